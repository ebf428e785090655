/* paged_attn.cu — attention over a paged KV cache, for continuous batches:
 * every token of the batch has its own sequence slot and position, and the
 * cache rows of a sequence are found through its block table (position p of
 * sequence s is row p % block_size of pool block
 * blocks[s * blocks_per_seq + p / block_size]).
 *
 * Two kernels on the stream, in order:
 *  1. paged_kv_write: one block per token copies its k, v rows into the row
 *     of the pool its position maps to. All writes land before any read, so
 *     tokens of one sequence in one batch (a prefill chunk) see each other.
 *  2. paged_attn: one block of PA_THREADS threads per (token, kv head),
 *     for the G query heads that share the kv head (K and V are read once
 *     for the G of them). Keys 0..pos[t] (with a sliding window, the last
 *     `window` of them) go by in tiles of PA_THREADS: each thread reads one
 *     key row (16 bytes at a time where rows are aligned) and scores it for
 *     each head (fp32 dot product, sequential over head_dim), the block
 *     takes the tile's max per head, rescales that head's running (max,
 *     sum, acc) — the online softmax — and each thread accumulates its
 *     output dims over the tile's keys in key order, each V value read once
 *     for the G heads. The probabilities stay fp32 (no bf16 operand), so
 *     the result is the naive same-precision computation up to the
 *     rescaling; each head's sums run in the same order as with one block
 *     per head, and a token's result does not depend on the other tokens of
 *     the batch.
 *
 * This is the correctness-first kernel of the paged path: CUDA cores, a
 * tile's keys scored by independent threads (flash_decode.cu's split-KV
 * and matrix units are not used). A token whose position is
 * outside [0, n_ctx) or whose slot is outside [0, n_seq) writes nothing and
 * outputs zeros; a block id outside [0, n_blocks) is a key that is not
 * there: never a read or write out of bounds. The host checks the tables
 * before the forward (model/forward.c). */
#include "gpu.h"

#define PA_THREADS 128  /* keys per tile = threads per block */
#define PA_MAX_HD 256   /* shared q row; head_dim up to this, even */
#define PA_DIMS (PA_MAX_HD / PA_THREADS) /* output dims per thread */
#define PA_MAX_G 16     /* query heads per kv head (the GPU backend's bound) */

static __device__ __forceinline__ float pa_bf16(const uint16_t *p) {
    nstf_bf16 b;
    b.bits = *p;
    return nstf_bf16_to_float(b);
}

/* The pool row of position p of sequence s, or -1 when there is none. */
static __device__ __forceinline__ int64_t pa_row(const int32_t *blocks, int64_t bps, int block_size, int64_t n_blocks,
                                                 int32_t s, int64_t p) {
    const int32_t b = blocks[(int64_t)s * bps + p / block_size];
    if (b < 0 || b >= n_blocks) return -1;
    return (int64_t)b * block_size + p % block_size;
}

__global__ void __launch_bounds__(PA_THREADS)
paged_kv_write_kernel(const uint16_t *__restrict__ k, int64_t k_stride, const uint16_t *__restrict__ v,
                      int64_t v_stride, uint16_t *__restrict__ kc, uint16_t *__restrict__ vc,
                      const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
                      const int32_t *__restrict__ blocks, int64_t n_tok, int64_t kvd, int64_t n_ctx,
                      int n_seq, int block_size, int64_t n_blocks) {
    const int64_t bps = n_ctx / block_size;
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        const int32_t p = pos[t], s = seq ? seq[t] : 0;
        if (p < 0 || p >= n_ctx || s < 0 || s >= n_seq) continue;
        const int64_t row = pa_row(blocks, bps, block_size, n_blocks, s, p);
        if (row < 0) continue;
        for (int64_t i = threadIdx.x; i < kvd; i += blockDim.x) {
            kc[row * kvd + i] = k[t * k_stride + i];
            vc[row * kvd + i] = v[t * v_stride + i];
        }
    }
}

/* The max over the block (every thread gets it); red: shared scratch of
 * PA_THREADS / NSTF_WAVE floats. */
static __device__ __forceinline__ float pa_block_max(float v, float *red) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int n_waves = PA_THREADS / NSTF_WAVE;
    v = wave_reduce_max(v);
    __syncthreads(); /* `red` may still be read by a previous call */
    if (lane == 0) red[wave] = v;
    __syncthreads();
    v = lane < n_waves ? red[lane] : -INFINITY;
    return wave_reduce_max(v);
}

/* The dot product of the shared q rows of the group's heads with key row
 * kr, one sequential fmaf chain over d per head (the order of the naive
 * same-precision sum); the row is read once for every head, 16 bytes at a
 * time where vec says the rows are 16-byte aligned. */
