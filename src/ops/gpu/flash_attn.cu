/* flash_attn.cu — flash attention for prefill: causal, GQA, online softmax,
 * bf16 Q/K/V/out, fp32 softmax state and accumulators, QK^T and PV on the
 * matrix units through mma.h, with the KV-cache write fused.
 *
 * Grid (query tiles, n_heads); a block is 4 waves x 16 query rows = 64 rows
 * of one head, walking K/V tiles of 64 keys from position 0 up to its last
 * row's position (causal), double-buffered by cp.async on sm_80+ (one buffer
 * on HIP: LDS is 64 KiB). Heavy (late) query tiles are scheduled first. The
 * blocks of the first query head of each kv group also copy their tokens'
 * k, v rows into the cache; all blocks read positions >= pos0 from the new
 * k, v directly, so no block waits for another. Shared-memory rows are padded
 * by 8 elements (16 bytes) so ldmatrix rows fall in distinct banks. With a
 * sliding window a block starts at the tile of its first row's window and
 * masks the tiles its rows' windows begin in.
 *
 * Training (nstf_gpu_flash_attn_lse_batch): the grid's z is the sequence of
 * a batch of independent sequences laid one after another (each block
 * offsets its rows), no cache (kc NULL, pos0 0: every key comes from the
 * new rows), and each row's log-sum-exp is saved for the backward. */
#include "core/switches.h"
#include "flash_common.h"
#if defined(NSTF_GPU_CUDA)
#include "flash_attn_wgmma.h"
#endif

#define FA_NW 4
#define FA_BQ (FA_NW * 16)
/* Keys per tile: 64; 32 on RDNA3 (wave32 WMMA), where the 16 x 64 score
 * tile's registers on top of Q and O fragments spill at head_dim 128. */
#if defined(NSTF_MMA_WMMA)
#define FA_BKV 32
#else
#define FA_BKV 64
#endif
#if defined(NSTF_MMA_NV)
#define FA_STAGES 2
#else
#define FA_STAGES 1
#endif

template <int HD> static constexpr size_t fa_smem_bytes() {
    return ((size_t)FA_BQ * (HD + 8) + (size_t)2 * FA_STAGES * FA_BKV * (HD + 8) + (size_t)FA_NW * 16 * NSTF_MMA_SCRATCH_LD) *
           sizeof(u16);
}

/* WIN: the sliding-window instance. Without it the window is a compile-time
 * 0, so the common instance spends no registers on it (the head-128 one on
 * RDNA3 spills once the window's bounds are live). */
