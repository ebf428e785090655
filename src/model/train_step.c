/* train_step.c — one training step, written once against the backend
 * table (as forward.c is the forward):
 *
 *   zero the gradients
 *   for each micro-batch (n_seq sequences of seq_len tokens):
 *       forward, saving per layer what the recompute mode keeps
 *       h = rmsnorm(x_L); loss += cross_entropy(h, W_out, targets) -> dh, dW_out +=
 *       dX = rmsnorm_bwd(dh)
 *       for l = L-1 .. 0: recompute what the mode dropped; the layer's backward
 *       embedding backward: dtable += dX
 *   the update (train_update.c): the gradients summed over data-parallel
 *   ranks, norm = grad_norm (a NaN/Inf names its tensor: stop before the
 *   update), adamw(lr, grad_scale = clip(norm)), ZeRO-1's all-gather
 *
 * A layer is two sublayers whose split points are the fp32 residual
 * tensors x (input) and x_mid, so recomputing a part from a saved residual
 * reproduces the forward's bits (deterministic ops), and the gradients do
 * not depend on the mode. The residual stream's gradient dX is one buffer
 * for the whole backward: each block's output gradient is dX itself, and
 * each RMSNorm backward adds its input gradient into it (and, on a GPU,
 * leaves a bf16 copy for the matmuls that read it next). Parameter
 * gradients are added into (accumulation over micro-batches is the sum).
 *
 * LoRA: a frozen W with an adapter computes y = x W^T + (x A^T) Bt; the
 * extra product runs as the matmul-input-gradient row with accumulation
 * (y += u Bt), and its backward is two weight-gradient rows (dA, dBt), a
 * matmul (du = dy Bt^T) and an input-gradient row (dx += du A). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/train.h"

enum {
    P_ATTN = 1,   /* norm, Q/K/V (+ adapters), RoPE, attention with lse */
    P_OPROJ = 2,  /* x_mid = x + O(att) */
    P_FFN = 4,    /* norm, gate/up (+ adapters) */
    P_SWIGLU = 8, /* hs = silu(gate) * up */
    P_DOWN = 16,  /* x_next = x_mid + down(hs) */
    P_ALL = 31,
};

static uint64_t esz(nstf_type t) {
    uint64_t b = 4;
    (void)nstf_type_row_bytes(t, 1, &b);
    return b;
}

static nstf_view aview(const nstf_train *t, void *p, int64_t stride) { return (nstf_view){p, t->be->act_type, stride}; }
static nstf_view fview(float *p, int64_t stride) { return (nstf_view){p, NSTF_TYPE_F32, stride}; }

/* view v moved down by rows rows */
static nstf_status run(nstf_train *t, nstf_op_args *a) { return nstf_backend_op(t->be, a); }

static nstf_op_args op(nstf_op o, const char *label, int layer, nstf_block block) {
    nstf_op_args a = {.op = o, .label = label, .layer = layer, .block = block};
    return a;
}

/* The outputs of a group of matrices in buf: rows of the whole group when
 * one matmul computes it (t->rows and adjacent matrices), else planes. */
static void group_views(const nstf_train *t, const nstf_matrix *const *w, int n_w, void *buf, nstf_view *out,
                        nstf_matrix *span) {
    int64_t total = 0;
    for (int i = 0; i < n_w; i++) total += w[i]->n_out;
    const bool rows = t->rows && n_w > 1 && nstf_matrix_group_span(w, n_w, span);
    if (!rows) span->data = NULL;
    const uint64_t es = esz(t->be->act_type);
    int64_t off = 0;
    for (int i = 0; i < n_w; i++) {
        const uint64_t at = rows ? (uint64_t)off * es : (uint64_t)(off * t->n) * es;
        out[i] = aview(t, (char *)buf + at, rows ? total : w[i]->n_out);
        off += w[i]->n_out;
    }
}

/* ---- the pieces of a layer ------------------------------------------------------------------- */

static nstf_status rmsnorm(nstf_train *t, int l, nstf_block blk, float *x, const float *w, void *y) {
    nstf_op_args a = op(NSTF_OP_RMSNORM, "rmsnorm", l, blk);
    a.rmsnorm.x = x;
    a.rmsnorm.w = w;
    a.rmsnorm.y = aview(t, y, t->c.dim);
    a.rmsnorm.n = t->n;
    a.rmsnorm.dim = t->c.dim;
    a.rmsnorm.eps = t->c.norm_eps;
    return run(t, &a);
}

