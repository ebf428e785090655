/* rmsnorm_bwd.cu — the backward of y = x * r * w, r = rsqrt(mean(x^2) + eps):
 *   dx[t] += r dy w - x r^3 c / dim,  c = sum_i dy_i w_i x_i   (added into the
 *            residual stream's gradient; optionally copied to bf16 for the
 *            GEMMs that read it next)
 *   dw    += sum over rows of dy x r
 * x, dx fp32 (the residual stream and its gradient), dy fp32, w fp32.
 *
 * rmsnorm_bwd_rows: one block per row (grid-stride), two block reductions
 * (sum x^2 and c), then dx; it leaves each row's r in the scratch.
 * rmsnorm_bwd_cols: dw without atomics, so deterministic: blocks of 256
 * columns x RB_CHUNKS row chunks, each thread summing its column over its
 * chunk's rows in order into partials [RB_CHUNKS, dim]; rmsnorm_bwd_sum adds
 * the partials of a column in chunk order into dw. */
#include "gpu.h"

#define RB_THREADS 256
#define RB_CHUNKS 64

__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_rows(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ dy,
                     float *__restrict__ dx, nstf_bf16 *__restrict__ dx_bf16, int64_t dxb_stride,
                     float *__restrict__ r_out, int64_t n, int64_t dim, float eps) {
    __shared__ float red[32];
    for (int64_t t = blockIdx.x; t < n; t += gridDim.x) {
        const float *xt = x + t * dim, *dyt = dy + t * dim;
        float ss = 0.0f, cs = 0.0f;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float xi = xt[i];
            ss = fmaf(xi, xi, ss);
            cs = fmaf(dyt[i] * w[i], xi, cs);
        }
        ss = block_reduce_sum(ss, red);
        cs = block_reduce_sum(cs, red);
        const float r = nstf_fast_rsqrtf(ss / (float)dim + eps);
        const float k = r * r * r * cs / (float)dim;
        float *dxt = dx + t * dim;
        for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
            const float v = dxt[i] + (r * dyt[i] * w[i] - xt[i] * k);
            dxt[i] = v;
            if (dx_bf16) dx_bf16[t * dxb_stride + i] = nstf_float_to_bf16(v);
        }
        if (threadIdx.x == 0 && r_out) r_out[t] = r;
    }
}

__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_cols(const float *__restrict__ x, const float *__restrict__ dy, const float *__restrict__ r,
                     float *__restrict__ part, int64_t n, int64_t dim) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int chunk = blockIdx.y;
    const int64_t per = (n + RB_CHUNKS - 1) / RB_CHUNKS, t0 = chunk * per, t1 = t0 + per < n ? t0 + per : n;
    if (i >= dim) return;
    float s = 0.0f;
    for (int64_t t = t0; t < t1; t++) s = fmaf(dy[t * dim + i] * x[t * dim + i], r[t], s);
    part[(int64_t)chunk * dim + i] = s;
}

__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_sum(const float *__restrict__ part, float *__restrict__ dw, int64_t dim) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    float s = 0.0f;
    for (int c = 0; c < RB_CHUNKS; c++) s += part[(int64_t)c * dim + i];
    dw[i] += s;
}

extern "C" size_t nstf_gpu_rmsnorm_bwd_scratch_bytes(int64_t n, int64_t dim) {
    return ((size_t)n + (size_t)RB_CHUNKS * (size_t)dim) * sizeof(float);
}

extern "C" nstf_status nstf_gpu_rmsnorm_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                            uint16_t *dx_bf16, int64_t dxb_stride, int64_t n, int64_t dim,
                                            float eps, void *scratch, size_t scratch_bytes, void *stream) {
    if (!x || !w || !dy || !dx || n < 0 || dim <= 0 || !(eps >= 0.0f) || (dx_bf16 && dxb_stride < dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rmsnorm_bwd: bad arguments (n %lld, dim %lld)",
                              (long long)n, (long long)dim);
    if (dw && (!scratch || scratch_bytes < nstf_gpu_rmsnorm_bwd_scratch_bytes(n, dim)))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rmsnorm_bwd: scratch of %zu bytes is too small",
                              scratch_bytes);
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    float *r = dw ? (float *)scratch : NULL, *part = r ? r + n : NULL;
    const unsigned grid = (unsigned)(n < NSTF_GPU_MAX_GRID ? n : NSTF_GPU_MAX_GRID);
    rmsnorm_bwd_rows<<<grid, RB_THREADS, 0, s>>>(x, w, dy, dx, (nstf_bf16 *)dx_bf16, dxb_stride, r, n, dim, eps);
    GPU_LAUNCH_CHECK(s);
    if (!dw) return NSTF_OK;
    const unsigned cb = (unsigned)((dim + RB_THREADS - 1) / RB_THREADS);
    rmsnorm_bwd_cols<<<dim3(cb, RB_CHUNKS), RB_THREADS, 0, s>>>(x, dy, r, part, n, dim);
    GPU_LAUNCH_CHECK(s);
    rmsnorm_bwd_sum<<<cb, RB_THREADS, 0, s>>>(part, dw, dim);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
