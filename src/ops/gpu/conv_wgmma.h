/* conv_wgmma.h — level 4 of the conv2d ladder on Hopper (sm_90a): the
 * implicit GEMM of conv_igemm.cu on warpgroup MMA (`wgmma.mma_async`) with
 * both operands brought into shared memory by TMA. NVIDIA only:
 * conv_igemm.cu includes this file in CUDA builds, the kernel body exists
 * only in sm_90a device code, and the host takes this path only where the
 * loaded image holds it (cw_usable).
 *
 * It takes NHWC convolutions without groups whose channel count is a
 * multiple of 64 (every 3x3 and 1x1 layer of a ResNet past the stem):
 *   - a k-slice of 64 taps is then 64 channels of one filter tap (r, s),
 *     and the A slice of a block tile is x at that tap for 128 output
 *     positions: a 4-D TMA box (64 channels, bq columns, bp rows, bi
 *     images) of x [n][h][w][c] starting at (c0, q0 sw - pw + s dw, p0 sh -
 *     ph + r dh, i0), with traversal strides (1, sw, sh, 1) for the
 *     convolution's stride. TMA zero-fills what lies outside the image (the
 *     padding, and positions past the output's edge), so no thread gathers
 *     anything. The box arrives as 128 rows of 128 bytes (64 channels) in
 *     the 128-byte swizzle: exactly the K-major A slice of gemm_wgmma.h;
 *     row ((i bp) + p) bq + q of the tile is output position (i0 + i, p0 +
 *     p, q0 + q). bq, bp, bi are powers of two chosen so the tiles cover the
 *     output with the least padding (7 x 7 outputs: 8 x 8 x 2);
 *   - B is the filter bank w [k][r][s][c] as the 2-D matrix [k][r s c],
 *     TMA boxes of 64 taps x BN output channels, as the GEMM's weights;
 *   - the block structure is gemm_wgmma.h's: one producer warpgroup (one
 *     thread issues both loads per slice), two consumer warpgroups of 64
 *     rows each (`wgmma m64nBNk16`), a ring of stages with full / empty
 *     mbarriers, persistent blocks over the tiles (output channels fastest);
 *   - the epilogue writes two adjacent channels at a time (+ bias), each
 *     row to its output position, rows past the output skipped.
 * NCHW convolutions run the same kernel on re-laid copies (x and w to NHWC
 * order, the output back), in scratch taken from the stream's memory pool:
 * three transposes at the memory rate against a portable kernel at a
 * fraction of the matrix units' rate. */
#ifndef NSTF_GPU_CONV_WGMMA_H
#define NSTF_GPU_CONV_WGMMA_H

#include "wgmma_common.h"

/* The output tiling and the taps, as the kernel walks them. */
struct cw_geom {
    int n, p, q, k;    /* output: images, rows, columns, channels */
    int bi, bp, bq;    /* the box of output positions: bi bp bq = 128 */
    int ti, tp, tq;    /* tiles along images, rows, columns */
    int s, cs;         /* filter columns; 64-channel chunks per tap */
    int sh, sw, ph, pw, dh, dw;
    int kslices;       /* r s c / 64 */
};

#if defined(NSTF_WGMMA_DEVICE)
/* box (c0, w0, h0, i0) of a 4-D tensor map into shared memory */
static __device__ __forceinline__ void cw_tma_load4(uint32_t dst, const CUtensorMap *map, int c0, int w0, int h0,
                                                    int i0, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];"
                 ::"r"(dst), "l"((uint64_t)map), "r"(c0), "r"(w0), "r"(h0), "r"(i0), "r"(bar)
                 : "memory");
}
#endif