/* y (+)= x W^T for a group (out: its views; one op over the span when the
 * views are rows of it) */
static nstf_status matmul(nstf_train *t, int l, nstf_block blk, const char *label, const nstf_matrix *const *w,
                          int n_w, nstf_view x, const nstf_view *out) {
    nstf_op_args a = op(NSTF_OP_MATMUL, label, l, blk);
    a.matmul.n_w = n_w;
    for (int i = 0; i < n_w; i++) a.matmul.w[i] = w[i], a.matmul.out[i] = out[i];
    a.matmul.x = x;
    a.matmul.n = t->n;
    a.matmul.epi = NSTF_MM_STORE;
    return run(t, &a);
}

/* y = x W^T + res in one op where the backend fuses it (*fused), else y
 * = x W^T and the caller adds res after its LoRA term, as before */
static nstf_status matmul_res(nstf_train *t, int l, nstf_block blk, const char *label, const nstf_matrix *w,
                              nstf_view x, nstf_view y, float *res, bool *fused) {
    nstf_op_args a = op(NSTF_OP_MATMUL, label, l, blk);
    a.matmul.n_w = 1;
    a.matmul.w[0] = w;
    a.matmul.out[0] = y;
    a.matmul.x = x;
    a.matmul.n = t->n;
    a.matmul.epi = NSTF_MM_ADD;
    a.matmul.res = res;
    *fused = t->be->vt->can_fuse(t->be, &a);
    if (!*fused) a.matmul.epi = NSTF_MM_STORE, a.matmul.res = NULL;
    return run(t, &a);
}

/* dx (+)= dy W */
static nstf_status bwd_x(nstf_train *t, int l, nstf_block blk, const nstf_matrix *w, nstf_view dy, nstf_view dx,
                         bool acc) {
    nstf_op_args a = op(NSTF_OP_MATMUL_BWD_X, "matmul_bwd_x", l, blk);
    a.matmul_bwd_x.w = w;
    a.matmul_bwd_x.dy = dy;
    a.matmul_bwd_x.dx = dx;
    a.matmul_bwd_x.n = t->n;
    a.matmul_bwd_x.acc = acc;
    return run(t, &a);
}

/* dW [n_out, n_in] += dy^T x */
static nstf_status bwd_w(nstf_train *t, int l, nstf_block blk, nstf_view x, nstf_view dy, float *dw, int64_t n_in,
                         int64_t n_out) {
    if (!dw) return NSTF_OK; /* frozen */
    nstf_op_args a = op(NSTF_OP_MATMUL_BWD_W, "matmul_bwd_w", l, blk);
    a.matmul_bwd_w.x = x;
    a.matmul_bwd_w.dy = dy;
    a.matmul_bwd_w.dw = dw;
    a.matmul_bwd_w.n = t->n;
    a.matmul_bwd_w.n_in = n_in;
    a.matmul_bwd_w.n_out = n_out;
    return run(t, &a);
}

/* LoRA forward of adapter k: u = x A^T (saved), y += u Bt */
static nstf_status lora_fwd(nstf_train *t, int l, nstf_block blk, int k, nstf_view x, nstf_view y) {
    const train_layer *L = &t->layers[l];
    if (!L->has_lora[k]) return NSTF_OK;
    const train_lora *d = &L->lora[k];
    const int64_t r = t->sh.lora_rank;
    const nstf_view u = aview(t, t->acts[l].u[k], r);
    const nstf_matrix *a = &d->a;
    NSTF_TRY(matmul(t, l, blk, "lora_a", &a, 1, x, &u));
    return bwd_x(t, l, blk, &d->bt, u, y, true);
}

/* LoRA backward of adapter k given dy and the adapter's input x:
 * dBt += u^T dy, du = dy Bt^T, dA += du^T x, dx += du A */
