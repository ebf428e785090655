/* flash_decode.cu — split-KV flash decoding for n_tok = 1 (and small n_tok),
 * with the KV-cache write fused.
 *
 * The query rows of one kv head — n_tok tokens x its group of G query heads,
 * row R = token R / G, head hkv * G + R % G, at most 16 — form one 16-row mma
 * tile, so K and V are read once per kv head, not once per query head. The
 * context [0, pos0 + n_tok) is cut into S splits of `chunk` keys (a multiple
 * of the key tile FD_BKV); each wave of a 4-wave block runs the flash_common.h
 * loop over its own split into its own shared-memory tile and writes a
 * partial (m, l, unnormalized acc) for the valid rows. A second kernel
 * merges the S partials of each row: out = sum_s 2^(m_s - M) acc_s /
 * sum_s 2^(m_s - M) l_s. S is chosen from the context length and the SM
 * count so that about 3 blocks per SM are in flight; up to
 * FD_ONE_BLOCK_KEYS keys one block per kv head has the S = FD_NW splits
 * and its waves merge them in shared memory, in the same order, with no
 * partials in global memory and no second kernel. The merge stages the
 * S (m, l) pairs and the weights 2^(m_s - M) in shared memory and unrolls
 * its loop over the splits, so the loads of acc_s are in flight together:
 * a plain loop over S pays one L2 latency per split (~10 us per layer at
 * S = 32). With a sliding window the splits start at the first token's
 * window (rounded down to a key tile), read on the device with the
 * position, so a captured step stays valid. */
#include "flash_common.h"
#include "core/switches.h"

#include <stdlib.h>

#define FD_NW 4
/* Keys per tile. AMD: 16, so that head_dim 128 fits the 64 KiB a workgroup
 * may have (4 waves x K and V x 32 keys x 136 x 2 bytes alone are 68 KiB)
 * and the RDNA3 register file holds the state without spilling. */
#if defined(NSTF_GPU_HIP)
#define FD_BKV 16
#else
#define FD_BKV 32
#endif

template <int HD> static constexpr size_t fd_smem_bytes() {
    return ((size_t)16 * (HD + 8) + (size_t)FD_NW * 2 * FD_BKV * (HD + 8) + (size_t)FD_NW * 16 * NSTF_MMA_SCRATCH_LD) *
           sizeof(u16);
}

/* The in-block merge keeps (m, l, acc) of 16 rows per wave where the K/V
 * tiles were. */
static_assert((size_t)FD_NW * 16 * (2 + 64) * sizeof(float) <= (size_t)FD_NW * 2 * FD_BKV * (64 + 8) * sizeof(u16) &&
                  (size_t)FD_NW * 16 * (2 + 128) * sizeof(float) <= (size_t)FD_NW * 2 * FD_BKV * (128 + 8) * sizeof(u16),
              "the merge's partials must fit the K/V tiles' shared memory");

