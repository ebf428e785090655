/* attn_sparse.cu — sparse decode attention (ATTN_SPARSE, ops.h): Quest
 * block statistics and a block-sparse split-KV flash decode.
 *
 * Kernels on the stream, in order (one-token step):
 *  1. the KV write (kv_write.cu) of the token's k, v rows;
 *  2. sparse_stats: one workgroup per (touched block, kv head) recomputes
 *     the block's per-channel key min / max from its cached rows up to the
 *     last written position (fp32 of the bf16 keys: exact), and zeroes the
 *     attention mass of a block whose first row was written;
 *  3. sparse_select: one workgroup per kv head scores the candidate blocks
 *     (1 .. first window block - 1) by the Quest bound (max over the kv
 *     head's query heads of sum_c max(q_c min_c, q_c max_c), fp32), marks the
 *     topk by rank (a block's rank counts the blocks with a larger bound, or
 *     an equal one and a lower index: the CPU's order), and writes block 0,
 *     the marked blocks and the window's blocks ascending into sel through a
 *     workgroup prefix sum; -1 after them;
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
 * bounds and the marks [n_kv, nb], then the partials [n_heads, max_sel,
 * head_dim + 2]. */
#include "gpu.h"

#define SP_THREADS 128
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

__global__ void __launch_bounds__(SP_THREADS)
    sparse_select_kernel(const uint16_t *__restrict__ q, const float *__restrict__ kmin,
                         const float *__restrict__ kmax, int32_t *__restrict__ sel, float *__restrict__ work,
                         const int32_t *__restrict__ pos, int n_heads, int n_kv, int head_dim, int block, int topk,
                         int window, int64_t nb_max, int64_t ms) {
    __shared__ float qs[SP_MAX_QD];
    __shared__ int scan[SP_THREADS];
    const int g = blockIdx.x, group = n_heads / n_kv, tid = threadIdx.x;
    const int64_t kvd = (int64_t)n_kv * head_dim, n_keys = (int64_t)pos[0] + 1, nb = (n_keys + block - 1) / block,
                  w = window > 1 ? window : 1, wb0 = (n_keys > w ? n_keys - w : 0) / block;
    float *u = work + g * nb_max;
    int32_t *mark = (int32_t *)(work + n_kv * nb_max) + g * nb_max;
    int32_t *sg = sel + g * ms;
    for (int i = tid; i < group * head_dim; i += SP_THREADS) qs[i] = sp_bf16(q + (int64_t)g * group * head_dim + i);
    __syncthreads();
    for (int64_t b = 1 + tid; b < wb0; b += SP_THREADS) {
        const float *mn = kmin + b * kvd + (int64_t)g * head_dim, *mx = kmax + b * kvd + (int64_t)g * head_dim;
        float best = -INFINITY;
        for (int h = 0; h < group; h++) {
            float s = 0.0f;
            for (int c = 0; c < head_dim; c++) {
                const float qc = qs[h * head_dim + c];
                s += fmaxf(qc * mn[c], qc * mx[c]);
            }
            best = fmaxf(best, s);
        }
        u[b] = best;
    }
    __syncthreads();
    for (int64_t b = 1 + tid; b < wb0; b += SP_THREADS) {
        const float ub = u[b];
        int64_t rank = 0;
        for (int64_t r = 1; r < wb0 && rank < topk; r++) rank += r != b && (u[r] > ub || (u[r] == ub && r < b));
        mark[b] = rank < topk;
    }
    __syncthreads();
    /* ascending compaction of the marks: a workgroup prefix sum per chunk */
    int64_t n_sel = wb0 > 0 ? 1 : 0;
    if (tid == 0 && wb0 > 0) sg[0] = 0;
    for (int64_t base = 1; base < wb0; base += SP_THREADS) {
        const int64_t b = base + tid;
        const int f = b < wb0 ? mark[b] : 0;
        scan[tid] = f;
        __syncthreads();
        for (int o = 1; o < SP_THREADS; o *= 2) {
            const int add = tid >= o ? scan[tid - o] : 0;
            __syncthreads();
            scan[tid] += add;
            __syncthreads();
        }
        if (f) sg[n_sel + scan[tid] - 1] = (int32_t)b;
        const int total = scan[SP_THREADS - 1];
        __syncthreads();
        n_sel += total;
    }
    for (int64_t b = wb0 + tid; b < nb; b += SP_THREADS) sg[n_sel + (b - wb0)] = (int32_t)b;
    for (int64_t i = n_sel + (nb - wb0) + tid; i < ms; i += SP_THREADS) sg[i] = -1;
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
    sparse_select_kernel<<<n_kv_heads, SP_THREADS, 0, s>>>(q, kmin, kmax, sel, work, pos, n_heads, n_kv_heads,
                                                            head_dim, block, topk, window, nb_max, ms);
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