static nstf_status lora_bwd(nstf_train *t, int l, nstf_block blk, int k, nstf_view x, nstf_view dy, nstf_view dx) {
    const train_layer *L = &t->layers[l];
    if (!L->has_lora[k]) return NSTF_OK;
    const train_lora *d = &L->lora[k];
    const int64_t r = t->sh.lora_rank;
    const nstf_view u = aview(t, t->acts[l].u[k], r), du = aview(t, t->du, r);
    NSTF_TRY(bwd_w(t, l, blk, dy, u, d->gbt, d->bt.n_in, r));
    const nstf_matrix *bt = &d->bt;
    NSTF_TRY(matmul(t, l, blk, "lora_du", &bt, 1, dy, &du));
    NSTF_TRY(bwd_w(t, l, blk, x, du, d->ga, d->a.n_in, r));
    return bwd_x(t, l, blk, &d->a, du, dx, true);
}

static nstf_status add(nstf_train *t, int l, nstf_block blk, float *x, const float *y) {
    nstf_op_args a = op(NSTF_OP_ADD, "residual", l, blk);
    a.add.x = x;
    a.add.y = y;
    a.add.n = t->n * t->c.dim;
    return run(t, &a);
}

static nstf_rope_args rope_args(const nstf_train *t) {
    const nstf_llama_config *c = &t->c;
    return (nstf_rope_args){t->d_pos, c->n_heads, c->n_kv_heads, c->head_dim, c->rope_base, c->rope_mode, NULL};
}

/* The parts of layer l's forward (P_*), into the layer's activations. */
static nstf_status layer_fwd(nstf_train *t, int l, unsigned parts) {
    const nstf_llama_config *c = &t->c;
    const train_layer *L = &t->layers[l];
    const train_acts *A = &t->acts[l];
    const int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, T = t->sh.seq_len;
    if (parts & P_ATTN) {
        NSTF_TRY(rmsnorm(t, l, NSTF_BLOCK_ATTN, A->x, L->w.attn_norm, A->xn1));
        const nstf_matrix *w[3] = {&L->w.wq, &L->w.wk, &L->w.wv};
        nstf_view out[3], x = aview(t, A->xn1, dim);
        nstf_matrix span;
        group_views(t, w, 3, A->qkv, out, &span);
        NSTF_TRY(matmul(t, l, NSTF_BLOCK_ATTN, "qkv_proj", w, 3, x, out));
        for (int k = LORA_Q; k <= LORA_V; k++) NSTF_TRY(lora_fwd(t, l, NSTF_BLOCK_ATTN, k, x, out[k - LORA_Q]));
        nstf_op_args rope = op(NSTF_OP_ROPE, "rope", l, NSTF_BLOCK_ATTN);
        rope.rope.q = out[0];
        rope.rope.k = out[1];
        rope.rope.n = t->n;
        rope.rope.r = rope_args(t);
        NSTF_TRY(run(t, &rope));
        { /* every sequence attends to itself: one op over the batch, no cache */
            nstf_op_args at = op(NSTF_OP_ATTENTION, "attention", l, NSTF_BLOCK_ATTN);
            at.attention.q = out[0];
            at.attention.k = out[1];
            at.attention.v = out[2];
            at.attention.k_cache = NULL;
            at.attention.v_cache = NULL;
            at.attention.out = aview(t, A->att, qd);
            at.attention.pos = t->d_pos;
            at.attention.seq = NULL;
            at.attention.n = T;
            at.attention.n_seq = t->sh.n_seq;
            at.attention.n_ctx = T;
            at.attention.pos0 = 0;
            at.attention.n_heads = c->n_heads;
            at.attention.n_kv_heads = c->n_kv_heads;
            at.attention.head_dim = c->head_dim;
            at.attention.scale = 1.0f / sqrtf((float)c->head_dim);
            at.attention.lse = A->lse;
            NSTF_TRY(run(t, &at));
        }
    }
    if (parts & P_OPROJ) {
        const nstf_view x = aview(t, A->att, qd), y = fview(A->xmid, dim);
        bool fused;
        NSTF_TRY(matmul_res(t, l, NSTF_BLOCK_ATTN, "o_proj", &L->w.wo, x, y, A->x, &fused));
        NSTF_TRY(lora_fwd(t, l, NSTF_BLOCK_ATTN, LORA_O, x, y));
        if (!fused) NSTF_TRY(add(t, l, NSTF_BLOCK_ATTN, A->xmid, A->x));
    }
    if (parts & P_FFN) {
        NSTF_TRY(rmsnorm(t, l, NSTF_BLOCK_FFN, A->xmid, L->w.ffn_norm, A->xn2));
        const nstf_matrix *w[2] = {&L->w.w_gate, &L->w.w_up};
        nstf_view out[2], x = aview(t, A->xn2, dim);
        nstf_matrix span;
        group_views(t, w, 2, A->gu, out, &span);
        NSTF_TRY(matmul(t, l, NSTF_BLOCK_FFN, "gate_up_proj", w, 2, x, out));
        NSTF_TRY(lora_fwd(t, l, NSTF_BLOCK_FFN, LORA_GATE, x, out[0]));
        NSTF_TRY(lora_fwd(t, l, NSTF_BLOCK_FFN, LORA_UP, x, out[1]));
    }
    if (parts & P_SWIGLU) {
        const nstf_matrix *w[2] = {&L->w.w_gate, &L->w.w_up};
        nstf_view out[2];
        nstf_matrix span;
        group_views(t, w, 2, A->gu, out, &span);
        nstf_op_args sw = op(NSTF_OP_SWIGLU, "swiglu", l, NSTF_BLOCK_FFN);
        sw.swiglu.gate = out[0];
        sw.swiglu.up = out[1];
        sw.swiglu.y = aview(t, A->hs, c->ffn_dim);
        sw.swiglu.n = t->n;
        sw.swiglu.n_ff = c->ffn_dim;
        NSTF_TRY(run(t, &sw));
    }
    if (parts & P_DOWN) {
        float *xn = t->acts[l + 1].x;
        const nstf_view x = aview(t, A->hs, c->ffn_dim), y = fview(xn, dim);
        bool fused;
        NSTF_TRY(matmul_res(t, l, NSTF_BLOCK_FFN, "down_proj", &L->w.w_down, x, y, A->xmid, &fused));
        NSTF_TRY(lora_fwd(t, l, NSTF_BLOCK_FFN, LORA_DOWN, x, y));
        if (!fused) NSTF_TRY(add(t, l, NSTF_BLOCK_FFN, xn, A->xmid));
    }
    return NSTF_OK;
}

