/* flash_attn_wgmma.h — the Hopper (sm_90a) path of the prefill / training
 * flash attention (flash_attn.cu): QK^T and PV on warpgroup MMA
 * (`wgmma.mma_async`), Q, K and V brought into shared memory by TMA. NVIDIA
 * only: flash_attn.cu includes this file in CUDA builds, the kernel body
 * exists only in sm_90a device code, and the host takes this path only when
 * the loaded image holds that body (flash_wgmma_usable) and the operands
 * meet TMA's alignment rules; otherwise the portable mma.h kernel runs.
 * Same contract as that kernel: causal, GQA, optional sliding window, bf16
 * in and out, fp32 softmax state, optional log-sum-exp.
 *
 * Design:
 *   - a block owns 128 query rows of one head (grid: heads, query tiles,
 *     sequences; heads fastest and late, heavy tiles first, so blocks start
 *     in order of decreasing work) and walks the key tiles of 128 positions
 *     from 0 to its last row's position;
 *   - 3 warpgroups: warpgroup 0 is the producer (one thread issues the TMA
 *     loads, the others idle; the warpgroup gives its registers away with
 *     setmaxnreg), 1 and 2 are consumers, each owning 64 query rows;
 *   - the Q tile is loaded once; K and V tiles go through a 3-deep ring,
 *     with a "full" mbarrier each for K and V (so S = Q K^T starts before V
 *     has landed) and one "empty" mbarrier per stage (one arrive per
 *     consumer warpgroup once its MMAs on the stage have retired);
 *   - shared-memory tiles are 64-column chunks in the 128-byte swizzle (a
 *     64-element bf16 row is one swizzle row): S = Q K^T is K-major for both
 *     operands (as the GEMM's), P V takes P from registers (an m64nN
 *     accumulator's pairs are exactly the A fragment of the next k16 slice,
 *     so the probabilities never leave the registers) and V "MN-major" (its
 *     head dimension contiguous: wgmma transposes it; 8-key groups 1024 B
 *     apart, the second 64-column chunk of a 128-wide head FW_BN * 128 B on);
 *   - per tile, the softmax of tile it runs while the MMAs of P V(it-1)
 *     do, and S(it+1) is issued before P V(it); the two warpgroups take
 *     turns (named barriers) to issue their MMAs, so one's softmax runs
 *     under the other's MMAs ("ping-pong");
 *   - the online softmax in the log2 domain as in flash_common.h (running
 *     max m, per-thread partial sums l reduced over the quad at the end);
 *     tiles that reach past a warpgroup's first row (or, with a sliding
 *     window, below its last row's window) are masked, tiles wholly past
 *     its last row or before its first row's window are skipped (waited
 *     for, not computed; a block starts at its first row's window), and a
 *     warpgroup whose rows all lie past the end leaves at once (the empty
 *     barriers count only the warpgroups with rows);
 *   - TMA zero-fills rows past the tensor: the key map ends at the last key
 *     this call may read, so no stale cache row (possibly NaN) ever meets a
 *     zero probability.
 * With a KV cache the caller first copies the new rows into it
 * (cudaMemcpy2DAsync) and the keys are all read from the cache. */
#ifndef NSTF_FLASH_ATTN_WGMMA_H
#define NSTF_FLASH_ATTN_WGMMA_H

#include "wgmma_common.h"

#define FW_BM 128 /* query rows per block: 2 consumer warpgroups x 64 */
#define FW_BN 128 /* keys per tile */
#define FW_THREADS 384

