/* rmsnorm_bwd.cu — the backward of y = x * r * w, r = rsqrt(mean(x^2) + eps):
 *   dx[t] += r dy w - x r^3 c / dim,  c = sum_i dy_i w_i x_i   (added into the
 *            residual stream's gradient; optionally copied to bf16 for the
 *            GEMMs that read it next)
 *   dw    += sum over rows of dy x r
 * x, dx fp32 (the residual stream and its gradient), dy fp32, w fp32.
 *
 * Rows come in chunks of consecutive rows (rb_chunk: at most RB_MAX_CHUNKS
 * of them, a function of n only); dw is summed without atomics, so
 * deterministically: a column's partial sum over a chunk's rows lands in
 * part[chunk, :], and rmsnorm_bwd_sum adds a column's partials in chunk
 * order (an order that depends on n, dim and the wave width, never on
 * the scheduling).
 *
 * rmsnorm_bwd_rows (dim <= RB_REG_MAX): one block per chunk, one wave per
 * row (the block's waves take the chunk's rows in turn); lane l takes the
 * VEC-float vectors l + NSTF_WAVE s (float4 on NVIDIA when dim and the
 * pointers allow, else single floats). On NVIDIA the first pass reads x, dy and dx
 * at once and keeps them in registers through the two wave reductions
 * (sum x^2 and c), so a row is one trip to memory; on AMD the second pass
 * re-reads x and dy (in L1/L2). Each lane also sums dy x r of its columns
 * over its rows in registers; the block adds its waves' sums in wave
 * order (shared memory) into the chunk's partial row.
 * rmsnorm_bwd_loop (longer rows): one wave per row by loops, the second
 * re-reading x and dy (in L1/L2) for dx; it leaves each row's r in the
 * scratch, and rmsnorm_bwd_cols sums each column over a chunk's rows in
 * order into part. */
#include "gpu.h"

#include <limits.h>

#define RB_THREADS 256
#define RB_MAX_CHUNKS 512 /* row chunks: blocks of rmsnorm_bwd_rows, partial rows of dw */
/* The longest row rmsnorm_bwd_rows takes: 24 floats of x, dy, dx and of
 * dw's partials a lane at 32-lane waves. Its access width: float4 on
 * NVIDIA; single floats on AMD, where the float4 instances would spill on
 * gfx90a at full occupancy (64 registers a lane; docs/amd_gates.tsv). */
#define RB_REG_MAX 768
#if defined(NSTF_GPU_HIP)
#define RB_ROWS_VEC 1
#else
#define RB_ROWS_VEC 4
#endif
#define RB_SUM_COLS 8     /* rmsnorm_bwd_sum: a block's columns (one 32-byte sector) ... */
#define RB_SUM_GROUPS (RB_THREADS / RB_SUM_COLS) /* ... and its groups of chunks */

/* Full occupancy on AMD (8 waves a SIMD on CDNA, 16 on RDNA3; the gates of
 * docs/amd_gates.tsv) for the kernel that keeps rows in registers: without
 * the bound the compiler hoists loads into more registers than that
 * leaves. HIP's second launch bound is waves per SIMD; CUDA's (blocks per
 * SM) is not wanted. */
#if defined(NSTF_GPU_HIP)
#define RB_ROWS_BOUNDS __launch_bounds__(RB_THREADS, NSTF_WAVE == 64 ? 8 : 16)
#else
#define RB_ROWS_BOUNDS __launch_bounds__(RB_THREADS)
#endif

/* A row's r = rsqrt(mean(x^2) + eps) and k = r^3 c / dim from a lane's
 * parts of sum x^2 (ss) and c = sum dy w x (cs), summed over the wave. */
static __device__ __forceinline__ void rb_factors(float ss, float cs, int dim, float eps, float &r, float &k) {
    ss = wave_reduce_sum(ss);
    cs = wave_reduce_sum(cs);
    r = nstf_fast_rsqrtf(ss / (float)dim + eps);
    k = r * r * r * cs / (float)dim;
}

