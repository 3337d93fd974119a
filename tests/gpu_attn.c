/* tests/gpu_attn.c: gpu/attn.hip against ref/attn.c: dense causal GQA attention (prefill
 * after a history, decode) and block-sparse attention with teacher-forced block selections
 * (random ids, -1 padding, duplicates, the own block present or absent), under every
 * profile (fp32; hf eager scores, position order; atom partitions of 256 and selection
 * order). Shapes: M3 (H = 64, Hkv = 4, Dh = 128, Bs = 128, width 16) and odd (H = 6,
 * Hkv = 3, Dh = 80, T = 1, 3, 33, 131; H = 8, Hkv = 2, Dh = 64), scattered (unsorted,
 * repeated) positions for the dense kernels. Bounds GPU_NMSE_F32 (fp32) / GPU_NMSE_BF16; the
 * flash kernels (hf, atom) GPU_NMSE_FLASH, and each flash kernel run twice must agree bit for
 * bit. Outputs are guarded and poisoned (tests/gpu_test.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/attn.h"
#include "tests/gpu_test.h"

static void profile_of(m3_profile *p, int which) {
    if (which == 0) m3_profile_fp32(p);
    else if (which == 1) m3_profile_hf(p);
    else m3_profile_atom(p);
}

typedef struct {
    int T, n_ctx, H, Hkv, Dh;
    int width, block; /* width 0: dense */
    int scatter;      /* 1: random positions in [0, n_ctx) (unsorted, repeats) */
} attn_shape;

