/* tests/ref_config.c: config.json in both dialects (the real checkpoint's and the tiny
 * transformers 5.17 fixture's), per-field precedence, overrides and the top-k reuse schedule
 * of spec §3.9, validation messages, quantization_config, KV bytes, and the JSON wrapper. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/config.h"
#include "ref/json.h"
#include "tests/util.h"

static m3_config *load_shared(const char *rel) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", m3_shared_dir(), rel);
    m3_config *c = NULL;
    m3_status s = m3_config_load(&c, p);
    if (s) m3_test_failf("load %s: %s", p, m3_last_error());
    return c;
}

static m3_config *parse_ok(const char *json) {
    m3_config *c = NULL;
    if (m3_config_parse(&c, json, strlen(json), "t.json"))
        m3_test_failf("parse failed: %s\n%s", m3_last_error(), json);
    return c;
}

/* Parse must fail with status s and a message containing want. */
static void parse_fails(const char *json, m3_status s, const char *want) {
    m3_config *c = NULL;
    m3_clear_error();
    m3_status got = m3_config_parse(&c, json, strlen(json), "t.json");
    if (got == M3_OK) {
        m3_config_free(c);
        m3_test_failf("parse succeeded, expected '%s'\n%s", want, json);
    }
    const char *e = m3_last_error();
    if (got != s || !strstr(e, want) || !strstr(e, "t.json") || strchr(e, '\n'))
        m3_test_failf("status %d msg '%s', expected %d with '%s'", got, e, s, want);
}

static bool has_warning(const m3_config *c, const char *sub) {
    for (int i = 0; i < c->n_warnings; i++)
        if (strstr(c->warnings[i], sub)) return true;
    return false;
}

static void real_config_original_dialect(void **state) {
    (void)state;
    m3_config *c = load_shared("m3/config.json");
    assert_string_equal(c->model_type, "minimax_m3_vl");
    assert_int_equal(c->hidden, 6144);
    assert_int_equal(c->n_layer, 60);
    assert_int_equal(c->n_head, 64);
    assert_int_equal(c->n_kv_head, 4);
    assert_int_equal(c->head_dim, 128);
    assert_int_equal(c->vocab, 200064);
    assert_true(c->max_pos == 1048576);
    assert_true(c->rms_eps == (float)1e-6);
    assert_true(c->rope_theta == 5e6);
    assert_int_equal(c->rot_dim, 64);
    assert_int_equal(c->rotary_dim_key, 64);
    assert_true(c->swiglu_alpha == 1.702f && c->swiglu_limit == 7.0f);
    assert_int_equal(c->dense_inter, 12288);
    assert_int_equal(c->expert_inter, 3072);
    assert_int_equal(c->shared_inter, 3072);
    assert_int_equal(c->n_shared_experts, 1);
    assert_int_equal(c->n_expert, 128);
    assert_int_equal(c->top_k, 4);
    assert_true(c->routed_scale == 2.0f);
    for (int L = 0; L < 60; L++) {
        assert_int_equal(c->layer_sparse[L], L >= 3);
        assert_int_equal(c->layer_moe[L], L >= 3);
    }
    assert_int_equal(c->n_sparse, 57);
    assert_int_equal(c->n_moe, 57);
    assert_int_equal(c->index_n_heads, 4);
    assert_int_equal(c->index_head_dim, 128);
    assert_int_equal(c->index_block, 128);
    assert_int_equal(c->index_topk, 16);
    assert_int_equal(c->index_local, 1);
    assert_int_equal(c->index_init, 0);
    assert_false(c->tie_word_embeddings);
    assert_int_equal(c->bos_id, 200034);
    assert_int_equal(c->eos_id, 200020);
    assert_false(c->use_index_cache);
    assert_int_equal(c->index_topk_freq, 1);
    assert_null(c->index_topk_pattern);
    assert_int_equal(c->image_token_id, 200025);
    assert_int_equal(c->video_token_id, 200026);
    assert_int_equal(c->projector_hidden, 6144);
    assert_int_equal(c->merged_hidden, 24576);
    assert_true(c->vision.present);
    assert_int_equal(c->vision.hidden, 1280);
    assert_int_equal(c->vision.n_head, 16);
    assert_int_equal(c->vision.n_layer, 32);
    assert_int_equal(c->vision.inter, 5120);
    assert_int_equal(c->vision.patch, 14);
    assert_int_equal(c->vision.merge, 2);
    assert_int_equal(c->vision.temporal_patch, 2);
    assert_true(c->vision.layer_norm_eps == (float)1e-5);
    assert_true(c->vision.rope_theta == 1e4);
    assert_int_equal(c->quant.method, M3_QUANT_NONE);
    assert_int_equal(c->n_warnings, 0);
    /* verbatim text kept for dumps */
    char p[1024];
    snprintf(p, sizeof p, "%s/m3/config.json", m3_shared_dir());
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    char *buf = malloc(c->json_len + 1);
    assert_int_equal(fread(buf, 1, c->json_len + 1, f), c->json_len);
    fclose(f);
    assert_memory_equal(buf, c->json_text, c->json_len);
    free(buf);
    m3_kv_bytes kv = m3_config_kv_bytes(c);
    assert_true(kv.bf16 == 137472 && kv.fp8 == 76032 && kv.fp8_scales == 1920 &&
                kv.fp8_all == 70656);
    m3_config_free(c);
}

