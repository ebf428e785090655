/* gemm.cu — bf16 GEMM on the matrix units: C[M,N] = A[M,K] x W[N,K]^T with
 * fp32 accumulation and a fused epilogue (none, + residual, SwiGLU); the
 * engine's QKV, out-proj + residual, gate/up + SwiGLU and down-proj + residual.
 *
 * Block tile BM x BN x BK (128x128 or 64x128; BK 64 on NVIDIA, 32 on AMD), 8 waves each owning a WM x WN
 * patch of 16x16 mma tiles (mma.h). Shared memory holds STAGES k-slices of A
 * and W (padded rows, see GEMM_LDS). On sm_80+ the slices arrive by cp.async,
 * 3 deep; on HIP by plain 16-byte loads into a double buffer. Blocks are
 * rasterized in groups of 8 block rows for L2 reuse. Rows beyond M or N and
 * k beyond K are zero-filled, so any M, N work; K must be a multiple of 8
 * (16-byte pieces of a row).
 *
 * On Hopper the same call takes the wgmma + TMA path of gemm_wgmma.h
 * (CUDA builds only; used when the device is compute capability 9.x and the
 * loaded kernel image is sm_90a). The switch NSTF_GEMM=mma (environment,
 * or nstf_switch_set) forces the portable kernel above, so both can be
 * compared in one process (NSTF_GEMM=wgmma256 / wgmma128 / wgmma64 force one
 * wgmma tile width);
 * nstf_gpu_gemm_path() says which kernel a call of a given shape takes.
 * nstf_gpu_gemm_f16 is the same machinery on fp16 operands (F16 weights;
 * nstf_gpu_bf16_to_f16 converts the activations), only the matrix
 * instruction differs. */
#include <stdlib.h>
#include <string.h>

#include "core/switches.h"
#include "mma.h"

typedef unsigned short u16;

/* k-slice depth and pipeline: NVIDIA 64 x 3 stages (110 KiB of shared memory,
 * two blocks per SM); AMD 32 x 2 (40 KiB: LDS is 64 KiB). Rows are padded by
 * 8 elements: 144 (or 80) bytes, an odd number of 16-byte units, so the
 * eight rows of an ldmatrix phase hit eight different bank groups. */
#if defined(NSTF_MMA_NV)
#define GEMM_BK 64
#define GEMM_STAGES 3
#else
#define GEMM_BK 32
#define GEMM_STAGES 2
#endif
#define GEMM_LDS (GEMM_BK + 8)
#define GEMM_GROUP_M 8 /* raster: 8 block rows share each W panel while it is in L2 */

static __device__ __forceinline__ float silu_f(float x) {
    return x / (1.0f + nstf_exp2(-x * 1.4426950408889634f));
}

/* Grouped raster: the first row m0 and column n0 of tile t of an
 * n_pm x n_pn grid of BM x BN tiles. Consecutive tiles walk down
 * GEMM_GROUP_M tile rows, then across, so the tiles in flight share A and
 * W panels in L2. Used by gemm_bf16_kernel (t = its block) and the
 * persistent wgmma kernel's producer and consumers (t = each tile they take). */
struct gemm_tile {
    int64_t m0, n0;
};
template <int BM, int BN>
static __device__ __forceinline__ gemm_tile gemm_raster(int64_t t, int64_t n_pm, int64_t n_pn) {
    const int64_t grp = t / (GEMM_GROUP_M * n_pn), first_m = grp * GEMM_GROUP_M;
    const int64_t gsz = n_pm - first_m < GEMM_GROUP_M ? n_pm - first_m : GEMM_GROUP_M;
    const int64_t in_grp = t % (GEMM_GROUP_M * n_pn);
    return {(first_m + in_grp % gsz) * BM, (in_grp / gsz) * BN};
}

#if defined(NSTF_GPU_CUDA)
#include "gemm_wgmma.h"
#endif