/* VEC floats at p, one aligned access. */
template <int VEC>
static __device__ __forceinline__ void rb_ld(const float *p, float (&v)[VEC]) {
    if constexpr (VEC == 4) {
        const float4 u = *(const float4 *)p;
        v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
    } else {
        v[0] = p[0];
    }
}

template <int VEC>
static __device__ __forceinline__ void rb_st(float *p, const float (&v)[VEC]) {
    if constexpr (VEC == 4)
        *(float4 *)p = make_float4(v[0], v[1], v[2], v[3]);
    else
        p[0] = v[0];
}

template <int VEC>
static __device__ __forceinline__ void rb_st_bf16(nstf_bf16 *p, const float (&v)[VEC]) {
    if constexpr (VEC == 4) {
        const uint32_t a = (uint32_t)nstf_float_to_bf16(v[0]).bits | (uint32_t)nstf_float_to_bf16(v[1]).bits << 16;
        const uint32_t b = (uint32_t)nstf_float_to_bf16(v[2]).bits | (uint32_t)nstf_float_to_bf16(v[3]).bits << 16;
        *(uint2 *)p = make_uint2(a, b);
    } else {
        p[0] = nstf_float_to_bf16(v[0]);
    }
}

/* dx of one vector (in place in d), from x, dy, w and the row's r, k = r^3 c / dim. */
template <int VEC>
static __device__ __forceinline__ void rb_dx(float (&d)[VEC], const float (&xv)[VEC], const float (&g)[VEC],
                                             const float (&wv)[VEC], float r, float k) {
#pragma unroll
    for (int j = 0; j < VEC; j++) d[j] = d[j] + (r * g[j] * wv[j] - xv[j] * k);
}

