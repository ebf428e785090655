/* swiglu_bwd.cu — the backward of y = silu(gate) * up, elementwise:
 *   dgate = dy up s (1 + gate (1 - s)),  dup = dy gate s,  s = sigmoid(gate)
 * bf16 in and out, fp32 math. Rows of n_ff elements with their own token
 * strides, so gate | up in one row per token (one GEMM over the adjacent
 * matrices) and separate planes both work. Grid-stride over elements. */
#include "gpu.h"

#define SWB_THREADS 256

__global__ void __launch_bounds__(SWB_THREADS)
    swiglu_bwd_kernel(const nstf_bf16 *__restrict__ gate, int64_t gs, const nstf_bf16 *__restrict__ up, int64_t us,
                      const nstf_bf16 *__restrict__ dy, int64_t ds, nstf_bf16 *dgate, int64_t dgs, nstf_bf16 *dup,
                      int64_t dus, int64_t n, int64_t n_ff) {
    const int64_t total = n * n_ff, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += step) {
        const int64_t t = i / n_ff, c = i % n_ff;
        const float g = nstf_bf16_to_float(gate[t * gs + c]), u = nstf_bf16_to_float(up[t * us + c]);
        const float d = nstf_bf16_to_float(dy[t * ds + c]);
        const float sg = 1.0f / (1.0f + nstf_fast_exp2f(-1.4426950408889634f * g));
        /* outputs may alias inputs of the same element: all read above */
        dgate[t * dgs + c] = nstf_float_to_bf16(d * u * sg * (1.0f + g * (1.0f - sg)));
        dup[t * dus + c] = nstf_float_to_bf16(d * g * sg);
    }
}

extern "C" nstf_status nstf_gpu_swiglu_bwd(const uint16_t *gate, int64_t gate_stride, const uint16_t *up,
                                           int64_t up_stride, const uint16_t *dy, int64_t dy_stride,
                                           uint16_t *dgate, int64_t dgate_stride, uint16_t *dup,
                                           int64_t dup_stride, int64_t n, int64_t n_ff, void *stream) {
    if (!gate || !up || !dy || !dgate || !dup || n < 0 || n_ff <= 0 || gate_stride < n_ff || up_stride < n_ff ||
        dy_stride < n_ff || dgate_stride < n_ff || dup_stride < n_ff)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_swiglu_bwd: bad arguments (n %lld, n_ff %lld)",
                              (long long)n, (long long)n_ff);
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int64_t blocks = (n * n_ff + SWB_THREADS - 1) / SWB_THREADS;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    swiglu_bwd_kernel<<<grid, SWB_THREADS, 0, s>>>((const nstf_bf16 *)gate, gate_stride, (const nstf_bf16 *)up,
                                                   up_stride, (const nstf_bf16 *)dy, dy_stride, (nstf_bf16 *)dgate,
                                                   dgate_stride, (nstf_bf16 *)dup, dup_stride, n, n_ff);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
