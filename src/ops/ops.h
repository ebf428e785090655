/* ops.h — the op list: every op of the Llama forward, its CPU reference,
 * its fast CPU path, and (later) its GPU entry, generated from one X-macro
 * table so that names, dispatch and "supported" cannot drift apart.
 *
 * Layout conventions (row-major, innermost last):
 *   activations x      [n_tok, dim]                  fp32
 *   weights W          [n_out, n_in] (one row per output), any nstf_type
 *   q                  [n_tok, n_heads, head_dim]
 *   KV cache k, v      [n_ctx, n_kv_heads, head_dim] (one layer)
 *
 * Reference ops (nstf_ref_*) are plain scalar loops, the oracle for every
 * faster path. Fast ops (nstf_cpu_*) take an nstf_cpu context (thread pool
 * and a scratch arena reserved once per shape, so no op allocates per
 * token). */
#ifndef NSTF_OPS_H
#define NSTF_OPS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/status.h"
#include "core/threadpool.h"

/* ---- the op table ----------------------------------------------------------
 * One row per op of the forward. Everything else about an op is generated
 * from or checked against this row (test_op_table walks it):
 *   UPPER, lower   enum NSTF_OP_UPPER, name "lower", args member a.lower
 *   ref            the scalar reference (nstf_ref_*, src/ops/cpu/ref.c)
 *   cpu            the fast CPU entry (nstf_cpu_*, src/ops/cpu/)
 *   gpu            the GPU launcher (nstf_gpu_*, src/ops/gpu/gpu_api.h)
 *   description    what it computes
 * The backend table (src/backend/backend.h) has one entry per row, the
 * cost model (nstf_op_cost_of, ops/cost.c) one case per row, and the
 * op-comparison test (tests/test_backend_ops.c) one case generator per
 * row; a row without any of them fails the build or test_op_table. */
#define NSTF_OPS(X)                                                                                 \
    X(GET_ROWS, get_rows, nstf_ref_get_rows, nstf_cpu_get_rows, nstf_gpu_get_rows,                 \
      "embedding gather: out[t,:] = dequant(table[ids[t],:])")                                      \
    X(RMSNORM, rmsnorm, nstf_ref_rmsnorm, nstf_cpu_rmsnorm, nstf_gpu_rmsnorm,                      \
      "x += res (optional); y = x * rsqrt(mean(x^2) + eps) * w")                                     \
    X(ADD, add, nstf_ref_add, nstf_cpu_add, nstf_gpu_add, "x += y (residual)")                       \
    X(MATMUL, matmul, nstf_ref_matmul, nstf_cpu_matmul, nstf_gpu_gemv,                             \
      "y[t,o] = sum_i W[o,i] x[t,i] over a group of matrices; fusion flags: norm prologue, "       \
      "RoPE / SwiGLU / residual epilogue")                                                          \
    X(ROPE, rope, nstf_ref_rope_ff, nstf_cpu_rope_ff, nstf_gpu_rope_strided,                       \
      "rotary position embedding of q and k, in place (frequency factors optional)")                \
    X(ATTENTION, attention, nstf_ref_attention_sw, nstf_cpu_attention_sw, nstf_gpu_flash_attn_sw,  \
      "causal grouped-query attention over the KV cache (the batch's K and V written into it; "    \
      "sliding window optional)")                                                                   \
    X(SWIGLU, swiglu, nstf_ref_swiglu, nstf_cpu_swiglu, nstf_gpu_swiglu, "y = silu(gate) * up")    \
    X(ARGMAX, argmax, nstf_ref_argmax, nstf_cpu_argmax, nstf_gpu_argmax,                           \
      "index of the largest value per row (first on ties)")                                         \
    X(BIAS, bias, nstf_ref_bias, nstf_cpu_bias, nstf_gpu_bias, "x[t,:] += b (a projection's bias)") \
    X(HEAD_NORM, head_norm, nstf_ref_head_norm, nstf_cpu_head_norm, nstf_gpu_head_norm,            \
      "per-head RMSNorm of q and k, in place: x[t,h,:] = x * rsqrt(mean(x^2) + eps) * w")          \
    X(MATMUL_LR, matmul_lr, nstf_ref_matmul_lr, nstf_cpu_matmul_lr, nstf_gpu_matmul_lr,            \
      "y = (x A^T) B^T: a matrix stored as low-rank factors A [r, n_in], B [n_out, r]")            \
    X(ATTN_SPARSE, attn_sparse, nstf_ref_attn_sparse, nstf_cpu_attn_sparse, nstf_gpu_attn_sparse,  \
      "block-sparse decode attention over the KV cache (Quest): per-block key min/max kept as "    \
      "the cache is written, each one-token step attends to block 0, the recent window and the "   \
      "top-k blocks by upper bound; runs of several tokens attend densely")                        \
    /* training: the backward of every op, the fused loss, the optimizer (ops/backward.h,        \
     * ops/optim.h; parameter gradients are added into, activation gradients written) */         \
    X(GET_ROWS_BWD, get_rows_bwd, nstf_ref_get_rows_bwd, nstf_cpu_get_rows_bwd, nstf_gpu_get_rows_bwd, \
      "embedding backward: dtable[ids[t],:] += dout[t,:] (repeated ids summed in token order)")     \
    X(RMSNORM_BWD, rmsnorm_bwd, nstf_ref_rmsnorm_bwd, nstf_cpu_rmsnorm_bwd, nstf_gpu_rmsnorm_bwd,  \
      "RMSNorm backward: dx += (into the residual stream's gradient), dw +=")                       \
    X(ROPE_BWD, rope_bwd, nstf_ref_rope_bwd, nstf_cpu_rope_bwd, nstf_gpu_rope_bwd,                 \
      "RoPE backward: the gradients of q and k rotated by -theta, in place")                        \
    X(ATTENTION_BWD, attention_bwd, nstf_ref_attention_bwd, nstf_cpu_attention_bwd,               \
      nstf_gpu_flash_attn_bwd_batch, "causal GQA attention backward from the saved log-sum-exp: dq, dk, dv") \
    X(SWIGLU_BWD, swiglu_bwd, nstf_ref_swiglu_bwd, nstf_cpu_swiglu_bwd, nstf_gpu_swiglu_bwd,       \
      "SwiGLU backward: dgate, dup from dy")                                                        \
    X(MATMUL_BWD_X, matmul_bwd_x, nstf_ref_matmul_bwd_x, nstf_cpu_matmul_bwd_x, nstf_gpu_matmul_bwd_x, \
      "matmul input gradient: dx (+)= dy W")                                                        \
    X(MATMUL_BWD_W, matmul_bwd_w, nstf_ref_matmul_bwd_w, nstf_cpu_matmul_bwd_w, nstf_gpu_matmul_bwd_w, \
      "matmul weight gradient: dW += dy^T x")                                                       \
    X(CROSS_ENTROPY, cross_entropy, nstf_ref_cross_entropy, nstf_cpu_cross_entropy,               \
      nstf_gpu_cross_entropy, "loss of the logits h W^T fused with them, chunked over the vocabulary: loss, dh, dW +=") \
    X(ADAMW, adamw, nstf_ref_adamw, nstf_cpu_adamw, nstf_gpu_adamw,                                \
      "AdamW step over the flat fp32 parameters (and their compute copy)")                          \
    X(GRAD_NORM, grad_norm, nstf_ref_grad_norm, nstf_cpu_grad_norm, nstf_gpu_grad_norm,            \
      "sum of squares of each parameter tensor's gradient; a NaN/Inf names its tensor")
