/* forward.c — the Llama forward, written once for every backend.
 *
 *   x = embed(tokens)
 *   for each layer:
 *       q, k, v = rope(rmsnorm(x) [Wq; Wk; Wv])      one matmul op (norm, RoPE fused;
 *                                                     + bias, per-head q/k norm where
 *                                                     the architecture has them)
 *       a = attention(q, k, v, cache)                 writes k, v into the cache
 *       x += a Wo                                     one matmul op (residual fused)
 *       h = silu(rmsnorm(x) Wg) * (rmsnorm(x) Wu)     one matmul op (norm, SwiGLU fused)
 *       x += h Wd                                     one matmul op (residual fused)
 *   logits = rmsnorm(x) Wout                          one matmul op (norm fused)
 *
 * Each fused matmul is one op of the table with fusion flags. A backend
 * that runs it as one kernel says so through can_fuse; otherwise the
 * forward runs the separate ops here (rmsnorm, matmul, rope / swiglu), and
 * a residual add is carried to the next norm, which adds it on its way
 * (x += y; rmsnorm(x)): the order of the reference forward, so every
 * backend's unfused path computes what its fused one does.
 *
 * What an architecture adds (model/arch.h) are flags and arguments of
 * these same ops: the QKV bias and Qwen3's per-head q/k norm (matmul
 * fusion flags; unfused, the BIAS and HEAD_NORM ops before RoPE), RoPE
 * frequency factors (Llama 3.x) and the sliding window (Mistral) of the
 * attention. A Llama without them issues exactly the ops it always did.
 *
 * A layer the run made sparse (nstf_llama_run_sparse_set) runs the
 * ATTN_SPARSE op in place of ATTENTION: the same contract, plus the
 * layer's block statistics; its one-token steps attend to the selected
 * blocks only, its prefill densely.
 *
 * A matrix stored as low-rank factors (nstf_matrix.factors) runs as the
 * MATMUL_LR op, unfused, its intermediate x A^T [n, rank] in a run-state
 * buffer that is free at that point of the layer: att for Q/K/V, xb for
 * O and down, hs for gate/up (each holds n_batch rows of at least
 * min(n_in, n_out) >= rank values; the loader checks rank <= both). */
#include <math.h>
#include <string.h>

#include "core/mem.h"
#include "model/llama.h"

typedef struct fwd {
    nstf_llama_run *r;
    nstf_backend *be;
    const nstf_llama_config *c;
    const nstf_batch *b;
    nstf_batch_io io;
    int64_t n;
    float *pending; /* a block output (r->s.y) not yet added into x */
} fwd;

static nstf_view f32_rows(float *p, int64_t stride) { return (nstf_view){p, NSTF_TYPE_F32, stride}; }
static nstf_view act_rows(const fwd *f, void *p, int64_t stride) { return (nstf_view){p, f->be->act_type, stride}; }

static nstf_status run(fwd *f, const nstf_op_args *a) { return nstf_backend_op(f->be, a); }

static bool has_factors(const nstf_op_args *a) {
    for (int i = 0; i < a->matmul.n_w; i++)
        if (a->matmul.w[i]->factors) return true;
    return false;
}

/* The plain matmul of a group (no fusion flags): one op, or where some of
 * its matrices are low-rank, one op per matrix (MATMUL_LR for those, its
 * intermediate in lr_tmp). */
static nstf_status matmul_store(fwd *f, const nstf_op_args *mm, void *lr_tmp) {
    if (!has_factors(mm)) return run(f, mm);
    for (int i = 0; i < mm->matmul.n_w; i++) {
        const nstf_matrix *w = mm->matmul.w[i];
        if (!w->factors) {
            nstf_op_args one = *mm;
            one.matmul.n_w = 1;
            one.matmul.w[0] = w;
            one.matmul.out[0] = mm->matmul.out[i];
            NSTF_TRY(run(f, &one));
            continue;
        }
        if (!lr_tmp)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: a low-rank matrix here is not supported", mm->label);
        nstf_op_args lr = {.op = NSTF_OP_MATMUL_LR, .label = mm->label, .layer = mm->layer, .block = mm->block};
        lr.matmul_lr.a = &w->factors[0];
        lr.matmul_lr.b = &w->factors[1];
        lr.matmul_lr.x = mm->matmul.x;
        lr.matmul_lr.tmp = act_rows(f, lr_tmp, w->factors[0].n_out);
        lr.matmul_lr.out = mm->matmul.out[i];
        lr.matmul_lr.n = mm->matmul.n;
        NSTF_TRY(run(f, &lr));
    }
    return NSTF_OK;
}

