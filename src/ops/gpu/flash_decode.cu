/* flash_decode.cu — split-KV flash decoding for n_tok = 1 (and small n_tok),
 * with the KV-cache write fused.
 *
 * The query rows of one kv head — n_tok tokens x its group of G query heads,
 * row R = token R / G, head hkv * G + R % G, at most 16 — form one 16-row mma
 * tile, so K and V are read once per kv head, not once per query head. The
 * context [0, pos0 + n_tok) is cut into S splits of `chunk` keys (a multiple
 * of the key tile FD_BKV); each wave of a 4-wave block runs the flash_common.h
 * loop over its own split into its own shared-memory tile (the waves meet
 * only before and after the loop), then the block's waves merge their FD_NW
 * splits in shared memory (NSTF_SOFTMAX_MERGE_SUMS). With one block per kv
 * head (up to FD_ONE_BLOCK_KEYS keys) that merge writes the output: no
 * partials in global memory and no second kernel. Otherwise each block
 * writes one partial (m, l, unnormalized acc) per row, and a second kernel
 * merges the S / FD_NW partials of each row: out = sum_b 2^(m_b - M) acc_b /
 * sum_b 2^(m_b - M) l_b. S is chosen from the context length, the SM count
 * and the blocks an SM holds (occupancy API), so that every SM is busy in
 * one round. The merge kernel stages the (m, l) pairs and the weights
 * 2^(m_b - M) in shared memory, and 4 threads share each output element,
 * each unrolling its loop over every 4th partial, so the loads of acc_b are
 * in flight together: a plain loop pays one L2 latency per partial (~10 us
 * per layer at S = 32). Each wave streams its split through FD_STAGES
 * tiles in shared memory (cp.async: the next tile loads while it computes
 * on this one). With a sliding window the splits start at the first token's
 * window (rounded down to a key tile), read on the device with the
 * position, so a captured step stays valid. Over a Q8_0 cache (Q8) each
 * wave stages its next tiles' codes and scales (all of them started
 * before the PDL wait: cache rows only) and widens each into its one bf16
 * tile before the same flash_tile; the call's own rows come from k, v as
 * plain loads. */
#include "flash_common.h"
#include "core/switches.h"

#include <stdlib.h>

#define FD_NW 4
/* Keys per tile, and the tiles a wave has in shared memory (FD_STAGES: the
 * next tile loads while the wave computes on this one). NVIDIA: 2 stages
 * of 16 keys, the shared memory of one 32-key tile. AMD: one stage of 16
 * keys, so that head_dim 128 fits the 64 KiB a workgroup may have (4 waves
 * x K and V x 32 keys x 136 x 2 bytes alone are 68 KiB) and the RDNA3
 * register file holds the state without spilling; its loads are not
 * asynchronous anyway. */
#define FD_BKV 16
#if defined(NSTF_GPU_HIP)
#define FD_STAGES 1
#else
#define FD_STAGES 2
#endif
#define FD_WAVE_KV (FD_STAGES * 2 * FD_BKV) /* rows of a wave's K/V stages */

/* Q8 (the Q8_0 cache): each wave has one bf16 K/V tile and fd_q8_stages
 * staged tiles of codes and scales (flash_q8_stage_bytes), copied ahead
 * while it computes: 4 at head_dim 64, 2 at 128 (3 and 2 blocks an SM on
 * an H200); 1 on AMD (64 KiB of LDS; plain copies there anyway). 8 and 4
 * (2 blocks an SM, more keys in flight but fewer waves) were slower on the
 * H200 (docs/PERFORMANCE.md). */
#if defined(NSTF_GPU_HIP)
template <int HD> static constexpr int fd_q8_stages() { return 1; }
#else
template <int HD> static constexpr int fd_q8_stages() { return HD == 64 ? 4 : 2; }
#endif
template <int HD> static constexpr size_t fd_q8_wave_bytes() {
    return (size_t)2 * FD_BKV * (HD + 8) * sizeof(u16) + (size_t)fd_q8_stages<HD>() * flash_q8_stage_bytes<HD, FD_BKV>();
}
/* Q tile, the waves' K/V (bf16: FD_STAGES tiles a wave; Q8: its region),
 * the waves' mma scratch. */