#define NSTF_OP_COUNT 22

typedef enum nstf_op {
#define NSTF_X(U, l, ref, cpu, gpu, d) NSTF_OP_##U,
    NSTF_OPS(NSTF_X)
#undef NSTF_X
        NSTF_OP_N
} nstf_op;
_Static_assert(NSTF_OP_N == NSTF_OP_COUNT, "op table and NSTF_OP_COUNT disagree");

const char *nstf_op_name(nstf_op op);
const char *nstf_op_desc(nstf_op op);
/* The names of a row's reference, CPU entry and GPU launcher (for
 * test_op_table and `nstf devices --verbose`). */
const char *nstf_op_ref_name(nstf_op op);
const char *nstf_op_cpu_name(nstf_op op);
const char *nstf_op_gpu_name(nstf_op op);

typedef enum nstf_rope_mode {
    NSTF_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF "llama" */
    NSTF_ROPE_NEOX = 2, /* rotate (x[i], x[i + d/2]): HF layout, GGUF neox-style archs */
} nstf_rope_mode;

/* ---- op arguments --------------------------------------------------------------
 * Every op of the table takes one nstf_op_args: the op, a label and layer
 * for profiles, and the op's own member of the union (named like the op).
 * Pointers are in the memory of the backend that runs the op. */

/* A weight matrix [n_out, n_in] in its stored type (one row per output).
 * factors: NULL, or the matrix's low-rank form W ~ B A (opt/lowrank.h):
 * factors[0] = A [rank, n_in], factors[1] = B [n_out, rank]; data is then
 * NULL and the forward runs the MATMUL_LR op for it. */
typedef struct nstf_matrix {
    const void *data;
    nstf_type type;
    int64_t n_in, n_out;
    const struct nstf_matrix *factors;
} nstf_matrix;

/* Rows of activations: row t starts at data + t * stride elements of
 * `type` (F32; BF16 for a GPU's activations). */
typedef struct nstf_view {
    void *data;
    nstf_type type;
    int64_t stride;
} nstf_view;

/* Where an op's work belongs, for profiles that split time by block. */
typedef enum nstf_block {
    NSTF_BLOCK_OTHER = 0, /* embedding, logits, argmax */
    NSTF_BLOCK_ATTN,      /* norm, Q/K/V/O projections, RoPE, attention */
    NSTF_BLOCK_FFN,       /* norm, gate/up/down projections, SwiGLU */
} nstf_block;

enum { NSTF_MM_MAX_GROUP = 3 };

/* Epilogue of a matmul (a fusion flag: a backend runs it inside the
 * matmul only where it said it can; the forward otherwise runs the ops). */
