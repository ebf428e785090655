/* backward.h — the backward of every op of the Llama forward (ops.h), for
 * training: scalar references (nstf_ref_*_bwd, the oracle) and the fast CPU
 * paths of the heavy ones (matmul, attention, cross-entropy), plus the
 * forward helpers the backward needs (attention that also returns the
 * log-sum-exp of every row).
 *
 * Layouts are those of ops.h (row-major, innermost last):
 *   activations x      [n_tok, dim]                       fp32
 *   weights W          [n_out, n_in] (one row per output)  fp32 here
 *   q                  [n_tok, n_heads, head_dim]
 *   k, v               [n_keys, n_kv_heads, head_dim]
 * A gradient has the layout of the tensor it belongs to.
 *
 * Accumulation contract (what gradient accumulation over micro-batches and
 * tensors used twice rely on):
 *   - gradients of PARAMETERS (dw of matmul and RMSNorm, the embedding
 *     table's dtable, the output matrix's dw) are always ADDED into (+=):
 *     the caller zeroes them once per optimizer step, and a tied embedding
 *     receives both the embedding's and the logits' gradient in one buffer;
 *   - gradients of ACTIVATIONS are written (=), except where an op says
 *     otherwise: RMSNorm's dx is added into the residual stream's gradient,
 *     and matmul's dx may be added (acc = true: x feeds Q, K and V, or gate
 *     and up, and its gradient is their sum).
 * The cross-entropy takes its normalizer from the caller, so that the
 * micro-batches of one step each add 1/N of the step's mean loss gradient.
 *
 * Every fast path is deterministic: each output element is computed by one
 * thread in an order that does not depend on the thread count, so results
 * are bitwise identical for any pool size. */
#ifndef NSTF_OPS_BACKWARD_H
#define NSTF_OPS_BACKWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/ops.h"

/* ---- scalar references (the oracle) ---------------------------------------- */

/* Embedding: dtable[ids[t], :] += dout[t, :] (scatter-add; repeated ids sum).
 * torch: table.grad.index_add_(0, ids, dout) */
void nstf_ref_get_rows_bwd(const int32_t *ids /* [n_tok] */, const float *dout /* [n_tok, dim] */,
                           float *dtable /* [n_rows, dim] += */, int64_t n_tok, int64_t dim);

/* RMSNorm y = x * r * w, r = rsqrt(mean(x^2) + eps), per row:
 *   dx += r * (dy * w - x * r^2 * sum(dy * w * x) / dim)
 *   dw += sum over rows of dy * x * r
 * dx is ADDED into: it is the residual stream's gradient, which the
 * residual add passes through unchanged. torch: autograd of
 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w */
void nstf_ref_rmsnorm_bwd(const float *x /* [n_tok, dim] */, const float *w /* [dim] */,
                          const float *dy /* [n_tok, dim] */, float *dx /* [n_tok, dim] += */,
                          float *dw /* [dim] += */, int64_t n_tok, int64_t dim, float eps);

/* RoPE is a rotation by theta per pair; its backward is the rotation by
 * -theta (the transpose), applied in place to the gradient. Same modes and
 * angles as nstf_ref_rope. torch: autograd of x * cos + rotate_half(x) * sin */
void nstf_ref_rope_bwd(float *dx /* [n_tok, n_heads, head_dim]: dy in, dx out */,
                       const int32_t *pos /* [n_tok] */, int64_t n_tok, int n_heads, int head_dim,
                       float base, nstf_rope_mode mode);

/* Causal GQA attention forward that also saves, per (token, head), the
 * log-sum-exp of the scaled scores, lse = log(sum_j exp(scale * q.k_j)),
 * which the backward uses to recompute the probabilities without a stored
 * score matrix. Same contract as nstf_ref_attention: token t sits at
 * position pos0 + t and sees keys 0..pos0+t. */
void nstf_ref_attention_lse(const float *q /* [n_tok, n_heads, head_dim] */,
                            const float *k /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *v /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            float *out /* [n_tok, n_heads, head_dim] */,
                            float *lse /* [n_tok, n_heads] */, int64_t n_tok, int64_t pos0,
                            int n_heads, int n_kv_heads, int head_dim, float scale);

