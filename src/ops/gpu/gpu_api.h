/* gpu_api.h — the C interface of the GPU backend (CUDA or HIP, one source).
 *
 * Everything the rest of the engine calls on a GPU goes through here:
 * device query, memory, streams, and one launcher per kernel. The header
 * is plain C (usable from the C11 engine) and is also included by the .cu
 * files. Conventions:
 *  - Pointers named d_* or documented "device" are device memory.
 *  - Activations are bf16 (passed as uint16_t bit patterns), except the
 *    residual stream, which is fp32 (see nstf_gpu_rmsnorm). Weights are
 *    read as stored in the GGUF file (F32/F16/BF16/Q8_0/Q4_0/Q4_1).
 *  - Every launcher takes an explicit stream (`void *stream`, a
 *    cudaStream_t / hipStream_t; NULL = the legacy default stream), only
 *    enqueues work, and returns NSTF_OK or an error with a message
 *    (nstf_last_error()). Argument errors are caught before launching.
 *  - Sizes and counts are 64-bit. */
#ifndef NSTF_GPU_API_H
#define NSTF_GPU_API_H

#include <stddef.h>
#include <stdint.h>

/* core/dtype.h uses C11 _Static_assert; C++ spells it static_assert. */
#if defined(__cplusplus) && !defined(_Static_assert)
#define _Static_assert static_assert
#endif