typedef enum nstf_mm_epi {
    NSTF_MM_STORE = 0, /* out[i] = x W_i^T */
    NSTF_MM_ACCUM,     /* one matrix: res += x W^T (res: the fp32 residual stream) */
    NSTF_MM_ROPE,      /* q | k | v group: out views, then RoPE on q and k */
    NSTF_MM_SWIGLU,    /* gate | up group: act = silu(x Wg^T) * (x Wu^T) */
    NSTF_MM_ADD,       /* one matrix: out[0] = x W^T + res (res read only; out[0] fp32): the
                        * next residual stream kept apart from the last, as training saves both */
} nstf_mm_epi;

typedef struct nstf_rope_args {
    const int32_t *pos; /* [n] positions */
    int n_heads, n_kv_heads, head_dim;
    float base;
    nstf_rope_mode mode;
    /* [head_dim/2] or NULL: theta_i = pos * base^(-2i/head_dim) / freq_factors[i]
     * (Llama 3.x rope_freqs.weight, linear scaling: every factor the same) */
    const float *freq_factors;
} nstf_rope_args;

typedef struct nstf_op_args {
    nstf_op op;
    const char *label; /* call site ("qkv_proj"): a string literal */
    int layer;         /* -1 outside the layers */
    nstf_block block;
    union {
        struct {
            const nstf_matrix *table; /* [n_rows, dim] */
            const int32_t *ids;       /* [n] */
            nstf_view out;            /* [n, dim] */
            int64_t n;
        } get_rows;
        struct {
            float *x;        /* [n, dim] fp32, stride dim */
            const float *res; /* [n, dim] fp32 added into x first, or NULL */
            const float *w;  /* [dim] */
            nstf_view y;     /* [n, dim] */
            int64_t n, dim;
            float eps;
        } rmsnorm;
        struct {
            float *x;       /* [n] += y */
            const float *y; /* [n] */
            int64_t n;
        } add;
        struct {
            const nstf_matrix *w[NSTF_MM_MAX_GROUP]; /* n_w matrices of one n_in */
            int n_w;
            nstf_view x;                    /* [n, n_in] (unused with the norm prologue) */
            nstf_view out[NSTF_MM_MAX_GROUP]; /* [n, w[i]->n_out] each */
            int64_t n;
            /* fusion flags */
            nstf_mm_epi epi;
            const float *norm_x; /* non-NULL: x = rmsnorm(norm_x [n, n_in] fp32) * norm_w */
            const float *norm_w;
            float eps;
            nstf_rope_args rope; /* ROPE */
            nstf_view act;       /* SWIGLU output [n, n_ff] */
            float *res;          /* ACCUM, ADD: the residual stream [n, n_out] fp32 */
            /* out[i][t, :] += bias[i] (fp32 [w[i]->n_out]) before the epilogue,
             * where non-NULL (Qwen2's QKV bias): the BIAS op unfused */
            const float *bias[NSTF_MM_MAX_GROUP];
            /* ROPE: per-head RMSNorm of q and k (weights [head_dim], eps
             * above) after the bias, before the rotation (Qwen3): the
             * HEAD_NORM op unfused */
            const float *q_norm, *k_norm;
        } matmul;
        struct {
            nstf_view q, k; /* [n, n_heads, head_dim], [n, n_kv_heads, head_dim] */
            int64_t n;
            nstf_rope_args r;
        } rope;
        struct {
            nstf_view q, k, v;      /* this batch: [n, heads, head_dim] rows (k, v RoPE'd / raw) */
            void *k_cache, *v_cache; /* one layer: [n_seq, n_ctx, n_kv_heads * head_dim], or with
                                       blocks [n_blocks, block_size, n_kv_heads * head_dim] */
            nstf_view out;          /* [n, n_heads * head_dim] */
            const int32_t *pos;     /* [n] */
            const int32_t *seq;     /* [n] sequence slots, or NULL: all 0 */
            int64_t n, n_ctx;       /* n_ctx: positions per sequence */
            int64_t pos0;           /* host: the first position when the batch is one run of one
                                       sequence at consecutive positions, else -1 */
            int n_heads, n_kv_heads, head_dim;
            float scale;
            int window;             /* > 0: a token at position p sees keys at positions
                                       > p - window only (sliding window); 0: all */
            /* Paged KV cache: NULL = the contiguous layout above. Otherwise
             * position p of sequence s is row p % block_size of cache block
             * blocks[s * (n_ctx / block_size) + p / block_size] (n_ctx is a
             * multiple of block_size; every block a token reads is assigned). */
            const int32_t *blocks;  /* [n_seq, n_ctx / block_size] block ids */
            int block_size;         /* positions per block */
            float *lse;             /* [n, n_heads] fp32 or NULL: each row's log-sum-exp of the
                                       scaled scores (the training forward saves it) */
            /* The training forward (lse set, pos0 0, no seq or blocks) may
             * pass k_cache = v_cache = NULL: nothing is written to a cache,
             * each sequence attends to its own k, v rows. It may then run
             * n_seq S > 1 independent sequences of n rows each, one after
             * another in q, k, v, out and lse (0 or 1: one sequence). */
            int64_t n_seq;
            /* The cache's type: false = the backend's kv_type (fp32 on the
             * CPU, bf16 on a GPU); true = Q8_0 rows of nstf_kv_row_bytes
             * (contiguous caches only; not with lse): this batch's k, v are
             * written quantized, and earlier positions are read back as
             * d * code. The batch's own keys and values are used as given. */
            bool kv_q8;
        } attention;
        /* The attention op's contract (the batch's k, v written into a
         * contiguous cache, causal, GQA) for a layer that tracks its cache
         * in blocks of `block` positions (see the sparse-attention section
         * below for what is kept and how a step selects). */
        struct {
            nstf_view q, k, v;      /* this batch: as attention's */
            void *k_cache, *v_cache; /* one layer: [n_seq, n_ctx, n_kv_heads * head_dim] */
            nstf_view out;          /* [n, n_heads * head_dim] */
            const int32_t *pos;     /* [n] */
            const int32_t *seq;     /* [n] sequence slots, or NULL: all 0 */
            int64_t n, n_ctx;
            int64_t pos0;           /* host: as attention's (the cost model reads it) */
            int n_heads, n_kv_heads, head_dim;
            float scale;
            int block;              /* positions per tracked block (NSTF_SPARSE_BLOCK_MIN..MAX) */
            int topk;               /* blocks chosen by the bound besides block 0 and the window */
            int window;             /* recent positions always attended (their whole blocks) */
            bool kv_q8;             /* a Q8_0 cache (as attention's): refused, not supported */
            float *kmin, *kmax;     /* [n_seq, n_blocks, n_kv_heads, head_dim] fp32: per-channel
                                       min / max of the keys of each block (n_blocks =
                                       ceil(n_ctx / block)) */
            float *mass;            /* [n_seq, n_blocks, n_kv_heads] fp32 EMA of the attention
                                       mass each block received, or NULL: not tracked */
            float mass_decay;       /* EMA factor: mass = decay * mass + (1 - decay) * p */
            int32_t *sel;           /* [n, n_kv_heads, nstf_sparse_max_sel()] the blocks each
                                       one-token step attended, ascending, -1 after them */
            float *work;            /* nstf_sparse_work_floats(1, ...) fp32 of scratch (the runs of
                                       a batch use it in turn) */
        } attn_sparse;
        struct {
            nstf_view gate, up, y; /* [n, n_ff] each */
            int64_t n, n_ff;
        } swiglu;
        struct {
            nstf_view x;  /* [n_rows, n] */
            int32_t *out; /* [n_rows] */
            int64_t n_rows, n;
        } argmax;
        struct {
            const nstf_matrix *a, *b; /* A [rank, n_in], B [n_out, rank] */
            nstf_view x;              /* [n, n_in] */
            nstf_view tmp;            /* [n, rank] scratch: x A^T (dense rows) */
            nstf_view out;            /* [n, n_out] */
            int64_t n;
        } matmul_lr;
        struct {
            nstf_view x;     /* [n, width], in place */
            const float *b;  /* [width] fp32 */
            int64_t n, width;
        } bias;
        struct {
            nstf_view q, k;        /* [n, n_heads, head_dim], [n, n_kv_heads, head_dim], in place */
            const float *wq, *wk;  /* [head_dim] each (wk unused when n_kv_heads is 0) */
            int64_t n;
            int n_heads, n_kv_heads, head_dim;
            float eps;
        } head_norm;
        /* ---- training (row layouts as the forward's; gradients of
         * parameters fp32 and added into) ---- */
        struct {
            const int32_t *ids; /* [n] */
            nstf_view dout;     /* [n, dim] F32 */
            float *dtable;      /* [n_rows, dim] += */
            int64_t n, dim;
        } get_rows_bwd;
        struct {
            const float *x;   /* [n, dim] the norm's input (the residual stream) */
            const float *w;   /* [dim] */
            const float *dy;  /* [n, dim] F32 */
            float *dx;        /* [n, dim] += (the residual stream's gradient) */
            float *dw;        /* [dim] +=, or NULL: a frozen norm */
            nstf_view dx_act; /* data non-NULL: dx after the add, also in this view
                                 (the activation type the next matmuls read) */
            int64_t n, dim;
            float eps;
        } rmsnorm_bwd;
        struct {
            nstf_view q, k; /* gradients [n, n_heads, head_dim], [n, n_kv_heads, head_dim], in place */
            int64_t n;
            nstf_rope_args r;
        } rope_bwd;
        struct {
            nstf_view q, k, v;  /* q [n, heads, hd]; k, v [pos0 + n, kv_heads, hd] (as the forward saw them) */
            nstf_view out, dout; /* [n, heads * hd] */
            const float *lse;   /* [n, n_heads] from the forward */
            nstf_view dq, dk, dv; /* written; dk, dv cover the pos0 + n key rows */
            int64_t n, pos0;
            int64_t n_seq;      /* 0 or 1: one sequence; S > 1: S independent sequences of n
                                   rows each, one after another in every view and in lse
                                   (pos0 must be 0: each attends to its own n keys) */
            int n_heads, n_kv_heads, head_dim;
            float scale;
        } attention_bwd;
        struct {
            nstf_view gate, up, dy; /* [n, n_ff] each */
            nstf_view dgate, dup;   /* [n, n_ff] written (may alias gate, up) */
            int64_t n, n_ff;
        } swiglu_bwd;
        struct {
            const nstf_matrix *w; /* [n_out, n_in], any stored type (a frozen base: dequantized) */
            nstf_view dy;         /* [n, n_out] */
            nstf_view dx;         /* [n, n_in] */
            int64_t n;
            bool acc;             /* dx += dy W, else dx = dy W */
        } matmul_bwd_x;
        struct {
            nstf_view x;  /* [n, n_in] */
            nstf_view dy; /* [n, n_out] */
            float *dw;    /* [n_out, n_in] += */
            int64_t n, n_in, n_out;
        } matmul_bwd_w;
        struct {
            nstf_view h;              /* [n, dim] the normed final rows */
            const nstf_matrix *w;     /* [n_vocab, dim] the output matrix (CPU: F32; GPU: BF16) */
            const int32_t *targets;   /* [n] */
            int32_t ignore_index;
            double n_norm;            /* the step's count of targets (<= 0: this call's) */
            float *lse;               /* [n] or NULL */
            float *dh;                /* [n, dim] written */
            float *dw;                /* [n_vocab, dim] +=, or NULL: a frozen matrix */
            double *loss;             /* [1] written (backend memory) */
            int64_t n;
        } cross_entropy;
        struct {
            const struct nstf_adamw_params *p;       /* host */
            const struct nstf_param_tensor *tensors; /* host: [n_tensors] */
            int n_tensors;
            int64_t step; /* from 1 */
            float grad_scale;
            float *w, *m, *v;  /* flat fp32 */
            const float *grad;
            nstf_view w_copy;  /* data non-NULL: the weights again in this type (the GPU's bf16 compute copy) */
        } adamw;
        struct {
            const struct nstf_param_tensor *tensors; /* host: [n_tensors] */
            int n_tensors;
            const float *grad;
            double *sq;   /* host [n_tensors]: each tensor's sum of squares */
            double *norm; /* host: the global norm */
        } grad_norm;
    };
} nstf_op_args;