/* Attention backward from the saved lse (flash-attention style):
 *   P_tj = exp(scale * q_t.k_j - lse_t)        (recomputed, never stored)
 *   D_t  = dout_t . out_t
 *   dv_j = sum_t P_tj dout_t
 *   dS_tj = P_tj (dout_t . v_j - D_t)
 *   dq_t = scale * sum_j dS_tj k_j,   dk_j = scale * sum_t dS_tj q_t
 * with dk, dv summed over the n_heads / n_kv_heads query heads that share a
 * kv head. All three are written (=); dk and dv cover every key position
 * 0..pos0+n_tok-1 (the prefix positions included).
 * torch: autograd of F.scaled_dot_product_attention with k, v repeated
 * along the head axis (repeat_interleave), causal mask offset by pos0. */
void nstf_ref_attention_bwd(const float *q /* [n_tok, n_heads, head_dim] */,
                            const float *k /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *v /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            const float *out /* [n_tok, n_heads, head_dim] */,
                            const float *dout /* [n_tok, n_heads, head_dim] */,
                            const float *lse /* [n_tok, n_heads] */,
                            float *dq /* [n_tok, n_heads, head_dim] */,
                            float *dk /* [pos0 + n_tok, n_kv_heads, head_dim] */,
                            float *dv /* [pos0 + n_tok, n_kv_heads, head_dim] */, int64_t n_tok,
                            int64_t pos0, int n_heads, int n_kv_heads, int head_dim, float scale);

/* SwiGLU y = silu(gate) * up:
 *   dgate = dy * up * sig(gate) * (1 + gate * (1 - sig(gate))),  dup = dy * silu(gate)
 * Elementwise: an output may alias any input.  torch: autograd of F.silu(gate) * up */
void nstf_ref_swiglu_bwd(const float *gate /* [n] */, const float *up /* [n] */,
                         const float *dy /* [n] */, float *dgate /* [n] */, float *dup /* [n] */,
                         int64_t n);

/* Matmul y = x @ W.T (W fp32 [n_out, n_in]):
 *   dx  = dy @ W         written, or added when acc   torch: dy @ W
 *   dW += dy.T @ x                                     torch: W.grad += dy.T @ x */
void nstf_ref_matmul_bwd_x(const float *w /* [n_out, n_in] */, const float *dy /* [n_tok, n_out] */,
                           float *dx /* [n_tok, n_in] */, int64_t n_tok, int64_t n_in,
                           int64_t n_out, bool acc);
void nstf_ref_matmul_bwd_w(const float *x /* [n_tok, n_in] */, const float *dy /* [n_tok, n_out] */,
                           float *dw /* [n_out, n_in] += */, int64_t n_tok, int64_t n_in,
                           int64_t n_out);

/* Cross-entropy fused with the logits matmul, z = h @ W.T, never holding
 * more than a chunk of z:
 *   loss = sum over t with targets[t] != ignore_index of
 *          (lse_t - z[t, targets[t]]) / n_norm,   lse_t = log sum_v exp(z[t, v])
 *   dh   = d loss / d h        (written; zero rows for ignored tokens)
 *   dW  += d loss / d W      (dw may be NULL: a frozen output matrix)
 * and returns loss. n_norm is the number of targets the step's mean runs
 * over: pass the count of non-ignored targets of the whole step (summed
 * over its micro-batches, nstf_ce_count), or <= 0 to use this call's
 * count. With no target to count, loss is 0 and the gradients are zero
 * (where torch returns NaN). lse (optional, NULL to skip) receives lse_t
 * of the non-ignored tokens and 0 for the ignored ones. Targets must be
 * ignore_index or in [0, n_vocab) (nstf_ce_count checks).
 * torch: F.cross_entropy(h @ W.T, targets, ignore_index=ignore_index,
 *        reduction="sum") / n_norm, with autograd. */
double nstf_ref_cross_entropy(const float *h /* [n_tok, dim] */, const float *w /* [n_vocab, dim] */,
                              const int32_t *targets /* [n_tok] */, int32_t ignore_index,
                              double n_norm, float *lse /* [n_tok] or NULL */,
                              float *dh /* [n_tok, dim] */, float *dw /* [n_vocab, dim] += */,
                              int64_t n_tok, int64_t dim, int64_t n_vocab);

/* The common start of every cross-entropy path: counts the non-ignored
 * targets (returned), resolves *n_norm <= 0 to that count, zeroes dh and
 * lse (ignored rows stay zero). */
int64_t nstf_ce_prepare(const int32_t *targets /* [n_tok] */, int64_t n_tok, int64_t dim,
                        int32_t ignore_index, double *n_norm, float *lse /* [n_tok] or NULL */,
                        float *dh /* [n_tok, dim] */);