#ifdef __cplusplus
extern "C" {
#endif

#include "core/dtype.h"
#include "core/status.h"
#include "nstf_tools.h"
#include "ops/ops.h"
#include "ops/optim.h"

/* ---- devices -------------------------------------------------------------- */

typedef struct nstf_gpu_info {
    char name[256];      /* "NVIDIA H100 80GB HBM3" */
    char arch[32];       /* "sm_90", "gfx942" */
    int n_sm;            /* streaming multiprocessors (NVIDIA) / compute units (AMD) */
    int wave_size;       /* 32 or 64 */
    int clock_khz;       /* peak SM clock */
    uint64_t total_mem;  /* bytes of device memory */
    uint64_t free_mem;   /* bytes free at query time */
    uint64_t l2_bytes;   /* L2 cache size */
    uint64_t smem_per_block; /* max shared memory (LDS) per block, opt-in included */
} nstf_gpu_info;

/* Number of visible devices (0 when no driver or no device: not an error). */
int nstf_gpu_device_count(void);
nstf_status nstf_gpu_query(int dev, nstf_gpu_info *info);
/* Make `dev` current for the calling thread; fails (NSTF_ERR_UNSUPPORTED)
 * when the build has no code for the device (nstf_gpu_check_device). */
nstf_status nstf_gpu_set_device(int dev);
/* Programmatic dependent launch (CUDA, sm_90+): while on, the decode-path
 * kernels (GEMV, fused GEMV, flash decode, get_rows, argmax) launched from
 * this host thread may start before the previous kernel ends, overlapping
 * their launch and weight prefetch with its tail. Returns the previous
 * setting. NSTF_PDL=0 in the environment keeps it off. No effect on HIP. */
int nstf_gpu_set_pdl(int on);
/* HIP: NSTF_ERR_UNSUPPORTED, naming the device's gfx target and the compiled
 * ones, when this build has no code object for `dev`. Called by
 * nstf_gpu_set_device and before the first launch of the matrix kernels, so
 * a wrong target is reported before any kernel runs. CUDA: always NSTF_OK. */
nstf_status nstf_gpu_check_device(int dev);

/* ---- memory and streams ---------------------------------------------------- */

nstf_status nstf_gpu_malloc(void **d_ptr, size_t bytes);
nstf_status nstf_gpu_free(void *d_ptr); /* NULL is a no-op */
/* Copies return when the copy is complete (they synchronize `stream`). */
nstf_status nstf_gpu_memcpy_h2d(void *d_dst, const void *src, size_t bytes, void *stream);
nstf_status nstf_gpu_memcpy_d2h(void *dst, const void *d_src, size_t bytes, void *stream);
nstf_status nstf_gpu_memcpy_d2d(void *d_dst, const void *d_src, size_t bytes, void *stream);
/* Enqueued on `stream` (asynchronous). */
nstf_status nstf_gpu_memset(void *d_ptr, int byte, size_t bytes, void *stream);

nstf_status nstf_gpu_stream_create(void **stream);
nstf_status nstf_gpu_stream_destroy(void *stream);
nstf_status nstf_gpu_stream_sync(void *stream);

/* ---- kernels ------------------------------------------------------------------ */

/* Rewrite a weight matrix [n_out, n_in] of `type`, uploaded as the file
 * stores it, in place into the GPU's row layout: Q4_0, IQ4_NL and Q8_0
 * rows of a multiple of 256 elements and Q6_K rows of a multiple of 2048
 * (up to 36 KiB a row) are split into their codes (16-byte aligned runs),
 * scales and d (quant.h, nstf_gpu_split_rows); every other matrix is left
 * as it is. The kernels below that take weights (get_rows, gemv,
 * gemv_fused, matmul_lr) read rows of such types and lengths in that
 * layout only, so a matrix must pass through here once after its upload;
 * w 16-byte aligned. */
nstf_status nstf_gpu_weights_relayout(nstf_type type, void *w, int64_t n_in, int64_t n_out, void *stream);

/* Embedding gather: out[t, :] = dequant(table[ids[t], :]).
 * table [n_rows, dim] of `type` (any supported; dim a multiple of 32 for the
 * quantized types), ids [n_tok] int32 on the device, out [n_tok, dim] of
 * out_type F32 (the residual stream) or BF16. An id outside [0, n_rows)
 * yields a row of NaN instead of an out-of-bounds read. ids NULL: rows 0 ..
 * n_tok - 1 (n_tok <= n_rows), the prefill's dequantization of a whole
 * matrix, with no id to load before each row. */
nstf_status nstf_gpu_get_rows(nstf_type type, const void *table, int64_t n_rows,
                              const int32_t *ids, void *out, nstf_type out_type,
                              int64_t n_tok, int64_t dim, void *stream);

/* Residual add fused into RMSNorm, one pass per token:
 *   if (res) x[t, :] += res[t, :];                       (x: fp32, in place)
 *   y[t, :] = bf16(x[t, :] * rsqrt(mean(x[t, :]^2) + eps) * w[:])
 * x [n_tok, dim] fp32 is the residual stream. It stays fp32 because it
 * accumulates every layer's output: rounding it to bf16 each layer adds an
 * error of 2^-9 relative per add that never averages out, while the branch
 * outputs (res) only need their own precision. res [n_tok, dim] is F32 or
 * BF16 (res_type) or NULL; w [dim] fp32 (norm weights are stored F32);
 * y [n_tok, dim] bf16. */
nstf_status nstf_gpu_rmsnorm(float *x, const void *res, nstf_type res_type, const float *w,
                             uint16_t *y, int64_t n_tok, int64_t dim, float eps, void *stream);

/* Rotary embedding, in place, on q [n_tok, n_heads, head_dim] and
 * k [n_tok, n_kv_heads, head_dim] (bf16; k may be NULL with n_kv_heads 0).
 * Token t is at position pos[t] (device int32); theta_i = pos *
 * base^(-2i/head_dim); mode NSTF_ROPE_NORM rotates (x[2i], x[2i+1]),
 * NSTF_ROPE_NEOX rotates (x[i], x[i + head_dim/2]). head_dim even, <= 256.
 * The angle is accurate to ~1e-7 rad at any position below 2^24. */
nstf_status nstf_gpu_rope(uint16_t *q, uint16_t *k, const int32_t *pos, int64_t n_tok,
                          int n_heads, int n_kv_heads, int head_dim, float base,
                          nstf_rope_mode mode, void *stream);
/* The same with token strides (elements) for q and k, e.g. the rows of one
 * fused q | k | v GEMM output, and optional frequency factors: factors
 * (device, [head_dim/2] fp32, or NULL) divide each theta_i (Llama 3.x
 * rope_freqs), applied to the inverse frequency as a compensated division
 * (nstf_rope_scale, fused_math.h) so the angle keeps its accuracy. */
nstf_status nstf_gpu_rope_strided(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride,
                                  const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                  int head_dim, float base, const float *factors, nstf_rope_mode mode,
                                  void *stream);

/* The RoPE inverse frequencies base^(-2i/head_dim), i < head_dim/2, each a
 * double split into two floats: hi_lo[i] the float nearest, hi_lo[half + i]
 * the remainder (host function; the table nstf_gemv_fusion.rope_freqs
 * points to, after a copy to the device). */
void nstf_gpu_rope_freqs(float base, int head_dim, float *hi_lo);

/* y[i] = silu(gate[i]) * up[i] over n elements, bf16 in and out (fp32 math). */
nstf_status nstf_gpu_swiglu(const uint16_t *gate, const uint16_t *up, uint16_t *y, int64_t n,
                            void *stream);

/* Decode GEMV (matrix-vector for 1..8 tokens; more are processed 8 at a
 * time): y[t, o] = sum_i W[o, i] * x[t, i], fp32 accumulation.
 * W [n_out, n_in] of any weight type (n_in a multiple of the type's
 * block; in the GPU's row layout: nstf_gpu_weights_relayout), x [n_tok, n_in] bf16,
 * y [n_tok, n_out] of y_type F32 or BF16. */
nstf_status nstf_gpu_gemv(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                          nstf_type y_type, int64_t n_tok, int64_t n_in, int64_t n_out,
                          void *stream);
/* The kernel configuration nstf_gpu_gemv picks for these arguments, for
 * tests and benchmarks ("bf16/vec16 nt=3 chunk=2048x2"). Static string
 * storage owned by the library, overwritten by the next call. */
const char *nstf_gpu_gemv_config(nstf_type wtype, const void *w, const uint16_t *x,
                                 int64_t n_tok, int64_t n_in);

/* The decode GEMV of one token with the ops around it fused, so a layer is
 * six kernels: the RMSNorm before it (prologue) and the residual add, the
 * RoPE or the SwiGLU after it (epilogue), with Qwen's QKV bias and per-head
 * q/k norm before the RoPE. Each result is bitwise what the unfused kernels
 * give (nstf_gpu_rmsnorm, nstf_gpu_gemv, nstf_gpu_bias, nstf_gpu_head_norm,
 * nstf_gpu_rope, nstf_gpu_swiglu, nstf_gpu_add): the same sums in the same
 * order, the same bf16 roundings in between. */
typedef enum nstf_gemv_epi {
    NSTF_GEMV_STORE = 0,  /* y[o] = (W x)[o], y F32 */
    NSTF_GEMV_ACCUM = 1,  /* y[o] += (W x)[o], y F32 (the residual stream) */
    NSTF_GEMV_ROPE = 2,   /* y[o] bf16; rows [0, rope_rows) are q | k heads of
                             head_dim, rotated at position *pos */
    NSTF_GEMV_SWIGLU = 3, /* W rows [0, n_out/2) gate, [n_out/2, n_out) up;
                             y[j] = silu(gate_j) * up_j, bf16, n_out/2 of them */
} nstf_gemv_epi;

typedef struct nstf_gemv_fusion {
    const float *norm_x; /* non-NULL: the input is bf16(norm_x * rsqrt(mean(norm_x^2)
                            + norm_eps) * norm_w), norm_x, norm_w f32 [n_in]
                            (device); x is then not read */
    const float *norm_w;
    float norm_eps;
    nstf_gemv_epi epi;
    int rope_rows;           /* ROPE: rotated rows, a multiple of head_dim */
    int head_dim;            /* ROPE: even, <= 256 */
    nstf_rope_mode rope_mode;
    const int32_t *pos;      /* ROPE: device position */
    const float *rope_freqs; /* ROPE: device table of nstf_gpu_rope_freqs() */
    const float *rope_factors; /* ROPE: device [head_dim/2] frequency factors (as
                                  nstf_gpu_rope_strided's), or NULL */
    /* ROPE only, Qwen's extras, applied where the unfused ops apply them
     * (nstf_gpu_bias, then nstf_gpu_head_norm, then the rotation): rows
     * [0, q_rows) are q's heads, [q_rows, rope_rows) k's, the rest v's. */
    int q_rows;              /* needed with a bias or the q/k norm: a multiple of head_dim */
    const float *bias_q, *bias_k, *bias_v; /* device fp32 biases of the three row
                                              ranges (Qwen2), each NULL: none */
    const float *q_norm, *k_norm; /* device fp32 [head_dim] per-head RMSNorm weights
                                     of q's and k's heads (Qwen3), or NULL */
    float qk_eps;            /* the per-head norm's epsilon */
} nstf_gemv_fusion;

/* Whether nstf_gpu_gemv_fused takes this weight (BF16 with n_in % 8 == 0 and
 * 16-byte aligned, Q8_0, Q4_0, 4-byte aligned Q4_1) and, with the norm
 * prologue (norm != 0), whether x of n_in fits the staging buffer. */
int nstf_gpu_gemv_fusable(nstf_type wtype, const void *w, int64_t n_in, int norm);
/* One token: W [n_out, n_in] as in nstf_gpu_gemv, x [n_in] bf16 (unless
 * f->norm_x), y as f->epi says (n_out even for ROPE and SWIGLU). One
 * kernel; two with the per-head q/k norm (the GEMV stores q | k | v with
 * their biases, then one kernel normalizes and rotates q's and k's heads:
 * nstf_gpu_head_norm_rope). */
nstf_status nstf_gpu_gemv_fused(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                                int64_t n_in, int64_t n_out, const nstf_gemv_fusion *f,
                                void *stream);

/* Greedy sampling: out[r] = argmax_j x[r, j] (first index on ties; NaN
 * never wins; an all-NaN row gives 0). x [n_rows, n] of x_type F32 or BF16,
 * out [n_rows] int32 on the device. `scratch` is device memory of at least
 * nstf_gpu_argmax_scratch_bytes(n_rows, n) bytes. */
size_t nstf_gpu_argmax_scratch_bytes(int64_t n_rows, int64_t n);
nstf_status nstf_gpu_argmax(const void *x, nstf_type x_type, int32_t *out, int64_t n_rows,
                            int64_t n, void *scratch, void *stream);

/* KV-cache write for one layer: k_cache[pos[t], :] = k[t, :] and likewise
 * v, for rows of kv_dim bf16 (n_kv_heads * head_dim); caches are
 * [n_ctx, kv_dim]. A position outside [0, n_ctx) is skipped. */
nstf_status nstf_gpu_kv_write(const uint16_t *k, const uint16_t *v, uint16_t *k_cache,
                              uint16_t *v_cache, const int32_t *pos, int64_t n_tok,
                              int64_t kv_dim, int64_t n_ctx, void *stream);

/* Attention over a paged KV cache for a continuous batch (paged_attn.cu):
 * token t of sequence seq[t] (seq NULL: all 0) at position pos[t] first
 * writes its k, v rows into the pool, then attends (causal, GQA) to the
 * positions 0..pos[t] of its sequence. Position p of sequence s is row
 * p % block_size of pool block blocks[s * (n_ctx / block_size) + p /
 * block_size]; the pools are [n_blocks, block_size, n_kv_heads, head_dim].
 *   q [n_tok, n_heads, head_dim] bf16 (RoPE applied), token stride q_stride
 *   k, v [n_tok, n_kv_heads, head_dim] bf16, token strides k_stride, v_stride
 *   out [n_tok, n_heads, head_dim] bf16, token stride out_stride
 *   pos, seq [n_tok], blocks [n_seq, n_ctx / block_size] int32, on the device
 * n_ctx % block_size == 0; head_dim even, at most 256; no alignment asked.
 * A token at a position outside [0, n_ctx) or of a slot outside [0, n_seq)
 * writes nothing and outputs zeros; a block id outside [0, n_blocks) is a
 * key that is not there (never read or written). fp32 scores, softmax and
 * accumulation. */
nstf_status nstf_gpu_paged_attention(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                     int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                     uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                     int64_t out_stride, const int32_t *pos, const int32_t *seq,
                                     const int32_t *blocks, int64_t n_tok, int64_t n_ctx, int n_seq,
                                     int block_size, int64_t n_blocks, int n_heads, int n_kv_heads,
                                     int head_dim, float scale, int window, void *stream);


/* ==========================================================================
 * GEMM on the matrix units and flash attention (gemm.cu, flash_attn.cu,
 * flash_decode.cu; tile abstraction in mma.h). bf16 operands are uint16_t
 * bit patterns.
 * ========================================================================== */

/* Epilogues fused into nstf_gpu_gemm_bf16. */
typedef enum nstf_gemm_epilogue {
    NSTF_GEMM_EPI_NONE = 0,     /* C = A W^T */
    NSTF_GEMM_EPI_RESIDUAL = 1, /* C = A W^T + R; R [M, N] F32 or BF16, may alias C
                                   (then of C's type): out-proj / down-proj + residual */
    NSTF_GEMM_EPI_SWIGLU = 2,   /* C [M, N/2] = silu(gate) * up, W's rows interleaved
                                   in groups of 16: W rows [32j, 32j+16) are gate rows
                                   [16j, 16j+16) and W rows [32j+16, 32j+32) the up
                                   rows [16j, 16j+16). N (W rows, 2 n_ff) % 32 == 0.
                                   nstf_gpu_swiglu_packed_row() gives the layout. */
} nstf_gemm_epilogue;

/* C[M, N] = A[M, K] x W[N, K]^T, fp32 accumulation, fused epilogue.
 *   a [M, K] bf16 row-major (activations); w [N, K] bf16 row-major (the
 *   nn.Linear layout: one row of K per output); c [M, N] ([M, N/2] for
 *   SWIGLU) of c_type F32 or BF16; res [M, N] of res_type F32/BF16 for
 *   NSTF_GEMM_EPI_RESIDUAL, else NULL (res_type ignored).
 * Requires K % 8 == 0 and a, w 16-byte aligned (rows move in 16-byte
 * pieces); M and N are free (tails are masked). */
nstf_status nstf_gpu_gemm_bf16(const uint16_t *a, const uint16_t *w, void *c, nstf_type c_type,
                               const void *res, nstf_type res_type, int64_t m, int64_t n,
                               int64_t k, nstf_gemm_epilogue epi, void *stream);

/* The same with fp16 operands (F16 weights): a and w hold fp16 bit
 * patterns, the products run on the fp16 matrix instructions (wgmma .f16 on
 * sm_90a, mma.sync .f16, v_mfma_f32_16x16x16f16, v_wmma_f32_16x16x16_f16),
 * accumulation, epilogues, output and requirements as nstf_gpu_gemm_bf16.
 * The activations, bf16 in the engine, get there through
 * nstf_gpu_bf16_to_f16. */
nstf_status nstf_gpu_gemm_f16(const uint16_t *a, const uint16_t *w, void *c, nstf_type c_type,
                              const void *res, nstf_type res_type, int64_t m, int64_t n,
                              int64_t k, nstf_gemm_epilogue epi, void *stream);

/* y[i] = fp16(x[i]) for n bf16 values: round to nearest even, finite values
 * beyond the fp16 range saturated to +-65504, infinities kept, NaN stays NaN
 * (the fp16 quiet NaN). x and y must not overlap. */
nstf_status nstf_gpu_bf16_to_f16(const uint16_t *x, uint16_t *y, int64_t n, void *stream);

/* Which kernel nstf_gpu_gemm_bf16 takes for an M x N x K call on the current
 * device, as a static string ("wgmma 128x256", "mma.sync 128x128", ...; "none"
 * without a usable device). For tests and benchmarks to print. On Hopper
 * the wgmma path is taken unless the environment has NSTF_GEMM=mma. */
const char *nstf_gpu_gemm_path(int64_t m, int64_t n, int64_t k);
/* Whether an M x N x K call takes the wgmma path and meets what a gradient
 * GEMM rewritten onto it needs (K and N multiples of 8: TMA rows of the
 * transposed operands): the training ops then transpose the operand that is
 * not k-major and call nstf_gpu_gemm_bf16 (1) rather than nstf_gpu_gemm_ex
 * (0). */
int nstf_gpu_gemm_kmajor_fast(int64_t m, int64_t n, int64_t k);
/* The weight gradient read as stored: C [M, N] (fp32) += A^T B for bf16
 * A [K, M] (row stride lda) and B [K, N] (ldb), on wgmma with both operands
 * MN-major and K split across the SMs where the output has few tiles (the
 * splits' partial sums go to the scratch and are added in split order:
 * deterministic). nstf_gpu_gemm_dw_fast says whether this call can take it
 * (Hopper, strides multiples of 8, A and B 16-byte aligned, no NSTF_GEMM=mma)
 * and sets the scratch it needs (0: none); nstf_gpu_gemm_dw refuses calls
 * it cannot take (NSTF_ERR_UNSUPPORTED). */
int nstf_gpu_gemm_dw_fast(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m, int64_t n,
                          int64_t k, size_t *scratch_bytes);
nstf_status nstf_gpu_gemm_dw(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c, int64_t m,
                             int64_t n, int64_t k, void *scratch, size_t scratch_bytes, void *stream);

/* SWIGLU packing: row p of the packed W holds row nstf_gpu_swiglu_packed_row(p,
 * n_ff) of the stacked [gate (n_ff rows); up (n_ff rows)] matrix. */
int64_t nstf_gpu_swiglu_packed_row(int64_t p, int64_t n_ff);

/* Flash attention for prefill: causal, GQA, online softmax, KV-cache write
 * fused (this call stores its k, v rows into the cache).
 *   q   [n_tok, n_heads, head_dim] bf16, RoPE applied; token stride q_stride
 *   k,v [n_tok, n_kv_heads, head_dim] bf16 (this chunk; RoPE applied to k);
 *       token strides k_stride, v_stride (so a fused QKV buffer works)
 *   k_cache, v_cache [n_ctx, n_kv_heads, head_dim] bf16, one layer: positions
 *       [0, pos0) hold earlier tokens; [pos0, pos0 + n_tok) are written here
 *   out [n_tok, n_heads, head_dim] bf16, token stride out_stride
 * Token i is at position pos0 + i and attends to positions <= pos0 + i.
 * head_dim 64 or 128; n_heads % n_kv_heads == 0; pos0 + n_tok <= n_ctx;
 * strides multiples of 8 and pointers 16-byte aligned; scale usually
 * 1/sqrt(head_dim). nstf_gpu_flash_attn_sw adds a sliding window: with
 * window > 0 token i sees positions > pos0 + i - window only (the key
 * tiles wholly before a block's window are skipped). */
nstf_status nstf_gpu_flash_attn_sw(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                   int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                   uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                   int64_t out_stride, int64_t n_tok, int64_t pos0, int64_t n_ctx,
                                   int n_heads, int n_kv_heads, int head_dim, float scale, int window,
                                   void *stream);
/* Prefill over a Q8_0 cache (rows of kv_rb bytes, as in
 * nstf_gpu_flash_decode_dpos) through the bf16 kernel: cache rows [lo,
 * pos0) of every kv head widened into the bf16 rows [n_ctx, n_kv_heads,
 * head_dim] of k_bf, v_bf (their rows elsewhere untouched), and the call's
 * n_tok rows of k, v quantized into the cache at pos0; then
 * nstf_gpu_flash_attn_sw on k_bf, v_bf as its cache attends (lo: the first
 * position any of the call's tokens sees, 0 without a window). Each
 * cached value is widened once per call, not once per query tile. */
nstf_status nstf_gpu_kv_q8_prepare(const uint16_t *k, int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                   uint8_t *k_cache, uint8_t *v_cache, int64_t kv_rb, uint16_t *k_bf,
                                   uint16_t *v_bf, int64_t n_tok, int64_t lo, int64_t pos0, int64_t n_ctx,
                                   int n_kv_heads, int head_dim, void *stream);
nstf_status nstf_gpu_flash_attn(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                int64_t out_stride, int64_t n_tok, int64_t pos0, int64_t n_ctx,
                                int n_heads, int n_kv_heads, int head_dim, float scale,
                                void *stream);

/* Split-KV flash decoding for small n_tok (n_tok * n_heads / n_kv_heads <= 16
 * query rows per kv head): same arguments and semantics as
 * nstf_gpu_flash_attn, plus device scratch of
 * nstf_gpu_flash_decode_scratch_bytes() bytes for the partial results. The
 * KV range is cut into splits chosen from the context length and the SM
 * count; a second kernel merges the partial (max, sum, acc), or for short
 * contexts (one block per kv head) the block itself. */
size_t nstf_gpu_flash_decode_scratch_bytes(int64_t n_tok, int64_t pos0, int n_heads,
                                           int n_kv_heads, int head_dim);
nstf_status nstf_gpu_flash_decode(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                  int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                  uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                  int64_t out_stride, int64_t n_tok, int64_t pos0, int64_t n_ctx,
                                  int n_heads, int n_kv_heads, int head_dim, float scale,
                                  void *scratch, size_t scratch_bytes, void *stream);

/* ==========================================================================
 * Graphs, events, and the device-position decode attention (graph.cu,
 * flash_decode.cu): what the model forward (model/llama_gpu.c) needs to
 * capture its decode step once and replay it at every position.
 * ========================================================================== */

/* Enqueue a host-to-device copy without waiting (small pageable copies are
 * staged at once, so `src` may be reused when this returns). */
nstf_status nstf_gpu_memcpy_h2d_async(void *d_dst, const void *src, size_t bytes, void *stream);
/* Enqueue a device-to-host copy without waiting (dst page-locked). */
nstf_status nstf_gpu_memcpy_d2h_async(void *dst, const void *d_src, size_t bytes, void *stream);
/* Page-locked host memory, also visible to the devices at the same
 * address (unified addressing): the small results copied every step, the
 * words a kernel and the host both read. */
nstf_status nstf_gpu_host_alloc(void **p, size_t bytes);
void nstf_gpu_host_free(void *p); /* NULL is a no-op */

/* Capture the work enqueued on `stream` (a created stream, not NULL) between
 * begin and end into an executable graph; end also leaves capture mode after
 * a failure inside the capture. Launch replays it on `stream`. */
nstf_status nstf_gpu_capture_begin(void *stream);
nstf_status nstf_gpu_capture_end(void *stream, void **graph_exec);
nstf_status nstf_gpu_graph_launch(void *graph_exec, void *stream);
void nstf_gpu_graph_destroy(void *graph_exec); /* NULL is a no-op */

/* Timing events: ms = time between two recorded events (waits for stop). */
nstf_status nstf_gpu_event_create(void **ev);
void nstf_gpu_event_destroy(void *ev);
nstf_status nstf_gpu_event_record(void *ev, void *stream);
nstf_status nstf_gpu_event_ms(void *start, void *stop, float *ms);

/* nstf_gpu_flash_decode with pos0 read from device memory (*d_pos0) when the
 * kernel runs, so a captured launch stays valid at every position. The split
 * plan and the scratch size are made for the bound pos_max (>= every *d_pos0
 * it will see; scratch of nstf_gpu_flash_decode_scratch_bytes(n_tok,
 * pos_max, ...) bytes); positions past *d_pos0 + n_tok cost an empty split.
 * window > 0: a sliding window as in nstf_gpu_flash_attn_sw; the splits
 * then start at the window of the first token. kv_rb: 0 for a bf16 cache
 * as above, else a Q8_0 cache of rows of kv_rb bytes (nstf_kv_row_bytes,
 * ops.h: the row's int8 codes, then an fp16 scale per 32 of them), written
 * quantized and read widened to bf16 (each tile's codes and scales staged
 * in shared memory, by cp.async on NVIDIA). */
nstf_status nstf_gpu_flash_decode_dpos(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                       int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                       uint16_t *k_cache, uint16_t *v_cache, int64_t kv_rb, uint16_t *out,
                                       int64_t out_stride, int64_t n_tok, const int32_t *d_pos0,
                                       int64_t pos_max, int64_t n_ctx, int n_heads, int n_kv_heads,
                                       int head_dim, float scale, int window, void *scratch,
                                       size_t scratch_bytes, void *stream);

/* ==========================================================================
 * Unfused kernels of the lower execution levels (attn_naive.cu): attention
 * through a materialized fp32 score matrix, a plain residual add, SwiGLU on
 * [gate | up] rows, and profiler range markers (NVTX on CUDA; no-ops where
 * unavailable, including HIP).
 * ========================================================================== */

/* scores [n_heads, n_tok, n_kv] fp32 = q . k_cache^T (unscaled, unmasked);
 * q [n_tok, n_heads, head_dim] bf16 with token stride q_stride; k_cache
 * [>= n_kv, n_kv_heads, head_dim] bf16. head_dim even, divides 256. */
nstf_status nstf_gpu_attn_scores(const uint16_t *q, int64_t q_stride, const uint16_t *k_cache, float *scores,
                                 int64_t n_tok, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim,
                                 void *stream);
/* In place: s[h, t, j] = j <= pos0 + t ? s * scale : -inf (and -inf for
 * j <= pos0 + t - window when window > 0: a sliding window). */
nstf_status nstf_gpu_scale_mask(float *scores, int64_t n_heads, int64_t n_tok, int64_t n_kv, int64_t pos0,
                                float scale, int window, void *stream);
/* In place row softmax over n_kv; fused != 0 applies the scale and the
 * causal (and window) mask of nstf_gpu_scale_mask while reading. Fully
 * masked entries become 0. */
nstf_status nstf_gpu_softmax_rows(float *scores, int64_t n_heads, int64_t n_tok, int64_t n_kv, int64_t pos0,
                                  float scale, int fused, int window, void *stream);
/* out[t, h, :] = sum_j p[h, t, j] v_cache[j, kvh, :] (bf16 out, token
 * stride out_stride). */
nstf_status nstf_gpu_attn_pv(const float *p, const uint16_t *v_cache, uint16_t *out, int64_t out_stride,
                             int64_t n_tok, int64_t n_kv, int n_heads, int n_kv_heads, int head_dim, void *stream);
/* x[i] += y[i], fp32. */
nstf_status nstf_gpu_add(float *x, const float *y, int64_t n, void *stream);
/* y[t, c] = silu(h[t, c]) * h[t, ffn + c]: h [n_tok, 2 ffn] bf16 holds each
 * token's gate then up (one GEMM over the adjacent matrices), y [n_tok, ffn]. */
nstf_status nstf_gpu_swiglu_rows(const uint16_t *h, uint16_t *y, int64_t n_tok, int64_t ffn, void *stream);
/* x[t, i] = bf16(x[t, i] + b[i]) for i < width: a projection's bias, in
 * place on bf16 rows of token stride `stride` (elements), b fp32 (bias.cu). */
nstf_status nstf_gpu_bias(uint16_t *x, int64_t stride, const float *b, int64_t n_tok, int64_t width,
                          void *stream);
/* Per-head RMSNorm in place (head_norm.cu), fp32 math on bf16 rows:
 * q [n_tok, n_heads, head_dim] (token stride q_stride), k likewise with
 * n_kv_heads (k may be NULL with n_kv_heads 0); each head row
 * x = bf16(x * rsqrt(mean(x^2) + eps) * w), w = wq or wk [head_dim] fp32.
 * head_dim even, <= 512. */
nstf_status nstf_gpu_head_norm(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride, const float *wq,
                               const float *wk, int64_t n_tok, int n_heads, int n_kv_heads, int head_dim,
                               float eps, void *stream);
/* One token's per-head RMSNorm then RoPE, in place, in one kernel (the
 * level-3 decode of Qwen3, after the fused QKV GEMV): q [n_heads, head_dim]
 * and k [n_kv_heads, head_dim] bf16, each head row normalized as
 * nstf_gpu_head_norm does, rounded to bf16, then rotated at position *pos
 * as nstf_gpu_rope_strided does, with the device table `freqs` of
 * nstf_gpu_rope_freqs and the device frequency `factors` (or NULL):
 * bitwise the two kernels' result. head_dim even, <= 256. */
nstf_status nstf_gpu_head_norm_rope(uint16_t *q, uint16_t *k, const float *wq, const float *wk, int n_heads,
                                    int n_kv_heads, int head_dim, float eps, const int32_t *pos, const float *freqs,
                                    const float *factors, nstf_rope_mode mode, void *stream);

/* The workspace a low-rank matmul may use for its GEMM path: a bf16
 * buffer of wtmp_elems elements for a dequantized factor, and the token
 * count up to which the GEMV runs instead. */
typedef struct nstf_gpu_lr_ws {
    uint16_t *wtmp;
    uint64_t wtmp_elems;
    int64_t gemv_max_tok;
} nstf_gpu_lr_ws;
/* y [n, n_out] (y_type F32 or BF16) = (x [n, n_in] A^T) B^T for a matrix
 * stored as factors A [rank, n_in] (type ta) and B [n_out, rank] (tb), any
 * GEMV type: two matmul launches through tmp [n, rank] bf16 (not fused;
 * matmul_lr.cu). */
nstf_status nstf_gpu_matmul_lr(nstf_type ta, const void *a, nstf_type tb, const void *b, const uint16_t *x,
                               uint16_t *tmp, void *y, nstf_type y_type, int64_t n, int64_t n_in, int64_t rank,
                               int64_t n_out, const nstf_gpu_lr_ws *ws, void *stream);
/* Kernels one factor's stage launches (for the backend's kernel count). */
int nstf_gpu_matmul_lr_kernels(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out, const nstf_gpu_lr_ws *ws);
/* The workspace elements (bf16) one factor [n_out, n_in] of type wt needs
 * to run on the GEMM at n tokens: its dequantized copy unless bf16 and,
 * when n_in (the rank, for the second factor) is not a multiple of 8, the
 * zero-padded copies of it and of its input. */
uint64_t nstf_gpu_matmul_lr_ws_elems(nstf_type wt, int64_t n, int64_t n_in, int64_t n_out);
/* Named ranges for Nsight Systems (NVTX) around layers and ops. */
void nstf_gpu_range_push(const char *name);
void nstf_gpu_range_pop(void);
int nstf_gpu_have_ranges(void);


/* ==========================================================================
 * Training (gemm_bwd.cu, attn_bwd.cu, flash_attn.cu, rmsnorm_bwd.cu, rope.cu,
 * swiglu_bwd.cu, get_rows_bwd.cu, cross_entropy.cu, optim.cu): the backward
 * of every op, the fused loss and the optimizer step, with the contracts of
 * ops/backward.h and ops/optim.h: parameter gradients (fp32) are added
 * into, activation gradients written. Kernels that need room beyond their
 * operands take device scratch sized by their *_scratch_bytes function.
 * ========================================================================== */

/* C[M, N] (+)= A B with bf16 operands, fp32 accumulation, on the matrix
 * units, any operand orientation:
 *   a_km 0: A [M, K] (row stride lda); 1: A stored transposed, [K, M]
 *   b_kn 0: B stored transposed, [N, K] (the nn.Linear weight layout, as
 *           nstf_gpu_gemm_bf16); 1: B [K, N]
 * c [M, N] F32 or BF16 with row stride ldc; acc: C += A B (C read first),
 * else C = A B. The contiguous extent of each operand (K for A and B^T, M
 * for A^T, N for B) and lda, ldb are multiples of 8, a and b 16-byte
 * aligned; M, N, K are otherwise free (edges masked). */
nstf_status nstf_gpu_gemm_ex(const uint16_t *a, int64_t lda, int a_km, const uint16_t *b, int64_t ldb,
                             int b_kn, void *c, nstf_type c_type, int64_t ldc, int64_t m, int64_t n,
                             int64_t k, int acc, void *stream);
/* dx [n_tok, n_in] (+= when acc) = dy [n_tok, n_out] W [n_out, n_in]: W bf16
 * dense, dy bf16 with token stride dy_stride, dx F32 or BF16 with token
 * stride dx_stride. */
nstf_status nstf_gpu_matmul_bwd_x(const uint16_t *w, const uint16_t *dy, int64_t dy_stride, void *dx,
                                  nstf_type dx_type, int64_t dx_stride, int64_t n_tok, int64_t n_in,
                                  int64_t n_out, int acc, void *stream);
/* dW [n_out, n_in] (fp32, dense) += dy^T x: x [n_tok, n_in], dy [n_tok, n_out]
 * bf16 with token strides. */
nstf_status nstf_gpu_matmul_bwd_w(const uint16_t *x, int64_t x_stride, const uint16_t *dy,
                                  int64_t dy_stride, float *dw, int64_t n_tok, int64_t n_in,
                                  int64_t n_out, void *stream);

/* y [cols, rows] = x^T: x [rows, cols] bf16 with row stride ldx >= cols,
 * y dense; x and y must not overlap. The gradient GEMMs' operand copy
 * where the fast GEMM wants k-major operands (backend/gpu_ops.c). */
nstf_status nstf_gpu_transpose_bf16(const uint16_t *x, int64_t ldx, uint16_t *y, int64_t rows,
                                    int64_t cols, void *stream);

/* nstf_gpu_flash_attn that also writes lse [n_tok, n_heads] fp32, the
 * natural log-sum-exp of each row's scaled scores (the training forward). */
nstf_status nstf_gpu_flash_attn_lse(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                    int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                    uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                    int64_t out_stride, float *lse, int64_t n_tok, int64_t pos0,
                                    int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim,
                                    float scale, void *stream);
/* The training forward over a batch: n_seq independent sequences of n_tok
 * rows each, one after another in q, k, v, out and lse (token strides as
 * nstf_gpu_flash_attn), each attending causally to its own rows (positions
 * 0..n_tok-1); no cache is read or written. One launch, the sequence in the
 * grid's z. lse [n_seq * n_tok, n_heads] fp32. */
nstf_status nstf_gpu_flash_attn_lse_batch(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                          int64_t k_stride, const uint16_t *v, int64_t v_stride, uint16_t *out,
                                          int64_t out_stride, float *lse, int64_t n_tok, int64_t n_seq,
                                          int n_heads, int n_kv_heads, int head_dim, float scale, void *stream);
/* Attention backward from the saved lse (nstf_ref_attention_bwd): q, out,
 * dout, dq [n_tok, n_heads, head_dim]; k, v, dk, dv [pos0 + n_tok,
 * n_kv_heads, head_dim]; all bf16 with token strides (multiples of 8,
 * pointers 16-byte aligned); lse [n_tok, n_heads] fp32. head_dim 64 or 128.
 * dq, dk, dv are written. Scratch: nstf_gpu_flash_attn_bwd_scratch_bytes. */
size_t nstf_gpu_flash_attn_bwd_scratch_bytes(int64_t n_tok, int n_heads);
nstf_status nstf_gpu_flash_attn_bwd(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                    int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                    const uint16_t *out, int64_t o_stride, const uint16_t *dout,
                                    int64_t do_stride, const float *lse, uint16_t *dq, int64_t dq_stride,
                                    uint16_t *dk, int64_t dk_stride, uint16_t *dv, int64_t dv_stride,
                                    int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                    int head_dim, float scale, void *scratch, size_t scratch_bytes,
                                    void *stream);
/* The same over n_seq sequences of n_tok queries each, laid out one after
 * another in every operand (q, out, dout, dq, lse: n_tok rows each; k, v,
 * dk, dv: pos0 + n_tok rows each), each attending to its own keys, in one
 * launch (pos0 must be 0 when n_seq > 1). Scratch:
 * nstf_gpu_flash_attn_bwd_scratch_bytes(n_seq * n_tok, n_heads). */
nstf_status nstf_gpu_flash_attn_bwd_batch(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                          int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                          const uint16_t *out, int64_t o_stride, const uint16_t *dout,
                                          int64_t do_stride, const float *lse, uint16_t *dq, int64_t dq_stride,
                                          uint16_t *dk, int64_t dk_stride, uint16_t *dv, int64_t dv_stride,
                                          int64_t n_tok, int64_t n_seq, int64_t pos0, int n_heads,
                                          int n_kv_heads, int head_dim, float scale, void *scratch,
                                          size_t scratch_bytes, void *stream);

/* RMSNorm backward (nstf_ref_rmsnorm_bwd): x, dy, dx [n, dim] fp32, w [dim];
 * dx += ...; dw [dim] += ... unless NULL (a frozen norm); dx_bf16 (may be
 * NULL, token stride dxb_stride) receives dx after the add, rounded to bf16.
 * Scratch (only with dw): nstf_gpu_rmsnorm_bwd_scratch_bytes. */
size_t nstf_gpu_rmsnorm_bwd_scratch_bytes(int64_t n, int64_t dim);
/* The kernels nstf_gpu_rmsnorm_bwd launches for rows of dim (with dw or not). */
int nstf_gpu_rmsnorm_bwd_launches(int64_t dim, int with_dw);
nstf_status nstf_gpu_rmsnorm_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                 uint16_t *dx_bf16, int64_t dxb_stride, int64_t n, int64_t dim,
                                 float eps, void *scratch, size_t scratch_bytes, void *stream);

