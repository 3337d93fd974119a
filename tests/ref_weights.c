/* tests/ref_weights.c: safetensors reading. The tiny transformers-written fixture (aliases as
 * save_pretrained writes them), header validation (one case per rule), single vs sharded,
 * alias resolution, the role API, the config-driven checkpoint check (missing / mis-shaped
 * tensors named), MXFP4/MXFP8 tensor forms, lazy mapping and drop, exact f32 conversion.
 * Checkpoints are written at run time into a temp dir; data regions are holes (ftruncate). */
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ref/config.h"
#include "ref/json.h"
#include "ref/num/bf16.h"
#include "ref/weights.h"
#include "tests/util.h"

static void mkdir_p(const char *rel) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", m3_tmp_path(rel));
    assert_int_equal(system(cmd), 0);
}

/* Raw file: 8-byte length (declared, or the real one when declared < 0), header text,
 * data_len bytes of data (bytes i -> (i * 7 + 1) & 0xFF when fill, else a hole). */
static void write_raw(const char *path, const char *hdr, int64_t data_len, int64_t declared,
                      bool fill) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint64_t n = declared < 0 ? strlen(hdr) : (uint64_t)declared;
    unsigned char lb[8];
    for (int i = 0; i < 8; i++) lb[i] = (unsigned char)(n >> (8 * i));
    assert_int_equal(fwrite(lb, 1, 8, f), 8);
    assert_int_equal(fwrite(hdr, 1, strlen(hdr), f), strlen(hdr));
    if (fill)
        for (int64_t i = 0; i < data_len; i++) fputc((int)((i * 7 + 1) & 0xFF), f);
    fflush(f);
    if (!fill) assert_int_equal(ftruncate(fileno(f), 8 + (off_t)strlen(hdr) + data_len), 0);
    fclose(f);
}

typedef struct {
    const char *name;
    const char *dtype;
    int rank;
    int64_t shape[5];
} ent;

static int64_t ent_bytes(const ent *e) {
    int64_t n = 1;
    for (int i = 0; i < e->rank; i++) n *= e->shape[i];
    int bits = m3_dtype_bits(m3_dtype_from_name(e->dtype));
    return n * bits / 8;
}

/* Well-formed safetensors file of the given entries, laid out contiguously. */
static void write_st(const char *path, const ent *e, int n, bool fill) {
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    m3_jw w;
    m3_jw_init(&w, m);
    m3_jw_object(&w, NULL);
    m3_jw_object(&w, "__metadata__");
    m3_jw_str(&w, "format", "pt");
    m3_jw_end(&w);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        m3_jw_object(&w, e[i].name);
        m3_jw_str(&w, "dtype", e[i].dtype);
        m3_jw_array(&w, "shape");
        for (int d = 0; d < e[i].rank; d++) m3_jw_int(&w, NULL, e[i].shape[d]);
        m3_jw_end(&w);
        m3_jw_array(&w, "data_offsets");
        m3_jw_int(&w, NULL, off);
        off += ent_bytes(&e[i]);
        m3_jw_int(&w, NULL, off);
        m3_jw_end(&w);
        m3_jw_end(&w);
    }
    m3_jw_end(&w);
    fclose(m);
    write_raw(path, buf, off, -1, fill);
    free(buf);
}

static void expect_open_fails(const char *path, m3_status st, const char *want) {
    m3_weights *w = NULL;
    m3_clear_error();
    m3_status s = m3_weights_open(&w, path);
    if (s == M3_OK) {
        m3_weights_close(w);
        m3_test_failf("%s opened, expected '%s'", path, want);
    }
    const char *e = m3_last_error();
    if (s != st || !strstr(e, want) || strchr(e, '\n'))
        m3_test_failf("%s: status %d '%s', expected %d '%s'", path, s, e, st, want);
}

static m3_config *tiny_cfg(void) {
    char p[1024];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny/model", m3_shared_dir());
    m3_config *c = NULL;
    if (m3_config_load(&c, p)) m3_test_failf("%s", m3_last_error());
    return c;
}