template <int HD, bool WIN>
__global__ void __launch_bounds__(FA_NW *NSTF_WAVE)
    flash_attn_kernel(const u16 *__restrict__ q, int64_t q_stride, const u16 *__restrict__ kn, int64_t k_stride,
                      const u16 *__restrict__ vn, int64_t v_stride, u16 *kc, u16 *vc, u16 *out, int64_t out_stride,
                      float *lse, int64_t n_tok, int64_t pos0, int n_heads, int n_kv, float scale_log2, int window_arg) {
    const int window = WIN ? window_arg : 0;
    constexpr int LD = HD + 8;
    { /* sequence blockIdx.z of a training batch (0 otherwise): its rows */
        const int64_t s = blockIdx.z;
        q += s * n_tok * q_stride;
        kn += s * n_tok * k_stride;
        vn += s * n_tok * v_stride;
        out += s * n_tok * out_stride;
        if (lse) lse += s * n_tok * n_heads;
    }
    extern __shared__ __align__(16) u16 smem[];
    u16 *sq = smem;
    u16 *sk = sq + FA_BQ * LD;                  /* [STAGES][BKV][LD] */
    u16 *sv = sk + FA_STAGES * FA_BKV * LD;     /* [STAGES][BKV][LD] */
    u16 *scratch = sv + FA_STAGES * FA_BKV * LD; /* [NW][16 * SCRATCH_LD] */

    const int tid = threadIdx.x, nt = FA_NW * NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int64_t n_qt = (n_tok + FA_BQ - 1) / FA_BQ;
    const int64_t t0 = (n_qt - 1 - blockIdx.x) * FA_BQ; /* heavy tiles first */
    const int64_t t1 = t0 + FA_BQ < n_tok ? t0 + FA_BQ : n_tok;
    const int h = blockIdx.y, group = n_heads / n_kv, hkv = h / group;

    if (kc && h % group == 0) flash_write_cache<HD>(kc, vc, kn, k_stride, vn, v_stride, t0, t1, pos0, n_kv, hkv, tid, nt);

    /* Q tile: rows past n_tok are zeros */
    for (int c = tid; c < FA_BQ * (HD / 8); c += nt) {
        int row = c / (HD / 8), ch = c % (HD / 8);
        int64_t t = t0 + row;
        bool valid = t < n_tok;
        nstf_cp16(sq + row * LD + ch * 8, q + (valid ? t * q_stride + (int64_t)h * HD + ch * 8 : 0), valid);
    }
    nstf_cp_commit();

    const int64_t kv_end = pos0 + t1; /* keys [0, pos0 + last token + 1) */
    const int64_t n_tiles = (kv_end + FA_BKV - 1) / FA_BKV;
    const int64_t diag = pos0 + t0; /* first key position that any row of the block may mask */
    /* sliding window: tiles wholly before the first row's window are
     * skipped; keys before the last row's window start are masked */
    const int64_t win_lo = window > 0 && pos0 + t0 + 1 > window ? pos0 + t0 + 1 - window : 0;
    const int64_t win_mask = window > 0 ? kv_end - window : -1;
    const int64_t it0 = win_lo / FA_BKV;

    flash_load_kv<HD, FA_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, it0 * FA_BKV, kv_end, pos0, n_kv, hkv,
                              tid, nt);
    nstf_cp_commit();
    nstf_cp_wait<1>();
    __syncthreads();

    flash_state<HD> st;
    flash_state_init<HD>(st, sq + wave * 16 * LD, LD);
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        int64_t t = t0 + wave * 16 + nstf_mma_slot_row(r);
        st.qpos[r] = pos0 + (t < n_tok ? t : n_tok - 1);
    }

    for (int64_t it = it0; it < n_tiles; it++) {
        if (FA_STAGES == 2) {
            if (it + 1 < n_tiles) {
                int s1 = (int)((it + 1 - it0) % FA_STAGES);
                flash_load_kv<HD, FA_BKV>(sk + s1 * FA_BKV * LD, sv + s1 * FA_BKV * LD, LD, kc, vc, kn, k_stride, vn,
                                          v_stride, (it + 1) * FA_BKV, kv_end, pos0, n_kv, hkv, tid, nt);
            }
            nstf_cp_commit();
            nstf_cp_wait<1>();
        } else {
            nstf_cp_wait<0>();
        }
        __syncthreads();
        const int s0 = (int)((it - it0) % FA_STAGES);
        const int64_t kv0 = it * FA_BKV;
        const bool need_mask = kv0 + FA_BKV - 1 > diag || kv0 + FA_BKV > kv_end || kv0 < win_mask;
        flash_tile<HD, FA_BKV>(st, sk + s0 * FA_BKV * LD, sv + s0 * FA_BKV * LD, LD, kv0, kv_end, scale_log2, need_mask,
                               window, scratch + wave * 16 * NSTF_MMA_SCRATCH_LD);
        __syncthreads();
        if (FA_STAGES == 1 && it + 1 < n_tiles) {
            flash_load_kv<HD, FA_BKV>(sk, sv, LD, kc, vc, kn, k_stride, vn, v_stride, (it + 1) * FA_BKV, kv_end, pos0,
                                      n_kv, hkv, tid, nt);
            nstf_cp_commit();
        }
    }

    flash_finish_l<HD>(st);
#pragma unroll
    for (int d = 0; d < HD / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            int64_t t = t0 + wave * 16 + nstf_mma_c_row(e);
            if (t >= n_tok) continue;
            float l = st.l[nstf_mma_c_slot(e)];
            out[t * out_stride + (int64_t)h * HD + d * 16 + nstf_mma_c_col(e)] = nstf_mma_f2bf(st.o[d].x[e] / l);
            /* training: the natural log-sum-exp of the row's scaled scores,
             * once per row (by the lane that holds its column 0) */
            if (lse && d == 0 && nstf_mma_c_col(e) == 0)
                lse[t * n_heads + h] = (st.m[nstf_mma_c_slot(e)] + nstf_fast_log2f(l)) * 0.6931471805599453f;
        }
}