/* FLOPs and bytes of one op call. Bytes are the op's compulsory traffic:
 * every input read once and every output written once (weights at their
 * stored size), which is what a roofline places an op by. int8 says the
 * op's arithmetic runs as int8 dot products (quantized matmul in the
 * default CPU mode), so its compute ceiling is the int8 one. */
typedef struct nstf_op_cost {
    double flops;
    double bytes;
    bool int8;
} nstf_op_cost;

/* The cost model of the op table (ops/cost.c): one case per row, fusions
 * included. int8_act: the backend runs quantized matmuls on 8-bit
 * activations. */
nstf_op_cost nstf_op_cost_of(const nstf_op_args *a, bool int8_act);

nstf_op_cost nstf_cost_get_rows(nstf_type type, int64_t n_tok, int64_t dim);
nstf_op_cost nstf_cost_rmsnorm(int64_t n_tok, int64_t dim);
nstf_op_cost nstf_cost_add(int64_t n);
nstf_op_cost nstf_cost_swiglu(int64_t n);
nstf_op_cost nstf_cost_rope(int64_t n_tok, int n_heads, int head_dim);
/* y[n_tok, n_out] = x[n_tok, n_in] W^T; int8_act: activations quantized
 * to 8-bit blocks (the default CPU path for quantized W). */
