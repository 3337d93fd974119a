/* compare/cmd_info.c: `m3 info MODEL_DIR [--json] [--override JSON]` (contract: spec/cli.md).
 *
 * Reads config.json, the index (if any) and the safetensors headers only, checks that every
 * tensor the config implies is present with its shape, and prints parameter, checkpoint and
 * KV-cache accounting. Components (cli.md): attention = q,k,v,o; sparse_indexer =
 * index_q_proj + index_k_proj; router_and_norms = router gate, routing bias and every norm
 * weight of the text model (vision norms count as vision_tower); projector =
 * multi_modal_projector + patch_merge_mlp; `other` = anything the model does not use.
 * Parameters are logical elements: an MXFP4 U8 weight holds two per byte, MX scales are not
 * parameters. active_per_token = attention + sparse_indexer + dense_mlp + router_and_norms +
 * shared_experts + routed_experts * top_k / n_expert + lm_head (the tied embedding when
 * tie_word_embeddings); the embedding lookup is excluded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compare/cmd.h"
#include "ref/config.h"
#include "ref/json.h"
#include "ref/weights.h"

enum {
    C_ROUTED, C_SHARED, C_ATTN, C_INDEXER, C_DENSE, C_EMBED, C_LM_HEAD, C_ROUTER_NORMS,
    C_VISION, C_PROJECTOR, C_OTHER, C_COUNT
};
static const char *const comp_name[C_COUNT] = {
    "routed_experts", "shared_experts", "attention",  "sparse_indexer", "dense_mlp", "embed_tokens",
    "lm_head",        "router_and_norms", "vision_tower", "projector",    "other"};

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }
static bool starts(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Component of a canonical tensor name (ref/weights.h naming). */
static int classify(const char *c) {
    if (starts(c, "vision_tower.")) return C_VISION;
    if (starts(c, "multi_modal_projector.") || starts(c, "patch_merge_mlp.")) return C_PROJECTOR;
    if (!starts(c, "language_model.")) return C_OTHER;
    if (has(c, ".embed_tokens.")) return C_EMBED;
    if (starts(c, "language_model.lm_head.")) return C_LM_HEAD;
    if (has(c, ".block_sparse_moe.experts.")) return C_ROUTED;
    if (has(c, ".block_sparse_moe.shared_experts.")) return C_SHARED;
    if (has(c, ".self_attn.index_q_proj.") || has(c, ".self_attn.index_k_proj."))
        return C_INDEXER;
    if (has(c, ".self_attn.q_proj.") || has(c, ".self_attn.k_proj.") ||
        has(c, ".self_attn.v_proj.") || has(c, ".self_attn.o_proj."))
        return C_ATTN;
    if (has(c, ".mlp.gate_proj.") || has(c, ".mlp.up_proj.") || has(c, ".mlp.down_proj."))
        return C_DENSE;
    if (has(c, ".block_sparse_moe.gate.") || has(c, ".e_score_correction_bias") ||
        has(c, "norm.weight"))
        return C_ROUTER_NORMS;
    return C_OTHER;
}

/* 1234567 -> "1,234,567" */
static const char *commas(char *buf, long long v) {
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", v < 0 ? -v : v);
    size_t n = strlen(tmp), k = 0;
    if (v < 0) buf[k++] = '-';
    for (size_t i = 0; i < n; i++) {
        buf[k++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i + 1 < n) buf[k++] = ',';
    }
    buf[k] = 0;
    return buf;
}

static void usage(FILE *f) {
    fputs("usage: m3 info MODEL_DIR [--json] [--override JSON]\n"
          "  Parameter, checkpoint and KV-cache accounting from config.json and the safetensors\n"
          "  headers (never the tensor data). --json prints one JSON object (spec/cli.md).\n"
          "  --override applies inference overrides, e.g. '{\"use_index_cache\": true,\n"
          "  \"index_topk_freq\": 4}', and reports the resulting top-k reuse schedule.\n",
          f);
}

