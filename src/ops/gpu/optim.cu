/* optim.cu — the optimizer step on the device: AdamW over the flat fp32
 * arrays (master weights, gradients, moments) in one fused pass that also
 * rewrites the bf16 compute copy of the weights, and the per-tensor sums
 * of squares of the gradients (the global norm, its NaN/Inf check).
 *
 * AdamW (adamw_kernel): grid-stride over a run of tensors that share the
 * weight-decay flag (the launcher makes one launch per such run: a layout
 * that puts matrices first and norms last is two launches), fp32
 * arithmetic in the order of torch's single-tensor AdamW (as
 * nstf_cpu_adamw), the per-step scalars formed in double on the host.
 *
 * Gradient norm: the host cuts every tensor into pieces of at most
 * GN_PIECE elements (a work list uploaded with the call); gn_piece_kernel
 * sums the squares of one piece per block in double (a fixed reduction
 * tree), gn_tensor_kernel adds a tensor's pieces in order. Deterministic;
 * no atomics. */
#include <math.h>
#include <stdlib.h>

#include "gpu.h"

#include "ops/optim.h"

#define OPT_THREADS 256
#define GN_PIECE 65536

__global__ void __launch_bounds__(OPT_THREADS)
    adamw_kernel(float *__restrict__ w, const float *__restrict__ grad, float *__restrict__ m,
                 float *__restrict__ v, uint16_t *__restrict__ w16, int64_t i0, int64_t n, float dm, float a1,
                 float b2, float a2, float bc2, float eps, float step, float gs, int decay) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += stride) {
        const int64_t i = i0 + k;
        const float g = grad[i] * gs;
        const float wi = decay ? w[i] * dm : w[i];
        const float mi = m[i] + a1 * (g - m[i]);
        const float vi = v[i] * b2 + a2 * g * g;
        const float den = nstf_sqrtf(vi) / bc2 + eps;
        const float wn = wi + step * mi / den;
        w[i] = wn;
        m[i] = mi;
        v[i] = vi;
        if (w16) w16[i] = nstf_float_to_bf16(wn).bits;
    }
}

extern "C" nstf_status nstf_gpu_adamw(const nstf_adamw_params *p, int64_t step, float grad_scale,
                                      const nstf_param_tensor *tensors, int n_tensors, float *w, const float *grad,
                                      float *m, float *v, uint16_t *w_bf16, void *stream) {
    if (!p || !tensors || n_tensors < 0 || !w || !grad || !m || !v || step < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_adamw: bad arguments (step %lld)", (long long)step);
    gpuStream_t s = (gpuStream_t)stream;
    /* the per-step scalars in double, as nstf_cpu_adamw */
    const double decay_mul = 1.0 - p->lr * p->weight_decay, step_size = p->lr / (1.0 - pow(p->beta1, (double)step));
    const double bc2 = sqrt(1.0 - pow(p->beta2, (double)step));
    for (int i = 0; i < n_tensors;) {
        /* a run of tensors back to back with one decay flag */
        int j = i + 1;
        while (j < n_tensors && tensors[j].decay == tensors[i].decay &&
               tensors[j].offset == tensors[j - 1].offset + tensors[j - 1].n)
            j++;
        const int64_t i0 = tensors[i].offset, n = tensors[j - 1].offset + tensors[j - 1].n - i0;
        if (n > 0) {
            const int64_t blocks = (n + OPT_THREADS - 1) / OPT_THREADS;
            const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
            adamw_kernel<<<grid, OPT_THREADS, 0, s>>>(w, grad, m, v, w_bf16, i0, n, (float)decay_mul,
                                                      (float)(1.0 - p->beta1), (float)p->beta2,
                                                      (float)(1.0 - p->beta2), (float)bc2, (float)p->eps,
                                                      (float)-step_size, grad_scale, (int)tensors[i].decay);
            GPU_LAUNCH_CHECK(s);
        }
        i = j;
    }
    return NSTF_OK;
}

/* one block per piece: sum of squares in double */
__global__ void __launch_bounds__(OPT_THREADS)
    gn_piece_kernel(const float *__restrict__ grad, const int64_t *__restrict__ pieces, double *__restrict__ part) {
    __shared__ double red[OPT_THREADS];
    const int64_t p = blockIdx.x, i0 = pieces[2 * p], n = pieces[2 * p + 1];
    double acc = 0.0;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        const double g = grad[i0 + k];
        acc += g * g;
    }
    red[threadIdx.x] = acc;
    __syncthreads();
    for (int o = OPT_THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) part[p] = red[0];
}

