/* compare/tokenizer.c: byte-level BPE as the `tokenizers` library does it. Contract:
 * compare/tokenizer.h. Semantics checked against huggingface/tokenizers 3ba8ad00 (0.23):
 *   tokenizer/added_vocabulary.rs  find_matches (leftmost-longest, single_word, l/rstrip)
 *   tokenizer/normalizer.rs        NormalizedString::split behaviours
 *   tokenizer/pattern.rs, utils/onig.rs  find_matches over find_iter (empty-match rule)
 *   pre_tokenizers/byte_level.rs   GPT-2 alphabet, regex, prefix space, decoder
 *   models/bpe/word.rs             merge_word priority queue
 * The only file including <pcre2.h>. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "compare/tokenizer.h"

#include <errno.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref/json.h"

enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum { STEP_SPLIT, STEP_BYTELEVEL };

typedef struct {
    int kind;
    pcre2_code *re; /* STEP_SPLIT: the pattern; STEP_BYTELEVEL: GPT-2 regex or NULL */
    int behavior;
    bool invert;
    bool add_prefix_space;
} step;

typedef struct {
    char *s;
    int len;
    int32_t id;
    bool special, normalized, single_word, lstrip, rstrip;
} added_tok;

struct m3_tokenizer {
    char *path;
    int32_t n_vocab;
    /* model vocab: strings by id (NULL where the id is unused), hash string -> id */
    char **tok;
    int *tok_len;
    int32_t *vh;
    uint32_t vh_mask;
    /* merges: (a, b) -> rank, new id */
    uint64_t *mk;
    int32_t *mrank, *mnew;
    uint32_t m_mask;
    /* added tokens; by_id[id] = index into added or -1 */
    added_tok *added;
    int n_added;
    int32_t *added_by_id;
    step *steps;
    int n_steps;
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;
    pcre2_code *re_word, *re_space; /* one-character class tests */
    uint32_t byte_cp[256];          /* GPT-2 byte -> code point */
    int16_t cp_byte[324];           /* code point (< 324) -> byte, or -1 */
};

/* ---- hashing ------------------------------------------------------------------------ */

static uint64_t fnv(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int32_t vocab_get(const m3_tokenizer *t, const char *s, size_t n) {
    for (uint32_t i = (uint32_t)fnv(s, n) & t->vh_mask;; i = (i + 1) & t->vh_mask) {
        int32_t id = t->vh[i];
        if (id < 0) return -1;
        if ((size_t)t->tok_len[id] == n && !memcmp(t->tok[id], s, n)) return id;
    }
}

static void vocab_put(m3_tokenizer *t, int32_t id) {
    uint32_t i = (uint32_t)fnv(t->tok[id], (size_t)t->tok_len[id]) & t->vh_mask;
    for (;; i = (i + 1) & t->vh_mask) {
        int32_t o = t->vh[i];
        if (o < 0) break;
        if (t->tok_len[o] == t->tok_len[id] && !memcmp(t->tok[o], t->tok[id], (size_t)t->tok_len[id]))
            break; /* duplicate string: the later id wins, like a HashMap insert */
    }
    t->vh[i] = id;
}

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static bool merge_get(const m3_tokenizer *t, int32_t a, int32_t b, int32_t *rank, int32_t *nid) {
    if (!t->mk) return false;
    uint64_t k = pair_key(a, b);
    for (uint32_t i = (uint32_t)mix64(k) & t->m_mask;; i = (i + 1) & t->m_mask) {
        if (t->mrank[i] < 0) return false;
        if (t->mk[i] == k) {
            *rank = t->mrank[i];
            *nid = t->mnew[i];
            return true;
        }
    }
}

static void merge_put(m3_tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t nid) {
    uint64_t k = pair_key(a, b);
    uint32_t i = (uint32_t)mix64(k) & t->m_mask;
    while (t->mrank[i] >= 0 && t->mk[i] != k) i = (i + 1) & t->m_mask;
    t->mk[i] = k; /* a repeated pair: the later rank wins (HashMap collect) */
    t->mrank[i] = rank;
    t->mnew[i] = nid;
}

static uint32_t pow2_at_least(uint64_t n) {
    uint32_t c = 16;
    while (c < n) c *= 2;
    return c;
}

/* ---- UTF-8 -------------------------------------------------------------------------- */

/* Continuation bytes a UTF-8 sequence led by byte c needs (0 for ASCII, -1 when c cannot
 * lead one), and the range [*lo, *hi] its first continuation byte must fall in. Rust's
 * rules: no overlongs, no surrogates, <= U+10FFFF. */
static int utf8_lead(unsigned c, unsigned *lo, unsigned *hi) {
    *lo = 0x80, *hi = 0xbf;
    if (c < 0x80) return 0;
    if (c >= 0xc2 && c <= 0xdf) return 1;
    if (c >= 0xe0 && c <= 0xef) {
        if (c == 0xe0) *lo = 0xa0;
        if (c == 0xed) *hi = 0x9f;
        return 2;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (c == 0xf0) *lo = 0x90;
        if (c == 0xf4) *hi = 0x8f;
        return 3;
    }
    return -1;
}

/* Length of a valid UTF-8 sequence at s (n bytes available), 0 if invalid. */
static int utf8_valid_len(const unsigned char *s, size_t n) {
    unsigned lo, hi;
    int need = utf8_lead(s[0], &lo, &hi);
    if (need <= 0) return need + 1; /* ASCII: 1; no lead byte: 0 */
    if (n < (size_t)need + 1) return 0;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i <= need; i++)
        if (s[i] < 0x80 || s[i] > 0xbf) return 0;
    return need + 1;
}

/* Length of the maximal invalid prefix at s (String::from_utf8_lossy replaces it with one
 * U+FFFD): the lead byte plus the continuation bytes that were still acceptable. */
