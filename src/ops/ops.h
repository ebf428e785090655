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

/* X(UPPER, lower, description) */
#define NSTF_OPS(X)                                                                  \
    X(GET_ROWS, get_rows, "embedding gather: out[t,:] = dequant(table[ids[t],:])")  \
    X(RMSNORM, rmsnorm, "y = x * rsqrt(mean(x^2) + eps) * w")                       \
    X(ADD, add, "y = a + b (residual)")                                              \
    X(MATMUL, matmul, "y[t,o] = sum_i W[o,i] * x[t,i] (quantized W used directly)") \
    X(ROPE, rope, "rotary position embedding, in place")                             \
    X(ATTENTION, attention, "causal grouped-query attention over the KV cache")      \
    X(SWIGLU, swiglu, "y = silu(gate) * up")                                         \
    X(ARGMAX, argmax, "index of the largest value per row")
#define NSTF_OP_COUNT 8

typedef enum nstf_op {
#define NSTF_X(U, l, d) NSTF_OP_##U,
    NSTF_OPS(NSTF_X)
#undef NSTF_X
        NSTF_OP_N
} nstf_op;
_Static_assert(NSTF_OP_N == NSTF_OP_COUNT, "op table and NSTF_OP_COUNT disagree");

const char *nstf_op_name(nstf_op op);
const char *nstf_op_desc(nstf_op op);

typedef enum nstf_rope_mode {
    NSTF_ROPE_NORM = 0, /* rotate adjacent pairs (x[2i], x[2i+1]): GGUF "llama" */
    NSTF_ROPE_NEOX = 2, /* rotate (x[i], x[i + d/2]): HF layout, GGUF neox-style archs */
} nstf_rope_mode;

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
 * theta_i = pos * base^(-2i/head_dim). */
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
/* y = gate * sigmoid(gate) * up;  torch: F.silu(gate) * up */
void nstf_ref_swiglu(const float *gate, const float *up, float *y, int64_t n);
/* out[r] = argmax_j x[r, j] (first index on ties) */
void nstf_ref_argmax(const float *x /* [n_rows, n] */, int32_t *out /* [n_rows] */,
                     int64_t n_rows, int64_t n);

/* ---- fast CPU paths ------------------------------------------------------ */

typedef struct nstf_cpu {
    nstf_pool *pool;      /* not owned */
    bool precise;         /* model matmuls use nstf_cpu_matmul_precise */
    bool deterministic;   /* results independent of the thread count: no op
                             changes its summation order with the pool size
                             (attention does not split a row's keys) */
    void *scratch;        /* owned; e.g. quantized activations for matmul */
    size_t scratch_bytes;
    struct nstf_prof *prof; /* optional per-op profiler (src/prof/profiler.h); NULL = off */
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
/* Same contract as nstf_cpu_matmul, but activations stay fp32 (quantized
 * weights are dequantized on the fly): comparable with an fp32 reference to
 * rounding. Chunks of 1024 values: n_in must be a multiple of 32 for the
 * quantized types. Allocates nothing. */
void nstf_cpu_matmul_precise(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x,
                             float *y, int64_t n_tok, int64_t n_in, int64_t n_out);
void nstf_cpu_rope(nstf_cpu *cpu, float *x, const int32_t *pos, int64_t n_tok, int n_heads,
                   int head_dim, float base, nstf_rope_mode mode);
void nstf_cpu_attention(nstf_cpu *cpu, const float *q, const float *k, const float *v, float *out,
                        int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads, int head_dim,
                        float scale);
void nstf_cpu_swiglu(nstf_cpu *cpu, const float *gate, const float *up, float *y, int64_t n);
void nstf_cpu_argmax(nstf_cpu *cpu, const float *x, int32_t *out, int64_t n_rows, int64_t n);

#endif
