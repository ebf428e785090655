/* cost.c — the op table's cost model: FLOPs and compulsory bytes of every
 * op call from its arguments (fusions included), for profiles, rooflines
 * and traces. Activation bytes follow the views' element types, so one
 * model serves the fp32 CPU path and the bf16 GPU path. */
#include <math.h>

#include "ops/ops.h"
#include "ops/optim.h"

static double esize(nstf_type t) {
    uint64_t b;
    return nstf_type_row_bytes(t, 1, &b) ? (double)b : 4.0;
}

static double row_bytes(nstf_type type, int64_t n) {
    uint64_t b;
    return nstf_type_row_bytes(type, n, &b) ? (double)b : 4.0 * (double)n;
}

static bool is_quantized(nstf_type t) { return nstf_type_block_elems(t) > 1; }

nstf_op_cost nstf_cost_get_rows(nstf_type type, int64_t n_tok, int64_t dim) {
    /* one dequantize multiply per element; reads the rows, writes fp32 */
    nstf_op_cost c = {(double)n_tok * dim, (double)n_tok * (row_bytes(type, dim) + 4.0 * dim + 4.0), false};
    return c;
}

nstf_op_cost nstf_cost_rmsnorm(int64_t n_tok, int64_t dim) {
    /* x^2 and sum (2), scale and weight (2) per element */
    nstf_op_cost c = {4.0 * n_tok * dim, 4.0 * (2.0 * n_tok * dim + dim), false};
    return c;
}

nstf_op_cost nstf_cost_add(int64_t n) {
    nstf_op_cost c = {(double)n, 12.0 * n, false};
    return c;
}

nstf_op_cost nstf_cost_swiglu(int64_t n) {
    /* silu(g) * u: exp, add, divide, two multiplies ~ 5 */
    nstf_op_cost c = {5.0 * n, 12.0 * n, false};
    return c;
}

nstf_op_cost nstf_cost_rope(int64_t n_tok, int n_heads, int head_dim) {
    /* per rotated pair: 4 multiplies and 2 adds; in place read + write */
    double elems = (double)n_tok * n_heads * head_dim;
    nstf_op_cost c = {3.0 * elems, 8.0 * elems + 4.0 * n_tok, false};
    return c;
}

nstf_op_cost nstf_cost_matmul(nstf_type wtype, int64_t n_tok, int64_t n_in, int64_t n_out, bool int8_act) {
    nstf_op_cost c;
    c.flops = 2.0 * n_tok * n_in * n_out;
    c.bytes = (double)n_out * row_bytes(wtype, n_in) + 4.0 * n_tok * (n_in + n_out);
    c.int8 = int8_act && is_quantized(wtype);
    return c;
}

nstf_op_cost nstf_cost_attention(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim) {
    /* sum over t of (pos0 + t + 1) visible positions */
    double visible = (double)n_tok * pos0 + (double)n_tok * (n_tok + 1) / 2.0;
    nstf_op_cost c;
    c.flops = 4.0 * visible * n_heads * head_dim + 5.0 * visible * n_heads; /* + softmax */
    /* q and out, plus the K and V rows of every position read once */
    c.bytes = 8.0 * n_tok * n_heads * head_dim + 8.0 * (double)(pos0 + n_tok) * n_kv_heads * head_dim;
    c.int8 = false;
    return c;
}