/* RoPE backward: the rotation by -theta, in place on the gradients dq, dk
 * (nstf_gpu_rope_strided's arguments). */
nstf_status nstf_gpu_rope_bwd(uint16_t *dq, int64_t q_stride, uint16_t *dk, int64_t k_stride,
                              const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                              int head_dim, float base, nstf_rope_mode mode, void *stream);

/* SwiGLU backward, elementwise over rows of n_ff with their own token
 * strides; bf16 in and out; outputs may alias inputs. */
nstf_status nstf_gpu_swiglu_bwd(const uint16_t *gate, int64_t gate_stride, const uint16_t *up,
                                int64_t up_stride, const uint16_t *dy, int64_t dy_stride,
                                uint16_t *dgate, int64_t dgate_stride, uint16_t *dup,
                                int64_t dup_stride, int64_t n, int64_t n_ff, void *stream);

/* Embedding backward: dtable[ids[t], :] += dout[t, :] (fp32), repeated ids
 * summed in token order (deterministic, no float atomics); the scratch
 * (nstf_gpu_get_rows_bwd_scratch_bytes) holds a hash of the ids. */
size_t nstf_gpu_get_rows_bwd_scratch_bytes(int64_t n_tok);
nstf_status nstf_gpu_get_rows_bwd(const int32_t *ids, const float *dout, int64_t dout_stride,
                                  float *dtable, int64_t n_tok, int64_t dim, void *scratch,
                                  size_t scratch_bytes, void *stream);

