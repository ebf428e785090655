/* gemm_wgmma.h — the Hopper (sm_90a) path of nstf_gpu_gemm_bf16 (and of
 * nstf_gpu_gemm_f16: the same kernel with the fp16 wgmma): warpgroup
 * MMA (`wgmma.mma_async`) on operands that TMA (`cp.async.bulk.tensor`)
 * brings into shared memory. NVIDIA only: gemm.cu includes this file only
 * in CUDA builds, and the kernel body exists only in sm_90a device code
 * (__CUDA_ARCH_FEAT_SM90_ALL); other device passes compile an empty body
 * and the host never launches it there (gemm_wgmma_usable() checks the
 * loaded image).
 *
 * Same contract and epilogues as the portable kernel in gemm.cu. Design:
 *   - block tile 128 x BN x 64 (BN 256, 192, 128 or 64, chosen per shape so the
 *     tiles fill the SMs), one block per SM, persistent: block b takes tiles
 *     b, b + grid, ... in the grouped raster order of gemm_raster (gemm.cu;
 *     GEMM_GROUP_M block rows at a time) so the tiles in flight share A and
 *     W panels in L2;
 *   - 3 warpgroups: warpgroup 0 is the producer (one thread issues the TMA
 *     loads; the warpgroup gives its registers away with setmaxnreg), 1 and 2
 *     are consumers, each owning 64 rows x BN of the tile (BN/2 fp32
 *     accumulators per thread, `wgmma m64nBNk16`);
 *   - STAGES-deep ring of (A 128x64, W BNx64) k-slices; per stage a "full"
 *     mbarrier (producer's expect_tx; TMA completes the byte count) and an
 *     "empty" mbarrier (one arrive per consumer warpgroup once its wgmmas
 *     on the stage have retired: wgmma.wait_group 1 keeps one k-slice of
 *     MMAs in flight while the next is issued);
 *   - 128-byte swizzle: a 64-element bf16 row is exactly one 128-byte
 *     swizzle row, TMA writes the box swizzled and the wgmma descriptors say
 *     so (rows 128 B apart, 8-row groups 1024 B apart); stepping k by 16
 *     inside the slice adds 32 B to the descriptor's start address, as the
 *     swizzle is a function of the address bits;
 *   - TMA zero-fills rows beyond M or N and k beyond K, so any M, N and any
 *     K % 8 == 0 (16-byte row pitch, a TMA rule) work;
 *   - epilogue straight from the accumulators to global memory (each output
 *     element read (residual) and written by one thread, so R may alias C)
 *     while the producer already streams the next tile's slices; when rows
 *     are a multiple of 8 and C, R 16-byte aligned, a quad transposes its
 *     pairs with shuffles so each lane moves 8 consecutive outputs with
 *     16-byte accesses.
 * The tensor maps are encoded on the host per call (wgmma_common.h).
 *
 * The weight gradient dW (+)= dY^T X (nstf_gpu_gemm_dw) is the same kernel
 * with both operands MN-major (template MN): dY [tokens, out] and X [tokens,
 * in] are read as stored (TMA boxes of 64 tokens x 64 columns, wgmma with
 * both transpose bits), so nothing is transposed first; its output has few
 * tiles (out x in) and a long K (the tokens), so K is split into ranges
 * whose partial sums are added in split order afterwards (deterministic);
 * gemm_dw_plan picks the tile width (128, 192, 256) and the splits. */
#ifndef NSTF_GEMM_WGMMA_H
#define NSTF_GEMM_WGMMA_H

#include "wgmma_common.h"

#if defined(NSTF_WGMMA_DEVICE)

/* Two adjacent outputs (row, col), (row, col + 1) of the NONE / RESIDUAL
 * epilogue. vec: N even and C, R aligned for a paired access. */
