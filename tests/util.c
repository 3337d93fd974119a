/* tests/util.c: see util.h. */
#include "tests/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