int m3_cmd_info(int argc, char **argv) {
    const char *dir = NULL, *override = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--override")) {
            if (++i >= argc) return m3_cli_fail("info: --override needs a JSON argument");
            override = argv[i];
        } else if (!strncmp(argv[i], "--override=", 11)) {
            override = argv[i] + 11;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-') {
            return m3_cli_fail("info: unknown option '%s' (see m3 info --help)", argv[i]);
        } else if (dir) {
            return m3_cli_fail("info: more than one MODEL_DIR ('%s', '%s')", dir, argv[i]);
        } else {
            dir = argv[i];
        }
    }
    if (!dir) return m3_cli_fail("info: need a MODEL_DIR (see m3 info --help)");

    m3_config *cfg = NULL;
    m3_weights *w = NULL;
    bool *computes = NULL;
    char **warns = NULL; /* m3_warnings_addf list */
    int n_warns = 0;
    int rc = 2;
    if (m3_config_load(&cfg, dir)) goto fail;
    if (override && m3_config_apply_overrides(cfg, override)) goto fail;
    if (m3_weights_open(&w, dir)) goto fail;
    int64_t n_unused = 0;
    if (m3_weights_check(w, cfg, &n_unused)) goto fail;
    computes = calloc((size_t)cfg->n_layer, sizeof *computes);
    if (!computes || m3_config_topk_schedule(cfg, computes)) goto fail;

    /* ---- accounting ---- */
    int64_t comp[C_COUNT] = {0}, total = 0, scale_bytes = 0, n_mtp = 0;
    int64_t n = m3_weights_n_tensors(w);
    for (int64_t i = 0; i < n; i++) {
        const m3_tensor_info *t = m3_weights_tensor_at(w, i);
        if (starts(t->canon, "mtp.")) n_mtp++;
        if (!t->params) scale_bytes += t->nbytes;
        comp[classify(t->canon)] += t->params;
        total += t->params;
    }
    int64_t routed_active =
        cfg->n_expert > 0 ? comp[C_ROUTED] / cfg->n_expert * cfg->top_k : 0; /* exact per expert */
    int64_t head = cfg->tie_word_embeddings && !comp[C_LM_HEAD] ? comp[C_EMBED] : comp[C_LM_HEAD];
    int64_t active = comp[C_ATTN] + comp[C_INDEXER] + comp[C_DENSE] + comp[C_ROUTER_NORMS] +
                     comp[C_SHARED] + routed_active + head;
    int64_t bytes = m3_weights_bytes(w), idx_total = m3_weights_index_total_size(w);
    m3_kv_bytes kv = m3_config_kv_bytes(cfg);
    int n_compute = 0;
    for (int L = 0; L < cfg->n_layer; L++) n_compute += computes[L];

    for (int i = 0; i < cfg->n_warnings; i++)
        m3_warnings_addf(&warns, &n_warns, "%s", cfg->warnings[i]);
    for (int i = 0; i < m3_weights_n_warnings(w); i++)
        m3_warnings_addf(&warns, &n_warns, "%s", m3_weights_warning(w, i));
    if (idx_total >= 0 && idx_total != bytes)
        m3_warnings_addf(&warns, &n_warns,
                         "%s: metadata.total_size %lld != the tensors' %lld bytes (never size "
                         "buffers from it)",
                         m3_weights_index_path(w), (long long)idx_total, (long long)bytes);
    if (n_unused > 0)
        m3_warnings_addf(&warns, &n_warns, "%lld stored tensors are not used by the model",
                         (long long)n_unused);
    char qfirst[300];
    int64_t n_qmis = m3_weights_quant_mismatch(w, cfg, qfirst, sizeof qfirst);
    if (n_qmis > 0)
        m3_warnings_addf(&warns, &n_warns,
                         "%lld linear modules are stored %s quantization_config says (first: %s)",
                         (long long)n_qmis, "in another form than", qfirst);
    if (n_mtp > 0)
        m3_warnings_addf(&warns, &n_warns, "%lld mtp.* tensors ignored (no MTP in the forward)",
                         (long long)n_mtp);
    int64_t sum = 0;
    for (int c = 0; c < C_COUNT; c++) sum += comp[c];
    M3_ASSERT(sum == total);

    const char *qname = cfg->quant.method == M3_QUANT_QUARK   ? "quark"
                        : cfg->quant.method == M3_QUANT_MXFP8 ? "mxfp8"
                                                              : "none";
    if (json) {
        m3_jw j;
        m3_jw_init(&j, stdout);
        m3_jw_object(&j, NULL);
        m3_jw_str(&j, "model_type", cfg->model_type);
        m3_jw_str(&j, "model_dir", dir);
        m3_jw_object(&j, "text");
        m3_jw_int(&j, "n_layer", cfg->n_layer);
        m3_jw_int(&j, "sparse_layers", cfg->n_sparse);
        m3_jw_int(&j, "moe_layers", cfg->n_moe);
        m3_jw_int(&j, "hidden", cfg->hidden);
        m3_jw_int(&j, "n_head", cfg->n_head);
        m3_jw_int(&j, "n_kv_head", cfg->n_kv_head);
        m3_jw_int(&j, "head_dim", cfg->head_dim);
        m3_jw_int(&j, "rot_dim", cfg->rot_dim);
        m3_jw_int(&j, "vocab", cfg->vocab);
        m3_jw_int(&j, "n_expert", cfg->n_expert);
        m3_jw_int(&j, "top_k", cfg->top_k);
        m3_jw_int(&j, "topk_computing_layers", n_compute);
        m3_jw_end(&j);
        m3_jw_object(&j, "params");
        m3_jw_int(&j, "total", total);
        m3_jw_int(&j, "active_per_token", active);
        m3_jw_object(&j, "by_component");
        for (int c = 0; c < C_COUNT; c++) m3_jw_int(&j, comp_name[c], comp[c]);
        m3_jw_end(&j);
        m3_jw_end(&j);
        m3_jw_object(&j, "checkpoint");
        m3_jw_int(&j, "files", m3_weights_n_files(w));
        m3_jw_int(&j, "tensors", n);
        m3_jw_int(&j, "bytes", bytes);
        if (idx_total >= 0)
            m3_jw_int(&j, "index_total_size", idx_total);
        else
            m3_jw_null(&j, "index_total_size");
        m3_jw_int(&j, "mx_scale_bytes", scale_bytes);
        m3_jw_str(&j, "quantization", qname);
        m3_jw_array(&j, "warnings");
        for (int i = 0; i < n_warns; i++) m3_jw_str(&j, NULL, warns[i]);
        m3_jw_end(&j);
        m3_jw_end(&j);
        m3_jw_object(&j, "kv_cache");
        m3_jw_object(&j, "bytes_per_token");
        m3_jw_int(&j, "bf16", kv.bf16);
        m3_jw_int(&j, "fp8", kv.fp8);
        m3_jw_int(&j, "fp8_scales", kv.fp8_scales);
        m3_jw_int(&j, "fp8_with_fp8_index", kv.fp8_all);
        m3_jw_end(&j);
        m3_jw_end(&j);
        m3_jw_end(&j);
    } else {
        char a[40], b[40];
        printf("model        %s  (%s)\n", cfg->model_type[0] ? cfg->model_type : "?", dir);
        printf("text         %d layers (%d full + %d sparse attention; %d dense + %d MoE MLP), "
               "D %d, heads %d/%d x %d, rot %d, vocab %d\n",
               cfg->n_layer, cfg->n_layer - cfg->n_sparse, cfg->n_sparse, cfg->n_layer - cfg->n_moe,
               cfg->n_moe, cfg->hidden, cfg->n_head, cfg->n_kv_head, cfg->head_dim, cfg->rot_dim,
               cfg->vocab);
        if (cfg->n_moe)
            printf("moe          %d experts x %d, top-%d, %d shared x %d, routed scale %g\n",
                   cfg->n_expert, cfg->expert_inter, cfg->top_k, cfg->n_shared_experts,
                   cfg->shared_inter, (double)cfg->routed_scale);
        if (cfg->n_sparse)
            printf("indexer      %d heads x %d, block %d, top-%d blocks (%d local, %d init); "
                   "top-k computed on %d of %d sparse layers%s\n",
                   cfg->index_n_heads, cfg->index_head_dim, cfg->index_block, cfg->index_topk,
                   cfg->index_local, cfg->index_init, n_compute, cfg->n_sparse,
                   cfg->use_index_cache ? " (index cache reuse on)" : "");
        if (cfg->vision.present)
            printf("vision       %d layers, D %d, heads %d, fc %d, patch %d, merge %d; projector "
                   "%d\n",
                   cfg->vision.n_layer, cfg->vision.hidden, cfg->vision.n_head, cfg->vision.inter,
                   cfg->vision.patch, cfg->vision.merge, cfg->projector_hidden);
        printf("quantization %s\n\n", qname);
        printf("%-18s %22s %8s\n", "parameters", "count", "share");
        for (int c = 0; c < C_COUNT; c++) {
            if (c == C_OTHER && !comp[c]) continue;
            printf("  %-16s %22s %7.2f%%\n", comp_name[c], commas(a, comp[c]),
                   total ? 100.0 * (double)comp[c] / (double)total : 0.0);
        }
        printf("  %-16s %22s\n", "total", commas(a, total));
        if (active >= 1000000000)
            printf("  %-16s %22s  (%.2f B)\n\n", "active/token", commas(b, active),
                   (double)active / 1e9);
        else
            printf("  %-16s %22s  (%.2f M)\n\n", "active/token", commas(b, active),
                   (double)active / 1e6);
        printf("checkpoint   %d files, %s tensors, %s bytes (%.2f %s)\n", m3_weights_n_files(w),
               commas(a, n), commas(b, bytes), (double)bytes / (bytes >= 1000000000 ? 1e9 : 1e6),
               bytes >= 1000000000 ? "GB" : "MB");
        if (idx_total >= 0)
            printf("             index total_size %s (%.2f GB)\n", commas(a, idx_total),
                   (double)idx_total / 1e9);
        if (scale_bytes) printf("             MX scales %s bytes\n", commas(a, scale_bytes));
        printf("kv cache     per token: bf16 %s B (%.2f KiB); fp8 KV + bf16 index %s B (%.2f "
               "KiB) + fp8 scales %s B; all fp8 %s B\n",
               commas(a, kv.bf16), (double)kv.bf16 / 1024.0, commas(b, kv.fp8),
               (double)kv.fp8 / 1024.0, commas((char[40]){0}, kv.fp8_scales),
               commas((char[40]){0}, kv.fp8_all));
        if (n_warns) {
            printf("\nwarnings\n");
            for (int i = 0; i < n_warns; i++) printf("  - %s\n", warns[i]);
        }
    }
    rc = 0;
    goto done;
fail:
    rc = m3_cli_fail(NULL);
done:
    for (int i = 0; i < n_warns; i++) free(warns[i]);
    free(warns);
    free(computes);
    m3_weights_close(w);
    m3_config_free(cfg);
    return rc;
}