/* dx (+)= the input gradient of a group; dW += of each matrix; the
 * adapters' backward. w: the group, dy: its output gradient views (the
 * forward's layout), x: the group's input, dx: fp32 [n, n_in]. */
static nstf_status group_bwd(nstf_train *t, int l, nstf_block blk, const nstf_matrix *const *w, float *const *dw,
                             const int *lora_k, int n_w, void *dy_buf, nstf_view x, float *dx) {
    nstf_view dy[3];
    nstf_matrix span;
    group_views(t, w, n_w, dy_buf, dy, &span);
    const nstf_view dxv = fview(dx, w[0]->n_in);
    bool same = true;
    for (int i = 1; i < n_w; i++) same = same && dw[i] && dw[0] && dw[i] == dw[i - 1] + w[i - 1]->n_in * w[i - 1]->n_out;
    if (span.data) { /* one matrix: rows of the whole group */
        NSTF_TRY(bwd_w(t, l, blk, x, dy[0], same ? dw[0] : NULL, span.n_in, span.n_out));
        for (int i = 0; !same && i < n_w; i++) NSTF_TRY(bwd_w(t, l, blk, x, dy[i], dw[i], w[i]->n_in, w[i]->n_out));
        NSTF_TRY(bwd_x(t, l, blk, &span, dy[0], dxv, false));
    } else {
        for (int i = 0; i < n_w; i++) {
            NSTF_TRY(bwd_w(t, l, blk, x, dy[i], dw[i], w[i]->n_in, w[i]->n_out));
            NSTF_TRY(bwd_x(t, l, blk, w[i], dy[i], dxv, i > 0));
        }
    }
    for (int i = 0; i < n_w; i++) NSTF_TRY(lora_bwd(t, l, blk, lora_k[i], x, dy[i], dxv));
    return NSTF_OK;
}

/* dx += the RMSNorm's input gradient; dw +=; dX's act copy refreshed */
static nstf_status rmsnorm_bwd(nstf_train *t, int l, nstf_block blk, const float *x, const float *w, float *dw) {
    nstf_op_args a = op(NSTF_OP_RMSNORM_BWD, "rmsnorm_bwd", l, blk);
    a.rmsnorm_bwd.x = x;
    a.rmsnorm_bwd.w = w;
    a.rmsnorm_bwd.dy = t->dxn;
    a.rmsnorm_bwd.dx = t->dX;
    a.rmsnorm_bwd.dw = dw;
    if (t->dX_act != t->dX) a.rmsnorm_bwd.dx_act = aview(t, t->dX_act, t->c.dim);
    a.rmsnorm_bwd.n = t->n;
    a.rmsnorm_bwd.dim = t->c.dim;
    a.rmsnorm_bwd.eps = t->c.norm_eps;
    return run(t, &a);
}

