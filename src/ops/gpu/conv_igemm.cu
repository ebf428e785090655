/* conv_igemm.cu — level 4 of the conv2d ladder: implicit GEMM on the matrix
 * units (mma.h: mma.sync on NVIDIA, MFMA on CDNA, WMMA on RDNA3).
 *
 * Per group g the convolution is the GEMM C[M, N] = A[M, K] B[N, K]^T with
 *   M = n p q output positions (m = (n, p, q) in y's order),
 *   N = k / groups output channels,  K = (c / groups) r s filter taps,
 *   A[m][t] = x at the tap t of position m (0 on the padding),
 *   B[j][t] = w[g N + j][t]: a filter row is K contiguous elements in both
 *   layouts, with t ordered (c, r, s) in NCHW and (r, s, c) in NHWC.
 * A is never materialized: the block tile's loaders gather it from x. In
 * NHWC with c/groups % 8 == 0 (and c % 8 == 0, x 16-byte aligned) eight
 * consecutive taps are eight consecutive channels of one pixel, so each
 * 16-byte piece is one cp.async (zero-filled on the padding); otherwise each
 * element is decoded and loaded alone. B pieces are 16-byte copies when
 * K % 8 == 0, else element loads.
 *
 * The tile loop is gemm.cu's: block tile BM x BN x BK (128 x 128 or, for
 * N <= 64, 128 x 64), 8 waves each owning a WM x WN patch of 16 x 16 mma
 * tiles, STAGES k-slices in shared memory (NVIDIA: BK 64, 3 stages through
 * cp.async; AMD: BK 32, 2 stages of plain loads), rows padded by 8 elements
 * (conflict-free ldmatrix phases); blocks rasterized in groups of 8 block
 * rows. Each thread's rows of A are fixed for the whole loop, so their
 * positions (n, p, q) are decoded once. */
#include "conv_common.h"
#include "mma.h"

#if defined(NSTF_MMA_NV)
#define CI_BK 64
#define CI_STAGES 3
#else
#define CI_BK 32
#define CI_STAGES 2
#endif
#define CI_LDS (CI_BK + 8)
#define CI_GROUP_M 8
#define CI_WAVES 8

/* A gather: AV = 16-byte pieces (NHWC, c/groups % 8 == 0); else elements */
enum { CI_A_ELEM = 0, CI_A_VEC = 1 };