template <int HD>
__global__ void __launch_bounds__(FD_NW *NSTF_WAVE)
    flash_decode_kernel(const u16 *__restrict__ q, int64_t q_stride, const u16 *__restrict__ kn, int64_t k_stride,
                        const u16 *__restrict__ vn, int64_t v_stride, u16 *kc, u16 *vc, int64_t n_tok, int64_t pos0,
                        int n_heads, int n_kv, float scale_log2, int64_t chunk, float *part_ml, float *part_acc,
                        const int32_t *__restrict__ pos_dev, int early, int window, u16 *out, int64_t out_stride) {
    /* the position comes from the host (copied before the launch), and the
     * cache rows below it are constant during this step: the first tile's
     * cache rows are loaded before waiting for the previous kernel (PDL) */
    if (pos_dev) pos0 = *pos_dev;
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) u16 smem[];
    u16 *sq = smem;
    u16 *skv = sq + 16 * LD; /* per wave: K [BKV][LD], V [BKV][LD] */
    u16 *scratch = skv + FD_NW * 2 * FD_BKV * LD;

    const int tid = threadIdx.x, nt = FD_NW * NSTF_WAVE, wave = tid / NSTF_WAVE, lane = tid % NSTF_WAVE;
    const int hkv = blockIdx.y, group = n_heads / n_kv;
    const int rows = (int)n_tok * group;
    const int n_split = gridDim.x * FD_NW, split = blockIdx.x * FD_NW + wave;
    const int64_t kv_total = pos0 + n_tok;
    const int64_t lo = window > 0 && pos0 + 1 > window ? (pos0 + 1 - window) / FD_BKV * FD_BKV : 0;
    const int64_t s0 = lo + (int64_t)split * chunk;
    const int64_t s1 = s0 + chunk < kv_total ? s0 + chunk : kv_total;
    u16 *sk = skv + wave * 2 * FD_BKV * LD, *sv = sk + FD_BKV * LD;
    if (early)
        flash_load_kv<HD, FD_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, s0, s1, pos0, n_kv, hkv, lane,
                                  NSTF_WAVE, 0);
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();

    if (blockIdx.x == 0) flash_write_cache<HD>(kc, vc, kn, k_stride, vn, v_stride, 0, n_tok, pos0, n_kv, hkv, tid, nt);

    for (int c = tid; c < 16 * (HD / 8); c += nt) {
        int row = c / (HD / 8), ch = c % (HD / 8);
        bool valid = row < rows;
        int64_t off = valid ? (row / group) * q_stride + (int64_t)(hkv * group + row % group) * HD + ch * 8 : 0;
        nstf_cp16(sq + row * LD + ch * 8, q + off, valid);
    }
    nstf_cp_commit();
    nstf_cp_wait<0>();
    __syncthreads();

    flash_state<HD> st;
    flash_state_init<HD>(st, sq, LD);
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        int row = nstf_mma_slot_row(r);
        st.qpos[r] = pos0 + (row < rows ? row / group : n_tok - 1);
    }

    u16 *wscratch = scratch + wave * 16 * NSTF_MMA_SCRATCH_LD;
    for (int64_t kv0 = s0; kv0 < s0 + chunk; kv0 += FD_BKV) { /* same trip count in every wave */
        flash_load_kv<HD, FD_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, kv0, s1, pos0, n_kv, hkv, lane,
                                  NSTF_WAVE, early && kv0 == s0 ? 1 : -1);
        nstf_cp_commit();
        nstf_cp_wait<0>();
        __syncthreads();
        if (kv0 < s1) flash_tile<HD, FD_BKV>(st, sk, sv, LD, kv0, s1, scale_log2, true, window, wscratch);
        __syncthreads();
    }
    flash_finish_l<HD>(st);

    if (gridDim.x == 1) { /* one block per kv head: its FD_NW splits merge here */
        __syncthreads(); /* every wave is done with its K/V tiles */
        float *pm = (float *)skv;              /* [FD_NW][16][2]: m, l */
        float *pa = pm + FD_NW * 16 * 2;       /* [FD_NW][16][HD] */
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
        /* flash_decode_merge's arithmetic (wave_algo.h) over the FD_NW splits */
        for (int i = tid; i < rows * HD; i += nt) {
            const int row = i / HD, d = i % HD;
            float o;
            NSTF_SOFTMAX_MERGE_ROW(o, pm + row * 2, 16 * 2, pa + row * HD + d, 16 * HD, FD_NW, nstf_exp2);
            const int64_t t = row / group;
            const int h = hkv * group + row % group;
            out[t * out_stride + (int64_t)h * HD + d] = nstf_mma_f2bf(o);
        }
        return;
    }

    /* partials: ml [n_kv][S][rows][2], acc [n_kv][S][rows][HD] */
    const int64_t base = ((int64_t)hkv * n_split + split) * rows;
#pragma unroll
    for (int d = 0; d < HD / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            int row = nstf_mma_c_row(e);
            if (row >= rows) continue;
            int col = d * 16 + nstf_mma_c_col(e);
            part_acc[(base + row) * HD + col] = st.o[d].x[e];
            if (col == 0) {
                part_ml[(base + row) * 2 + 0] = st.m[nstf_mma_c_slot(e)];
                part_ml[(base + row) * 2 + 1] = st.l[nstf_mma_c_slot(e)];
            }
        }
}

/* grid (rows, n_kv), HD threads, 2 S floats of shared memory: merges the S
 * partials of one query row, the arithmetic of NSTF_SOFTMAX_MERGE_ROW
 * (wave_algo.h) in the same order: M = max m_s, w_s = 2^(m_s - base(M)),
 * out = (sum_s w_s acc_s) / (sum_s w_s l_s), sums in split order. */