/* A matmul op with its fusion flags: one op where the backend fuses it,
 * else the ops it stands for. a->matmul.out holds the group's views;
 * lr_tmp is the scratch of its low-rank matrices (see the top). */
static nstf_status matmul(fwd *f, nstf_op_args *a, void *lr_tmp) {
    const nstf_llama_state *s = &f->r->s;
    const int64_t n = a->matmul.n, n_in = a->matmul.w[0]->n_in;
    if (!has_factors(a) && f->be->vt->can_fuse(f->be, a)) {
        if (a->matmul.norm_x && f->pending) { /* a fused norm reads x: add the carried output first */
            nstf_op_args add = {.op = NSTF_OP_ADD, .label = "add", .layer = a->layer, .block = a->block};
            add.add.x = (float *)a->matmul.norm_x;
            add.add.y = f->pending + (a->matmul.norm_x - s->x);
            add.add.n = n * n_in;
            NSTF_TRY(run(f, &add));
            f->pending = NULL;
        }
        return run(f, a);
    }
    nstf_op_args mm = *a;
    mm.matmul.epi = NSTF_MM_STORE;
    mm.matmul.norm_x = NULL;
    mm.matmul.q_norm = mm.matmul.k_norm = NULL;
    for (int i = 0; i < NSTF_MM_MAX_GROUP; i++) mm.matmul.bias[i] = NULL;
    if (a->matmul.norm_x) {
        nstf_op_args norm = {.op = NSTF_OP_RMSNORM, .layer = a->layer, .block = a->block};
        norm.label = f->pending ? "add_rmsnorm" : "rmsnorm";
        norm.rmsnorm.x = (float *)a->matmul.norm_x;
        norm.rmsnorm.res = f->pending ? f->pending + (a->matmul.norm_x - s->x) : NULL;
        norm.rmsnorm.w = a->matmul.norm_w;
        norm.rmsnorm.y = act_rows(f, s->xb, n_in);
        norm.rmsnorm.n = n;
        norm.rmsnorm.dim = n_in;
        norm.rmsnorm.eps = a->matmul.eps;
        NSTF_TRY(run(f, &norm));
        f->pending = NULL;
        mm.matmul.x = norm.rmsnorm.y;
    }
    NSTF_TRY(matmul_store(f, &mm, lr_tmp));
    for (int i = 0; i < a->matmul.n_w; i++) {
        if (!a->matmul.bias[i]) continue;
        nstf_op_args b = {.op = NSTF_OP_BIAS, .label = "bias", .layer = a->layer, .block = a->block};
        b.bias.x = a->matmul.out[i];
        b.bias.b = a->matmul.bias[i];
        b.bias.n = n;
        b.bias.width = a->matmul.w[i]->n_out;
        NSTF_TRY(run(f, &b));
    }
    switch (a->matmul.epi) {
    case NSTF_MM_ROPE: {
        if (a->matmul.q_norm) {
            nstf_op_args hn = {.op = NSTF_OP_HEAD_NORM, .label = "qk_norm", .layer = a->layer, .block = a->block};
            hn.head_norm.q = a->matmul.out[0];
            hn.head_norm.k = a->matmul.out[1];
            hn.head_norm.wq = a->matmul.q_norm;
            hn.head_norm.wk = a->matmul.k_norm;
            hn.head_norm.n = n;
            hn.head_norm.n_heads = a->matmul.rope.n_heads;
            hn.head_norm.n_kv_heads = a->matmul.rope.n_kv_heads;
            hn.head_norm.head_dim = a->matmul.rope.head_dim;
            hn.head_norm.eps = a->matmul.eps;
            NSTF_TRY(run(f, &hn));
        }
        nstf_op_args rope = {.op = NSTF_OP_ROPE, .label = "rope", .layer = a->layer, .block = a->block};
        rope.rope.q = a->matmul.out[0];
        rope.rope.k = a->matmul.out[1];
        rope.rope.n = n;
        rope.rope.r = a->matmul.rope;
        return run(f, &rope);
    }
    case NSTF_MM_SWIGLU: {
        nstf_op_args sw = {.op = NSTF_OP_SWIGLU, .label = "swiglu", .layer = a->layer, .block = a->block};
        sw.swiglu.gate = a->matmul.out[0];
        sw.swiglu.up = a->matmul.out[1];
        sw.swiglu.y = a->matmul.act;
        sw.swiglu.n = n;
        sw.swiglu.n_ff = a->matmul.w[0]->n_out;
        return run(f, &sw);
    }
    case NSTF_MM_ACCUM:
        f->pending = s->y; /* the next norm adds it */
        return NSTF_OK;
    case NSTF_MM_ADD: /* training's (train_step.c runs its unfused form) */
        return nstf_set_error(NSTF_ERR_INTERNAL, "%s: the forward has no residual-input matmul", a->label);
    case NSTF_MM_STORE: return NSTF_OK;
    }
    return NSTF_OK;
}