/* One k-slice of rows [r0, r0+ROWS) of a [rows_total, K] matrix into smem. */
template <int ROWS, int NT>
static __device__ __forceinline__ void gemm_load_tile(u16 *s, const u16 *g, int64_t r0, int64_t rows_total,
                                                      int64_t k0, int64_t K, int tid) {
    constexpr int CHUNKS = ROWS * (GEMM_BK / 8);
#pragma unroll
    for (int it = 0; it < (CHUNKS + NT - 1) / NT; it++) {
        const int c = tid + it * NT;
        if (CHUNKS % NT != 0 && c >= CHUNKS) break;
        int row = c / (GEMM_BK / 8), kc = c % (GEMM_BK / 8);
        int64_t gr = r0 + row, gk = k0 + kc * 8;
        bool valid = gr < rows_total && gk < K;
        const u16 *src = g + (valid ? gr * K + gk : 0);
        nstf_cp16(s + row * GEMM_LDS + kc * 8, src, valid);
    }
}

/* The block's work; F16: A and W hold fp16 (nstf_mma_f16), else bf16. */
template <int BM, int BN, int WM, int WN, bool F16>
static __device__ __forceinline__ void gemm_body(const u16 *__restrict__ A, const u16 *__restrict__ W, void *C,
                                                 const void *R, int64_t M, int64_t N, int64_t K, int epi, int c_bf16,
                                                 int r_bf16) {
    constexpr int NWN = BN / WN, NW = (BM / WM) * NWN, NT = NW * NSTF_WAVE;
    constexpr int TM = WM / 16, TN = WN / 16;
    extern __shared__ __align__(16) u16 smem[];
    u16 *sA = smem;                              /* [STAGES][BM][LDS] */
    u16 *sB = smem + GEMM_STAGES * BM * GEMM_LDS; /* [STAGES][BN][LDS] */

    const int tid = threadIdx.x, wave = tid / NSTF_WAVE;
    const int wm = wave / NWN, wn = wave % NWN;
    const int64_t n_pm = (M + BM - 1) / BM, n_pn = (N + BN - 1) / BN;
    const gemm_tile tile = gemm_raster<BM, BN>(blockIdx.x, n_pm, n_pn); /* grouped raster */
    const int64_t m0 = tile.m0, n0 = tile.n0;
    const int64_t ktiles = (K + GEMM_BK - 1) / GEMM_BK;

    nstf_mma_c acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) nstf_mma_zero(acc[i][j]);

