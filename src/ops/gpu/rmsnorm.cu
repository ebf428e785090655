/* rmsnorm.cu — the residual add fused into RMSNorm:
 *   x[t] += res[t] (optional, x fp32 in place);  y[t] = bf16(x[t] * rsqrt(mean(x[t]^2) + eps) * w)
 * One block per token (grid-stride over tokens). Pass 1 adds the residual,
 * writes x back and sums squares (fp32 per thread, then a block
 * reduction); pass 2 re-reads x (now in L1/L2) and writes y. The residual
 * stream is fp32: see nstf_gpu_rmsnorm in gpu_api.h for why. */
#include "gpu.h"

#define RMSNORM_THREADS 256

template <int RES> /* 0: none, 1: F32, 2: BF16 */
__global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_kernel(float *__restrict__ x, const void *__restrict__ res, const float *__restrict__ w,
               nstf_bf16 *__restrict__ y, int64_t n_tok, int64_t dim, float eps) {
    __shared__ float red[32];
    for (int64_t t = blockIdx.x; t < n_tok; t += gridDim.x) {
        float *xt = x + t * dim;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            float v = xt[i];
            if (RES == 1) v += ((const float *)res)[t * dim + i];
            if (RES == 2) v += nstf_bf16_to_float(((const nstf_bf16 *)res)[t * dim + i]);
            if (RES) xt[i] = v;
            ss = fmaf(v, v, ss);
        }
        ss = block_reduce_sum(ss, red);
        const float r = nstf_fast_rsqrtf(ss / (float)dim + eps);
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x)
            y[t * dim + i] = nstf_float_to_bf16(xt[i] * r * w[i]);
    }
}

extern "C" nstf_status nstf_gpu_rmsnorm(float *x, const void *res, nstf_type res_type,
                                        const float *w, uint16_t *y, int64_t n_tok, int64_t dim,
                                        float eps, void *stream) {
    if (!x || !w || !y || n_tok < 0 || dim <= 0 || !(eps >= 0.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_rmsnorm: bad arguments (n_tok %lld, dim %lld, eps %g)",
                              (long long)n_tok, (long long)dim, (double)eps);
    if (res && res_type != NSTF_TYPE_F32 && res_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_rmsnorm: residual type %s (F32 or BF16)",
                              nstf_type_name(res_type));
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const unsigned grid = (unsigned)(n_tok < NSTF_GPU_MAX_GRID ? n_tok : NSTF_GPU_MAX_GRID);
    nstf_bf16 *yb = (nstf_bf16 *)y;
    if (!res)
        rmsnorm_kernel<0><<<grid, RMSNORM_THREADS, 0, s>>>(x, res, w, yb, n_tok, dim, eps);
    else if (res_type == NSTF_TYPE_F32)
        rmsnorm_kernel<1><<<grid, RMSNORM_THREADS, 0, s>>>(x, res, w, yb, n_tok, dim, eps);
    else
        rmsnorm_kernel<2><<<grid, RMSNORM_THREADS, 0, s>>>(x, res, w, yb, n_tok, dim, eps);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