static nstf_op_args mm_args(const char *label, int layer, nstf_block block, int64_t n) {
    nstf_op_args a = {.op = NSTF_OP_MATMUL, .label = label, .layer = layer, .block = block};
    a.matmul.n = n;
    return a;
}

/* The group's matrices and their output views in buf (the backend's layout). */
static void group(fwd *f, nstf_op_args *a, const nstf_matrix *w0, const nstf_matrix *w1, const nstf_matrix *w2,
                  void *buf) {
    const nstf_matrix *w[3] = {w0, w1, w2};
    a->matmul.n_w = w2 ? 3 : w1 ? 2 : 1;
    for (int i = 0; i < a->matmul.n_w; i++) a->matmul.w[i] = w[i];
    f->be->vt->place(f->be, a->matmul.w, a->matmul.n_w, a->matmul.n, buf, a->matmul.out);
}

/* A sparse layer's attention (model/llama.h: nstf_llama_sparse): the
 * attention op's arguments plus the layer's block statistics. */
static nstf_status sparse_attention(fwd *f, const nstf_op_args *at, int l) {
    const nstf_llama_sparse *sp = &f->r->sparse;
    const nstf_llama_state *s = &f->r->s;
    const int64_t nb = (s->n_ctx + sp->block - 1) / sp->block, per = (int64_t)s->n_seq * nb, slot = sp->slot[l];
    nstf_op_args a = {.op = NSTF_OP_ATTN_SPARSE, .label = "attn_sparse", .layer = l, .block = NSTF_BLOCK_ATTN};
    a.attn_sparse.q = at->attention.q;
    a.attn_sparse.k = at->attention.k;
    a.attn_sparse.v = at->attention.v;
    a.attn_sparse.k_cache = at->attention.k_cache;
    a.attn_sparse.v_cache = at->attention.v_cache;
    a.attn_sparse.out = at->attention.out;
    a.attn_sparse.pos = at->attention.pos;
    a.attn_sparse.seq = at->attention.seq;
    a.attn_sparse.n = at->attention.n;
    a.attn_sparse.n_ctx = at->attention.n_ctx;
    a.attn_sparse.pos0 = at->attention.pos0;
    a.attn_sparse.n_heads = at->attention.n_heads;
    a.attn_sparse.n_kv_heads = at->attention.n_kv_heads;
    a.attn_sparse.head_dim = at->attention.head_dim;
    a.attn_sparse.scale = at->attention.scale;
    a.attn_sparse.kv_q8 = at->attention.kv_q8;
    a.attn_sparse.block = sp->block;
    a.attn_sparse.topk = sp->topk;
    a.attn_sparse.window = sp->window;
    a.attn_sparse.kmin = sp->kmin + slot * per * f->c->n_kv_heads * f->c->head_dim;
    a.attn_sparse.kmax = sp->kmax + slot * per * f->c->n_kv_heads * f->c->head_dim;
    a.attn_sparse.mass = sp->mass + slot * per * f->c->n_kv_heads;
    a.attn_sparse.mass_decay = sp->decay;
    a.attn_sparse.sel = sp->sel;
    a.attn_sparse.work = sp->work;
    return run(f, &a);
}

