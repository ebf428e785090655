/* attn_bwd_wgmma.h — the Hopper (sm_90a) path of the flash-attention
 * backward (attn_bwd.cu): the same two deterministic kernels (dQ over query
 * tiles; dK, dV over key tiles, every query head of the group), their
 * products on warpgroup MMA (`wgmma.mma_async`) with the operands brought
 * into shared memory by TMA. NVIDIA only: attn_bwd.cu includes this file in
 * CUDA builds, the kernel bodies exist only in sm_90a device code, and the
 * host takes this path only when the loaded image holds them
 * (attn_bwd_wgmma_usable) and the operands meet TMA's rules; otherwise the
 * portable mma.h kernels run (and with NSTF_FLASH=mma).
 *
 * Both kernels have the forward's shape (flash_attn_wgmma.h): 3 warpgroups,
 * one TMA producer and two consumers of 64 rows each, so a block owns 128
 * rows: query rows (dq) or keys (dkv). The block's two "owned" operands (Q
 * and dO for dq, K and V for dkv) are loaded once; the two "streamed" ones
 * (K and V tiles of 64 keys for dq; Q and dO tiles of 64 queries for dkv)
 * go through a 3-deep ring. Every product is one of two shapes:
 *   - bw_ss: [64 owned rows] x [64 streamed rows]^T over the head dimension,
 *     both operands K-major in shared memory (S = Q K^T and dP = dO V^T in
 *     dq; S^T = K Q^T and dP^T = V dO^T in dkv);
 *   - wg_rs_tb (wgmma_common.h, the forward's P V): [64 rows] x [64
 *     streamed rows, head dim] with the left operand (P or dS, rounded to
 *     bf16 as in the portable kernels) from registers and the streamed tile
 *     read transposed (dQ += dS K in dq; dV += P^T dO
 *     and dK += dS^T Q in dkv).
 * The log-sum-exp (times log2 e) and D = dO . O are laid out [sequence]
 * [head][token] by bw_dot_kernel; dkv reads a streamed tile's 64 values of
 * each from shared memory, where warp 1 of the producer warpgroup stores
 * them (it arrives on the tile's "full" barrier after TMA's bytes). */
#ifndef NSTF_ATTN_BWD_WGMMA_H
#define NSTF_ATTN_BWD_WGMMA_H

#include "wgmma_common.h"

#define BW_THREADS 384
#define BW_ROWS 128 /* rows a block owns: 64 per consumer warpgroup */
#define BW_T 64     /* rows of a streamed tile */
#define BW_STAGES 3

template <int HD> struct bw_cfg {
    static constexpr int OWN_BYTES = BW_ROWS * HD * 2; /* one owned operand */
    static constexpr int T_BYTES = BW_T * HD * 2;      /* one streamed tile */
    static constexpr int STAT_BYTES = 2 * BW_T * 4;    /* a tile's lse and D (dkv) */
    static constexpr int SMEM = 2 * OWN_BYTES + BW_STAGES * (2 * T_BYTES + STAT_BYTES) + 1024;
    static constexpr int N_BARS = 1 + 3 * BW_STAGES; /* owned; per stage X full, Y full, empty */
};

/* D[s][h][t] = dO . O and L[s][h][t] = lse * log2(e) of token t of sequence
 * s (n_seq sequences of seq_len tokens, n_seq * seq_len rows in all). */
__global__ void __launch_bounds__(256)
    bw_dot_kernel(const u16 *__restrict__ out, int64_t o_stride, const u16 *__restrict__ dout, int64_t do_stride,
                  const float *__restrict__ lse, float *__restrict__ D, float *__restrict__ L, int64_t n_rows,
                  int64_t seq_len, int n_heads, int hd) {
    const int64_t n = n_rows * n_heads, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
        const int64_t row = r / n_heads, sq = row / seq_len, t = row % seq_len;
        const int h = (int)(r % n_heads);
        const u16 *o = out + row * o_stride + (int64_t)h * hd, *g = dout + row * do_stride + (int64_t)h * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s = fmaf(nstf_mma_bf2f(o[d]), nstf_mma_bf2f(g[d]), s);
        const int64_t i = (sq * n_heads + h) * seq_len + t;
        D[i] = s;
        L[i] = lse[r] * 1.4426950408889634f;
    }
}

#if defined(NSTF_WGMMA_DEVICE)
/* acc[32] = A B^T, A the consumer's 64 owned rows (a_wg: their address in
 * the owned operand, chunks BW_ROWS * 128 B apart), B a streamed tile of 64
 * rows (chunks BW_T * 128 B apart); issued, not committed. */
