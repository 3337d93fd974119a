/* tests/fuzz_config.c: libFuzzer target for the config.json reader (ref/config.c) and the
 * JSON wrapper (ref/json.c). Built and run by scripts/fuzz.sh (`make fuzz`), corpus in
 * fixtures/fuzz/config/. The input is parsed as a config; when it loads, the derived queries
 * run (top-k schedule, KV bytes, quantized-module predicate, role shapes) and the input is
 * also applied as an --override to a fixed valid config. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ref/config.h"
#include "ref/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char base_cfg[] =
    "{\"hidden_size\": 16, \"num_hidden_layers\": 4, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 32, \"partial_rotary_factor\": "
    "0.5, \"intermediate_size\": 32, \"dense_intermediate_size\": 32, \"num_local_experts\": 2, "
    "\"num_experts_per_tok\": 1, \"index_n_heads\": 1, \"index_head_dim\": 8, "
    "\"layer_types\": [\"full_attention\", \"minimax_m3_sparse\", \"minimax_m3_sparse\", "
    "\"minimax_m3_sparse\"], \"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\", \"sparse\"]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    m3_config *c = NULL;
    if (m3_config_parse(&c, (const char *)data, size, "fuzz.json") == M3_OK) {
        bool *comp = malloc((size_t)c->n_layer);
        if (m3_config_topk_schedule(c, comp) != M3_OK) __builtin_trap(); /* validated on load */
        for (int L = 0; L < c->n_layer; L++) {
            int o = m3_config_sparse_ordinal(c, L);
            if ((o >= 0) != c->layer_sparse[L]) __builtin_trap();
            for (int r = 0; r < M3_W_ROLE_COUNT; r++) {
                int64_t s[8];
                int rank;
                (void)m3_weight_shape(c, (m3_wrole)r, L, s, &rank);
            }
        }
        m3_kv_bytes kv = m3_config_kv_bytes(c);
        if (kv.bf16 < 0) __builtin_trap();
        (void)m3_config_module_quantized(c, "language_model.model.layers.3.block_sparse_moe.experts.7.w1");
        free(comp);
        m3_config_free(c);
    }
    if (strchr(m3_last_error(), '\n')) __builtin_trap();
    /* the same bytes as an --override on a valid config (NUL-terminated copy) */
    m3_config *base = NULL; /* fresh each run: no state carried between inputs */
    if (m3_config_parse(&base, base_cfg, strlen(base_cfg), "base")) __builtin_trap();
    char *txt = malloc(size + 1);
    memcpy(txt, data, size);
    txt[size] = 0;
    if (m3_config_apply_overrides(base, txt) == M3_OK) {
        bool comp[4];
        if (m3_config_topk_schedule(base, comp) != M3_OK) __builtin_trap();
    }
    free(txt);
    m3_config_free(base);
    m3_clear_error();
    return 0;
}