template <int HD, bool Q8 = false> static constexpr size_t fd_smem_bytes() {
    return (size_t)16 * (HD + 8) * sizeof(u16) + (size_t)FD_NW * 16 * NSTF_MMA_SCRATCH_LD * sizeof(u16) +
           (Q8 ? (size_t)FD_NW * fd_q8_wave_bytes<HD>() : (size_t)FD_NW * FD_WAVE_KV * (HD + 8) * sizeof(u16));
}
static_assert(fd_q8_wave_bytes<64>() % 16 == 0 && fd_q8_wave_bytes<128>() % 16 == 0, "16-byte aligned wave regions");
static_assert((size_t)16 * (2 + 64) * sizeof(float) <= fd_q8_wave_bytes<64>() &&
                  (size_t)16 * (2 + 128) * sizeof(float) <= fd_q8_wave_bytes<128>(),
              "the merge's partials must fit the Q8 waves' regions");
#if defined(NSTF_GPU_HIP)
static_assert(fd_smem_bytes<128, true>() <= 65536, "LDS: 64 KiB a workgroup");
#endif

/* The in-block merge keeps (m, l, acc) of 16 rows per wave where the K/V
 * tiles were. */
static_assert((size_t)FD_NW * 16 * (2 + 64) * sizeof(float) <= (size_t)FD_NW * FD_WAVE_KV * (64 + 8) * sizeof(u16) &&
                  (size_t)FD_NW * 16 * (2 + 128) * sizeof(float) <= (size_t)FD_NW * FD_WAVE_KV * (128 + 8) * sizeof(u16),
              "the merge's partials must fit the K/V tiles' shared memory");

/* The wave's own K/V tile is loaded (or may be overwritten): its lanes
 * meet, and on AMD their LDS writes are made visible to each other. */
static __device__ __forceinline__ void fd_wave_sync(void) {
    NSTF_WAVE_SYNC();
#if defined(NSTF_GPU_HIP)
    __builtin_amdgcn_fence(__ATOMIC_ACQ_REL, "wavefront");
#endif
}