static void attn_case(m3_gpu *g, const attn_shape *s, int prof) {
    m3_profile p;
    profile_of(&p, prof);
    m3_attn_params ap;
    m3_attn_params_init(&ap, s->H, s->Hkv, s->Dh);
    m3_rng r;
    m3_rng_init(&r, m3_test_seed(), 800 + (uint64_t)s->T * 17 + (uint64_t)s->n_ctx + prof);
    const int T = s->T, C = s->n_ctx, ldq = s->H * s->Dh + 64; /* a padded row pitch */
    const int64_t nq = (int64_t)T * ldq, nkv = (int64_t)C * s->Hkv * s->Dh,
                  no = (int64_t)T * s->H * s->Dh;
    float *q = malloc(nq * sizeof *q), *k = malloc(nkv * sizeof *k), *v = malloc(nkv * sizeof *v);
    float *ref = malloc(no * sizeof *ref), *got = malloc(no * sizeof *got);
    int32_t *pos = malloc(T * sizeof *pos);
    m3_fill_normal(&r, q, nq, 1.0f);
    m3_fill_normal(&r, k, nkv, 1.0f);
    m3_fill_normal(&r, v, nkv, 1.0f);
    for (int t = 0; t < T; t++) /* the last T positions of the history, or scattered */
        pos[t] = s->scatter ? (int32_t)(m3_rng_u32(&r) % (uint32_t)C) : C - T + t;
    int32_t *topk = NULL;
    if (s->width) {
        topk = malloc((size_t)s->Hkv * T * s->width * sizeof *topk);
        for (int gq = 0; gq < s->Hkv; gq++)
            for (int t = 0; t < T; t++) {
                int32_t *row = topk + ((size_t)gq * T + t) * s->width;
                int nb = pos[t] / s->block + 1;
                for (int i = 0; i < s->width; i++) row[i] = (int32_t)(m3_rng_u32(&r) % (uint32_t)nb);
                row[s->width - 1] = -1;                      /* padding */
                if (s->width > 3) row[s->width - 2] = row[0]; /* a duplicate */
            }
    }
    if (p.attn_out_bf16) { /* the bf16 path sees bf16 values: give the reference the same */
        for (int64_t i = 0; i < nq; i++) q[i] = m3_round_bf16(q[i]);
        for (int64_t i = 0; i < nkv; i++) k[i] = m3_round_bf16(k[i]), v[i] = m3_round_bf16(v[i]);
    }
    size_t sb = m3_attn_scratch_bytes(C, &ap);
    void *scratch = malloc(sb);
    if (s->width)
        m3_attn_sparse(ref, q, ldq, k, v, pos, T, C, topk, s->width, s->block, &ap, &p, scratch, sb);
    else
        m3_attn_dense(ref, q, ldq, k, v, pos, T, C, &ap, &p, scratch, sb);
    free(scratch);

    void *dpos, *dtopk = NULL;
    GPU_OK(m3_gpu_alloc(g, &dpos, T * sizeof *pos));
    GPU_OK(m3_gpu_upload(g, dpos, pos, T * sizeof *pos));
    if (topk) {
        size_t tb = (size_t)s->Hkv * T * s->width * sizeof *topk;
        GPU_OK(m3_gpu_alloc(g, &dtopk, tb));
        GPU_OK(m3_gpu_upload(g, dtopk, topk, tb));
    }
    char what[200];
    snprintf(what, sizeof what, "attn_%s%%s(%s,T=%d,C=%d,H=%d,Hkv=%d,Dh=%d,W=%d)",
             s->width ? "sparse" : "dense", p.name, T, C, s->H, s->Hkv, s->Dh, s->width);
    char name[220];
    if (p.attn_out_bf16) {
        m3_bf16 *dq = gpu_upload_bf16(g, q, nq, NULL), *dk = gpu_upload_bf16(g, k, nkv, NULL),
                *dv = gpu_upload_bf16(g, v, nkv, NULL);
        m3_bf16 *dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
        if (s->width)
            GPU_OK(m3_gpu_attn_sparse(g, dout, dq, ldq, dk, dv, dpos, T, C, dtopk, s->width,
                                      s->block, &ap, &p));
        else
            GPU_OK(m3_gpu_attn_dense(g, dout, dq, ldq, dk, dv, dpos, T, C, &ap, &p));
        gpu_download_bf16(g, got, dout, no);
        gpu_guard_check(g, dout, no * sizeof(m3_bf16), "attention bf16 out");
        snprintf(name, sizeof name, what, " bf16");
        gpu_expect_nmse(ref, got, no, GPU_NMSE_BF16, name);
        /* the flash kernels: other rounding points (unnormalised bf16 P, fp32 LSE merge) */
        dout = gpu_guard_alloc(g, no * sizeof(m3_bf16));
        if (s->width)
            GPU_OK(m3_gpu_attn_sparse_flash(g, dout, dq, ldq, dk, dv, dpos, T, C, dtopk, s->width,
                                            s->block, &ap, &p));
        else
            GPU_OK(m3_gpu_attn_dense_flash(g, dout, dq, ldq, dk, dv, dpos, T, C, &ap, &p));
        gpu_download_bf16(g, got, dout, no);
        gpu_guard_check(g, dout, no * sizeof(m3_bf16), "attention flash out");
        snprintf(name, sizeof name, what, " flash");
        gpu_expect_nmse(ref, got, no, GPU_NMSE_FLASH, name);
        /* a second run into a fresh poisoned buffer must agree bit for bit (a race or a read
         * of unwritten shared memory shows up as a moving result) */
        m3_bf16 *dout2 = gpu_guard_alloc(g, no * sizeof(m3_bf16));
        if (s->width)
            GPU_OK(m3_gpu_attn_sparse_flash(g, dout2, dq, ldq, dk, dv, dpos, T, C, dtopk, s->width,
                                            s->block, &ap, &p));
        else
            GPU_OK(m3_gpu_attn_dense_flash(g, dout2, dq, ldq, dk, dv, dpos, T, C, &ap, &p));
        float *got2 = malloc(no * sizeof *got2);
        gpu_download_bf16(g, got2, dout2, no);
        gpu_guard_check(g, dout2, no * sizeof(m3_bf16), "attention flash out (rerun)");
        if (memcmp(got, got2, no * sizeof *got))
            m3_test_failf("%s: two runs differ (race?)", name);
        free(got2);
    }
    float *dq = gpu_upload_f32(g, q, nq), *dk = gpu_upload_f32(g, k, nkv), *dv = gpu_upload_f32(g, v, nkv);
    float *dout = gpu_guard_alloc(g, no * sizeof(float));
    if (s->width)
        GPU_OK(m3_gpu_attn_sparse_f32(g, dout, dq, ldq, dk, dv, dpos, T, C, dtopk, s->width,
                                      s->block, &ap, &p));
    else
        GPU_OK(m3_gpu_attn_dense_f32(g, dout, dq, ldq, dk, dv, dpos, T, C, &ap, &p));
    gpu_download_f32(g, got, dout, no);
    gpu_guard_check(g, dout, no * sizeof(float), "attention f32 out");
    snprintf(name, sizeof name, what, "_f32");
    gpu_expect_nmse(ref, got, no, p.attn_out_bf16 ? GPU_NMSE_BF16 : GPU_NMSE_F32, name);
    free(q); free(k); free(v); free(ref); free(got); free(pos); free(topk);
}

