/* ref/base.c: see base.h. */
#include "ref/base.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef M3_GIT
#define M3_GIT "unknown"
#endif

const char *m3_status_str(m3_status s) {
    switch (s) {
    case M3_OK: return "ok";
    case M3_ERR_IO: return "I/O error";
    case M3_ERR_FORMAT: return "malformed input";
    case M3_ERR_NOMEM: return "out of memory";
    case M3_ERR_DEVICE: return "device error";
    case M3_ERR_UNSUPPORTED: return "unsupported";
    case M3_ERR_ARG: return "bad argument";
    case M3_ERR_SHAPE: return "shape mismatch";
    case M3_ERR_MISSING: return "missing";
    case M3_ERR_NUMERIC: return "non-finite value";
    }
    return "unknown error";
}

static _Thread_local char err_buf[1024];

m3_status m3_errorf(m3_status s, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_buf, sizeof err_buf, fmt, ap);
    va_end(ap);
    /* one line: a newline inside a message would break the CLI contract */
    for (char *p = err_buf; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    return s;
}

m3_status m3_error_context(m3_status s, const char *fmt, ...) {
    char pre[256], old[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(pre, sizeof pre, fmt, ap);
    va_end(ap);
    memcpy(old, err_buf, sizeof old - 1); /* err_buf is NUL-terminated; keep a prefix */
    old[sizeof old - 1] = 0;
    if (old[0])
        snprintf(err_buf, sizeof err_buf, "%.255s: %.700s", pre, old);
    else
        snprintf(err_buf, sizeof err_buf, "%s: %s", pre, m3_status_str(s));
    return s;
}

const char *m3_last_error(void) { return err_buf; }
void m3_clear_error(void) { err_buf[0] = 0; }

static int log_level(void) {
    static int lvl = -1;
    if (lvl < 0) {
        const char *e = getenv("M3_LOG");
        lvl = e ? atoi(e) : M3_LOG_WARN;
    }
    return lvl;
}

void m3_log(int level, const char *fmt, ...) {
    if (level > log_level()) return;
    va_list ap;
    va_start(ap, fmt);
    fputs(level == M3_LOG_WARN ? "m3: warning: " : "m3: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void m3_assert_fail(const char *file, int line, const char *expr, const char *fmt, ...) {
    fprintf(stderr, "%s:%d: assertion failed: %s", file, line, expr);
    if (fmt) {
        va_list ap;
        va_start(ap, fmt);
        fputs(": ", stderr);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
    }
    fputc('\n', stderr);
    abort();
}

static const struct {
    m3_dtype t;
    const char *name;
    int bits;
} dtypes[] = {
    {M3_DT_BOOL, "BOOL", 8},        {M3_DT_U8, "U8", 8},
    {M3_DT_I8, "I8", 8},            {M3_DT_U16, "U16", 16},
    {M3_DT_I16, "I16", 16},         {M3_DT_U32, "U32", 32},
    {M3_DT_I32, "I32", 32},         {M3_DT_U64, "U64", 64},
    {M3_DT_I64, "I64", 64},         {M3_DT_F16, "F16", 16},
    {M3_DT_BF16, "BF16", 16},       {M3_DT_F32, "F32", 32},
    {M3_DT_F64, "F64", 64},         {M3_DT_F8_E4M3, "F8_E4M3", 8},
    {M3_DT_F8_E4M3FNUZ, "F8_E4M3FNUZ", 8}, {M3_DT_F8_E5M2, "F8_E5M2", 8},
    {M3_DT_F8_E8M0, "F8_E8M0", 8},  {M3_DT_F4, "F4", 4},
};

const char *m3_dtype_name(m3_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].name;
    return "INVALID";
}

m3_dtype m3_dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (strcmp(dtypes[i].name, name) == 0) return dtypes[i].t;
    return M3_DT_INVALID;
}

int m3_dtype_bits(m3_dtype t) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (dtypes[i].t == t) return dtypes[i].bits;
    return 0;
}

int64_t m3_shape_numel(const int64_t *shape, int rank) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

int64_t m3_tensor_numel(const m3_tensor *t) { return m3_shape_numel(t->shape, t->rank); }

void m3_tensor_free(m3_tensor *t) {
    if (!t) return;
    free(t->data);
    t->data = NULL;
}

static atomic_int n_threads_cfg;

int m3_threads(void) {
    int n = atomic_load(&n_threads_cfg);
    if (n > 0) return n;
    const char *e = getenv("M3_THREADS");
    n = e ? atoi(e) : 0;
    if (n <= 0) n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0) n = 1;
    if (n > 256) n = 256;
    atomic_store(&n_threads_cfg, n);
    return n;
}

void m3_set_threads(int n) { atomic_store(&n_threads_cfg, n > 0 ? (n > 256 ? 256 : n) : 0); }