template <int HD>
__global__ void __launch_bounds__(HD)
    flash_decode_merge(const float *__restrict__ part_ml, const float *__restrict__ part_acc, u16 *out,
                       int64_t out_stride, int n_split, int rows, int group) {
    NSTF_PDL_WAIT();
    NSTF_PDL_TRIGGER();
    constexpr int NWV = HD / NSTF_WAVE > 0 ? HD / NSTF_WAVE : 1;
    extern __shared__ float fdm[]; /* [S] m then w_s, [S] l */
    __shared__ float red[NWV];
    float *sw = fdm, *sl = fdm + n_split;
    const int row = blockIdx.x, hkv = blockIdx.y, d = threadIdx.x;
    const int64_t i0 = (int64_t)hkv * n_split * rows + row; /* split s of this row: i0 + s * rows */
    const float *ml = part_ml + i0 * 2;
    float mx = -__builtin_huge_valf();
    for (int s = d; s < n_split; s += HD) {
        const float m = ml[(int64_t)s * rows * 2];
        sw[s] = m;
        sl[s] = ml[(int64_t)s * rows * 2 + 1];
        mx = fmaxf(mx, m);
    }
    mx = wave_reduce_max(mx);
    if (d % NSTF_WAVE == 0) red[d / NSTF_WAVE] = mx;
    __syncthreads();
    mx = red[0];
    for (int i = 1; i < NWV; i++) mx = fmaxf(mx, red[i]);
    const float base = nstf_softmax_base(mx);
    for (int s = d; s < n_split; s += HD) sw[s] = nstf_exp2(sw[s] - base);
    __syncthreads();
    const float *acc = part_acc + i0 * HD + d;
    const int64_t as = (int64_t)rows * HD;
    float num = 0.0f, den = 0.0f;
#pragma unroll 8
    for (int s = 0; s < n_split; s++) {
        const float w = sw[s];
        den = fmaf(w, sl[s], den);
        num = fmaf(w, acc[(int64_t)s * as], num);
    }
    const float o = num / den;
    const int64_t t = row / group;
    const int h = hkv * group + row % group;
    out[t * out_stride + (int64_t)h * HD + d] = nstf_mma_f2bf(o);
}

/* Early cache loads on (the switch NSTF_FD_EARLY=0 turns them off, for measurement). */
static int fd_early(void) { return nstf_switch_int(NSTF_SW_FD_EARLY); }

/* Contexts up to this many keys run one block per kv head, whose waves
 * merge their splits in shared memory: no partials in global memory and
 * no merge kernel (at such lengths the launch and the two dependent global
 * round trips of the merge cost more than the parallelism of more blocks
 * saves; each wave reads at most 2 key tiles). */
#define FD_ONE_BLOCK_KEYS (FD_NW * 2 * FD_BKV)

/* The split plan: chunk keys per split, S splits (a multiple of FD_NW; S ==
 * FD_NW: one block per kv head). */
static void fd_plan(int64_t kv_total, int n_kv, int n_sm, int64_t *chunk, int64_t *n_split) {
    if (kv_total <= FD_ONE_BLOCK_KEYS) {
        *chunk = (kv_total + FD_NW * FD_BKV - 1) / (FD_NW * FD_BKV) * FD_BKV;
        *n_split = FD_NW;
        return;
    }
    int64_t want = ((int64_t)3 * n_sm + n_kv - 1) / n_kv * FD_NW; /* splits per kv head */
    int64_t c = (kv_total + want - 1) / want;
    c = (c + FD_BKV - 1) / FD_BKV * FD_BKV;
    int64_t s = (kv_total + c - 1) / c;
    s = (s + FD_NW - 1) / FD_NW * FD_NW;
    *chunk = c;
    *n_split = s;
}

extern "C" size_t nstf_gpu_flash_decode_scratch_bytes(int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                                      int head_dim) {
    int n_sm = 0, wave = 0;
    if (n_tok <= 0 || pos0 < 0 || n_kv_heads <= 0 || n_heads <= 0 || head_dim <= 0) return 0;
    if (nstf_mma_device(&n_sm, &wave) != NSTF_OK) return 0;
    int64_t chunk = 0, n_split = 0;
    fd_plan(pos0 + n_tok, n_kv_heads, n_sm, &chunk, &n_split);
    int64_t rows = n_tok * (n_heads / n_kv_heads);
    return (size_t)(n_kv_heads * n_split * rows * (head_dim + 2)) * sizeof(float);
}