template <int HD, bool Q8>
__global__ void __launch_bounds__(FD_NW *NSTF_WAVE)
    flash_decode_kernel(const u16 *__restrict__ q, int64_t q_stride, const u16 *__restrict__ kn, int64_t k_stride,
                        const u16 *__restrict__ vn, int64_t v_stride, u16 *kc, u16 *vc, int64_t kv_rb, int64_t n_tok,
                        int64_t pos0,
                        int n_heads, int n_kv, float scale_log2, int64_t chunk, float *part_ml, float *part_acc,
                        const int32_t *__restrict__ pos_dev, int early, int window, u16 *out, int64_t out_stride) {
    /* the position comes from the host (copied before the launch), and the
     * cache rows below it are constant during this step: the first tile's
     * cache rows are loaded before waiting for the previous kernel (PDL) */
    if (pos_dev) pos0 = *pos_dev;
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) u16 smem[];
    u16 *sq = smem;
    u16 *skv = sq + 16 * LD; /* bf16: per wave, per stage: K [BKV][LD], V [BKV][LD]; Q8: per wave regions */
    u16 *scratch = Q8 ? (u16 *)((uint8_t *)skv + FD_NW * fd_q8_wave_bytes<HD>()) : skv + FD_NW * FD_WAVE_KV * LD;

    const int tid = threadIdx.x, nt = FD_NW * NSTF_WAVE, wave = tid / NSTF_WAVE, lane = tid % NSTF_WAVE;
    const int hkv = blockIdx.y, group = n_heads / n_kv;
    const int rows = (int)n_tok * group;
    const int split = blockIdx.x * FD_NW + wave;
    const int64_t kv_total = pos0 + n_tok;
    const int64_t lo = window > 0 && pos0 + 1 > window ? (pos0 + 1 - window) / FD_BKV * FD_BKV : 0;
    const int64_t s0 = lo + (int64_t)split * chunk;
    const int64_t s1 = s0 + chunk < kv_total ? s0 + chunk : kv_total;
    u16 *sk = skv + wave * FD_WAVE_KV * LD, *sv = sk + FD_BKV * LD; /* bf16: stage 0 */
    /* Q8: the wave's tile, then its staged tiles; every staged copy reads
     * cache rows only, so all of them are started before the PDL wait */
    constexpr int QS = fd_q8_stages<HD>();
    constexpr size_t QSB = flash_q8_stage_bytes<HD, FD_BKV>();
    uint8_t *stg = (uint8_t *)skv + wave * fd_q8_wave_bytes<HD>() + 2 * FD_BKV * LD * sizeof(u16);
    if constexpr (Q8) {
        sk = (u16 *)((uint8_t *)skv + wave * fd_q8_wave_bytes<HD>());
        sv = sk + FD_BKV * LD;
#pragma unroll
        for (int i = 0; i < QS; i++) {
            const int64_t k1 = s0 + (int64_t)i * FD_BKV;
            if (k1 < s1)
                flash_stage_q8<HD, FD_BKV>(stg + i * QSB, (const uint8_t *)kc, (const uint8_t *)vc, kv_rb, k1, s1, pos0,
                                           n_kv, hkv, lane, NSTF_WAVE);
            nstf_cp_commit();
        }
    } else if (early) {
        flash_load_kv<HD, FD_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, s0, s1, pos0, n_kv, hkv, lane,
                                  NSTF_WAVE, 0);
    }
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();

    if (blockIdx.x == 0) {
        if constexpr (Q8)
            flash_write_cache_q8<HD>((uint8_t *)kc, (uint8_t *)vc, kv_rb, kn, k_stride, vn, v_stride, 0, n_tok, pos0,
                                     n_kv, hkv, tid, nt);
        else
            flash_write_cache<HD>(kc, vc, kn, k_stride, vn, v_stride, 0, n_tok, pos0, n_kv, hkv, tid, nt);
    }

    /* the Q tile (Q8: plain loads, so that its wait is not on the staged tiles) */
    for (int c = tid; c < 16 * (HD / 8); c += nt) {
        int row = c / (HD / 8), ch = c % (HD / 8);
        bool valid = row < rows;
        int64_t off = valid ? (row / group) * q_stride + (int64_t)(hkv * group + row % group) * HD + ch * 8 : 0;
        if constexpr (Q8)
            *(uint4 *)(sq + row * LD + ch * 8) = valid ? *(const uint4 *)(q + off) : make_uint4(0, 0, 0, 0);
        else
            nstf_cp16(sq + row * LD + ch * 8, q + off, valid);
    }
    if constexpr (!Q8) {
        nstf_cp_commit();
        nstf_cp_wait<0>();
    }
    __syncthreads();

    flash_state<HD> st;
    flash_state_init<HD>(st, sq, LD);
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        int row = nstf_mma_slot_row(r);
        st.qpos[r] = pos0 + (row < rows ? row / group : n_tok - 1);
    }

    u16 *wscratch = scratch + wave * 16 * NSTF_MMA_SCRATCH_LD;
    if constexpr (Q8) {
        /* tile i (keys s0 + i BKV ..) is staged in stage i % QS, one
         * cp.async group per tile (empty past the split's keys); widened
         * into the wave's tile once it has landed */
        int stage = 0;
        for (int64_t kv0 = s0; kv0 < s0 + chunk; kv0 += FD_BKV) { /* same trip count in every wave */
            nstf_cp_wait<QS - 1>(); /* this tile's group is complete */
            fd_wave_sync();
            if (kv0 < s1) {
                flash_fill_q8<HD, FD_BKV>(sk, sv, LD, stg + stage * QSB, kn, k_stride, vn, v_stride, kv0, s1, pos0,
                                          hkv, lane, NSTF_WAVE);
                fd_wave_sync();
                flash_tile<HD, FD_BKV>(st, sk, sv, LD, kv0, s1, scale_log2, true, window, wscratch);
            }
            fd_wave_sync(); /* the tile and the stage may be refilled */
            const int64_t kn0 = kv0 + QS * FD_BKV;
            if (kn0 < s1)
                flash_stage_q8<HD, FD_BKV>(stg + stage * QSB, (const uint8_t *)kc, (const uint8_t *)vc, kv_rb, kn0, s1,
                                           pos0, n_kv, hkv, lane, NSTF_WAVE);
            nstf_cp_commit();
            stage = stage + 1 == QS ? 0 : stage + 1;
        }
    } else {
        /* tile i of the split (keys s0 + i BKV ..) goes to stage i % FD_STAGES,
         * one cp.async group per tile (empty past the split's keys); tile 0's
         * cache rows were started before the PDL wait */
        constexpr int SROWS = 2 * FD_BKV * LD; /* one stage */
        flash_load_kv<HD, FD_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, s0, s1, pos0, n_kv, hkv, lane,
                                  NSTF_WAVE, early ? 1 : -1);
        nstf_cp_commit();
