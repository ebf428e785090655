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
 * No division in the tile loop: a thread's A pieces all sit at the same
 * column of the k-slice (the piece count per slice row divides the thread
 * count), so one tap (r, s, c) per thread is carried from slice to slice
 * (16-byte pieces) or decoded once per slice in 32 bits (element loads);
 * each row's pixel is decoded once before the loop.
 *
 * The tile loop is gemm.cu's: block tile BM x BN x BK, WAVES waves each
 * owning a WM x WN patch of 16 x 16 mma tiles, STAGES k-slices in shared
 * memory (NVIDIA: BK 64, 3 stages through cp.async; AMD: BK 32, 2 stages of
 * plain loads), rows padded by 8 elements (conflict-free ldmatrix phases);
 * blocks rasterized in groups of 8 block rows. The tile is the largest of
 * 128 x 128 (N > 64), 128 x 64 and 64 x 64 (4 waves) whose grid still gives
 * every SM a block: ResNet's late layers (few positions, many channels)
 * would otherwise leave most SMs idle. On NVIDIA, NHWC outputs are stored
 * two channels at a time (the accumulator's adjacent columns).
 *
 * On Hopper, convolutions without groups over 64-channel multiples take
 * conv_wgmma.h instead: the same GEMM on warpgroup MMA, A gathered by 4-D
 * TMA boxes of x (NCHW through NHWC copies). */
#include "conv_common.h"
#include "mma.h"
#if defined(NSTF_GPU_CUDA)
#include "conv_wgmma.h"
#endif

#if defined(NSTF_MMA_NV)
#define CI_BK 64
#define CI_STAGES 3
#else
#define CI_BK 32
#define CI_STAGES 2
#endif
#define CI_LDS (CI_BK + 8)
#define CI_GROUP_M 8

/* A gather: AV = 16-byte pieces (NHWC, c/groups % 8 == 0); else elements */
enum { CI_A_ELEM = 0, CI_A_VEC = 1 };
/* a row's pixel: an index in 32 bits (16-byte pieces) or an x offset */
template <bool VEC> struct ci_pix { typedef int64_t t; };
template <> struct ci_pix<true> { typedef int t; };
/* h0 of a row past the output: below any tap's reach (r dh <= 2^30) */
#define CI_OUT (-(3 << 29))

/* NVIDIA: blocks an SM the registers must allow: two for the 16-byte
 * gather's 128 x 64 tile (at most 128 registers, which it needs: measured
 * faster with two blocks an SM); elsewhere no floor (0), ptxas's own
 * choice. */
#if defined(NSTF_MMA_NV)
#define CI_BOUNDS(nt, minb) __launch_bounds__(nt, minb)
#else
#define CI_BOUNDS(nt, minb) __launch_bounds__(nt)
#endif

template <int BM, int BN, int WM, int WN, int WAVES, bool NHWC, int AMODE>
__global__ void CI_BOUNDS(WAVES *NSTF_WAVE, AMODE == CI_A_VEC && BM * BN == 128 * 64 ? 2 : 0)
    conv_igemm_kernel(conv_params cp, const u16 *__restrict__ x, const u16 *__restrict__ w,
                      const float *__restrict__ bias, void *__restrict__ y, int y_bf16, int b_vec, int y_pair) {
    constexpr int NT = WAVES * NSTF_WAVE, NWN = BN / WN, TM = WM / 16, TN = WN / 16;
    constexpr int KC = CI_BK / 8;                          /* 16-byte pieces per row of a slice */
    constexpr int A_IT = (BM * KC + NT - 1) / NT;          /* A pieces per thread per slice */
    static_assert((BM * KC) % NT == 0 && NT % KC == 0, "A pieces must divide evenly among the threads");
    static_assert((BM / WM) * (BN / WN) == WAVES, "the waves must tile the block");
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

    /* this thread's A rows: piece c = tid + it NT is row c / KC, column piece
     * tid % KC (the same for every it, as NT % KC == 0) */
    const int a_kc = tid % KC;
    const int H = (int)cp.h, W = (int)cp.w, S = (int)cp.s, CG = (int)cp.cg, KK = (int)K;
    /* a row's pixel: with 16-byte pieces its index n h w + h0 w + w0 (32
     * bits, conv_igemm_check), else its x offset at channel c_off; either
     * may lie before the image. With 16-byte pieces, rows past M get h0 =
     * CI_OUT: every tap's bounds check fails for them. */
    typename ci_pix<AMODE == CI_A_VEC>::t a_pix[A_IT];
    int a_h0[A_IT], a_w0[A_IT];
    bool a_ok[A_IT]; /* element gathers: the row is in the output (kept apart: fewer registers there) */
#pragma unroll
    for (int it = 0; it < A_IT; it++) {
        const int64_t m = m0 + (tid + it * NT) / KC;
        const int64_t mm = m < M ? m : 0, n = mm / PQ, pq = mm % PQ;
        a_ok[it] = m < M;
        a_h0[it] = (int)((pq / cp.q) * cp.sh - cp.ph);
        a_w0[it] = (int)((pq % cp.q) * cp.sw - cp.pw);
        if (AMODE == CI_A_VEC)
            a_pix[it] = (int)(n * cp.h * cp.w) + a_h0[it] * W + a_w0[it];
        else
            a_pix[it] = NHWC ? n * cp.h * cp.w * cp.c + c_off + ((int64_t)a_h0[it] * W + a_w0[it]) * cp.c
                             : (n * cp.c + c_off) * cp.h * cp.w + (int64_t)a_h0[it] * W + a_w0[it];
        if (AMODE == CI_A_VEC && m >= M) a_h0[it] = CI_OUT;
    }
    /* 16-byte pieces: the tap (r, s, c) of column t0 = k0 + a_kc 8, carried
     * from slice to slice (the loads come in slice order) */
    int tc = 0, ts = 0, tr = 0;
    if (AMODE == CI_A_VEC) {
        const int t0 = a_kc * 8, rs = t0 / CG;
        tc = t0 % CG, ts = rs % S, tr = rs / S;
    }

    auto load_a = [&](u16 *s, int64_t k0) {
        if (AMODE == CI_A_VEC) {
            const int dh = tr * cp.dh, dw = ts * cp.dw, dpix = dh * W + dw;
            const int64_t ch = c_off + tc;
            const bool t_ok = tr < (int)cp.r;
#pragma unroll
            for (int it = 0; it < A_IT; it++) {
                const int row = (tid + it * NT) / KC;
                const int h = a_h0[it] + dh, wi = a_w0[it] + dw;
                const bool ok = t_ok && (unsigned)h < (unsigned)H && (unsigned)wi < (unsigned)W;
                nstf_cp16(s + row * CI_LDS + a_kc * 8, x + (ok ? (int64_t)(a_pix[it] + dpix) * cp.c + ch : 0), ok);
            }
            tc += CI_BK; /* the next slice's tap */
            while (tc >= CG) {
                tc -= CG;
                if (++ts == S) ts = 0, tr++;
            }
            return;
        }
        /* element loads: the first tap decoded once (32 bits), then stepped */
        const int t0 = (int)k0 + a_kc * 8;
        int c0, r0, s0;
        if (NHWC) {
            c0 = t0 % CG, s0 = (t0 / CG) % S, r0 = t0 / (CG * S);
        } else {
            s0 = t0 % S, r0 = (t0 / S) % (int)cp.r, c0 = t0 / (S * (int)cp.r);
        }
#pragma unroll
        for (int it = 0; it < A_IT; it++) {
            const int row = (tid + it * NT) / KC;
            int c = c0, r = r0, sx = s0;
            unsigned short v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int h = a_h0[it] + r * cp.dh, wi = a_w0[it] + sx * cp.dw;
                const bool ok = a_ok[it] && t0 + e < KK && (unsigned)h < (unsigned)H && (unsigned)wi < (unsigned)W;
                const int64_t o = NHWC ? ((int64_t)(r * cp.dh) * W + sx * cp.dw) * cp.c + c
                                       : (int64_t)c * H * W + (int64_t)(r * cp.dh) * W + sx * cp.dw;
                v[e] = ok ? x[a_pix[it] + o] : (unsigned short)0;
                if (NHWC && ++c == CG) {
                    c = 0;
                    if (++sx == S) sx = 0, r++;
                } else if (!NHWC && ++sx == S) {
                    sx = 0;
                    if (++r == (int)cp.r) r = 0, c++;
                }
            }
            *(uint4 *)(s + row * CI_LDS + a_kc * 8) =
                make_uint4(v[0] | (unsigned)v[1] << 16, v[2] | (unsigned)v[3] << 16, v[4] | (unsigned)v[5] << 16,
                           v[6] | (unsigned)v[7] << 16);
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
#if defined(NSTF_MMA_NV)
            /* elements e, e + 1 (e even) are adjacent columns of one row */
            if (NHWC && y_pair && e % 2 == 0) {
#pragma unroll
                for (int j = 0; j < TN; j++) {
                    const int64_t col = cbase + j * 16 + nstf_mma_c_col(e);
                    if (col + 1 >= N) {
                        if (col < N) conv_store(y, yrow + col, acc[i][j].x[e], bias, g * N + col, y_bf16 != 0);
                        continue;
                    }
                    float v0 = acc[i][j].x[e], v1 = acc[i][j].x[e + 1];
                    if (bias) v0 += bias[g * N + col], v1 += bias[g * N + col + 1];
                    if (y_bf16)
                        *(unsigned *)((nstf_bf16 *)y + yrow + col) =
                            (unsigned)nstf_float_to_bf16(v0).bits | (unsigned)nstf_float_to_bf16(v1).bits << 16;
                    else
                        *(float2 *)((float *)y + yrow + col) = make_float2(v0, v1);
                }
                continue;
            }
            if (NHWC && y_pair) continue; /* odd e: stored with e - 1 */
#endif
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
    const int64_t blocks = ((M + 63) / 64) * ((cp.kg + 63) / 64); /* the smallest tile's grid */
    if (blocks > 0x7fffffff || cp.groups > 65535)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level 4: grid too large (%lld blocks, %d groups)",
                              (long long)blocks, cp.groups);
    if (cp.h > (1 << 30) / 2 || cp.w > (1 << 30) / 2)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level 4: image %lldx%lld too large", (long long)cp.h,
                              (long long)cp.w);
    /* the taps are counted in 32 bits (a slice past the end included), as
     * are a filter's reach (r dh, s dw) and the input's pixels (n h w) */
    const int64_t K = cp.cg * cp.r * cp.s;
    if (K > 0x7fffffff - 2 * CI_BK || cp.r * cp.dh > (1 << 30) || cp.s * cp.dw > (1 << 30) ||
        cp.n * cp.h * cp.w >= (1 << 30))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level 4: %lld taps per output, or %lld pixels of input, too many",
                              (long long)K, (long long)(cp.n * cp.h * cp.w));
    return NSTF_OK;
}

