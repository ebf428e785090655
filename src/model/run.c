/* run.c — a model placed on a backend: the weights in its memory (one
 * allocation carved by a size table, or the file's mapping itself on a
 * host backend), the run state (activations and KV cache, a second
 * allocation carved by a size table) and the backend's own workspace,
 * all planned and checked against the free memory before anything is
 * allocated. */
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/llama.h"

#define ALIGN 256u

/* A carve: entries placed one after another, each ALIGN-aligned. */
typedef struct carve {
    uint64_t off;
    bool ok;
} carve;

static uint64_t carve_take(carve *c, uint64_t bytes) {
    uint64_t at = c->off, r;
    if (!c->ok || !nstf_add_ok(bytes, ALIGN - 1, &r) || !nstf_add_ok(c->off, r & ~(uint64_t)(ALIGN - 1), &c->off))
        c->ok = false;
    return at;
}

static bool mat_bytes(const nstf_matrix *m, uint64_t *out) {
    uint64_t rb;
    return nstf_type_row_bytes(m->type, m->n_in, &rb) && nstf_mul_ok(rb, (uint64_t)m->n_out, out);
}

/* ---- weights --------------------------------------------------------------------- */

typedef struct placer {
    nstf_backend *be;
    char *base; /* NULL: sizes only */
    carve cv;
    nstf_status st;
    const nstf_matrix *src_fac; /* the model's low-rank factor table */
    nstf_matrix *dst_fac;       /* the run's, same slots */
} placer;

static void put(placer *p, uint64_t off, const void *src, uint64_t bytes) {
    if (p->base && p->cv.ok && p->st == NSTF_OK) p->st = p->be->vt->upload(p->be, p->base + off, src, bytes);
}

static void view(placer *p, nstf_matrix *dst, const nstf_matrix *src, uint64_t off) {
    if (!p->base) return;
    *dst = *src;
    dst->data = p->base + off;
}

/* The uploaded matrix into the backend's own layout (backend.h). */
static void relayout(placer *p, const nstf_matrix *m) {
    if (p->base && p->cv.ok && p->st == NSTF_OK && p->be->vt->relayout) p->st = p->be->vt->relayout(p->be, m);
}

/* Matrices that share a type are placed back to back (Q|K|V, gate|up), so
 * a backend can run each group as one matmul (nstf_matrix_group_span). */
static void put_group(placer *p, const nstf_matrix *const *src, nstf_matrix *const *dst, int n);

/* A low-rank matrix: its two factors, each placed on its own, in the
 * run's factor slot of the same index as the model's. */
static void put_factors(placer *p, const nstf_matrix *src, nstf_matrix *dst) {
    const ptrdiff_t slot = src->factors - p->src_fac;
    const nstf_matrix *fa = &src->factors[0], *fb = &src->factors[1];
    nstf_matrix *da = p->dst_fac + slot, *db = da + 1;
    put_group(p, &fa, &da, 1);
    put_group(p, &fb, &db, 1);
    if (p->base) *dst = (nstf_matrix){NULL, src->type, src->n_in, src->n_out, da};
}

static void put_group(placer *p, const nstf_matrix *const *src, nstf_matrix *const *dst, int n) {
    bool lowrank = false;
    for (int i = 0; i < n; i++) lowrank = lowrank || src[i]->factors;
    if (lowrank) {
        for (int i = 0; i < n; i++) {
            if (src[i]->factors) put_factors(p, src[i], dst[i]);
            else put_group(p, &src[i], &dst[i], 1);
        }
        return;
    }
    uint64_t b[NSTF_MM_MAX_GROUP];
    bool adjacent = true;
    for (int i = 0; i < n; i++) {
        if (!mat_bytes(src[i], &b[i])) {
            p->cv.ok = false;
            return;
        }
        if (i > 0 && (src[i]->type != src[0]->type || b[i - 1] % 16 != 0)) adjacent = false;
    }
    uint64_t off[NSTF_MM_MAX_GROUP];
    if (adjacent) {
        uint64_t sum = 0;
        for (int i = 0; i < n; i++) sum += b[i];
        off[0] = carve_take(&p->cv, sum);
        for (int i = 1; i < n; i++) off[i] = off[i - 1] + b[i - 1];
    } else {
        for (int i = 0; i < n; i++) off[i] = carve_take(&p->cv, b[i]);
    }
    for (int i = 0; i < n; i++) {
        put(p, off[i], src[i]->data, b[i]);
        view(p, dst[i], src[i], off[i]);
        relayout(p, dst[i]);
    }
}