#pragma unroll
        for (int i = 1; i < FD_STAGES; i++) {
            const int64_t k1 = s0 + (int64_t)i * FD_BKV;
            if (k1 < s1)
                flash_load_kv<HD, FD_BKV>(sk + i * SROWS, sv + i * SROWS, LD, kc, vc, kn, k_stride, vn, v_stride, k1,
                                          s1, pos0, n_kv, hkv, lane, NSTF_WAVE, -1);
            nstf_cp_commit();
        }
        int stage = 0;
        for (int64_t kv0 = s0; kv0 < s0 + chunk; kv0 += FD_BKV) { /* same trip count in every wave */
            nstf_cp_wait<FD_STAGES - 1>(); /* this tile's group is complete */
            fd_wave_sync();                 /* the tile is the wave's own: no block barrier */
            if (kv0 < s1)
                flash_tile<HD, FD_BKV>(st, sk + stage * SROWS, sv + stage * SROWS, LD, kv0, s1, scale_log2, true,
                                       window, wscratch);
            fd_wave_sync(); /* the stage may be refilled */
            const int64_t kn0 = kv0 + FD_STAGES * FD_BKV;
            if (kn0 < s1)
                flash_load_kv<HD, FD_BKV>(sk + stage * SROWS, sv + stage * SROWS, LD, kc, vc, kn, k_stride, vn,
                                          v_stride, kn0, s1, pos0, n_kv, hkv, lane, NSTF_WAVE, -1);
            nstf_cp_commit();
            stage = stage + 1 == FD_STAGES ? 0 : stage + 1;
        }
    }
    flash_finish_l<HD>(st);

    /* the block's FD_NW splits merge in shared memory, where the K/V tiles
     * were: into the output (one block per kv head), else into the block's
     * partial (m, l, unnormalized acc) for the merge kernel */
    __syncthreads(); /* every wave is done with its K/V tiles */
    float *pm = (float *)skv;        /* [FD_NW][16][2]: m, l */
    float *pa = pm + FD_NW * 16 * 2; /* [FD_NW][16][HD] */
#pragma unroll
    for (int d = 0; d < HD / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            const int row = nstf_mma_c_row(e), col = d * 16 + nstf_mma_c_col(e);
            if (row >= rows) continue;
            pa[(wave * 16 + row) * HD + col] = st.o[d].x[e];
            if (col == 0) {
                pm[(wave * 16 + row) * 2 + 0] = st.m[nstf_mma_c_slot(e)];
                pm[(wave * 16 + row) * 2 + 1] = st.l[nstf_mma_c_slot(e)];
            }
        }
    __syncthreads();
    /* partials: ml [n_kv][blocks][rows][2], acc [n_kv][blocks][rows][HD] */
    const int64_t base = ((int64_t)hkv * gridDim.x + blockIdx.x) * rows;
    for (int i = tid; i < rows * HD; i += nt) {
        const int row = i / HD, d = i % HD;
        float mx, num, den;
        NSTF_SOFTMAX_MERGE_SUMS(mx, num, den, pm + row * 2, 16 * 2, pa + row * HD + d, 16 * HD, FD_NW, nstf_exp2);
        if (gridDim.x == 1) {
            const int64_t t = row / group;
            const int h = hkv * group + row % group;
            out[t * out_stride + (int64_t)h * HD + d] = nstf_mma_f2bf(num / den);
        } else {
            part_acc[(base + row) * HD + d] = num;
            if (d == 0) {
                part_ml[(base + row) * 2 + 0] = mx;
                part_ml[(base + row) * 2 + 1] = den;
            }
        }
    }
}

/* Threads per output element in the merge: strand j sums the partials b
 * = j, j + FD_MQ, ..., so each thread has a quarter of the dependent loads
 * in flight at once; the strands' sums are added in strand order. */
#define FD_MQ 4

/* grid (rows, n_kv), FD_MQ x HD threads, 2 S floats of shared memory:
 * merges the S block partials of one query row: M = max m_b, w_b = 2^(m_b -
 * base(M)), out = (sum_b w_b acc_b) / (sum_b w_b l_b), each sum over the
 * FD_MQ strands in strand order. */