nstf_op_cost nstf_cost_matmul(nstf_type wtype, int64_t n_tok, int64_t n_in, int64_t n_out, bool int8_act);
/* Causal attention of n_tok queries at pos0.. over the cache (each token
 * sees pos0 + t + 1 positions): QK^T and PV are 2 FLOPs per MAC each. */
nstf_op_cost nstf_cost_attention(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim);
nstf_op_cost nstf_cost_argmax(int64_t n_rows, int64_t n);
nstf_op_cost nstf_cost_bias(int64_t n);
nstf_op_cost nstf_cost_head_norm(int64_t n_rows, int64_t head_dim);
/* ATTN_SPARSE: n_tok == 1: the bounds over the blocks before pos0 and the
 * attention over the selected keys; else dense attention (+ the statistics). */
nstf_op_cost nstf_cost_attn_sparse(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim, int topk,
                                   int block, int window);

/* The backward ops' rows (training) take their own cost entries. */
nstf_op_cost nstf_cost_attention_bwd(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim);
nstf_op_cost nstf_cost_cross_entropy(int64_t n_tok, int64_t dim, int64_t n_vocab, bool dw);
/* Two matmuls through the rank-r intermediate. */
nstf_op_cost nstf_cost_matmul_lr(nstf_type ta, nstf_type tb, int64_t n_tok, int64_t n_in, int64_t rank,
                                 int64_t n_out, bool int8_act);

