/* tests/util.c: see util.h. */
#include "tests/util.h"

#include <errno.h> /* program_invocation_short_name (GNU) */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/model.h"

uint64_t m3_test_seed(void) {
    static uint64_t seed;
    static int done;
    if (!done) {
        const char *e = getenv("M3_SEED");
        seed = e ? strtoull(e, NULL, 0) : 20261129u;
        done = 1;
    }
    return seed;
}

void m3_rng_init(m3_rng *r, uint64_t seed, uint64_t stream) {
    r->state = 0;
    r->inc = (stream << 1u) | 1u;
    m3_rng_u32(r);
    r->state += seed;
    m3_rng_u32(r);
}

uint32_t m3_rng_u32(m3_rng *r) {
    uint64_t old = r->state;
    r->state = old * 6364136223846793005ULL + r->inc;
    uint32_t xs = (uint32_t)(((old >> 18u) ^ old) >> 27u);
    uint32_t rot = (uint32_t)(old >> 59u);
    return (xs >> rot) | (xs << ((-rot) & 31));
}

float m3_rng_uniform(m3_rng *r, float lo, float hi) {
    float u = (float)(m3_rng_u32(r) >> 8) * (1.0f / 16777216.0f);
    return lo + (hi - lo) * u;
}

float m3_rng_normal(m3_rng *r) {
    double u1 = ((double)(m3_rng_u32(r) >> 8) + 0.5) / 16777216.0;
    double u2 = (double)(m3_rng_u32(r) >> 8) / 16777216.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

void m3_fill_uniform(m3_rng *r, float *x, int64_t n, float lo, float hi) {
    for (int64_t i = 0; i < n; i++) x[i] = m3_rng_uniform(r, lo, hi);
}

void m3_fill_normal(m3_rng *r, float *x, int64_t n, float sd) {
    for (int64_t i = 0; i < n; i++) x[i] = sd * m3_rng_normal(r);
}

void m3_fill_int(m3_rng *r, float *x, int64_t n, int scale_bits) {
    uint32_t span = (1u << scale_bits) * 2u + 1u;
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)((int64_t)(m3_rng_u32(r) % span) - (int64_t)(1u << scale_bits));
}

#define GUARD_WORDS 16
#define CANARY 0xC0FFEE5Au

typedef struct { size_t bytes; uint32_t pad[GUARD_WORDS - 2]; } guard_hdr;

void *m3_guard_alloc(size_t bytes) {
    size_t total = sizeof(guard_hdr) + GUARD_WORDS * 4 + bytes + GUARD_WORDS * 4;
    unsigned char *base = malloc(total);
    assert_non_null(base);
    guard_hdr *h = (guard_hdr *)base;
    h->bytes = bytes;
    uint32_t *pre = (uint32_t *)(base + sizeof(guard_hdr));
    unsigned char *p = base + sizeof(guard_hdr) + GUARD_WORDS * 4;
    uint32_t post[GUARD_WORDS];
    for (int i = 0; i < GUARD_WORDS; i++) pre[i] = post[i] = CANARY;
    memcpy(p + bytes, post, sizeof post);
    memset(p, 0xFF, bytes);
    return p;
}

void m3_guard_check(const void *vp) {
    const unsigned char *p = vp;
    const unsigned char *base = p - GUARD_WORDS * 4 - sizeof(guard_hdr);
    const guard_hdr *h = (const guard_hdr *)base;
    const uint32_t *pre = (const uint32_t *)(base + sizeof(guard_hdr));
    uint32_t post[GUARD_WORDS];
    memcpy(post, p + h->bytes, sizeof post);
    for (int i = 0; i < GUARD_WORDS; i++) {
        if (pre[i] != CANARY) m3_test_failf("guard: write before buffer start (word %d)", i);
        if (post[i] != CANARY) m3_test_failf("guard: write past buffer end (word %d)", i);
    }
}

void m3_guard_free(void *vp) {
    if (!vp) return;
    m3_guard_check(vp);
    free((unsigned char *)vp - GUARD_WORDS * 4 - sizeof(guard_hdr));
}

const char *m3_shared_dir(void) {
    const char *e = getenv("M3_SHARED");
    return e ? e : "../shared";
}

const char *m3_bin(void) {
    const char *e = getenv("M3");
    return e ? e : "build/m3";
}

void m3_test_failf(const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fail_msg("%s (M3_SEED=%llu)", buf, (unsigned long long)m3_test_seed());
}