static __device__ __forceinline__ void wg_store2(void *C, const void *R, int64_t row, int64_t col, int64_t M,
                                                 int64_t N, float v0, float v1, int epi, int c_bf16, int r_bf16,
                                                 int vec) {
    if (row >= M || col >= N) return;
    const int64_t o = row * N + col;
    if (vec) { /* col even and N even: col + 1 < N */
        if (epi == NSTF_GEMM_EPI_RESIDUAL) {
            if (r_bf16) {
                uint32_t rv = *(const uint32_t *)((const u16 *)R + o);
                v0 += nstf_bf16lo_to_float(rv);
                v1 += nstf_bf16hi_to_float(rv);
            } else {
                float2 rv = *(const float2 *)((const float *)R + o);
                v0 += rv.x;
                v1 += rv.y;
            }
        }
        if (c_bf16)
            *(uint32_t *)((u16 *)C + o) = (uint32_t)nstf_mma_f2bf(v0) | ((uint32_t)nstf_mma_f2bf(v1) << 16);
        else
            *(float2 *)((float *)C + o) = make_float2(v0, v1);
        return;
    }
    const float v[2] = {v0, v1};
    for (int e = 0; e < 2 && col + e < N; e++) {
        float x = v[e];
        if (epi == NSTF_GEMM_EPI_RESIDUAL)
            x += r_bf16 ? nstf_mma_bf2f(((const u16 *)R)[o + e]) : ((const float *)R)[o + e];
        if (c_bf16)
            ((u16 *)C)[o + e] = nstf_mma_f2bf(x);
        else
            ((float *)C)[o + e] = x;
    }
}
/* Residual of eight consecutive outputs (row, col .. col + 7), 16-byte
 * loads (vec == 2: col % 8 == 0, N % 8 == 0, R 16-byte aligned, so the
 * eight are all in range or all out); zeros when out of range. */
static __device__ __forceinline__ void wg_load8(float *x, const void *R, int64_t row, int64_t col, int64_t M,
                                                int64_t N, int r_bf16) {
    if (row >= M || col >= N) {
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = 0.0f;
        return;
    }
    const int64_t o = row * N + col;
    if (r_bf16) {
        const uint4 rv = *(const uint4 *)((const u16 *)R + o);
        const uint32_t w[4] = {rv.x, rv.y, rv.z, rv.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            x[2 * i] = nstf_bf16lo_to_float(w[i]);
            x[2 * i + 1] = nstf_bf16hi_to_float(w[i]);
        }
    } else {
        const float4 r0 = *(const float4 *)((const float *)R + o), r1 = *(const float4 *)((const float *)R + o + 4);
        x[0] = r0.x, x[1] = r0.y, x[2] = r0.z, x[3] = r0.w;
        x[4] = r1.x, x[5] = r1.y, x[6] = r1.z, x[7] = r1.w;
    }
}

/* Eight consecutive outputs (row, col .. col + 7) of a row of length ld,
 * 16-byte stores (col % 8 == 0, ld % 8 == 0, C 16-byte aligned). */
static __device__ __forceinline__ void wg_store8(void *C, int64_t o, const float *x, int c_bf16) {
    if (c_bf16) {
        uint4 v;
        v.x = (uint32_t)nstf_mma_f2bf(x[0]) | ((uint32_t)nstf_mma_f2bf(x[1]) << 16);
        v.y = (uint32_t)nstf_mma_f2bf(x[2]) | ((uint32_t)nstf_mma_f2bf(x[3]) << 16);
        v.z = (uint32_t)nstf_mma_f2bf(x[4]) | ((uint32_t)nstf_mma_f2bf(x[5]) << 16);
        v.w = (uint32_t)nstf_mma_f2bf(x[6]) | ((uint32_t)nstf_mma_f2bf(x[7]) << 16);
        *(uint4 *)((u16 *)C + o) = v;
    } else {
        *(float4 *)((float *)C + o) = make_float4(x[0], x[1], x[2], x[3]);
        *(float4 *)((float *)C + o + 4) = make_float4(x[4], x[5], x[6], x[7]);
    }
}

/* 4 x 4 transpose of float pairs across the 4 lanes of a quad: on entry
 * lane q's p[j] is pair j of lane q; on exit lane q's p[j] is lane j's
 * pair q. Two butterfly stages swap the lane/index high bit, then the low
 * bit; each lane sends the two pairs it gives up (selects on its own lane
 * bit, no dynamic register indexing). */