static void tiny_fixture(void **state) {
    (void)state;
    char p[1024];
    snprintf(p, sizeof p, "%s/fixtures/hf-tiny/model", m3_shared_dir());
    m3_weights *w = NULL;
    if (m3_weights_open(&w, p)) m3_test_failf("%s", m3_last_error());
    assert_int_equal(m3_weights_n_files(w), 1);
    assert_int_equal(m3_weights_n_tensors(w), 180);
    assert_true(m3_weights_bytes(w) == 2365664);
    assert_true(m3_weights_index_total_size(w) == -1);
    /* save_pretrained quirks resolve to the original names */
    const m3_tensor_info *t = m3_weights_find(w, "language_model.model.layers.0.mlp.gate_proj.weight");
    assert_non_null(t);
    assert_string_equal(t->name, "language_model.model.layers.0.block_sparse_moe.gate_proj.weight");
    t = m3_weights_find(w, "vision_tower.vision_model.encoder.layers.1.mlp.fc2.weight");
    assert_non_null(t);
    assert_string_equal(t->name, "vision_tower.vision_model.encoder.layers.1.block_sparse_moe.fc2.weight");
    /* and an alias query resolves too */
    assert_ptr_equal(m3_weights_find(w, "model.language_model.layers.1.block_sparse_moe.experts.3.gate_proj.weight"),
                     m3_weights_find(w, "language_model.model.layers.1.block_sparse_moe.experts.3.w1.weight"));
    assert_null(m3_weights_find(w, "language_model.model.layers.0.self_attn.index_q_proj.weight"));
    m3_config *c = tiny_cfg();
    int64_t unused = -1;
    if (m3_weights_check(w, c, &unused)) m3_test_failf("%s", m3_last_error());
    assert_int_equal(unused, 0);
    /* role API */
    m3_linear_w lw;
    assert_int_equal(m3_weights_linear(w, M3_W_MLP_GATE, 0, 0, &lw), M3_OK);
    assert_int_equal(lw.fmt, M3_WF_DENSE);
    assert_true(lw.rows == 256 && lw.cols == 128);
    assert_int_equal(lw.scale.dtype, M3_DT_INVALID);
    char name[256];
    m3_weight_name(name, sizeof name, M3_W_EXPERT_DOWN, 3, 7);
    assert_string_equal(name, "language_model.model.layers.3.block_sparse_moe.experts.7.w2.weight");
    /* conversion is exact: compare with the bytes read from the file */
    t = m3_weights_find(w, "language_model.model.layers.2.self_attn.q_proj.weight");
    assert_non_null(t);
    int64_t n = t->numel;
    uint16_t *raw = malloc((size_t)t->nbytes);
    float *got = malloc((size_t)n * sizeof(float));
    int fd = open(m3_weights_file_path(w, t->file), O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, raw, (size_t)t->nbytes, t->offset), t->nbytes);
    assert_int_equal(m3_weights_linear(w, M3_W_Q_PROJ, 2, 0, &lw), M3_OK);
    assert_int_equal(m3_linear_rows_f32(&lw, 0, lw.rows, got), M3_OK);
    double norm = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(got[i] == m3_bf16_to_f32(raw[i]));
        norm += (double)got[i] * (double)got[i];
    }
    assert_true(norm > 0); /* not a vacuous comparison */
    /* rows subset, then drop the layer and read again */
    assert_int_equal(m3_linear_rows_f32(&lw, 5, 2, got), M3_OK);
    assert_true(got[0] == m3_bf16_to_f32(raw[5 * 128]));
    assert_int_equal(m3_weights_drop(w, "language_model.model.layers.2."), M3_OK);
    assert_int_equal(m3_linear_rows_f32(&lw, 0, lw.rows, got), M3_OK);
    for (int64_t i = 0; i < n; i++) assert_true(got[i] == m3_bf16_to_f32(raw[i]));
    /* F32 router */
    m3_tensor rt;
    assert_int_equal(m3_weights_role_get(w, M3_W_ROUTER, 1, 0, &rt), M3_OK);
    assert_int_equal(rt.dtype, M3_DT_F32);
    t = m3_weights_find(w, "language_model.model.layers.1.block_sparse_moe.gate.weight");
    float *rf = malloc((size_t)t->nbytes);
    assert_int_equal(pread(fd, rf, (size_t)t->nbytes, t->offset), t->nbytes);
    assert_int_equal(m3_tensor_rows_f32(&rt, 0, 8, got), M3_OK);
    assert_memory_equal(rf, got, (size_t)t->nbytes);
    close(fd);
    assert_int_equal(m3_weights_get(w, "language_model.model.layers.9.self_attn.q_proj.weight", &rt),
                     M3_ERR_MISSING);
    assert_non_null(strstr(m3_last_error(), "layers.9.self_attn.q_proj"));
    free(rf);
    free(raw);
    free(got);
    m3_config_free(c);
    m3_weights_close(w);
}

