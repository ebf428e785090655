/* attn_sparse.cu — sparse decode attention (ATTN_SPARSE, ops.h): Quest
 * block statistics and a block-sparse split-KV flash decode.
 *
 * Kernels on the stream, in order (one-token step):
 *  1. the KV write (kv_write.cu) of the token's k, v rows;
 *  2. sparse_stats: one workgroup per (touched block, kv head) recomputes
 *     the block's per-channel key min / max from its cached rows up to the
 *     last written position (fp32 of the bf16 keys: exact), and zeroes the
 *     attention mass of a block whose first row was written;
 *  3. sparse_bound: one wave per candidate block (1 .. first window block
 *     - 1) and kv head scores it by the Quest bound (max over the kv head's
 *     query heads of sum_c max(q_c min_c, q_c max_c), fp32), spread over
 *     the GPU; sparse_select: one workgroup per kv head takes the top k by
 *     a radix select (a block's rank counts the blocks with a larger bound,
 *     or an equal one and a lower index: the CPU's order), and writes block
 *     0, the chosen blocks and the window's blocks ascending into sel
 *     through workgroup prefix sums; -1 after them;
 *  4. sparse_attend: the split-KV part: one workgroup per (selected block,
 *     kv head) scores the block's keys for every query head of the group
 *     (fp32 dot products from the bf16 cache), and leaves the block's
 *     partial softmax (max m, sum l, unnormalised acc) per head;
 *  5. sparse_merge: one workgroup per kv head merges the partials of each
 *     query head into the output (bf16) and updates the attention mass
 *     (decay every block of the sequence, add (1 - d) p_b, p_b the block's
 *     probability averaged over the group).
 * Every position-dependent quantity is read from the device position, so a
 * captured step replays at any position: grids are sized by the host bound
 * (max_sel workgroups, a -1 entry costs an early exit). For a run of
 * several tokens (prefill, which attends densely through flash attention
 * before this is called) only kernel 2 runs.
 *
 * Correctness first: no matrix units (a block is at most 64 keys, scored by
 * independent threads, probabilities fp32), K and V read once per kv head
 * per selected block. Work floats: nstf_sparse_work_floats(1, ...): the
 * bounds [n_kv, nb], an [n_kv, nb] area the GPU leaves unused (the size
 * is shared with the CPU path), then the partials [n_heads, max_sel,
 * head_dim + 2]. */
#include "gpu.h"

#define SP_THREADS 128
#define SP_SEL_THREADS 256 /* the selection's workgroup */
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

/* 3a. The Quest bound of every candidate block (1 .. first window block -
 * 1) of one kv head: one wave per block, lanes over the channels (the
 * block's min / max rows read once, coalesced), a wave sum per query head,
 * the maximum over the group. Grid (chunks, kv heads), a block stride
 * loop, so the grid is sized by the host and the positions read here. */
#define SP_CH (256 / NSTF_WAVE) /* channels per lane: head_dim <= 256 */
__global__ void __launch_bounds__(SP_THREADS)
    sparse_bound_kernel(const uint16_t *__restrict__ q, const float *__restrict__ kmin,
                        const float *__restrict__ kmax, float *__restrict__ work, const int32_t *__restrict__ pos,
                        int n_heads, int n_kv, int head_dim, int block, int window, int64_t nb_max) {
    __shared__ float qs[SP_MAX_QD];
    const int g = blockIdx.y, group = n_heads / n_kv, tid = threadIdx.x, lane = tid % NSTF_WAVE;
    const int n_waves = SP_THREADS / NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int64_t kvd = (int64_t)n_kv * head_dim, wb0 = sp_window_block((int64_t)pos[0] + 1, window, block);
    if (wb0 <= 1) return;
    for (int i = tid; i < group * head_dim; i += SP_THREADS) qs[i] = sp_bf16(q + (int64_t)g * group * head_dim + i);
    __syncthreads();
    float *u = work + g * nb_max;
    for (int64_t b = 1 + (int64_t)blockIdx.x * n_waves + wave; b < wb0; b += (int64_t)gridDim.x * n_waves) {
        const float *mn = kmin + b * kvd + (int64_t)g * head_dim, *mx = kmax + b * kvd + (int64_t)g * head_dim;
        float lo[SP_CH], hi[SP_CH];
#pragma unroll
        for (int k = 0; k < SP_CH; k++) {
            const int c = lane + k * NSTF_WAVE;
            lo[k] = c < head_dim ? mn[c] : 0.0f;
            hi[k] = c < head_dim ? mx[c] : 0.0f;
        }
        float best = -INFINITY;
        for (int h = 0; h < group; h++) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < SP_CH; k++) {
                const int c = lane + k * NSTF_WAVE;
                const float qc = c < head_dim ? qs[h * head_dim + c] : 0.0f;
                sum += fmaxf(qc * lo[k], qc * hi[k]);
            }
            best = fmaxf(best, wave_reduce_sum(sum));
        }
        if (lane == 0) u[b] = best;
    }
}