#pragma unroll
    for (int s = 0; s < GEMM_STAGES - 1; s++) {
        if (s < ktiles) {
            gemm_load_tile<BM, NT>(sA + s * BM * GEMM_LDS, A, m0, M, s * GEMM_BK, K, tid);
            gemm_load_tile<BN, NT>(sB + s * BN * GEMM_LDS, W, n0, N, s * GEMM_BK, K, tid);
        }
        nstf_cp_commit();
    }

    for (int64_t kt = 0; kt < ktiles; kt++) {
        nstf_cp_wait<GEMM_STAGES - 2>();
        __syncthreads();
        {
            int64_t nk = kt + GEMM_STAGES - 1;
            if (nk < ktiles) {
                int slot = (int)(nk % GEMM_STAGES);
                gemm_load_tile<BM, NT>(sA + slot * BM * GEMM_LDS, A, m0, M, nk * GEMM_BK, K, tid);
                gemm_load_tile<BN, NT>(sB + slot * BN * GEMM_LDS, W, n0, N, nk * GEMM_BK, K, tid);
            }
            nstf_cp_commit();
        }
#if !defined(NSTF_MMA_NV)
        __syncthreads(); /* plain loads: the slice of kt was stored last iteration; make it visible */
#endif
        const int slot = (int)(kt % GEMM_STAGES);
        const u16 *a_s = sA + slot * BM * GEMM_LDS + wm * WM * GEMM_LDS;
        const u16 *b_s = sB + slot * BN * GEMM_LDS + wn * WN * GEMM_LDS;
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            nstf_mma_a fa[TM];
            nstf_mma_b fb[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) nstf_mma_load_a(fa[i], a_s + i * 16 * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int j = 0; j < TN; j++) nstf_mma_load_b(fb[j], b_s + j * 16 * GEMM_LDS + kk, GEMM_LDS);
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) {
                    if constexpr (F16) nstf_mma_f16(acc[i][j], fa[i], fb[j]);
                    else nstf_mma(acc[i][j], fa[i], fb[j]);
                }
        }
    }
    nstf_cp_wait<0>();

    /* ---- epilogue ---- */
    const int64_t rbase = m0 + wm * WM, cbase = n0 + wn * WN;
    if (epi == NSTF_GEMM_EPI_SWIGLU) {
        /* tile pair (j, j+1) = (gate, up) of the same 16 output columns */
        const int64_t n_out = N / 2;
#pragma unroll
        for (int i = 0; i < TM; i++)
#pragma unroll
            for (int j = 0; j < TN; j += 2)
#pragma unroll
                for (int e = 0; e < NSTF_MMA_C_N; e++) {
                    int64_t row = rbase + i * 16 + nstf_mma_c_row(e);
                    int64_t col = cbase / 2 + (j / 2) * 16 + nstf_mma_c_col(e);
                    if (row >= M || col >= n_out) continue;
                    float v = silu_f(acc[i][j].x[e]) * acc[i][j + 1].x[e];
                    if (c_bf16)
                        ((u16 *)C)[row * n_out + col] = nstf_mma_f2bf(v);
                    else
                        ((float *)C)[row * n_out + col] = v;
                }
        return;
    }
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++)
#pragma unroll
            for (int e = 0; e < NSTF_MMA_C_N; e++) {
                int64_t row = rbase + i * 16 + nstf_mma_c_row(e);
                int64_t col = cbase + j * 16 + nstf_mma_c_col(e);
                if (row >= M || col >= N) continue;
                int64_t o = row * N + col;
                float v = acc[i][j].x[e];
                if (epi == NSTF_GEMM_EPI_RESIDUAL)
                    v += r_bf16 ? nstf_mma_bf2f(((const u16 *)R)[o]) : ((const float *)R)[o];
                if (c_bf16)
                    ((u16 *)C)[o] = nstf_mma_f2bf(v);
                else
                    ((float *)C)[o] = v;
            }
}

template <int BM, int BN, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * NSTF_WAVE)
    gemm_bf16_kernel(const u16 *__restrict__ A, const u16 *__restrict__ W, void *C, const void *R, int64_t M,
                     int64_t N, int64_t K, int epi, int c_bf16, int r_bf16) {
    gemm_body<BM, BN, WM, WN, false>(A, W, C, R, M, N, K, epi, c_bf16, r_bf16);
}
/* fp16 A and W (F16 weights; the activations converted by nstf_gpu_bf16_to_f16) */
template <int BM, int BN, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * NSTF_WAVE)
    gemm_f16_kernel(const u16 *__restrict__ A, const u16 *__restrict__ W, void *C, const void *R, int64_t M,
                    int64_t N, int64_t K, int epi, int c_bf16, int r_bf16) {
    gemm_body<BM, BN, WM, WN, true>(A, W, C, R, M, N, K, epi, c_bf16, r_bf16);
}

/* ---------------------------------------------------------------- host ---- */