static int utf8_invalid_len(const unsigned char *s, size_t n) {
    unsigned lo, hi;
    int need = utf8_lead(s[0], &lo, &hi);
    if (need <= 0) return 1;
    int k = 1;
    if (k < (int)n && s[1] >= lo && s[1] <= hi) {
        k = 2;
        while (k <= need && k < (int)n && s[k] >= 0x80 && s[k] <= 0xbf) k++;
    }
    return k;
}

static int put_utf8(char *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

static uint32_t get_utf8(const char *p, int *len) {
    const unsigned char *s = (const unsigned char *)p;
    if (s[0] < 0x80) {
        *len = 1;
        return s[0];
    }
    if (s[0] < 0xe0) {
        *len = 2;
        return ((s[0] & 0x1fu) << 6) | (s[1] & 0x3fu);
    }
    if (s[0] < 0xf0) {
        *len = 3;
        return ((s[0] & 0x0fu) << 12) | ((s[1] & 0x3fu) << 6) | (s[2] & 0x3fu);
    }
    *len = 4;
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3fu) << 12) | ((s[2] & 0x3fu) << 6) | (s[3] & 0x3fu);
}

/* GPT-2's byte <-> unicode map: printable bytes map to themselves, the other 68 bytes to
 * U+0100.. in byte order. */
static void init_bytelevel(m3_tokenizer *t) {
    for (int i = 0; i < 324; i++) t->cp_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        bool keep = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        t->byte_cp[b] = keep ? (uint32_t)b : 256u + (uint32_t)n++;
        t->cp_byte[t->byte_cp[b]] = (int16_t)b;
    }
}

/* ---- pieces ------------------------------------------------------------------------- */

typedef struct {
    char *s;    /* owned */
    size_t len;
    int32_t id; /* >= 0: an added token, fixed */
} piece;

typedef struct {
    piece *p;
    size_t n, cap;
} pieces;

static bool pieces_push(pieces *v, const char *s, size_t len, int32_t id) {
    if (v->n == v->cap) {
        size_t c = v->cap ? 2 * v->cap : 16;
        piece *np = realloc(v->p, c * sizeof *np);
        if (!np) return false;
        v->p = np;
        v->cap = c;
    }
    char *c = malloc(len + 1);
    if (!c) return false;
    memcpy(c, s, len);
    c[len] = 0;
    v->p[v->n++] = (piece){c, len, id};
    return true;
}

static void pieces_free(pieces *v) {
    for (size_t i = 0; i < v->n; i++) free(v->p[i].s);
    free(v->p);
    *v = (pieces){0};
}

/* Does the single character at s[0..len) match the one-character class re? */
static bool char_is(const pcre2_code *re, const char *s, size_t len, pcre2_match_data *md) {
    return pcre2_match(re, (PCRE2_SPTR)s, len, 0, PCRE2_ANCHORED, md, NULL) >= 0;
}

static size_t prev_char_start(const char *s, size_t pos) {
    do pos--;
    while (pos > 0 && ((unsigned char)s[pos] & 0xc0) == 0x80);
    return pos;
}

/* ---- added tokens (AddedVocabulary::find_matches) ----------------------------------- */

typedef struct {
    size_t b, e;
    int32_t id; /* -1: plain text */
} span;

/* Split text into spans by the added tokens whose `normalized` flag equals `normalized`.
 * Leftmost-longest, non-overlapping, then the single_word / lstrip / rstrip adjustments. */
static m3_status added_split(const m3_tokenizer *t, const char *s, size_t len, bool normalized,
                             span **out, size_t *n_out, pcre2_match_data *md) {
    size_t cap = 8, n = 0, start_off = 0;
    span *v = malloc(cap * sizeof *v);
    if (!v) return m3_errorf(M3_ERR_NOMEM, "tokenizer: out of memory");
#define PUSH(B, E, ID)                                                                            \
    do {                                                                                          \
        if (n == cap) {                                                                           \
            span *nv = realloc(v, (cap *= 2) * sizeof *v);                                        \
            if (!nv) {                                                                            \
                free(v);                                                                          \
                return m3_errorf(M3_ERR_NOMEM, "tokenizer: out of memory");                       \
            }                                                                                     \
            v = nv;                                                                               \
        }                                                                                         \
        v[n++] = (span){(B), (E), (ID)};                                                          \
    } while (0)
    size_t p = 0;
    while (p < len) {
        /* leftmost: the first position with any match; longest among those */
        int best = -1;
        for (; p < len; p++) {
            for (int k = 0; k < t->n_added; k++) {
                const added_tok *a = &t->added[k];
                if (a->normalized != normalized || a->len == 0 || (size_t)a->len > len - p) continue;
                if (memcmp(s + p, a->s, (size_t)a->len)) continue;
                if (best < 0 || a->len > t->added[best].len) best = k;
            }
            if (best >= 0) break;
        }
        if (best < 0) break;
        const added_tok *a = &t->added[best];
        size_t b = p, e = p + (size_t)a->len;
        p = e; /* the automaton resumes after this match whatever the checks below decide */
        if (a->single_word) {
            bool start_ok = b == 0, stop_ok = e == len;
            if (!start_ok) {
                size_t q = prev_char_start(s, b);
                start_ok = !char_is(t->re_word, s + q, b - q, md);
            }
            if (!stop_ok) {
                int cl;
                get_utf8(s + e, &cl);
                stop_ok = !char_is(t->re_word, s + e, (size_t)cl, md);
            }
            if (!start_ok || !stop_ok) continue;
        }
        if (a->lstrip) {
            size_t nb = b;
            while (nb > 0) {
                size_t q = prev_char_start(s, nb);
                if (!char_is(t->re_space, s + q, nb - q, md)) break;
                nb = q;
            }
            b = nb > start_off ? nb : start_off;
        }
        if (a->rstrip) {
            while (e < len) {
                int cl;
                get_utf8(s + e, &cl);
                if (!char_is(t->re_space, s + e, (size_t)cl, md)) break;
                e += (size_t)cl;
            }
        }
        if (start_off < b) PUSH(start_off, b, -1);
        PUSH(b, e, a->id);
        start_off = e;
    }
    if (start_off != len || n == 0) PUSH(start_off, len, -1);
#undef PUSH
    *out = v;
    *n_out = n;
    return M3_OK;
}