/* A float as an unsigned key of the same order (+0 for -0, so that the two
 * zeros tie as they compare equal). */
static __device__ __forceinline__ uint32_t sp_key(float f) {
    const uint32_t b = __float_as_uint(f == 0.0f ? 0.0f : f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

/* Exclusive prefix sum of one int per thread over the workgroup (Hillis-
 * Steele in shared memory); *total gets the sum. */
static __device__ __forceinline__ int sp_scan_excl(int v, int *scan, int *total) {
    const int tid = threadIdx.x;
    scan[tid] = v;
    __syncthreads();
    for (int o = 1; o < SP_SEL_THREADS; o *= 2) {
        const int add = tid >= o ? scan[tid - o] : 0;
        __syncthreads();
        scan[tid] += add;
        __syncthreads();
    }
    const int incl = scan[tid];
    *total = scan[SP_SEL_THREADS - 1];
    __syncthreads();
    return incl - v;
}

/* 3b. The selection of one kv head (one workgroup): the top-k candidate
 * blocks by bound, ties to the lower block (the CPU's rank order: a block
 * is chosen when fewer than k blocks have a larger bound, or an equal one
 * and a lower index). A radix select over the bounds' order keys (four
 * 8-bit digits, a shared histogram each) finds the k-th largest key T and
 * how many of the blocks at T to take; each thread then owns a run of
 * consecutive candidates, and two workgroup prefix sums (blocks at T
 * before it, chosen blocks before it) place block 0, the chosen blocks and
 * the window's blocks ascending into sel; -1 after them. */
__global__ void __launch_bounds__(SP_SEL_THREADS)
    sparse_select_kernel(int32_t *__restrict__ sel, const float *__restrict__ work, const int32_t *__restrict__ pos,
                         int n_kv, int block, int topk, int window, int64_t nb_max, int64_t ms) {
    __shared__ unsigned hist[256];
    __shared__ int scan[SP_SEL_THREADS];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    const int g = blockIdx.x, tid = threadIdx.x;
    const int64_t n_keys = (int64_t)pos[0] + 1, nb = (n_keys + block - 1) / block,
                  wb0 = sp_window_block(n_keys, window, block);
    const float *u = work + g * nb_max;
    int32_t *sg = sel + g * ms;
    const int64_t n_cand = wb0 > 1 ? wb0 - 1 : 0;
    /* this thread's run of candidates: [lo, hi) within 1 .. wb0 - 1 */
    const int64_t per = (n_cand + SP_SEL_THREADS - 1) / SP_SEL_THREADS;
    const int64_t lo = 1 + tid * per < 1 + n_cand ? 1 + tid * per : 1 + n_cand;
    const int64_t hi = lo + per < 1 + n_cand ? lo + per : 1 + n_cand;
    const bool all = n_cand <= topk;
    if (tid == 0) {
        s_prefix = 0;
        s_need = topk;
    }
    __syncthreads();
    for (int shift = 24; !all && shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += SP_SEL_THREADS) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix, mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int64_t b = lo; b < hi; b++) {
            const uint32_t k = sp_key(u[b]);
            if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) { /* the digit holding the need-th largest key */
            int need = s_need, d = 255;
            for (; d > 0 && (int)hist[d] < need; d--) need -= (int)hist[d];
            s_prefix = prefix | ((uint32_t)d << shift);
            s_need = need;
        }
        __syncthreads();
    }
    const uint32_t thr = s_prefix;
    const int need = s_need; /* blocks with key == thr to take, the lowest first */
    int n_eq = 0;
    for (int64_t b = lo; !all && b < hi; b++) n_eq += sp_key(u[b]) == thr;
    int tot = 0;
    const int eq_before = sp_scan_excl(n_eq, scan, &tot);
    int n_mine = 0;
    for (int64_t b = lo, e = eq_before; b < hi; b++) {
        const uint32_t k = all ? 0u : sp_key(u[b]);
        const bool eq = !all && k == thr;
        n_mine += all || k > thr || (eq && e < need);
        e += eq;
    }
    const int head = wb0 > 0 ? 1 : 0; /* block 0, the attention sink */
    const int before = sp_scan_excl(n_mine, scan, &tot);
    if (tid == 0 && head) sg[0] = 0;
    for (int64_t b = lo, e = eq_before, at = head + before; b < hi; b++) {
        const uint32_t k = all ? 0u : sp_key(u[b]);
        const bool eq = !all && k == thr;
        if (all || k > thr || (eq && e < need)) sg[at++] = (int32_t)b;
        e += eq;
    }
    const int64_t n_sel = head + tot;
    for (int64_t b = wb0 + tid; b < nb; b += SP_SEL_THREADS) sg[n_sel + (b - wb0)] = (int32_t)b;
    for (int64_t i = n_sel + (nb - wb0) + tid; i < ms; i += SP_SEL_THREADS) sg[i] = -1;
}