static void half_conversion(void **state) {
    (void)state;
    /* every binary16 value converts exactly: check against the arithmetic definition */
    uint16_t *h = malloc(65536 * 2);
    float *f = malloc(65536 * sizeof(float));
    for (int i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    m3_tensor t = {.dtype = M3_DT_F16, .rank = 1, .shape = {65536}, .data = h};
    assert_int_equal(m3_tensor_rows_f32(&t, 0, 65536, f), M3_OK);
    for (int i = 0; i < 65536; i++) {
        int e = (i >> 10) & 31, m = i & 1023;
        double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
        if (i & 0x8000) v = -v;
        if (e == 31)
            assert_true(m ? isnan(f[i]) : isinf(f[i]));
        else
            assert_true((double)f[i] == v);
    }
    t.dtype = M3_DT_I32;
    assert_int_equal(m3_tensor_rows_f32(&t, 0, 1, f), M3_ERR_UNSUPPORTED);
    free(h);
    free(f);
}

static void header_validation(void **state) {
    (void)state;
    const char *ok1 = "{\"a\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}";
    struct {
        const char *hdr;
        int64_t data_len, declared;
        const char *want;
    } cases[] = {
        {ok1, 12, INT64_MAX, "header length 9223372036854775807 exceeds file size"},
        {ok1, 12, 1, "too short for a JSON object"},
        {"{\"a\":", 0, -1, "invalid JSON"},
        {"[1, 2]", 0, -1, "header is not a JSON object"},
        {"{\"a\": 3}", 0, -1, "header entry 'a' is not an object"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "unknown dtype 'F33'"},
        {"{\"a\":{\"dtype\":\"F8_E4M3FNUZ\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "unknown dtype"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "dtype missing"},
        {"{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,2]}}", 2, -1, "shape missing"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2,-1],\"data_offsets\":[0,2]}}", 2, -1, "shape[1] is not a non-negative integer"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2.5],\"data_offsets\":[0,2]}}", 2, -1, "shape[0] is not"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1, -1, "rank 9 exceeds 8"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,2]}}", 2, -1, "element count overflows"},
        {"{\"a\":{\"dtype\":\"F64\",\"shape\":[1125899906842624,4096],\"data_offsets\":[0,2]}}", 2, -1, "element count overflows"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2, -1, "data_offsets must be two integers"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":{\"x\":1,\"y\":2}}}", 2, -1, "data_offsets must be two integers"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 2, -1, "outside the data region of 2 bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,0]}}", 2, -1, "outside the data region"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-1,1]}}", 2, -1, "outside the data region"},
        {"{\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "2 bytes in data_offsets, but BF16 [2] needs 4"},
        {"{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2, -1, "are not whole bytes"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]}}", 6, -1, "overlap"},
        {"{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}", 4, -1, "stored twice"},
        {"{\"language_model.model.layers.0.mlp.up_proj.weight\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"language_model.model.layers.0.block_sparse_moe.up_proj.weight\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]}}",
         4, -1, "same tensor under aliases"},
        {"{\"__metadata__\": 5}", 0, -1, "__metadata__ is not an object"},
        {"{\"__metadata__\": {}}", 0, -1, "holds no tensors"},
        {"{\"\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, -1, "empty tensor name"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *p = m3_tmp_path("bad.safetensors");
        write_raw(p, cases[i].hdr, cases[i].data_len, cases[i].declared, false);
        expect_open_fails(p, M3_ERR_FORMAT, cases[i].want);
        /* the message names the file */
        assert_non_null(strstr(m3_last_error(), "bad.safetensors"));
    }
    /* a file shorter than 8 bytes */
    FILE *f = fopen(m3_tmp_path("short.safetensors"), "wb");
    fputs("abc", f);
    fclose(f);
    expect_open_fails(m3_tmp_path("short.safetensors"), M3_ERR_FORMAT,
                      "too short for a safetensors header");
    expect_open_fails(m3_tmp_path("nonexistent"), M3_ERR_IO, "no such file");
    mkdir_p("empty");
    expect_open_fails(m3_tmp_path("empty"), M3_ERR_MISSING,
                      "no model.safetensors or model.safetensors.index.json");
}