/* ---- regex splitting ---------------------------------------------------------------- */

typedef struct {
    size_t b, e;
    bool match;
} seg;

typedef struct {
    seg *s;
    size_t n, cap;
} segs;

static bool segs_push(segs *v, size_t b, size_t e, bool m) {
    if (v->n == v->cap) {
        size_t c = v->cap ? 2 * v->cap : 16;
        seg *ns = realloc(v->s, c * sizeof *ns);
        if (!ns) return false;
        v->s = ns;
        v->cap = c;
    }
    v->s[v->n++] = (seg){b, e, m};
    return true;
}

/* Pattern::find_matches for a SysRegex: matches and the gaps between them, covering the
 * string. find_iter follows the onig crate: an empty match right where the previous match
 * ended is skipped by advancing one character. */
static m3_status find_matches(const pcre2_code *re, const char *s, size_t len, segs *out,
                              pcre2_match_data *md) {
    out->n = 0;
    if (len == 0) return segs_push(out, 0, 0, false) ? M3_OK : M3_ERR_NOMEM;
    size_t prev = 0, last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, last_end, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) return m3_errorf(M3_ERR_ARG, "tokenizer: regex match failed (%d)", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && have_last && last_match_end == me) {
            if (last_end >= len) break;
            int cl;
            get_utf8(s + last_end, &cl);
            last_end += (size_t)cl;
            continue;
        }
        last_end = me;
        last_match_end = me;
        have_last = true;
        if (prev != ms && !segs_push(out, prev, ms, false)) return M3_ERR_NOMEM;
        if (!segs_push(out, ms, me, true)) return M3_ERR_NOMEM;
        prev = me;
        if (ms == me) { /* an empty match: the next search starts one character on */
            if (last_end >= len) break;
        }
    }
    if (prev != len && !segs_push(out, prev, len, false)) return M3_ERR_NOMEM;
    return M3_OK;
}

/* NormalizedString::split: apply the behaviour to the (offsets, is_match) list, in place;
 * returns the kept segments (match = "remove" after this). */
static void apply_behavior(segs *v, int behavior, bool invert) {
    if (invert)
        for (size_t i = 0; i < v->n; i++) v->s[i].match = !v->s[i].match;
    size_t n = 0;
    bool prev_match = false;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < v->n; i++) v->s[i].match = false;
        return;
    case SPLIT_REMOVED:
        return; /* match = remove */
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < v->n; i++) {
            seg x = v->s[i];
            if (x.match == prev_match && n > 0) v->s[n - 1].e = x.e;
            else v->s[n++] = (seg){x.b, x.e, false};
            prev_match = x.match;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < v->n; i++) {
            seg x = v->s[i];
            if (x.match && !prev_match && n > 0) v->s[n - 1].e = x.e;
            else v->s[n++] = (seg){x.b, x.e, false};
            prev_match = x.match;
        }
        break;
    case SPLIT_MERGED_NEXT: {
        /* fold from the right, then the result is reversed back */
        for (size_t i = v->n; i-- > 0;) {
            seg x = v->s[i];
            if (x.match && !prev_match && n > 0) v->s[v->n - n].b = x.b;
            else {
                n++;
                v->s[v->n - n] = (seg){x.b, x.e, false};
            }
            prev_match = x.match;
        }
        memmove(v->s, v->s + (v->n - n), n * sizeof *v->s);
        break;
    }
    }
    v->n = n;
}

/* One pre-tokenizer step over all pieces (added-token pieces pass through). */
static m3_status run_step(const m3_tokenizer *t, const step *st, pieces *in, pieces *out,
                          pcre2_match_data *md, segs *sg) {
    m3_status rc = M3_OK;
    for (size_t i = 0; i < in->n && !rc; i++) {
        piece *p = &in->p[i];
        if (p->id >= 0) {
            if (!pieces_push(out, p->s, p->len, p->id)) rc = M3_ERR_NOMEM;
            continue;
        }
        const char *s = p->s;
        size_t len = p->len;
        char *pref = NULL;
        if (st->kind == STEP_BYTELEVEL && st->add_prefix_space && (len == 0 || s[0] != ' ')) {
            pref = malloc(len + 2);
            if (!pref) return M3_ERR_NOMEM;
            pref[0] = ' ';
            memcpy(pref + 1, s, len);
            pref[++len] = 0;
            s = pref;
        }
        const pcre2_code *re = st->re;
        if (re) {
            rc = find_matches(re, s, len, sg, md);
            if (!rc) apply_behavior(sg, st->kind == STEP_SPLIT ? st->behavior : SPLIT_ISOLATED,
                                    st->kind == STEP_SPLIT && st->invert);
        } else {
            sg->n = 0;
            if (!segs_push(sg, 0, len, false)) rc = M3_ERR_NOMEM;
        }
        for (size_t k = 0; k < sg->n && !rc; k++) {
            const seg *x = &sg->s[k];
            if (x->match || x->e == x->b) continue; /* removed, or empty (dropped) */
            if (st->kind == STEP_BYTELEVEL) {
                /* bytes -> GPT-2 alphabet: at most 2 UTF-8 bytes per input byte */
                char *m = malloc(2 * (x->e - x->b) + 1);
                if (!m) {
                    rc = M3_ERR_NOMEM;
                    break;
                }
                size_t o = 0;
                for (size_t j = x->b; j < x->e; j++)
                    o += (size_t)put_utf8(m + o, t->byte_cp[(unsigned char)s[j]]);
                if (!pieces_push(out, m, o, -1)) rc = M3_ERR_NOMEM;
                free(m);
            } else if (!pieces_push(out, s + x->b, x->e - x->b, -1)) {
                rc = M3_ERR_NOMEM;
            }
        }
        free(pref);
    }
    if (rc == M3_ERR_NOMEM) return m3_errorf(rc, "tokenizer: out of memory");
    return rc;
}