template <int BM, int BN, int WM, int WN, bool NHWC, int AMODE>
__global__ void __launch_bounds__(CI_WAVES *NSTF_WAVE)
    conv_igemm_kernel(conv_params cp, const u16 *__restrict__ x, const u16 *__restrict__ w,
                      const float *__restrict__ bias, void *__restrict__ y, int y_bf16, int b_vec) {
    constexpr int NT = CI_WAVES * NSTF_WAVE, NWN = BN / WN, TM = WM / 16, TN = WN / 16;
    constexpr int KC = CI_BK / 8;                          /* 16-byte pieces per row of a slice */
    constexpr int A_IT = (BM * KC + NT - 1) / NT;          /* A pieces per thread per slice */
    static_assert((BM * KC) % NT == 0, "A pieces must divide evenly among the threads");
    extern __shared__ __align__(16) u16 ci_smem[];
    u16 *sA = ci_smem;                                 /* [STAGES][BM][LDS] */
    u16 *sB = ci_smem + CI_STAGES * BM * CI_LDS;       /* [STAGES][BN][LDS] */

    const int tid = threadIdx.x, wave = tid / NSTF_WAVE, wm = wave / NWN, wn = wave % NWN;
    const int64_t M = cp.n * cp.p * cp.q, N = cp.kg, K = cp.cg * cp.r * cp.s, PQ = cp.p * cp.q;
    const int64_t g = blockIdx.y;
    /* grouped raster over (m tile, n tile), as gemm.cu */
    const int64_t n_pm = (M + BM - 1) / BM, n_pn = (N + BN - 1) / BN, pid = blockIdx.x;
    const int64_t grp = pid / (CI_GROUP_M * n_pn), first_m = grp * CI_GROUP_M;
    const int64_t gsz = n_pm - first_m < CI_GROUP_M ? n_pm - first_m : CI_GROUP_M;
    const int64_t in_grp = pid % (CI_GROUP_M * n_pn);
    const int64_t m0 = (first_m + in_grp % gsz) * BM, n0 = (in_grp / gsz) * BN;
    const int64_t ktiles = (K + CI_BK - 1) / CI_BK;
    const u16 *wg = w + g * N * K;
    const int64_t c_off = g * cp.cg;

    /* this thread's A rows: piece c = tid + it NT is row c / KC, column piece tid % KC */
    const int a_kc = tid % KC;
    int64_t a_base[A_IT]; /* x offset of (n, channel c_off, 0, 0) */
    int a_h0[A_IT], a_w0[A_IT];
    bool a_ok[A_IT];
#pragma unroll
    for (int it = 0; it < A_IT; it++) {
        const int64_t m = m0 + (tid + it * NT) / KC;
        a_ok[it] = m < M;
        const int64_t mm = a_ok[it] ? m : 0, n = mm / PQ, pq = mm % PQ;
        a_h0[it] = (int)((pq / cp.q) * cp.sh - cp.ph);
        a_w0[it] = (int)((pq % cp.q) * cp.sw - cp.pw);
        a_base[it] = NHWC ? n * cp.h * cp.w * cp.c + c_off : (n * cp.c + c_off) * cp.h * cp.w;
    }

    auto load_a = [&](u16 *s, int64_t k0) {
#pragma unroll
        for (int it = 0; it < A_IT; it++) {
            const int row = (tid + it * NT) / KC;
            u16 *dst = s + row * CI_LDS + a_kc * 8;
            const int64_t t0 = k0 + a_kc * 8;
            if (AMODE == CI_A_VEC) { /* (r, s, c): 8 channels of one pixel */
                const int64_t c = t0 % cp.cg, rs = t0 / cp.cg;
                const int h = a_h0[it] + (int)(rs / cp.s) * cp.dh, wi = a_w0[it] + (int)(rs % cp.s) * cp.dw;
                const bool ok = a_ok[it] && t0 < K && h >= 0 && h < cp.h && wi >= 0 && wi < cp.w;
                const u16 *src = x + (ok ? a_base[it] + ((int64_t)h * cp.w + wi) * cp.c + c : 0);
                nstf_cp16(dst, src, ok);
            } else {
                unsigned short v[8];
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const int64_t t = t0 + e;
                    int64_t c, r, sidx;
                    if (NHWC) {
                        c = t % cp.cg, sidx = (t / cp.cg) % cp.s, r = t / (cp.cg * cp.s);
                    } else {
                        sidx = t % cp.s, r = (t / cp.s) % cp.r, c = t / (cp.r * cp.s);
                    }
                    const int h = a_h0[it] + (int)r * cp.dh, wi = a_w0[it] + (int)sidx * cp.dw;
                    const bool ok = a_ok[it] && t < K && h >= 0 && h < cp.h && wi >= 0 && wi < cp.w;
                    const int64_t o = NHWC ? ((int64_t)h * cp.w + wi) * cp.c + c : (c * cp.h + h) * cp.w + wi;
                    v[e] = ok ? x[a_base[it] + o] : (unsigned short)0;
                }
                *(uint4 *)dst = make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16,
                                           v[4] | (unsigned)v[5] << 16, v[6] | (unsigned)v[7] << 16);
            }
        }
    };
    auto load_b = [&](u16 *s, int64_t k0) {
        constexpr int CH = BN * KC;
#pragma unroll
        for (int it = 0; it < (CH + NT - 1) / NT; it++) {
            const int c = tid + it * NT;
            if (CH % NT != 0 && c >= CH) break;
            const int row = c / KC, kc = c % KC;
            const int64_t j = n0 + row, t0 = k0 + kc * 8;
            u16 *dst = s + row * CI_LDS + kc * 8;
            if (b_vec) {
                const bool ok = j < N && t0 < K;
                nstf_cp16(dst, wg + (ok ? j * K + t0 : 0), ok);
            } else {
                unsigned short v[8];
#pragma unroll
                for (int e = 0; e < 8; e++) v[e] = j < N && t0 + e < K ? wg[j * K + t0 + e] : (unsigned short)0;
                *(uint4 *)dst = make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16,
                                           v[4] | (unsigned)v[5] << 16, v[6] | (unsigned)v[7] << 16);
            }
        }
    };

    nstf_mma_c acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int j = 0; j < TN; j++) nstf_mma_zero(acc[i][j]);

#pragma unroll
    for (int st = 0; st < CI_STAGES - 1; st++) {
        if (st < ktiles) {
            load_a(sA + st * BM * CI_LDS, st * CI_BK);
            load_b(sB + st * BN * CI_LDS, st * CI_BK);
        }
        nstf_cp_commit();
    }
    for (int64_t kt = 0; kt < ktiles; kt++) {
        nstf_cp_wait<CI_STAGES - 2>();
        __syncthreads();
        {
            const int64_t nk = kt + CI_STAGES - 1;
            if (nk < ktiles) {
                const int slot = (int)(nk % CI_STAGES);
                load_a(sA + slot * BM * CI_LDS, nk * CI_BK);
                load_b(sB + slot * BN * CI_LDS, nk * CI_BK);
            }
            nstf_cp_commit();
        }
#if !defined(NSTF_MMA_NV)
        __syncthreads(); /* plain loads: as in gemm.cu */
#endif
        const int slot = (int)(kt % CI_STAGES);
        const u16 *a_s = sA + slot * BM * CI_LDS + wm * WM * CI_LDS;
        const u16 *b_s = sB + slot * BN * CI_LDS + wn * WN * CI_LDS;
#pragma unroll
        for (int kk = 0; kk < CI_BK; kk += 16) {
            nstf_mma_a fa[TM];
            nstf_mma_b fb[TN];
#pragma unroll
            for (int i = 0; i < TM; i++) nstf_mma_load_a(fa[i], a_s + i * 16 * CI_LDS + kk, CI_LDS);
#pragma unroll
            for (int j = 0; j < TN; j++) nstf_mma_load_b(fb[j], b_s + j * 16 * CI_LDS + kk, CI_LDS);
#pragma unroll
            for (int i = 0; i < TM; i++)
#pragma unroll
                for (int j = 0; j < TN; j++) nstf_mma(acc[i][j], fa[i], fb[j]);
        }
    }
    nstf_cp_wait<0>();

    /* ---- epilogue: C[m][j] -> y[n, g N + j, p, q] (+ bias) ---- */
    const int64_t rbase = m0 + wm * WM, cbase = n0 + wn * WN;