/* thread per tensor: its pieces [first[t], first[t + 1]) in order */
__global__ void __launch_bounds__(OPT_THREADS)
    gn_tensor_kernel(const double *__restrict__ part, const int64_t *__restrict__ first, double *__restrict__ sq,
                     int n_tensors) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tensors) return;
    double s = 0.0;
    for (int64_t p = first[t]; p < first[t + 1]; p++) s += part[p];
    sq[t] = s;
}

static int64_t gn_pieces(const nstf_param_tensor *t, int n) {
    int64_t k = 0;
    for (int i = 0; i < n; i++) k += (t[i].n + GN_PIECE - 1) / GN_PIECE;
    return k;
}

extern "C" size_t nstf_gpu_grad_norm_scratch_bytes(const nstf_param_tensor *tensors, int n_tensors) {
    const int64_t k = gn_pieces(tensors, n_tensors);
    /* pieces (2 int64 each), their sums, first piece per tensor (+1), sums per tensor */
    return (size_t)(3 * k + (n_tensors + 1) + n_tensors) * 8;
}

extern "C" nstf_status nstf_gpu_grad_norm(const nstf_param_tensor *tensors, int n_tensors, const float *grad,
                                          double *sq, void *scratch, size_t scratch_bytes, void *stream) {
    if (!tensors || n_tensors <= 0 || !grad || !sq || !scratch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_grad_norm: bad arguments (%d tensors)", n_tensors);
    if (scratch_bytes < nstf_gpu_grad_norm_scratch_bytes(tensors, n_tensors))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_grad_norm: scratch of %zu bytes is too small",
                              scratch_bytes);
    const int64_t k = gn_pieces(tensors, n_tensors);
    const size_t list_bytes = (size_t)(2 * k + n_tensors + 1) * 8;
    int64_t *host = (int64_t *)malloc(list_bytes);
    if (!host) return nstf_set_error(NSTF_ERR_OOM, "nstf_gpu_grad_norm: %zu bytes for the work list", list_bytes);
    int64_t *first = host + 2 * k, at = 0;
    for (int i = 0; i < n_tensors; i++) {
        first[i] = at;
        for (int64_t o = 0; o < tensors[i].n; o += GN_PIECE, at++) {
            host[2 * at] = tensors[i].offset + o;
            host[2 * at + 1] = tensors[i].n - o < GN_PIECE ? tensors[i].n - o : GN_PIECE;
        }
    }
    first[n_tensors] = at;
    int64_t *d_list = (int64_t *)scratch, *d_first = d_list + 2 * k;
    double *d_part = (double *)(d_first + n_tensors + 1), *d_sq = d_part + k;
    nstf_status st = nstf_gpu_memcpy_h2d(d_list, host, list_bytes, stream);
    free(host);
    NSTF_TRY(st);
    gpuStream_t s = (gpuStream_t)stream;
    if (k > 0) {
        gn_piece_kernel<<<(unsigned)k, OPT_THREADS, 0, s>>>(grad, d_list, d_part);
        GPU_LAUNCH_CHECK(s);
    }
    gn_tensor_kernel<<<(unsigned)((n_tensors + OPT_THREADS - 1) / OPT_THREADS), OPT_THREADS, 0, s>>>(
        d_part, d_first, d_sq, n_tensors);
    GPU_LAUNCH_CHECK(s);
    return nstf_gpu_memcpy_d2h(sq, d_sq, (size_t)n_tensors * sizeof(double), stream);
}
