/* swiglu.cu — y = silu(gate) * up = gate / (1 + exp(-gate)) * up, bf16 in
 * and out, fp32 math (nstf_swiglu1, shared with the fused GEMV epilogue).
 *
 * nstf_gpu_swiglu (separate planes): grid-stride, two elements per
 * thread-step through 32-bit loads when the three pointers are 4-byte
 * aligned.
 * nstf_gpu_swiglu_rows (each token's gate | up in one row of 2 ffn, one GEMM
 * over the adjacent matrices): blocks of (ffn / VEC threads, tokens), each
 * thread VEC elements of a token per step, VEC = 8 (16-byte accesses) when
 * ffn and the pointers allow, down to 1 (2-byte accesses, any ffn and
 * alignment); 32-bit index math inside a row, 64-bit token offsets. */
#include "gpu.h"
#include "fused_math.h"

#include <limits.h>

#define SWIGLU_THREADS 256

/* silu(g) * u of the two bf16 in a word each (element 0 in the low half). */
static __device__ __forceinline__ uint32_t swiglu_word(uint32_t g, uint32_t u) {
    const nstf_bf16 lo = nstf_float_to_bf16(nstf_swiglu1(nstf_bf16lo_to_float(g), nstf_bf16lo_to_float(u)));
    const nstf_bf16 hi = nstf_float_to_bf16(nstf_swiglu1(nstf_bf16hi_to_float(g), nstf_bf16hi_to_float(u)));
    return (uint32_t)lo.bits | (uint32_t)hi.bits << 16;
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_kernel(const nstf_bf16 *__restrict__ gate, const nstf_bf16 *__restrict__ up,
              nstf_bf16 *__restrict__ y, int64_t n) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = nstf_float_to_bf16(nstf_swiglu1(nstf_bf16_to_float(gate[i]), nstf_bf16_to_float(up[i])));
}

__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_kernel2(const uint32_t *__restrict__ gate, const uint32_t *__restrict__ up,
               uint32_t *__restrict__ y, int64_t n2) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += stride)
        y[i] = swiglu_word(gate[i], up[i]);
}

/* h [n_tok, 2 ffn]: gate at h[t, c], up at h[t, ffn + c]; y [n_tok, ffn].
 * threadIdx.x: the VEC-element chunk (looping when a row has more chunks
 * than the block is wide), threadIdx.y: the token within the block. */
template <int VEC>
__global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu_kernel_rows(const nstf_bf16 *__restrict__ h, nstf_bf16 *__restrict__ y, int64_t n_tok, int ffn) {
    constexpr int NW = (VEC + 1) / 2;
    const int n_ch = ffn / VEC;
    const int64_t step = (int64_t)gridDim.x * blockDim.y;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; t < n_tok; t += step) {
        const nstf_bf16 *gt = h + t * 2 * ffn;
        nstf_bf16 *yt = y + t * ffn;
        for (int c = threadIdx.x; c < n_ch; c += blockDim.x) {
            uint32_t g[NW], u[NW], o[NW];
            nstf_bf16_ldv<VEC>(gt + c * VEC, g);
            nstf_bf16_ldv<VEC>(gt + ffn + c * VEC, u);
#pragma unroll
            for (int j = 0; j < NW; j++) o[j] = swiglu_word(g[j], u[j]);
            nstf_bf16_stv<VEC>(yt + c * VEC, o);
        }
    }
}

extern "C" nstf_status nstf_gpu_swiglu(const uint16_t *gate, const uint16_t *up, uint16_t *y,
                                       int64_t n, void *stream) {
    if (!gate || !up || !y || n < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_swiglu: bad arguments (n %lld)",
                              (long long)n);
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const bool pair = n % 2 == 0 && ((uintptr_t)gate | (uintptr_t)up | (uintptr_t)y) % 4 == 0;
    const int64_t work = pair ? n / 2 : n;
    int64_t blocks = (work + SWIGLU_THREADS - 1) / SWIGLU_THREADS;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    if (pair)
        swiglu_kernel2<<<grid, SWIGLU_THREADS, 0, s>>>((const uint32_t *)gate, (const uint32_t *)up,
                                                      (uint32_t *)y, work);
    else
        swiglu_kernel<<<grid, SWIGLU_THREADS, 0, s>>>((const nstf_bf16 *)gate, (const nstf_bf16 *)up,
                                                     (nstf_bf16 *)y, n);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_swiglu_rows(const uint16_t *h, uint16_t *y, int64_t n_tok, int64_t ffn,
                                            void *stream) {
    if (!h || !y || n_tok < 0 || ffn < 1 || ffn > INT_MAX / 2)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_swiglu_rows: bad arguments (n_tok %lld, ffn %lld)",
                              (long long)n_tok, (long long)ffn);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    /* every row start: h at 4 ffn bytes a token, up 2 ffn bytes on, y at 2 ffn */
    const nstf_rows_launch l = nstf_bf16_rows_launch((uintptr_t)h | (uintptr_t)y, ffn, n_tok, SWIGLU_THREADS);
    const nstf_bf16 *hb = (const nstf_bf16 *)h;
    nstf_bf16 *yb = (nstf_bf16 *)y;
    if (l.vec == 8)
        swiglu_kernel_rows<8><<<l.grid, l.block, 0, s>>>(hb, yb, n_tok, (int)ffn);
    else if (l.vec == 4)
        swiglu_kernel_rows<4><<<l.grid, l.block, 0, s>>>(hb, yb, n_tok, (int)ffn);
    else if (l.vec == 2)
        swiglu_kernel_rows<2><<<l.grid, l.block, 0, s>>>(hb, yb, n_tok, (int)ffn);
    else
        swiglu_kernel_rows<1><<<l.grid, l.block, 0, s>>>(hb, yb, n_tok, (int)ffn);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