static void tiny_hf_dialect(void **state) {
    (void)state;
    m3_config *c = load_shared("fixtures/hf-tiny/model");
    assert_int_equal(c->hidden, 128);
    assert_int_equal(c->n_layer, 4);
    assert_int_equal(c->n_head, 8);
    assert_int_equal(c->n_kv_head, 2);
    assert_int_equal(c->head_dim, 32);
    assert_int_equal(c->rot_dim, 16);
    assert_true(c->rope_theta == 5e6);
    assert_int_equal(c->vocab, 512);
    assert_int_equal(c->index_n_heads, 2);
    assert_int_equal(c->index_head_dim, 32);
    assert_int_equal(c->index_block, 16);
    assert_int_equal(c->index_topk, 3);
    assert_int_equal(c->index_local, 1);
    bool sp[4] = {false, true, true, true};
    for (int L = 0; L < 4; L++) {
        assert_int_equal(c->layer_sparse[L], sp[L]);
        assert_int_equal(c->layer_moe[L], sp[L]);
    }
    assert_int_equal(c->dense_inter, 256);
    assert_int_equal(c->expert_inter, 32);
    assert_int_equal(c->shared_inter, 32);
    assert_int_equal(c->n_expert, 8);
    assert_int_equal(c->top_k, 2);
    assert_int_equal(c->bos_id, 1);
    assert_int_equal(c->eos_id, 2);
    assert_true(c->max_pos == 4096);
    assert_int_equal(c->projector_hidden, 128);
    assert_int_equal(c->merged_hidden, 512);
    assert_int_equal(c->vision.hidden, 64);
    assert_int_equal(c->vision.n_layer, 2);
    assert_int_equal(c->vision.merge, 2);
    assert_true(c->vision.rope_theta == 1e4);
    assert_int_equal(c->n_warnings, 0);
    m3_kv_bytes kv = m3_config_kv_bytes(c);
    /* 4 layers * 2 * 2 heads * 32 * 2 B + 3 sparse * 32 * 2 B */
    assert_true(kv.bf16 == 4 * 2 * 2 * 32 * 2 + 3 * 32 * 2);
    m3_config_free(c);
}

/* A small flat (text-only) config; %s slots let cases add or replace keys. */
#define BASE_HEAD                                                                                 \
    "{\"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4, "               \
    "\"num_key_value_heads\": 2, \"head_dim\": 16, \"vocab_size\": 100, "                         \
    "\"intermediate_size\": 8, \"dense_intermediate_size\": 32, \"num_local_experts\": 4, "       \
    "\"num_experts_per_tok\": 2, \"partial_rotary_factor\": 0.5, "
#define LT4 "\"layer_types\": [\"full_attention\", \"minimax_m3_sparse\", \"minimax_m3_sparse\", \"minimax_m3_sparse\"], "
#define MT4 "\"mlp_layer_types\": [\"dense\", \"sparse\", \"sparse\", \"sparse\"]"