nstf_op_cost nstf_cost_attn_sparse(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim, int topk,
                                   int block, int window) {
    const double kvd = (double)n_kv_heads * head_dim;
    if (n_tok != 1) { /* dense, plus the statistics of the blocks written: read their rows, write min and max */
        nstf_op_cost c = nstf_cost_attention(n_tok, pos0, n_heads, n_kv_heads, head_dim);
        const double rows = (double)n_tok + 2.0 * block;
        c.flops += 2.0 * rows * kvd;
        c.bytes += 4.0 * rows * kvd + 8.0 * (rows / block + 1.0) * kvd;
        return c;
    }
    const double keys = (double)nstf_sparse_keys(pos0, topk, block, window),
                 nb = (double)((pos0 + block) / block);
    nstf_op_cost c;
    /* bounds: 2 products, a max and an add per channel, per query head and block */
    c.flops = 4.0 * keys * n_heads * head_dim + 5.0 * keys * n_heads + 4.0 * nb * n_heads * head_dim;
    /* q and out; the selected K and V rows; min and max of every block; the
     * current block's rows for its statistics */
    c.bytes = 8.0 * n_heads * head_dim + 8.0 * keys * kvd + 8.0 * nb * kvd + 4.0 * block * kvd;
    c.int8 = false;
    return c;
}

nstf_op_cost nstf_cost_argmax(int64_t n_rows, int64_t n) {
    nstf_op_cost c = {(double)n_rows * n, 4.0 * (double)n_rows * (n + 1), false};
    return c;
}

nstf_op_cost nstf_cost_matmul_lr(nstf_type ta, nstf_type tb, int64_t n_tok, int64_t n_in, int64_t rank,
                                 int64_t n_out, bool int8_act) {
    /* the intermediate [n_tok, rank] is written once and read once */
    nstf_op_cost c = nstf_cost_matmul(ta, n_tok, n_in, rank, int8_act), d = nstf_cost_matmul(tb, n_tok, rank, n_out, int8_act);
    c.flops += d.flops;
    c.bytes += d.bytes;
    c.int8 = c.int8 || d.int8;
    return c;
}

nstf_op_cost nstf_cost_bias(int64_t n) {
    /* one add per element; x read and written, b read once per row (cached) */
    nstf_op_cost c = {(double)n, 8.0 * n, false};
    return c;
}

nstf_op_cost nstf_cost_head_norm(int64_t n_rows, int64_t head_dim) {
    /* as rmsnorm, in place */
    nstf_op_cost c = nstf_cost_rmsnorm(n_rows, head_dim);
    return c;
}

/* The backward of attention recomputes the scores (QK^T) and forms dP
 * (dO V^T), dV (P^T dO), dQ (dS K) and dK (dS^T Q): five products where
 * the forward has two, 2.5x its FLOPs; reads q, k, v, out, dout once and
 * writes dq, dk, dv. */
nstf_op_cost nstf_cost_attention_bwd(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim) {
    nstf_op_cost f = nstf_cost_attention(n_tok, pos0, n_heads, n_kv_heads, head_dim);
    nstf_op_cost c = {2.5 * f.flops, 2.0 * f.bytes + 4.0 * n_tok * n_heads * head_dim, false};
    return c;
}

/* Two passes of the logits GEMM (2 n dim V each) and the two gradient GEMMs
 * (dh and, unless frozen, dW): 8 n dim V, plus ~10 per logit for the
 * softmax; the output matrix is read twice (and its gradient written). */
nstf_op_cost nstf_cost_cross_entropy(int64_t n_tok, int64_t dim, int64_t n_vocab, bool dw) {
    const double nvd = (double)n_tok * dim * n_vocab;
    nstf_op_cost c = {(dw ? 8.0 : 6.0) * nvd + 10.0 * (double)n_tok * n_vocab,
                      4.0 * (double)n_vocab * dim * (dw ? 3.0 : 2.0) + 8.0 * (double)n_tok * dim, false};
    return c;
}

static void cost_add(nstf_op_cost *c, nstf_op_cost d) {
    c->flops += d.flops;
    c->bytes += d.bytes;
    c->int8 = c->int8 || d.int8;
}