typedef struct {
    m3_row_fn fn;
    void *ctx;
    int64_t n;
    int nt; /* threads this job may use, the caller included */
    atomic_llong next;
} pf_job;

static void pf_rows(pf_job *j) {
    for (;;) {
        int64_t i = atomic_fetch_add(&j->next, 1);
        if (i >= j->n) break;
        j->fn(j->ctx, i);
    }
}

/* A persistent pool: creating threads per call cost more than the work of a decode step's
 * small ops (a tiny model decoded 7x slower on 2 threads than on 1). Between jobs a worker
 * spins briefly on the job generation (a decode step issues the next job within
 * microseconds), then sleeps on a condition variable; the caller likewise spins briefly
 * before sleeping until the job's last worker is done. One job at a time (submit_mu); a
 * parallel_for issued from inside a job runs serially in its thread (in_job), so nesting
 * cannot deadlock. Which thread takes which row never changes a number: rows are
 * independent by contract. */
#define POOL_SPIN 20000 /* polls (~tens of microseconds) before sleeping */
static struct {
    pthread_mutex_t mu, submit_mu;
    pthread_cond_t go, done;
    int n_workers;
    atomic_uint_fast64_t gen; /* job generation: changes under mu, polled without it */
    pf_job *job;              /* valid for the current generation (set before gen++) */
    atomic_int pending;       /* workers that have not finished the current generation */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
          PTHREAD_COND_INITIALIZER, 0, 0, NULL, 0};
static _Thread_local bool in_job;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

typedef struct {
    int w;         /* worker w is thread w + 1 of a job */
    uint64_t seen; /* the generation current when it was created (before its first job) */
} pool_arg;

static void *pool_worker(void *arg) {
    const pool_arg a = *(const pool_arg *)arg;
    free(arg);
    in_job = true;
    uint64_t seen = a.seen;
    for (;;) {
        uint64_t g = atomic_load(&pool.gen);
        for (int i = 0; g == seen && i < POOL_SPIN; i++) {
            cpu_relax();
            g = atomic_load(&pool.gen);
        }
        if (g == seen) {
            pthread_mutex_lock(&pool.mu);
            while ((g = atomic_load(&pool.gen)) == seen) pthread_cond_wait(&pool.go, &pool.mu);
            pthread_mutex_unlock(&pool.mu);
        }
        seen = g;
        pf_job *j = pool.job; /* published before the gen increment that was just seen */
        if (a.w + 1 < j->nt) pf_rows(j);
        if (atomic_fetch_sub(&pool.pending, 1) == 1) {
            pthread_mutex_lock(&pool.mu); /* the caller checks pending under mu */
            pthread_cond_signal(&pool.done);
            pthread_mutex_unlock(&pool.mu);
        }
    }
    return NULL;
}

/* Grow the pool to `want` workers (under submit_mu); returns how many exist. */
static int pool_grow(int want) {
    pthread_mutex_lock(&pool.mu);
    while (pool.n_workers < want) {
        pthread_t th;
        pthread_attr_t at;
        pool_arg *a = malloc(sizeof *a);
        if (!a) break;
        a->w = pool.n_workers;
        a->seen = atomic_load(&pool.gen); /* under mu: the next job's gen++ comes after */
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&th, &at, pool_worker, a);
        pthread_attr_destroy(&at);
        if (rc != 0) {
            free(a);
            break; /* fewer threads: the caller does the rest */
        }
        pool.n_workers++;
    }
    int n = pool.n_workers;
    pthread_mutex_unlock(&pool.mu);
    return n;
}

void m3_parallel_for(int64_t n, m3_row_fn fn, void *ctx) {
    int nt = m3_threads();
    if (nt > n) nt = (int)n;
    if (nt <= 1 || in_job) {
        for (int64_t i = 0; i < n; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool.submit_mu);
    int nw = pool_grow(nt - 1);
    pf_job j = {.fn = fn, .ctx = ctx, .n = n, .nt = nw + 1 < nt ? nw + 1 : nt};
    atomic_init(&j.next, 0);
    pthread_mutex_lock(&pool.mu);
    pool.job = &j;
    atomic_store(&pool.pending, nw);
    atomic_fetch_add(&pool.gen, 1);
    pthread_cond_broadcast(&pool.go);
    pthread_mutex_unlock(&pool.mu);
    in_job = true;
    pf_rows(&j); /* the caller works too */
    in_job = false;
    for (int i = 0; atomic_load(&pool.pending) > 0 && i < POOL_SPIN; i++) cpu_relax();
    if (atomic_load(&pool.pending) > 0) {
        pthread_mutex_lock(&pool.mu);
        while (atomic_load(&pool.pending) > 0) pthread_cond_wait(&pool.done, &pool.mu);
        pthread_mutex_unlock(&pool.mu);
    }
    pthread_mutex_unlock(&pool.submit_mu);
}

const char *m3_version_string(void) { return M3_VERSION " (git " M3_GIT ")"; }