template <int HD> static __device__ __forceinline__ void bw_ss(float *acc, uint32_t a_wg, uint32_t b) {
    const uint64_t da = wg_desc(a_wg), db = wg_desc(b);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int c = kk / 4, off = (kk % 4) * 32;
        nstf_wgmma_m64n64(acc, wg_desc_add(da, c * BW_ROWS * 128 + off), wg_desc_add(db, c * BW_T * 128 + off), kk > 0);
    }
}
static __device__ __forceinline__ void bw_commit_wait0(void) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
#endif

/* dQ: a block owns 128 query rows of one head (grid: heads, query tiles
 * heavy first, sequences) and streams the K, V tiles of 64 keys up to its
 * last row's position. */
template <int HD>
__global__ void __launch_bounds__(BW_THREADS, 1)
    bw_dq_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_do,
                 const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                 const float *__restrict__ L, const float *__restrict__ D, u16 *__restrict__ dq, int64_t dq_stride,
                 int64_t n_tok, int64_t pos0, int n_heads, int n_kv, float scale_log2, float scale) {
#if defined(NSTF_WGMMA_DEVICE)
    typedef bw_cfg<HD> cfg;
    constexpr int S = BW_STAGES, NCH = HD / 64, NO = HD / 2;
    extern __shared__ unsigned char bw_smem_raw[];
    __shared__ __align__(8) uint64_t bw_bars[cfg::N_BARS]; /* static: only the sm_90a body has them */
    const uint32_t base = (wg_smem_addr(bw_smem_raw) + 1023u) & ~1023u;
    const uint32_t s_a = base, s_b = s_a + cfg::OWN_BYTES, s_x = s_b + cfg::OWN_BYTES, s_y = s_x + S * cfg::T_BYTES;
    const uint32_t bar_own = wg_smem_addr(bw_bars), bar_fx = bar_own + 8, bar_fy = bar_fx + 8 * S,
                   bar_e = bar_fy + 8 * S;

    const int64_t seq = blockIdx.z, nk = pos0 + n_tok;
    const int64_t n_qt = (n_tok + BW_ROWS - 1) / BW_ROWS;
    const int64_t t0 = (n_qt - 1 - (int64_t)blockIdx.y) * BW_ROWS;
    const int64_t t1 = t0 + BW_ROWS < n_tok ? t0 + BW_ROWS : n_tok;
    const int h = blockIdx.x, hkv = h / (n_heads / n_kv);
    const int64_t kv_end = pos0 + t1;
    const int n_tiles = (int)((kv_end + BW_T - 1) / BW_T);

    wg_ring_init(bar_own, bar_fx, bar_fy, bar_e, S, 1, t0 + 64 < n_tok ? 2 : 1); /* consumers with rows */

    const int wg = wg_index(); /* warp-uniform to the compiler */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0) {
            const int qrow = (int)(seq * n_tok + t0), krow = (int)(seq * nk);
            wg_bar_expect_tx(bar_own, 2 * cfg::OWN_BYTES);
            wg_tma_load_chunks<NCH>(s_a, BW_ROWS * 128, &map_q, h * HD, qrow, bar_own);
            wg_tma_load_chunks<NCH>(s_b, BW_ROWS * 128, &map_do, h * HD, qrow, bar_own);
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % S;
                wg_bar_wait(bar_e + 8 * st, ((uint32_t)(it / S) & 1) ^ 1);
                const int r = krow + it * BW_T;
                wg_bar_expect_tx(bar_fx + 8 * st, cfg::T_BYTES);
                wg_tma_load_chunks<NCH>(s_x + st * cfg::T_BYTES, BW_T * 128, &map_k, hkv * HD, r, bar_fx + 8 * st);
                wg_bar_expect_tx(bar_fy + 8 * st, cfg::T_BYTES);
                wg_tma_load_chunks<NCH>(s_y + st * cfg::T_BYTES, BW_T * 128, &map_v, hkv * HD, r, bar_fy + 8 * st);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    if (t0 + cw * 64 >= n_tok) return; /* every row past the end: not counted by the empty barriers */
    const int64_t row0 = t0 + cw * 64 + warp * 16 + lane / 4; /* slot 0; slot 1 is row0 + 8 */
    const int64_t wg_first = pos0 + t0 + cw * 64;
    const int64_t wg_last = wg_first + 63 < kv_end - 1 ? wg_first + 63 : kv_end - 1;
    const int n_my = (int)(wg_last / BW_T) + 1 < n_tiles ? (int)(wg_last / BW_T) + 1 : n_tiles;
    float l2[2], dd[2];
    for (int r = 0; r < 2; r++) {
        const int64_t t = row0 + 8 * r;
        const int64_t i = (seq * n_heads + h) * n_tok + t;
        l2[r] = t < n_tok ? L[i] : 0.0f; /* rows past the end have Q = dO = 0: dS = 0 */
        dd[r] = t < n_tok ? D[i] : 0.0f;
    }
    float acc[NO], sc[32], dp[32];
#pragma unroll
    for (int i = 0; i < NO; i++) acc[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) sc[i] = dp[i] = 0.0f;
    const uint32_t q_wg = s_a + cw * 64 * 128, do_wg = s_b + cw * 64 * 128;
    wg_bar_wait(bar_own, 0);
    for (int it = 0; it < n_my; it++) {
        const int st = it % S;
        const uint32_t ph = (uint32_t)(it / S) & 1;
        const uint32_t kb = s_x + st * cfg::T_BYTES, vb = s_y + st * cfg::T_BYTES;
        /* both tiles first: a wait (a loop) between two MMAs of one
         * group makes ptxas serialize them */
        wg_bar_wait(bar_fx + 8 * st, ph);
        wg_bar_wait(bar_fy + 8 * st, ph);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        bw_ss<HD>(sc, q_wg, kb);  /* S = Q K^T */
        bw_ss<HD>(dp, do_wg, vb); /* dP = dO V^T */
        bw_commit_wait0();
        wg_fence_regs<32>(sc);
        wg_fence_regs<32>(dp);
        const int64_t kv0 = (int64_t)it * BW_T;
        uint32_t pd[16];
#pragma unroll
        for (int i = 0; i < 32; i += 2) {
            const int r = (i >> 1) & 1;
            const int64_t key = kv0 + 8 * (i >> 2) + 2 * (lane & 3), qp = pos0 + row0 + 8 * r;
            float x[2];
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = key + e <= qp ? nstf_exp2(fmaf(sc[i + e], scale_log2, -l2[r])) : 0.0f;
                x[e] = p * (dp[i + e] - dd[r]); /* dS */
            }
            pd[i / 2] = nstf_mma_pack2(x[0], x[1]);
        }
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_rs_tb<HD, BW_T>(acc, pd, kb); /* dQ += dS K */
        bw_commit_wait0();
        wg_fence_regs<NO>(acc);
        if (tid == 0) wg_bar_arrive(bar_e + 8 * st);
    }
    /* tiles wholly past this warpgroup's rows: the arrive must count for the
     * tile's fill, not run ahead of it (no MMA in a branch: ptxas serializes
     * every wgmma of a kernel that has one on a path it cannot prove
     * uniform) */
    for (int it = n_my; it < n_tiles; it++) {
        wg_bar_wait(bar_fy + 8 * (it % S), (uint32_t)(it / S) & 1);
        if (tid == 0) wg_bar_arrive(bar_e + 8 * (it % S));
    }
    u16 *ob = dq + seq * n_tok * dq_stride + (int64_t)h * HD;
