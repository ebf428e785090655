/* swiglu.cu — y = silu(gate) * up = gate / (1 + exp(-gate)) * up, bf16 in
 * and out, fp32 math. Grid-stride, two elements per thread-step through
 * 32-bit loads when the three pointers are 4-byte aligned. */
#include "gpu.h"
#include "fused_math.h"

#define SWIGLU_THREADS 256

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
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n2; i += stride) {
        const uint32_t g = gate[i], u = up[i];
        const nstf_bf16 lo = nstf_float_to_bf16(nstf_swiglu1(nstf_bf16lo_to_float(g), nstf_bf16lo_to_float(u)));
        const nstf_bf16 hi = nstf_float_to_bf16(nstf_swiglu1(nstf_bf16hi_to_float(g), nstf_bf16hi_to_float(u)));
        y[i] = (uint32_t)lo.bits | ((uint32_t)hi.bits << 16);
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