/* A tensor-parallel rank's block output y is its partial sum (a share of
 * O's or down's input columns): the all-reduce makes it the whole, which
 * it adds into x itself where its transport can (the peer path), and the
 * next norm adds like any carried output otherwise. */
static nstf_status tp_reduce(fwd *f) {
    if (!f->r->tp) return NSTF_OK;
    bool added = false;
    NSTF_TRY(nstf_llama_tp_allreduce(f->r, f->r->s.y, f->r->s.x, f->n * f->c->dim, &added));
    f->pending = added ? NULL : f->r->s.y;
    return NSTF_OK;
}

static nstf_status layers(fwd *f) {
    const nstf_llama_config *c = f->c;
    const nstf_llama_weights *w = &f->r->w;
    nstf_llama_state *s = &f->r->s;
    const int64_t n = f->n, dim = c->dim, hd = c->head_dim, qd = (int64_t)c->n_heads * hd;
    const uint64_t layer_cache = (uint64_t)(s->kv_block ? s->kv_blocks : s->n_seq) *
                                 (uint64_t)(s->kv_block ? s->kv_block : s->n_ctx) * s->kv_row;
    const nstf_rope_args rope = {f->io.pos, c->n_heads, c->n_kv_heads, c->head_dim, c->rope_base, c->rope_mode,
                                 w->rope_factors};
    f->pending = NULL;

    if (f->r->embed) {
        nstf_op_args e = {.op = NSTF_OP_GET_ROWS, .label = "embed", .layer = -1};
        e.get_rows.table = &w->tok_embd;
        e.get_rows.ids = f->io.ids;
        e.get_rows.out = f32_rows(s->x, dim);
        e.get_rows.n = n;
        NSTF_TRY(run(f, &e));
    }

    for (int l = f->r->l0; l < f->r->l1; l++) {
        const int64_t lc = l - f->r->l0; /* this stage's cache holds its own layers */
        const nstf_llama_layer *L = &w->layers[l];
        /* attention block */
        nstf_op_args qkv = mm_args("qkv_proj", l, NSTF_BLOCK_ATTN, n);
        group(f, &qkv, &L->wq, &L->wk, &L->wv, s->qkv);
        qkv.matmul.norm_x = s->x;
        qkv.matmul.norm_w = L->attn_norm;
        qkv.matmul.eps = c->norm_eps;
        qkv.matmul.epi = NSTF_MM_ROPE;
        qkv.matmul.rope = rope;
        qkv.matmul.bias[0] = L->bq;
        qkv.matmul.bias[1] = L->bk;
        qkv.matmul.bias[2] = L->bv;
        qkv.matmul.q_norm = L->q_norm;
        qkv.matmul.k_norm = L->k_norm;
        NSTF_TRY(matmul(f, &qkv, s->att));

        nstf_op_args at = {.op = NSTF_OP_ATTENTION, .label = "attention", .layer = l, .block = NSTF_BLOCK_ATTN};
        at.attention.q = qkv.matmul.out[0];
        at.attention.k = qkv.matmul.out[1];
        at.attention.v = qkv.matmul.out[2];
        at.attention.k_cache = (char *)s->k_cache + lc * layer_cache;
        at.attention.v_cache = (char *)s->v_cache + lc * layer_cache;
        at.attention.out = act_rows(f, s->att, qd);
        at.attention.pos = f->io.pos;
        at.attention.seq = f->io.seq;
        at.attention.n = n;
        at.attention.n_ctx = s->n_ctx;
        at.attention.pos0 = -1;
        at.attention.n_heads = c->n_heads;
        at.attention.n_kv_heads = c->n_kv_heads;
        at.attention.head_dim = c->head_dim;
        at.attention.scale = 1.0f / sqrtf((float)hd);
        at.attention.window = c->sliding_window;
        at.attention.blocks = f->io.blocks;
        at.attention.block_size = s->kv_block;
        at.attention.kv_q8 = s->kv_q8;
        if (!f->b->seq || f->b->seq[0] == 0) {
            bool run1 = true;
            for (int64_t t = 1; t < n && run1; t++)
                run1 = f->b->pos[t] == f->b->pos[t - 1] + 1 && (!f->b->seq || f->b->seq[t] == f->b->seq[0]);
            if (run1) at.attention.pos0 = f->b->pos[0];
        }
        if (f->r->sparse.on && f->r->sparse.layer[l] && !f->io.blocks) NSTF_TRY(sparse_attention(f, &at, l));
        else NSTF_TRY(run(f, &at));

        nstf_op_args o = mm_args("o_proj", l, NSTF_BLOCK_ATTN, n);
        group(f, &o, &L->wo, NULL, NULL, s->y);
        o.matmul.out[0] = f32_rows(s->y, dim);
        o.matmul.x = act_rows(f, s->att, qd);
        o.matmul.epi = f->r->tp ? NSTF_MM_STORE : NSTF_MM_ACCUM;
        o.matmul.res = s->x;
        NSTF_TRY(matmul(f, &o, s->xb));
        NSTF_TRY(tp_reduce(f));

        /* feed-forward block */
        nstf_op_args gu = mm_args("gate_up_proj", l, NSTF_BLOCK_FFN, n);
        group(f, &gu, &L->w_gate, &L->w_up, NULL, s->h);
        gu.matmul.norm_x = s->x;
        gu.matmul.norm_w = L->ffn_norm;
        gu.matmul.eps = c->norm_eps;
        gu.matmul.epi = NSTF_MM_SWIGLU;
        gu.matmul.act = act_rows(f, s->hs, c->ffn_dim);
        NSTF_TRY(matmul(f, &gu, s->hs));

        nstf_op_args d = mm_args("down_proj", l, NSTF_BLOCK_FFN, n);
        group(f, &d, &L->w_down, NULL, NULL, s->y);
        d.matmul.out[0] = f32_rows(s->y, dim);
        d.matmul.x = gu.matmul.act;
        d.matmul.epi = f->r->tp ? NSTF_MM_STORE : NSTF_MM_ACCUM;
        d.matmul.res = s->x;
        NSTF_TRY(matmul(f, &d, s->xb));
        NSTF_TRY(tp_reduce(f));
    }

    if (!f->r->output) { /* a stage before the last: hand over x whole */
        if (!f->pending) return NSTF_OK;
        nstf_op_args add = {.op = NSTF_OP_ADD, .label = "add", .layer = f->r->l1 - 1};
        add.add.x = s->x;
        add.add.y = f->pending;
        add.add.n = n * dim;
        f->pending = NULL;
        return run(f, &add);
    }

    /* final norm and logits: of every token, of the rows asked for, or of
     * the last one only */
    const int64_t first = f->b->all_logits ? 0 : n - 1;
    int64_t rows = n - first;
    const float *norm_x = s->x + first * dim;
    if (f->b->rows) { /* the rows asked for, gathered into y once x has its last residual */
        if (f->pending) {
            nstf_op_args add = {.op = NSTF_OP_ADD, .label = "add", .layer = -1, .block = NSTF_BLOCK_OTHER};
            add.add.x = s->x;
            add.add.y = f->pending;
            add.add.n = n * dim;
            NSTF_TRY(run(f, &add));
            f->pending = NULL;
        }
        const nstf_matrix xs = {s->x, NSTF_TYPE_F32, dim, n, NULL};
        nstf_op_args g = {.op = NSTF_OP_GET_ROWS, .label = "logits_rows", .layer = -1};
        g.get_rows.table = &xs;
        g.get_rows.ids = f->io.rows;
        g.get_rows.out = f32_rows(s->y, dim);
        g.get_rows.n = f->b->n_rows;
        NSTF_TRY(run(f, &g));
        rows = f->b->n_rows;
        norm_x = s->y;
    }
    const int64_t nv = w->output.n_out; /* n_vocab, or a tensor-parallel rank's share */
    nstf_op_args lg = mm_args("logits", -1, NSTF_BLOCK_OTHER, rows);
    group(f, &lg, &w->output, NULL, NULL, s->logits);
    lg.matmul.out[0] = f32_rows(s->logits, nv);
    lg.matmul.norm_x = norm_x;
    lg.matmul.norm_w = w->out_norm;
    lg.matmul.eps = c->norm_eps;
    lg.matmul.epi = NSTF_MM_STORE;
    NSTF_TRY(matmul(f, &lg, NULL));

    if (f->b->argmax || f->b->argmax_rows) { /* the last row's greedy token, or every selected row's */
        const int64_t from = f->b->argmax_rows ? 0 : rows - 1;
        nstf_op_args am = {.op = NSTF_OP_ARGMAX, .label = "argmax", .layer = -1};
        am.argmax.x = f32_rows(s->logits + from * nv, nv);
        am.argmax.out = s->argmax;
        am.argmax.n_rows = rows - from;
        am.argmax.n = nv;
        NSTF_TRY(run(f, &am));
    }
    return NSTF_OK;
}

