/* attn_sparse.cu — sparse decode attention (ATTN_SPARSE, ops.h): Quest
 * block statistics and a block-sparse split-KV flash decode.
 *
 * A one-token step is three kernels, chained by programmatic dependent
 * launch where the device has it:
 *  1. sparse_prep: the token's k, v rows into the cache and its block's
 *     per-channel key min / max (fp32 of the bf16 keys: exact; the mass of
 *     a block the token opens zeroed), and, spread over the GPU, the decay
 *     of the other blocks' attention mass and the Quest bound of every
 *     candidate block (1 .. first window block - 1) per kv head: the max
 *     over the kv head's query heads of sum_c max(q_c min_c, q_c max_c),
 *     fp32;
 *  2. sparse_select: one workgroup per kv head takes the top k by a radix
 *     select (a block's rank counts the blocks with a larger bound, or an
 *     equal one and a lower index: the CPU's order), and writes block 0,
 *     the chosen blocks and the window's blocks ascending into sel through
 *     workgroup prefix sums; -1 after them;
 *  3. sparse_attend: the split-KV part: one workgroup per (selected block,
 *     kv head) scores the block's keys for every query head of the group
 *     (fp32 dot products from the bf16 cache) and leaves the block's
 *     partial softmax (max m, sum l, unnormalised acc) per head; the kv
 *     head's last workgroup to finish merges the partials into the output
 *     (bf16) and adds (1 - d) p_b to each selected block's (decayed)
 *     attention mass, p_b the block's probability averaged over the group.
 * Every position-dependent quantity is read from the device position, so a
 * captured step replays at any position: grids are sized by the host bound
 * (max_sel workgroups; the count selected at a position is known from it,
 * so the rest exit at once). For a run of several tokens (prefill, which
 * attends densely through flash attention before this is called) only
 * sparse_stats runs: the statistics of every block the run touched.
 *
 * No matrix units (a block is at most 64 keys, scored by independent
 * threads, probabilities fp32), K and V read once per kv head per selected
 * block. Work floats: nstf_sparse_work_floats(1, ...): the bounds [n_kv,
 * nb], an [n_kv, nb] area of which the GPU uses the first n_kv as int32
 * arrival counters (the size is shared with the CPU path), then the
 * partials [n_heads, max_sel, head_dim + 2]. */
#include "gpu.h"

#define SP_THREADS 128
#define SP_SEL_THREADS 1024 /* the selection's workgroup */
#define SP_SEL_R 4 /* rounds of candidate keys it keeps in registers */
#define SP_MAX_QD 2048 /* group * head_dim staged in shared memory (fp32) */
#define SP_MAX_G 32    /* query heads per kv head */

static __device__ __forceinline__ float sp_bf16(const uint16_t *p) {
    nstf_bf16 b;
    b.bits = *p;
    return nstf_bf16_to_float(b);
}

__global__ void __launch_bounds__(SP_THREADS)
    sparse_stats_kernel(const uint16_t *__restrict__ kc, float *__restrict__ kmin, float *__restrict__ kmax,
                        float *__restrict__ mass, const int32_t *__restrict__ pos, int64_t n_tok, int n_kv,
                        int head_dim, int block, int64_t n_ctx) {
    const int64_t p_first = pos[0], p_last = pos[n_tok - 1];
    const int64_t b = p_first / block + blockIdx.x, g = blockIdx.y, kvd = (int64_t)n_kv * head_dim;
    if (p_first < 0 || p_last >= n_ctx || b * block > p_last) return;
    const int64_t j1 = (b + 1) * block < p_last + 1 ? (b + 1) * block : p_last + 1;
    for (int c = threadIdx.x; c < head_dim; c += SP_THREADS) {
        const int64_t off = g * head_dim + c;
        float lo = sp_bf16(kc + b * block * kvd + off), hi = lo;
        for (int64_t j = b * block + 1; j < j1; j++) {
            const float x = sp_bf16(kc + j * kvd + off);
            lo = fminf(lo, x);
            hi = fmaxf(hi, x);
        }
        kmin[b * kvd + off] = lo;
        kmax[b * kvd + off] = hi;
    }
    if (mass && threadIdx.x == 0 && b * block >= p_first) mass[b * n_kv + g] = 0.0f;
}