template <int BM, int BN, int WM, int WN, int WAVES, bool NHWC, int AMODE>
static nstf_status conv_igemm_go(const conv_params &cp, const u16 *x, const u16 *w, const float *bias, void *y,
                                 bool y_bf16, int b_vec, int y_pair, int wave, gpuStream_t s) {
    const int threads = WAVES * wave;
    const size_t smem = (size_t)CI_STAGES * (BM + BN) * CI_LDS * sizeof(u16);
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(conv_params, const u16 *, const u16 *, const float *, void *, int, int, int) =
            conv_igemm_kernel<BM, BN, WM, WN, WAVES, NHWC, AMODE>;
        if (gpuFuncSetAttribute((const void *)kfn, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
            gpuSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4: cannot allow %zu bytes of shared memory", smem);
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t M = cp.n * cp.p * cp.q;
    const dim3 grid((unsigned)(((M + BM - 1) / BM) * ((cp.kg + BN - 1) / BN)), (unsigned)cp.groups);
    conv_igemm_kernel<BM, BN, WM, WN, WAVES, NHWC, AMODE>
        <<<grid, threads, smem, s>>>(cp, x, w, bias, y, y_bf16, b_vec, y_pair);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

template <int BM, int BN, int WM, int WN, int WAVES>
static nstf_status conv_igemm_layout(const conv_params &cp, bool nhwc, bool a_vec, const u16 *x, const u16 *w,
                                     const float *bias, void *y, bool y_bf16, int b_vec, int y_pair, int wave,
                                     gpuStream_t s) {
    if (!nhwc)
        return conv_igemm_go<BM, BN, WM, WN, WAVES, false, CI_A_ELEM>(cp, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
    if (a_vec)
        return conv_igemm_go<BM, BN, WM, WN, WAVES, true, CI_A_VEC>(cp, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
    return conv_igemm_go<BM, BN, WM, WN, WAVES, true, CI_A_ELEM>(cp, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
}

/* The tile: the largest whose grid gives every SM a block (the groups
 * count as blocks too); 64 x 64 where none does. */
static int conv_igemm_tile(const conv_params &cp, int n_sm) {
    const int64_t M = cp.n * cp.p * cp.q, per = cp.groups;
    if (cp.kg > 64 && ((M + 127) / 128) * ((cp.kg + 127) / 128) * per >= n_sm) return 128;
    if (((M + 127) / 128) * ((cp.kg + 63) / 64) * per >= n_sm) return 64;
    return 0;
}

nstf_status conv_igemm_launch(const conv_params &cp, bool nhwc, const u16 *x, const u16 *w, const float *bias,
                              void *y, bool y_bf16, gpuStream_t s) {
    NSTF_TRY(conv_igemm_check(cp));
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    const int64_t K = cp.cg * cp.r * cp.s;
    const bool a_vec = nhwc && cp.cg % 8 == 0 && cp.c % 8 == 0 && (uintptr_t)x % 16 == 0;
    const int b_vec = K % 8 == 0 && (uintptr_t)w % 16 == 0;
    /* two channels a store: an even channel count per group keeps every pair aligned */
    const int y_pair = nhwc && cp.kg % 2 == 0 && (uintptr_t)y % (y_bf16 ? 4 : 8) == 0;
#if defined(NSTF_GPU_CUDA)
    if (nhwc && conv_wgmma_applies(cp, x, w)) return conv_wgmma_launch(cp, x, w, bias, y, y_bf16, y_pair, n_sm, s);
    if (!nhwc) {
        bool taken = false;
        NSTF_TRY(conv_wgmma_nchw(cp, x, w, bias, y, y_bf16, n_sm, s, &taken));
        if (taken) return NSTF_OK;
    }
#endif
    switch (conv_igemm_tile(cp, n_sm)) {
    case 128:
        return conv_igemm_layout<128, 128, 64, 32, 8>(cp, nhwc, a_vec, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
    case 64:
        return conv_igemm_layout<128, 64, 32, 32, 8>(cp, nhwc, a_vec, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
    default:
        return conv_igemm_layout<64, 64, 32, 32, 4>(cp, nhwc, a_vec, x, w, bias, y, y_bf16, b_vec, y_pair, wave, s);
    }
}