/* Cross-entropy fused with the logits (nstf_ref_cross_entropy's
 * contract), chunked over the tokens: chunks of `rows` tokens (a multiple
 * of 8) each compute their logits over the whole vocabulary (fp32), the
 * row's log-sum-exp and loss, the logit gradient (bf16) and its two
 * products, so no [n_tok, n_vocab] tensor exists and each logit is computed
 * once. h [n_tok, dim] bf16 dense, w [n_vocab, dim] bf16, targets [n_tok]
 * (device), n_norm > 0; lse [n_tok] (may be NULL); dh [n_tok, dim] fp32
 * written; dw [n_vocab, dim] fp32 += (NULL: a frozen matrix); *loss (device
 * double) written. n_vocab and dim multiples of 8. Scratch:
 * nstf_gpu_cross_entropy_scratch_bytes(n_tok, rows, dim, n_vocab); the
 * chunk for a scratch budget: nstf_gpu_cross_entropy_rows. */
/* The scratch the GPU backend gives the cross-entropy: 2 GiB holds 4096
 * tokens' logits at SmolLM2's vocabulary (49152), enough rows for the input
 * gradient's GEMM (rows x dim outputs, K = the vocabulary) to fill an H100. */
#define NSTF_GPU_CE_BUDGET ((uint64_t)2 << 30)
static inline uint64_t nstf_gpu_ce_round(uint64_t b) { return (b + 255) / 256 * 256; }
static inline uint64_t nstf_gpu_cross_entropy_scratch_bytes(int64_t n_tok, int64_t rows, int64_t dim,
                                                            int64_t n_vocab) {
    const uint64_t n = (uint64_t)n_tok, r = (uint64_t)rows, d = (uint64_t)dim, v = (uint64_t)n_vocab;
    /* per-row lse and target logit [n_tok]; W^T [dim, V]; the chunk's logits [rows, V] fp32,
     * gradient and its transpose [rows, V] bf16, h^T [dim, rows] */
    return 2 * nstf_gpu_ce_round(4 * n) + nstf_gpu_ce_round(2 * v * d) +
           nstf_gpu_ce_round(4 * r * v) + 2 * nstf_gpu_ce_round(2 * r * v) + nstf_gpu_ce_round(2 * d * r);
}
/* Rows per chunk within `budget` bytes of scratch: all n_tok (rounded up to
 * 8) when they fit, else the fewest chunks that fit, of equal size (at
 * least 8 rows: a budget below that is exceeded). */