/* Layer l's backward: dX holds the gradient of its output x_{l+1} (and
 * dX_act its act-type copy) and receives that of its input x_l. */
static nstf_status layer_bwd(nstf_train *t, int l) {
    const nstf_llama_config *c = &t->c;
    const train_layer *L = &t->layers[l];
    const train_acts *A = &t->acts[l];
    const int64_t dim = c->dim, qd = (int64_t)c->n_heads * c->head_dim, ffn = c->ffn_dim, T = t->sh.seq_len;
    const nstf_view dXa = aview(t, t->dX_act, dim);
    /* feed-forward block: x_{l+1} = x_mid + down(silu(gate) * up) */
    {
        const nstf_view hs = aview(t, A->hs, ffn), dhs = aview(t, t->dhs, ffn);
        NSTF_TRY(bwd_w(t, l, NSTF_BLOCK_FFN, hs, dXa, L->g_down, ffn, dim));
        NSTF_TRY(bwd_x(t, l, NSTF_BLOCK_FFN, &L->w.w_down, dXa, dhs, false));
        NSTF_TRY(lora_bwd(t, l, NSTF_BLOCK_FFN, LORA_DOWN, hs, dXa, dhs));
        const nstf_matrix *w[2] = {&L->w.w_gate, &L->w.w_up};
        nstf_view gu[2], dgu[2];
        nstf_matrix span;
        group_views(t, w, 2, A->gu, gu, &span);
        group_views(t, w, 2, t->dgu, dgu, &span);
        nstf_op_args sw = op(NSTF_OP_SWIGLU_BWD, "swiglu_bwd", l, NSTF_BLOCK_FFN);
        sw.swiglu_bwd.gate = gu[0];
        sw.swiglu_bwd.up = gu[1];
        sw.swiglu_bwd.dy = dhs;
        sw.swiglu_bwd.dgate = dgu[0];
        sw.swiglu_bwd.dup = dgu[1];
        sw.swiglu_bwd.n = t->n;
        sw.swiglu_bwd.n_ff = ffn;
        NSTF_TRY(run(t, &sw));
        float *dw[2] = {L->g_gate, L->g_up};
        const int lk[2] = {LORA_GATE, LORA_UP};
        NSTF_TRY(group_bwd(t, l, NSTF_BLOCK_FFN, w, dw, lk, 2, t->dgu, aview(t, A->xn2, dim), t->dxn));
        NSTF_TRY(rmsnorm_bwd(t, l, NSTF_BLOCK_FFN, A->xmid, L->w.ffn_norm, L->g_ffn_norm));
    }
    /* attention block: x_mid = x + O(attention(rope(q), rope(k), v)) */
    {
        const nstf_view att = aview(t, A->att, qd), datt = aview(t, t->datt, qd);
        NSTF_TRY(bwd_w(t, l, NSTF_BLOCK_ATTN, att, dXa, L->g_o, qd, dim));
        NSTF_TRY(bwd_x(t, l, NSTF_BLOCK_ATTN, &L->w.wo, dXa, datt, false));
        NSTF_TRY(lora_bwd(t, l, NSTF_BLOCK_ATTN, LORA_O, att, dXa, datt));
        const nstf_matrix *w[3] = {&L->w.wq, &L->w.wk, &L->w.wv};
        nstf_view qkv[3], dqkv[3];
        nstf_matrix span;
        group_views(t, w, 3, A->qkv, qkv, &span);
        group_views(t, w, 3, t->dqkv, dqkv, &span);
        { /* every sequence attends to itself: one op over the batch */
            nstf_op_args ab = op(NSTF_OP_ATTENTION_BWD, "attention_bwd", l, NSTF_BLOCK_ATTN);
            ab.attention_bwd.q = qkv[0];
            ab.attention_bwd.k = qkv[1];
            ab.attention_bwd.v = qkv[2];
            ab.attention_bwd.out = att;
            ab.attention_bwd.dout = datt;
            ab.attention_bwd.lse = A->lse;
            ab.attention_bwd.dq = dqkv[0];
            ab.attention_bwd.dk = dqkv[1];
            ab.attention_bwd.dv = dqkv[2];
            ab.attention_bwd.n = T;
            ab.attention_bwd.n_seq = t->sh.n_seq;
            ab.attention_bwd.pos0 = 0;
            ab.attention_bwd.n_heads = c->n_heads;
            ab.attention_bwd.n_kv_heads = c->n_kv_heads;
            ab.attention_bwd.head_dim = c->head_dim;
            ab.attention_bwd.scale = 1.0f / sqrtf((float)c->head_dim);
            NSTF_TRY(run(t, &ab));
        }
        nstf_op_args rb = op(NSTF_OP_ROPE_BWD, "rope_bwd", l, NSTF_BLOCK_ATTN);
        rb.rope_bwd.q = dqkv[0];
        rb.rope_bwd.k = dqkv[1];
        rb.rope_bwd.n = t->n;
        rb.rope_bwd.r = rope_args(t);
        NSTF_TRY(run(t, &rb));
        float *dw[3] = {L->g_q, L->g_k, L->g_v};
        const int lk[3] = {LORA_Q, LORA_K, LORA_V};
        NSTF_TRY(group_bwd(t, l, NSTF_BLOCK_ATTN, w, dw, lk, 3, t->dqkv, aview(t, A->xn1, dim), t->dxn));
        NSTF_TRY(rmsnorm_bwd(t, l, NSTF_BLOCK_ATTN, A->x, L->w.attn_norm, L->g_attn_norm));
    }
    return NSTF_OK;
}