/* ---- BPE ---------------------------------------------------------------------------- */

typedef struct {
    int32_t id;
    int prev, next, len;
} sym;

typedef struct {
    int32_t rank, pos, nid;
} mrg;

static bool mrg_less(mrg a, mrg b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

static void heap_push(mrg *h, int *n, mrg x) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!mrg_less(x, h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = x;
}

static mrg heap_pop(mrg *h, int *n) {
    mrg top = h[0], x = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && mrg_less(h[c + 1], h[c])) c++;
        if (!mrg_less(h[c], x)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = x;
    return top;
}

typedef struct {
    int32_t *v;
    int64_t n, cap;
} idvec;

static bool ids_push(idvec *v, int32_t id) {
    if (v->n == v->cap) {
        int64_t c = v->cap ? 2 * v->cap : 64;
        int32_t *nv = realloc(v->v, (size_t)c * sizeof *nv);
        if (!nv) return false;
        v->v = nv;
        v->cap = c;
    }
    v->v[v->n++] = id;
    return true;
}

static m3_status bpe_word(const m3_tokenizer *t, const char *w, size_t len, idvec *out) {
    if (t->ignore_merges) {
        int32_t id = vocab_get(t, w, len);
        if (id >= 0) return ids_push(out, id) ? M3_OK : M3_ERR_NOMEM;
    }
    /* one symbol per character; at most len symbols (+3 per char with byte fallback) */
    sym *sy = malloc((4 * len + 1) * sizeof *sy);
    mrg *h = malloc((4 * len + 1) * 2 * sizeof *h);
    m3_status rc = M3_OK;
    if (!sy || !h) {
        rc = M3_ERR_NOMEM;
        goto done;
    }
    int n = 0;
    for (size_t i = 0; i < len;) {
        int cl;
        get_utf8(w + i, &cl);
        int32_t id = vocab_get(t, w + i, (size_t)cl);
        if (id >= 0) {
            sy[n] = (sym){id, n - 1, n + 1, cl};
            n++;
        } else {
            bool done_fb = false;
            if (t->byte_fallback) {
                int32_t fb[4];
                done_fb = true;
                for (int k = 0; k < cl && done_fb; k++) {
                    char name[8];
                    snprintf(name, sizeof name, "<0x%02X>", (unsigned char)w[i + (size_t)k]);
                    fb[k] = vocab_get(t, name, strlen(name));
                    done_fb = fb[k] >= 0;
                }
                if (done_fb)
                    for (int k = 0; k < cl; k++) {
                        sy[n] = (sym){fb[k], n - 1, n + 1, 1};
                        n++;
                    }
            }
            if (!done_fb && t->unk_id >= 0) {
                if (t->fuse_unk && n > 0 && sy[n - 1].id == t->unk_id) sy[n - 1].len += cl;
                else {
                    sy[n] = (sym){t->unk_id, n - 1, n + 1, cl};
                    n++;
                }
            }
            /* neither: the character is dropped, as tokenizers does */
        }
        i += (size_t)cl;
    }
    if (n > 0) sy[n - 1].next = -1;
    int hn = 0;
    for (int i = 0; i + 1 < n; i++) {
        int32_t r, nid;
        if (merge_get(t, sy[i].id, sy[i + 1].id, &r, &nid)) heap_push(h, &hn, (mrg){r, i, nid});
    }
    while (hn > 0) {
        mrg top = heap_pop(h, &hn);
        sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        int np = cur->next;
        int32_t r, nid;
        if (!merge_get(t, cur->id, sy[np].id, &r, &nid) || nid != top.nid) continue;
        cur->id = top.nid;
        cur->len += sy[np].len;
        cur->next = sy[np].next;
        sy[np].len = 0;
        if (cur->next >= 0) sy[cur->next].prev = top.pos;
        if (cur->prev >= 0 && merge_get(t, sy[cur->prev].id, cur->id, &r, &nid))
            heap_push(h, &hn, (mrg){r, cur->prev, nid});
        if (cur->next >= 0 && merge_get(t, cur->id, sy[cur->next].id, &r, &nid))
            heap_push(h, &hn, (mrg){r, top.pos, nid});
    }
    for (int i = 0; i < n && !rc; i++)
        if (sy[i].len && !ids_push(out, sy[i].id)) rc = M3_ERR_NOMEM;
done:
    free(sy);
    free(h);
    return rc;
}

/* ---- encode / decode ------------------------------------------------------------------ */

m3_status m3_tokenizer_encode(const m3_tokenizer *t, const char *text, size_t len,
                              int32_t **ids, int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    for (size_t i = 0; i < len;) {
        int l = utf8_valid_len((const unsigned char *)text + i, len - i);
        if (!l) return m3_errorf(M3_ERR_ARG, "tokenizer: input is not valid UTF-8 at byte %zu", i);
        i += (size_t)l;
    }
    pcre2_match_data *md = pcre2_match_data_create(4, NULL);
    pieces a = {0}, b = {0};
    segs sg = {0};
    idvec out = {0};
    span *sp = NULL;
    size_t nsp = 0;
    m3_status rc = M3_OK;
    if (!md) {
        rc = M3_ERR_NOMEM;
        goto done;
    }
    /* 1. added tokens: non-normalized ones on the raw text, normalized ones on the rest
     * (there is no normalizer, so the normalized text is the text) */
    if ((rc = added_split(t, text, len, false, &sp, &nsp, md))) goto done;
    for (size_t i = 0; i < nsp; i++)
        if (!pieces_push(&a, text + sp[i].b, sp[i].e - sp[i].b, sp[i].id)) rc = M3_ERR_NOMEM;
    free(sp);
    sp = NULL;
    for (size_t i = 0; i < a.n && !rc; i++) {
        if (a.p[i].id >= 0) {
            if (!pieces_push(&b, a.p[i].s, a.p[i].len, a.p[i].id)) rc = M3_ERR_NOMEM;
            continue;
        }
        if ((rc = added_split(t, a.p[i].s, a.p[i].len, true, &sp, &nsp, md))) break;
        for (size_t k = 0; k < nsp && !rc; k++)
            if (sp[k].e > sp[k].b &&
                !pieces_push(&b, a.p[i].s + sp[k].b, sp[k].e - sp[k].b, sp[k].id))
                rc = M3_ERR_NOMEM;
        free(sp);
        sp = NULL;
    }
    if (rc) goto done;
    /* 2. pre-tokenizer steps */
    for (int s = 0; s < t->n_steps; s++) {
        pieces_free(&a);
        if ((rc = run_step(t, &t->steps[s], &b, &a, md, &sg))) goto done;
        pieces tmp = a;
        a = b;
        b = tmp;
    }
    /* 3. model */
    for (size_t i = 0; i < b.n && !rc; i++) {
        if (b.p[i].id >= 0) rc = ids_push(&out, b.p[i].id) ? M3_OK : M3_ERR_NOMEM;
        else if (b.p[i].len) rc = bpe_word(t, b.p[i].s, b.p[i].len, &out);
    }
done:
    if (rc == M3_ERR_NOMEM) m3_errorf(rc, "tokenizer: out of memory");
    pieces_free(&a);
    pieces_free(&b);
    free(sg.s);
    free(sp);
    pcre2_match_data_free(md);
    if (rc) {
        free(out.v);
        return rc;
    }
    if (!out.v) out.v = malloc(sizeof(int32_t)); /* a non-NULL empty result */
    if (!out.v) return m3_errorf(M3_ERR_NOMEM, "tokenizer: out of memory");
    *ids = out.v;
    *n_ids = out.n;
    return M3_OK;
}

m3_status m3_tokenizer_decode(const m3_tokenizer *t, const int32_t *ids, int64_t n,
                              bool skip_special, char **out, size_t *out_len) {
    *out = NULL;
    size_t cap = 16;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) continue;
        int a = t->added_by_id[id];
        cap += a >= 0 ? (size_t)t->added[a].len : t->tok[id] ? (size_t)t->tok_len[id] : 0;
    }
    unsigned char *bytes = malloc(cap);
    if (!bytes) return m3_errorf(M3_ERR_NOMEM, "tokenizer: out of memory");
    size_t nb = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab) continue; /* unknown ids are dropped (filter_map) */
        int a = t->added_by_id[id];
        const char *s;
        size_t len;
        if (a >= 0) {
            if (skip_special && t->added[a].special) continue;
            s = t->added[a].s;
            len = (size_t)t->added[a].len;
        } else if (t->tok[id]) {
            s = t->tok[id];
            len = (size_t)t->tok_len[id];
        } else {
            continue;
        }
        /* ByteLevel decoder: all characters in the alphabet -> their bytes, else verbatim */
        size_t o = nb;
        bool all = true;
        for (size_t k = 0; k < len && all;) {
            int cl;
            uint32_t cp = get_utf8(s + k, &cl);
            if (cp < 324 && t->cp_byte[cp] >= 0) bytes[o++] = (unsigned char)t->cp_byte[cp];
            else all = false;
            k += (size_t)cl;
        }
        if (all) nb = o;
        else {
            memcpy(bytes + nb, s, len);
            nb += len;
        }
    }
    /* String::from_utf8_lossy: each maximal invalid subsequence -> U+FFFD (3 bytes) */
    char *res = malloc(3 * nb + 1);
    if (!res) {
        free(bytes);
        return m3_errorf(M3_ERR_NOMEM, "tokenizer: out of memory");
    }
    size_t o = 0;
    for (size_t i = 0; i < nb;) {
        int l = utf8_valid_len(bytes + i, nb - i);
        if (l) {
            memcpy(res + o, bytes + i, (size_t)l);
            o += (size_t)l;
            i += (size_t)l;
        } else {
            o += (size_t)put_utf8(res + o, 0xfffd);
            i += (size_t)utf8_invalid_len(bytes + i, nb - i);
        }
    }
    res[o] = 0;
    free(bytes);
    *out = res;
    if (out_len) *out_len = o;
    return M3_OK;
}