static inline int64_t nstf_gpu_cross_entropy_rows(int64_t n_tok, int64_t dim, int64_t n_vocab, uint64_t budget) {
    const int64_t all = (n_tok + 7) / 8 * 8;
    if (nstf_gpu_cross_entropy_scratch_bytes(n_tok, all, dim, n_vocab) <= budget) return all;
    /* the fixed part, the rounding of the four per-chunk buffers, and the bytes of one row */
    const uint64_t fixed = nstf_gpu_cross_entropy_scratch_bytes(n_tok, 0, dim, n_vocab) + 4 * 256;
    const uint64_t per_row = 8 * (uint64_t)n_vocab + 2 * (uint64_t)dim;
    int64_t most = budget > fixed ? (int64_t)((budget - fixed) / per_row) / 8 * 8 : 0;
    if (most < 8) most = 8;
    const int64_t chunks = (n_tok + most - 1) / most;
    return ((n_tok + chunks - 1) / chunks + 7) / 8 * 8;
}

/* The kernels nstf_gpu_cross_entropy launches for these arguments (the
 * backend's count of launches per step). */
int nstf_gpu_cross_entropy_launches(const uint16_t *h, int64_t n_tok, int64_t dim, int64_t n_vocab, int64_t rows,
                                    int with_dw);