template <int BN>
__global__ void __launch_bounds__(WG_THREADS, 1)
    conv_wgmma_kernel(const __grid_constant__ CUtensorMap map_x, const __grid_constant__ CUtensorMap map_w,
                      const cw_geom g, const float *__restrict__ bias, void *__restrict__ y, int y_bf16, int y_pair) {
#if defined(NSTF_WGMMA_DEVICE)
    typedef wg_cfg<BN> cfg;
    constexpr int S = cfg::STAGES, NR = BN / 2;
    extern __shared__ unsigned char cw_smem_raw[];
    __shared__ __align__(8) uint64_t cw_bars[2 * S]; /* static: cw_usable reads its size */
    const uint32_t raw = wg_smem_addr(cw_smem_raw);
    const uint32_t ring = (raw + 1023u) & ~1023u;
    const uint32_t s_a = ring, s_w = ring + S * cfg::A_BYTES;
    const uint32_t bar_full = wg_smem_addr(cw_bars), bar_empty = bar_full + S * 8;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            wg_bar_init(bar_full + 8 * s, 1);
            wg_bar_init(bar_empty + 8 * s, 2);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    const int n_pn = (g.k + BN - 1) / BN;
    const int64_t n_tiles = (int64_t)g.ti * g.tp * g.tq * n_pn;

    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x == 0) {
            int stage = 0;
            uint32_t phase = 0;
            for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
                const int sp = (int)(t / n_pn), n0 = (int)(t % n_pn) * BN;
                const int i0 = sp / (g.tp * g.tq) * g.bi, p0 = sp / g.tq % g.tp * g.bp, q0 = sp % g.tq * g.bq;
                const int hb = p0 * g.sh - g.ph, wb = q0 * g.sw - g.pw;
                int r = 0, s = 0, cc = 0; /* the slice's tap and channel chunk */
                for (int kt = 0; kt < g.kslices; kt++) {
                    wg_bar_wait(bar_empty + 8 * stage, phase ^ 1);
                    wg_bar_expect_tx(bar_full + 8 * stage, cfg::STAGE_BYTES);
                    cw_tma_load4(s_a + stage * cfg::A_BYTES, &map_x, cc * 64, wb + s * g.dw, hb + r * g.dh, i0,
                                 bar_full + 8 * stage);
                    wg_tma_load(s_w + stage * cfg::B_BYTES, &map_w, kt * WG_BK, n0, bar_full + 8 * stage);
                    if (++cc == g.cs) {
                        cc = 0;
                        if (++s == g.s) s = 0, r++;
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

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    float acc[NR];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.0f;
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < n_tiles; t += gridDim.x) {
        const int sp = (int)(t / n_pn), n0 = (int)(t % n_pn) * BN;
        int prev = -1;
        for (int kt = 0; kt < g.kslices; kt++) {
            wg_slice_begin(bar_full, stage, phase);
            const uint32_t a0 = s_a + stage * cfg::A_BYTES + cw * 64 * 128;
            const uint32_t b0 = s_w + stage * cfg::B_BYTES;
#pragma unroll
            for (int kk = 0; kk < WG_BK / 16; kk++)
                wg_mma<BN, false>(acc, wg_desc(a0 + kk * 32), wg_desc(b0 + kk * 32), kt > 0 || kk > 0);
            wg_slice_end<NR, S>(acc, bar_empty, tid, prev, stage, phase);
        }
        wg_slices_drain<NR>(acc, bar_empty, tid, prev);

        /* ---- epilogue: accumulator i is tile row 16 warp + lane/4 (+8 for
         * i % 4 >= 2), column 8 (i / 4) + 2 (lane % 4) + i % 2 ---- */
        const int i0 = sp / (g.tp * g.tq) * g.bi, p0 = sp / g.tq % g.tp * g.bp, q0 = sp % g.tq * g.bq;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = cw * 64 + warp * 16 + lane / 4 + 8 * h;
            const int qq = q0 + row % g.bq, pp = p0 + row / g.bq % g.bp, ii = i0 + row / (g.bq * g.bp);
            if (qq >= g.q || pp >= g.p || ii >= g.n) continue;
            const int64_t o = (((int64_t)ii * g.p + pp) * g.q + qq) * g.k;
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int col = n0 + 8 * j + 2 * (lane % 4);
                if (col >= g.k) continue;
                float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
                const bool two = col + 1 < g.k;
                if (bias) {
                    v0 += bias[col];
                    if (two) v1 += bias[col + 1];
                }
                if (two && y_pair) {
                    if (y_bf16)
                        *(uint32_t *)((u16 *)y + o + col) =
                            (uint32_t)nstf_mma_f2bf(v0) | ((uint32_t)nstf_mma_f2bf(v1) << 16);
                    else
                        *(float2 *)((float *)y + o + col) = make_float2(v0, v1);
                } else if (y_bf16) {
                    ((u16 *)y)[o + col] = nstf_mma_f2bf(v0);
                    if (two) ((u16 *)y)[o + col + 1] = nstf_mma_f2bf(v1);
                } else {
                    ((float *)y)[o + col] = v0;
                    if (two) ((float *)y)[o + col + 1] = v1;
                }
            }
        }
    }
#endif /* NSTF_WGMMA_DEVICE */
}

/* ---------------------------------------------------------------- host ---- */

typedef void (*cw_kernel_fn)(const CUtensorMap, const CUtensorMap, const cw_geom, const float *, void *, int, int);

