/* bias.cu — a projection's bias added in place: x[t, i] = bf16(x[t, i] +
 * b[i]) for the rows of one matrix of a q | k | v group (Qwen2's QKV bias),
 * rows of `width` at a token stride. One thread per element, grid-stride;
 * b is fp32 as every vector of the model. */
#include "gpu.h"

#define BIAS_THREADS 256

__global__ void __launch_bounds__(BIAS_THREADS)
bias_kernel(nstf_bf16 *__restrict__ x, int64_t stride, const float *__restrict__ b, int64_t n_tok, int64_t width) {
    const int64_t n = n_tok * width, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const int64_t t = i / width, c = i - t * width;
        nstf_bf16 *p = x + t * stride + c;
        *p = nstf_float_to_bf16(nstf_bf16_to_float(*p) + b[c]);
    }
}

extern "C" nstf_status nstf_gpu_bias(uint16_t *x, int64_t stride, const float *b, int64_t n_tok, int64_t width,
                                     void *stream) {
    if (!x || !b || n_tok < 0 || width <= 0 || stride < width)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_bias: bad arguments (n_tok %lld, width %lld, stride %lld)",
                              (long long)n_tok, (long long)width, (long long)stride);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int64_t blocks = (n_tok * width + BIAS_THREADS - 1) / BIAS_THREADS;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    bias_kernel<<<grid, BIAS_THREADS, 0, s>>>((nstf_bf16 *)x, stride, b, n_tok, width);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