int32_t m3_tokenizer_n_vocab(const m3_tokenizer *t) { return t->n_vocab; }

int32_t m3_tokenizer_token_id(const m3_tokenizer *t, const char *token) {
    size_t n = strlen(token);
    for (int k = 0; k < t->n_added; k++)
        if ((size_t)t->added[k].len == n && !memcmp(t->added[k].s, token, n)) return t->added[k].id;
    return vocab_get(t, token, n);
}

/* ---- loading ------------------------------------------------------------------------ */

void m3_tokenizer_close(m3_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; t->tok && i < t->n_vocab; i++) free(t->tok[i]);
    free(t->tok);
    free(t->tok_len);
    free(t->vh);
    free(t->mk);
    free(t->mrank);
    free(t->mnew);
    for (int k = 0; k < t->n_added; k++) free(t->added[k].s);
    free(t->added);
    free(t->added_by_id);
    for (int s = 0; s < t->n_steps; s++) pcre2_code_free(t->steps[s].re);
    free(t->steps);
    pcre2_code_free(t->re_word);
    pcre2_code_free(t->re_space);
    free(t->path);
    free(t);
}

static const char word_class[] = "[\\p{L}\\p{Nl}\\p{M}\\p{Nd}\\p{Pc}\\x{200c}\\x{200d}]";
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static m3_status compile(const m3_tokenizer *t, const char *pat, size_t len, bool literal,
                         pcre2_code **out) {
    int err;
    PCRE2_SIZE off;
    uint32_t opt = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP); /* UCP is not allowed with LITERAL */
    *out = pcre2_compile((PCRE2_SPTR)pat, len, opt, &err, &off, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return m3_errorf(M3_ERR_UNSUPPORTED, "%s: pre-tokenizer regex not accepted by PCRE2 at "
                         "offset %zu: %s", t->path, (size_t)off, (const char *)msg);
    }
    return M3_OK;
}

