/* compare/stages.c: the stage table (see stages.h). Order = execution order of §3 of the
 * numerics spec: embed -> per layer (input, attention half, MLP half, output) -> final
 * norm -> logits. Vision stages come before embed because vision/merged overwrites the
 * image placeholder rows of the embedding. */
#include "compare/stages.h"

#include <string.h>

static const m3_stage table[] = {
    /* name                scope              kind                    ph pair    shape */
    {"tokens",             M3_SCOPE_GLOBAL, M3_STAGE_EXACT,         0, NULL, "[T] int32"},
    {"positions",          M3_SCOPE_GLOBAL, M3_STAGE_EXACT,         0, NULL, "[T] int32"},
    {"vision/patch_embed", M3_SCOPE_GLOBAL, M3_STAGE_FLOAT,         0, NULL, "[P,Hv]"},
    {"output",             M3_SCOPE_VISION, M3_STAGE_FLOAT,         1, NULL, "[P,Hv]"},
    {"vision/projector",   M3_SCOPE_GLOBAL, M3_STAGE_FLOAT,         2, NULL, "[P,H]"},
    {"vision/merged",      M3_SCOPE_GLOBAL, M3_STAGE_FLOAT,         2, NULL, "[P/4,H]"},
    {"embed",              M3_SCOPE_GLOBAL, M3_STAGE_FLOAT,         2, NULL, "[T,H]"},
    {"input",              M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"attn_norm",          M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"q_proj",             M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nq*d]"},
    {"k_proj",             M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nkv*d]"},
    {"v_proj",             M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nkv*d]"},
    {"q",                  M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nq,d]"},
    {"k",                  M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nkv,d]"},
    {"v",                  M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nkv,d]"},
    {"index_q",            M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,G,di]"},
    {"index_k",            M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,di]"},
    {"index_scores",       M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[G,T,NB] block scores"},
    {"index_topk",         M3_SCOPE_LAYER,  M3_STAGE_INDEX_SET,     3, "index_scores", "[G,T,K] int32"},
    {"attn_out",           M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,nq*d]"},
    {"attn_proj",          M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"mlp_norm",           M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"router_logits",      M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,E]"},
    {"expert_ids",         M3_SCOPE_LAYER,  M3_STAGE_INDEX_SET,     3, "router_logits", "[T,k] int32"},
    {"expert_weights",     M3_SCOPE_LAYER,  M3_STAGE_WEIGHTS_BY_ID, 3, "expert_ids", "[T,k]"},
    {"shared_out",         M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"mlp_out",            M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"output",             M3_SCOPE_LAYER,  M3_STAGE_FLOAT,         3, NULL, "[T,H]"},
    {"final_norm",         M3_SCOPE_GLOBAL, M3_STAGE_FLOAT,         4, NULL, "[T,H]"},
    {"logits",             M3_SCOPE_GLOBAL, M3_STAGE_LOGITS,        4, NULL, "[T,V] or [t,V]"},
};

#define N_STAGES ((int)(sizeof table / sizeof table[0]))

const m3_stage *m3_stages(int *n) {
    *n = N_STAGES;
    return table;
}

const m3_stage *m3_stage_find(const char *name, m3_stage_scope scope) {
    for (int i = 0; i < N_STAGES; i++)
        if (table[i].scope == scope && strcmp(table[i].name, name) == 0) return &table[i];
    return NULL;
}

int m3_stage_order(const m3_stage *s) { return s ? (int)(s - table) : N_STAGES; }

const char *m3_stage_kind_name(m3_stage_kind k) {
    switch (k) {
    case M3_STAGE_FLOAT: return "float";
    case M3_STAGE_EXACT: return "exact";
    case M3_STAGE_INDEX_SET: return "index-set";
    case M3_STAGE_WEIGHTS_BY_ID: return "weights-by-id";
    case M3_STAGE_LOGITS: return "logits";
    }
    return "?";
}