template <int BM, int BN, int WM, int WN, bool F16>
static nstf_status gemm_launch(const u16 *a, const u16 *w, void *c, const void *r, int64_t m, int64_t n,
                               int64_t k, int epi, int c_bf16, int r_bf16, gpuStream_t stream) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    const int threads = (BM / WM) * (BN / WN) * wave;
    const size_t smem = (size_t)GEMM_STAGES * (BM + BN) * GEMM_LDS * sizeof(u16);
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(const u16 *, const u16 *, void *, const void *, int64_t, int64_t, int64_t, int, int, int) =
            F16 ? gemm_f16_kernel<BM, BN, WM, WN> : gemm_bf16_kernel<BM, BN, WM, WN>;
        if (gpuFuncSetAttribute((const void *)kfn, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            gpuSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "gemm: cannot allow %zu bytes of shared memory", smem);
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t n_blocks = ((n + BN - 1) / BN) * ((m + BM - 1) / BM);
    if (n_blocks > 0x7fffffff) return nstf_set_error(NSTF_ERR_RANGE, "gemm: %lld blocks", (long long)n_blocks);
    dim3 grid((unsigned)n_blocks);
    if (F16) gemm_f16_kernel<BM, BN, WM, WN><<<grid, threads, smem, stream>>>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16);
    else gemm_bf16_kernel<BM, BN, WM, WN><<<grid, threads, smem, stream>>>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16);
    gpuError_t e = gpuGetLastError();
    if (e != gpuSuccess) return nstf_set_error(NSTF_ERR_GPU, "gemm: launch failed: %s", gpuGetErrorString(e));
    return NSTF_OK;
}

/* The kernel a call of this shape takes on the current device:
 * 0 = portable 128x128, 1 = portable 64x128, 2/3/4 = wgmma 128x256/128/64.
 * The switch NSTF_GEMM (core/switches.h; tests and benchmarks change it
 * between calls with nstf_switch_set) forces the portable kernel ("mma",
 * value 0) or one wgmma tile width where the wgmma path is usable. */
static int gemm_pick(int64_t m, int64_t n, int n_sm) {
#if defined(NSTF_GPU_CUDA)
    const int sw = nstf_switch_int(NSTF_SW_GEMM); /* NSTF_SWITCH_AUTO, 0 (mma) or a tile width */
    if (sw != 0 && gemm_wgmma_usable()) {
        const int bn = sw > 0 ? sw : gemm_wgmma_bn(m, n, n_sm);
        return bn == 256 ? 2 : bn == 128 ? 3 : bn == 64 ? 4 : 5;
    }
#endif
    return ((m + 127) / 128) * ((n + 127) / 128) >= n_sm ? 0 : 1;
}

extern "C" const char *nstf_gpu_gemm_path(int64_t m, int64_t n, int64_t k) {
    static const char *names[] = {"mma.sync 128x128", "mma.sync 64x128", "wgmma 128x256", "wgmma 128x128",
                                  "wgmma 128x64", "wgmma 128x192"};
    (void)k;
    int n_sm = 0, wave = 0;
    if (m <= 0 || n <= 0 || nstf_mma_device(&n_sm, &wave) != NSTF_OK) return "none";
    return names[gemm_pick(m, n, n_sm)];
}

extern "C" int nstf_gpu_gemm_kmajor_fast(int64_t m, int64_t n, int64_t k) {
    int n_sm = 0, wave = 0;
    if (m <= 0 || n <= 0 || k % 8 != 0 || n % 8 != 0 || nstf_mma_device(&n_sm, &wave) != NSTF_OK) return 0;
    return gemm_pick(m, n, n_sm) >= 2;
}

/* ---- the weight gradient on wgmma: C [M, N] += A^T B, A [K, M], B [K, N] ---- */

/* dw[i] += part[0][i] + part[1][i] + ... in split order (deterministic) */
__global__ void __launch_bounds__(256) gemm_dw_reduce_kernel(const float *__restrict__ part, float *__restrict__ dw,
                                                             int64_t n, int splits, int vec) {
    const int64_t stride = (int64_t)gridDim.x * 256;
    if (vec) {
        for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n / 4; i += stride) {
            float4 v = ((const float4 *)dw)[i];
            for (int s = 0; s < splits; s++) {
                const float4 p = ((const float4 *)(part + (int64_t)s * n))[i];
                v.x += p.x, v.y += p.y, v.z += p.z, v.w += p.w;
            }
            ((float4 *)dw)[i] = v;
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n; i += stride) {
        float v = dw[i];
        for (int s = 0; s < splits; s++) v += part[(int64_t)s * n + i];
        dw[i] = v;
    }
}