/* E: floats of each row array a lane holds at 32-lane waves (dim <= 32 E). */
template <int VEC, int E>
__global__ void RB_ROWS_BOUNDS
    rmsnorm_bwd_rows(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ dy,
                     float *__restrict__ dx, nstf_bf16 *__restrict__ dx_bf16, int64_t dxb_stride,
                     float *__restrict__ part, int64_t n, int dim, int64_t chunk, float eps) {
    constexpr int S = (E / VEC * 32 + NSTF_WAVE - 1) / NSTF_WAVE; /* vectors a lane takes */
    /* On NVIDIA the first pass also loads dx and keeps x, dy, dx in
     * registers (one trip to memory a row); on AMD (within the registers a
     * lane has at full occupancy) the second pass re-reads x and dy (in
     * L1/L2) and reads dx. */
#if defined(NSTF_GPU_HIP)
    constexpr bool KEEP = false;
#else
    constexpr bool KEEP = true;
#endif
    constexpr int SK = KEEP ? S : 1;
    __shared__ float acc[32 * E];
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE, waves = blockDim.x / NSTF_WAVE;
    const int nv = dim / VEC;
    const int64_t t0 = (int64_t)blockIdx.x * chunk, t1 = t0 + chunk < n ? t0 + chunk : n;
    float pw[S][VEC]; /* dw's partial sums of the lane's columns */
#pragma unroll
    for (int s = 0; s < S; s++)
#pragma unroll
        for (int j = 0; j < VEC; j++) pw[s][j] = 0.0f;
    for (int64_t t = t0 + wave; t < t1; t += waves) {
        const float *xt = x + t * dim, *dyt = dy + t * dim;
        float *dxt = dx + t * dim;
        float xk[SK][VEC], gk[SK][VEC], dk[SK][VEC];
        float ss = 0.0f, cs = 0.0f;
#pragma unroll
        for (int s = 0; s < S; s++) {
            const int v = lane + s * NSTF_WAVE;
            if (v >= nv) continue;
            float xe[VEC], g[VEC], wv[VEC];
            rb_ld<VEC>(xt + v * VEC, xe);
            rb_ld<VEC>(dyt + v * VEC, g);
            if constexpr (KEEP) rb_ld<VEC>(dxt + v * VEC, dk[s]);
            rb_ld<VEC>(w + v * VEC, wv);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                if constexpr (KEEP) xk[s][j] = xe[j], gk[s][j] = g[j];
                ss = fmaf(xe[j], xe[j], ss);
                cs = fmaf(g[j] * wv[j], xe[j], cs);
            }
        }
        float r, k;
        rb_factors(ss, cs, dim, eps, r, k);
#pragma unroll
        for (int s = 0; s < S; s++) {
            const int v = lane + s * NSTF_WAVE;
            if (v >= nv) continue;
            float d[VEC], xe[VEC], g[VEC], wv[VEC];
            if constexpr (KEEP) {
#pragma unroll
                for (int j = 0; j < VEC; j++) d[j] = dk[s][j], xe[j] = xk[s][j], g[j] = gk[s][j];
            } else {
                rb_ld<VEC>(dxt + v * VEC, d);
                rb_ld<VEC>(xt + v * VEC, xe); /* again: in L1/L2 since the first pass */
                rb_ld<VEC>(dyt + v * VEC, g);
            }
            rb_ld<VEC>(w + v * VEC, wv);
            rb_dx<VEC>(d, xe, g, wv, r, k);
            rb_st<VEC>(dxt + v * VEC, d);
            if (dx_bf16) rb_st_bf16<VEC>(dx_bf16 + t * dxb_stride + v * VEC, d);
#pragma unroll
            for (int j = 0; j < VEC; j++) pw[s][j] = fmaf(g[j] * xe[j], r, pw[s][j]);
        }
    }
    if (!part) return; /* a frozen norm: no dw (uniform over the grid) */
    /* the waves' partials added in wave order */
    for (int wi = 0; wi < waves; wi++) {
        if (wave == wi) {
#pragma unroll
            for (int s = 0; s < S; s++) {
                const int v = lane + s * NSTF_WAVE;
                if (v >= nv) continue;
#pragma unroll
                for (int j = 0; j < VEC; j++) acc[v * VEC + j] = wi ? acc[v * VEC + j] + pw[s][j] : pw[s][j];
            }
        }
        __syncthreads();
    }
    for (int i = threadIdx.x; i < dim; i += blockDim.x) part[(int64_t)blockIdx.x * dim + i] = acc[i];
}

/* Any dim: one wave per row (grid-stride), r to r_out[t] unless NULL. */
template <int VEC>
__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_loop(const float *__restrict__ x, const float *__restrict__ w, const float *__restrict__ dy,
                     float *__restrict__ dx, nstf_bf16 *__restrict__ dx_bf16, int64_t dxb_stride,
                     float *__restrict__ r_out, int64_t n, int dim, float eps) {
    const int lane = threadIdx.x % NSTF_WAVE, waves = blockDim.x / NSTF_WAVE;
    const int nv = dim / VEC;
    const int64_t step = (int64_t)gridDim.x * waves;
    for (int64_t t = (int64_t)blockIdx.x * waves + threadIdx.x / NSTF_WAVE; t < n; t += step) {
        const float *xt = x + t * dim, *dyt = dy + t * dim;
        float ss = 0.0f, cs = 0.0f;
        for (int v = lane; v < nv; v += NSTF_WAVE) {
            float xv[VEC], g[VEC], wv[VEC];
            rb_ld<VEC>(xt + v * VEC, xv);
            rb_ld<VEC>(dyt + v * VEC, g);
            rb_ld<VEC>(w + v * VEC, wv);
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                ss = fmaf(xv[j], xv[j], ss);
                cs = fmaf(g[j] * wv[j], xv[j], cs);
            }
        }
        float r, k;
        rb_factors(ss, cs, dim, eps, r, k);
        float *dxt = dx + t * dim;
        for (int v = lane; v < nv; v += NSTF_WAVE) {
            float d[VEC], xv[VEC], g[VEC], wv[VEC];
            rb_ld<VEC>(dxt + v * VEC, d);
            rb_ld<VEC>(xt + v * VEC, xv);
            rb_ld<VEC>(dyt + v * VEC, g);
            rb_ld<VEC>(w + v * VEC, wv);
            rb_dx<VEC>(d, xv, g, wv, r, k);
            rb_st<VEC>(dxt + v * VEC, d);
            if (dx_bf16) rb_st_bf16<VEC>(dx_bf16 + t * dxb_stride + v * VEC, d);
        }
        if (lane == 0 && r_out) r_out[t] = r;
    }
}