__global__ void __launch_bounds__(SP_THREADS)
    sparse_attend_kernel(const uint16_t *__restrict__ q, const uint16_t *__restrict__ kc,
                         const uint16_t *__restrict__ vc, const int32_t *__restrict__ sel, float *__restrict__ part,
                         const int32_t *__restrict__ pos, int n_heads, int n_kv, int head_dim, int block, float scale,
                         int64_t ms) {
    __shared__ float qs[SP_MAX_QD];
    __shared__ float sc[SP_MAX_G * NSTF_SPARSE_BLOCK_MAX];
    __shared__ float ml[SP_MAX_G * 2];
    const int i = blockIdx.x, g = blockIdx.y, group = n_heads / n_kv, tid = threadIdx.x;
    const int32_t b = sel[(int64_t)g * ms + i];
    if (b < 0) return;
    const int64_t kvd = (int64_t)n_kv * head_dim, n_keys = (int64_t)pos[0] + 1, j0 = (int64_t)b * block,
                  nk = j0 + block < n_keys ? block : n_keys - j0;
    for (int t = tid; t < group * head_dim; t += SP_THREADS) qs[t] = sp_bf16(q + (int64_t)g * group * head_dim + t);
    __syncthreads();
    for (int t = tid; t < group * nk; t += SP_THREADS) {
        const int h = t / (int)nk, j = t % (int)nk;
        const uint16_t *kr = kc + (j0 + j) * kvd + (int64_t)g * head_dim;
        float s = 0.0f;
        for (int c = 0; c < head_dim; c++) s += qs[h * head_dim + c] * sp_bf16(kr + c);
        sc[h * NSTF_SPARSE_BLOCK_MAX + j] = s * scale;
    }
    __syncthreads();
    if (tid < group) {
        float *s = sc + tid * NSTF_SPARSE_BLOCK_MAX, m = -INFINITY, l = 0.0f;
        for (int j = 0; j < nk; j++) m = fmaxf(m, s[j]);
        for (int j = 0; j < nk; j++) {
            s[j] = expf(s[j] - m);
            l += s[j];
        }
        ml[2 * tid] = m;
        ml[2 * tid + 1] = l;
    }
    __syncthreads();
    for (int t = tid; t < group * head_dim; t += SP_THREADS) {
        const int h = t / head_dim, c = t % head_dim;
        const float *s = sc + h * NSTF_SPARSE_BLOCK_MAX;
        float acc = 0.0f;
        for (int j = 0; j < nk; j++) acc += s[j] * sp_bf16(vc + (j0 + j) * kvd + (int64_t)g * head_dim + c);
        float *dst = part + ((int64_t)(g * group + h) * ms + i) * (head_dim + 2);
        dst[2 + c] = acc;
        if (c == 0) dst[0] = ml[2 * h], dst[1] = ml[2 * h + 1];
    }
}