nstf_op_cost nstf_op_cost_of(const nstf_op_args *a, bool int8_act) {
    nstf_op_cost c = {0, 0, false};
    switch (a->op) {
    case NSTF_OP_GET_ROWS: {
        const int64_t n = a->get_rows.n, dim = a->get_rows.table->n_in;
        c = nstf_cost_get_rows(a->get_rows.table->type, n, dim);
        c.bytes += (double)n * dim * (esize(a->get_rows.out.type) - 4.0);
        break;
    }
    case NSTF_OP_RMSNORM:
        c = nstf_cost_rmsnorm(a->rmsnorm.n, a->rmsnorm.dim);
        c.bytes += (double)a->rmsnorm.n * a->rmsnorm.dim * (esize(a->rmsnorm.y.type) - 4.0);
        if (a->rmsnorm.res) cost_add(&c, nstf_cost_add(a->rmsnorm.n * a->rmsnorm.dim));
        break;
    case NSTF_OP_ADD: c = nstf_cost_add(a->add.n); break;
    case NSTF_OP_MATMUL: {
        const int64_t n = a->matmul.n, n_in = a->matmul.w[0]->n_in;
        const double sx = a->matmul.norm_x ? 4.0 : esize(a->matmul.x.type);
        int64_t n_out = 0;
        for (int i = 0; i < a->matmul.n_w; i++) {
            const nstf_matrix *w = a->matmul.w[i];
            nstf_op_cost m = nstf_cost_matmul(w->type, n, w->n_in, w->n_out, int8_act);
            m.bytes -= 4.0 * n * (w->n_in + w->n_out); /* activations counted once below */
            cost_add(&c, m);
            n_out += w->n_out;
        }
        const bool resid = a->matmul.epi == NSTF_MM_ACCUM || a->matmul.epi == NSTF_MM_ADD;
        const double sy = resid ? 8.0 : esize(a->matmul.out[0].type);
        c.bytes += (double)n * ((double)n_in * sx + (double)n_out * sy);
        if (a->matmul.norm_x) c.flops += 4.0 * (double)n * n_in;
        if (resid) c.flops += (double)n * n_out;
        if (a->matmul.epi == NSTF_MM_ROPE)
            c.flops += nstf_cost_rope(n, a->matmul.rope.n_heads + a->matmul.rope.n_kv_heads, a->matmul.rope.head_dim).flops;
        if (a->matmul.epi == NSTF_MM_SWIGLU) c.flops += nstf_cost_swiglu(n * (n_out / 2)).flops;
        for (int i = 0; i < a->matmul.n_w; i++)
            if (a->matmul.bias[i]) {
                c.flops += (double)n * a->matmul.w[i]->n_out;
                c.bytes += 4.0 * a->matmul.w[i]->n_out;
            }
        if (a->matmul.q_norm) {
            const nstf_rope_args *r = &a->matmul.rope;
            c.flops += nstf_cost_head_norm(n * (r->n_heads + r->n_kv_heads), r->head_dim).flops;
            c.bytes += 8.0 * r->head_dim;
        }
        break;
    }
    case NSTF_OP_ROPE: {
        const nstf_rope_args *r = &a->rope.r;
        c = nstf_cost_rope(a->rope.n, r->n_heads + r->n_kv_heads, r->head_dim);
        c.bytes += (double)a->rope.n * (r->n_heads + r->n_kv_heads) * r->head_dim * 2.0 * (esize(a->rope.q.type) - 4.0);
        break;
    }
    case NSTF_OP_ATTENTION: {
        const int64_t n = a->attention.n, pos0 = a->attention.pos0 > 0 ? a->attention.pos0 : 0;
        const int nh = a->attention.n_heads, nkv = a->attention.n_kv_heads, hd = a->attention.head_dim;
        c = nstf_cost_attention(n, pos0, nh, nkv, hd);
        const double sq = esize(a->attention.q.type);
        /* a cached value: as k is given, or a Q8_0 code with its share of a scale */
        const double skv = a->attention.kv_q8 ? 34.0 / 32.0 : esize(a->attention.k.type);
        double keys = (double)(pos0 + n); /* cache positions read */
        if (a->attention.window > 0) {      /* each token sees at most `window` keys */
            const double w = a->attention.window;
            double visible = 0;
            for (int64_t t = 0; t < n; t++) visible += fmin((double)(pos0 + t + 1), w);
            c.flops = 4.0 * visible * nh * hd + 5.0 * visible * nh;
            keys = fmin(keys, w + (double)n - 1);
        }
        c.bytes = 2.0 * sq * n * nh * hd + 2.0 * skv * keys * nkv * hd;
        if (a->attention.n_seq > 1) { /* the training forward over a batch of sequences */
            c.flops *= (double)a->attention.n_seq;
            c.bytes *= (double)a->attention.n_seq;
        }
        break;
    }
    case NSTF_OP_SWIGLU:
        c = nstf_cost_swiglu(a->swiglu.n * a->swiglu.n_ff);
        c.bytes = 3.0 * esize(a->swiglu.y.type) * (double)a->swiglu.n * a->swiglu.n_ff;
        break;
    case NSTF_OP_ARGMAX:
        c = nstf_cost_argmax(a->argmax.n_rows, a->argmax.n);
        c.bytes = (double)a->argmax.n_rows * (esize(a->argmax.x.type) * a->argmax.n + 4.0);
        break;
    case NSTF_OP_BIAS:
        c = nstf_cost_bias(a->bias.n * a->bias.width);
        c.bytes = 2.0 * esize(a->bias.x.type) * (double)a->bias.n * a->bias.width + 4.0 * a->bias.width;
        break;
    case NSTF_OP_HEAD_NORM: {
        const int64_t rows = a->head_norm.n * (a->head_norm.n_heads + a->head_norm.n_kv_heads);
        c = nstf_cost_head_norm(rows, a->head_norm.head_dim);
        c.bytes = 2.0 * esize(a->head_norm.q.type) * (double)rows * a->head_norm.head_dim + 8.0 * a->head_norm.head_dim;
        break;
    }
    case NSTF_OP_GET_ROWS_BWD:
        c.flops = (double)a->get_rows_bwd.n * a->get_rows_bwd.dim;
        c.bytes = 12.0 * (double)a->get_rows_bwd.n * a->get_rows_bwd.dim;
        break;
    case NSTF_OP_RMSNORM_BWD: {
        const double e = (double)a->rmsnorm_bwd.n * a->rmsnorm_bwd.dim;
        c.flops = (a->rmsnorm_bwd.dw ? 10.0 : 7.0) * e;
        c.bytes = 4.0 * 4.0 * e + (a->rmsnorm_bwd.dx_act.data ? esize(a->rmsnorm_bwd.dx_act.type) * e : 0.0);
        break;
    }
    case NSTF_OP_ROPE_BWD: {
        const nstf_rope_args *r = &a->rope_bwd.r;
        c = nstf_cost_rope(a->rope_bwd.n, r->n_heads + r->n_kv_heads, r->head_dim);
        c.bytes += (double)a->rope_bwd.n * (r->n_heads + r->n_kv_heads) * r->head_dim * 2.0 *
                   (esize(a->rope_bwd.q.type) - 4.0);
        break;
    }
    case NSTF_OP_ATTENTION_BWD: {
        const int nh = a->attention_bwd.n_heads, nkv = a->attention_bwd.n_kv_heads, hd = a->attention_bwd.head_dim;
        const int64_t n = a->attention_bwd.n, pos0 = a->attention_bwd.pos0;
        const double seqs = a->attention_bwd.n_seq > 1 ? (double)a->attention_bwd.n_seq : 1.0;
        c = nstf_cost_attention_bwd(n, pos0, nh, nkv, hd);
        const double s = esize(a->attention_bwd.q.type);
        c.bytes = s * (5.0 * n * nh * hd + 4.0 * (double)(pos0 + n) * nkv * hd) + 4.0 * n * nh;
        c.flops *= seqs;
        c.bytes *= seqs;
        break;
    }
    case NSTF_OP_SWIGLU_BWD: {
        const double e = (double)a->swiglu_bwd.n * a->swiglu_bwd.n_ff;
        c.flops = 12.0 * e;
        c.bytes = 5.0 * esize(a->swiglu_bwd.dy.type) * e;
        break;
    }
    case NSTF_OP_MATMUL_BWD_X: {
        const nstf_matrix *w = a->matmul_bwd_x.w;
        const int64_t n = a->matmul_bwd_x.n;
        c.flops = 2.0 * n * w->n_in * w->n_out;
        c.bytes = (double)w->n_out * row_bytes(w->type, w->n_in) + (double)n * w->n_out * esize(a->matmul_bwd_x.dy.type) +
                  (double)n * w->n_in * esize(a->matmul_bwd_x.dx.type) * (a->matmul_bwd_x.acc ? 2.0 : 1.0);
        break;
    }
    case NSTF_OP_MATMUL_BWD_W: {
        const int64_t n = a->matmul_bwd_w.n, ni = a->matmul_bwd_w.n_in, no = a->matmul_bwd_w.n_out;
        c.flops = 2.0 * n * ni * no;
        c.bytes = (double)n * (ni * esize(a->matmul_bwd_w.x.type) + no * esize(a->matmul_bwd_w.dy.type)) + 8.0 * ni * no;
        break;
    }
    case NSTF_OP_CROSS_ENTROPY:
        c = nstf_cost_cross_entropy(a->cross_entropy.n, a->cross_entropy.w->n_in, a->cross_entropy.w->n_out,
                                    a->cross_entropy.dw != NULL);
        break;
    case NSTF_OP_ADAMW:
    case NSTF_OP_GRAD_NORM: {
        const struct nstf_param_tensor *t = a->op == NSTF_OP_ADAMW ? a->adamw.tensors : a->grad_norm.tensors;
        const int nt = a->op == NSTF_OP_ADAMW ? a->adamw.n_tensors : a->grad_norm.n_tensors;
        double p = 0;
        for (int i = 0; i < nt; i++) p += (double)t[i].n;
        if (a->op == NSTF_OP_ADAMW) {
            /* reads w, g, m, v; writes w, m, v (and the compute copy) */
            c.flops = 16.0 * p;
            c.bytes = 28.0 * p + (a->adamw.w_copy.data ? esize(a->adamw.w_copy.type) * p : 0.0);
        } else {
            c.flops = 2.0 * p;
            c.bytes = 4.0 * p;
        }
        break;
    }
    case NSTF_OP_MATMUL_LR: {
        const nstf_matrix *fa = a->matmul_lr.a, *fb = a->matmul_lr.b;
        const int64_t n = a->matmul_lr.n;
        c = nstf_cost_matmul_lr(fa->type, fb->type, n, fa->n_in, fa->n_out, fb->n_out, int8_act);
        /* activations at the views' element sizes, not fp32 */
        const double sx = esize(a->matmul_lr.x.type) - 4.0, st = esize(a->matmul_lr.tmp.type) - 4.0,
                     sy = esize(a->matmul_lr.out.type) - 4.0;
        c.bytes += (double)n * ((double)fa->n_in * sx + 2.0 * (double)fa->n_out * st + (double)fb->n_out * sy);
        break;
    }
    case NSTF_OP_ATTN_SPARSE: {
        const int64_t n = a->attn_sparse.n, pos0 = a->attn_sparse.pos0 > 0 ? a->attn_sparse.pos0 : 0;
        const int nh = a->attn_sparse.n_heads, hd = a->attn_sparse.head_dim;
        c = nstf_cost_attn_sparse(n, pos0, nh, a->attn_sparse.n_kv_heads, hd, a->attn_sparse.topk,
                                  a->attn_sparse.block, a->attn_sparse.window);
        /* q and out at the views' element size, not fp32 */
        c.bytes += 2.0 * (double)n * nh * hd * (esize(a->attn_sparse.q.type) - 4.0);
        break;
    }
    case NSTF_OP_N: break;
    }
    return c;
}