/* part[c, i] = sum over chunk c's rows t, in order, of dy[t, i] x[t, i] r[t]. */
__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_cols(const float *__restrict__ x, const float *__restrict__ dy, const float *__restrict__ r,
                     float *__restrict__ part, int64_t n, int dim, int64_t chunk) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t t0 = (int64_t)blockIdx.y * chunk, t1 = t0 + chunk < n ? t0 + chunk : n;
    if (i >= dim) return;
    float s = 0.0f;
    for (int64_t t = t0; t < t1; t++) s = fmaf(dy[t * dim + i] * x[t * dim + i], r[t], s);
    part[(int64_t)blockIdx.y * dim + i] = s;
}

/* dw[i] += sum over chunks c of part[c, i]: group g of the block sums the
 * chunks g, g + RB_SUM_GROUPS, ... in order, then the groups' sums are added
 * in group order. */
__global__ void __launch_bounds__(RB_THREADS)
    rmsnorm_bwd_sum(const float *__restrict__ part, float *__restrict__ dw, int dim, int n_chunks) {
    __shared__ float red[RB_SUM_GROUPS][RB_SUM_COLS];
    const int c = threadIdx.x % RB_SUM_COLS, g = threadIdx.x / RB_SUM_COLS;
    const int i = blockIdx.x * RB_SUM_COLS + c;
    float s = 0.0f;
    if (i < dim) {
#pragma unroll 8
        for (int ch = g; ch < n_chunks; ch += RB_SUM_GROUPS) s += part[(int64_t)ch * dim + i];
    }
    red[g][c] = s;
    __syncthreads();
    if (g == 0 && i < dim) {
        float t = 0.0f;
        for (int k = 0; k < RB_SUM_GROUPS; k++) t += red[k][c];
        dw[i] += t;
    }
}

/* Rows a chunk: at most RB_MAX_CHUNKS chunks, and a row for each wave of a
 * block (at 32-lane waves) where n allows. */
static int64_t rb_chunk(int64_t n) {
    const int64_t c = (n + RB_MAX_CHUNKS - 1) / RB_MAX_CHUNKS;
    return c > RB_THREADS / 32 ? c : RB_THREADS / 32;
}

extern "C" size_t nstf_gpu_rmsnorm_bwd_scratch_bytes(int64_t n, int64_t dim) {
    if (n < 0 || dim < 0) return 0;
    const int64_t n_chunks = (n + rb_chunk(n) - 1) / rb_chunk(n);
    return ((size_t)n + (size_t)n_chunks * (size_t)dim) * sizeof(float); /* r [n], part [n_chunks, dim] */
}

template <int VEC>
static void rb_rows_go(int e, int64_t n_chunks, gpuStream_t s, const float *x, const float *w, const float *dy,
                       float *dx, nstf_bf16 *dxb, int64_t dxb_stride, float *part, int64_t n, int dim,
                       int64_t chunk, float eps) {
#define RB_ROWS(E)                                                                                               \
    case E:                                                                                                      \
        rmsnorm_bwd_rows<VEC, E><<<(unsigned)n_chunks, RB_THREADS, 0, s>>>(x, w, dy, dx, dxb, dxb_stride, part, n, \
                                                                           dim, chunk, eps);                     \
        break;
    switch (e) {
        RB_ROWS(4)
        RB_ROWS(8)
        RB_ROWS(12)
        RB_ROWS(16)
        RB_ROWS(20)
    default:
        RB_ROWS(24)
    }
#undef RB_ROWS
}