__global__ void __launch_bounds__(SP_THREADS)
    sparse_merge_kernel(const int32_t *__restrict__ sel, const float *__restrict__ part, uint16_t *__restrict__ out,
                        float *__restrict__ mass, float decay, const int32_t *__restrict__ pos, int n_heads, int n_kv,
                        int head_dim, int block, int64_t ms) {
    __shared__ float hm[SP_MAX_G], hl[SP_MAX_G];
    const int g = blockIdx.x, group = n_heads / n_kv, tid = threadIdx.x;
    const int32_t *sg = sel + (int64_t)g * ms;
    int64_t n_sel = 0;
    while (n_sel < ms && sg[n_sel] >= 0) n_sel++;
    if (tid < group) {
        const float *ph = part + (int64_t)(g * group + tid) * ms * (head_dim + 2);
        float m = -INFINITY, l = 0.0f;
        for (int64_t i = 0; i < n_sel; i++) m = fmaxf(m, ph[i * (head_dim + 2)]);
        for (int64_t i = 0; i < n_sel; i++) l += ph[i * (head_dim + 2) + 1] * expf(ph[i * (head_dim + 2)] - m);
        hm[tid] = m;
        hl[tid] = l;
    }
    __syncthreads();
    for (int t = tid; t < group * head_dim; t += SP_THREADS) {
        const int h = t / head_dim, c = t % head_dim;
        const float *ph = part + (int64_t)(g * group + h) * ms * (head_dim + 2);
        float acc = 0.0f;
        for (int64_t i = 0; i < n_sel; i++) acc += ph[i * (head_dim + 2) + 2 + c] * expf(ph[i * (head_dim + 2)] - hm[h]);
        out[(int64_t)(g * group + h) * head_dim + c] = nstf_float_to_bf16(acc / hl[h]).bits;
    }
    if (!mass) return;
    const int64_t nb = ((int64_t)pos[0] + block) / block;
    for (int64_t b = tid; b < nb; b += SP_THREADS) mass[b * n_kv + g] *= decay;
    __syncthreads();
    for (int64_t i = tid; i < n_sel; i += SP_THREADS) {
        float p = 0.0f;
        for (int h = 0; h < group; h++) {
            const float *e = part + ((int64_t)(g * group + h) * ms + i) * (head_dim + 2);
            p += e[1] * expf(e[0] - hm[h]) / hl[h];
        }
        mass[(int64_t)sg[i] * n_kv + g] += (1.0f - decay) * p / (float)group;
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
    const int64_t kvd = (int64_t)n_kv_heads * head_dim, nb_max = (n_ctx + block - 1) / block;
    const int64_t ms = nstf_sparse_max_sel(topk, block, window);
    if (n_tok == 1) NSTF_TRY(nstf_gpu_kv_write(k, v, k_cache, v_cache, pos, 1, kvd, n_ctx, stream));
    const int64_t touched = (n_tok + block - 1) / block + 1;
    sparse_stats_kernel<<<dim3((unsigned)(touched < NSTF_GPU_MAX_GRID ? touched : NSTF_GPU_MAX_GRID), (unsigned)n_kv_heads),
                          SP_THREADS, 0, s>>>(k_cache, kmin, kmax, mass, pos, n_tok, n_kv_heads, head_dim, block, n_ctx);
    GPU_LAUNCH_CHECK(s);
    if (n_tok > 1) return NSTF_OK;
    if (ms > NSTF_GPU_MAX_GRID)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_attn_sparse: %lld selected blocks per step", (long long)ms);
    const int64_t bound_wgs = (nb_max + SP_THREADS / NSTF_WAVE - 1) / (SP_THREADS / NSTF_WAVE);
    sparse_bound_kernel<<<dim3((unsigned)(bound_wgs < 64 ? bound_wgs : 64), (unsigned)n_kv_heads), SP_THREADS, 0, s>>>(
        q, kmin, kmax, work, pos, n_heads, n_kv_heads, head_dim, block, window, nb_max);
    GPU_LAUNCH_CHECK(s);
    sparse_select_kernel<<<n_kv_heads, SP_SEL_THREADS, 0, s>>>(sel, work, pos, n_kv_heads, block, topk, window,
                                                                nb_max, ms);
    GPU_LAUNCH_CHECK(s);
    float *part = work + 2 * n_kv_heads * nb_max;
    sparse_attend_kernel<<<dim3((unsigned)ms, (unsigned)n_kv_heads), SP_THREADS, 0, s>>>(
        q, k_cache, v_cache, sel, part, pos, n_heads, n_kv_heads, head_dim, block, scale, ms);
    GPU_LAUNCH_CHECK(s);
    sparse_merge_kernel<<<n_kv_heads, SP_THREADS, 0, s>>>(sel, part, out, mass, mass_decay, pos, n_heads, n_kv_heads,
                                                           head_dim, block, ms);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