static __device__ __forceinline__ void wg_quad_transpose(float2 *p, int q) {
#pragma unroll
    for (int st = 0; st < 2; st++) {
        const int bitv = st == 0 ? 2 : 1, b = (q & bitv) != 0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            /* the two indices whose bit differs from the lane's: stage 0
             * (bit 1) k, k + 2; stage 1 (bit 0) 2k, 2k + 1 */
            const int lo = st == 0 ? k : 2 * k, hi = st == 0 ? k + 2 : 2 * k + 1;
            float2 send = b ? p[lo] : p[hi];
            float2 r;
            r.x = __shfl_xor_sync(0xffffffffu, send.x, bitv);
            r.y = __shfl_xor_sync(0xffffffffu, send.y, bitv);
            if (b)
                p[lo] = r;
            else
                p[hi] = r;
        }
    }
}
#endif /* NSTF_WGMMA_DEVICE */

/* MN: the weight-gradient form C (+)= A^T B with A [K, M] and B [K, N] read
 * as stored (both operands MN-major: TMA boxes of 64 k rows x 64 columns,
 * chunk c of a slice 8 KiB on), K split into `splits` ranges: work item t
 * is tile t % n_tiles of split t / n_tiles (the items in flight share their
 * k range's panels in L2), and split s writes its own C + s M N. */