/* Checks every target (ignore_index or in [0, n_vocab)) and counts the
 * non-ignored ones; NSTF_ERR_RANGE names the first bad one. */
nstf_status nstf_ce_count(const int32_t *targets /* [n_tok] */, int64_t n_tok, int64_t n_vocab,
                          int32_t ignore_index, int64_t *n_valid);

/* ---- fast CPU paths ---------------------------------------------------------- */

/* Same contracts as the references. Matmul: cache-blocked FMA tiles over
 * the pool; attention: two passes (dq over query rows, then dk/dv over key
 * blocks of each kv head), so that no two threads write one row, with the
 * probabilities recomputed from lse. head_dim <= NSTF_ATTN_BWD_MAX_D (larger
 * heads fall back to the reference). */
#define NSTF_ATTN_BWD_MAX_D 256

void nstf_cpu_matmul_bwd_x(nstf_cpu *cpu, const float *w, const float *dy, float *dx,
                           int64_t n_tok, int64_t n_in, int64_t n_out, bool acc);
void nstf_cpu_matmul_bwd_w(nstf_cpu *cpu, const float *x, const float *dy, float *dw,
                           int64_t n_tok, int64_t n_in, int64_t n_out);
void nstf_cpu_attention_bwd(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                            const float *out, const float *dout, const float *lse, float *dq,
                            float *dk, float *dv, int64_t n_tok, int64_t pos0, int n_heads,
                            int n_kv_heads, int head_dim, float scale);

/* The light ones, threaded; same contracts as the references. RMSNorm's
 * work holds n floats (each row's rsqrt), dw may be NULL (a frozen norm). */
void nstf_cpu_get_rows_bwd(nstf_cpu *cpu, const int32_t *ids, const float *dout, float *dtable,
                           int64_t n_tok, int64_t dim);
void nstf_cpu_rmsnorm_bwd(nstf_cpu *cpu, const float *x, const float *w, const float *dy, float *dx,
                          float *dw, int64_t n_tok, int64_t dim, float eps, float *work /* [n_tok] */);
void nstf_cpu_rope_bwd(nstf_cpu *cpu, float *dx, const int32_t *pos, int64_t n_tok, int n_heads,
                       int head_dim, float base, nstf_rope_mode mode);
void nstf_cpu_swiglu_bwd(nstf_cpu *cpu, const float *gate, const float *up, const float *dy,
                         float *dgate, float *dup, int64_t n);

/* Forward attention that also writes the log-sum-exp of every row (the
 * training forward; nstf_cpu_attention's contract, lse [n_tok, n_heads]).
 * Never splits a row's keys, so results do not depend on the pool size. */
void nstf_cpu_attention_lse(nstf_cpu *cpu, const float *q, const float *k, const float *v,
                            float *out, float *lse, int64_t n_tok, int64_t pos0, int n_heads,
                            int n_kv_heads, int head_dim, float scale);

/* Floats of workspace nstf_cpu_cross_entropy needs for this shape: at most
 * NSTF_CE_TOK x (2 dim + NSTF_CE_VOCAB) floats (2.2 MiB for dim 576),
 * whatever n_tok and n_vocab are. */
#define NSTF_CE_TOK 256    /* tokens per block */
#define NSTF_CE_VOCAB 1024 /* vocabulary entries per chunk of logits */
int64_t nstf_cpu_cross_entropy_work(int64_t n_tok, int64_t dim, int64_t n_vocab);

/* Blocks of up to NSTF_CE_TOK non-ignored tokens; per block two passes over
 * the vocabulary in chunks of NSTF_CE_VOCAB logits (one computes the
 * log-sum-exp online, the other recomputes the chunk, turns it into
 * d loss / d z and feeds both gradient GEMMs), so the logits held at once
 * are [NSTF_CE_TOK, NSTF_CE_VOCAB]. The logits GEMM is nstf_cpu_matmul on
 * fp32 W (exact fp32). Cost: two logits GEMMs and two gradient GEMMs.
 * work: nstf_cpu_cross_entropy_work(...) floats. Returns the loss. */
double nstf_cpu_cross_entropy(nstf_cpu *cpu, const float *h, const float *w,
                              const int32_t *targets, int32_t ignore_index, double n_norm,
                              float *lse, float *dh, float *dw, int64_t n_tok, int64_t dim,
                              int64_t n_vocab, float *work);

#endif