/* -- tokenizer.json: everything below reads the parse tree (ref/json.h) ------------- */

/* true/false only: unlike m3_json_get_bool, the numbers 0/1 are not flags here (serde
 * refuses them for a bool field) and fall back to the default. */
static bool jbool(const m3_json *o, const char *k, bool dflt) {
    const m3_json *v = m3_json_get(o, k);
    bool b;
    return m3_json_is_bool(v) && m3_json_bool(v, &b) ? b : dflt;
}

static const char *jstr(const m3_json *o, const char *k) { return m3_json_get_str(o, k, NULL); }

static bool jnull(const m3_json *o, const char *k) {
    const m3_json *v = m3_json_get(o, k);
    return !v || m3_json_is_null(v);
}

/* a token id: an integral number in [0, 1e9] (fits int32) */
static bool jid(const m3_json *v, int32_t *id) {
    double d;
    if (!m3_json_double(v, &d) || d < 0 || d > 1e9 || d != (double)(int32_t)d) return false;
    *id = (int32_t)d;
    return true;
}

static m3_status add_step(m3_tokenizer *t, step st) {
    step *ns = realloc(t->steps, (size_t)(t->n_steps + 1) * sizeof *ns);
    if (!ns) {
        pcre2_code_free(st.re);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
    }
    t->steps = ns;
    t->steps[t->n_steps++] = st;
    return M3_OK;
}

static m3_status parse_pretok(m3_tokenizer *t, const m3_json *pt, int depth) {
    if (!pt || m3_json_is_null(pt)) return M3_OK;
    const char *type = jstr(pt, "type");
    if (!type || depth > 8)
        return m3_errorf(M3_ERR_FORMAT, "%s: pre_tokenizer without a type", t->path);
    if (!strcmp(type, "Sequence")) {
        const m3_json *l = m3_json_get(pt, "pretokenizers");
        if (!m3_json_is_array(l))
            return m3_errorf(M3_ERR_FORMAT, "%s: Sequence pre_tokenizer without a list", t->path);
        const m3_json *e;
        for (e = m3_json_first(l); e; e = m3_json_next(e)) M3_TRY(parse_pretok(t, e, depth + 1));
        return M3_OK;
    }
    step st = {0};
    if (!strcmp(type, "ByteLevel")) {
        st.kind = STEP_BYTELEVEL;
        st.add_prefix_space = jbool(pt, "add_prefix_space", true);
        if (jbool(pt, "use_regex", true))
            M3_TRY(compile(t, gpt2_pattern, sizeof gpt2_pattern - 1, false, &st.re));
        return add_step(t, st);
    }
    if (!strcmp(type, "Digits")) {
        /* char::is_numeric = \p{N}; one match per character, Isolated or Contiguous */
        st.kind = STEP_SPLIT;
        st.behavior = jbool(pt, "individual_digits", false) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        M3_TRY(compile(t, "\\p{N}", 5, false, &st.re));
        return add_step(t, st);
    }
    if (!strcmp(type, "Split")) {
        st.kind = STEP_SPLIT;
        const m3_json *pat = m3_json_get(pt, "pattern");
        const char *b = jstr(pt, "behavior");
        static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                            "MergedWithNext", "Contiguous"};
        st.behavior = -1;
        for (int i = 0; b && i < 5; i++)
            if (!strcmp(b, names[i])) st.behavior = i;
        if (st.behavior < 0)
            return m3_errorf(M3_ERR_FORMAT, "%s: Split behavior '%s' unknown", t->path,
                             b ? b : "(missing)");
        st.invert = jbool(pt, "invert", false);
        const char *rs = jstr(pat, "Regex"), *ss = jstr(pat, "String");
        if (rs) M3_TRY(compile(t, rs, strlen(rs), false, &st.re));
        else if (ss && ss[0]) M3_TRY(compile(t, ss, strlen(ss), true, &st.re));
        else if (!ss) return m3_errorf(M3_ERR_FORMAT, "%s: Split without a pattern", t->path);
        /* an empty String pattern matches nothing: re stays NULL, one unmatched segment */
        return add_step(t, st);
    }
    return m3_errorf(M3_ERR_UNSUPPORTED, "%s: pre_tokenizer type '%s' not supported", t->path,
                     type);
}

