/* rmsnorm.cu — the residual add fused into RMSNorm:
 *   x[t] += res[t] (optional, x fp32 in place);  y[t] = bf16(x[t] * rsqrt(mean(x[t]^2) + eps) * w)
 * The residual stream is fp32: see nstf_gpu_rmsnorm in gpu_api.h for why.
 *
 * One wave per token (grid-stride over tokens). VEC 4 (dim % 4 == 0 and
 * aligned pointers): lane l takes the float4 l of each run of 4 NSTF_WAVE
 * elements; VEC 1 (any shape): the elements l + NSTF_WAVE m. Rows of at
 * most RMS_REG_MAX elements stay in registers between the sum of squares
 * and the output (M elements a lane at 32-lane waves, M * 32 / NSTF_WAVE
 * at others); longer rows take a loop (VEC 1) that re-reads x for y.
 *
 * The sum of squares is added in the order of a block of RMSNORM_THREADS
 * threads, one element in RMSNORM_THREADS each, then block_reduce_sum: the
 * order the fused GEMV's norm prologue (gemv_fused.h, fz_rnorm) uses, so
 * the fused decode stays bitwise the unfused kernels. Element e belongs to
 * virtual thread j = e % RMSNORM_THREADS, lane j % NSTF_WAVE of virtual wave
 * j / NSTF_WAVE. A lane keeps one fmaf chain per virtual thread whose
 * elements it holds: at VEC 1 the virtual threads lane + NSTF_WAVE w (one
 * per virtual wave w); at VEC 4, where run m of 4 NSTF_WAVE elements puts
 * e = 4 NSTF_WAVE m + 4 lane + c in the lane, the virtual threads
 * 4 NSTF_WAVE p + 4 lane + c (p = m % (RMSNORM_THREADS / (4 NSTF_WAVE)),
 * c < 4), which are virtual lane 4 (lane % (NSTF_WAVE / 4)) + c of virtual
 * wave 4 p + lane / (NSTF_WAVE / 4). Each virtual wave's butterfly is then
 * done as that wave would: its xor offsets >= 4 are lane offsets / 4, those
 * below 4 combine the c in the lane. The virtual waves' sums are added as
 * block_reduce_sum's second step does. */
#include "gpu.h"

#include <limits.h>

#define RMSNORM_THREADS 256 /* threads a launch's block has, and the virtual block of the sum order */
#define RMS_REG_MAX 1024    /* longest row kept in registers (M = 32 at 32-lane waves) */

/* Waves of the virtual block (RMSNORM_THREADS threads). */
#define RMS_VW (RMSNORM_THREADS / NSTF_WAVE)

/* v = x[e] (+ res[e]), written back with a residual. */
template <int RES>
static __device__ __forceinline__ float rms_load(float *xt, const void *res, int64_t ro, int e) {
    float v = xt[e];
    if (RES == 1) v += ((const float *)res)[ro + e];
    if (RES == 2) v += nstf_bf16_to_float(((const nstf_bf16 *)res)[ro + e]);
    if (RES) xt[e] = v;
    return v;
}

/* The block sum of a RMSNORM_THREADS-thread block (block_reduce_sum) from
 * the lane's per-virtual-wave sums s[w]; every lane gets it. */
static __device__ __forceinline__ float rms_block_sum(const float (&s)[RMS_VW], int lane) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < RMS_VW; w++) {
        const float r = wave_reduce_sum(s[w]); /* virtual wave w's red[w] */
        v = lane == w ? r : v;
    }
    return wave_reduce_sum(v);
}

/* The second step of block_reduce_sum from the virtual waves' sums: red[w]
 * sits in every lane of the lane group w % 4 (NSTF_WAVE / 4 lanes) as
 * rp[w / 4] (VEC 4's layout). */
template <int P>
static __device__ __forceinline__ float rms_block_sum4(const float (&rp)[P], int lane) {
    float v = 0.0f;
#pragma unroll
    for (int p = 0; p < P; p++) {
        const float a = NSTF_SHFL(rp[p], (lane % 4) * (NSTF_WAVE / 4));
        v = lane / 4 == p ? a : v; /* lane < RMS_VW = 4 P */
    }
    return wave_reduce_sum(v);
}

/* 4 floats at p / 4 bf16 at p (one aligned access). */
static __device__ __forceinline__ void rms_ld4(const float *p, float (&v)[4]) {
    const float4 u = *(const float4 *)p;
    v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
}
static __device__ __forceinline__ void rms_ld4(const nstf_bf16 *p, float (&v)[4]) {
    const uint2 u = *(const uint2 *)p;
    v[0] = nstf_bf16lo_to_float(u.x), v[1] = nstf_bf16hi_to_float(u.x);
    v[2] = nstf_bf16lo_to_float(u.y), v[3] = nstf_bf16hi_to_float(u.y);
}