nstf_status nstf_gpu_cross_entropy(const uint16_t *h, const uint16_t *w, const int32_t *targets,
                                   int32_t ignore_index, double n_norm, float *lse, float *dh, float *dw,
                                   double *loss, int64_t n_tok, int64_t dim, int64_t n_vocab, int64_t rows,
                                   void *scratch, size_t scratch_bytes, void *stream);

/* AdamW over the flat fp32 arrays (nstf_cpu_adamw's contract and order of
 * operations); w_bf16 (may be NULL) receives the updated weights in bf16.
 * The tensor table is host memory. */
nstf_status nstf_gpu_adamw(const nstf_adamw_params *p, int64_t step, float grad_scale,
                           const nstf_param_tensor *tensors, int n_tensors, float *w, const float *grad,
                           float *m, float *v, uint16_t *w_bf16, void *stream);
/* Sum of squares of each tensor's gradient (double, fixed order) into sq
 * [n_tensors] (host memory: the call waits for it). Scratch:
 * nstf_gpu_grad_norm_scratch_bytes. */
size_t nstf_gpu_grad_norm_scratch_bytes(const nstf_param_tensor *tensors, int n_tensors);
nstf_status nstf_gpu_grad_norm(const nstf_param_tensor *tensors, int n_tensors, const float *grad,
                               double *sq, void *scratch, size_t scratch_bytes, void *stream);