/* ---- sparse decode attention (ATTN_SPARSE) ---------------------------------
 * Quest-style block sparsity for decode. The cache of a layer is seen in
 * blocks of B positions; per block and kv head the op keeps the per-channel
 * min and max of the keys (post-RoPE, as cached). Whenever the op writes
 * rows into the cache it recomputes those of every block it touched from
 * the block's rows up to the last written position (exact after rewinds
 * and context shifts, which rewrite positions).
 *
 * A one-token step of a sequence at position p (n_keys = p + 1 keys,
 * nb = ceil(n_keys / B) blocks) attends, per kv head, to:
 *   - block 0 (the attention sink);
 *   - the window: every block holding one of the last max(W, 1) positions
 *     (so the current, partial block always);
 *   - the topk other blocks of largest upper bound
 *       u_b = max over the kv head's query heads h of
 *             sum_c max(q_hc * kmin_bc, q_hc * kmax_bc)
 *     (the bound of q_h . k over the block, Quest; the max over the group
 *     because the kv head's selection serves every head of it); ties go
 *     to the lower block; all of them when there are at most topk.
 * and takes the exact softmax over the selected keys. Every kv head
 * selects the same number of blocks. When the selection is every block
 * the result is the dense attention's, bitwise on the CPU (the same sums
 * in the same order). Runs of several tokens (prefill) attend densely.
 *
 * Attention mass (mass != NULL): after a one-token step, for every block b
 * of the sequence, mass_b = d * mass_b + (1 - d) * p_b, where p_b is the
 * softmax probability of the step's selected keys in block b, averaged over
 * the kv head's query heads (0 for blocks not selected); a block's mass is
 * set to 0 when its first row is written. Prefill updates no mass. */
enum {
    NSTF_SPARSE_BLOCK_MIN = 4,
    NSTF_SPARSE_BLOCK_MAX = 64,
    NSTF_SPARSE_TOPK_MAX = 1024, /* the CPU keeps its running top-k on the stack */
};
/* Selected blocks per kv head at most: block 0, topk, the window's. */
int64_t nstf_sparse_max_sel(int topk, int block, int window);
/* Scratch floats the op needs (any backend) for n tokens. */
int64_t nstf_sparse_work_floats(int64_t n, int n_heads, int n_kv_heads, int head_dim, int64_t n_ctx, int topk,
                                int block, int window);
/* Positions a one-token step at position p attends to, per kv head. */
int64_t nstf_sparse_keys(int64_t p, int topk, int block, int window);

/* ---- the Q8_0 KV cache ---------------------------------------------------
 * A row (one position, every kv head) of a Q8_0 cache holds the kv_dim
 * int8 codes, then one fp16 scale d per 32 of them (kv head h's block j at
 * scale h * head_dim / 32 + j), value = d * code, padded to a multiple of
 * 16 bytes (the GPU loads codes 8 and 16 bytes at a time); d = amax / 127
 * of the block, code = nearest-even(x / d), as ggml's Q8_0 blocks (d at
 * most 65504, the largest fp16: values past 127 x 65504 clip; a NaN value
 * is stored as code 0). */
/* Bytes of a cache row of kv_dim values: es bytes a value (the backend's
 * own type) or, with q8, the Q8_0 row above. False for a kv_dim that is
 * not positive or (q8) not a multiple of 32, or on overflow. */
bool nstf_kv_row_bytes(bool q8, int es, int64_t kv_dim, uint64_t *out);
/* One row of kv_dim fp32 values into a Q8_0 cache row (the codes, then
 * the scales), and back (fp32; the padding is not read). */
void nstf_kv_q8_store(const float *x, int64_t kv_dim, uint8_t *row);
void nstf_kv_q8_load(const uint8_t *row, int64_t kv_dim, float *x);

/* ---- scalar references (the oracle) ------------------------------------ */

/* out[t, :] = dequant(table[ids[t], :]);  torch: table[ids] */
void nstf_ref_get_rows(nstf_type type, const void *table /* [n_rows, dim] */,
                       const int32_t *ids /* [n_tok] */, float *out /* [n_tok, dim] */,
                       int64_t n_tok, int64_t dim);
/* torch: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w */
void nstf_ref_rmsnorm(const float *x /* [n_tok, dim] */, const float *w /* [dim] */,
                      float *y /* [n_tok, dim] */, int64_t n_tok, int64_t dim, float eps);
/* y = a + b; y may alias a or b */
void nstf_ref_add(const float *a, const float *b, float *y, int64_t n);
/* y = x @ W.T with W dequantized; torch: F.linear(x, W) */
void nstf_ref_matmul(nstf_type wtype, const void *w /* [n_out, n_in] */,
                     const float *x /* [n_tok, n_in] */, float *y /* [n_tok, n_out] */,
                     int64_t n_tok, int64_t n_in, int64_t n_out);
/* In-place rotary embedding of the first `head_dim` dims of every head;
 * theta_i = pos * base^(-2i/head_dim) / factors[i] (factors NULL: 1).
 * nstf_ref_rope is the same without factors. */
void nstf_ref_rope_ff(float *x /* [n_tok, n_heads, head_dim] */, const int32_t *pos /* [n_tok] */,
                      int64_t n_tok, int n_heads, int head_dim, float base,
                      const float *factors /* [head_dim/2] or NULL */, nstf_rope_mode mode);