static void put_norm(placer *p, const float *src, int64_t dim, const float **dst) {
    const uint64_t bytes = (uint64_t)dim * sizeof(float);
    uint64_t off = carve_take(&p->cv, bytes);
    put(p, off, src, bytes);
    if (p->base) *dst = (const float *)(p->base + off);
}

/* The weights' size table; with p->base also upload them and fill w. */
static nstf_status weights_place(placer *p, const nstf_llama *m, const nstf_llama_run *r, nstf_llama_weights *w,
                                 uint64_t *total) {
    const nstf_llama_config *c = &m->cfg;
    const nstf_matrix *te = &m->w.tok_embd;
    nstf_matrix *te_dst = &w->tok_embd;
    /* the embedding on the first stage, and on the last when it is the tied output */
    if (r->embed || (r->output && c->tied_output)) put_group(p, &te, &te_dst, 1);
    for (int l = r->l0; p->cv.ok && l < r->l1; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        nstf_llama_layer *D = &w->layers[l];
        put_norm(p, L->attn_norm, c->dim, &D->attn_norm);
        put_norm(p, L->ffn_norm, c->dim, &D->ffn_norm);
        const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
        if (L->bq) {
            put_norm(p, L->bq, qd, &D->bq);
            put_norm(p, L->bk, kvd, &D->bk);
            put_norm(p, L->bv, kvd, &D->bv);
        }
        if (L->q_norm) {
            put_norm(p, L->q_norm, c->head_dim, &D->q_norm);
            put_norm(p, L->k_norm, c->head_dim, &D->k_norm);
        }
        const nstf_matrix *qkv[3] = {&L->wq, &L->wk, &L->wv}, *o = &L->wo, *gu[2] = {&L->w_gate, &L->w_up},
                          *dn = &L->w_down;
        nstf_matrix *qkv_d[3] = {&D->wq, &D->wk, &D->wv}, *o_d = &D->wo, *gu_d[2] = {&D->w_gate, &D->w_up},
                    *dn_d = &D->w_down;
        put_group(p, qkv, qkv_d, 3);
        put_group(p, &o, &o_d, 1);
        put_group(p, gu, gu_d, 2);
        put_group(p, &dn, &dn_d, 1);
    }
    /* the RoPE frequency factors on every stage with layers */
    if (m->w.rope_factors && r->l1 > r->l0) put_norm(p, m->w.rope_factors, c->head_dim / 2, &w->rope_factors);
    if (r->output) {
        put_norm(p, m->w.out_norm, c->dim, &w->out_norm);
        if (c->tied_output) {
            if (p->base) w->output = w->tok_embd;
        } else {
            const nstf_matrix *out = &m->w.output;
            nstf_matrix *out_d = &w->output;
            put_group(p, &out, &out_d, 1);
        }
    }
    if (!p->cv.ok) return nstf_set_error(NSTF_ERR_RANGE, "the weight table overflows or has a bad row size");
    *total = p->cv.off;
    return p->st;
}

/* Whether put_group places these matrices back to back. */
static bool placed_adjacent(const nstf_matrix *const *w, int n) {
    for (int i = 0; i < n; i++)
        if (w[i]->factors) return false;
    for (int i = 1; i < n; i++) {
        uint64_t b;
        if (w[i]->type != w[0]->type || !mat_bytes(w[i - 1], &b) || b % 16 != 0) return false;
    }
    return true;
}

/* One entry per matmul of the layers: a group as one matrix where it is
 * (or, with as_placed, where put_group will make it) adjacent. The output
 * matrix is not listed: a backend sizes no workspace for it (its every-
 * token logits of a prefill are the rare case). */
static int matmuls(const nstf_llama_weights *w, int l0, int l1, nstf_matrix *out, int cap, bool as_placed) {
    int n = 0;
#define ADD(m) do { if (n < cap) out[n] = (m); n++; } while (0)
    /* a low-rank matrix is its two factors' matmuls */
#define ADD_ONE(m) do { if ((m)->factors) { ADD((m)->factors[0]); ADD((m)->factors[1]); } else ADD(*(m)); } while (0)
    for (int l = l0; l < l1; l++) {
        const nstf_llama_layer *L = &w->layers[l];
        const nstf_matrix *g[2][3] = {{&L->wq, &L->wk, &L->wv}, {&L->w_gate, &L->w_up, NULL}};
        for (int k = 0; k < 2; k++) {
            const int gn = k ? 2 : 3;
            nstf_matrix span = *g[k][0];
            bool one = as_placed ? placed_adjacent(g[k], gn) : nstf_matrix_group_span(g[k], gn, &span);
            if (one && as_placed)
                for (int i = 1; i < gn; i++) span.n_out += g[k][i]->n_out;
            if (one) ADD(span);
            else for (int i = 0; i < gn; i++) ADD_ONE(g[k][i]);
            ADD_ONE(k ? &L->w_down : &L->wo);
        }
    }
#undef ADD_ONE
#undef ADD
    return n;
}