static void dtypes_and_padding(void **state) {
    (void)state;
    /* every safetensors dtype we accept, zero-size tensors sharing an offset, space padding,
     * __metadata__ */
    const char *names[] = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16",
                           "BF16", "F32", "F64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4"};
    ent e[18];
    char nm[18][32];
    for (int i = 0; i < 17; i++) {
        snprintf(nm[i], sizeof nm[i], "t%02d", i);
        e[i] = (ent){nm[i], names[i], 2, {3, 4}};
    }
    e[17] = (ent){"zero", "BF16", 2, {0, 7}};
    write_st(m3_tmp_path("dt.safetensors"), e, 18, true);
    m3_weights *w = NULL;
    if (m3_weights_open(&w, m3_tmp_path("dt.safetensors"))) m3_test_failf("%s", m3_last_error());
    assert_int_equal(m3_weights_n_tensors(w), 18);
    const m3_tensor_info *t = m3_weights_find(w, "t16");
    assert_int_equal(t->dtype, M3_DT_F4);
    assert_int_equal(t->nbytes, 6);
    assert_int_equal(m3_weights_find(w, "t12")->nbytes, 96);
    assert_int_equal(m3_weights_find(w, "zero")->nbytes, 0);
    m3_tensor v;
    assert_int_equal(m3_weights_get(w, "t01", &v), M3_OK);
    /* data content as written: byte i of the data region is (i*7+1)&0xFF */
    int64_t base = m3_weights_find(w, "t01")->offset - m3_weights_find(w, "t00")->offset;
    assert_int_equal(((unsigned char *)v.data)[0], (unsigned char)((base * 7 + 1) & 0xFF));
    m3_weights_close(w);
    /* trailing spaces after the JSON (alignment padding) are fine */
    write_raw(m3_tmp_path("pad.safetensors"),
              "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}       ", 2, -1,
              false);
    assert_int_equal(m3_weights_open(&w, m3_tmp_path("pad.safetensors")), M3_OK);
    m3_weights_close(w);
}

static const ent shard_ents[] = {
    {"language_model.model.embed_tokens.weight", "BF16", 2, {16, 8}},
    {"model.language_model.layers.0.self_attn.q_proj.weight", "BF16", 2, {8, 8}},
    {"lm_head.weight", "BF16", 2, {16, 8}},
    {"language_model.model.layers.1.block_sparse_moe.experts.2.up_proj.weight", "BF16", 2, {4, 8}},
    {"language_model.model.layers.1.self_attn.indexer.k_norm.weight", "F32", 1, {8}},
    {"language_model.model.layers.1.block_sparse_moe.experts.2.w2.weight_scale_inv", "U8", 2, {8, 1}},
};

