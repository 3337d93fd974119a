/* tests/fuzz_safetensors.c: libFuzzer target for the safetensors header parser and the
 * lazy mapping (ref/weights.c). Built and run by scripts/fuzz.sh (`make fuzz`), corpus in
 * fixtures/fuzz/safetensors/. The input is written to a memfd and opened as a checkpoint file;
 * when it opens, every tensor is mapped and its first and last byte read (ASan catches a
 * view outside the file), the checkpoint check runs against a micro config, and the layer
 * pages are dropped. Any input must give M3_OK or an error status with one message line. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "ref/config.h"
#include "ref/weights.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char micro_cfg[] =
    "{\"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 2, "
    "\"num_key_value_heads\": 1, \"head_dim\": 8, \"vocab_size\": 32, \"partial_rotary_factor\": "
    "0.5, \"intermediate_size\": 32, \"dense_intermediate_size\": 32, \"num_local_experts\": 2, "
    "\"num_experts_per_tok\": 1, \"index_n_heads\": 1, \"index_head_dim\": 8, "
    "\"layer_types\": [\"full_attention\", \"minimax_m3_sparse\"], \"mlp_layer_types\": "
    "[\"dense\", \"sparse\"]}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static m3_config *cfg;
    if (!cfg && m3_config_parse(&cfg, micro_cfg, strlen(micro_cfg), "micro")) __builtin_trap();
    int fd = memfd_create("st", 0);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    m3_weights *w = NULL;
    if (m3_weights_open(&w, path) == M3_OK) {
        volatile uint8_t sink = 0;
        for (int64_t i = 0; i < m3_weights_n_tensors(w); i++) {
            const m3_tensor_info *ti = m3_weights_tensor_at(w, i);
            m3_tensor t;
            if (m3_weights_get(w, ti->canon, &t) != M3_OK) __builtin_trap();
            if (ti->nbytes > 0)
                sink ^= ((const uint8_t *)t.data)[0] ^ ((const uint8_t *)t.data)[ti->nbytes - 1];
        }
        (void)sink;
        int64_t unused;
        (void)m3_weights_check(w, cfg, &unused);
        m3_linear_w lw;
        (void)m3_weights_linear(w, M3_W_Q_PROJ, 0, 0, &lw);
        (void)m3_weights_drop(w, "language_model.");
        m3_weights_close(w);
    }
    if (strchr(m3_last_error(), '\n')) __builtin_trap(); /* the one-line contract */
    m3_clear_error();
    close(fd);
    return 0;
}