int nstf_llama_matmuls(const nstf_llama_weights *w, const nstf_llama_config *c, nstf_matrix *out, int cap) {
    return matmuls(w, 0, c->n_layers, out, cap, false);
}

/* ---- run state ------------------------------------------------------------------------- */

/* The run state's size table; with base also carve the pointers. */
static nstf_status state_plan(nstf_llama_state *s, const nstf_llama_config *c, int n_layers, const nstf_backend *be,
                              char *base, uint64_t *total) {
    uint64_t act = 0, kv = 0;
    (void)nstf_type_row_bytes(be->act_type, 1, &act);
    (void)nstf_type_row_bytes(be->kv_type, 1, &kv);
    if (!nstf_kv_row_bytes(s->kv_q8, (int)kv, (int64_t)c->n_kv_heads * c->head_dim, &s->kv_row))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "a KV cache row of %d x %d values%s", c->n_kv_heads, c->head_dim,
                              s->kv_q8 ? " (Q8_0: a multiple of 32)" : "");
    const uint64_t B = (uint64_t)s->n_batch, dim = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim,
                   kvd = (uint64_t)c->n_kv_heads * c->head_dim, ffn = (uint64_t)c->ffn_dim, V = (uint64_t)c->n_vocab;
    uint64_t sz[12] = {0}, cache = 0;
    bool ok = nstf_mul_ok(B * 4, dim, &sz[0]) &&                    /* x */
              nstf_mul_ok(B * act, dim, &sz[2]) &&                  /* xb */
              nstf_mul_ok(B * act, qd + 2 * kvd, &sz[3]) &&         /* qkv */
              nstf_mul_ok(B * act, qd, &sz[4]) &&                   /* att */
              nstf_mul_ok(B * act, 2 * ffn, &sz[5]) &&              /* h */
              nstf_mul_ok(B * act, ffn, &sz[6]) &&                  /* hs */
              nstf_mul_ok(B * 4, V, &sz[7]) &&                      /* logits */
              nstf_mul_ok((uint64_t)n_layers * (uint64_t)(s->kv_block ? s->kv_blocks : s->n_seq),
                          (uint64_t)(s->kv_block ? s->kv_block : s->n_ctx), &cache) &&
              nstf_mul_ok(cache, s->kv_row, &sz[9]);                /* k_cache */
    sz[1] = sz[0];  /* y */
    sz[8] = B * 4 > 16 ? B * 4 : 16; /* argmax */
    sz[10] = sz[9]; /* v_cache */
    carve cv = {0, ok};
    uint64_t off[11];
    for (int i = 0; i < 11; i++) off[i] = carve_take(&cv, sz[i]);
    if (!cv.ok)
        return nstf_set_error(NSTF_ERR_RANGE, "the run state for context %d, batch %d and %d sequences overflows",
                              s->n_ctx, s->n_batch, s->n_seq);
    *total = cv.off;
    s->kv_bytes = 2 * sz[9];
    if (!base) return NSTF_OK;
    s->x = (float *)(base + off[0]);
    s->y = (float *)(base + off[1]);
    s->xb = base + off[2];
    s->qkv = base + off[3];
    s->att = base + off[4];
    s->h = base + off[5];
    s->hs = base + off[6];
    s->logits = (float *)(base + off[7]);
    s->argmax = (int32_t *)(base + off[8]);
    s->k_cache = base + off[9];
    s->v_cache = base + off[10];
    return NSTF_OK;
}

/* ---- the run ------------------------------------------------------------------------------ */

static double mib(uint64_t b) { return (double)b / (1 << 20); }
static double gib(uint64_t b) { return (double)b / (1u << 30); }