#if defined(NSTF_GPU_CUDA)
/* The plan of an M x N x K weight gradient: tile width, k splits, and the
 * device's SM count it was made for. */
struct gemm_dw_choice {
    int bn, splits, n_sm;
};

/* 0 when the wgmma form does not apply (no sm_90a body, the mma switch, or
 * operands TMA cannot address), else 1 and the plan. */
static int gemm_dw_pick(const void *a, int64_t lda, const void *b, int64_t ldb, int64_t m, int64_t n, int64_t k,
                        gemm_dw_choice *p) {
    int wave = 0;
    if (m <= 0 || n <= 0 || k <= 0 || m > INT32_MAX / 2 || n > INT32_MAX / 2 || k > INT32_MAX / 2 || lda < m ||
        ldb < n || lda % 8 || ldb % 8 || ((uintptr_t)a | (uintptr_t)b) % 16)
        return 0;
    if (nstf_switch_int(NSTF_SW_GEMM) == 0 || !gemm_wgmma_body_usable<192, true>() ||
        nstf_mma_device(&p->n_sm, &wave) != NSTF_OK)
        return 0;
    gemm_dw_plan(m, n, k, p->n_sm, &p->bn, &p->splits);
    return 1;
}

/* The splits' partial sums (none with one split). */
static size_t gemm_dw_scratch(const gemm_dw_choice *p, int64_t m, int64_t n) {
    return p->splits > 1 ? (size_t)p->splits * (size_t)m * (size_t)n * sizeof(float) : 0;
}
#endif

extern "C" int nstf_gpu_gemm_dw_fast(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, int64_t m,
                                     int64_t n, int64_t k, size_t *scratch_bytes) {
#if defined(NSTF_GPU_CUDA)
    gemm_dw_choice p = {128, 1, 0};
    if (!gemm_dw_pick(a, lda, b, ldb, m, n, k, &p)) return 0;
    *scratch_bytes = gemm_dw_scratch(&p, m, n);
    return 1;
#else
    (void)a, (void)lda, (void)b, (void)ldb, (void)m, (void)n, (void)k, (void)scratch_bytes;
    return 0;
#endif
}

extern "C" nstf_status nstf_gpu_gemm_dw(const uint16_t *a, int64_t lda, const uint16_t *b, int64_t ldb, float *c,
                                        int64_t m, int64_t n, int64_t k, void *scratch, size_t scratch_bytes,
                                        void *stream) {
#if defined(NSTF_GPU_CUDA)
    gemm_dw_choice p = {128, 1, 0};
    if (!c || !gemm_dw_pick(a, lda, b, ldb, m, n, k, &p))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm_dw: no wgmma weight gradient for M=%lld N=%lld K=%lld",
                              (long long)m, (long long)n, (long long)k);
    const int sp = p.splits, n_sm = p.n_sm;
    const size_t need = gemm_dw_scratch(&p, m, n);
    if (need && (!scratch || scratch_bytes < need || (uintptr_t)scratch % 16))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm_dw: scratch of %zu bytes (want %zu, 16-byte aligned)",
                              scratch_bytes, need);
    float *out = sp > 1 ? (float *)scratch : c;
    const int vec = n % 8 == 0 && (uintptr_t)out % 16 == 0 ? 2 : n % 2 == 0 && (uintptr_t)out % 8 == 0 ? 1 : 0;
    const u16 *a16 = (const u16 *)a, *b16 = (const u16 *)b;
    cudaStream_t s = (cudaStream_t)stream;
    if (p.bn == 256)
        NSTF_TRY(gemm_dw_launch_bn<256>(a16, lda, b16, ldb, out, m, n, k, sp, vec, n_sm, s));
    else if (p.bn == 192)
        NSTF_TRY(gemm_dw_launch_bn<192>(a16, lda, b16, ldb, out, m, n, k, sp, vec, n_sm, s));
    else
        NSTF_TRY(gemm_dw_launch_bn<128>(a16, lda, b16, ldb, out, m, n, k, sp, vec, n_sm, s));
    if (sp == 1) return NSTF_OK;
    const int64_t total = m * n;
    const int rvec = total % 4 == 0 && (uintptr_t)c % 16 == 0;
    const int64_t blocks = ((rvec ? total / 4 : total) + 255) / 256;
    gemm_dw_reduce_kernel<<<(unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID), 256, 0, s>>>(
        (const float *)scratch, c, total, sp, rvec);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