static __device__ __forceinline__ void pa_scores(const float (*qs)[PA_MAX_HD], const uint16_t *kr, int head_dim,
                                                 int G, bool vec, float *a) {
#pragma unroll
    for (int g = 0; g < PA_MAX_G; g++) a[g] = 0.0f;
    if (G == 0) return; /* no key here */
    if (vec) {
        for (int d0 = 0; d0 < head_dim; d0 += 8) {
            const uint4 w = *(const uint4 *)(kr + d0);
            const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int e = 0; e < 8; e++) {
                nstf_bf16 b;
                b.bits = (uint16_t)(e % 2 ? u[e / 2] >> 16 : u[e / 2] & 0xffffu);
                const float kv = nstf_bf16_to_float(b);
#pragma unroll
                for (int g = 0; g < PA_MAX_G; g++)
                    if (g < G) a[g] = fmaf(qs[g][d0 + e], kv, a[g]);
            }
        }
        return;
    }
    for (int d = 0; d < head_dim; d++) {
        const float kv = pa_bf16(kr + d);
#pragma unroll
        for (int g = 0; g < PA_MAX_G; g++)
            if (g < G) a[g] = fmaf(qs[g][d], kv, a[g]);
    }
}

__global__ void __launch_bounds__(PA_THREADS)
paged_attn_kernel(const uint16_t *__restrict__ q, int64_t q_stride, const uint16_t *__restrict__ kc,
                  const uint16_t *__restrict__ vc, uint16_t *__restrict__ out, int64_t out_stride,
                  const int32_t *__restrict__ pos, const int32_t *__restrict__ seq,
                  const int32_t *__restrict__ blocks, int64_t n_ctx, int n_seq, int n_heads, int n_kv_heads,
                  int head_dim, int block_size, int64_t n_blocks, float scale, int window, int vec) {
    __shared__ float qs[PA_MAX_G][PA_MAX_HD];
    __shared__ float ps[PA_MAX_G][PA_THREADS]; /* the tile's probabilities per head (0 for no key) */
    __shared__ int64_t rows[PA_THREADS];       /* the tile's pool rows (-1: no key) */
    __shared__ float red[32];                  /* block reductions (block_reduce_sum asks for 32) */
    const int64_t t = blockIdx.x;
    const int kvh = blockIdx.y, G = n_heads / n_kv_heads, h0 = kvh * G;
    const int64_t kvd = (int64_t)n_kv_heads * head_dim, bps = n_ctx / block_size;
    for (int i = threadIdx.x; i < G * head_dim; i += PA_THREADS)
        qs[i / head_dim][i % head_dim] = pa_bf16(q + t * q_stride + (int64_t)(h0 + i / head_dim) * head_dim + i % head_dim);
    const int32_t p_t = pos[t], s = seq ? seq[t] : 0;
    const int64_t n_keys = p_t < 0 || p_t >= n_ctx || s < 0 || s >= n_seq ? 0 : (int64_t)p_t + 1;
    /* a sliding window: the last `window` positions only */
    const int64_t j_first = window > 0 && n_keys > window ? n_keys - window : 0;
    float m[PA_MAX_G], l[PA_MAX_G], acc[PA_MAX_G][PA_DIMS];
#pragma unroll
    for (int g = 0; g < PA_MAX_G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int i = 0; i < PA_DIMS; i++) acc[g][i] = 0.0f;
    }
    __syncthreads();
    for (int64_t j0 = j_first; j0 < n_keys; j0 += PA_THREADS) {
        const int64_t j = j0 + threadIdx.x;
        const int64_t row = j < n_keys ? pa_row(blocks, bps, block_size, n_blocks, s, j) : -1;
        float sc[PA_MAX_G], corr[PA_MAX_G];
        pa_scores(qs, kc + (row >= 0 ? row : 0) * kvd + (int64_t)kvh * head_dim, head_dim, row >= 0 ? G : 0, vec != 0,
                  sc);
        rows[threadIdx.x] = row;
#pragma unroll
        for (int g = 0; g < PA_MAX_G; g++) {
            corr[g] = 1.0f;
            if (g < G) { /* G is the block's: every thread takes the barriers */
                const float sg = row >= 0 ? sc[g] * scale : -INFINITY;
                const float m_new = fmaxf(m[g], pa_block_max(sg, red));
                /* a tile of no keys at all leaves the state as it is */
                corr[g] = m_new == -INFINITY ? 1.0f : expf(m[g] - m_new);
                const float pj = sg == -INFINITY ? 0.0f : expf(sg - m_new);
                ps[g][threadIdx.x] = pj;
                l[g] = l[g] * corr[g] + block_reduce_sum(pj, red); /* its barriers also publish ps and rows */
                m[g] = m_new;
            }
        }
        const int64_t n_here = n_keys - j0 < PA_THREADS ? n_keys - j0 : PA_THREADS;
#pragma unroll
        for (int i = 0; i < PA_DIMS; i++) { /* no break: acc stays in registers */
            const int d = threadIdx.x + i * PA_THREADS;
            float a[PA_MAX_G];
#pragma unroll
            for (int g = 0; g < PA_MAX_G; g++) a[g] = g < G ? acc[g][i] * corr[g] : 0.0f;
            if (d < head_dim) {
                const uint16_t *vd = vc + (int64_t)kvh * head_dim + d;
                for (int jj = 0; jj < (int)n_here; jj++) {
                    const int64_t rr = rows[jj];
                    if (rr < 0) continue;
                    const float vv = pa_bf16(vd + rr * kvd);
#pragma unroll
                    for (int g = 0; g < PA_MAX_G; g++)
                        if (g < G) a[g] = fmaf(ps[g][jj], vv, a[g]);
                }
            }
#pragma unroll
            for (int g = 0; g < PA_MAX_G; g++) acc[g][i] = a[g];
        }
        __syncthreads(); /* ps and rows are rewritten by the next tile */
    }