/* M: elements a lane holds at 32-lane waves (the row in registers,
 * dim <= 32 M); 0: any dim, by a loop (VEC 1 only). VEC 4: dim % 4 == 0
 * and x, res, w 16-byte (res bf16: 8-byte), y 8-byte aligned. */
template <int RES, int M, int VEC>
__global__ void __launch_bounds__(RMSNORM_THREADS)
rmsnorm_kernel(float *__restrict__ x, const void *__restrict__ res, const float *__restrict__ w,
               nstf_bf16 *__restrict__ y, int64_t n_tok, int dim, float eps) {
    const int lane = threadIdx.x % NSTF_WAVE, waves = blockDim.x / NSTF_WAVE;
    const int64_t step = (int64_t)gridDim.x * waves;
    for (int64_t t = (int64_t)blockIdx.x * waves + threadIdx.x / NSTF_WAVE; t < n_tok; t += step) {
        float *xt = x + t * dim;
        nstf_bf16 *yt = y + t * dim;
        if constexpr (VEC == 4) {
            constexpr int P = RMSNORM_THREADS / (4 * NSTF_WAVE); /* virtual waves a lane's chains span / 4 */
            constexpr int MC = (M * 32 / 4 + NSTF_WAVE - 1) / NSTF_WAVE; /* float4 a lane holds */
            float xv[MC][4], s[P][4];
#pragma unroll
            for (int p = 0; p < P; p++)
#pragma unroll
                for (int c = 0; c < 4; c++) s[p][c] = 0.0f;
#pragma unroll
            for (int m = 0; m < MC; m++) {
                const int e = 4 * (m * NSTF_WAVE + lane);
                if (e >= dim) continue;
                rms_ld4(xt + e, xv[m]);
                if constexpr (RES) {
                    float rv[4];
                    if constexpr (RES == 1) rms_ld4((const float *)res + t * dim + e, rv);
                    else rms_ld4((const nstf_bf16 *)res + t * dim + e, rv);
#pragma unroll
                    for (int c = 0; c < 4; c++) xv[m][c] += rv[c];
                    *(float4 *)(xt + e) = make_float4(xv[m][0], xv[m][1], xv[m][2], xv[m][3]);
                }
#pragma unroll
                for (int c = 0; c < 4; c++) s[m % P][c] = fmaf(xv[m][c], xv[m][c], s[m % P][c]);
            }
            /* each virtual wave's butterfly: offsets >= 4 across lanes, < 4 in the lane */
            float rp[P];
#pragma unroll
            for (int p = 0; p < P; p++) {
#pragma unroll
                NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) {
                    if (o >= 4) {
#pragma unroll
                        for (int c = 0; c < 4; c++) s[p][c] += NSTF_SHFL_XOR(s[p][c], o / 4);
                    } else {
                        float u[4];
#pragma unroll
                        for (int c = 0; c < 4; c++) u[c] = s[p][c] + s[p][c ^ o];
#pragma unroll
                        for (int c = 0; c < 4; c++) s[p][c] = u[c];
                    }
                }
                rp[p] = s[p][0];
            }
            const float r = nstf_fast_rsqrtf(rms_block_sum4(rp, lane) / (float)dim + eps);
#pragma unroll
            for (int m = 0; m < MC; m++) {
                const int e = 4 * (m * NSTF_WAVE + lane);
                if (e >= dim) continue;
                float wv[4];
                rms_ld4(w + e, wv);
                uint32_t b[4];
#pragma unroll
                for (int c = 0; c < 4; c++) b[c] = nstf_float_to_bf16(xv[m][c] * r * wv[c]).bits;
                *(uint2 *)(yt + e) = make_uint2(b[0] | b[1] << 16, b[2] | b[3] << 16);
            }
        } else if constexpr (M > 0) {
            float s[RMS_VW];
#pragma unroll
            for (int v = 0; v < RMS_VW; v++) s[v] = 0.0f;
            constexpr int ML = (M * 32 + NSTF_WAVE - 1) / NSTF_WAVE; /* elements a lane holds */
            float xv[ML];
#pragma unroll
            for (int m = 0; m < ML; m++) {
                const int e = lane + m * NSTF_WAVE;
                xv[m] = e < dim ? rms_load<RES>(xt, res, t * dim, e) : 0.0f;
                if (e < dim) s[m % RMS_VW] = fmaf(xv[m], xv[m], s[m % RMS_VW]);
            }
            const float r = nstf_fast_rsqrtf(rms_block_sum(s, lane) / (float)dim + eps);
#pragma unroll
            for (int m = 0; m < ML; m++) {
                const int e = lane + m * NSTF_WAVE;
                if (e < dim) yt[e] = nstf_float_to_bf16(xv[m] * r * w[e]);
            }
        } else {
            float s[RMS_VW];
#pragma unroll
            for (int v = 0; v < RMS_VW; v++) s[v] = 0.0f;
            for (int m0 = 0; m0 * NSTF_WAVE < dim; m0 += RMS_VW) {
#pragma unroll
                for (int v = 0; v < RMS_VW; v++) {
                    const int e = lane + (m0 + v) * NSTF_WAVE;
                    if (e < dim) {
                        const float xe = rms_load<RES>(xt, res, t * dim, e);
                        s[v] = fmaf(xe, xe, s[v]);
                    }
                }
            }
            const float r = nstf_fast_rsqrtf(rms_block_sum(s, lane) / (float)dim + eps);
            for (int e = lane; e < dim; e += NSTF_WAVE) yt[e] = nstf_float_to_bf16(xt[e] * r * w[e]);
        }
    }
}