#else
    (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)m, (void)n, (void)k, (void)scratch, (void)scratch_bytes,
        (void)stream;
    return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm_dw: the wgmma weight gradient is a CUDA (sm_90a) path");
#endif
}

extern "C" int64_t nstf_gpu_swiglu_packed_row(int64_t p, int64_t n_ff) {
    int64_t grp = p / 32, r = p % 32;
    return r < 16 ? grp * 16 + r : n_ff + grp * 16 + (r - 16);
}

/* nstf_gpu_gemm_bf16 (f16 false) and nstf_gpu_gemm_f16 (true). */
static nstf_status gemm_run(bool f16, const uint16_t *a, const uint16_t *w, void *c, nstf_type c_type, const void *res,
                            nstf_type res_type, int64_t m, int64_t n, int64_t k, nstf_gemm_epilogue epi, void *stream) {
    if (!a || !w || !c) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: NULL operand");
    if (m <= 0 || n <= 0 || k <= 0 || m > (int64_t)65535 * 64 || n > ((int64_t)1 << 31) / 2)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: bad shape M=%lld N=%lld K=%lld", (long long)m,
                              (long long)n, (long long)k);
    if (k % 8 != 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm: K=%lld is not a multiple of 8", (long long)k);
    if (((uintptr_t)a | (uintptr_t)w) % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: A and W must be 16-byte aligned");
    if (c_type != NSTF_TYPE_F32 && c_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm: output type %d (want F32 or BF16)", (int)c_type);
    int r_bf16 = 0;
    if (epi == NSTF_GEMM_EPI_RESIDUAL) {
        if (!res) return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: residual epilogue without a residual");
        if (res_type != NSTF_TYPE_F32 && res_type != NSTF_TYPE_BF16)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "gemm: residual type %d (want F32 or BF16)", (int)res_type);
        r_bf16 = res_type == NSTF_TYPE_BF16;
    } else if (epi == NSTF_GEMM_EPI_SWIGLU) {
        if (n % 32 != 0)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: SwiGLU needs N %% 32 == 0 (N=%lld)", (long long)n);
    } else if (epi != NSTF_GEMM_EPI_NONE) {
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "gemm: unknown epilogue %d", (int)epi);
    }
    const int c_bf16 = c_type == NSTF_TYPE_BF16;
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    gpuStream_t s = (gpuStream_t)stream;
    const int path = gemm_pick(m, n, n_sm);
#if defined(NSTF_GPU_CUDA)
    if (path >= 2) {
        /* epilogue access width: 8 elements (16-byte and wider accesses)
         * when rows are a multiple of 8 and C, R 16-byte aligned; else pairs
         * (8- or 4-byte) when rows are even and C, R aligned to two elements;
         * else single elements */
        const int64_t n_out = epi == NSTF_GEMM_EPI_SWIGLU ? n / 2 : n;
        const uintptr_t c_al = c_bf16 ? 4 : 8, r_al = r_bf16 ? 4 : 8;
        const int res_on = epi == NSTF_GEMM_EPI_RESIDUAL;
        int vec = n_out % 2 == 0 && (uintptr_t)c % c_al == 0 && (!res_on || (uintptr_t)res % r_al == 0);
        if (n_out % 8 == 0 && (uintptr_t)c % 16 == 0 && (!res_on || (uintptr_t)res % 16 == 0)) vec = 2;
        const u16 *a16 = (const u16 *)a, *w16 = (const u16 *)w;
        const int bn = path == 2 ? 256 : path == 3 ? 128 : path == 4 ? 64 : 192;
        return f16 ? gemm_wgmma_launch<true>(bn, a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, s)
                   : gemm_wgmma_launch<false>(bn, a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, s);
    }
#endif
    const u16 *a16 = (const u16 *)a, *w16 = (const u16 *)w;
    if (path == 0)
        return f16 ? gemm_launch<128, 128, 64, 32, true>(a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, s)
                   : gemm_launch<128, 128, 64, 32, false>(a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, s);
    return f16 ? gemm_launch<64, 128, 32, 32, true>(a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, s)
               : gemm_launch<64, 128, 32, 32, false>(a16, w16, c, res, m, n, k, epi, c_bf16, r_bf16, s);
}