template <int HD>
__global__ void __launch_bounds__(FD_MQ *HD)
    flash_decode_merge(const float *__restrict__ part_ml, const float *__restrict__ part_acc, u16 *out,
                       int64_t out_stride, int n_split, int rows, int group) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    constexpr int NT = FD_MQ * HD, NWV = NT / NSTF_WAVE;
    extern __shared__ float fdm[]; /* [S] m then w_b, [S] l */
    __shared__ float red[NWV];
    __shared__ float strand[2][FD_MQ][HD]; /* num, den */
    float *sw = fdm, *sl = fdm + n_split;
    const int row = blockIdx.x, hkv = blockIdx.y, tid = threadIdx.x, d = tid % HD, j = tid / HD;
    const int64_t i0 = (int64_t)hkv * n_split * rows + row; /* partial b of this row: i0 + b * rows */
    const float *ml = part_ml + i0 * 2;
    float mx = -__builtin_huge_valf();
    for (int b = tid; b < n_split; b += NT) {
        const float m = ml[(int64_t)b * rows * 2];
        sw[b] = m;
        sl[b] = ml[(int64_t)b * rows * 2 + 1];
        mx = fmaxf(mx, m);
    }
    mx = wave_reduce_max(mx);
    if (tid % NSTF_WAVE == 0) red[tid / NSTF_WAVE] = mx;
    __syncthreads();
    mx = red[0];
    for (int i = 1; i < NWV; i++) mx = fmaxf(mx, red[i]);
    const float base = nstf_softmax_base(mx);
    for (int b = tid; b < n_split; b += NT) sw[b] = nstf_exp2(sw[b] - base);
    __syncthreads();
    const float *acc = part_acc + i0 * HD + d;
    const int64_t as = (int64_t)rows * HD;
    float num = 0.0f, den = 0.0f;
#pragma unroll 8
    for (int b = j; b < n_split; b += FD_MQ) {
        const float w = sw[b];
        den = fmaf(w, sl[b], den);
        num = fmaf(w, acc[(int64_t)b * as], num);
    }
    strand[0][j][d] = num;
    strand[1][j][d] = den;
    __syncthreads();
    if (j) return;
    for (int i = 1; i < FD_MQ; i++) {
        num += strand[0][i][d];
        den += strand[1][i][d];
    }
    const int64_t t = row / group;
    const int h = hkv * group + row % group;
    out[t * out_stride + (int64_t)h * HD + d] = nstf_mma_f2bf(num / den);
}

/* Early cache loads on (the switch NSTF_FD_EARLY=0 turns them off, for measurement). */
static int fd_early(void) { return nstf_switch_int(NSTF_SW_FD_EARLY); }

/* Contexts up to this many keys run one block per kv head, whose waves
 * merge their splits in shared memory: no partials in global memory and
 * no merge kernel (at such lengths the launch and the two dependent global
 * round trips of the merge cost more than the parallelism of more blocks
 * saves; each wave reads at most 2 x FD_STAGES key tiles: 256 keys on
 * NVIDIA, 128 on AMD). */
#define FD_ONE_BLOCK_KEYS (FD_NW * FD_WAVE_KV)

/* The kernel's shared-memory size allowed on the current device (once per
 * device), and the blocks of it an SM holds at once (the occupancy API,
 * read once; 2 if it cannot say). */
template <int HD, bool Q8> static nstf_status fd_prepare(int wave, int *per_sm) {
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    static int cached = 0;
    void (*kfn)(const u16 *, int64_t, const u16 *, int64_t, const u16 *, int64_t, u16 *, u16 *, int64_t, int64_t,
                int64_t, int, int, float, int64_t, float *, float *, const int32_t *, int, int, u16 *, int64_t) =
        flash_decode_kernel<HD, Q8>;
    if (!nstf_gpu_device_done(&attr_set)) {
        GPU_CHECK(gpuFuncSetAttribute((const void *)kfn, gpuFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)fd_smem_bytes<HD, Q8>()));
        nstf_gpu_device_mark(&attr_set);
    }
    if (!cached) {
        int n = 0;
        if (gpuOccupancyMaxActiveBlocksPerMultiprocessor(&n, kfn, FD_NW * wave, fd_smem_bytes<HD, Q8>()) != gpuSuccess ||
            n <= 0)
            n = 2;
        cached = n;
    }
    *per_sm = cached;
    return NSTF_OK;
}

