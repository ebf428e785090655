/* argmax.cu — greedy sampling: out[r] = argmax_j x[r, j] over logits
 * (F32 or BF16), first index on ties, NaN never wins. Two passes:
 * (1) blocks of 256 threads reduce ARGMAX_SEG-element segments of a row to
 * (value, index) pairs in scratch; (2) one block per row reduces those.
 * Both use the same order-independent comparison, so the result does not
 * depend on the launch shape: (v, i) beats (bv, bi) when v > bv, or
 * v == bv and i < bi. */
#include "gpu.h"

#include <limits.h>

#define ARGMAX_THREADS 256
#define ARGMAX_SEG 8192

struct am_pair {
    float v;
    int32_t i;
};

static __device__ __forceinline__ void am_merge(float &bv, int32_t &bi, float v, int32_t i) {
    if (nstf_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
}

/* Block-wide (value, index) reduction; every thread gets the result. */
static __device__ __forceinline__ void am_block_reduce(float &bv, int32_t &bi, am_pair *red) {
#pragma unroll
    NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) {
        const float v = NSTF_SHFL_XOR(bv, o);
        const int32_t i = NSTF_SHFL_XOR(bi, o);
        am_merge(bv, bi, v, i);
    }
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int n_waves = blockDim.x / NSTF_WAVE;
    if (lane == 0) red[wave] = am_pair{bv, bi};
    __syncthreads();
    bv = -INFINITY;
    bi = INT_MAX;
    if (lane < n_waves) { bv = red[lane].v; bi = red[lane].i; }
#pragma unroll
    NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) {
        const float v = NSTF_SHFL_XOR(bv, o);
        const int32_t i = NSTF_SHFL_XOR(bi, o);
        am_merge(bv, bi, v, i);
    }
}

template <bool BF16>
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_pass1(const void *__restrict__ x, am_pair *__restrict__ part, int64_t n, int n_seg) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    __shared__ am_pair red[32];
    const int64_t row = blockIdx.y;
    const int64_t j0 = (int64_t)blockIdx.x * ARGMAX_SEG;
    const int64_t j1 = j0 + ARGMAX_SEG < n ? j0 + ARGMAX_SEG : n;
    float bv = -INFINITY;
    int32_t bi = INT_MAX;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        const float v = BF16 ? nstf_bf16_to_float(((const nstf_bf16 *)x)[row * n + j])
                             : ((const float *)x)[row * n + j];
        am_merge(bv, bi, v, (int32_t)j);
    }
    am_block_reduce(bv, bi, red);
    if (threadIdx.x == 0) part[row * n_seg + blockIdx.x] = am_pair{bv, bi};
}

__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_pass2(const am_pair *__restrict__ part, int32_t *__restrict__ out, int n_seg) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    __shared__ am_pair red[32];
    const int64_t row = blockIdx.x;
    float bv = -INFINITY;
    int32_t bi = INT_MAX;
    for (int s = threadIdx.x; s < n_seg; s += blockDim.x) {
        const am_pair p = part[row * n_seg + s];
        am_merge(bv, bi, p.v, p.i);
    }
    am_block_reduce(bv, bi, red);
    if (threadIdx.x == 0) out[row] = bi == INT_MAX ? 0 : bi;
}

extern "C" size_t nstf_gpu_argmax_scratch_bytes(int64_t n_rows, int64_t n) {
    if (n_rows <= 0 || n <= 0) return 0;
    const int64_t n_seg = (n + ARGMAX_SEG - 1) / ARGMAX_SEG;
    return (size_t)(n_rows * n_seg) * sizeof(am_pair);
}

extern "C" nstf_status nstf_gpu_argmax(const void *x, nstf_type x_type, int32_t *out,
                                       int64_t n_rows, int64_t n, void *scratch, void *stream) {
    if (!x || !out || n_rows < 0 || n <= 0 || n > INT32_MAX || n_rows > 65535 || (n_rows && !scratch))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_argmax: bad arguments (n_rows %lld, n %lld, scratch %p)",
                              (long long)n_rows, (long long)n, scratch);
    if (x_type != NSTF_TYPE_F32 && x_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_argmax: input type %s (F32 or BF16)",
                              nstf_type_name(x_type));
    if (n_rows == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int n_seg = (int)((n + ARGMAX_SEG - 1) / ARGMAX_SEG);
    am_pair *part = (am_pair *)scratch;
    dim3 g1((unsigned)n_seg, (unsigned)n_rows);
    const int pdl = nstf_gpu_pdl();
    GPU_CHECK(nstf_gpu_launch(x_type == NSTF_TYPE_BF16 ? argmax_pass1<true> : argmax_pass1<false>, g1,
                              dim3(ARGMAX_THREADS), 0, s, pdl, x, part, n, n_seg));
    GPU_LAUNCH_CHECK(s);
    GPU_CHECK(nstf_gpu_launch(argmax_pass2, dim3((unsigned)n_rows), dim3(ARGMAX_THREADS), 0, s, pdl,
                              (const am_pair *)part, out, n_seg));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