/* The first block of the recent window and the block count for n_keys keys. */
static __device__ __forceinline__ int64_t sp_window_block(int64_t n_keys, int window, int block) {
    const int64_t w = window > 1 ? window : 1;
    return (n_keys > w ? n_keys - w : 0) / block;
}

/* The selected blocks of kv head g's row of sel at n_keys keys: block 0
 * (once the window has moved past it), the top-k candidates (or all of
 * them), the window's blocks. The same count the selection writes, from
 * the position alone, so a workgroup knows it before the selection ends. */
static __device__ __forceinline__ int64_t sp_n_sel(int64_t n_keys, int topk, int window, int block) {
    const int64_t nb = (n_keys + block - 1) / block, wb0 = sp_window_block(n_keys, window, block);
    const int64_t n_cand = wb0 > 1 ? wb0 - 1 : 0;
    return (wb0 > 0 ? 1 : 0) + (n_cand < topk ? n_cand : (int64_t)topk) + (nb - wb0);
}

/* 1. The step's preparation, grid (1 + bound workgroups, kv heads).
 * Workgroup x = 0 of kv head g writes the token's k, v rows of the head
 * into the cache and recomputes its block's key min / max (the earlier
 * rows from the cache, the new one from k), and zeroes the block's
 * attention mass when the token opens it. The others score the candidate
 * blocks 1 .. first window block - 1 by the Quest bound (the max over the
 * group's query heads of sum_c max(q_c min_c, q_c max_c), fp32): one wave
 * per SP_BU blocks at a time, lanes over the channels (CH each), all the
 * wave's min / max loads issued together, the next batch's while this
 * one is scored, the first before the PDL wait (the statistics of blocks
 * below the window were written by earlier steps). They also decay the
 * attention mass of the blocks before the token (the merge only adds).
 * The token's block is always in the window, so the two parts touch
 * different blocks. */