template <int HD>
static nstf_status flash_attn_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_stride, const u16 *v,
                                     int64_t v_stride, u16 *kc, u16 *vc, u16 *out, int64_t out_stride, float *lse,
                                     int64_t n_tok, int64_t n_seq, int64_t pos0, int n_heads, int n_kv, float scale,
                                     int window, gpuStream_t stream) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    const size_t smem = fa_smem_bytes<HD>();
    /* [0] the common instance, [1] the sliding-window one */
    void (*const kfn[2])(const u16 *, int64_t, const u16 *, int64_t, const u16 *, int64_t, u16 *, u16 *, u16 *,
                         int64_t, float *, int64_t, int64_t, int, int, float, int) = {flash_attn_kernel<HD, false>,
                                                                                      flash_attn_kernel<HD, true>};
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        for (int i = 0; i < 2; i++)
            GPU_CHECK(gpuFuncSetAttribute((const void *)kfn[i], gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t n_qt = (n_tok + FA_BQ - 1) / FA_BQ;
    if (n_qt > 0x7fffffff || n_heads > 65535 || n_seq > 65535)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_attn: grid too large");
    dim3 grid((unsigned)n_qt, (unsigned)n_heads, (unsigned)n_seq);
    kfn[window > 0]<<<grid, FA_NW * wave, smem, stream>>>(q, q_stride, k, k_stride, v, v_stride, kc, vc, out, out_stride,
                                                         lse, n_tok, pos0, n_heads, n_kv, scale * 1.4426950408889634f,
                                                         window);
    GPU_LAUNCH_CHECK(stream);
    return NSTF_OK;
}

#if defined(NSTF_GPU_CUDA)
/* The new k, v rows into the cache (the wgmma path's): blockIdx.y 0
 * copies k, 1 v; rows of w 16-byte units, source rows k_ld / v_ld units
 * apart, cache rows packed (a tensor already in place copies onto
 * itself). flash_check_args has asked for the 16-byte alignment and
 * strides in multiples of 8 elements. */
__global__ void __launch_bounds__(256)
    flash_rows_copy_kernel(const uint4 *k, int64_t k_ld, const uint4 *v, int64_t v_ld, uint4 *kc, uint4 *vc,
                           int64_t rows, int64_t w) {
    const uint4 *src = blockIdx.y ? v : k;
    uint4 *dst = blockIdx.y ? vc : kc;
    const int64_t ld = blockIdx.y ? v_ld : k_ld, n = rows * w, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        const int64_t r = i / w, c = i - r * w;
        dst[i] = src[r * ld + c];
    }
}
#endif

