/* session_sparse.c — a session's sparse decode attention: the model file's
 * plan (GGUF nstf.plan.attn_sparse, one u8 per layer, 1 = sparse, and
 * nstf.plan.sparse_topk / sparse_block / sparse_window, u32) or the
 * session's parameters, applied to every stage of the session's run; and
 * the nstf_tools.h controls. */
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"

enum { SPARSE_TOPK = 16, SPARSE_WINDOW = 64, SPARSE_BLOCK = 16 };

/* The file's per-layer flags into layer (n_layers), when it has a plan. */
static nstf_status read_plan(const nstf_gguf *g, int n_layers, uint8_t *layer, bool *has) {
    *has = false;
    if (!nstf_gguf_find_kv(g, "nstf.plan.attn_sparse")) return NSTF_OK;
    const nstf_gguf_kv *kv = NULL;
    NSTF_TRY(nstf_gguf_get_arr(g, "nstf.plan.attn_sparse", NSTF_GGUF_UINT8, &kv));
    if (kv->arr_n != (uint64_t)n_layers)
        return nstf_set_error(NSTF_ERR_FORMAT, "nstf.plan.attn_sparse has %llu flags for %d layers",
                              (unsigned long long)kv->arr_n, n_layers);
    const uint8_t *f = kv->arr_data;
    for (int l = 0; l < n_layers; l++) {
        if (f[l] > 1)
            return nstf_set_error(NSTF_ERR_FORMAT, "nstf.plan.attn_sparse[%d] is %u (0 dense, 1 sparse)", l, f[l]);
        layer[l] = f[l];
    }
    *has = true;
    return NSTF_OK;
}

/* value: the parameter, else the plan's key, else the default */
static int pick(int value, const nstf_gguf *g, bool plan, const char *key, int dflt) {
    if (value > 0) return value;
    const uint32_t v = plan ? nstf_gguf_get_u32_or(g, key, 0) : 0;
    return v > 0 && v <= (1u << 30) ? (int)v : dflt;
}

nstf_status nstf_session_sparse_apply(nstf_session *s) {
    const nstf_session_params *p = &s->params;
    if (p->sparse_attn < 0) return NSTF_OK;
    if (p->sparse_attn > 1 || p->sparse_topk < 0 || p->sparse_window < 0 || p->sparse_block < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "sparse attention: mode %d (-1, 0, 1), top-k %d, window %d, block %d",
                              p->sparse_attn, p->sparse_topk, p->sparse_window, p->sparse_block);
    const int L = s->model->cfg.n_layers;
    const nstf_gguf *g = s->model->file;
    uint8_t *layer = nstf_calloc((size_t)L, 1, "sparse layers");
    if (!layer) return NSTF_ERR_OOM;
    bool plan = false;
    nstf_status st = read_plan(g, L, layer, &plan);
    if (st == NSTF_OK && p->sparse_attn == 1) memset(layer, 1, (size_t)L);
    const int topk = pick(p->sparse_topk, g, plan, "nstf.plan.sparse_topk", SPARSE_TOPK),
              block = pick(p->sparse_block, g, plan, "nstf.plan.sparse_block", SPARSE_BLOCK),
              window = pick(p->sparse_window, g, plan, "nstf.plan.sparse_window", SPARSE_WINDOW);
    int n = 0;
    for (int l = 0; l < L; l++) n += layer[l];
    if (st == NSTF_OK && n > 0) {
        st = nstf_session_sparse_set(s, layer, topk, block, window);
        if (st == NSTF_OK && p->verbose)
            fprintf(stderr, "nstf: sparse attention in %d of %d layers (%s): top-k %d, blocks of %d, window %d\n", n, L,
                    p->sparse_attn == 1 ? "every layer" : "the file's plan", topk, block, window);
    }
    nstf_free(layer);
    return st;
}

nstf_status nstf_session_sparse_set(nstf_session *s, const uint8_t *layer, int topk, int block, int window) {
    for (nstf_llama_run *r = s->run; r; r = r->next)
        NSTF_TRY(nstf_llama_run_sparse_set(r, layer, topk, block, window > s->n_ctx ? s->n_ctx : window));
    return NSTF_OK;
}

int nstf_session_sparse(const nstf_session *s, int *topk, int *block, int *window) {
    int n = 0;
    for (const nstf_llama_run *r = s->run; r; r = r->next)
        for (int l = r->l0; r->sparse.on && l < r->l1; l++) n += r->sparse.layer[l];
    const nstf_llama_sparse *sp = &s->run->sparse;
    for (const nstf_llama_run *r = s->run; r && !sp->on; r = r->next) sp = &r->sparse;
    if (topk) *topk = sp->topk;
    if (block) *block = sp->block;
    if (window) *window = sp->window;
    return n;
}

nstf_status nstf_session_sparse_tune(nstf_session *s, int topk, int window) {
    bool any = false;
    for (nstf_llama_run *r = s->run; r; r = r->next) {
        if (!r->sparse.on) continue;
        NSTF_TRY(nstf_llama_run_sparse_tune(r, topk, window));
        any = true;
    }
    if (!any) return nstf_set_error(NSTF_ERR_INVALID_ARG, "the session has no sparse attention layers");
    /* a captured decode step holds the old top-k and window in its kernels'
     * arguments: turning graphs off and on drops it, the next step captures
     * afresh */
    if (s->be->vt->get_opt(s->be, NSTF_OPT_GRAPHS)) {
        NSTF_TRY(s->be->vt->set_opt(s->be, NSTF_OPT_GRAPHS, 0));
        NSTF_TRY(s->be->vt->set_opt(s->be, NSTF_OPT_GRAPHS, 1));
    }
    return NSTF_OK;
}