/* ---- a micro-batch --------------------------------------------------------------------------- */

/* tokens [n_seq][seq_len + 1] into the batch's ids and targets */
static nstf_status load_batch(nstf_train *t, const int32_t *tokens) {
    const int T = t->sh.seq_len;
    for (int b = 0; b < t->sh.n_seq; b++)
        for (int i = 0; i < T; i++) {
            const int32_t id = tokens[(int64_t)b * (T + 1) + i], tg = tokens[(int64_t)b * (T + 1) + i + 1];
            if (id < 0 || id >= t->c.n_vocab || tg < 0 || tg >= t->c.n_vocab)
                return nstf_set_error(NSTF_ERR_RANGE, "token %d of sequence %d is outside the vocabulary (0..%d)",
                                      id < 0 || id >= t->c.n_vocab ? id : tg, b, t->c.n_vocab - 1);
            t->h_ids[(int64_t)b * T + i] = id;
            t->h_tgt[(int64_t)b * T + i] = tg;
        }
    NSTF_TRY(t->be->vt->upload(t->be, t->d_ids, t->h_ids, (uint64_t)t->n * 4));
    return t->be->vt->upload(t->be, t->d_tgt, t->h_tgt, (uint64_t)t->n * 4);
}

/* The forward through the final norm and the loss with its gradient dh. */
static nstf_status forward_loss(nstf_train *t, double n_norm, bool with_grad, double *loss) {
    const nstf_llama_config *c = &t->c;
    nstf_op_args e = op(NSTF_OP_GET_ROWS, "embed", -1, NSTF_BLOCK_OTHER);
    e.get_rows.table = &t->tok_embd;
    e.get_rows.ids = t->d_ids;
    e.get_rows.out = fview(t->acts[0].x, c->dim);
    e.get_rows.n = t->n;
    NSTF_TRY(run(t, &e));
    for (int l = 0; l < c->n_layers; l++) NSTF_TRY(layer_fwd(t, l, P_ALL));
    NSTF_TRY(rmsnorm(t, -1, NSTF_BLOCK_OTHER, t->acts[c->n_layers].x, t->out_norm, t->xnf));
    nstf_op_args ce = op(NSTF_OP_CROSS_ENTROPY, "cross_entropy", -1, NSTF_BLOCK_OTHER);
    ce.cross_entropy.h = aview(t, t->xnf, c->dim);
    ce.cross_entropy.w = &t->ce_w;
    ce.cross_entropy.targets = t->d_tgt;
    ce.cross_entropy.ignore_index = -1;
    ce.cross_entropy.n_norm = n_norm;
    ce.cross_entropy.dh = t->dh;
    ce.cross_entropy.dw = with_grad ? t->g_output : NULL;
    ce.cross_entropy.loss = t->d_loss;
    ce.cross_entropy.n = t->n;
    NSTF_TRY(run(t, &ce));
    return t->be->vt->download(t->be, loss, t->d_loss, sizeof *loss);
}