void nstf_llama_run_free(nstf_llama_run *r) {
    if (!r) return;
    if (r->tp) { /* rank 0's run: the whole group */
        nstf_llama_tp_free(r);
        return;
    }
    (void)nstf_llama_run_sparse_set(r, NULL, 0, 0, 0);
    if (r->be) {
        (void)r->be->vt->sync(r->be);
        if (r->s.block) r->be->vt->free(r->be, r->s.block);
        if (r->wblock) r->be->vt->free(r->be, r->wblock);
    }
    if (r->w.layers != r->m->w.layers) nstf_free(r->w.layers);
    if (r->w.factors != r->m->w.factors) nstf_free(r->w.factors);
    nstf_free(r->xfer);
    nstf_free(r);
}

nstf_status nstf_llama_run_create(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                  nstf_llama_run **out) {
    const nstf_llama_run_shape sh = {n_ctx, n_batch, n_seq, 0, m->cfg.n_layers, true, true, 0, 0, false};
    return nstf_llama_run_create_shaped(m, be, &sh, out);
}

nstf_status nstf_llama_run_create_paged(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                        int kv_block, int kv_blocks, nstf_llama_run **out) {
    const nstf_llama_run_shape sh = {n_ctx, n_batch, n_seq, 0, m->cfg.n_layers, true, true, kv_block, kv_blocks, false};
    return nstf_llama_run_create_shaped(m, be, &sh, out);
}

nstf_status nstf_llama_run_create_stage(const nstf_llama *m, nstf_backend *be, int n_ctx, int n_batch, int n_seq,
                                        int l0, int l1, bool embed, bool output, nstf_llama_run **out) {
    const nstf_llama_run_shape sh = {n_ctx, n_batch, n_seq, l0, l1, embed, output, 0, 0, false};
    return nstf_llama_run_create_shaped(m, be, &sh, out);
}