/* The rows whose logits a batch asks for: 1..n of its rows. */
static nstf_status check_rows(const nstf_batch *b) {
    if (b->argmax_rows && !b->rows)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: greedy tokens of selected rows without the rows");
    if (!b->rows) return NSTF_OK;
    if (b->all_logits)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: logits of every row and of selected rows both asked for");
    if (b->n_rows < 1 || b->n_rows > b->n)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: %d logits rows of a batch of %d", b->n_rows, b->n);
    if (b->argmax_rows && (b->host_rows < 0 || b->host_rows > b->n_rows))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: %d rows' logits to the host of %d rows", b->host_rows,
                              b->n_rows);
    for (int i = 0; i < b->n_rows; i++)
        if (b->rows[i] < 0 || b->rows[i] >= b->n)
            return nstf_set_error(NSTF_ERR_RANGE, "forward: logits row %d of a batch of %d", b->rows[i], b->n);
    return NSTF_OK;
}

/* A paged run takes a block table, and every block a token writes or
 * reads (those of positions 0..pos of its sequence) is one of the pool. */
static nstf_status check_blocks(const nstf_llama_state *s, const nstf_batch *b) {
    if (!s->kv_block != !b->blocks)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, s->kv_block ? "forward: a paged KV cache needs the batch's block table"
                                                                : "forward: a block table for a contiguous KV cache");
    if (!b->blocks) return NSTF_OK;
    const int bps = s->n_ctx / s->kv_block;
    for (int t = 0; t < b->n; t++) {
        const int q = b->seq ? b->seq[t] : 0;
        for (int i = 0; i <= b->pos[t] / s->kv_block; i++) {
            const int32_t id = b->blocks[(int64_t)q * bps + i];
            if (id < 0 || id >= s->kv_blocks)
                return nstf_set_error(NSTF_ERR_RANGE, "forward: sequence %d's block %d is %d, not one of the %d blocks",
                                      q, i, id, s->kv_blocks);
        }
    }
    return NSTF_OK;
}

