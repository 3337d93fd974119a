/* compare/stages.h: the dump stages of one forward pass, ONCE, in execution order
 * (shared spec/dump-schema.md). The reference forward, the GPU forward and `m3 compare`
 * iterate this same table, so the comparator can name the FIRST stage that diverges.
 *
 * A stage is global ("embed", "logits", "vision/projector"), per text layer
 * ("layers/NN/<name>") or per vision layer ("vision/layers/NN/<name>"). Its kind says how
 * two dumps of it are compared (compare/diff.h):
 *   FLOAT           elementwise metrics (NMSE, SQNR, max |Δ|, cosine, relative error)
 *   EXACT           integer data that must be identical (tokens, positions)
 *   INDEX_SET       int32 ids, one set per row of the last dim; -1 pads; order ignored
 *   WEIGHTS_BY_ID   float weights aligned with the INDEX_SET stage `pair`; compared after
 *                   sorting each row by id, on rows whose sets agree
 *   LOGITS          FLOAT metrics plus KL(A||B), top-1 agreement and Δp per position */
#ifndef M3_STAGES_H
#define M3_STAGES_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    M3_STAGE_FLOAT = 0,
    M3_STAGE_EXACT,
    M3_STAGE_INDEX_SET,
    M3_STAGE_WEIGHTS_BY_ID,
    M3_STAGE_LOGITS
} m3_stage_kind;

typedef enum {
    M3_SCOPE_GLOBAL = 0, /* key = name */
    M3_SCOPE_VISION,     /* key = vision/layers/NN/name */
    M3_SCOPE_LAYER       /* key = layers/NN/name */
} m3_stage_scope;

typedef struct m3_stage {
    const char *name;    /* as in the key: "attn_out", "vision/projector" */
    m3_stage_scope scope;
    m3_stage_kind kind;
    int phase;           /* 0 inputs, 1 vision layers, 2 vision out + embed, 3 text layers,
                            4 final norm + logits: phase then layer then table order is
                            execution order */
    const char *pair;    /* WEIGHTS_BY_ID: the ids stage; INDEX_SET: the score stage used to
                            classify near-tie flips (may be absent from a dump); else NULL */
    const char *shape;   /* documentation: the schema's shape in legend letters */
} m3_stage;

/* The table, in execution order; *n receives its length. Static storage. */
const m3_stage *m3_stages(int *n);
/* Table row for a stage name in a scope, or NULL for a stage the table does not know
 * (extra stages are legal; the comparator treats them as FLOAT, or EXACT for int32 data). */
const m3_stage *m3_stage_find(const char *name, m3_stage_scope scope);
/* Position of a stage in the table (for ordering); unknown stages sort after known ones of
 * their scope. */
int m3_stage_order(const m3_stage *s);
const char *m3_stage_kind_name(m3_stage_kind k);

#ifdef __cplusplus
}
#endif
#endif