#pragma unroll
    for (int i = 0; i < NO; i += 2) {
        const int64_t t = row0 + ((i & 2) ? 8 : 0);
        if (t >= n_tok) continue;
        const int col = 8 * (i >> 2) + 2 * (lane & 3);
        *(uint32_t *)(ob + t * dq_stride + col) = nstf_mma_pack2(acc[i] * scale, acc[i + 1] * scale);
    }
#endif /* NSTF_WGMMA_DEVICE */
}

/* dK, dV: a block owns 128 keys of one kv head (grid: kv heads, key tiles
 * early (heavy) first, sequences) and streams, for every query head of the
 * group, the Q and dO tiles of 64 queries from the first that sees its first
 * key to the end. */
template <int HD>
__global__ void __launch_bounds__(BW_THREADS, 1)
    bw_dkv_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_do,
                  const __grid_constant__ CUtensorMap map_k, const __grid_constant__ CUtensorMap map_v,
                  const float *__restrict__ L, const float *__restrict__ D, u16 *__restrict__ dk, int64_t dk_stride,
                  u16 *__restrict__ dv, int64_t dv_stride, int64_t n_tok, int64_t pos0, int n_heads, int n_kv,
                  float scale_log2, float scale) {
#if defined(NSTF_WGMMA_DEVICE)
    typedef bw_cfg<HD> cfg;
    constexpr int S = BW_STAGES, NCH = HD / 64, NO = HD / 2;
    extern __shared__ unsigned char bw_smem_raw[];
    __shared__ __align__(8) uint64_t bw_bars[cfg::N_BARS];
    const uint32_t base = (wg_smem_addr(bw_smem_raw) + 1023u) & ~1023u;
    const uint32_t s_a = base, s_b = s_a + cfg::OWN_BYTES, s_x = s_b + cfg::OWN_BYTES, s_y = s_x + S * cfg::T_BYTES;
    /* per stage: the tile's L (log2-scaled lse) then D, BW_T floats each */
    float *stat = (float *)(bw_smem_raw + (s_y + S * cfg::T_BYTES - wg_smem_addr(bw_smem_raw)));
    const uint32_t bar_own = wg_smem_addr(bw_bars), bar_fx = bar_own + 8, bar_fy = bar_fx + 8 * S,
                   bar_e = bar_fy + 8 * S;

    const int64_t seq = blockIdx.z, nk = pos0 + n_tok;
    const int group = n_heads / n_kv, hkv = blockIdx.x;
    const int64_t j0 = (int64_t)blockIdx.y * BW_ROWS; /* early keys see the most queries: first */
    const int64_t qt_first = (j0 - pos0 > 0 ? j0 - pos0 : 0) / BW_T, n_qt = (n_tok + BW_T - 1) / BW_T;
    const int n_per = (int)(n_qt - qt_first), n_tiles = group * n_per;

    /* Y full: TMA's bytes (thread 0) and the statistics (warp 1) */
    wg_ring_init(bar_own, bar_fx, bar_fy, bar_e, S, 2, j0 + 64 < nk ? 2 : 1);

    const int wg = wg_index(); /* warp-uniform to the compiler */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        const int pw = threadIdx.x / 32, pl = threadIdx.x % 32;
        if (pw == 0 && pl == 0) {
            const int krow = (int)(seq * nk + j0);
            wg_bar_expect_tx(bar_own, 2 * cfg::OWN_BYTES);
            wg_tma_load_chunks<NCH>(s_a, BW_ROWS * 128, &map_k, hkv * HD, krow, bar_own);
            wg_tma_load_chunks<NCH>(s_b, BW_ROWS * 128, &map_v, hkv * HD, krow, bar_own);
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % S;
                wg_bar_wait(bar_e + 8 * st, ((uint32_t)(it / S) & 1) ^ 1);
                const int h = hkv * group + it / n_per;
                const int r = (int)(seq * n_tok + (qt_first + it % n_per) * BW_T);
                wg_bar_expect_tx(bar_fx + 8 * st, cfg::T_BYTES);
                wg_tma_load_chunks<NCH>(s_x + st * cfg::T_BYTES, BW_T * 128, &map_q, h * HD, r, bar_fx + 8 * st);
                wg_bar_expect_tx(bar_fy + 8 * st, cfg::T_BYTES);
                wg_tma_load_chunks<NCH>(s_y + st * cfg::T_BYTES, BW_T * 128, &map_do, h * HD, r, bar_fy + 8 * st);
            }
        } else if (pw == 1) {
            /* the tiles' L and D into shared memory, 2 values a lane */
            for (int it = 0; it < n_tiles; it++) {
                const int st = it % S;
                wg_bar_wait(bar_e + 8 * st, ((uint32_t)(it / S) & 1) ^ 1);
                const int h = hkv * group + it / n_per;
                const int64_t tq0 = (qt_first + it % n_per) * BW_T;
                float *sl = stat + st * 2 * BW_T;
                for (int e = 0; e < 2; e++) {
                    const int c = 2 * pl + e;
                    const int64_t t = tq0 + c, i = (seq * n_heads + h) * n_tok + t;
                    sl[c] = t < n_tok ? L[i] : 0.0f;
                    sl[BW_T + c] = t < n_tok ? D[i] : 0.0f;
                }
                __syncwarp();
                if (pl == 0) wg_bar_arrive(bar_fy + 8 * st); /* release: the stores above are seen */
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    if (j0 + cw * 64 >= nk) return; /* every key past the end: not counted by the empty barriers */
    const int64_t key0 = j0 + cw * 64 + warp * 16 + lane / 4; /* slot 0; slot 1 is key0 + 8 */
    float dka[NO], dva[NO], sc[32], dp[32];
#pragma unroll
    for (int i = 0; i < NO; i++) dka[i] = dva[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) sc[i] = dp[i] = 0.0f;
    const uint32_t k_wg = s_a + cw * 64 * 128, v_wg = s_b + cw * 64 * 128;
    wg_bar_wait(bar_own, 0);
    for (int it = 0; it < n_tiles; it++) {
        const int st = it % S;
        const uint32_t ph = (uint32_t)(it / S) & 1;
        const int64_t tq0 = (qt_first + it % n_per) * BW_T;
        /* a tile wholly before this warpgroup's first key (the first of each
         * head, for warpgroup 1) is computed all the same, every pair masked:
         * no MMA in a branch (ptxas would serialize every wgmma) */
        {
            const uint32_t qb = s_x + st * cfg::T_BYTES, gb = s_y + st * cfg::T_BYTES;
            wg_bar_wait(bar_fx + 8 * st, ph);
            wg_bar_wait(bar_fy + 8 * st, ph);
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            bw_ss<HD>(sc, k_wg, qb); /* S^T = K Q^T */
            bw_ss<HD>(dp, v_wg, gb); /* dP^T = V dO^T */
            bw_commit_wait0();
            wg_fence_regs<32>(sc);
            wg_fence_regs<32>(dp);
            const float *sl = stat + st * 2 * BW_T;
            uint32_t pp[16], pd[16];
#pragma unroll
            for (int i = 0; i < 32; i += 2) {
                const int c = 8 * (i >> 2) + 2 * (lane & 3); /* query column of the pair */
                const int64_t key = key0 + ((i & 2) ? 8 : 0), qp = pos0 + tq0 + c;
                const float2 l2 = *(const float2 *)(sl + c), d2 = *(const float2 *)(sl + BW_T + c);
                const float lv[2] = {l2.x, l2.y}, dv[2] = {d2.x, d2.y};
                float p[2], x[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    /* query past the end, or before the key: no pair */
                    const bool on = tq0 + c + e < n_tok && key <= qp + e;
                    p[e] = on ? nstf_exp2(fmaf(sc[i + e], scale_log2, -lv[e])) : 0.0f;
                    x[e] = p[e] * (dp[i + e] - dv[e]); /* dS^T */
                }
                pp[i / 2] = nstf_mma_pack2(p[0], p[1]);
                pd[i / 2] = nstf_mma_pack2(x[0], x[1]);
            }
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
            wg_rs_tb<HD, BW_T>(dva, pp, gb); /* dV += P^T dO */
            wg_rs_tb<HD, BW_T>(dka, pd, qb); /* dK += dS^T Q */
            bw_commit_wait0();
            wg_fence_regs<NO>(dva);
            wg_fence_regs<NO>(dka);
        }
        if (tid == 0) wg_bar_arrive(bar_e + 8 * st);
    }
    const int64_t kr = seq * nk;
#pragma unroll
    for (int i = 0; i < NO; i += 2) {
        const int64_t key = key0 + ((i & 2) ? 8 : 0);
        if (key >= nk) continue;
        const int64_t col = (int64_t)hkv * HD + 8 * (i >> 2) + 2 * (lane & 3);
        *(uint32_t *)(dk + (kr + key) * dk_stride + col) = nstf_mma_pack2(dka[i] * scale, dka[i + 1] * scale);
        *(uint32_t *)(dv + (kr + key) * dv_stride + col) = nstf_mma_pack2(dva[i], dva[i + 1]);
    }
#endif /* NSTF_WGMMA_DEVICE */
}

/* ---------------------------------------------------------------- host ---- */

typedef void (*bw_kfn_dq)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const float *,
                          const float *, u16 *, int64_t, int64_t, int64_t, int, int, float, float);