/* id of merge part s (length n) or an error naming it */
static m3_status merge_part(m3_tokenizer *t, const char *s, size_t n, int64_t i, int32_t *id) {
    *id = vocab_get(t, s, n);
    if (*id < 0)
        return m3_errorf(M3_ERR_FORMAT, "%s: merge %lld: '%.*s' is not in the vocab", t->path,
                         (long long)i, (int)n, s);
    return M3_OK;
}

static m3_status parse_model(m3_tokenizer *t, const m3_json *m) {
    const char *type = jstr(m, "type");
    if (type && strcmp(type, "BPE"))
        return m3_errorf(M3_ERR_UNSUPPORTED, "%s: model type '%s' not supported (BPE only)",
                         t->path, type);
    const m3_json *dropout = m3_json_get(m, "dropout");
    if (dropout && !m3_json_is_null(dropout))
        return m3_errorf(M3_ERR_UNSUPPORTED, "%s: BPE dropout not supported", t->path);
    const char *csp = jstr(m, "continuing_subword_prefix"), *eow = jstr(m, "end_of_word_suffix");
    if ((csp && csp[0]) || (eow && eow[0]))
        return m3_errorf(M3_ERR_UNSUPPORTED, "%s: continuing_subword_prefix/end_of_word_suffix "
                         "not supported", t->path);
    t->ignore_merges = jbool(m, "ignore_merges", false);
    t->byte_fallback = jbool(m, "byte_fallback", false);
    t->fuse_unk = jbool(m, "fuse_unk", false);
    const m3_json *vocab = m3_json_get(m, "vocab");
    if (!m3_json_is_object(vocab))
        return m3_errorf(M3_ERR_FORMAT, "%s: model.vocab is not an object", t->path);
    const m3_json *e;
    int64_t nv = 0;
    int32_t max_id = -1;
    for (e = m3_json_first(vocab); e; e = m3_json_next(e)) {
        int32_t id;
        if (!jid(e, &id))
            return m3_errorf(M3_ERR_FORMAT, "%s: vocab entry '%s' has no valid id", t->path,
                             m3_json_key(e));
        if (id > max_id) max_id = id;
        nv++;
    }
    t->n_vocab = max_id + 1;
    t->tok = calloc((size_t)t->n_vocab + 1, sizeof *t->tok);
    t->tok_len = calloc((size_t)t->n_vocab + 1, sizeof *t->tok_len);
    t->vh_mask = pow2_at_least((uint64_t)nv * 2 + 16) - 1;
    t->vh = malloc(((size_t)t->vh_mask + 1) * sizeof *t->vh);
    if (!t->tok || !t->tok_len || !t->vh) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
    memset(t->vh, 0xff, ((size_t)t->vh_mask + 1) * sizeof *t->vh);
    for (e = m3_json_first(vocab); e; e = m3_json_next(e)) {
        int32_t id = 0;
        (void)jid(e, &id); /* valid: checked in the first pass */
        const char *key = m3_json_key(e);
        if (t->tok[id])
            return m3_errorf(M3_ERR_FORMAT, "%s: id %d used twice in the vocab", t->path, id);
        t->tok[id] = strdup(key);
        if (!t->tok[id]) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
        t->tok_len[id] = (int)strlen(key);
        vocab_put(t, id);
    }
    const char *unk = jstr(m, "unk_token");
    t->unk_id = unk ? vocab_get(t, unk, strlen(unk)) : -1;
    if (unk && t->unk_id < 0)
        return m3_errorf(M3_ERR_FORMAT, "%s: unk_token '%s' not in the vocab", t->path, unk);
    const m3_json *merges = m3_json_get(m, "merges");
    if (!merges || m3_json_is_null(merges)) return M3_OK;
    if (!m3_json_is_array(merges))
        return m3_errorf(M3_ERR_FORMAT, "%s: model.merges is not a list", t->path);
    int nm = m3_json_size(merges);
    t->m_mask = pow2_at_least((uint64_t)nm * 2 + 16) - 1;
    t->mk = malloc(((size_t)t->m_mask + 1) * sizeof *t->mk);
    t->mrank = malloc(((size_t)t->m_mask + 1) * sizeof *t->mrank);
    t->mnew = malloc(((size_t)t->m_mask + 1) * sizeof *t->mnew);
    if (!t->mk || !t->mrank || !t->mnew) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
    memset(t->mrank, 0xff, ((size_t)t->m_mask + 1) * sizeof *t->mrank);
    int64_t i = 0;
    char *cat = NULL;
    m3_status rc = M3_OK;
    for (e = m3_json_first(merges); e; e = m3_json_next(e)) {
        const char *a, *b;
        size_t la, lb;
        if (m3_json_is_string(e)) {
            /* legacy "a b": exactly two parts separated by one space */
            a = m3_json_str(e);
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                rc = m3_errorf(M3_ERR_FORMAT, "%s: merge %lld '%s' is not \"a b\"", t->path,
                               (long long)i, a);
                break;
            }
            la = (size_t)(sp - a);
            b = sp + 1;
            lb = strlen(b);
        } else if (m3_json_is_array(e) && m3_json_size(e) == 2 &&
                   (a = m3_json_str(m3_json_at(e, 0))) && (b = m3_json_str(m3_json_at(e, 1)))) {
            la = strlen(a);
            lb = strlen(b);
        } else {
            rc = m3_errorf(M3_ERR_FORMAT, "%s: merge %lld is neither \"a b\" nor [a, b]",
                           t->path, (long long)i);
            break;
        }
        int32_t ia, ib, in;
        if ((rc = merge_part(t, a, la, i, &ia)) || (rc = merge_part(t, b, lb, i, &ib))) break;
        free(cat);
        cat = malloc(la + lb + 1);
        if (!cat) {
            rc = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
            break;
        }
        memcpy(cat, a, la);
        memcpy(cat + la, b, lb);
        if ((rc = merge_part(t, cat, la + lb, i, &in))) break;
        merge_put(t, ia, ib, (int32_t)i, in);
        i++;
    }
    free(cat);
    return rc;
}