static void precedence_per_field(void **state) {
    (void)state;
    /* legacy sparse_attention_config keys override flat index_* keys; layer_types beats
     * sparse_attention_freq; rope_parameters beats rope_theta / partial_rotary_factor */
    m3_config *c = parse_ok(
        BASE_HEAD LT4 MT4 ", \"index_n_heads\": 3, \"index_head_dim\": 64, \"index_block_size\": 8, "
        "\"rope_theta\": 1000, \"rope_parameters\": {\"rope_theta\": 2000, "
        "\"partial_rotary_factor\": 0.25}, \"sparse_attention_config\": {\"sparse_num_index_heads\": "
        "2, \"sparse_index_dim\": 16, \"sparse_attention_freq\": [0, 0, 0, 0], "
        "\"sparse_init_block\": 1, \"sparse_topk_blocks\": 8}}");
    assert_int_equal(c->index_n_heads, 2);
    assert_int_equal(c->index_head_dim, 16);
    assert_int_equal(c->index_block, 8); /* flat: no legacy key */
    assert_int_equal(c->index_topk, 8);
    assert_int_equal(c->index_init, 1);
    assert_int_equal(c->n_sparse, 3); /* layer_types wins */
    assert_true(c->rope_theta == 2000.0);
    assert_int_equal(c->rot_dim, 4);
    m3_config_free(c);
    /* text_config with per-field fallback to the top level; moe_layer_freq as 0/1 */
    c = parse_ok("{\"model_type\": \"x\", \"tie_word_embeddings\": true, \"use_index_cache\": true,"
                 " \"index_topk_freq\": 2, \"text_config\": " BASE_HEAD
                 "\"sparse_attention_config\": {\"sparse_attention_freq\": [0, 1, 1, 1]}, "
                 "\"moe_layer_freq\": [0, 0, 1, 1], \"index_n_heads\": 2}}");
    assert_true(c->tie_word_embeddings);
    assert_true(c->use_index_cache);
    assert_int_equal(c->index_topk_freq, 2);
    assert_int_equal(c->n_sparse, 3);
    assert_int_equal(c->n_moe, 2);
    assert_false(c->layer_moe[1]);
    assert_false(c->vision.present);
    m3_config_free(c);
}

static void warnings_collected(void **state) {
    (void)state;
    /* rotary_dim without partial_rotary_factor: HF rotates the full head; warn */
    m3_config *c = parse_ok("{\"hidden_size\": 64, \"num_hidden_layers\": 2, "
                            "\"num_attention_heads\": 4, \"head_dim\": 16, \"vocab_size\": 10, "
                            "\"rotary_dim\": 8, \"intermediate_size\": 8, \"num_local_experts\": 2,"
                            " \"num_experts_per_tok\": 1}");
    assert_int_equal(c->rot_dim, 16);
    assert_int_equal(c->n_kv_head, 4); /* defaults to n_head */
    assert_true(has_warning(c, "rotary_dim 8"));
    assert_true(has_warning(c, "every layer is full attention"));
    assert_true(has_warning(c, "every layer is MoE"));
    assert_int_equal(c->n_sparse, 0);
    assert_int_equal(c->n_moe, 2);
    m3_config_free(c);
}

static void schedule_of(m3_config *c, const char *ov, char *out) {
    if (ov && m3_config_apply_overrides(c, ov))
        m3_test_failf("override %s: %s", ov, m3_last_error());
    bool comp[60];
    assert_int_equal(m3_config_topk_schedule(c, comp), M3_OK);
    size_t k = 0;
    out[0] = 0;
    for (int L = 0; L < c->n_layer; L++)
        if (comp[L]) k += (size_t)snprintf(out + k, 400 - k, "%s%d", k ? "," : "", L);
}