template <int BN, bool F16, bool MN>
__global__ void __launch_bounds__(WG_THREADS, 1)
    gemm_wgmma_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_w,
                      void *C_all, const void *R, int64_t M, int64_t N, int64_t K, int epi, int c_bf16,
                      int r_bf16, int vec, int splits) {
#if defined(NSTF_WGMMA_DEVICE)
    typedef wg_cfg<BN> cfg;
    constexpr int S = cfg::STAGES, NR = BN / 2;
    extern __shared__ unsigned char wg_smem_raw[];
    /* The mbarriers live in static shared memory, which only this sm_90a
     * body declares: the host reads the kernel's static shared size to know
     * the loaded image holds this body (gemm_wgmma_usable). */
    __shared__ __align__(8) uint64_t wg_bars[2 * S];
    /* the ring: [S] A slices then [S] W slices, 1024-byte aligned */
    const uint32_t raw = wg_smem_addr(wg_smem_raw);
    const uint32_t ring = (raw + 1023u) & ~1023u;
    const uint32_t s_a = ring, s_w = ring + S * cfg::A_BYTES;
    const uint32_t bar_full = wg_smem_addr(wg_bars), bar_empty = bar_full + S * 8;

    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            wg_bar_init(bar_full + 8 * s, 1);  /* the producer's expect_tx arrive */
            wg_bar_init(bar_empty + 8 * s, 2); /* one arrive per consumer warpgroup */
        }
        /* make the initialized barriers visible to the async (TMA) proxy */
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    const int wg = wg_index(); /* warp-uniform to the compiler */
    const int64_t n_pm = (M + WG_BM - 1) / WG_BM, n_pn = (N + BN - 1) / BN, n_tiles = n_pm * n_pn;
    const int ktiles = (int)((K + WG_BK - 1) / WG_BK), k_per = (ktiles + splits - 1) / splits;
    const int64_t n_items = n_tiles * splits;

    if (wg == 0) {
        /* producer: 40 registers are plenty for one thread issuing TMA */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int64_t t = blockIdx.x; t < n_items; t += gridDim.x) {
                const gemm_tile tile = gemm_raster<WG_BM, BN>(t % n_tiles, n_pm, n_pn);
                const int m0 = (int)tile.m0, n0 = (int)tile.n0, sp = (int)(t / n_tiles);
                const int k0 = sp * k_per, k1 = k0 + k_per < ktiles ? k0 + k_per : ktiles;
                for (int kt = k0; kt < k1; kt++) {
                    /* a fresh barrier counts as having completed the phase
                     * before phase 0: the first lap does not wait */
                    wg_bar_wait(bar_empty + 8 * stage, phase ^ 1);
                    wg_bar_expect_tx(bar_full + 8 * stage, cfg::STAGE_BYTES);
                    if constexpr (MN) {
                        wg_tma_load_chunks<2>(s_a + stage * cfg::A_BYTES, 8192, &map_a, m0, kt * WG_BK,
                                              bar_full + 8 * stage);
                        wg_tma_load_chunks<BN / 64>(s_w + stage * cfg::B_BYTES, 8192, &map_w, n0, kt * WG_BK,
                                                    bar_full + 8 * stage);
                    } else {
                        wg_tma_load(s_a + stage * cfg::A_BYTES, &map_a, kt * WG_BK, m0, bar_full + 8 * stage);
                        wg_tma_load(s_w + stage * cfg::B_BYTES, &map_w, kt * WG_BK, n0, bar_full + 8 * stage);
                    }
                    if (++stage == S) {
                        stage = 0;
                        phase ^= 1;
                    }
                }
            }
        }
        return;
    }

    /* consumers: 232 registers (BN/2 accumulators + addressing) */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < n_items; t += gridDim.x) {
        const gemm_tile tile = gemm_raster<WG_BM, BN>(t % n_tiles, n_pm, n_pn);
        const int64_t m0 = tile.m0, n0 = tile.n0;
        const int sp = (int)(t / n_tiles), k0 = sp * k_per, k1 = k0 + k_per < ktiles ? k0 + k_per : ktiles;
        /* the output: with splits, this split's partial sums */
        void *const C = MN && splits > 1 ? (void *)((float *)C_all + (int64_t)sp * M * N) : C_all;
        int prev = -1;
        for (int kt = k0; kt < k1; kt++) {
            wg_slice_begin(bar_full, stage, phase);
            /* this warpgroup's 64 rows (K-major) or 64 columns (MN-major: chunk cw) */
            const uint32_t a0 = s_a + stage * cfg::A_BYTES + cw * 64 * 128;
            const uint32_t b0 = s_w + stage * cfg::B_BYTES;
            if constexpr (MN) {
                /* k16 steps are 16 rows of 128 B; B's 64-column chunks 8 KiB apart */
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    wg_mma_tt<BN>(acc, wg_desc_mn(a0 + kk * 2048, 8192), wg_desc_mn(b0 + kk * 2048, 8192),
                                  kt > k0 || kk > 0);
            } else {
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; kk++)
                    wg_mma<BN, F16>(acc, wg_desc(a0 + kk * 32), wg_desc(b0 + kk * 32), kt > 0 || kk > 0);
            }
            wg_slice_end<NR, S>(acc, bar_empty, tid, prev, stage, phase);
        }
        wg_slices_drain<NR>(acc, bar_empty, tid, prev);

        /* ---- epilogue: accumulator i of this thread is row 16 warp + lane/4
         * (+8 for i % 4 >= 2), column 8 (i / 4) + 2 (lane % 4) + i % 2 ---- */
        const int64_t row = m0 + cw * 64 + warp * 16 + lane / 4;
        const int64_t colt = n0 + 2 * (lane % 4);
        const int q = lane % 4;
        if (epi == NSTF_GEMM_EPI_SWIGLU && vec == 2) {
            /* columns [32g, 32g+16) of the tile are gate, [32g+16, 32g+32)
             * the up rows of the same 16 outputs: chunk j (j % 4 < 2) pairs
             * with chunk j + 2, held by the same thread. Two groups give 4
             * output chunks of 8; transposed in the quad, lane q owns output
             * chunk 2g + q: 16-byte stores (C 16-byte aligned; n_out % 16 == 0) */
            const int64_t n_out = N / 2;
#pragma unroll
            for (int g = 0; g < BN / 32; g += 2)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    float2 p[4];
#pragma unroll
                    for (int u = 0; u < 2; u++)
#pragma unroll
                        for (int jj = 0; jj < 2; jj++) {
                            const int j = 4 * (g + u) + jj;
                            p[2 * u + jj] = make_float2(silu_f(acc[4 * j + 2 * h]) * acc[4 * (j + 2) + 2 * h],
                                                        silu_f(acc[4 * j + 2 * h + 1]) * acc[4 * (j + 2) + 2 * h + 1]);
                        }
                    wg_quad_transpose(p, q);
                    const float x[8] = {p[0].x, p[0].y, p[1].x, p[1].y, p[2].x, p[2].y, p[3].x, p[3].y};
                    const int64_t r = row + 8 * h, oc = n0 / 2 + 16 * g + 8 * q;
                    if (r < M && oc < n_out) wg_store8(C, r * n_out + oc, x, c_bf16);
                }
        } else if (epi == NSTF_GEMM_EPI_SWIGLU) {
            const int64_t n_out = N / 2;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                if (j % 4 >= 2) continue;
                const int64_t gc = colt + 8 * j; /* gate column in W rows; n0 % 32 == 0 */
                const int64_t oc = (gc / 32) * 16 + gc % 32;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int64_t r = row + 8 * h;
                    if (r >= M || oc >= n_out) continue;
                    const float v0 = silu_f(acc[4 * j + 2 * h]) * acc[4 * (j + 2) + 2 * h];
                    const float v1 = silu_f(acc[4 * j + 2 * h + 1]) * acc[4 * (j + 2) + 2 * h + 1];
                    /* n_out % 16 == 0 and oc even: the pair is in range */
                    const int64_t o = r * n_out + oc;
                    if (c_bf16 && vec)
                        *(uint32_t *)((u16 *)C + o) = (uint32_t)nstf_mma_f2bf(v0) | ((uint32_t)nstf_mma_f2bf(v1) << 16);
                    else if (c_bf16) {
                        ((u16 *)C)[o] = nstf_mma_f2bf(v0);
                        ((u16 *)C)[o + 1] = nstf_mma_f2bf(v1);
                    } else if (vec)
                        *(float2 *)((float *)C + o) = make_float2(v0, v1);
                    else {
                        ((float *)C)[o] = v0;
                        ((float *)C)[o + 1] = v1;
                    }
                }
            }
        } else if (vec == 2) {
            /* a quad holds 4 chunks of 8 columns as pairs; transposed, lane
             * q owns all 8 columns of chunk 4g + q: one 16-byte (bf16) or
             * two 16-byte (f32) accesses instead of four 4- or 8-byte ones.
             * Items (g, h) go in batches of 4 whose residual loads are all
             * issued before the batch's stores: with R possibly aliasing C
             * the compiler cannot hoist a load above an earlier store. */
            constexpr int ITEMS = BN / 16, BATCH = 4;
#pragma unroll
            for (int b = 0; b < ITEMS; b += BATCH) {
                float rx[BATCH][8];
                if (epi == NSTF_GEMM_EPI_RESIDUAL) {
#pragma unroll
                    for (int i = 0; i < BATCH; i++)
                        wg_load8(rx[i], R, row + 8 * ((b + i) % 2), n0 + 32 * ((b + i) / 2) + 8 * q, M, N, r_bf16);
                }
#pragma unroll
                for (int i = 0; i < BATCH; i++) {
                    const int g = (b + i) / 2, h = (b + i) % 2;
                    float2 p[4];
#pragma unroll
                    for (int jj = 0; jj < 4; jj++)
                        p[jj] = make_float2(acc[4 * (4 * g + jj) + 2 * h], acc[4 * (4 * g + jj) + 2 * h + 1]);
                    wg_quad_transpose(p, q);
                    float x[8] = {p[0].x, p[0].y, p[1].x, p[1].y, p[2].x, p[2].y, p[3].x, p[3].y};
                    if (epi == NSTF_GEMM_EPI_RESIDUAL)
#pragma unroll
                        for (int e = 0; e < 8; e++) x[e] += rx[i][e];
                    const int64_t r = row + 8 * h, col = n0 + 32 * g + 8 * q;
                    if (r < M && col < N) wg_store8(C, r * N + col, x, c_bf16);
                }
            }
        } else {
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                wg_store2(C, R, row, colt + 8 * j, M, N, acc[4 * j], acc[4 * j + 1], epi, c_bf16, r_bf16, vec);
                wg_store2(C, R, row + 8, colt + 8 * j, M, N, acc[4 * j + 2], acc[4 * j + 3], epi, c_bf16, r_bf16,
                          vec);
            }
        }
    }