template <int HD> struct fw_cfg {
    static constexpr int NCH = HD / 64; /* 64-column chunks of a row */
    /* 3: the K tile of it + 1 loads while tiles it - 1 and it are in use
     * (a 2-deep ring would expose the load of every tile); at head dim 128
     * that is 225 KiB of the 227 an SM allows */
    static constexpr int STAGES = 3;
    static constexpr int Q_BYTES = FW_BM * HD * 2;
    static constexpr int KV_BYTES = FW_BN * HD * 2; /* one K or V tile */
    /* dynamic shared memory: Q, the K ring, the V ring, + 1024 to align to
     * the swizzle's period (the mbarriers are static, see the kernel) */
    static constexpr int SMEM = Q_BYTES + 2 * STAGES * KV_BYTES + 1024;
    static constexpr int N_BARS = 1 + 3 * STAGES; /* Q; per stage K full, V full, empty */
};

#if defined(NSTF_WGMMA_DEVICE)
/* The max (MAX) or sum of r[0 .. N), N a power of two, as a tree; r is
 * overwritten. */
template <int N, bool MAX> static __device__ __forceinline__ float fw_tree(float *r) {
    if constexpr (N == 1) {
        return r[0];
    } else {
#pragma unroll
        for (int k = 0; k < N / 2; k++) r[k] = MAX ? fmaxf(r[k], r[k + N / 2]) : r[k] + r[k + N / 2];
        return fw_tree<N / 2, MAX>(r);
    }
}

/* Issue (and commit) S = Q K^T for one consumer warpgroup: wait for the K
 * tile at ring position j (tiles counted from the block's first), then
 * HD / 16 k-steps; q_wg is its 64 rows of the Q tile. */
template <int HD>
static __device__ __forceinline__ void fw_qk(float *s, uint32_t q_wg, uint32_t s_k, uint32_t bar_fk, int j) {
    constexpr int S = fw_cfg<HD>::STAGES;
    const int st = j % S;
    wg_bar_wait(bar_fk + 8 * st, (uint32_t)(j / S) & 1);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    const uint64_t dq = wg_desc(q_wg), dk = wg_desc(s_k + st * fw_cfg<HD>::KV_BYTES);
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int c = kk / 4, off = (kk % 4) * 32;
        nstf_wgmma_m64n128(s, wg_desc_add(dq, c * FW_BM * 128 + off), wg_desc_add(dk, c * FW_BN * 128 + off), kk > 0);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}
#endif