/* One stage's part of the forward, in its backend's bracket. */
nstf_status nstf_llama_stage_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax) {
    const nstf_llama_config *c = &r->m->cfg;
    const nstf_llama_state *s = &r->s;
    fwd f = {.r = r, .be = r->be, .c = c, .b = b, .n = b->n};
    const int64_t rows = b->rows ? b->n_rows : b->all_logits ? b->n : 1;
    const bool am = (b->argmax || b->argmax_rows) && r->output;
    const int64_t host_rows = b->argmax_rows ? b->host_rows : rows;
    const nstf_fwd_out out = {s->logits,
                              r->output ? host_rows : 0,
                              r->output ? r->w.output.n_out : c->n_vocab, /* a tensor-parallel rank's share */
                              am ? s->argmax : NULL,
                              b->argmax_rows ? rows : 1,
                              r->output && host_rows > 0 ? logits : NULL,
                              r->output ? argmax : NULL};
    for (int attempt = 0;; attempt++) {
        bool replayed = false, retry = false;
        NSTF_TRY(r->be->vt->begin(r->be, b, &f.io, &replayed));
        nstf_status st = replayed ? NSTF_OK : layers(&f);
        st = r->be->vt->end(r->be, b, st, &out, &retry);
        if (!retry || attempt > 0) return st;
    }
}