#pragma unroll
    for (int g = 0; g < PA_MAX_G; g++) {
        if (g < G) {
            const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
            uint16_t *o = out + t * out_stride + (int64_t)(h0 + g) * head_dim;
#pragma unroll
            for (int i = 0; i < PA_DIMS; i++) {
                const int d = threadIdx.x + i * PA_THREADS;
                if (d < head_dim) o[d] = nstf_float_to_bf16(acc[g][i] * inv).bits;
            }
        }
    }
}

extern "C" nstf_status nstf_gpu_paged_attention(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                                int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                                uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                                int64_t out_stride, const int32_t *pos, const int32_t *seq,
                                                const int32_t *blocks, int64_t n_tok, int64_t n_ctx, int n_seq,
                                                int block_size, int64_t n_blocks, int n_heads, int n_kv_heads,
                                                int head_dim, float scale, int window, void *stream) {
    if (!q || !k || !v || !k_cache || !v_cache || !out || !pos || !blocks || n_tok < 0 || n_ctx < 1 || n_seq < 1 ||
        block_size < 1 || n_blocks < 1 || n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0 ||
        n_ctx % block_size != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_paged_attention: bad arguments (n_tok %lld, context %lld, blocks %lld of "
                              "%d, heads %d/%d)",
                              (long long)n_tok, (long long)n_ctx, (long long)n_blocks, block_size, n_heads,
                              n_kv_heads);
    if (head_dim < 2 || head_dim > PA_MAX_HD || head_dim % 2 != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_paged_attention: head_dim %d (2..%d, even)", head_dim,
                              PA_MAX_HD);
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    if (q_stride < (int64_t)n_heads * head_dim || out_stride < (int64_t)n_heads * head_dim || k_stride < kvd ||
        v_stride < kvd)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_paged_attention: a row stride is shorter than its row");
    if (n_heads / n_kv_heads > PA_MAX_G)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_paged_attention: %d query heads per kv head (at most %d)",
                              n_heads / n_kv_heads, PA_MAX_G);
    if (n_tok > 0x7fffffff || n_heads > NSTF_GPU_MAX_GRID)
        return nstf_set_error(NSTF_ERR_RANGE, "nstf_gpu_paged_attention: %lld tokens x %d heads is too large a grid",
                              (long long)n_tok, n_heads);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t st = (gpuStream_t)stream;
    const unsigned wgrid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    paged_kv_write_kernel<<<wgrid, PA_THREADS, 0, st>>>(k, k_stride, v, v_stride, k_cache, v_cache, pos, seq, blocks,
                                                        n_tok, kvd, n_ctx, n_seq, block_size, n_blocks);
    GPU_LAUNCH_CHECK(st);
    const dim3 grid((unsigned)n_tok, (unsigned)n_kv_heads);
    const int vec = head_dim % 8 == 0 && kvd % 8 == 0 && (uintptr_t)k_cache % 16 == 0; /* 16-byte key rows */
    paged_attn_kernel<<<grid, PA_THREADS, 0, st>>>(q, q_stride, k_cache, v_cache, out, out_stride, pos, seq, blocks,
                                                   n_ctx, n_seq, n_heads, n_kv_heads, head_dim, block_size,
                                                   n_blocks, scale, window, vec);
    GPU_LAUNCH_CHECK(st);
    return NSTF_OK;
}