#endif /* NSTF_WGMMA_DEVICE */
}

/* ---------------------------------------------------------------- host ---- */


/* Whether this process can run the BN-wide (MN: weight-gradient) instance
 * of the wgmma GEMM: wg_kernel_usable, its body declaring 2 x STAGES
 * mbarriers. The forward asks for the 128-wide instance. */
template <int BN, bool MN> static int gemm_wgmma_body_usable(void) {
    static int cached = -1;
    if (cached < 0) {
        void (*kfn)(const CUtensorMap, const CUtensorMap, void *, const void *, int64_t, int64_t, int64_t, int, int,
                    int, int, int) = gemm_wgmma_kernel<BN, false, MN>;
        cached = wg_kernel_usable((const void *)kfn, 2 * (size_t)wg_cfg<BN>::STAGES * 8);
    }
    return cached;
}
static int gemm_wgmma_usable(void) { return gemm_wgmma_body_usable<128, false>(); }

/* Tile width for an M x N problem on n_sm SMs: the fewest "column-waves"
 * (waves of persistent tiles x tile width), a narrower tile paying for its
 * lower MMA efficiency (wider wgmma reuses each A fragment more). */
static int gemm_wgmma_bn(int64_t m, int64_t n, int n_sm) {
    static const int bns[4] = {256, 192, 128, 64};
    static const double eff[4] = {1.0, 0.97, 0.9, 0.75};
    int best = 256;
    double best_cost = 0;
    for (int i = 0; i < 4; i++) {
        const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + bns[i] - 1) / bns[i]);
        const int64_t waves = (tiles + n_sm - 1) / n_sm;
        const double cost = (double)waves * bns[i] / eff[i];
        if (i == 0 || cost < best_cost) {
            best = bns[i];
            best_cost = cost;
        }
    }
    return best;
}