#define SP_BU 4
template <int C32> /* channels a lane takes in a 32-lane wave (a 64-lane wave takes half) */
__global__ void __launch_bounds__(SP_THREADS)
    sparse_prep_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ k, const uint16_t *__restrict__ v,
                       uint16_t *kc, uint16_t *vc, float *kmin, float *kmax, float *mass, float decay,
                       float *__restrict__ work, const int32_t *__restrict__ pos, int n_heads, int n_kv, int head_dim,
                       int block, int window, int64_t nb_max, int64_t n_ctx) {
    constexpr int CH = C32 * 32 / NSTF_WAVE > 0 ? C32 * 32 / NSTF_WAVE : 1;
    __shared__ float qs[SP_MAX_QD];
    const int g = blockIdx.y, group = n_heads / n_kv, tid = threadIdx.x, lane = tid % NSTF_WAVE;
    const int n_waves = SP_THREADS / NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int64_t kvd = (int64_t)n_kv * head_dim, p = pos[0], hd0 = (int64_t)g * head_dim;
    if (p < 0 || p >= n_ctx) return;
    if (blockIdx.x == 0) {
        NSTF_PDL_WAIT();
        NSTF_PDL_TRIGGER();
        const int64_t b = p / block;
        for (int c = tid; c < head_dim; c += SP_THREADS) {
            const uint16_t kv = k[hd0 + c];
            kc[p * kvd + hd0 + c] = kv;
            vc[p * kvd + hd0 + c] = v[hd0 + c];
            float lo = sp_bf16(&kv), hi = lo;
#pragma unroll 8
            for (int64_t j = b * block; j < p; j++) {
                const float x = sp_bf16(kc + j * kvd + hd0 + c);
                lo = fminf(lo, x);
                hi = fmaxf(hi, x);
            }
            kmin[b * kvd + hd0 + c] = lo;
            kmax[b * kvd + hd0 + c] = hi;
        }
        if (mass && tid == 0 && p % block == 0) mass[b * n_kv + g] = 0.0f;
        return;
    }
    const int64_t wb0 = sp_window_block(p + 1, window, block);
    const int64_t stride = (int64_t)(gridDim.x - 1) * n_waves * SP_BU;
    const int64_t first = 1 + ((int64_t)(blockIdx.x - 1) * n_waves + wave) * SP_BU;
    float lo[SP_BU][CH], hi[SP_BU][CH], lo2[SP_BU][CH], hi2[SP_BU][CH]; /* two batches: one loads, one computes */
    auto load = [&](float (&l)[SP_BU][CH], float (&h)[SP_BU][CH], int64_t b0) {
#pragma unroll
        for (int u = 0; u < SP_BU; u++) {
            const int64_t b = b0 + u < wb0 ? b0 + u : b0;
            const float *mn = kmin + b * kvd + hd0, *mx = kmax + b * kvd + hd0;
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int c = lane + i * NSTF_WAVE;
                l[u][i] = c < head_dim ? mn[c] : 0.0f;
                h[u][i] = c < head_dim ? mx[c] : 0.0f;
            }
        }
    };
    if (first < wb0) load(lo, hi, first);
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    /* the decay of the mass of every block before the token's position (a
     * block the token opens is zeroed by workgroup 0, the only writer) */
    const int64_t nb_before = (p + block - 1) / block;
    for (int64_t b = (int64_t)(blockIdx.x - 1) * SP_THREADS + tid; mass && b < nb_before;
         b += (int64_t)(gridDim.x - 1) * SP_THREADS)
        mass[b * n_kv + g] *= decay;
    if (wb0 <= 1 || (int64_t)(blockIdx.x - 1) * n_waves * SP_BU + 1 >= wb0) return;
    for (int i = tid; i < group * head_dim; i += SP_THREADS) qs[i] = sp_bf16(q + (int64_t)g * group * head_dim + i);
    __syncthreads();
    float *ub = work + g * nb_max;
    auto score = [&](const float (&l)[SP_BU][CH], const float (&hh)[SP_BU][CH], int64_t b0) {
        float best[SP_BU];
#pragma unroll
        for (int u = 0; u < SP_BU; u++) best[u] = -INFINITY;
        for (int h = 0; h < group; h++) {
            float qv[CH];
#pragma unroll
            for (int i = 0; i < CH; i++) {
                const int c = lane + i * NSTF_WAVE;
                qv[i] = c < head_dim ? qs[h * head_dim + c] : 0.0f;
            }
#pragma unroll
            for (int u = 0; u < SP_BU; u++) {
                float sum = 0.0f;
#pragma unroll
                for (int i = 0; i < CH; i++) sum += fmaxf(qv[i] * l[u][i], qv[i] * hh[u][i]);
                best[u] = fmaxf(best[u], wave_reduce_sum(sum));
            }
        }
#pragma unroll
        for (int u = 0; u < SP_BU; u++)
            if (lane == u && b0 + u < wb0) ub[b0 + u] = best[u];
    };
    for (int64_t b0 = first; b0 < wb0; b0 += 2 * stride) {
        if (b0 + stride < wb0) load(lo2, hi2, b0 + stride);
        score(lo, hi, b0);
        if (b0 + stride >= wb0) break;
        if (b0 + 2 * stride < wb0) load(lo, hi, b0 + 2 * stride);
        score(lo2, hi2, b0 + stride);
    }
}

/* A float as an unsigned key of the same order (+0 for -0, so that the two
 * zeros tie as they compare equal). */