/* n_seq > 1 (training): no cache, pos0 0, n_ctx n_tok. */
static nstf_status flash_attn_any(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride,
                                  const uint16_t *v, int64_t v_stride, uint16_t *k_cache, uint16_t *v_cache,
                                  uint16_t *out, int64_t out_stride, float *lse, int64_t n_tok, int64_t n_seq,
                                  int64_t pos0, int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim, float scale,
                                  int window, void *stream) {
    /* without a cache (training) the checks see the new rows in its place:
     * nothing is read from it at pos0 0 */
    const bool cached = k_cache != NULL;
    NSTF_TRY(flash_check_args("flash_attn", q, q_stride, k, k_stride, v, v_stride, cached ? k_cache : k,
                              cached ? v_cache : v, out, out_stride, n_tok, pos0, n_ctx, n_heads, n_kv_heads,
                              head_dim));
    if (window < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn: window %d", window);
    const bool ok = cached ? v_cache != NULL && n_seq == 1 : v_cache == NULL && pos0 == 0 && n_seq >= 1;
    if (!ok)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "flash_attn: %lld sequences at %lld %s a cache: a batch of sequences runs at position "
                              "0 without one",
                              (long long)n_seq, (long long)pos0, cached ? "with" : "without");
    gpuStream_t s = (gpuStream_t)stream;
#if defined(NSTF_GPU_CUDA)
    /* sm_90a: the wgmma kernel (flash_attn_wgmma.h) unless NSTF_FLASH=mma
     * or a prompt longer than its grid holds (flash_check_args has checked
     * what TMA needs of the operands). With a cache, the new rows are
     * copied into it first and every key is read from there. */
    const int64_t kvd = (int64_t)n_kv_heads * head_dim;
    const uint16_t *ks = cached ? k_cache : k, *vs = cached ? v_cache : v;
    const int64_t k_ld = cached ? kvd : k_stride, v_ld = cached ? kvd : v_stride;
    if (nstf_switch_int(NSTF_SW_FLASH) != 0 && flash_wgmma_usable() && n_tok <= FW_MAX_TOK) {
        if (cached && (k != k_cache + pos0 * kvd || v != v_cache + pos0 * kvd || k_stride != kvd ||
                       v_stride != kvd)) { /* rows already in place need no copy */
            /* one kernel for both, not cudaMemcpy2DAsync: k and v lie
             * strided in the fused Q|K|V rows */
            const int64_t vecs = n_tok * (kvd / 8), want = (vecs + 255) / 256;
            const unsigned gx = (unsigned)(want < 4096 ? want : 4096);
            flash_rows_copy_kernel<<<dim3(gx, 2), 256, 0, s>>>((const uint4 *)k, k_stride / 8, (const uint4 *)v,
                                                               v_stride / 8, (uint4 *)(k_cache + pos0 * kvd),
                                                               (uint4 *)(v_cache + pos0 * kvd), n_tok, kvd / 8);
            GPU_LAUNCH_CHECK(s);
        }
        const int64_t kv_rows = cached ? pos0 + n_tok : n_seq * n_tok, kv_seq = cached ? 0 : n_tok;
        if (head_dim == 64)
            return flash_wgmma_launch<64>(q, q_stride, ks, k_ld, vs, v_ld, kv_rows, kv_seq, out, out_stride, lse,
                                          n_tok, n_seq, pos0, n_heads, n_kv_heads, scale, window, s);
        return flash_wgmma_launch<128>(q, q_stride, ks, k_ld, vs, v_ld, kv_rows, kv_seq, out, out_stride, lse, n_tok,
                                       n_seq, pos0, n_heads, n_kv_heads, scale, window, s);
    }
#endif
    if (head_dim == 64)
        return flash_attn_launch<64>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, lse,
                                     n_tok, n_seq, pos0, n_heads, n_kv_heads, scale, window, s);
    return flash_attn_launch<128>(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, lse,
                                  n_tok, n_seq, pos0, n_heads, n_kv_heads, scale, window, s);
}

extern "C" nstf_status nstf_gpu_flash_attn_sw(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                              int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                              uint16_t *k_cache, uint16_t *v_cache, uint16_t *out, int64_t out_stride,
                                              int64_t n_tok, int64_t pos0, int64_t n_ctx, int n_heads, int n_kv_heads,
                                              int head_dim, float scale, int window, void *stream) {
    return flash_attn_any(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, NULL, n_tok, 1,
                          pos0, n_ctx, n_heads, n_kv_heads, head_dim, scale, window, stream);
}

extern "C" nstf_status nstf_gpu_flash_attn(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride,
                                           const uint16_t *v, int64_t v_stride, uint16_t *k_cache, uint16_t *v_cache,
                                           uint16_t *out, int64_t out_stride, int64_t n_tok, int64_t pos0,
                                           int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim, float scale,
                                           void *stream) {
    return flash_attn_any(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, NULL, n_tok, 1,
                          pos0, n_ctx, n_heads, n_kv_heads, head_dim, scale, 0, stream);
}

extern "C" nstf_status nstf_gpu_flash_attn_lse(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                               int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                               uint16_t *k_cache, uint16_t *v_cache, uint16_t *out,
                                               int64_t out_stride, float *lse, int64_t n_tok, int64_t pos0,
                                               int64_t n_ctx, int n_heads, int n_kv_heads, int head_dim,
                                               float scale, void *stream) {
    if (!lse || !k_cache) return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_lse: NULL lse or cache");
    return flash_attn_any(q, q_stride, k, k_stride, v, v_stride, k_cache, v_cache, out, out_stride, lse, n_tok, 1,
                          pos0, n_ctx, n_heads, n_kv_heads, head_dim, scale, 0, stream);
}

extern "C" nstf_status nstf_gpu_flash_attn_lse_batch(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                                     int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                                     uint16_t *out, int64_t out_stride, float *lse, int64_t n_tok,
                                                     int64_t n_seq, int n_heads, int n_kv_heads, int head_dim,
                                                     float scale, void *stream) {
    if (!lse) return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_lse_batch: NULL lse");
    return flash_attn_any(q, q_stride, k, k_stride, v, v_stride, NULL, NULL, out, out_stride, lse, n_tok, n_seq, 0,
                          n_tok, n_heads, n_kv_heads, head_dim, scale, 0, stream);
}