/* ==========================================================================
 * conv2d forward: the convolution ladder (conv.cu, conv_tiled.cu,
 * conv_igemm.cu). Not a row of the model's op table: kernels for the conv
 * benchmark (nstf bench conv) and the PyTorch ops.
 * ========================================================================== */

/* y = conv2d(x, w) + bias for the descriptor d (nstf_tools.h: layout NCHW or
 * NHWC, stride, padding, dilation, groups). x and w bf16 (w [k][c/g][r][s]
 * for NCHW, [k][r][s][c/g] for NHWC), bias fp32 [k] or NULL, y of y_type F32
 * or BF16; every level accumulates in fp32. Levels:
 *   0  direct: one thread per output, 64-thread groups (grid-stride)
 *   1  direct, 256-thread groups
 *   2  shared-memory tiles: a 256-thread group computes a 32x32 tile of
 *      positions for 8 output channels (2x2 positions x 8 channels per
 *      thread), the input patch and the filters staged by chunks of channels
 *   3  level 2 with 16-byte global loads, 16-byte shared reads of the
 *      filters and (NHWC) 8-channel stores
 *   4  implicit GEMM on the matrix units (mma.h): M = n p q positions,
 *      N = k/groups, K = (c/groups) r s; A gathered from x on the fly
 *      (16-byte cp.async pieces in NHWC when c/groups % 8 == 0), zero-filled
 *      padding
 * level -1: the fastest level (4). Pointers 2-byte aligned (bf16); vector
 * paths are taken where the pointers are 16-byte aligned. */