static __device__ __forceinline__ uint32_t sp_key(float f) {
    const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Inclusive prefix sum of one int per thread over the workgroup (a wave
 * scan by shuffles, then one over the waves' totals); *total gets the sum.
 * Every thread calls it; ws: shared scratch of one int per wave. */
static __device__ __forceinline__ int sp_scan_incl(int v, int *ws, int *total) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE, n_waves = blockDim.x / NSTF_WAVE;
#pragma unroll
    for (int o = 1; o < NSTF_WAVE; o <<= 1) {
        const int t = NSTF_SHFL(v, lane >= o ? lane - o : lane);
        if (lane >= o) v += t;
    }
    if (lane == NSTF_WAVE - 1) ws[wave] = v;
    __syncthreads();
    if (wave == 0) {
        int s = lane < n_waves ? ws[lane] : 0;
#pragma unroll
        for (int o = 1; o < NSTF_WAVE; o <<= 1) {
            const int t = NSTF_SHFL(s, lane >= o ? lane - o : lane);
            if (lane >= o) s += t;
        }
        if (lane < n_waves) ws[lane] = s;
    }
    __syncthreads();
    const int incl = v + (wave > 0 ? ws[wave - 1] : 0);
    *total = ws[n_waves - 1];
    __syncthreads(); /* ws may be reused at once */
    return incl;
}

/* 2. The selection of one kv head (one workgroup of SP_SEL_THREADS): the
 * top-k candidate blocks by bound, ties to the lower block (the CPU's rank
 * order: a block is chosen when fewer than k blocks have a larger bound,
 * or an equal one and a lower index). A radix select over the bounds'
 * order keys (four 8-bit digits; a shared histogram each, the lanes that
 * share lane 0's digit adding once; the digit found by a scan of the 256
 * counts) finds the k-th largest key T and how many of the blocks at T to
 * take. Candidates are read in rounds of one per thread (coalesced; the
 * first SP_SEL_R rounds' keys kept in registers), so the index order is
 * the round and thread order, and a workgroup scan a round (chosen blocks
 * before it; first the blocks at T before it, when more tie at T than are
 * taken) places block 0, the chosen blocks and the window's blocks
 * ascending into sel; -1 after them. Also zeroes the kv head's arrival
 * counter for the attention. */
__global__ void __launch_bounds__(SP_SEL_THREADS)
    sparse_select_kernel(int32_t *__restrict__ sel, const float *__restrict__ work, int32_t *__restrict__ cnt,
                         const int32_t *__restrict__ pos, int block, int topk, int window, int64_t nb_max,
                         int64_t ms) {
    __shared__ unsigned hist[256];
    __shared__ int ws[SP_SEL_THREADS / 32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need, s_at;
    const int g = blockIdx.x, tid = threadIdx.x, lane = tid % NSTF_WAVE;
    const int64_t n_keys = (int64_t)pos[0] + 1, nb = (n_keys + block - 1) / block,
                  wb0 = sp_window_block(n_keys, window, block);
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const float *u = work + g * nb_max;
    int32_t *sg = sel + g * ms;
    if (tid == 0) cnt[g] = 0;
    const int64_t n_cand = wb0 > 1 ? wb0 - 1 : 0;
    const bool all = n_cand <= topk, rank = !all && topk > 0; /* top-k 0: none of the candidates */
    /* the keys of the first SP_SEL_R rounds stay in registers */
    uint32_t kr[SP_SEL_R];
#pragma unroll
    for (int r = 0; r < SP_SEL_R; r++) {
        const int64_t b = 1 + (int64_t)r * SP_SEL_THREADS + tid;
        kr[r] = rank && b < wb0 ? sp_key(u[b]) : 0u;
    }
    uint32_t prefix = 0;
    int need = topk, at_thr = 0;
    for (int shift = 24; rank && shift >= 0; shift -= 8) {
        if (tid < 256) hist[tid] = 0;
        __syncthreads();
        const uint32_t mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        auto count = [&](uint32_t key, bool valid) { /* the whole wave calls it */
            const int d = valid && (key & mask) == prefix ? (int)((key >> shift) & 255u) : -1;
            const int d0 = NSTF_SHFL(d, 0);
            const unsigned long long same = NSTF_BALLOT(d == d0 && d >= 0);
            if (lane == 0 && d >= 0) atomicAdd(&hist[d], (unsigned)__popcll(same));
            else if (d >= 0 && d != d0) atomicAdd(&hist[d], 1u);
        };
#pragma unroll
        for (int r = 0; r < SP_SEL_R; r++)
            if (1 + (int64_t)r * SP_SEL_THREADS < wb0) count(kr[r], 1 + (int64_t)r * SP_SEL_THREADS + tid < wb0);
        for (int64_t b0 = 1 + (int64_t)SP_SEL_R * SP_SEL_THREADS; b0 < wb0; b0 += SP_SEL_THREADS)
            count(b0 + tid < wb0 ? sp_key(u[b0 + tid]) : 0u, b0 + tid < wb0);
        __syncthreads();
        /* thread t holds digit 255 - t: its inclusive scan counts the keys
         * with this digit or a larger one */
        const int c = tid < 256 ? (int)hist[255 - tid] : 0;
        int tot;
        const int incl = sp_scan_incl(c, ws, &tot);
        if (tid < 256 && incl - c < need && incl >= need) {
            s_prefix = prefix | ((uint32_t)(255 - tid) << shift);
            s_need = need - (incl - c);
            s_at = c;
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        at_thr = s_at; /* after the last digit: the candidates whose key is T */
    }
    /* T's blocks need ranks among themselves only when not all of them are
     * taken */
    const bool ties = rank && at_thr > need;
    const int head = wb0 > 0 ? 1 : 0; /* block 0, the attention sink */
    int eq_run = 0, sel_run = 0;
    auto place = [&](uint32_t key, int64_t b) { /* the whole workgroup calls it */
        const bool valid = b < wb0;
        int tot, mine;
        if (ties) {
            const int eq = valid && key == prefix;
            const int eq_before = eq_run + sp_scan_incl(eq, ws, &tot) - eq;
            eq_run += tot;
            mine = valid && (key > prefix || (eq && eq_before < need));
        } else {
            mine = valid && (all || (rank && key >= prefix));
        }
        const int at = head + sel_run + sp_scan_incl(mine, ws, &tot) - mine;
        sel_run += tot;
        if (mine) sg[at] = (int32_t)b;
    };
#pragma unroll
    for (int r = 0; r < SP_SEL_R; r++)
        if (1 + (int64_t)r * SP_SEL_THREADS < wb0) place(kr[r], 1 + (int64_t)r * SP_SEL_THREADS + tid);
    for (int64_t b0 = 1 + (int64_t)SP_SEL_R * SP_SEL_THREADS; b0 < wb0; b0 += SP_SEL_THREADS)
        place(rank && b0 + tid < wb0 ? sp_key(u[b0 + tid]) : 0u, b0 + tid);
    if (tid == 0 && head) sg[0] = 0;
    const int64_t n_sel = head + sel_run;
    for (int64_t b = wb0 + tid; b < nb; b += SP_SEL_THREADS) sg[n_sel + (b - wb0)] = (int32_t)b;
    for (int64_t i = n_sel + (nb - wb0) + tid; i < ms; i += SP_SEL_THREADS) sg[i] = -1;
}

/* A load of what other workgroups stored before their fence: from L2
 * (CUDA: ld.global.cg), not a line this SM's L1 may hold (HIP: volatile,
 * after the agent fence that invalidates L1). */
static __device__ __forceinline__ float sp_ld_l2(const float *p) {
#if defined(NSTF_GPU_CUDA)
    return __ldcg(p);
#else
    return *(const volatile float *)p;
#endif
}

/* 3. Attention over the selected blocks, grid (max_sel, kv heads): one
 * workgroup per (selected block, kv head) scores the block's keys for
 * every query head of the group (a thread per key and head, the key row in
 * 16-byte loads when VEC), takes the block's softmax (a wave per head) and
 * its probabilities times V (a thread per head and channel, rows
 * coalesced), and leaves the partial (max m, sum l, unnormalised acc) per
 * head. The last workgroup of the kv head to finish (an arrival counter
 * after a fence) merges the partials into the output (bf16), adds (1 - d)
 * p_b to the mass of each selected block (decayed by sparse_prep), p_b the
 * block's probability averaged over the group, and leaves the counter at
 * zero. */
template <bool VEC>
__global__ void __launch_bounds__(SP_THREADS)
    sparse_attend_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ kc,
                         const uint16_t *__restrict__ vc, const int32_t *__restrict__ sel, float *part,
                         uint16_t *__restrict__ out, float *__restrict__ mass, float decay, int32_t *cnt,
                         const int32_t *__restrict__ pos, int n_heads, int n_kv, int head_dim, int block, int topk,
                         int window, float scale, int64_t ms) {
    __shared__ __align__(16) float qs[SP_MAX_QD];
    __shared__ float sc[SP_MAX_G * NSTF_SPARSE_BLOCK_MAX];
    __shared__ float ml[SP_MAX_G * 2];
    __shared__ int s_last;
    const int i = blockIdx.x, g = blockIdx.y, group = n_heads / n_kv, tid = threadIdx.x;
    const int lane = tid % NSTF_WAVE, wave = tid / NSTF_WAVE, n_waves = SP_THREADS / NSTF_WAVE;
    const int64_t n_keys = (int64_t)pos[0] + 1, n_sel = sp_n_sel(n_keys, topk, window, block);
    if (i >= n_sel) return;
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    const int32_t *sg = sel + (int64_t)g * ms;
    const int64_t kvd = (int64_t)n_kv * head_dim, j0 = (int64_t)sg[i] * block, hd0 = (int64_t)g * head_dim,
                  nk = j0 + block < n_keys ? block : n_keys - j0;
    if constexpr (VEC) { /* the block's V rows (and K's) start into L2 while K is scored */
        for (int t = tid; t < 2 * nk; t += SP_THREADS)
            NSTF_L2_PREFETCH((t < nk ? vc + (j0 + t) * kvd : kc + (j0 + t - nk) * kvd) + hd0, head_dim * 2);
    }
    for (int t = tid; t < group * head_dim; t += SP_THREADS) qs[t] = sp_bf16(q + (int64_t)g * group * head_dim + t);
    __syncthreads();
    for (int t = tid; t < group * nk; t += SP_THREADS) {
        const int h = t % group, j = t / group;
        const uint16_t *kr = kc + (j0 + j) * kvd + hd0;
        const float *qh = qs + h * head_dim;
        float s = 0.0f;
        if constexpr (VEC) {
#pragma unroll 8
            for (int c = 0; c < head_dim; c += 8) {
                const uint4 w = *(const uint4 *)(kr + c);
                const float4 qa = *(const float4 *)(qh + c), qb = *(const float4 *)(qh + c + 4);
                s += qa.x * nstf_bf16lo_to_float(w.x) + qa.y * nstf_bf16hi_to_float(w.x);
                s += qa.z * nstf_bf16lo_to_float(w.y) + qa.w * nstf_bf16hi_to_float(w.y);
                s += qb.x * nstf_bf16lo_to_float(w.z) + qb.y * nstf_bf16hi_to_float(w.z);
                s += qb.z * nstf_bf16lo_to_float(w.w) + qb.w * nstf_bf16hi_to_float(w.w);
            }
        } else {
            for (int c = 0; c < head_dim; c++) s += qh[c] * sp_bf16(kr + c);
        }
        sc[h * NSTF_SPARSE_BLOCK_MAX + j] = s * scale;
    }
    __syncthreads();
    for (int h = wave; h < group; h += n_waves) {
        float *s = sc + h * NSTF_SPARSE_BLOCK_MAX, m = -INFINITY, l = 0.0f;
        for (int j = lane; j < nk; j += NSTF_WAVE) m = fmaxf(m, s[j]);
        m = wave_reduce_max(m);
        for (int j = lane; j < nk; j += NSTF_WAVE) {
            const float e = expf(s[j] - m);
            s[j] = e;
            l += e;
        }
        l = wave_reduce_sum(l);
        if (lane == 0) ml[2 * h] = m, ml[2 * h + 1] = l;
    }
    __syncthreads();
    for (int t = tid; t < group * head_dim; t += SP_THREADS) {
        const int h = t / head_dim, c = t % head_dim;
        const float *s = sc + h * NSTF_SPARSE_BLOCK_MAX;
        const uint16_t *vr = vc + j0 * kvd + hd0 + c;
        float a0 = 0.0f, a1 = 0.0f;
        int j = 0;
#pragma unroll 4
        for (; j + 1 < nk; j += 2) { /* 8 rows' loads in flight */
            a0 += s[j] * sp_bf16(vr + j * kvd);
            a1 += s[j + 1] * sp_bf16(vr + (j + 1) * kvd);
        }
        if (j < nk) a0 += s[j] * sp_bf16(vr + j * kvd);
        float *dst = part + ((int64_t)(g * group + h) * ms + i) * (head_dim + 2);
        dst[2 + c] = a0 + a1;
        if (c == 0) dst[0] = ml[2 * h], dst[1] = ml[2 * h + 1];
    }
    /* the last of the kv head's workgroups merges */
    NSTF_FENCE_GPU();
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(&cnt[g], 1) == (int)n_sel - 1;
    __syncthreads();
    if (!s_last) return;
    NSTF_FENCE_GPU();
    float *hm = sc, *hl = sc + SP_MAX_G;
    for (int h = wave; h < group; h += n_waves) {
        const float *ph = part + (int64_t)(g * group + h) * ms * (head_dim + 2);
        float m = -INFINITY;
        for (int64_t e = lane; e < n_sel; e += NSTF_WAVE) m = fmaxf(m, sp_ld_l2(ph + e * (head_dim + 2)));
        m = wave_reduce_max(m);
        float l = 0.0f;
        for (int64_t e = lane; e < n_sel; e += NSTF_WAVE)
            l += sp_ld_l2(ph + e * (head_dim + 2) + 1) * expf(sp_ld_l2(ph + e * (head_dim + 2)) - m);
        l = wave_reduce_sum(l);
        if (lane == 0) hm[h] = m, hl[h] = l;
    }
    __syncthreads();
    for (int t = tid; t < group * head_dim; t += SP_THREADS) {
        const int h = t / head_dim, c = t % head_dim;
        const float *ph = part + (int64_t)(g * group + h) * ms * (head_dim + 2);
        const float mh = hm[h];
        float acc = 0.0f;
#pragma unroll 8
        for (int64_t e = 0; e < n_sel; e++)
            acc += sp_ld_l2(ph + e * (head_dim + 2) + 2 + c) * expf(sp_ld_l2(ph + e * (head_dim + 2)) - mh);
        out[(int64_t)(g * group + h) * head_dim + c] = nstf_float_to_bf16(acc / hl[h]).bits;
    }
    if (tid == 0) cnt[g] = 0;
    if (!mass) return;
    for (int64_t e = tid; e < n_sel; e += SP_THREADS) {
        float p = 0.0f;
        for (int h = 0; h < group; h++) {
            const float *pe = part + ((int64_t)(g * group + h) * ms + e) * (head_dim + 2);
            p += sp_ld_l2(pe + 1) * expf(sp_ld_l2(pe) - hm[h]) / hl[h];
        }
        mass[(int64_t)sg[e] * n_kv + g] += (1.0f - decay) * p / (float)group;
    }
}

extern "C" nstf_status nstf_gpu_attn_sparse(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                            uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                            const int32_t *pos, int64_t n_tok, int64_t n_ctx, int n_heads,
                                            int n_kv_heads, int head_dim, float scale, int block, int topk,
                                            int window, float *kmin, float *kmax, float *mass, float mass_decay,
                                            int32_t *sel, float *work, void *stream) {
    const int group = n_kv_heads > 0 ? n_heads / n_kv_heads : 0;
    if (!k_cache || !v_cache || !pos || !kmin || !kmax || n_tok < 1 || n_ctx < 1 || n_kv_heads < 1 ||
        n_heads % n_kv_heads != 0 || group > SP_MAX_G || (int64_t)group * head_dim > SP_MAX_QD || head_dim < 1 ||
        head_dim > 256 ||
        block < NSTF_SPARSE_BLOCK_MIN || block > NSTF_SPARSE_BLOCK_MAX || topk < 0 || window < 0 ||
        (n_tok == 1 && (!q || !k || !v || !out || !sel || !work)))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_attn_sparse: bad arguments (n_tok %lld, %d/%d heads of %d, block %d, top-k %d, "
                              "window %d; at most %d query heads per kv head and %d values of them)",
                              (long long)n_tok, n_heads, n_kv_heads, head_dim, block, topk, window, SP_MAX_G, SP_MAX_QD);
    gpuStream_t s = (gpuStream_t)stream;
    const int64_t nb_max = (n_ctx + block - 1) / block;
    const int64_t ms = nstf_sparse_max_sel(topk, block, window);
    if (n_tok > 1) {
        const int64_t touched = (n_tok + block - 1) / block + 1;
        sparse_stats_kernel<<<dim3((unsigned)(touched < NSTF_GPU_MAX_GRID ? touched : NSTF_GPU_MAX_GRID),
                                   (unsigned)n_kv_heads),
                              SP_THREADS, 0, s>>>(k_cache, kmin, kmax, mass, pos, n_tok, n_kv_heads, head_dim, block,
                                                  n_ctx);
        GPU_LAUNCH_CHECK(s);
        return NSTF_OK;
    }
    if (ms > NSTF_GPU_MAX_GRID)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_attn_sparse: %lld selected blocks per step", (long long)ms);
    const int pdl = nstf_gpu_pdl(), n_sm = nstf_gpu_n_sm() > 0 ? nstf_gpu_n_sm() : 1;
    /* the bounds: enough workgroups for every candidate in one pass of
     * 32-lane waves (64-lane waves loop twice), at most 8 per SM over all kv
     * heads (the waves loop over the rest) */
    const int64_t per_wg = (int64_t)(SP_THREADS / 32) * SP_BU;
    int64_t bound_wgs = (nb_max + per_wg - 1) / per_wg;
    const int64_t cap = (8 * (int64_t)n_sm + n_kv_heads - 1) / n_kv_heads;
    if (bound_wgs > cap) bound_wgs = cap;
    const dim3 pg((unsigned)(1 + bound_wgs), (unsigned)n_kv_heads);
    int32_t *cnt = (int32_t *)(work + n_kv_heads * nb_max); /* the area the GPU leaves unused: n_kv counters */
    const int ch = head_dim <= 32 ? 1 : head_dim <= 64 ? 2 : head_dim <= 128 ? 4 : 8;
#define SP_PREP(CH)                                                                                                  \
    nstf_gpu_launch(sparse_prep_kernel<CH>, pg, dim3(SP_THREADS), 0, s, pdl, q, k, v, k_cache, v_cache, kmin, kmax, \
                    mass, mass_decay, work, pos, n_heads, n_kv_heads, head_dim, block, window, nb_max, n_ctx)
    GPU_CHECK(ch == 1 ? SP_PREP(1) : ch == 2 ? SP_PREP(2) : ch == 4 ? SP_PREP(4) : SP_PREP(8));
#undef SP_PREP
    GPU_CHECK(nstf_gpu_launch(sparse_select_kernel, dim3((unsigned)n_kv_heads), dim3(SP_SEL_THREADS), 0, s, pdl, sel,
                              work, cnt, pos, block, topk, window, nb_max, ms));
    float *part = work + 2 * n_kv_heads * nb_max;
    const bool vec = head_dim % 8 == 0 && ((uintptr_t)k_cache | (uintptr_t)v_cache) % 16 == 0;
    const dim3 ag((unsigned)ms, (unsigned)n_kv_heads);
    if (vec)
        GPU_CHECK(nstf_gpu_launch(sparse_attend_kernel<true>, ag, dim3(SP_THREADS), 0, s, pdl, q, k_cache, v_cache,
                                  sel, part, out, mass, mass_decay, cnt, pos, n_heads, n_kv_heads, head_dim, block,
                                  topk, window, scale, ms));
    else
        GPU_CHECK(nstf_gpu_launch(sparse_attend_kernel<false>, ag, dim3(SP_THREADS), 0, s, pdl, q, k_cache, v_cache,
                                  sel, part, out, mass, mass_decay, cnt, pos, n_heads, n_kv_heads, head_dim, block,
                                  topk, window, scale, ms));
    return NSTF_OK;
}