template <int HD>
static nstf_status flash_decode_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_stride, const u16 *v,
                                       int64_t v_stride, u16 *kc, u16 *vc, u16 *out, int64_t out_stride, int64_t n_tok,
                                       int64_t pos0, int n_heads, int n_kv, float scale, int window, void *scratch,
                                       size_t scratch_bytes, const int32_t *pos_dev, gpuStream_t stream) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    int64_t chunk = 0, n_split = 0;
    fd_plan(pos0 + n_tok, n_kv, n_sm, &chunk, &n_split); /* with pos_dev, pos0 is the bound */
    const int rows = (int)n_tok * (n_heads / n_kv);
    const size_t need = (size_t)(n_kv * n_split * rows * (HD + 2)) * sizeof(float);
    if (!scratch || scratch_bytes < need)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_decode: scratch of %zu bytes, need %zu", scratch_bytes,
                              need);
    if (n_split / FD_NW > 0x7fffffff) return nstf_set_error(NSTF_ERR_RANGE, "flash_decode: context too long");
    if ((size_t)n_split * 2 * sizeof(float) > 48 * 1024)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_decode: %lld splits", (long long)n_split);
    float *part_ml = (float *)scratch;
    float *part_acc = part_ml + (size_t)n_kv * n_split * rows * 2;
    const size_t smem = fd_smem_bytes<HD>();
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        void (*kfn)(const u16 *, int64_t, const u16 *, int64_t, const u16 *, int64_t, u16 *, u16 *, int64_t, int64_t,
                    int, int, float, int64_t, float *, float *, const int32_t *, int, int, u16 *, int64_t) =
            flash_decode_kernel<HD>;
        GPU_CHECK(gpuFuncSetAttribute((const void *)kfn, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        nstf_gpu_device_mark(&attr_set);
    }
    dim3 grid((unsigned)(n_split / FD_NW), (unsigned)n_kv);
    const int pdl = nstf_gpu_pdl();
    GPU_CHECK(nstf_gpu_launch(flash_decode_kernel<HD>, grid, dim3(FD_NW * wave), smem, stream, pdl, q, q_stride, k,
                              k_stride, v, v_stride, kc, vc, n_tok, pos0, n_heads, n_kv,
                              scale * 1.4426950408889634f, chunk, part_ml, part_acc, pos_dev, fd_early(), window,
                              out, out_stride));
    GPU_LAUNCH_CHECK(stream);
    if (n_split == FD_NW) return NSTF_OK; /* merged in the block */
    GPU_CHECK(nstf_gpu_launch(flash_decode_merge<HD>, dim3((unsigned)rows, (unsigned)n_kv), dim3(HD),
                              (size_t)n_split * 2 * sizeof(float), stream, pdl,
                              (const float *)part_ml, (const float *)part_acc, out, out_stride, (int)n_split, rows,
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
        return flash_decode_launch<64>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, n_tok,
                                       pos0, n_heads, n_kv_heads, scale, 0, scratch, scratch_bytes, NULL, s);
    return flash_decode_launch<128>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, n_tok,
                                    pos0, n_heads, n_kv_heads, scale, 0, scratch, scratch_bytes, NULL, s);
}

extern "C" nstf_status nstf_gpu_flash_decode_dpos(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                                  int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                                  uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                                  int64_t out_stride, int64_t n_tok, const int32_t *d_pos0,
                                                  int64_t pos_max, int64_t n_ctx, int n_heads, int n_kv_heads,
                                                  int head_dim, float scale, int window, void *scratch,
                                                  size_t scratch_bytes, void *stream) {
    if (!d_pos0 || window < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_decode_dpos: d_pos0 NULL or window < 0");
    NSTF_TRY(flash_check_args("flash_decode", q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride,
                              n_tok, pos_max, n_ctx, n_heads, n_kv_heads, head_dim));
    if (n_tok * (n_heads / n_kv_heads) > 16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "flash_decode_dpos: %lld tokens x %d query heads per kv head > 16",
                              (long long)n_tok, n_heads / n_kv_heads);
    gpuStream_t s = (gpuStream_t)stream;
    if (head_dim == 64)
        return flash_decode_launch<64>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, n_tok,
                                       pos_max, n_heads, n_kv_heads, scale, window, scratch, scratch_bytes, d_pos0, s);
    return flash_decode_launch<128>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, n_tok,
                                    pos_max, n_heads, n_kv_heads, scale, window, scratch, scratch_bytes, d_pos0, s);
}