nstf_status nstf_llama_forward(nstf_llama_run *r, const nstf_batch *b, float *logits, int32_t *argmax) {
    const nstf_llama_config *c = &r->m->cfg;
    const nstf_llama_state *s = &r->s;
    if (b->n < 1 || b->n > s->n_batch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward of %d tokens (batch holds 1..%d)", b->n, s->n_batch);
    if (argmax && !b->argmax && !b->argmax_rows)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: a greedy token asked for without batch.argmax");
    if (b->argmax && b->argmax_rows)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward: the last row's greedy token and every row's both asked for");
    for (int t = 0; t < b->n; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->n_vocab)
            return nstf_set_error(NSTF_ERR_RANGE, "token id %d is outside the vocabulary (0..%d)", b->tokens[t],
                                  c->n_vocab - 1);
        if (b->pos[t] < 0 || b->pos[t] >= s->n_ctx)
            return nstf_set_error(NSTF_ERR_RANGE, "position %d exceeds the context of %d tokens", b->pos[t], s->n_ctx);
        if (b->seq && (b->seq[t] < 0 || b->seq[t] >= s->n_seq))
            return nstf_set_error(NSTF_ERR_RANGE, "sequence %d is not one of the %d slots", b->seq[t], s->n_seq);
    }
    NSTF_TRY(check_rows(b));
    NSTF_TRY(check_blocks(s, b));
    if (r->tp) return nstf_llama_tp_forward(r, b, logits, argmax);
    /* stage after stage; x [n, dim] goes from one to the next through the host */
    for (nstf_llama_run *st = r; st; st = st->next) {
        NSTF_TRY(nstf_llama_stage_forward(st, b, logits, argmax));
        if (!st->next) break;
        const uint64_t bytes = (uint64_t)b->n * (uint64_t)c->dim * sizeof(float);
        NSTF_TRY(st->be->vt->download(st->be, st->xfer, st->s.x, bytes));
        NSTF_TRY(st->next->be->vt->upload(st->next->be, st->next->s.x, st->xfer, bytes));
    }
    return NSTF_OK;
}

static nstf_status forward_run(nstf_llama_run *r, const int32_t *tokens, int n, int pos0, bool all_logits,
                               bool prompt, float *logits, int32_t *argmax) {
    if (n < 1 || n > r->s.n_batch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "forward of %d tokens (batch holds 1..%d)", n, r->s.n_batch);
    if (pos0 < 0 || pos0 + n > r->s.n_ctx)
        return nstf_set_error(NSTF_ERR_RANGE, "positions %d..%d exceed the context of %d tokens", pos0, pos0 + n - 1,
                              r->s.n_ctx);
    int32_t pbuf[256], *pos = n <= 256 ? pbuf : nstf_alloc((size_t)n * sizeof(int32_t), "positions");
    if (!pos) return NSTF_ERR_OOM;
    for (int t = 0; t < n; t++) pos[t] = pos0 + t;
    const nstf_batch b = {.tokens = tokens, .pos = pos, .n = n, .all_logits = all_logits, .argmax = argmax != NULL,
                          .row_invariant = prompt};
    nstf_status st = nstf_llama_forward(r, &b, logits, argmax);
    if (pos != pbuf) nstf_free(pos);
    return st;
}

nstf_status nstf_llama_forward_seq(nstf_llama_run *r, const int32_t *tokens, int n, int pos0, bool all_logits,
                                   float *logits, int32_t *argmax) {
    return forward_run(r, tokens, n, pos0, all_logits, false, logits, argmax);
}

nstf_status nstf_llama_forward_prompt(nstf_llama_run *r, const int32_t *tokens, int n, int pos0, float *logits,
                                      int32_t *argmax) {
    return forward_run(r, tokens, n, pos0, false, true, logits, argmax);
}