static m3_status parse_added(m3_tokenizer *t, const m3_json *l) {
    if (!l || m3_json_is_null(l)) return M3_OK;
    if (!m3_json_is_array(l)) return m3_errorf(M3_ERR_FORMAT, "%s: added_tokens is not a list", t->path);
    int n = m3_json_size(l);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
    const m3_json *e;
    for (e = m3_json_first(l); e; e = m3_json_next(e)) {
        double id;
        const char *c = jstr(e, "content");
        if (!c || !m3_json_double(m3_json_get(e, "id"), &id) || id < 0 || id > 1e9)
            return m3_errorf(M3_ERR_FORMAT, "%s: added_tokens entry %d lacks id/content",
                             t->path, t->n_added);
        added_tok *a = &t->added[t->n_added];
        a->s = strdup(c);
        if (!a->s) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
        t->n_added++;
        a->len = (int)strlen(c);
        a->id = (int32_t)id;
        a->special = jbool(e, "special", false);
        a->normalized = jbool(e, "normalized", !a->special);
        a->single_word = jbool(e, "single_word", false);
        a->lstrip = jbool(e, "lstrip", false);
        a->rstrip = jbool(e, "rstrip", false);
        if (a->id >= t->n_vocab) {
            int32_t nv = a->id + 1;
            char **nt = realloc(t->tok, (size_t)nv * sizeof *nt);
            if (nt) t->tok = nt;
            int *nl = realloc(t->tok_len, (size_t)nv * sizeof *nl);
            if (nl) t->tok_len = nl;
            if (!nt || !nl) return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", t->path);
            for (int32_t k = t->n_vocab; k < nv; k++) {
                t->tok[k] = NULL;
                t->tok_len[k] = 0;
            }
            t->n_vocab = nv;
        }
    }
    return M3_OK;
}

/* text: len bytes. Any parse failure is reported as "not a JSON object", as for a valid
 * document of another type. */
static m3_status tokenizer_parse(m3_tokenizer *t, const char *text, size_t len) {
    m3_json *root = NULL;
    m3_status rc = M3_OK;
    if (m3_json_parse(&root, text, len, t->path) != M3_OK || !m3_json_is_object(root)) {
        rc = m3_errorf(M3_ERR_FORMAT, "%s: not a JSON object", t->path);
        goto done;
    }
    if (!jnull(root, "normalizer")) {
        rc = m3_errorf(M3_ERR_UNSUPPORTED, "%s: normalizer '%s' not supported", t->path,
                       jstr(m3_json_get(root, "normalizer"), "type")
                           ? jstr(m3_json_get(root, "normalizer"), "type")
                           : "?");
        goto done;
    }
    const m3_json *dec = m3_json_get(root, "decoder");
    const char *dt = jstr(dec, "type");
    if (!dt || strcmp(dt, "ByteLevel")) {
        rc = m3_errorf(M3_ERR_UNSUPPORTED, "%s: decoder '%s' not supported (ByteLevel only)",
                       t->path, dt ? dt : "null");
        goto done;
    }
    const m3_json *model = m3_json_get(root, "model");
    if (!m3_json_is_object(model)) {
        rc = m3_errorf(M3_ERR_FORMAT, "%s: no model object", t->path);
        goto done;
    }
    if ((rc = parse_model(t, model))) goto done;
    if ((rc = parse_added(t, m3_json_get(root, "added_tokens")))) goto done;
    if ((rc = parse_pretok(t, m3_json_get(root, "pre_tokenizer"), 0))) goto done;
done:
    m3_json_free(root);
    return rc;
}

/* -- end of the tokenizer.json section ------------------------------------------------- */

m3_status m3_tokenizer_open(m3_tokenizer **out, const char *path) {
    *out = NULL;
    m3_tokenizer *t = calloc(1, sizeof *t);
    char *text = NULL;
    m3_status rc = M3_OK;
    if (!t || !(t->path = strdup(path))) {
        free(t);
        return m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
    }
    init_bytelevel(t);
    t->unk_id = -1;
    FILE *f = fopen(path, "rb");
    if (!f) {
        rc = m3_errorf(M3_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto done;
    }
    long sz = -1;
    if (fseek(f, 0, SEEK_END) == 0) sz = ftell(f);
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        rc = m3_errorf(M3_ERR_IO, "%s: cannot read", path);
        goto done;
    }
    text = malloc((size_t)sz + 1);
    if (!text || fread(text, 1, (size_t)sz, f) != (size_t)sz) {
        fclose(f);
        rc = m3_errorf(text ? M3_ERR_IO : M3_ERR_NOMEM, "%s: cannot read", path);
        goto done;
    }
    fclose(f);
    text[sz] = 0;
    if ((rc = tokenizer_parse(t, text, (size_t)sz))) goto done;
    /* one-character class tests: Rust regex \w (approximated by PCRE2 UCP classes) and \s */
    if ((rc = compile(t, word_class, strlen(word_class), false, &t->re_word)) ||
        (rc = compile(t, "\\s", 2, false, &t->re_space)))
        goto done;
    t->added_by_id = malloc((size_t)(t->n_vocab ? t->n_vocab : 1) * sizeof *t->added_by_id);
    if (!t->added_by_id) {
        rc = m3_errorf(M3_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (int32_t i = 0; i < t->n_vocab; i++) t->added_by_id[i] = -1;
    for (int k = 0; k < t->n_added; k++) t->added_by_id[t->added[k].id] = k;
done:
    free(text);
    if (rc) {
        m3_tokenizer_close(t);
        return rc;
    }
    *out = t;
    return M3_OK;
}