int m3_run_cmd(const char *cmd, char **out) {
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *f = popen(full, "r");
    if (!f) return -1;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t k;
    while (buf && (k = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += k;
        if (cap - len < 1024) {
            cap *= 2;
            char *nb = realloc(buf, cap);
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
        }
    }
    if (buf) buf[len] = 0;
    int st = pclose(f);
    if (out) *out = buf; else free(buf);
    if (st == -1) return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int m3_run_m3(char **out, const char *fmt, ...) {
    char args[4096], cmd[4400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", m3_bin(), args);
    return m3_run_cmd(cmd, out);
}

static char tmpdir[256];

int m3_tmpdir_setup(void **state) {
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/m3_%s_XXXXXX", program_invocation_short_name);
    return mkdtemp(tmpdir) ? 0 : -1;
}

int m3_tmpdir_teardown(void **state) {
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

const char *m3_tmpdir(void) {
    return tmpdir;
}

const char *m3_tmp_path(const char *name) {
    static char buf[8][1024];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmpdir, name);
    return buf[k];
}

int32_t *m3_read_tokens(const char *dir, int *n) {
    char p[600];
    snprintf(p, sizeof p, "%s/tokens.txt", dir);
    FILE *f = fopen(p, "r");
    if (!f) fail_msg("%s: cannot open", p);
    int32_t *t = malloc(4096 * sizeof *t);
    assert_non_null(t);
    int k = 0;
    long v;
    while (k < 4096 && fscanf(f, " %ld", &v) == 1)
        t[k++] = (int32_t)v;
    fclose(f);
    if (k == 0) fail_msg("%s: no tokens", p);
    *n = k;
    return t;
}

m3_model *m3_test_open_model(const char *dir, const char *prof, const char *override,
                             const m3_variant *v) {
    char p[600];
    snprintf(p, sizeof p, "%s/model", dir);
    m3_profile pr;
    assert_int_equal(m3_profile_by_name(&pr, prof), M3_OK);
    m3_model *m = NULL;
    if (m3_model_open(&m, p, override, &pr)) fail_msg("%s", m3_last_error());
    if (v && m3_model_set_variant(m, v)) fail_msg("%s", m3_last_error());
    return m;
}

_Static_assert(M3_KEY_MAX == 128, "m3_capture keys hold M3_KEY_MAX bytes");

m3_capture *m3_capture_create(void) {
    m3_capture *c = calloc(1, sizeof *c);
    assert_non_null(c);
    return c;
}

void m3_capture_clear(m3_capture *c) {
    for (int i = 0; i < c->n; i++)
        free(c->t[i].data);
    c->n = 0;
}

void m3_capture_free(m3_capture *c) {
    if (!c) return;
    m3_capture_clear(c);
    free(c->key);
    free(c->t);
    free(c);
}

/* a copy of t's 4-byte elements (malloc'ed, at least 1 byte so an empty stage is not NULL) */
static void *copy_data(const m3_tensor *t) {
    size_t b = (size_t)m3_tensor_numel(t) * 4;
    void *d = malloc(b ? b : 1);
    M3_ASSERT(d);
    memcpy(d, t->data, b);
    return d;
}

m3_status m3_capture_tap(void *ctx, const char *key, const m3_tensor *t, const char *dt) {
    (void)dt;
    m3_capture *c = ctx;
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        char(*nk)[128] = realloc(c->key, (size_t)cap * sizeof *nk);
        M3_ASSERT(nk);
        c->key = nk;
        m3_tensor *nt = realloc(c->t, (size_t)cap * sizeof *nt);
        M3_ASSERT(nt);
        c->t = nt;
        c->cap = cap;
    }
    M3_ASSERT(strlen(key) < sizeof c->key[0]);
    snprintf(c->key[c->n], sizeof c->key[0], "%s", key);
    c->t[c->n] = *t;
    c->t[c->n].data = copy_data(t);
    c->n++;
    return M3_OK;
}

const m3_tensor *m3_capture_get(const m3_capture *c, const char *key) {
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->key[i], key)) return &c->t[i];
    return NULL;
}

m3_status m3_capture_fetch(void *ctx, const char *key, m3_tensor *out) {
    const m3_tensor *t = m3_capture_get(ctx, key);
    if (!t) return m3_errorf(M3_ERR_MISSING, "capture: no stage %s", key);
    *out = *t;
    out->data = copy_data(t);
    return M3_OK;
}