static void topk_reuse_schedule(void **state) {
    (void)state;
    m3_config *c = load_shared("m3/config.json");
    char s[400];
    schedule_of(c, NULL, s); /* no index cache: all 57 sparse layers compute */
    assert_int_equal(strlen(s), strlen("3,4,5,6,7,8,9") + 50 * 3);
    schedule_of(c, "{\"use_index_cache\": true, \"index_topk_freq\": 4}", s);
    assert_string_equal(s, "3,7,11,15,19,23,27,31,35,39,43,47,51,55,59"); /* 15 layers */
    schedule_of(c, "{\"index_skip_topk_offset\": 1}", s);
    assert_string_equal(s, "3,4,8,12,16,20,24,28,32,36,40,44,48,52,56");
    /* pattern overrides freq; ordinals beyond its length compute */
    schedule_of(c, "{\"index_topk_pattern\": \"CSSCS\"}", s);
    assert_int_equal(strncmp(s, "3,6,8,9,10,", 11), 0);
    assert_int_equal(m3_config_sparse_ordinal(c, 3), 0);
    assert_int_equal(m3_config_sparse_ordinal(c, 59), 56);
    assert_int_equal(m3_config_sparse_ordinal(c, 2), -1);
    /* pattern[0] == 'S' is an error and leaves the config unchanged */
    assert_int_not_equal(m3_config_apply_overrides(c, "{\"index_topk_pattern\": \"SC\"}"), M3_OK);
    assert_non_null(strstr(m3_last_error(), "pattern[0]"));
    assert_string_equal(c->index_topk_pattern, "CSSCS");
    assert_int_not_equal(m3_config_apply_overrides(c, "{\"index_topk_freq\": 0}"), M3_OK);
    assert_int_not_equal(m3_config_apply_overrides(c, "{\"bogus\": 1}"), M3_OK);
    assert_non_null(strstr(m3_last_error(), "unknown override 'bogus'"));
    assert_int_not_equal(m3_config_apply_overrides(c, "{\"use_index_cache\": \"yes\"}"), M3_OK);
    assert_int_not_equal(m3_config_apply_overrides(c, "[1]"), M3_OK);
    assert_int_not_equal(m3_config_apply_overrides(c, "{\"index_topk_freq\": "), M3_OK);
    assert_non_null(strstr(m3_last_error(), "--override: invalid JSON"));
    schedule_of(c, "{\"index_topk_pattern\": null, \"use_index_cache\": false}", s);
    assert_int_equal(strncmp(s, "3,4,5,6,", 8), 0);
    m3_config_free(c);
    /* overrides inside the config file, pattern[0] = 'S' refused at load */
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"use_index_cache\": true, "
                "\"index_topk_pattern\": \"S\"}",
                M3_ERR_FORMAT, "pattern[0]");
}

static void validation_errors(void **state) {
    (void)state;
    parse_fails("{\"hidden_size\": 64,", M3_ERR_FORMAT, "invalid JSON");
    parse_fails("{\"a\":\n [1, 2,, 3]}", M3_ERR_FORMAT, "line 2 column");
    parse_fails("[1]", M3_ERR_FORMAT, "top level must be a JSON object");
    parse_fails(BASE_HEAD LT4 MT4 "}", M3_ERR_FORMAT, "index_n_heads 4 != num_key_value_heads 2");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"num_key_value_heads\": 3}",
                M3_ERR_FORMAT, "not divisible");
    parse_fails(BASE_HEAD MT4 ", \"layer_types\": [\"full_attention\"]}", M3_ERR_FORMAT,
                "layer_types has 1 entries, expected num_hidden_layers = 4");
    parse_fails(BASE_HEAD MT4 ", \"layer_types\": [\"full_attention\", \"x\", \"x\", \"x\"]}",
                M3_ERR_FORMAT, "layer_types[1] = \"x\"");
    parse_fails(BASE_HEAD LT4 "\"mlp_layer_types\": 3}", M3_ERR_FORMAT,
                "mlp_layer_types must be a list");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"hidden_size\": -5}", M3_ERR_FORMAT,
                "hidden_size = -5 is out of range");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"hidden_size\": \"64\"}",
                M3_ERR_FORMAT, "hidden_size must be an integer");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"vocab_size\": 0}", M3_ERR_FORMAT,
                "vocab_size must be positive");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"partial_rotary_factor\": 0.3125}",
                M3_ERR_FORMAT, "rotary width");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"partial_rotary_factor\": 2}",
                M3_ERR_FORMAT, "partial_rotary_factor");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"num_experts_per_tok\": 9}",
                M3_ERR_FORMAT, "exceeds num_local_experts");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"sparse_attention_config\": "
                "{\"sparse_score_type\": \"sum\"}}",
                M3_ERR_FORMAT, "sparse_score_type must be \"max\"");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"sparse_attention_config\": "
                "{\"sparse_disable_index_value\": [0, 0, 1, 1]}}",
                M3_ERR_UNSUPPORTED, "sparse_disable_index_value[1] = 0");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"quantization_config\": "
                "{\"quant_method\": \"gptq\"}}",
                M3_ERR_UNSUPPORTED, "quant_method \"gptq\"");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"vision_config\": {\"hidden_size\": "
                "30, \"num_attention_heads\": 4, \"num_hidden_layers\": 1, \"intermediate_size\": "
                "8}}",
                M3_ERR_FORMAT, "vision_config.hidden_size 30 is not divisible");
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"rms_norm_eps\": 0}", M3_ERR_FORMAT,
                "rms_norm_eps");
}