extern "C" nstf_status nstf_gpu_gemm_bf16(const uint16_t *a, const uint16_t *w, void *c, nstf_type c_type,
                                          const void *res, nstf_type res_type, int64_t m, int64_t n, int64_t k,
                                          nstf_gemm_epilogue epi, void *stream) {
    return gemm_run(false, a, w, c, c_type, res, res_type, m, n, k, epi, stream);
}

extern "C" nstf_status nstf_gpu_gemm_f16(const uint16_t *a, const uint16_t *w, void *c, nstf_type c_type,
                                         const void *res, nstf_type res_type, int64_t m, int64_t n, int64_t k,
                                         nstf_gemm_epilogue epi, void *stream) {
    return gemm_run(true, a, w, c, c_type, res, res_type, m, n, k, epi, stream);
}

/* bf16 -> fp16, round to nearest even; finite values beyond the fp16
 * range saturated to +-65504 (no infinities from finite inputs);
 * infinities kept; NaN stays NaN. Eight values per thread when x, y are
 * 16-byte aligned and n % 8 == 0. */
static __device__ __forceinline__ uint32_t bf16_to_f16_bits(uint32_t b) {
    float f = __uint_as_float(b << 16);
    if (fabsf(f) <= 3.4028235e38f) f = fminf(fmaxf(f, -65504.0f), 65504.0f); /* finite only */
#if defined(NSTF_GPU_CUDA)
    return __half_as_ushort(__float2half_rn(f));
#else
    return __builtin_bit_cast(unsigned short, (_Float16)f);
#endif
}

__global__ void __launch_bounds__(256) bf16_to_f16_kernel(const u16 *__restrict__ x, u16 *__restrict__ y, int64_t n,
                                                          int vec) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const int64_t stride = (int64_t)gridDim.x * 256;
    if (vec) {
        for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n / 8; i += stride) {
            const uint4 v = ((const uint4 *)x)[i];
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
            uint32_t o[4];
#pragma unroll
            for (int k = 0; k < 4; k++) o[k] = bf16_to_f16_bits(w[k] & 0xffffu) | (bf16_to_f16_bits(w[k] >> 16) << 16);
            ((uint4 *)y)[i] = make_uint4(o[0], o[1], o[2], o[3]);
        }
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x; i < n; i += stride) y[i] = (u16)bf16_to_f16_bits(x[i]);
}

extern "C" nstf_status nstf_gpu_bf16_to_f16(const uint16_t *x, uint16_t *y, int64_t n, void *stream) {
    if (!x || !y || n < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_bf16_to_f16: bad arguments");
    if (n == 0) return NSTF_OK;
    const int vec = n % 8 == 0 && (((uintptr_t)x | (uintptr_t)y) % 16) == 0;
    const int64_t work = vec ? n / 8 : n, blocks = (work + 255) / 256;
    const unsigned grid = (unsigned)(blocks < 8 * NSTF_GPU_MAX_GRID ? blocks : 8 * NSTF_GPU_MAX_GRID);
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(bf16_to_f16_kernel, dim3(grid), dim3(256), 0, s, nstf_gpu_pdl(), (const u16 *)x, (u16 *)y,
                              n, vec));
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