void nstf_ref_rope(float *x /* [n_tok, n_heads, head_dim] */, const int32_t *pos /* [n_tok] */,
                   int64_t n_tok, int n_heads, int head_dim, float base, nstf_rope_mode mode);
/* Causal GQA: token t sits at position pos0 + t and attends to cache
 * positions 0..pos0+t; head h uses kv head h / (n_heads / n_kv_heads).
 * torch: F.scaled_dot_product_attention(q, k, v, is_causal, scale) */
void nstf_ref_attention(const float *q /* [n_tok, n_heads, head_dim] */,
                        const float *k /* [n_ctx, n_kv_heads, head_dim] */,
                        const float *v /* [n_ctx, n_kv_heads, head_dim] */,
                        float *out /* [n_tok, n_heads, head_dim] */, int64_t n_tok, int64_t pos0,
                        int n_heads, int n_kv_heads, int head_dim, float scale);
/* The same with a sliding window (window > 0): token t attends to cache
 * positions max(0, pos0 + t - window + 1)..pos0+t; window 0 is
 * nstf_ref_attention. torch: the causal mask & (kv_idx > q_idx - window),
 * transformers' sliding_window_overlay. */
void nstf_ref_attention_sw(const float *q, const float *k, const float *v, float *out, int64_t n_tok,
                           int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale, int window);
/* y = gate * sigmoid(gate) * up;  torch: F.silu(gate) * up */
void nstf_ref_swiglu(const float *gate, const float *up, float *y, int64_t n);
/* out[r] = argmax_j x[r, j] (first index on ties) */
void nstf_ref_argmax(const float *x /* [n_rows, n] */, int32_t *out /* [n_rows] */,
                     int64_t n_rows, int64_t n);
/* x[t, :] += b;  torch: F.linear's bias */
void nstf_ref_bias(float *x /* [n_tok, width] */, const float *b /* [width] */, int64_t n_tok,
                   int64_t width);
/* Per-head RMSNorm in place, every head_dim row of x:
 * torch: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w  (Qwen3's q_norm / k_norm) */
void nstf_ref_head_norm(float *x /* [n_rows, head_dim] */, const float *w /* [head_dim] */,
                        int64_t n_rows, int head_dim, float eps);

/* y = (x A^T) B^T: tmp = x A^T as nstf_ref_matmul (double sums, rounded
 * to float once), then y = tmp B^T the same way.
 * torch: F.linear(F.linear(x, A), B) */
void nstf_ref_matmul_lr(nstf_type ta, const void *a /* [rank, n_in] */, nstf_type tb,
                        const void *b /* [n_out, rank] */, const float *x /* [n_tok, n_in] */,
                        float *tmp /* [n_tok, rank] */, float *y /* [n_tok, n_out] */, int64_t n_tok,
                        int64_t n_in, int64_t rank, int64_t n_out);

/* Sparse decode attention of one token at position n_keys - 1 over a
 * contiguous cache of one sequence, in double: the block min / max from
 * the keys, the bounds, the selection (above), the softmax over the
 * selected keys. sel [n_kv_heads, max_sel]: the selected blocks,
 * ascending, -1 after them. mass [nb, n_kv_heads] (or NULL): updated as
 * the op does, from the exact probabilities.
 * torch: F.scaled_dot_product_attention(q, k[idx], v[idx]) per kv head with
 * idx the positions of its selected blocks. */
void nstf_ref_attn_sparse(const float *q /* [n_heads, head_dim] */, const float *k /* [n_keys, n_kv_heads, head_dim] */,
                          const float *v /* [n_keys, n_kv_heads, head_dim] */, float *out /* [n_heads, head_dim] */,
                          int32_t *sel /* [n_kv_heads, max_sel] */, float *mass /* [nb, n_kv_heads] or NULL */,
                          float mass_decay, int64_t n_keys, int n_heads, int n_kv_heads, int head_dim, float scale,
                          int block, int topk, int window);

/* ---- fast CPU paths ------------------------------------------------------ */

typedef struct nstf_cpu {
    nstf_pool *pool;      /* not owned */
    bool precise;         /* model matmuls use nstf_cpu_matmul_precise */
    bool a16;             /* model matmuls use nstf_cpu_matmul_a16 */
    bool deterministic;   /* results independent of the thread count: no op
                             changes its summation order with the pool size
                             (attention does not split a row's keys) */
    void *scratch;        /* owned; e.g. quantized activations for matmul */
    size_t scratch_bytes;
    void *a16_rows;       /* owned; rows of nstf_cpu_matmul_a16 */
    size_t a16_bytes;
} nstf_cpu;

/* Make sure the scratch arena holds what nstf_cpu_matmul needs for
 * n_tok x n_in activations (and every other op's needs). Call once per
 * shape, not per token. */
nstf_status nstf_cpu_reserve(nstf_cpu *cpu, int64_t n_tok, int64_t n_in);
void nstf_cpu_release(nstf_cpu *cpu);

void nstf_cpu_get_rows(nstf_cpu *cpu, nstf_type type, const void *table, const int32_t *ids,
                       float *out, int64_t n_tok, int64_t dim);
