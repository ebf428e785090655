/* sparse.c — sparse decode attention on a run (model/llama.h): which
 * layers use the ATTN_SPARSE op, its parameters, and its buffers (block
 * statistics, selections, scratch) in the run's backend memory, carved from
 * one allocation with checked sizes. The forward (forward.c) issues the op
 * for those layers; everything else stays dense. */
#include <string.h>

#include "core/mem.h"
#include "model/llama.h"

static void sparse_free(nstf_llama_run *r) {
    nstf_llama_sparse *sp = &r->sparse;
    if (sp->alloc && r->be) {
        (void)r->be->vt->sync(r->be);
        r->be->vt->free(r->be, sp->alloc);
    }
    nstf_free(sp->layer);
    nstf_free(sp->slot);
    memset(sp, 0, sizeof *sp);
}

nstf_status nstf_llama_run_sparse_set(nstf_llama_run *r, const uint8_t *layer, int topk, int block, int window) {
    sparse_free(r);
    int n_slots = 0;
    const nstf_llama_config *c = &r->m->cfg;
    for (int l = r->l0; layer && l < r->l1; l++) n_slots += layer[l] != 0;
    if (n_slots == 0) return NSTF_OK;
    if (r->tp) return nstf_set_error(NSTF_ERR_UNSUPPORTED, "sparse attention in a tensor-parallel run is not supported");
    if (r->s.kv_q8)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "sparse attention with the Q8_0 KV cache is not supported (a plan in the file asks for it: "
                              "--dense-attn, or the default cache type)");
    if (block < NSTF_SPARSE_BLOCK_MIN || block > NSTF_SPARSE_BLOCK_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "sparse attention: block of %d positions (use %d..%d)", block,
                              NSTF_SPARSE_BLOCK_MIN, NSTF_SPARSE_BLOCK_MAX);
    if (topk < 0 || topk > NSTF_SPARSE_TOPK_MAX || window < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "sparse attention: top-k %d (0..%d), window %d (>= 0)", topk,
                              NSTF_SPARSE_TOPK_MAX, window);
    if (r->s.kv_block)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "sparse attention needs a contiguous KV cache, not a paged one");
    if (c->sliding_window > 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "sparse attention on a sliding-window model (window %d)",
                              c->sliding_window);
    const int64_t nb = (r->s.n_ctx + block - 1) / block, kvd = (int64_t)c->n_kv_heads * c->head_dim,
                  ms = nstf_sparse_max_sel(NSTF_SPARSE_TOPK_MAX, block, r->s.n_ctx);
    const int64_t wf = nstf_sparse_work_floats(1, c->n_heads, c->n_kv_heads, c->head_dim, r->s.n_ctx,
                                               NSTF_SPARSE_TOPK_MAX, block, r->s.n_ctx);
    uint64_t per_slot = 0, stats = 0, mass = 0, sel = 0, all = 0;
    bool ok = nstf_mul_ok((uint64_t)r->s.n_seq, (uint64_t)nb, &per_slot) &&
              nstf_mul_ok(per_slot * (uint64_t)n_slots, (uint64_t)kvd * 4, &stats) &&
              nstf_mul_ok(per_slot * (uint64_t)n_slots, (uint64_t)c->n_kv_heads * 4, &mass) &&
              nstf_mul_ok((uint64_t)r->s.n_batch * (uint64_t)c->n_kv_heads, (uint64_t)ms * 4, &sel);
    all = 2 * stats + mass + sel + (uint64_t)wf * 4;
    if (!ok || all < stats) return nstf_set_error(NSTF_ERR_OOM, "sparse attention: buffer sizes overflow");
    nstf_llama_sparse *sp = &r->sparse;
    sp->layer = nstf_calloc((size_t)c->n_layers, 1, "sparse layers");
    sp->slot = nstf_calloc((size_t)c->n_layers, sizeof(int), "sparse slots");
    nstf_status st = sp->layer && sp->slot ? r->be->vt->alloc(r->be, all, &sp->alloc) : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = r->be->vt->zero(r->be, sp->alloc, all);
    if (st != NSTF_OK) {
        sparse_free(r);
        return st;
    }
    for (int l = 0, i = 0; l < c->n_layers; l++) {
        sp->layer[l] = l >= r->l0 && l < r->l1 && layer[l] != 0;
        sp->slot[l] = sp->layer[l] ? i++ : -1;
    }
    char *base = sp->alloc;
    sp->kmin = (float *)base;
    sp->kmax = (float *)(base + stats);
    sp->mass = (float *)(base + 2 * stats);
    sp->sel = (int32_t *)(base + 2 * stats + mass);
    sp->work = (float *)(base + 2 * stats + mass + sel);
    sp->on = true;
    sp->block = block;
    sp->decay = 0.9f;
    return nstf_llama_run_sparse_tune(r, topk, window);
}

nstf_status nstf_llama_run_sparse_tune(nstf_llama_run *r, int topk, int window) {
    if (!r->sparse.on) return nstf_set_error(NSTF_ERR_INVALID_ARG, "sparse attention is not set up on this run");
    if (topk < 0 || topk > NSTF_SPARSE_TOPK_MAX || window < 0 || window > r->s.n_ctx)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "sparse attention: top-k %d (0..%d), window %d (0..%d)", topk,
                              NSTF_SPARSE_TOPK_MAX, window, r->s.n_ctx);
    r->sparse.topk = topk;
    r->sparse.window = window;
    return NSTF_OK;
}