extern "C" int nstf_gpu_rmsnorm_bwd_launches(int64_t dim, int with_dw) {
    if (!with_dw) return 1;
    return dim <= RB_REG_MAX ? 2 : 3; /* rows + sum, or loop + cols + sum */
}

extern "C" nstf_status nstf_gpu_rmsnorm_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw,
                                            uint16_t *dx_bf16, int64_t dxb_stride, int64_t n, int64_t dim,
                                            float eps, void *scratch, size_t scratch_bytes, void *stream) {
    if (!x || !w || !dy || !dx || n < 0 || dim <= 0 || dim > INT_MAX / 2 || !(eps >= 0.0f) ||
        (dx_bf16 && dxb_stride < dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rmsnorm_bwd: bad arguments (n %lld, dim %lld)",
                              (long long)n, (long long)dim);
    if (dw && (!scratch || scratch_bytes < nstf_gpu_rmsnorm_bwd_scratch_bytes(n, dim)))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rmsnorm_bwd: scratch of %zu bytes is too small",
                              scratch_bytes);
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int d = (int)dim;
    const int64_t chunk = rb_chunk(n), n_chunks = (n + chunk - 1) / chunk;
    float *r = dw ? (float *)scratch : NULL, *part = r ? r + n : NULL;
    nstf_bf16 *dxb = (nstf_bf16 *)dx_bf16;
    /* float4 accesses where every row start is 16-byte aligned (the bf16
     * copy's 8-byte) */
    const bool v4 = d % 4 == 0 && ((uintptr_t)x | (uintptr_t)w | (uintptr_t)dy | (uintptr_t)dx) % 16 == 0 &&
                    (!dxb || ((uintptr_t)dxb % 8 == 0 && dxb_stride % 4 == 0));
    if (d <= RB_REG_MAX) {
        const int e = 4 * ((d + 127) / 128); /* floats a lane holds at 32-lane waves, a multiple of 4 */
        if (v4)
            rb_rows_go<RB_ROWS_VEC>(e, n_chunks, s, x, w, dy, dx, dxb, dxb_stride, part, n, d, chunk, eps);
        else
            rb_rows_go<1>(e, n_chunks, s, x, w, dy, dx, dxb, dxb_stride, part, n, d, chunk, eps);
        GPU_LAUNCH_CHECK(s);
    } else {
        /* one row a wave at 32-lane waves; the grid-stride loop takes the rest */
        const int64_t blocks = (n + RB_THREADS / 32 - 1) / (RB_THREADS / 32);
        const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
        if (v4)
            rmsnorm_bwd_loop<4><<<grid, RB_THREADS, 0, s>>>(x, w, dy, dx, dxb, dxb_stride, r, n, d, eps);
        else
            rmsnorm_bwd_loop<1><<<grid, RB_THREADS, 0, s>>>(x, w, dy, dx, dxb, dxb_stride, r, n, d, eps);
        GPU_LAUNCH_CHECK(s);
        if (dw) {
            const unsigned cb = (unsigned)((d + RB_THREADS - 1) / RB_THREADS);
            rmsnorm_bwd_cols<<<dim3(cb, (unsigned)n_chunks), RB_THREADS, 0, s>>>(x, dy, r, part, n, d, chunk);
            GPU_LAUNCH_CHECK(s);
        }
    }
    if (!dw) return NSTF_OK;
    rmsnorm_bwd_sum<<<(unsigned)((d + RB_SUM_COLS - 1) / RB_SUM_COLS), RB_THREADS, 0, s>>>(part, dw, d,
                                                                                          (int)n_chunks);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