nstf_status nstf_gpu_conv2d(const nstf_conv2d_desc *d, int level, const uint16_t *x, const uint16_t *w,
                            const float *bias, void *y, nstf_type y_type, void *stream);
/* NSTF_OK when `level` takes the descriptor, else NSTF_ERR_UNSUPPORTED with
 * the reason (levels 2-3: the input patch of one channel must fit shared
 * memory; grids: n, groups within the launch limits). Needs a device (the
 * current one's limits) only for level 4. */
nstf_status nstf_gpu_conv2d_supported(const nstf_conv2d_desc *d, int level);

/* Sparse decode attention (ATTN_SPARSE, ops.h; attn_sparse.cu) over one
 * sequence's contiguous bf16 cache [n_ctx, n_kv_heads, head_dim], with the
 * block statistics kmin, kmax [ceil(n_ctx / block), n_kv_heads, head_dim]
 * fp32 and mass [ceil(n_ctx / block), n_kv_heads] fp32 (or NULL).
 * n_tok == 1: the token at position *pos (device) writes its k, v rows,
 * updates its block's statistics, selects (sel [n_kv_heads, max_sel],
 * ascending, -1 after) and attends: out [n_heads, head_dim] bf16, then the
 * mass update; work: nstf_sparse_work_floats(1, ...) floats.
 * n_tok > 1 (prefill, after flash attention wrote the rows and attended):
 * the statistics of the blocks of positions pos[0]..pos[n_tok - 1] only
 * (q, k, v, out, sel, work unused). block: NSTF_SPARSE_BLOCK_MIN..MAX. */
nstf_status nstf_gpu_attn_sparse(const uint16_t *q, const uint16_t *k, const uint16_t *v, uint16_t *k_cache,
                                 uint16_t *v_cache, uint16_t *out, const int32_t *pos, int64_t n_tok, int64_t n_ctx,
                                 int n_heads, int n_kv_heads, int head_dim, float scale, int block, int topk,
                                 int window, float *kmin, float *kmax, float *mass, float mass_decay, int32_t *sel,
                                 float *work, void *stream);

/* ---- collectives and peers (ccl.cu) ----------------------------------------------- *
 * NCCL (RCCL on HIP), loaded with dlopen at first use so that a program
 * that never runs tensor-parallel needs no NCCL library; a build without
 * NSTF_HAVE_NCCL answers NSTF_ERR_UNSUPPORTED. ccl_init makes n
 * non-blocking communicators, one per device devs[r], in one group,
 * waiting at most timeout_ms (then aborting them); desc receives "NCCL
 * 2.28.9". allreduce_f32 queues an in-place sum of buf [n] fp32 on stream
 * and waits (at most timeout_ms) until NCCL has taken it. The sharded
 * pair works in place on buf of n_ranks slots (rank r's at r x shard):
 * reduce_scatter_f32 leaves the sum of rank's slot over the ranks there
 * (ncclReduceScatter), allgather copies every rank's slot of slot_bytes
 * into the others' buffers (ncclAllGather as bytes). abort may be called
 * from any thread while another waits on the communicator. */
nstf_status nstf_gpu_ccl_init(const int *devs, int n, void **comms, int timeout_ms, char *desc, size_t cap);
/* One process per rank (a launch by mpirun): unique_id makes the group's
 * id on rank 0 (NSTF_CCL_ID_BYTES, ncclGetUniqueId), which the launch
 * hands to every rank; init_rank makes this rank's communicator on device
 * dev (ncclCommInitRank, blocking, on a thread of its own: an error when
 * not every rank joined within timeout_ms). */
#define NSTF_CCL_ID_BYTES 128
nstf_status nstf_gpu_ccl_unique_id(unsigned char *id);
nstf_status nstf_gpu_ccl_init_rank(int dev, int rank, int n, const unsigned char *id, void **comm, int timeout_ms,
                                   char *desc, size_t cap);
nstf_status nstf_gpu_ccl_allreduce_f32(void *comm, float *buf, int64_t n, void *stream, int timeout_ms);
nstf_status nstf_gpu_ccl_reduce_scatter_f32(void *comm, int rank, float *buf, int64_t shard, void *stream,
                                            int timeout_ms);
nstf_status nstf_gpu_ccl_allgather(void *comm, int rank, void *buf, int64_t slot_bytes, void *stream, int timeout_ms);
void nstf_gpu_ccl_abort(void *comm);
void nstf_gpu_ccl_destroy(void *comm);

/* The link from device a to device b: peer access (0/1), the runtime's
 * performance rank (lower is better), native atomics over the link
 * (NVIDIA: NVLink), and on HIP the link type (xGMI) and hops; link names
 * it in words ("NVLink", "xGMI", "PCIe", "none"). */
typedef struct nstf_gpu_link {
    int access, perf_rank, atomics, hops;
    char link[32];
} nstf_gpu_link;
nstf_status nstf_gpu_link_query(int a, int b, nstf_gpu_link *out);
/* Device a may access device b's memory from now on (already enabled is
 * not an error); leaves device a current. */
nstf_status nstf_gpu_enable_peer(int a, int b);
/* Timed peer copies from a to b: bandwidth of `bytes` (GB/s, best of
 * several) and the latency of a 4-byte copy (us, median), peer access
 * enabled where the link has it. */
nstf_status nstf_gpu_p2p_measure(int a, int b, size_t bytes, double *gbs, double *lat_us);

#ifdef __cplusplus
}
#endif
#endif