/* The split plan: chunk keys per split, S splits (a multiple of FD_NW; S ==
 * FD_NW: one block per kv head). Past FD_ONE_BLOCK_KEYS, as many blocks as
 * the SMs hold at once (per_sm each): one round, every SM busy. */
static void fd_plan(int64_t kv_total, int n_kv, int n_sm, int per_sm, int64_t *chunk, int64_t *n_split) {
    if (kv_total <= FD_ONE_BLOCK_KEYS) {
        *chunk = (kv_total + FD_NW * FD_BKV - 1) / (FD_NW * FD_BKV) * FD_BKV;
        *n_split = FD_NW;
        return;
    }
    int64_t want = (int64_t)per_sm * n_sm / n_kv; /* blocks per kv head */
    want = (want > 1 ? want : 1) * FD_NW;         /* splits per kv head */
    int64_t c = (kv_total + want - 1) / want;
    c = (c + FD_BKV - 1) / FD_BKV * FD_BKV;
    int64_t s = (kv_total + c - 1) / c;
    s = (s + FD_NW - 1) / FD_NW * FD_NW;
    *chunk = c;
    *n_split = s;
}

extern "C" size_t nstf_gpu_flash_decode_scratch_bytes(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                                      int head_dim) {
    int n_sm = 0, wave = 0, per_sm = 0;
    if (n_tok <= 0 || pos0 < 0 || n_kv_heads <= 0 || n_heads <= 0 || (head_dim != 64 && head_dim != 128)) return 0;
    if (nstf_mma_device(&n_sm, &wave) != NSTF_OK) return 0;
    /* the plan comes from the bf16 kernel's occupancy for either cache type
     * (the scratch is sized by it; the Q8_0 kernel's plan must not need more) */
    if ((head_dim == 64 ? fd_prepare<64, false>(wave, &per_sm) : fd_prepare<128, false>(wave, &per_sm)) != NSTF_OK)
        return 0;
    int64_t chunk = 0, n_split = 0;
    fd_plan(pos0 + n_tok, n_kv_heads, n_sm, per_sm, &chunk, &n_split);
    int64_t rows = n_tok * (n_heads / n_kv_heads);
    return (size_t)(n_kv_heads * (n_split / FD_NW) * rows * (head_dim + 2)) * sizeof(float);
}