typedef void (*bw_kfn_dkv)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap,
                           const float *, const float *, u16 *, int64_t, u16 *, int64_t, int64_t, int64_t, int, int,
                           float, float);

static int attn_bwd_wgmma_usable(void) {
    static int cached = -1;
    if (cached < 0) {
        bw_kfn_dq a = bw_dq_kernel<64>;
        bw_kfn_dkv b = bw_dkv_kernel<64>;
        const size_t bars = (size_t)bw_cfg<64>::N_BARS * 8;
        cached = wg_kernel_usable((const void *)a, bars) && wg_kernel_usable((const void *)b, bars);
    }
    return cached;
}

/* The 4-byte paired stores of dq, dk, dv. TMA's rules for the operands
 * (16-byte aligned q, k, v, dout; every stride a multiple of 8 elements)
 * are nstf_gpu_flash_attn_bwd_batch's own argument checks. */
static bool attn_bwd_wgmma_fits(const void *dq, const void *dk, const void *dv) {
    return (((uintptr_t)dq | (uintptr_t)dk | (uintptr_t)dv) & 3) == 0;
}

template <int HD>
static nstf_status attn_bwd_wgmma_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_stride,
                                         const u16 *v, int64_t v_stride, const u16 *out, int64_t o_stride,
                                         const u16 *dout, int64_t do_stride, const float *lse, u16 *dq,
                                         int64_t dq_stride, u16 *dk, int64_t dk_stride, u16 *dv, int64_t dv_stride,
                                         int64_t n_tok, int64_t n_seq, int64_t pos0, int n_heads, int n_kv,
                                         float scale, float *scratch, cudaStream_t s) {
    typedef bw_cfg<HD> cfg;
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    bw_kfn_dq kq = bw_dq_kernel<HD>;
    bw_kfn_dkv kkv = bw_dkv_kernel<HD>;
    if (!nstf_gpu_device_done(&attr_set)) {
        if (cudaFuncSetAttribute((const void *)kq, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) !=
                cudaSuccess ||
            cudaFuncSetAttribute((const void *)kkv, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) !=
                cudaSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "flash_attn_bwd (wgmma): cannot allow %d bytes of shared memory",
                                  cfg::SMEM);
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t nk = pos0 + n_tok, rows = n_seq * n_tok, krows = n_seq * nk;
    const int64_t n_qt = (n_tok + BW_ROWS - 1) / BW_ROWS, n_kt = (nk + BW_ROWS - 1) / BW_ROWS;
    if (rows > 0x7fffffff || krows > 0x7fffffff || n_qt > 65535 || n_kt > 65535 || n_seq > 65535)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_attn_bwd (wgmma): %lld x %lld tokens too many",
                              (long long)n_seq, (long long)n_tok);
    float *D = scratch, *L = scratch + rows * n_heads;
    const int64_t n_dot = rows * n_heads, dot_blocks = (n_dot + 255) / 256;
    bw_dot_kernel<<<(unsigned)(dot_blocks < NSTF_GPU_MAX_GRID ? dot_blocks : NSTF_GPU_MAX_GRID), 256, 0, s>>>(
        out, o_stride, dout, do_stride, lse, D, L, rows, n_tok, n_heads, HD);
    GPU_LAUNCH_CHECK(s);
    const char *who = "flash_attn_bwd (wgmma)";
    const int64_t qd = (int64_t)n_heads * HD, kvd = (int64_t)n_kv * HD;
    const float sl2 = scale * 1.4426950408889634f;
    CUtensorMap mq, mdo, mk, mv;
    /* dq: Q, dO owned (128 rows), K, V streamed (64) */
    NSTF_TRY(wg_make_map(&mq, q, rows, qd, q_stride, BW_ROWS, false, who));
    NSTF_TRY(wg_make_map(&mdo, dout, rows, qd, do_stride, BW_ROWS, false, who));
    NSTF_TRY(wg_make_map(&mk, k, krows, kvd, k_stride, BW_T, false, who));
    NSTF_TRY(wg_make_map(&mv, v, krows, kvd, v_stride, BW_T, false, who));
    kq<<<dim3((unsigned)n_heads, (unsigned)n_qt, (unsigned)n_seq), BW_THREADS, cfg::SMEM, s>>>(
        mq, mdo, mk, mv, L, D, dq, dq_stride, n_tok, pos0, n_heads, n_kv, sl2, scale);
    GPU_LAUNCH_CHECK(s);
    /* dkv: K, V owned (128 rows), Q, dO streamed (64) */
    NSTF_TRY(wg_make_map(&mq, q, rows, qd, q_stride, BW_T, false, who));
    NSTF_TRY(wg_make_map(&mdo, dout, rows, qd, do_stride, BW_T, false, who));
    NSTF_TRY(wg_make_map(&mk, k, krows, kvd, k_stride, BW_ROWS, false, who));
    NSTF_TRY(wg_make_map(&mv, v, krows, kvd, v_stride, BW_ROWS, false, who));
    kkv<<<dim3((unsigned)n_kv, (unsigned)n_kt, (unsigned)n_seq), BW_THREADS, cfg::SMEM, s>>>(
        mq, mdo, mk, mv, L, D, dk, dk_stride, dv, dv_stride, n_tok, pos0, n_heads, n_kv, sl2, scale);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

#endif /* NSTF_ATTN_BWD_WGMMA_H */