template <int BN, bool F16>
static nstf_status gemm_wgmma_launch_bn(const u16 *a, const u16 *w, void *c, const void *r, int64_t m, int64_t n,
                                        int64_t k, int epi, int c_bf16, int r_bf16, int vec, int n_sm,
                                        cudaStream_t stream) {
    typedef wg_cfg<BN> cfg;
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(const CUtensorMap, const CUtensorMap, void *, const void *, int64_t, int64_t, int64_t, int, int,
                    int, int, int) = gemm_wgmma_kernel<BN, F16, false>;
        if (cudaFuncSetAttribute((const void *)kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) !=
            cudaSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "gemm (wgmma): cannot allow %d bytes of shared memory", cfg::SMEM);
        nstf_gpu_device_mark(&attr_set);
    }
    CUtensorMap map_a, map_w;
    NSTF_TRY(wg_make_map(&map_a, a, m, k, k, WG_BM, F16, "gemm (wgmma)"));
    NSTF_TRY(wg_make_map(&map_w, w, n, k, k, BN, F16, "gemm (wgmma)"));
    const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + BN - 1) / BN);
    const int grid = (int)(tiles < n_sm ? tiles : n_sm);
    gemm_wgmma_kernel<BN, F16, false><<<grid, WG_THREADS, cfg::SMEM, stream>>>(map_a, map_w, c, r, m, n, k, epi,
                                                                                c_bf16, r_bf16, vec, 1);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nstf_set_error(NSTF_ERR_GPU, "gemm (wgmma): launch failed: %s", cudaGetErrorString(e));
    return NSTF_OK;
}

/* The tile width bn (256, 192, 128 or 64) of gemm_wgmma_bn; F16: fp16 operands. */
template <bool F16>
static nstf_status gemm_wgmma_launch(int bn, const u16 *a, const u16 *w, void *c, const void *r, int64_t m, int64_t n,
                                     int64_t k, int epi, int c_bf16, int r_bf16, int vec, int n_sm,
                                     cudaStream_t stream) {
    if (bn == 256) return gemm_wgmma_launch_bn<256, F16>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, stream);
    if (bn == 192) return gemm_wgmma_launch_bn<192, F16>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, stream);
    if (bn == 128) return gemm_wgmma_launch_bn<128, F16>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, stream);
    return gemm_wgmma_launch_bn<64, F16>(a, w, c, r, m, n, k, epi, c_bf16, r_bf16, vec, n_sm, stream);
}