template <int HD, bool Q8>
static nstf_status flash_decode_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_stride, const u16 *v,
                                       int64_t v_stride, u16 *kc, u16 *vc, int64_t kv_rb, u16 *out, int64_t out_stride,
                                       int64_t n_tok, int64_t pos0, int n_heads, int n_kv, float scale, int window,
                                       void *scratch, size_t scratch_bytes, const int32_t *pos_dev, gpuStream_t stream) {
    int n_sm = 0, wave = 0, per_sm = 0, per_sm_q8 = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    NSTF_TRY((fd_prepare<HD, false>(wave, &per_sm)));
    if (Q8) { /* its own attributes and occupancy (its staging costs shared memory): the plan for the blocks
               * it holds at once, no more than the bf16 kernel's, whose plan sized the scratch */
        NSTF_TRY((fd_prepare<HD, true>(wave, &per_sm_q8)));
        per_sm = per_sm_q8 < per_sm ? per_sm_q8 : per_sm;
    }
    int64_t chunk = 0, n_split = 0;
    fd_plan(pos0 + n_tok, n_kv, n_sm, per_sm, &chunk, &n_split); /* with pos_dev, pos0 is the bound */
    const int rows = (int)n_tok * (n_heads / n_kv);
    const int64_t n_blk = n_split / FD_NW; /* one partial per block */
    const size_t need = (size_t)(n_kv * n_blk * rows * (HD + 2)) * sizeof(float);
    if (!scratch || scratch_bytes < need)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_decode: scratch of %zu bytes, need %zu", scratch_bytes,
                              need);
    if (n_blk > 0x7fffffff) return nstf_set_error(NSTF_ERR_RANGE, "flash_decode: context too long");
    if ((size_t)n_blk * 2 * sizeof(float) > 48 * 1024)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_decode: %lld split blocks", (long long)n_blk);
    float *part_ml = (float *)scratch;
    float *part_acc = part_ml + (size_t)n_kv * n_blk * rows * 2;
    const size_t smem = fd_smem_bytes<HD, Q8>();
    dim3 grid((unsigned)n_blk, (unsigned)n_kv);
    const int pdl = nstf_gpu_pdl();
    GPU_CHECK(nstf_gpu_launch(flash_decode_kernel<HD, Q8>, grid, dim3(FD_NW * wave), smem, stream, pdl, q, q_stride,
                              k, k_stride, v, v_stride, kc, vc, kv_rb, n_tok, pos0, n_heads, n_kv,
                              scale * 1.4426950408889634f, chunk, part_ml, part_acc, pos_dev, fd_early(), window,
                              out, out_stride));
    GPU_LAUNCH_CHECK(stream);
    if (n_blk == 1) return NSTF_OK; /* merged in the block */
    GPU_CHECK(nstf_gpu_launch(flash_decode_merge<HD>, dim3((unsigned)rows, (unsigned)n_kv), dim3(FD_MQ * HD),
                              (size_t)n_blk * 2 * sizeof(float), stream, pdl,
                              (const float *)part_ml, (const float *)part_acc, out, out_stride, (int)n_blk, rows,
                              n_heads / n_kv));
    GPU_LAUNCH_CHECK(stream);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_flash_decode(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                             int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                             uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                             int64_t out_stride, int64_t n_tok, int64_t pos0, int64_t n_ctx,
                                             int n_heads, int n_kv_heads, int head_dim, float scale, void *scratch,
                                             size_t scratch_bytes, void *stream) {
    NSTF_TRY(flash_check_args("flash_decode", q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride,
                              n_tok, pos0, n_ctx, n_heads, n_kv_heads, head_dim));
    if (n_tok * (n_heads / n_kv_heads) > 16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "flash_decode: %lld tokens x %d query heads per kv head > 16 rows; use "
                              "nstf_gpu_flash_attn",
                              (long long)n_tok, n_heads / n_kv_heads);
    gpuStream_t s = (gpuStream_t)stream;
    if (head_dim == 64)
        return flash_decode_launch<64, false>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, 0, out,
                                              out_stride, n_tok, pos0, n_heads, n_kv_heads, scale, 0, scratch,
                                              scratch_bytes, NULL, s);
    return flash_decode_launch<128, false>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, 0, out, out_stride,
                                           n_tok, pos0, n_heads, n_kv_heads, scale, 0, scratch, scratch_bytes, NULL,
                                           s);
}

extern "C" nstf_status nstf_gpu_flash_decode_dpos(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                                  int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                                  uint16_t *k_cache, uint16_t *v_cache, int64_t kv_rb, uint16_t *out,
                                                  int64_t out_stride, int64_t n_tok, const int32_t *d_pos0,
                                                  int64_t pos_max, int64_t n_ctx, int n_heads, int n_kv_heads,
                                                  int head_dim, float scale, int window, void *scratch,
                                                  size_t scratch_bytes, void *stream) {
    if (!d_pos0 || window < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_decode_dpos: d_pos0 NULL or window < 0");
    NSTF_TRY(flash_check_args("flash_decode", q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride,
                              n_tok, pos_max, n_ctx, n_heads, n_kv_heads, head_dim));
    NSTF_TRY(flash_check_kv_rb("flash_decode_dpos", kv_rb, n_kv_heads, head_dim));
    if (n_tok * (n_heads / n_kv_heads) > 16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "flash_decode_dpos: %lld tokens x %d query heads per kv head > 16",
                              (long long)n_tok, n_heads / n_kv_heads);
    gpuStream_t s = (gpuStream_t)stream;
#define FD_DPOS(HD, Q8)                                                                                          \
    flash_decode_launch<HD, Q8>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, kv_rb, out, out_stride, \
                                n_tok, pos_max, n_heads, n_kv_heads, scale, window, scratch, scratch_bytes, d_pos0, s)
    if (head_dim == 64) return kv_rb ? FD_DPOS(64, true) : FD_DPOS(64, false);
    return kv_rb ? FD_DPOS(128, true) : FD_DPOS(128, false);
#undef FD_DPOS
}