template <int RES, int VEC>
static void rmsnorm_go(unsigned grid, gpuStream_t s, float *x, const void *res, const float *w, nstf_bf16 *y,
                       int64_t n_tok, int dim, float eps) {
#define RMS_GO(M, V) rmsnorm_kernel<RES, M, V><<<grid, RMSNORM_THREADS, 0, s>>>(x, res, w, y, n_tok, dim, eps)
    const int m = (dim + 31) / 32;
    if (m <= 8)
        RMS_GO(8, VEC);
    else if (m <= 16)
        RMS_GO(16, VEC);
    else if (m <= 24)
        RMS_GO(24, VEC);
    else if (m <= RMS_REG_MAX / 32)
        RMS_GO(RMS_REG_MAX / 32, VEC);
    else
        RMS_GO(0, 1);
#undef RMS_GO
}

template <int RES>
static void rmsnorm_go(bool v4, unsigned grid, gpuStream_t s, float *x, const void *res, const float *w,
                       nstf_bf16 *y, int64_t n_tok, int dim, float eps) {
    if (v4)
        rmsnorm_go<RES, 4>(grid, s, x, res, w, y, n_tok, dim, eps);
    else
        rmsnorm_go<RES, 1>(grid, s, x, res, w, y, n_tok, dim, eps);
}

extern "C" nstf_status nstf_gpu_rmsnorm(float *x, const void *res, nstf_type res_type,
                                        const float *w, uint16_t *y, int64_t n_tok, int64_t dim,
                                        float eps, void *stream) {
    if (!x || !w || !y || n_tok < 0 || dim <= 0 || dim > INT_MAX / 2 || !(eps >= 0.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_rmsnorm: bad arguments (n_tok %lld, dim %lld, eps %g)",
                              (long long)n_tok, (long long)dim, (double)eps);
    if (res && res_type != NSTF_TYPE_F32 && res_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_rmsnorm: residual type %s (F32 or BF16)",
                              nstf_type_name(res_type));
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    /* blocks for one token a wave at 32-lane waves; with 64-lane ones a block
     * takes half as many per pass and the grid-stride loop the rest */
    const int64_t blocks = (n_tok + RMSNORM_THREADS / 32 - 1) / (RMSNORM_THREADS / 32);
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    nstf_bf16 *yb = (nstf_bf16 *)y;
    const int d = (int)dim;
    /* float4 accesses where every row start is aligned to them */
    const uintptr_t ra = !res ? 0 : (uintptr_t)res % (res_type == NSTF_TYPE_F32 ? 16 : 8);
    const bool v4 = d % 4 == 0 && ((uintptr_t)x | (uintptr_t)w) % 16 == 0 && ra == 0 && (uintptr_t)y % 8 == 0;
    if (!res)
        rmsnorm_go<0>(v4, grid, s, x, res, w, yb, n_tok, d, eps);
    else if (res_type == NSTF_TYPE_F32)
        rmsnorm_go<1>(v4, grid, s, x, res, w, yb, n_tok, d, eps);
    else
        rmsnorm_go<2>(v4, grid, s, x, res, w, yb, n_tok, d, eps);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