template <int BN> static int cw_usable(void) {
    static int cached = -1;
    if (cached < 0) cached = wg_kernel_usable((const void *)(cw_kernel_fn)conv_wgmma_kernel<BN>, 2 * (size_t)wg_cfg<BN>::STAGES * 8);
    return cached;
}

/* Whether the wgmma path takes this convolution: one group, 64-channel
 * multiples, strides TMA can traverse (<= 8), and every size within TMA's
 * and 32-bit limits (shape_ok); NHWC with x and w 16-byte aligned
 * (applies), or NCHW through re-laid copies (conv_wgmma_nchw). */
static bool conv_wgmma_shape_ok(const conv_params &cp) {
    if (cp.groups != 1 || cp.c % 64 != 0) return false;
    if (cp.sh > 8 || cp.sw > 8) return false;
    const int64_t K = cp.c * cp.r * cp.s;
    if (cp.n > (1 << 24) || cp.h > (1 << 24) || cp.w > (1 << 24) || cp.c > (1 << 24) || cp.k > (1 << 24) ||
        K > (1 << 30) || cp.p > (1 << 24) || cp.q > (1 << 24) || (int64_t)cp.r * cp.dh > (1 << 24) ||
        (int64_t)cp.s * cp.dw > (1 << 24) || cp.n * cp.h * cp.w * cp.c > ((int64_t)1 << 38) ||
        cp.n * cp.p * cp.q > ((int64_t)1 << 36))
        return false;
    return cw_usable<64>() && cw_usable<128>();
}
static bool conv_wgmma_applies(const conv_params &cp, const void *x, const void *w) {
    return ((uintptr_t)x | (uintptr_t)w) % 16 == 0 && conv_wgmma_shape_ok(cp);
}

/* The box of output positions: powers of two with bi bp bq = 128 (bq sw and
 * bp sh <= 256, TMA's box limit) covering the output with the fewest tiles,
 * the widest rows first among equals. */
static void cw_box(const conv_params &cp, cw_geom *g) {
    int64_t best = -1;
    for (int lq = 7; lq >= 0; lq--)
        for (int lp = 7 - lq; lp >= 0; lp--) {
            const int bq = 1 << lq, bp = 1 << lp, bi = 128 / (bq * bp);
            if (bq * cp.sw > 256 || bp * cp.sh > 256) continue;
            const int64_t tiles = ((cp.n + bi - 1) / bi) * ((cp.p + bp - 1) / bp) * ((cp.q + bq - 1) / bq);
            if (best < 0 || tiles < best) {
                best = tiles;
                g->bi = bi, g->bp = bp, g->bq = bq;
            }
        }
}

/* Output channels per tile: the fewest column-waves of persistent tiles,
 * a narrower tile paying for its lower MMA efficiency (as gemm_wgmma_bn).
 * 128 or 64: a 256-wide tile would pay off only on grids of over 500
 * tiles of 128 positions, beyond ResNet's layers at batch 32 and beyond
 * what test_conv_gpu's references can check. */
static int cw_bn(int64_t m_tiles, int64_t k, int n_sm) {
    static const int bns[2] = {128, 64};
    static const double eff[2] = {0.9, 0.75};
    int best = 64;
    double best_cost = -1;
    for (int i = 0; i < 2; i++) {
        const int64_t tiles = m_tiles * ((k + bns[i] - 1) / bns[i]);
        const double cost = (double)((tiles + n_sm - 1) / n_sm) * bns[i] / eff[i];
        if (best_cost < 0 || cost < best_cost) best = bns[i], best_cost = cost;
    }
    return best;
}