nstf_status nstf_llama_run_create_shaped(const nstf_llama *m, nstf_backend *be, const nstf_llama_run_shape *sh,
                                         nstf_llama_run **out) {
    int n_batch = sh->n_batch;
    const int n_ctx = sh->n_ctx, n_seq = sh->n_seq, l0 = sh->l0, l1 = sh->l1, kv_block = sh->kv_block,
              kv_blocks = sh->kv_blocks;
    const bool embed = sh->embed, output = sh->output;
    *out = NULL;
    const nstf_llama_config *c = &m->cfg;
    if (n_ctx < 1 || n_batch < 1 || n_seq < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "context (%d), batch (%d) and sequences (%d) must be positive",
                              n_ctx, n_batch, n_seq);
    if (kv_block < 0 || (kv_block > 0 && (kv_blocks < 1 || n_ctx % kv_block != 0)) || (kv_block == 0 && kv_blocks != 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "paged KV cache: %d blocks of %d positions for a context of %d (a positive number of "
                              "blocks whose size divides the context)",
                              kv_blocks, kv_block, n_ctx);
    if (sh->kv_q8 && (kv_block > 0 || ((int64_t)c->n_kv_heads * c->head_dim) % 32 != 0))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "the Q8_0 KV cache: %s",
                              kv_block > 0 ? "not with a paged cache (the server's) yet"
                                           : "kv heads x head_dim must be a multiple of 32");
    if (l0 < 0 || l1 < l0 || l1 > c->n_layers || (l0 == l1 && !embed && !output))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "stage of layers %d..%d of a %d-layer model", l0, l1 - 1,
                              c->n_layers);
    if ((int64_t)n_batch > (int64_t)n_ctx * n_seq) n_batch = n_ctx * n_seq;
    nstf_llama_run *r = nstf_calloc(1, sizeof *r, "model run");
    if (!r) return NSTF_ERR_OOM;
    r->m = m;
    r->be = be;
    r->l0 = l0;
    r->l1 = l1;
    r->embed = embed;
    r->output = output;
    r->s.n_ctx = n_ctx;
    r->s.n_batch = n_batch;
    r->s.n_seq = n_seq;
    r->s.kv_block = kv_block;
    r->s.kv_blocks = kv_blocks;
    r->s.kv_q8 = sh->kv_q8;

    /* plan: weights, run state, workspace */
    nstf_status st = NSTF_OK;
    placer p = {be, NULL, {0, true}, NSTF_OK, NULL, NULL};
    if (be->host_memory) {
        r->w = m->w;
        const nstf_gguf *g = m->file;
        for (uint64_t i = 0; g && i < g->n_tensors; i++) r->wbytes += g->tensors[i].n_bytes;
        r->wbytes += m->w.norm_floats * sizeof(float); /* fp32 norms, biases, factors */
    } else {
        r->w.layers = nstf_calloc((size_t)c->n_layers, sizeof *r->w.layers, "layer table");
        r->w.factors = nstf_calloc((size_t)c->n_layers * 14, sizeof *r->w.factors, "low-rank factor table");
        if (!r->w.layers || !r->w.factors) st = NSTF_ERR_OOM;
        p.src_fac = m->w.factors;
        p.dst_fac = r->w.factors;
        if (st == NSTF_OK) st = weights_place(&p, m, r, &r->w, &r->wbytes);
    }
    uint64_t sbytes = 0, ws = 0;
    if (st == NSTF_OK) st = state_plan(&r->s, c, l1 - l0, be, NULL, &sbytes);
    nstf_matrix *mats = NULL;
    const int n_mats = 14 * c->n_layers; /* every matrix on its own, or as two factors: the most there can be */
    nstf_backend_plan bp = {c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->n_vocab,
                            n_ctx, n_batch, n_seq, c->rope_base, c->rope_mode, NULL, 0,
                            embed ? m->w.tok_embd.type : NSTF_TYPE_F32, output ? m->w.output.type : NSTF_TYPE_F32,
                            kv_block, kv_blocks, sh->kv_q8};
    if (st == NSTF_OK) {
        mats = nstf_calloc((size_t)n_mats, sizeof *mats, "matmul list");
        if (!mats) st = NSTF_ERR_OOM;
    }
    if (st == NSTF_OK) {
        /* sizes only here: the groups as they will be placed */
        bp.mats = mats;
        bp.n_mats = matmuls(&m->w, l0, l1, mats, n_mats, !be->host_memory);
        st = be->vt->plan(be, &bp, &ws);
    }
    if (st == NSTF_OK) {
        nstf_backend_mem mem;
        be->vt->mem(be, &mem);
        const uint64_t wneed = be->host_memory ? 0 : r->wbytes, need = wneed + sbytes + ws + mem.reserve;
        if (mem.free && need > mem.free) {
            if (be->host_memory)
                st = nstf_set_error(NSTF_ERR_OOM,
                                    "activations and KV cache for context %d need %.1f MiB but only %.1f MiB of host "
                                    "memory is available; try a smaller -c",
                                    n_ctx, mib(sbytes + ws), mib(mem.free));
            else
                st = nstf_set_error(NSTF_ERR_OOM,
                                    "out of GPU memory: the model needs %.2f GiB on %s (weights %.2f, activations and "
                                    "KV cache for context %d %.2f, workspace %.2f, reserve %.2f) but %.2f GiB of %.2f "
                                    "are free; try a smaller -c or a quantized model",
                                    gib(need), be->device, gib(wneed), n_ctx, gib(sbytes), gib(ws), gib(mem.reserve),
                                    gib(mem.free), gib(mem.total));
        }
    }
    /* allocate and upload */
    if (st == NSTF_OK && !be->host_memory) st = be->vt->alloc(be, r->wbytes, &r->wblock);
    if (st == NSTF_OK && !be->host_memory) {
        p = (placer){be, r->wblock, {0, true}, NSTF_OK, m->w.factors, r->w.factors};
        st = weights_place(&p, m, r, &r->w, &r->wbytes);
    }
    if (st == NSTF_OK) st = be->vt->alloc(be, sbytes, &r->s.block);
    if (st == NSTF_OK) {
        r->s.block_bytes = sbytes;
        st = state_plan(&r->s, c, l1 - l0, be, r->s.block, &sbytes);
    }
    /* a device's empty cache reads as zeros, never as NaN from stale memory
     * (host pages are left untouched until used: attention never reads a
     * position no token wrote) */
    if (st == NSTF_OK && !be->host_memory) st = be->vt->zero(be, r->s.block, sbytes);
    if (st == NSTF_OK) {
        bp.n_mats = matmuls(&r->w, l0, l1, mats, n_mats, false);
        st = be->vt->prepare(be, &bp);
    }
    if (st == NSTF_OK) st = be->vt->sync(be);
    if (st == NSTF_OK && !output) { /* x goes to the next stage through the host */
        r->xfer = nstf_alloc((size_t)n_batch * (size_t)c->dim * sizeof(float), "stage transfer");
        if (!r->xfer) st = NSTF_ERR_OOM;
    }
    nstf_free(mats);
    if (st != NSTF_OK) {
        nstf_llama_run_free(r);
        return st;
    }
    *out = r;
    return NSTF_OK;
}