void nstf_cpu_rmsnorm(nstf_cpu *cpu, const float *x, const float *w, float *y, int64_t n_tok,
                      int64_t dim, float eps);
void nstf_cpu_add(nstf_cpu *cpu, const float *a, const float *b, float *y, int64_t n);
void nstf_cpu_matmul(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y,
                     int64_t n_tok, int64_t n_in, int64_t n_out);
/* The part of x[n_in] (one row) that nstf_cpu_matmul's 8-bit activation
 * blocks lose for weights of wtype: r = x - d q per block, with the
 * kernel's own quantizer. False (r untouched) when that kernel keeps x in
 * fp32 (float weights) or n_in is not a whole number of blocks; x = NULL
 * only asks. */
bool nstf_cpu_act_residual(nstf_type wtype, const float *x, float *r, int64_t n_in);
/* Same contract as nstf_cpu_matmul, with activations carried to ~16 bits:
 * int16 blocks of 32 for the 32-element types and Q4_K / Q5_K / Q6_K;
 * for the other types every row is evaluated as its 8-bit blocks plus
 * their 8-bit rounding residual in one kernel call over the interleaved
 * rows (matmul_a16.c).
 * Needs nstf_cpu_reserve_a16 for the shape; otherwise it runs
 * nstf_cpu_matmul. Allocates nothing. */
void nstf_cpu_matmul_a16(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y,
                         int64_t n_tok, int64_t n_in, int64_t n_out);
/* Room for nstf_cpu_matmul_a16 on n_tok rows of n_in -> n_out at once
 * (grows, never shrinks; also reserves the 8-bit kernel's arena for 2 n_tok
 * rows). */
nstf_status nstf_cpu_reserve_a16(nstf_cpu *cpu, int64_t n_tok, int64_t n_in, int64_t n_out);
void nstf_cpu_release_a16(nstf_cpu *cpu);
/* Same contract as nstf_cpu_matmul, but activations stay fp32 (quantized
 * weights are dequantized on the fly): comparable with an fp32 reference to
 * rounding. Chunks of 1024 values: n_in must be a multiple of 32 for the
 * quantized types. Allocates nothing. */
void nstf_cpu_matmul_precise(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x,
                             float *y, int64_t n_tok, int64_t n_in, int64_t n_out);
void nstf_cpu_rope(nstf_cpu *cpu, float *x, const int32_t *pos, int64_t n_tok, int n_heads,
                   int head_dim, float base, nstf_rope_mode mode);
void nstf_cpu_rope_ff(nstf_cpu *cpu, float *x, const int32_t *pos, int64_t n_tok, int n_heads,
                      int head_dim, float base, const float *factors, nstf_rope_mode mode);
void nstf_cpu_attention(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                        int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim,
                        float scale);
void nstf_cpu_attention_sw(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                           int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim,
                           float scale, int window);
/* The same over a paged cache: k, v are the block pool [n_blocks,
 * block_size, n_kv_heads, head_dim] and cache position j is row
 * j % block_size of block blocks[j / block_size]. Bitwise the result of
 * nstf_cpu_attention_sw on the gathered rows (the same sums in the same
 * order), so its reference is nstf_ref_attention on those rows. */
void nstf_cpu_attention_paged(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                              const int32_t *blocks, int block_size, float *out, int64_t n_tok,
                              int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale,
                              int window);
void nstf_cpu_swiglu(nstf_cpu *cpu, const float *gate, const float *up, float *y, int64_t n);
void nstf_cpu_argmax(nstf_cpu *cpu, const float *x, int32_t *out, int64_t n_rows, int64_t n);
void nstf_cpu_bias(nstf_cpu *cpu, float *x, const float *b, int64_t n_tok, int64_t width);
void nstf_cpu_head_norm(nstf_cpu *cpu, float *x, const float *w, int64_t n_rows, int head_dim, float eps);
/* ATTN_SPARSE for n tokens of one sequence at positions pos0.. over its
 * contiguous cache (k, v: [n_ctx, n_kv_heads, head_dim], the batch's rows
 * already written) and its block statistics (kmin, kmax: [n_blocks,
 * n_kv_heads, head_dim]; mass [n_blocks, n_kv_heads] or NULL): the
 * statistics of the blocks of positions pos0..pos0+n-1 recomputed, then
 * n == 1: the sparse step (sel [n_kv_heads, max_sel] written), n > 1:
 * dense causal attention. work: nstf_sparse_work_floats(1, ...) floats. */
void nstf_cpu_attn_sparse(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                          float *kmin, float *kmax, float *mass, float mass_decay, int32_t *sel, float *work,
                          int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale,
                          int block, int topk, int window);
/* Two nstf_cpu_matmul calls (precise ones when cpu->precise) through tmp
 * [n_tok, rank]. */
void nstf_cpu_matmul_lr(nstf_cpu *cpu, nstf_type ta, const void *a, nstf_type tb, const void *b, const float *x,
                        float *tmp, float *y, int64_t n_tok, int64_t n_in, int64_t rank, int64_t n_out);

#endif