template <int HD>
__global__ void __launch_bounds__(FW_THREADS, 1)
    flash_wgmma_kernel(const __grid_constant__ CUtensorMap map_q, const __grid_constant__ CUtensorMap map_k,
                       const __grid_constant__ CUtensorMap map_v, u16 *out, int64_t out_stride, float *lse,
                       int64_t n_tok, int64_t pos0, int64_t kv_seq_rows, int n_heads, int n_kv, float scale_log2,
                       int window) {
#if defined(NSTF_WGMMA_DEVICE)
    typedef fw_cfg<HD> cfg;
    constexpr int S = cfg::STAGES, NCH = cfg::NCH, NS = FW_BN / 2, NO = HD / 2;
    extern __shared__ unsigned char fw_smem_raw[];
    /* static: only this sm_90a body declares them (flash_wgmma_usable) */
    __shared__ __align__(8) uint64_t fw_bars[cfg::N_BARS];
    const uint32_t base = (wg_smem_addr(fw_smem_raw) + 1023u) & ~1023u;
    const uint32_t s_q = base, s_k = s_q + cfg::Q_BYTES, s_v = s_k + S * cfg::KV_BYTES;
    const uint32_t bar_q = wg_smem_addr(fw_bars), bar_fk = bar_q + 8, bar_fv = bar_fk + 8 * S,
                   bar_e = bar_fv + 8 * S;

    const int64_t seq = blockIdx.z;
    const int64_t n_qt = (n_tok + FW_BM - 1) / FW_BM;
    const int64_t t0 = (n_qt - 1 - (int64_t)blockIdx.y) * FW_BM; /* heavy tiles first */
    const int64_t t1 = t0 + FW_BM < n_tok ? t0 + FW_BM : n_tok;
    const int h = blockIdx.x, hkv = h / (n_heads / n_kv);
    const int64_t kv_end = pos0 + t1; /* keys [0, kv_end) */
    const int n_tiles = (int)((kv_end + FW_BN - 1) / FW_BN);
    /* sliding window (window > 0): row at position p sees keys > p - window;
     * the block starts at the tile of its first row's first key */
    const int64_t blk_lo = window > 0 && pos0 + t0 + 1 > window ? pos0 + t0 + 1 - window : 0;
    const int it0 = (int)(blk_lo / FW_BN);

    /* per stage K full, V full, empty (one arrive per consumer warpgroup
     * with rows to compute) */
    wg_ring_init(bar_q, bar_fk, bar_fv, bar_e, S, 1, t0 + 64 < n_tok ? 2 : 1);

    const int wg = wg_index(); /* warp-uniform to the compiler */
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x == 0) {
            const int qrow = (int)(seq * n_tok + t0), krow = (int)(seq * kv_seq_rows);
            wg_bar_expect_tx(bar_q, cfg::Q_BYTES);
            wg_tma_load_chunks<NCH>(s_q, FW_BM * 128, &map_q, h * HD, qrow, bar_q);
            int stage = 0;
            uint32_t phase = 0;
            for (int it = it0; it < n_tiles; it++) {
                /* a fresh barrier counts as having completed the phase before
                 * phase 0: the first lap does not wait */
                wg_bar_wait(bar_e + 8 * stage, phase ^ 1);
                const int r = krow + it * FW_BN;
                const uint32_t fk = bar_fk + 8 * stage, fv = bar_fv + 8 * stage;
                wg_bar_expect_tx(fk, cfg::KV_BYTES);
                wg_tma_load_chunks<NCH>(s_k + stage * cfg::KV_BYTES, FW_BN * 128, &map_k, hkv * HD, r, fk);
                wg_bar_expect_tx(fv, cfg::KV_BYTES);
                wg_tma_load_chunks<NCH>(s_v + stage * cfg::KV_BYTES, FW_BN * 128, &map_v, hkv * HD, r, fv);
                if (++stage == S) {
                    stage = 0;
                    phase ^= 1;
                }
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
    /* accumulator i of a thread: row 16 warp + lane / 4 (+ 8 when i & 2),
     * column 8 (i / 4) + 2 (lane % 4) + (i & 1) */
    const int64_t row0 = t0 + cw * 64 + warp * 16 + lane / 4; /* slot 0; slot 1 is row0 + 8 */
    const int64_t wg_first = pos0 + t0 + cw * 64;
    const int64_t wg_last = wg_first + 63 < kv_end - 1 ? wg_first + 63 : kv_end - 1;
    if (t0 + cw * 64 >= n_tok) return; /* every row past the end: not counted by the empty barriers */
    /* this warpgroup computes tiles [c0, c1) of the block's [it0, n_tiles):
     * the earlier ones lie wholly before its rows' windows, the later ones
     * wholly past its rows */
    const int64_t wg_lo = window > 0 && wg_first + 1 > window ? wg_first + 1 - window : 0;
    const int c0 = (int)(wg_lo / FW_BN);
    const int c1 = (int)(wg_last / FW_BN) + 1 < n_tiles ? (int)(wg_last / FW_BN) + 1 : n_tiles;
    /* keys below the last row's window start need the lower mask */
    const int64_t lo_max = window > 0 ? wg_last + 1 - window : -1;
    float o[NO], s[NS];
#pragma unroll
    for (int i = 0; i < NO; i++) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < NS; i++) s[i] = 0.0f;
    /* running max (scaled, log2 domain) and per-thread partial sums */
    float m0 = FLASH_NEG_INF, m1 = FLASH_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const uint32_t q_wg = s_q + cw * 64 * 128;
    wg_bar_wait(bar_q, 0);
    /* Ping-pong (both warpgroups have rows): the warpgroups take turns to
     * issue their MMAs (named barrier 1 + cw is this one's turn), so one's
     * softmax runs under the other's MMAs instead of both contending for the
     * same units at once. One turn per tile of the block, for both: a tile a
     * warpgroup does not compute is an empty turn. Warpgroup 0 goes first;
     * warpgroup 1 hands the turn back after each but the block's last. */
    const bool pp = t0 + 64 < n_tok;
    if (pp && cw == 1) wg_named_arrive(1);
    auto turn_begin = [&]() {
        if (pp) wg_named_sync(1 + cw);
    };
    auto turn_end = [&](int it) {
        if (pp && (cw == 0 || it + 1 < n_tiles)) wg_named_arrive(2 - cw);
    };
    /* a tile this warpgroup does not compute: the arrive must count for the
     * tile's fill, not run ahead of it; then an empty turn */
    auto skip = [&](int it) {
        const int j = it - it0;
        wg_bar_wait(bar_fv + 8 * (j % S), (uint32_t)(j / S) & 1);
        if (tid == 0) wg_bar_arrive(bar_e + 8 * (j % S));
        turn_begin();
        turn_end(it);
    };
    for (int it = it0; it < c0; it++) skip(it);

    /* Pipeline per tile it (S = QK^T of tile it already in s):
     *   softmax(s) -> exponentials, alpha (the MMAs of P V(it-1) still run)
     *   wait for P V(it-1); release its stage; pack P (the registers that
     *   P V(it-1) read are free only now)
     *   issue S = Q K(it+1)^T into s
     *   O *= alpha; issue O += P V(it)
     *   wait for S(it+1)                (P V(it) still runs)
     * Ring positions count from the block's first tile it0. */
    fw_qk<HD>(s, q_wg, s_k, bar_fk, c0 - it0);
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_regs<NS>(s);
    for (int it = c0; it < c1; it++) {
        const int64_t kv0 = (int64_t)it * FW_BN;
        const int j = it - it0;
        const bool has_next = it + 1 < c1;
        if (kv0 + FW_BN - 1 > wg_first || kv0 + FW_BN > kv_end || kv0 < lo_max) {
            /* mask: key column > the row's position, past kv_end, or (with a
             * window) at or below the row's position - window; the limits
             * relative to kv0, clamped into [-1, FW_BN] */
            int64_t a = pos0 + row0, b = a + 8;
            const int64_t la = window > 0 ? a + 1 - window - kv0 : -1, lb = window > 0 ? b + 1 - window - kv0 : -1;
            a = (a < kv_end - 1 ? a : kv_end - 1) - kv0;
            b = (b < kv_end - 1 ? b : kv_end - 1) - kv0;
            const int hi0 = a < -1 ? -1 : a > FW_BN ? FW_BN : (int)a;
            const int hi1 = b < -1 ? -1 : b > FW_BN ? FW_BN : (int)b;
            const int lo0 = la < 0 ? 0 : la > FW_BN ? FW_BN : (int)la;
            const int lo1 = lb < 0 ? 0 : lb > FW_BN ? FW_BN : (int)lb;
#pragma unroll
            for (int i = 0; i < NS; i++) {
                const int col = 8 * (i >> 2) + 2 * (lane & 3) + (i & 1);
                const bool out = (i & 2) ? col > hi1 || col < lo1 : col > hi0 || col < lo0;
                if (out) s[i] = FLASH_NEG_INF;
            }
        }
        /* raw (unscaled) row maxima: trees, not a 32-long dependency chain
         * (one warp per scheduler per warpgroup has little else to issue) */
        float r0[NS / 4], r1[NS / 4];
#pragma unroll
        for (int k = 0; k < NS / 4; k++) {
            r0[k] = fmaxf(s[4 * k], s[4 * k + 1]);
            r1[k] = fmaxf(s[4 * k + 2], s[4 * k + 3]);
        }
        float mx0 = fw_tree<NS / 4, true>(r0), mx1 = fw_tree<NS / 4, true>(r1);
        mx0 = fmaxf(mx0, nstf_shfl_xor(mx0, 1));
        mx0 = fmaxf(mx0, nstf_shfl_xor(mx0, 2));
        mx1 = fmaxf(mx1, nstf_shfl_xor(mx1, 1));
        mx1 = fmaxf(mx1, nstf_shfl_xor(mx1, 2));
        /* scale > 0: the scaled max is the max of the scaled scores */
        mx0 = fmaxf(m0, mx0 * scale_log2);
        mx1 = fmaxf(m1, mx1 * scale_log2);
        const float b0 = nstf_softmax_base(mx0), b1 = nstf_softmax_base(mx1);
        const float a0 = nstf_exp2(m0 - b0), a1 = nstf_exp2(m1 - b1); /* m = -inf -> 0 */
        m0 = mx0;
        m1 = mx1;
        l0 *= a0;
        l1 *= a1;
#pragma unroll
        for (int i = 0; i < NS; i++) s[i] = nstf_exp2(fmaf(s[i], scale_log2, -((i & 2) ? b1 : b0)));
        /* the tile's share of the row sums, as trees */
#pragma unroll
        for (int k = 0; k < NS / 4; k++) {
            r0[k] = s[4 * k] + s[4 * k + 1];
            r1[k] = s[4 * k + 2] + s[4 * k + 3];
        }
        l0 += fw_tree<NS / 4, false>(r0);
        l1 += fw_tree<NS / 4, false>(r1);
        /* P V(it - 1) has retired: its stage goes back to the producer
         * (before waiting for tile it + 1, which may need that stage), and
         * the registers of its P operand may be written again */
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        wg_fence_regs<NO>(o);
        if (it > c0 && tid == 0) wg_bar_arrive(bar_e + 8 * ((j - 1) % S));
        uint32_t p[NS / 2];
#pragma unroll
        for (int i = 0; i < NS; i += 2) p[i / 2] = nstf_mma_pack2(s[i], s[i + 1]);
#pragma unroll
        for (int i = 0; i < NO; i++) o[i] *= (i & 2) ? a1 : a0;
        turn_begin(); /* this warpgroup's turn on the tensor cores */
        if (has_next) fw_qk<HD>(s, q_wg, s_k, bar_fk, j + 1);

        const int st = j % S;
        wg_bar_wait(bar_fv + 8 * st, (uint32_t)(j / S) & 1);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
        wg_rs_tb<HD, FW_BN>(o, p, s_v + st * cfg::KV_BYTES); /* O += P V */
        asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
        turn_end(it); /* the other's turn */
        /* S(it + 1) is ready (the last lap: nothing but P V(it) pending) */
        asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
        wg_fence_regs<NS>(s);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_regs<NO>(o);
    if (tid == 0) wg_bar_arrive(bar_e + 8 * ((c1 - 1 - it0) % S));
    for (int it = c1; it < n_tiles; it++) skip(it);

    l0 += nstf_shfl_xor(l0, 1);
    l0 += nstf_shfl_xor(l0, 2);
    l1 += nstf_shfl_xor(l1, 1);
    l1 += nstf_shfl_xor(l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    u16 *ob = out + seq * n_tok * out_stride + (int64_t)h * HD;
#pragma unroll
    for (int i = 0; i < NO; i += 2) {
        const int64_t t = row0 + ((i & 2) ? 8 : 0);
        if (t >= n_tok) continue;
        const float inv = (i & 2) ? inv1 : inv0;
        const int col = 8 * (i >> 2) + 2 * (lane & 3);
        *(uint32_t *)(ob + t * out_stride + col) = nstf_mma_pack2(o[i] * inv, o[i + 1] * inv);
    }
    if (lse && (lane & 3) == 0) {
        /* the natural log-sum-exp of the row's scaled scores */
        float *lb = lse + seq * n_tok * n_heads;
        if (row0 < n_tok) lb[row0 * n_heads + h] = (m0 + nstf_fast_log2f(l0)) * 0.6931471805599453f;
        if (row0 + 8 < n_tok) lb[(row0 + 8) * n_heads + h] = (m1 + nstf_fast_log2f(l1)) * 0.6931471805599453f;
    }
#endif /* NSTF_WGMMA_DEVICE */
}

/* ---------------------------------------------------------------- host ---- */

static int flash_wgmma_usable(void) {
    static int cached = -1;
    if (cached < 0) {
        void (*kfn)(const CUtensorMap, const CUtensorMap, const CUtensorMap, u16 *, int64_t, float *, int64_t,
                    int64_t, int64_t, int, int, float, int) = flash_wgmma_kernel<64>;
        cached = wg_kernel_usable((const void *)kfn, (size_t)fw_cfg<64>::N_BARS * 8);
    }
    return cached;
}

/* q: [n_seq * n_tok] rows of n_heads * HD (q_stride apart); k, v: kv_rows
 * rows of n_kv * HD (k_ld, v_ld apart), sequence s's keys starting at row
 * s * kv_seq_rows (0 with a cache: one sequence). TMA's rules (16-byte
 * aligned bases, row pitches multiples of 16 bytes) and the paired output
 * stores hold already: flash_check_args asks the same of every flash
 * attention call, and a cache's pitch is n_kv * HD. */
/* n_tok the grid's y can hold (one block per 128 rows) */
#define FW_MAX_TOK ((int64_t)65535 * FW_BM)

template <int HD>
static nstf_status flash_wgmma_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_ld, const u16 *v,
                                      int64_t v_ld, int64_t kv_rows, int64_t kv_seq_rows, u16 *out, int64_t out_stride, float *lse,
                                      int64_t n_tok, int64_t n_seq, int64_t pos0, int n_heads, int n_kv, float scale,
                                      int window, cudaStream_t stream) {
    typedef fw_cfg<HD> cfg;
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(const CUtensorMap, const CUtensorMap, const CUtensorMap, u16 *, int64_t, float *, int64_t,
                    int64_t, int64_t, int, int, float, int) = flash_wgmma_kernel<HD>;
        if (cudaFuncSetAttribute((const void *)kfn, cudaFuncAttributeMaxDynamicSharedMemorySize, cfg::SMEM) !=
            cudaSuccess)
            return nstf_set_error(NSTF_ERR_GPU, "flash_attn (wgmma): cannot allow %d bytes of shared memory",
                                  cfg::SMEM);
        nstf_gpu_device_mark(&attr_set);
    }
    const char *who = "flash_attn (wgmma)";
    CUtensorMap mq, mk, mv;
    NSTF_TRY(wg_make_map(&mq, q, n_seq * n_tok, (int64_t)n_heads * HD, q_stride, FW_BM, false, who));
    NSTF_TRY(wg_make_map(&mk, k, kv_rows, (int64_t)n_kv * HD, k_ld, FW_BN, false, who));
    NSTF_TRY(wg_make_map(&mv, v, kv_rows, (int64_t)n_kv * HD, v_ld, FW_BN, false, who));
    const int64_t n_qt = (n_tok + FW_BM - 1) / FW_BM;
    if (n_qt > 65535 || n_seq > 65535 || n_seq * n_tok > 0x7fffffff || kv_rows > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_attn (wgmma): grid or tensor too large");
    /* heads fastest: blocks start in order of decreasing work across all
     * heads (heavy tiles first), so the last wave holds the lightest tiles */
    dim3 grid((unsigned)n_heads, (unsigned)n_qt, (unsigned)n_seq);
    flash_wgmma_kernel<HD><<<grid, FW_THREADS, cfg::SMEM, stream>>>(mq, mk, mv, out, out_stride, lse, n_tok, pos0,
                                                                    kv_seq_rows, n_heads, n_kv,
                                                                    scale * 1.4426950408889634f, window);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return nstf_set_error(NSTF_ERR_GPU, "flash_attn (wgmma): launch failed: %s", cudaGetErrorString(e));
    return NSTF_OK;
}

#endif /* NSTF_FLASH_ATTN_WGMMA_H */