/* The recompute mode's parts of layer l to run again before its backward. */
static unsigned recompute_parts(nstf_recompute mode) {
    switch (mode) {
    case NSTF_RECOMPUTE_NONE: return 0;
    case NSTF_RECOMPUTE_ATTN: return P_ATTN | P_SWIGLU;
    case NSTF_RECOMPUTE_FULL: return P_ATTN | P_OPROJ | P_FFN | P_SWIGLU;
    }
    return 0;
}

static nstf_status micro_batch(nstf_train *t, const int32_t *tokens, double n_norm, double *loss) {
    const nstf_llama_config *c = &t->c;
    NSTF_TRY(load_batch(t, tokens));
    NSTF_TRY(forward_loss(t, n_norm, true, loss));
    NSTF_TRY(t->be->vt->zero(t->be, t->dX, (uint64_t)t->n * c->dim * 4));
    /* the final norm: its dy is the loss's dh */
    nstf_op_args a = op(NSTF_OP_RMSNORM_BWD, "rmsnorm_bwd", -1, NSTF_BLOCK_OTHER);
    a.rmsnorm_bwd.x = t->acts[c->n_layers].x;
    a.rmsnorm_bwd.w = t->out_norm;
    a.rmsnorm_bwd.dy = t->dh;
    a.rmsnorm_bwd.dx = t->dX;
    a.rmsnorm_bwd.dw = t->g_out_norm;
    if (t->dX_act != t->dX) a.rmsnorm_bwd.dx_act = aview(t, t->dX_act, c->dim);
    a.rmsnorm_bwd.n = t->n;
    a.rmsnorm_bwd.dim = c->dim;
    a.rmsnorm_bwd.eps = c->norm_eps;
    NSTF_TRY(run(t, &a));
    const unsigned again = recompute_parts(t->sh.recompute);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        if (again) NSTF_TRY(layer_fwd(t, l, again));
        NSTF_TRY(layer_bwd(t, l));
    }
    if (!t->g_tok_embd) return NSTF_OK;
    nstf_op_args e = op(NSTF_OP_GET_ROWS_BWD, "embed_bwd", -1, NSTF_BLOCK_OTHER);
    e.get_rows_bwd.ids = t->d_ids;
    e.get_rows_bwd.dout = fview(t->dX, c->dim);
    e.get_rows_bwd.dtable = t->g_tok_embd;
    e.get_rows_bwd.n = t->n;
    e.get_rows_bwd.dim = c->dim;
    return run(t, &e);
}

nstf_status nstf_train_step(nstf_train *t, const int32_t *tokens, int n_micro, int64_t step,
                            const nstf_adamw_params *opt, double clip, double *loss, double *norm) {
    nstf_backend *be = t->be;
    if (n_micro < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "a step of %d micro-batches", n_micro);
    if (!(opt->lr >= 0) || !isfinite(opt->lr))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "learning rate %g is not a finite number >= 0", opt->lr);
    NSTF_TRY(be->vt->zero(be, t->g, (uint64_t)t->n_pad * 4));
    const double n_norm = (double)n_micro * (double)t->n * (t->dp_comm ? t->dp_n : 1); /* every rank's targets */
    const int64_t per = (int64_t)t->sh.n_seq * (t->sh.seq_len + 1);
    double sum = 0;
    for (int mb = 0; mb < n_micro; mb++) {
        double l = 0;
        NSTF_TRY(micro_batch(t, tokens + mb * per, n_norm, &l));
        sum += l;
    }
    *loss = sum; /* this rank's share of the step's mean loss */
    return nstf_train_update(t, step, opt, clip, sum, norm);
}

nstf_status nstf_train_eval(nstf_train *t, const int32_t *tokens, int n_micro, double *loss) {
    const int64_t per = (int64_t)t->sh.n_seq * (t->sh.seq_len + 1);
    const double n_norm = (double)n_micro * (double)t->n;
    double sum = 0;
    for (int mb = 0; mb < n_micro; mb++) {
        double l = 0;
        NSTF_TRY(load_batch(t, tokens + mb * per));
        NSTF_TRY(forward_loss(t, n_norm, false, &l));
        sum += l;
    }
    *loss = sum;
    return NSTF_OK;
}