static void attn_dense_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const attn_shape shapes[] = {
        {33, 300, 64, 4, 128, 0, 0, 0},  /* prefill of 33 after 267 cached (2 atom partitions) */
        {1, 2000, 64, 4, 128, 0, 0, 0},  /* decode, 8 partitions */
        {3, 5, 6, 3, 80, 0, 0, 0},       /* odd */
        {33, 33, 64, 4, 128, 0, 0, 0},   /* plain causal prefill */
        {70, 200, 64, 4, 128, 0, 0, 0},  /* several 64-key tiles, tokens in several blocks */
        {131, 600, 64, 4, 128, 0, 0, 0}, /* 10 key tiles, 17 token blocks (last one partial) */
        {40, 700, 64, 4, 128, 0, 0, 1}, /* scattered positions: blocks span many tiles */
        {19, 150, 8, 2, 64, 0, 0, 1},   /* odd: hq = 4, Dh = 64, scattered */
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) attn_case(g, &shapes[i], prof);
}

static void attn_sparse_matches_ref(void **state) {
    m3_gpu *g = gpu_or_skip(state);
    static const attn_shape shapes[] = {
        {3, 4096, 64, 4, 128, 16, 128, 0}, /* decode-like rows near the end of a 4K history */
        {1, 9000, 64, 4, 128, 16, 128, 0},
        {33, 700, 6, 3, 80, 5, 64, 0},     /* odd */
        /* the NVIDIA kernel's launch shapes on the H200 (132 SMs): rows (T x Hkv) < 132 take
         * 8-warp blocks, several per row (the fused merge) when rows <= 66 at Dh 128; else
         * 4-warp blocks, one per row from 198 rows (no merge), two per row for T = 40 */
        {40, 1500, 64, 4, 128, 16, 128, 0},
        {80, 3000, 64, 4, 128, 16, 128, 0},
        {2, 20000, 64, 4, 128, 64, 128, 0}, /* width 64: 65 ranges, the most blocks per row */
        {5, 2000, 8, 2, 64, 7, 80, 0},      /* odd: Bs 80 (5 tiles of 16 keys), hq 4, Dh 64 */
        /* T = 1 (and T = 2 above, rows x 16 <= 132): a cluster of blocks per row, merged in
         * distributed shared memory; pos < 128 leaves most of a row's blocks without keys */
        {1, 100, 64, 4, 128, 16, 128, 0},
        {1, 700, 6, 3, 80, 5, 64, 0},       /* odd: 3 blocks a row */
        /* T = 1-2 through pc_k (a cluster of <= 16 CTAs a row, the keys split evenly): T = 2,
         * a CTA's keys across Bs-80 ranges, width 40 (repeats across warps) */
        {2, 5000, 64, 4, 128, 16, 128, 0},
        {1, 2000, 8, 2, 64, 7, 80, 0},
        {1, 3000, 64, 4, 128, 40, 16, 0},
        /* width 20 at M3 shapes: ~19 blocks a row, so a CTA of pc_k's contiguous instance takes
         * more than 128 keys (a second S pass, more than 8 16-key groups) */
        {1, 40000, 64, 4, 128, 20, 128, 0},
    };
    for (int prof = 0; prof < 3; prof++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) attn_case(g, &shapes[i], prof);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(attn_dense_matches_ref),
        cmocka_unit_test(attn_sparse_matches_ref),
    };
    return M3_RUN_GPU_TESTS(tests);
}