template <int BN>
static nstf_status cw_launch_bn(const CUtensorMap &mx, const CUtensorMap &mw, const cw_geom &g, const float *bias,
                                void *y, bool y_bf16, int y_pair, int n_sm, cudaStream_t s) {
    typedef wg_cfg<BN> cfg;
    static unsigned long long attr_set = 0;
    if (!nstf_gpu_device_done(&attr_set)) {
        if (cudaFuncSetAttribute((const void *)(cw_kernel_fn)conv_wgmma_kernel<BN>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) != cudaSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4 (wgmma): cannot allow %d bytes of shared memory",
                                  cfg::SMEM);
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t tiles = (int64_t)g.ti * g.tp * g.tq * ((g.k + BN - 1) / BN);
    const int grid = (int)(tiles < n_sm ? tiles : n_sm);
    conv_wgmma_kernel<BN><<<grid, WG_THREADS, cfg::SMEM, s>>>(mx, mw, g, bias, y, y_bf16, y_pair);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4 (wgmma): launch failed: %s", cudaGetErrorString(e));
    return NSTF_OK;
}

/* The convolution on wgmma (conv_wgmma_applies said yes). */
static nstf_status conv_wgmma_launch(const conv_params &cp, const u16 *x, const u16 *w, const float *bias, void *y,
                                     bool y_bf16, int y_pair, int n_sm, cudaStream_t s) {
    cw_geom g;
    g.n = (int)cp.n, g.p = (int)cp.p, g.q = (int)cp.q, g.k = (int)cp.k;
    cw_box(cp, &g);
    g.ti = (g.n + g.bi - 1) / g.bi, g.tp = (g.p + g.bp - 1) / g.bp, g.tq = (g.q + g.bq - 1) / g.bq;
    g.s = (int)cp.s, g.cs = (int)(cp.c / 64);
    g.sh = cp.sh, g.sw = cp.sw, g.ph = cp.ph, g.pw = cp.pw, g.dh = cp.dh, g.dw = cp.dw;
    const int64_t K = cp.c * cp.r * cp.s;
    g.kslices = (int)(K / 64);
    /* x [n][h][w][c] as 4-D (innermost first); the box's strides are the convolution's */
    CUtensorMap mx, mw;
    const cuuint64_t dims[4] = {(cuuint64_t)cp.c, (cuuint64_t)cp.w, (cuuint64_t)cp.h, (cuuint64_t)cp.n};
    const cuuint64_t strides[3] = {(cuuint64_t)cp.c * 2, (cuuint64_t)(cp.w * cp.c * 2),
                                   (cuuint64_t)(cp.h * cp.w * cp.c * 2)};
    const cuuint32_t box[4] = {64, (cuuint32_t)(g.bq * cp.sw), (cuuint32_t)(g.bp * cp.sh), (cuuint32_t)g.bi};
    const cuuint32_t estr[4] = {1, (cuuint32_t)cp.sw, (cuuint32_t)cp.sh, 1};
    CUresult r = wg_encoder()(&mx, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)x, dims, strides, box, estr,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4 (wgmma): cuTensorMapEncodeTiled failed (%d) for x", (int)r);
    const int64_t m_tiles = (int64_t)g.ti * g.tp * g.tq;
    const int bn = cw_bn(m_tiles, cp.k, n_sm);
    NSTF_TRY(wg_make_map(&mw, w, cp.k, K, K, bn, false, "conv2d level 4 (wgmma)"));
    if (bn == 128) return cw_launch_bn<128>(mx, mw, g, bias, y, y_bf16, y_pair, n_sm, s);
    return cw_launch_bn<64>(mx, mw, g, bias, y, y_bf16, y_pair, n_sm, s);
}


/* ---- NCHW through the NHWC kernel: x, w re-laid, y' re-laid back ---- */

/* dst[b][j][i] = src[b][i][j] for b < nb, i < rows, j < cols: 32 x 32
 * tiles through shared memory (reads and writes both along rows). */
template <typename T>
__global__ void __launch_bounds__(256)
    cw_transpose_kernel(const T *__restrict__ src, T *__restrict__ dst, int64_t rows, int64_t cols) {
    __shared__ T tile[32][33];
    const int64_t b = blockIdx.z, i0 = (int64_t)blockIdx.y * 32, j0 = (int64_t)blockIdx.x * 32;
    const T *sb = src + b * rows * cols;
    T *db = dst + b * rows * cols;
    for (int r = threadIdx.y; r < 32; r += 8)
        if (i0 + r < rows && j0 + threadIdx.x < cols) tile[r][threadIdx.x] = sb[(i0 + r) * cols + j0 + threadIdx.x];
    __syncthreads();
    for (int r = threadIdx.y; r < 32; r += 8)
        if (j0 + r < cols && i0 + threadIdx.x < rows) db[(j0 + r) * rows + i0 + threadIdx.x] = tile[threadIdx.x][r];
}

/* The same for 2-byte elements, even rows and columns, 4-byte aligned: 64 x
 * 64 tiles moved as pairs (128 bytes a warp row, as the 4-byte kernel). */
__global__ void __launch_bounds__(256)
    cw_transpose2_kernel(const u16 *__restrict__ src, u16 *__restrict__ dst, int64_t rows, int64_t cols) {
    __shared__ u16 tile[64][66];
    const int64_t b = blockIdx.z, i0 = (int64_t)blockIdx.y * 64, j0 = (int64_t)blockIdx.x * 64;
    const u16 *sb = src + b * rows * cols;
    u16 *db = dst + b * rows * cols;
    const int tx = threadIdx.x;
    for (int r = threadIdx.y; r < 64; r += 8) {
        const int64_t i = i0 + r, j = j0 + 2 * tx; /* j even, cols even: j + 1 < cols too */
        if (i < rows && j < cols) {
            const uint32_t v = *(const uint32_t *)(sb + i * cols + j);
            tile[r][2 * tx] = (u16)(v & 0xffffu);
            tile[r][2 * tx + 1] = (u16)(v >> 16);
        }
    }
    __syncthreads();
    for (int r = threadIdx.y; r < 64; r += 8) {
        const int64_t j = j0 + r, i = i0 + 2 * tx;
        if (j < cols && i < rows)
            *(uint32_t *)(db + j * rows + i) = (uint32_t)tile[2 * tx][r] | (uint32_t)tile[2 * tx + 1][r] << 16;
    }
}

template <typename T>
static nstf_status cw_transpose(const T *src, T *dst, int64_t nb, int64_t rows, int64_t cols, cudaStream_t s) {
    if (sizeof(T) == 2 && rows % 2 == 0 && cols % 2 == 0 && ((uintptr_t)src | (uintptr_t)dst) % 4 == 0) {
        const dim3 grid((unsigned)((cols + 63) / 64), (unsigned)((rows + 63) / 64), (unsigned)nb);
        cw_transpose2_kernel<<<grid, dim3(32, 8), 0, s>>>((const u16 *)src, (u16 *)dst, rows, cols);
    } else {
        const dim3 grid((unsigned)((cols + 31) / 32), (unsigned)((rows + 31) / 32), (unsigned)nb);
        cw_transpose_kernel<T><<<grid, dim3(32, 8), 0, s>>>(src, dst, rows, cols);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nstf_set_error(NSTF_ERR_GPU, "conv2d level 4 (wgmma, NCHW): transpose failed: %s",
                              cudaGetErrorString(e));
    return NSTF_OK;
}

/* An NCHW convolution on the wgmma kernel: x [n][c][h w] -> x' [n][h w][c]
 * and w [k][c][r s] -> w' [k][r s][c] in scratch from the stream's memory
 * pool (cudaMallocAsync, freed on the stream after use), the convolution
 * into y' [n][p q][k] (bias included), then y' -> y [n][k][p q]. *taken
 * says whether it ran: false (and NSTF_OK) when the shape does not suit or
 * the scratch cannot be had, for the caller's portable path. */
static nstf_status conv_wgmma_nchw(const conv_params &cp, const u16 *x, const u16 *w, const float *bias, void *y,
                                   bool y_bf16, int n_sm, cudaStream_t s, bool *taken) {
    *taken = false;
    if (!conv_wgmma_shape_ok(cp) || cp.n > 65535 || cp.k > 65535 || cp.c > 65535 * 32 || cp.p * cp.q > 65535 * 32)
        return NSTF_OK; /* the transposes' grids */
    const int64_t nx = cp.n * cp.c * cp.h * cp.w, nw = cp.k * cp.c * cp.r * cp.s, ny = cp.n * cp.k * cp.p * cp.q;
    const size_t bx = ((size_t)nx * 2 + 255) & ~(size_t)255, bw = ((size_t)nw * 2 + 255) & ~(size_t)255;
    const size_t by = (size_t)ny * (y_bf16 ? 2 : 4);
    void *scratch = NULL;
    if (cudaMallocAsync(&scratch, bx + bw + by, s) != cudaSuccess) {
        (void)cudaGetLastError(); /* no pool memory: the portable path, no lingering error */
        return NSTF_OK;
    }
    u16 *xt = (u16 *)scratch, *wt = (u16 *)((char *)scratch + bx);
    void *yt = (char *)scratch + bx + bw;
    nstf_status st = cw_transpose<u16>(x, xt, cp.n, cp.c, cp.h * cp.w, s);
    if (st == NSTF_OK) st = cw_transpose<u16>(w, wt, cp.k, cp.c, cp.r * cp.s, s);
    if (st == NSTF_OK) st = conv_wgmma_launch(cp, xt, wt, bias, yt, y_bf16, cp.k % 2 == 0, n_sm, s);
    if (st == NSTF_OK)
        st = y_bf16 ? cw_transpose<u16>((const u16 *)yt, (u16 *)y, cp.n, cp.p * cp.q, cp.k, s)
                    : cw_transpose<float>((const float *)yt, (float *)y, cp.n, cp.p * cp.q, cp.k, s);
    if (cudaFreeAsync(scratch, s) != cudaSuccess && st == NSTF_OK)
        st = nstf_set_error(NSTF_ERR_GPU, "conv2d level 4 (wgmma, NCHW): cannot free the scratch");
    *taken = st == NSTF_OK;
    return st;
}

#endif