#pragma unroll
    for (int i = 0; i < TM; i++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            const int64_t m = rbase + i * 16 + nstf_mma_c_row(e);
            if (m >= M) continue;
            const int64_t yrow = NHWC ? m * cp.k + g * N : ((m / PQ) * cp.k + g * N) * PQ + m % PQ;
            const int64_t ystep = NHWC ? 1 : PQ;
#pragma unroll
            for (int j = 0; j < TN; j++) {
                const int64_t col = cbase + j * 16 + nstf_mma_c_col(e);
                if (col < N) conv_store(y, yrow + col * ystep, acc[i][j].x[e], bias, g * N + col, y_bf16 != 0);
            }
        }
}

/* ---------------------------------------------------------------- host ---- */

nstf_status conv_igemm_check(const conv_params &cp) {
    const int64_t M = cp.n * cp.p * cp.q;
    const int64_t blocks = ((M + 127) / 128) * ((cp.kg + 63) / 64);
    if (blocks > 0x7fffffff || cp.groups > 65535)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level 4: grid too large (%lld blocks, %d groups)",
                              (long long)blocks, cp.groups);
    if (cp.h > (1 << 30) / 2 || cp.w > (1 << 30) / 2)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level 4: image %lldx%lld too large", (long long)cp.h,
                              (long long)cp.w);
    return NSTF_OK;
}

template <int BM, int BN, int WM, int WN, bool NHWC, int AMODE>
static nstf_status conv_igemm_go(const conv_params &cp, const u16 *x, const u16 *w, const float *bias, void *y,
                                 bool y_bf16, int b_vec, gpuStream_t s) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    const int threads = CI_WAVES * wave;
    const size_t smem = (size_t)CI_STAGES * (BM + BN) * CI_LDS * sizeof(u16);
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(conv_params, const u16 *, const u16 *, const float *, void *, int, int) =
            conv_igemm_kernel<BM, BN, WM, WN, NHWC, AMODE>;
        if (gpuFuncSetAttribute((const void *)kfn, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            gpuSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4: cannot allow %zu bytes of shared memory", smem);
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t M = cp.n * cp.p * cp.q;
    const dim3 grid((unsigned)(((M + BM - 1) / BM) * ((cp.kg + BN - 1) / BN)), (unsigned)cp.groups);
    conv_igemm_kernel<BM, BN, WM, WN, NHWC, AMODE><<<grid, threads, smem, s>>>(cp, x, w, bias, y, y_bf16, b_vec);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

template <int BM, int BN, int WM, int WN>
static nstf_status conv_igemm_layout(const conv_params &cp, bool nhwc, bool a_vec, const u16 *x, const u16 *w,
                                     const float *bias, void *y, bool y_bf16, int b_vec, gpuStream_t s) {
    if (!nhwc) return conv_igemm_go<BM, BN, WM, WN, false, CI_A_ELEM>(cp, x, w, bias, y, y_bf16, b_vec, s);
    if (a_vec) return conv_igemm_go<BM, BN, WM, WN, true, CI_A_VEC>(cp, x, w, bias, y, y_bf16, b_vec, s);
    return conv_igemm_go<BM, BN, WM, WN, true, CI_A_ELEM>(cp, x, w, bias, y, y_bf16, b_vec, s);
}

nstf_status conv_igemm_launch(const conv_params &cp, bool nhwc, const u16 *x, const u16 *w, const float *bias,
                              void *y, bool y_bf16, gpuStream_t s) {
    NSTF_TRY(conv_igemm_check(cp));
    const int64_t K = cp.cg * cp.r * cp.s;
    const bool a_vec = nhwc && cp.cg % 8 == 0 && cp.c % 8 == 0 && (uintptr_t)x % 16 == 0;
    const int b_vec = K % 8 == 0 && (uintptr_t)w % 16 == 0;
    if (cp.kg <= 64) return conv_igemm_layout<128, 64, 32, 32>(cp, nhwc, a_vec, x, w, bias, y, y_bf16, b_vec, s);
    return conv_igemm_layout<128, 128, 64, 32>(cp, nhwc, a_vec, x, w, bias, y, y_bf16, b_vec, s);
}