static void aliases_and_shards(void **state) {
    (void)state;
    mkdir_p("single");
    mkdir_p("sharded");
    write_st(m3_tmp_path("single/model.safetensors"), shard_ents, 6, true);
    write_st(m3_tmp_path("sharded/a.safetensors"), shard_ents, 3, true);
    write_st(m3_tmp_path("sharded/b.safetensors"), shard_ents + 3, 3, true);
    FILE *f = fopen(m3_tmp_path("sharded/model.safetensors.index.json"), "w");
    fprintf(f, "{\"metadata\": {\"total_size\": 12345}, \"weight_map\": {");
    for (int i = 0; i < 6; i++)
        fprintf(f, "%s\"%s\": \"%s\"", i ? ", " : "", shard_ents[i].name, i < 3 ? "a.safetensors" : "b.safetensors");
    fprintf(f, "}}");
    fclose(f);
    m3_weights *ws = NULL, *wm = NULL;
    if (m3_weights_open(&ws, m3_tmp_path("single"))) m3_test_failf("%s", m3_last_error());
    if (m3_weights_open(&wm, m3_tmp_path("sharded"))) m3_test_failf("%s", m3_last_error());
    assert_int_equal(m3_weights_n_files(ws), 1);
    assert_int_equal(m3_weights_n_files(wm), 2);
    assert_int_equal(m3_weights_n_tensors(ws), 6);
    assert_int_equal(m3_weights_n_tensors(wm), 6);
    assert_true(m3_weights_bytes(ws) == m3_weights_bytes(wm));
    assert_true(m3_weights_index_total_size(wm) == 12345);
    assert_non_null(m3_weights_index_path(wm));
    assert_null(m3_weights_index_path(ws));
    const char *canon[] = {
        "language_model.model.embed_tokens.weight",
        "language_model.model.layers.0.self_attn.q_proj.weight",
        "language_model.lm_head.weight",
        "language_model.model.layers.1.block_sparse_moe.experts.2.w3.weight",
        "language_model.model.layers.1.self_attn.index_k_norm.weight",
        "language_model.model.layers.1.block_sparse_moe.experts.2.w2.weight_scale",
    };
    for (int i = 0; i < 6; i++) {
        const m3_tensor_info *a = m3_weights_find(ws, canon[i]), *b = m3_weights_find(wm, canon[i]);
        if (!a || !b) m3_test_failf("alias not resolved: %s", canon[i]);
        assert_string_equal(a->name, shard_ents[i].name);
        assert_string_equal(a->canon, canon[i]);
        assert_int_equal(b->file, i < 3 ? 0 : 1);
        m3_tensor ta, tb;
        assert_int_equal(m3_weights_get(ws, canon[i], &ta), M3_OK);
        assert_int_equal(m3_weights_get(wm, shard_ents[i].name, &tb), M3_OK);
        /* same bytes: tensor i of the shard starts at the same data offset in both layouts
         * only for the first shard; compare content patterns instead */
        int64_t oa = a->offset - m3_weights_find(ws, canon[0])->offset;
        int64_t ob = b->offset - (i < 3 ? m3_weights_find(wm, canon[0])->offset
                                        : m3_weights_find(wm, canon[3])->offset);
        assert_int_equal(((unsigned char *)ta.data)[0], (unsigned char)((oa * 7 + 1) & 0xFF));
        assert_int_equal(((unsigned char *)tb.data)[0], (unsigned char)((ob * 7 + 1) & 0xFF));
    }
    assert_int_equal(m3_weights_drop(wm, "language_model."), M3_OK);
    m3_weights_close(ws);
    m3_weights_close(wm);
    /* index problems */
    mkdir_p("badidx");
    write_st(m3_tmp_path("badidx/a.safetensors"), shard_ents, 3, false);
    struct { const char *idx; m3_status st; const char *want; } cases[] = {
        {"{\"weight_map\": {\"language_model.model.embed_tokens.weight\": \"a.safetensors\", \"x.weight\": \"a.safetensors\"}}",
         M3_ERR_FORMAT, "tensor 'x.weight' listed in weight_map is not in a.safetensors"},
        {"{\"weight_map\": {\"x\": \"../a.safetensors\"}}", M3_ERR_FORMAT, "must be a plain file name"},
        {"{\"weight_map\": {\"x\": \"nothere.safetensors\"}}", M3_ERR_IO, "nothere.safetensors: cannot open"},
        {"{\"weight_map\": [1]}", M3_ERR_FORMAT, "no weight_map object"},
        {"{\"weight_map\": {}}", M3_ERR_FORMAT, "weight_map is empty"},
        {"{\"metadata\": {\"total_size\": \"big\"}, \"weight_map\": {\"x\": \"a.safetensors\"}}", M3_ERR_FORMAT, "total_size is not an integer"},
        {"{\"weight_map\": ", M3_ERR_FORMAT, "invalid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        f = fopen(m3_tmp_path("badidx/model.safetensors.index.json"), "w");
        fputs(cases[i].idx, f);
        fclose(f);
        expect_open_fails(m3_tmp_path("badidx"), cases[i].st, cases[i].want);
    }
    /* a shard tensor missing from weight_map is only a warning */
    f = fopen(m3_tmp_path("badidx/model.safetensors.index.json"), "w");
    fputs("{\"weight_map\": {\"language_model.model.embed_tokens.weight\": \"a.safetensors\"}}", f);
    fclose(f);
    assert_int_equal(m3_weights_open(&wm, m3_tmp_path("badidx")), M3_OK);
    assert_int_equal(m3_weights_n_warnings(wm), 1);
    assert_non_null(strstr(m3_weights_warning(wm, 0), "2 tensors in the shards are not listed"));
    m3_weights_close(wm);
}

/* Checkpoint of every tensor the config implies (holes for data). skip: a canonical name
 * left out; reshape: a name written with shape {9, 9}; quant: 0 dense, 1 MXFP4 experts and
 * shared experts, 2 MXFP8 (weight_scale_inv), 3 MXFP4 with a wrong scale shape. */
static void write_ckpt(const m3_config *c, const char *dir, const char *skip, const char *reshape,
                       int quant) {
    mkdir_p(dir);
    int cap = 4096, n = 0;
    ent *e = calloc((size_t)cap, sizeof *e);
    char (*names)[200] = calloc((size_t)cap, 200);
    for (int role = 0; role < M3_W_ROLE_COUNT; role++) {
        for (int L = 0; L < 64; L++) {
            int64_t s[8];
            int r;
            if (!m3_weight_shape(c, (m3_wrole)role, L, s, &r)) continue;
            bool global = false;
            char probe[200], probe2[200];
            m3_weight_name(probe, sizeof probe, (m3_wrole)role, 0, 0);
            m3_weight_name(probe2, sizeof probe2, (m3_wrole)role, 1, 0);
            global = !strcmp(probe, probe2);
            if (global && L > 0) break;
            int ne = role == M3_W_EXPERT_GATE || role == M3_W_EXPERT_UP || role == M3_W_EXPERT_DOWN
                         ? c->n_expert
                         : 1;
            for (int x = 0; x < ne; x++) {
                assert_true(n + 2 < cap);
                m3_weight_name(names[n], 200, (m3_wrole)role, L, x);
                if (skip && !strcmp(names[n], skip)) continue;
                bool q = quant && (strstr(names[n], ".experts.") || strstr(names[n], ".shared_experts."));
                e[n] = (ent){names[n], role == M3_W_ROUTER || role == M3_W_ROUTER_BIAS ? "F32" : "BF16", r,
                             {s[0], s[1], s[2], s[3], s[4]}};
                if (reshape && !strcmp(names[n], reshape)) e[n].shape[0] = e[n].shape[1] = 9;
                if (q) {
                    int64_t out = s[0], in = s[1];
                    e[n].dtype = quant == 2 ? "F8_E4M3" : "U8";
                    if (quant != 2) e[n].shape[1] = in / 2;
                    n++;
                    char sn[240];
                    snprintf(sn, sizeof sn, "%s_scale", names[n - 1]);
                    if (skip && !strcmp(sn, skip)) continue;
                    snprintf(names[n], 200, "%.190s%s", sn, quant == 2 ? "_inv" : "");
                    e[n] = (ent){names[n], quant == 2 ? "F8_E8M0" : "U8", 2, {out, in / 32 + (quant == 3)}};
                }
                n++;
            }
        }
    }
    char p[300];
    snprintf(p, sizeof p, "%.200s/model.safetensors", dir);
    write_st(m3_tmp_path(p), e, n, false);
    free(e);
    free(names);
}

static void check_reports(const m3_config *c, const char *dir, m3_status st, const char *want) {
    m3_weights *w = NULL;
    if (m3_weights_open(&w, m3_tmp_path(dir))) m3_test_failf("%s: %s", dir, m3_last_error());
    m3_clear_error();
    m3_status s = m3_weights_check(w, c, NULL);
    if (s != st || (want && !strstr(m3_last_error(), want)))
        m3_test_failf("%s: check gave %d '%s', expected %d '%s'", dir, s, m3_last_error(), st,
                      want ? want : "");
    m3_weights_close(w);
}

static void checkpoint_check(void **state) {
    (void)state;
    m3_config *c = tiny_cfg();
    write_ckpt(c, "ck_full", NULL, NULL, 0);
    check_reports(c, "ck_full", M3_OK, NULL);
    write_ckpt(c, "ck_miss", "language_model.model.layers.2.self_attn.index_k_proj.weight", NULL, 0);
    check_reports(c, "ck_miss", M3_ERR_MISSING,
                  "missing tensor language_model.model.layers.2.self_attn.index_k_proj.weight "
                  "(config implies [32, 128])");
    write_ckpt(c, "ck_vmiss", "vision_tower.vision_model.encoder.layers.1.mlp.fc1.bias", NULL, 0);
    check_reports(c, "ck_vmiss", M3_ERR_MISSING, "encoder.layers.1.mlp.fc1.bias");
    write_ckpt(c, "ck_shape", NULL, "language_model.model.layers.1.self_attn.q_proj.weight", 0);
    check_reports(c, "ck_shape", M3_ERR_SHAPE,
                  "tensor language_model.model.layers.1.self_attn.q_proj.weight has shape [9, 9], "
                  "config implies [256, 128]");
    write_ckpt(c, "ck_nshape", NULL, "language_model.model.layers.3.input_layernorm.weight", 0);
    check_reports(c, "ck_nshape", M3_ERR_SHAPE, "input_layernorm.weight has shape [9]");
    write_ckpt(c, "ck_mxfp4", NULL, NULL, 1);
    check_reports(c, "ck_mxfp4", M3_OK, NULL);
    write_ckpt(c, "ck_mxfp8", NULL, NULL, 2);
    check_reports(c, "ck_mxfp8", M3_OK, NULL);
    write_ckpt(c, "ck_badscale", NULL, NULL, 3);
    check_reports(c, "ck_badscale", M3_ERR_SHAPE, "expected U8/F8_E8M0 [32, 4]");
    write_ckpt(c, "ck_noscale", "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale", NULL, 1);
    check_reports(c, "ck_noscale", M3_ERR_MISSING, "experts.0.w1.weight_scale");

    /* quantized tensor views: logical shape, stored forms, params */
    m3_weights *w = NULL;
    assert_int_equal(m3_weights_open(&w, m3_tmp_path("ck_mxfp4")), M3_OK);
    m3_linear_w lw;
    assert_int_equal(m3_weights_linear(w, M3_W_EXPERT_DOWN, 1, 5, &lw), M3_OK);
    assert_int_equal(lw.fmt, M3_WF_MXFP4);
    assert_true(lw.rows == 128 && lw.cols == 32);
    assert_true(lw.w.dtype == M3_DT_U8 && lw.w.shape[0] == 128 && lw.w.shape[1] == 16);
    assert_true(lw.scale.dtype == M3_DT_U8 && lw.scale.shape[1] == 1);
    const m3_tensor_info *t = m3_weights_find(w, "language_model.model.layers.1.block_sparse_moe.experts.5.w2.weight");
    assert_true(t->params == 128 * 32 && t->numel == 128 * 16);
    assert_true(m3_weights_find(w, "language_model.model.layers.1.block_sparse_moe.experts.5.w2.weight_scale")->params == 0);
    /* stored form vs quantization_config: none in the tiny config -> every expert and shared
     * linear disagrees (3 MoE layers x (8 experts x 3 + 3 shared)); a Quark config that
     * excludes everything else agrees */
    char first[300];
    assert_int_equal(m3_weights_quant_mismatch(w, c, first, sizeof first), 3 * (8 * 3 + 3));
    assert_string_equal(first, "language_model.model.layers.1.block_sparse_moe.shared_experts.gate_proj");
    {
        size_t L = c->json_len;
        while (L && c->json_text[L - 1] != '}') L--;
        const char *qc = ", \"quantization_config\": {\"quant_method\": \"quark\", "
                         "\"global_quant_config\": {\"weight\": {\"dtype\": \"fp4\"}}, "
                         "\"exclude\": [\"*lm_head\", \"*vision_tower*\", \"*projector*\", "
                         "\"*patch_merge_mlp*\", \"*block_sparse_moe.gate\", \"*self_attn*\", "
                         "\"*mlp.*\"]}}";
        char *txt = malloc(L + strlen(qc) + 1);
        memcpy(txt, c->json_text, L - 1);
        strcpy(txt + L - 1, qc);
        m3_config *cq = NULL;
        if (m3_config_parse(&cq, txt, strlen(txt), "q.json")) m3_test_failf("%s", m3_last_error());
        assert_int_equal(m3_weights_quant_mismatch(w, cq, NULL, 0), 0);
        m3_config_free(cq);
        free(txt);
    }
    /* MX dequantization against an independent decode of the stored bytes: e2m1 code
     * (low nibble = even element) times 2^(scale - 127); scale 0xFF poisons the block */
    {
        float rows[3 * 32];
        assert_int_equal(m3_linear_rows_f32(&lw, 5, 3, rows), M3_OK);
        static const float e2m1[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
        const uint8_t *wc = lw.w.data, *sc = lw.scale.data;
        for (int r = 0; r < 3; r++)
            for (int k = 0; k < 32; k++) {
                uint8_t byte = wc[(5 + r) * 16 + k / 2];
                uint8_t code = (k & 1) ? byte >> 4 : byte & 15;
                uint8_t sb = sc[(5 + r) * 1 + k / 32];
                float v = (code & 8 ? -1.0f : 1.0f) * e2m1[code & 7] * ldexpf(1.0f, sb - 127);
                float got = rows[r * 32 + k];
                if (sb == 0xFF ? !isnan(got) : got != v)
                    m3_test_failf("MXFP4 row %d col %d: got %g want %g", 5 + r, k, (double)got, (double)v);
            }
        assert_int_equal(m3_linear_rows_f32(&lw, 127, 2, rows), M3_ERR_ARG);
    }
    m3_weights_close(w);
    assert_int_equal(m3_weights_open(&w, m3_tmp_path("ck_mxfp8")), M3_OK);
    assert_int_equal(m3_weights_linear(w, M3_W_SHARED_GATE, 2, 0, &lw), M3_OK);
    assert_int_equal(lw.fmt, M3_WF_MXFP8);
    assert_true(lw.rows == 32 && lw.cols == 128 && lw.w.dtype == M3_DT_F8_E4M3);
    assert_true(lw.scale.dtype == M3_DT_F8_E8M0 && lw.scale.shape[1] == 4);
    {
        float rows[2 * 128];
        assert_int_equal(m3_linear_rows_f32(&lw, 30, 2, rows), M3_OK);
        const uint8_t *wc = lw.w.data, *sc = lw.scale.data;
        for (int r = 0; r < 2; r++)
            for (int k = 0; k < 128; k++) {
                uint8_t c8 = wc[(30 + r) * 128 + k], sb = sc[(30 + r) * 4 + k / 32];
                int e = (c8 >> 3) & 15, m = c8 & 7;
                float mag = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
                float v = (c8 & 0x80 ? -mag : mag) * ldexpf(1.0f, sb - 127);
                bool nan_code = (c8 & 0x7F) == 0x7F;
                float got = rows[r * 128 + k];
                if ((sb == 0xFF || nan_code) ? !isnan(got) : got != v)
                    m3_test_failf("MXFP8 row %d col %d: got %g want %g", 30 + r, k, (double)got, (double)v);
            }
    }
    m3_weights_close(w);
    m3_config_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(tiny_fixture),
        cmocka_unit_test(half_conversion),
        cmocka_unit_test(header_validation),
        cmocka_unit_test(dtypes_and_padding),
        cmocka_unit_test(aliases_and_shards),
        cmocka_unit_test(checkpoint_check),
    };
    return M3_RUN_TESTS_IN_TMPDIR(tests);
}