/* ---- the weight gradient: C [M, N] (+)= A^T B, A [K, M] and B [K, N] as stored ---- */

/* Tile width and k splits for the weight gradient on n_sm SMs: the least
 * estimated time, in k-slices of a 64-wide tile, over widths 128, 192, 256
 * (a narrower tile paying for its lower MMA efficiency) and 1-16 splits of
 * at least 8 k-slices each; a split costs its partial sums' traffic (about
 * 4 slices' worth a tile, written once, read back by the reduction). */
static void gemm_dw_plan(int64_t m, int64_t n, int64_t k, int n_sm, int *bn_out, int *splits_out) {
    static const int bns[3] = {256, 192, 128};
    static const double eff[3] = {1.0, 0.97, 0.9};
    const int64_t ktiles = (k + WG_BK - 1) / WG_BK;
    double best = -1;
    for (int i = 0; i < 3; i++) {
        const int64_t tiles = ((m + WG_BM - 1) / WG_BM) * ((n + bns[i] - 1) / bns[i]);
        for (int sp = 1; sp <= 16; sp++) {
            const int64_t per = (ktiles + sp - 1) / sp;
            if (sp > 1 && (per < 8 || (sp - 1) * per >= ktiles)) break; /* too short, or an empty split */
            const int64_t waves = (tiles * sp + n_sm - 1) / n_sm;
            double cost = (double)waves * ((double)per / eff[i] + (sp > 1 ? 4.0 : 0.0)) * bns[i] / 64.0;
            if (sp > 1) cost += (double)tiles * sp * 4.0 * bns[i] / 64.0 / n_sm; /* the reduction's reads */
            if (best < 0 || cost < best) {
                best = cost;
                *bn_out = bns[i];
                *splits_out = sp;
            }
        }
    }
}

template <int BN>
static nstf_status gemm_dw_launch_bn(const u16 *a, int64_t lda, const u16 *b, int64_t ldb, float *c, int64_t m,
                                     int64_t n, int64_t k, int splits, int vec, int n_sm, cudaStream_t stream) {
    typedef wg_cfg<BN> cfg;
    static unsigned long long attr_set = 0;
    void (*kfn)(const CUtensorMap, const CUtensorMap, void *, const void *, int64_t, int64_t, int64_t, int, int, int,
                int, int) = gemm_wgmma_kernel<BN, false, true>;
    if (!nstf_gpu_device_done(&attr_set)) {
        if (cudaFuncSetAttribute((const void *)kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) !=
            cudaSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "weight gradient (wgmma): cannot allow %d bytes of shared memory",
                                  cfg::SMEM);
        nstf_gpu_device_mark(&attr_set);
    }
    CUtensorMap map_a, map_b;
    NSTF_TRY(wg_make_map(&map_a, a, k, m, lda, 64, false, "weight gradient (wgmma)"));
    NSTF_TRY(wg_make_map(&map_b, b, k, n, ldb, 64, false, "weight gradient (wgmma)"));
    const int64_t items = ((m + WG_BM - 1) / WG_BM) * ((n + BN - 1) / BN) * splits;
    const int grid = (int)(items < n_sm ? items : n_sm);
    /* one split adds into C; several write their partial sums (C is then the partials' buffer) */
    const int epi = splits == 1 ? NSTF_GEMM_EPI_RESIDUAL : NSTF_GEMM_EPI_NONE;
    kfn<<<grid, WG_THREADS, cfg::SMEM, stream>>>(map_a, map_b, c, c, m, n, k, epi, 0, 0, vec, splits);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nstf_set_error(NSTF_ERR_GPU, "weight gradient (wgmma): launch failed: %s", cudaGetErrorString(e));
    return NSTF_OK;
}

#endif /* NSTF_GEMM_WGMMA_H */
