/* gpu_api.h — the C launchers of the GPU kernels (extern "C"), callable from
 * the engine's C code without any vendor header. Streams are passed as
 * `void *` (a cudaStream_t / hipStream_t, NULL = the default stream). */
#ifndef NSTF_GPU_API_H
#define NSTF_GPU_API_H

#include <stdint.h>
#include "nstf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ======================================================================
 * GEMM and attention (gemm.cu, flash_attn.cu, flash_decode.cu)
 * ====================================================================== */

/* Epilogues fused into nstf_gpu_gemm_bf16. */
typedef enum nstf_gemm_epilogue {
    NSTF_GEMM_EPI_NONE = 0,     /* C = A W^T */
    NSTF_GEMM_EPI_RESIDUAL = 1, /* C = A W^T + R  (R: [M, N], f32 or bf16; R may be C) */
    NSTF_GEMM_EPI_SWIGLU = 2,   /* C[M, N/2] = silu(gate) * up, W rows interleaved by 16:
                                   W rows [32j, 32j+16) = gate rows [16j, 16j+16),
                                   W rows [32j+16, 32j+32) = up rows [16j, 16j+16);
                                   N (W rows) % 32 == 0. nstf_gpu_swiglu_packed_row()
                                   gives the source row of each packed row. */
} nstf_gemm_epilogue;

/* C[M, N] = A[M, K] x W[N, K]^T with fp32 accumulation.
 *   a: [M, K] bf16 row-major (activations); w: [N, K] bf16 row-major (the
 *   nn.Linear weight layout); c: [M, N] (or [M, N/2] for SWIGLU), c_type
 *   NSTF_TYPE_F32 or NSTF_TYPE_BF16; res: [M, N] of res_type (F32/BF16) for
 *   NSTF_GEMM_EPI_RESIDUAL, else NULL. Requires K % 8 == 0 and a, w 16-byte
 *   aligned (rows are copied in 16-byte pieces); M, N any size >= 1. */
nstf_status nstf_gpu_gemm_bf16(const void *a, const void *w, void *c, int c_type, const void *res,
                               int res_type, int64_t m, int64_t n, int64_t k,
                               nstf_gemm_epilogue epi, void *stream);

/* For NSTF_GEMM_EPI_SWIGLU weights: the row of the [gate; up] stack (gate
 * rows 0..n_ff-1, then up rows n_ff..2n_ff-1) that packed row p holds. */
int64_t nstf_gpu_swiglu_packed_row(int64_t p, int64_t n_ff);

/* Flash attention for prefill (causal, GQA), with the KV-cache write fused.
 *   q:     [n_tok, n_heads, head_dim] bf16, token stride q_stride elements
 *   k, v:  [n_tok, n_kv_heads, head_dim] bf16 (this chunk, RoPE applied to k),
 *          token strides k_stride, v_stride (a fused QKV buffer works)
 *   k_cache, v_cache: [n_ctx, n_kv_heads, head_dim] bf16 (one layer); positions
 *          [0, pos0) hold earlier tokens, this call writes [pos0, pos0 + n_tok)
 *   out:   [n_tok, n_heads, head_dim] bf16, token stride out_stride
 * Token i sits at position pos0 + i and attends to positions <= pos0 + i.
 * head_dim 64 or 128; n_heads % n_kv_heads == 0; scale usually 1/sqrt(head_dim). */
nstf_status nstf_gpu_flash_attn(const void *q, int64_t q_stride, const void *k, int64_t k_stride,
                                const void *v, int64_t v_stride, void *k_cache, void *v_cache,
                                void *out, int64_t out_stride, int64_t n_tok, int64_t pos0,
                                int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim, float scale,
                                void *stream);

/* Split-KV flash decoding for small n_tok (1..16 / (n_heads / n_kv_heads)
 * rows per kv head... see flash_decode.cu): same arguments and semantics as
 * nstf_gpu_flash_attn, plus a device workspace of nstf_gpu_flash_decode_workspace()
 * bytes (NULL asks for none: then the call fails if one is needed). */
size_t nstf_gpu_flash_decode_workspace(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                       int head_dim);
nstf_status nstf_gpu_flash_decode(const void *q, int64_t q_stride, const void *k, int64_t k_stride,
                                  const void *v, int64_t v_stride, void *k_cache, void *v_cache,
                                  void *out, int64_t out_stride, int64_t n_tok, int64_t pos0,
                                  int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim,
                                  float scale, void *workspace, size_t workspace_bytes,
                                  void *stream);

#ifdef __cplusplus
}
#endif

#endif