static void quantization_configs(void **state) {
    (void)state;
    m3_config *c = parse_ok(
        BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"quantization_config\": {\"quant_method\": "
        "\"quark\", \"global_quant_config\": {\"weight\": {\"dtype\": \"fp4\", \"qscheme\": "
        "\"per_group\", \"group_size\": 32, \"ch_axis\": -1, \"scale_format\": \"e8m0\", "
        "\"is_dynamic\": false, \"round_method\": \"half_even\", \"scale_calculation_mode\": "
        "\"even\"}, \"input_tensors\": {\"dtype\": \"fp4\", \"is_dynamic\": true}}, \"exclude\": "
        "[\"*lm_head\", \"*vision_tower*\", \"*multi_modal_projector*\", \"*patch_merge_mlp*\", "
        "\"*block_sparse_moe.gate\", \"*self_attn*\", \"*mlp.gate_proj\", \"*mlp.up_proj\", "
        "\"*mlp.down_proj\"], \"layer_quant_config\": {}, \"export\": {\"weight_format\": "
        "\"real_quantized\"}}}");
    const m3_quant_config *q = &c->quant;
    assert_int_equal(q->method, M3_QUANT_QUARK);
    assert_int_equal(q->weight_dtype, M3_DT_F4);
    assert_int_equal(q->group_size, 32);
    assert_string_equal(q->scale_format, "e8m0");
    assert_string_equal(q->round_method, "half_even");
    assert_string_equal(q->scale_mode, "even");
    assert_true(q->has_input_quant && q->input_dynamic);
    assert_int_equal(q->n_exclude, 9);
    const char *L3 = "language_model.model.layers.3.";
    char n[256];
    struct { const char *mod; bool quant; } cases[] = {
        {"block_sparse_moe.experts.7.w1", true},
        {"block_sparse_moe.experts.127.w2", true},
        {"block_sparse_moe.shared_experts.gate_proj", true},
        {"block_sparse_moe.gate", false},
        {"self_attn.q_proj", false},
        {"self_attn.index_k_proj", false},
        {"mlp.down_proj", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(n, sizeof n, "%s%s", L3, cases[i].mod);
        if (m3_config_module_quantized(c, n) != cases[i].quant)
            m3_test_failf("quark: %s expected %d", n, cases[i].quant);
    }
    assert_false(m3_config_module_quantized(c, "language_model.lm_head"));
    assert_false(m3_config_module_quantized(c, "vision_tower.vision_model.encoder.layers.0.mlp.fc1"));
    assert_false(m3_config_module_quantized(c, "patch_merge_mlp.linear_1"));
    m3_config_free(c);

    c = parse_ok(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"quantization_config\": "
                 "{\"quant_method\": \"mxfp8\", \"weight_block_size\": [1, 32], "
                 "\"activation_scheme\": \"dynamic\", \"ignored_layers\": [\"lm_head\", "
                 "\"*vision_tower*\", \"language_model.model.layers.3.block_sparse_moe.gate\"]}}");
    q = &c->quant;
    assert_int_equal(q->method, M3_QUANT_MXFP8);
    assert_int_equal(q->weight_dtype, M3_DT_F8_E4M3);
    assert_int_equal(q->group_size, 32);
    assert_true(q->input_dynamic);
    assert_false(m3_config_module_quantized(c, "language_model.lm_head"));
    assert_false(m3_config_module_quantized(c, "language_model.model.layers.3.block_sparse_moe.gate"));
    assert_true(m3_config_module_quantized(c, "language_model.model.layers.4.block_sparse_moe.gate"));
    assert_true(m3_config_module_quantized(c, "language_model.model.layers.4.self_attn.q_proj"));
    assert_false(m3_config_module_quantized(c, "vision_tower.vision_model.encoder.layers.0.mlp.fc1"));
    m3_config_free(c);
    parse_fails(BASE_HEAD LT4 MT4 ", \"index_n_heads\": 2, \"quantization_config\": "
                "{\"quant_method\": \"mxfp8\", \"weight_block_size\": [128, 128]}}",
                M3_ERR_UNSUPPORTED, "weight_block_size must be [1, G]");
    /* no quantization: nothing is quantized */
    c = load_shared("fixtures/hf-tiny/model");
    assert_false(m3_config_module_quantized(c, "language_model.model.layers.1.block_sparse_moe.experts.0.w1"));
    m3_config_free(c);
}

static void json_wrapper(void **state) {
    (void)state;
    m3_json *j = NULL;
    const char *t = "{\"a\": [1, 2.5, 9007199254740993, -3], \"s\": \"x\\ny\", \"b\": true, "
                    "\"n\": null, \"big\": 1e300}   \n";
    assert_int_equal(m3_json_parse(&j, t, strlen(t), "t"), M3_OK);
    const m3_json *a = m3_json_get(j, "a");
    assert_int_equal(m3_json_size(a), 4);
    int64_t v;
    assert_true(m3_json_int(m3_json_at(a, 0), &v) && v == 1);
    assert_false(m3_json_int(m3_json_at(a, 1), &v)); /* not integral */
    assert_false(m3_json_int(m3_json_at(a, 2), &v)); /* beyond 2^53: may be rounded */
    assert_true(m3_json_int(m3_json_at(a, 3), &v) && v == -3);
    assert_false(m3_json_int(m3_json_get(j, "big"), &v));
    assert_string_equal(m3_json_get_str(j, "s", NULL), "x\ny");
    assert_true(m3_json_get_bool(j, "b", false));
    assert_int_equal(m3_json_get_int(j, "n", 7), 7); /* null -> default */
    assert_int_equal(m3_json_get_int(j, "missing", 8), 8);
    assert_null(m3_json_get(NULL, "a"));
    int k = 0;
    for (const m3_json *c = m3_json_first(j); c; c = m3_json_next(c)) k++;
    assert_int_equal(k, 5);
    m3_json_free(j);
    assert_int_not_equal(m3_json_parse(&j, "{} x", 4, "t"), M3_OK);
    assert_non_null(strstr(m3_last_error(), "unexpected data after the value"));
    assert_int_not_equal(m3_json_parse(&j, "", 0, "t"), M3_OK);
    /* writer round-trip through the parser */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    m3_jw w;
    m3_jw_init(&w, f);
    m3_jw_object(&w, NULL);
    m3_jw_str(&w, "q\"\\\x01", "tab\there");
    m3_jw_int(&w, "i", INT64_C(854172958720));
    m3_jw_double(&w, "d", 0.1);
    m3_jw_array(&w, "arr");
    m3_jw_bool(&w, NULL, false);
    m3_jw_null(&w, NULL);
    m3_jw_object(&w, NULL);
    m3_jw_end(&w);
    m3_jw_end(&w);
    m3_jw_end(&w);
    fclose(f);
    assert_int_equal(m3_json_parse(&j, buf, len, "w"), M3_OK);
    assert_string_equal(m3_json_get_str(j, "q\"\\\x01", NULL), "tab\there");
    assert_true(m3_json_get_int(j, "i", 0) == INT64_C(854172958720));
    assert_true(m3_json_get_double(j, "d", 0) == 0.1);
    assert_int_equal(m3_json_size(m3_json_get(j, "arr")), 3);
    m3_json_free(j);
    free(buf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(real_config_original_dialect),
        cmocka_unit_test(tiny_hf_dialect),
        cmocka_unit_test(precedence_per_field),
        cmocka_unit_test(warnings_collected),
        cmocka_unit_test(topk_reuse_schedule),
        cmocka_unit_test(validation_errors),
        cmocka_unit_test(quantization_configs),
        cmocka_unit_test(json_wrapper),
    };
    return M3_RUN_TESTS(tests);
}
