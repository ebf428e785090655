/* attn_bwd.cu — the flash-attention backward (FA2 style): causal, GQA,
 * bf16 operands, fp32 accumulation on the matrix units (mma.h). The
 * probabilities are recomputed from the forward's saved log-sum-exp, so no
 * score matrix exists; no atomics, so the result is deterministic.
 *
 *   D_t   = dO_t . O_t                                   (attn_bwd_dot_kernel)
 *   P_tj  = 2^(scale log2(e) q_t.k_j - lse_t log2(e))
 *   dS_tj = P_tj (dO_t . v_j - D_t)
 *   dQ_t  = scale sum_j dS_tj k_j                        (attn_bwd_dq_kernel: query tiles)
 *   dK_j  = scale sum_t dS_tj q_t,  dV_j = sum_t P_tj dO_t (attn_bwd_dkv_kernel: key tiles,
 *                                                          every query head of the group)
 *
 * A batch of S sequences (one after another in every operand, each
 * attending to its own keys) is one launch: the grid's y holds sequence
 * and head. dq kernel: grid (query tiles of 64, heads x S); a block is 4 waves x 16 query
 * rows; Q and dO tiles stay in shared memory, K/V tiles of 32 keys (16 at
 * head_dim 128) are loaded in turn. dkv kernel: grid (key tiles of 64, kv heads); a block is
 * 4 waves x 16 keys (x 2 halves of the head dimension at head_dim 128);
 * K and V stay in shared memory, Q/dO tiles of 32 queries (16 at head_dim
 * 128), with their lse and D, are loaded in turn for each head of the
 * group. Operands are read as fragments from shared memory for every use
 * (no register copies of Q, dO, K or V), which keeps the accumulators in
 * registers without spills on every target. P and dS meet the next product
 * rounded to bf16 (nstf_mma_c_to_a), as in the forward. Rows are padded by
 * 8 elements so ldmatrix rows fall in distinct banks. */
#include "core/switches.h"
#include "mma.h"

typedef unsigned short u16;

#define AB_NW 4             /* waves per block */
#define AB_ROWS (AB_NW * 16) /* query rows (dq) / keys (dkv) per block */
/* keys (dq) / queries (dkv) per inner tile: 32, or 16 at head_dim 128, where
 * the dK and dV accumulators alone take 128 registers per lane on NVIDIA */
#define AB_T(HD) ((HD) == 128 ? 16 : 32)
/* dkv blocks per key tile along the head dimension: at head_dim 128 each
 * block accumulates half of dK and dV (grid z = 2), which keeps RDNA3's
 * 8-register C tiles under its register file; S^T and dP^T are computed
 * over the whole head by both halves */
#define AB_DSPLIT(HD) ((HD) == 128 ? 2 : 1)
#define AB_LOG2E 1.4426950408889634f

/* One tile of `rows` token rows (row stride `stride`, head offset col0)
 * into s [rows][ld]; rows at or past `valid` are zeros. */
template <int HD>
static __device__ __forceinline__ void ab_load_rows(u16 *s, int ld, const u16 *g, int64_t stride, int64_t col0,
                                                    int64_t r0, int rows, int64_t valid, int tid, int nt) {
    constexpr int CH = HD / 8;
    for (int c = tid; c < rows * CH; c += nt) {
        const int row = c / CH, ch = c % CH;
        const int64_t r = r0 + row;
        const bool ok = r < valid;
        nstf_cp16(s + row * ld + ch * 8, g + (ok ? r * stride + col0 + ch * 8 : 0), ok);
    }
}

template <int HD> static constexpr size_t ab_smem_bytes() {
    /* two tiles of AB_ROWS rows, two of AB_T rows, per-row lse and D of the
     * inner tile, the waves' C -> A scratch */
    return (size_t)2 * (AB_ROWS + AB_T(HD)) * (HD + 8) * sizeof(u16) + (size_t)2 * AB_T(HD) * sizeof(float) +
           (size_t)AB_NW * 16 * NSTF_MMA_SCRATCH_LD * sizeof(u16);
}

/* D[t, h] = dO[t, h, :] . O[t, h, :] in fp32 */
__global__ void __launch_bounds__(256)
    attn_bwd_dot_kernel(const u16 *__restrict__ out, int64_t o_stride, const u16 *__restrict__ dout,
                        int64_t do_stride, float *__restrict__ D, int64_t n_tok, int n_heads, int hd) {
    const int64_t n = n_tok * n_heads, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += step) {
        const int64_t t = r / n_heads;
        const int h = (int)(r % n_heads);
        const u16 *o = out + t * o_stride + (int64_t)h * hd, *g = dout + t * do_stride + (int64_t)h * hd;
        float s = 0.0f;
        for (int d = 0; d < hd; d++) s = fmaf(nstf_mma_bf2f(o[d]), nstf_mma_bf2f(g[d]), s);
        D[r] = s;
    }
}

template <int HD>
__global__ void __launch_bounds__(AB_NW *NSTF_WAVE)
    attn_bwd_dq_kernel(const u16 *__restrict__ q, int64_t q_stride, const u16 *__restrict__ k, int64_t k_stride,
                       const u16 *__restrict__ v, int64_t v_stride, const u16 *__restrict__ dout, int64_t do_stride,
                       const float *__restrict__ lse, const float *__restrict__ D, u16 *__restrict__ dq,
                       int64_t dq_stride, int64_t n_tok, int64_t pos0, int n_heads, int n_kv, float scale_log2,
                       float scale) {
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) u16 smem[];
    u16 *sq = smem;                    /* [AB_ROWS][LD] */
    u16 *sdo = sq + AB_ROWS * LD;      /* [AB_ROWS][LD] */
    u16 *sk = sdo + AB_ROWS * LD;      /* [AB_T(HD)][LD] */
    u16 *sv = sk + AB_T(HD) * LD;          /* [AB_T(HD)][LD] */
    u16 *scratch = sv + AB_T(HD) * LD + 4 * AB_T(HD); /* past the (unused here) lse/D area */

    const int tid = threadIdx.x, nt = AB_NW * NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int64_t n_qt = (n_tok + AB_ROWS - 1) / AB_ROWS;
    const int64_t t0 = (n_qt - 1 - blockIdx.x) * AB_ROWS; /* late (heavy) tiles first */
    const int64_t t1 = t0 + AB_ROWS < n_tok ? t0 + AB_ROWS : n_tok;
    const int h = (int)(blockIdx.y % n_heads), hkv = h / (n_heads / n_kv);
    u16 *scr = scratch + wave * 16 * NSTF_MMA_SCRATCH_LD;
    { /* sequence blockIdx.y / n_heads of a batch: its own rows (pos0 is 0 then) */
        const int64_t sq = blockIdx.y / n_heads, nk = pos0 + n_tok;
        q += sq * n_tok * q_stride, dout += sq * n_tok * do_stride, dq += sq * n_tok * dq_stride;
        k += sq * nk * k_stride, v += sq * nk * v_stride;
        lse += sq * n_tok * n_heads, D += sq * n_tok * n_heads;
    }

    ab_load_rows<HD>(sq, LD, q, q_stride, (int64_t)h * HD, t0, AB_ROWS, n_tok, tid, nt);
    ab_load_rows<HD>(sdo, LD, dout, do_stride, (int64_t)h * HD, t0, AB_ROWS, n_tok, tid, nt);
    nstf_cp_commit();

    bool valid[NSTF_MMA_C_ROWS];
    float lse2[NSTF_MMA_C_ROWS], dd[NSTF_MMA_C_ROWS];
    int64_t qpos[NSTF_MMA_C_ROWS];
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        const int64_t t = t0 + wave * 16 + nstf_mma_slot_row(r);
        valid[r] = t < n_tok;
        lse2[r] = valid[r] ? lse[t * n_heads + h] * AB_LOG2E : 0.0f;
        dd[r] = valid[r] ? D[t * n_heads + h] : 0.0f;
        qpos[r] = pos0 + t;
    }
    nstf_mma_c acc[HD / 16];
#pragma unroll
    for (int d = 0; d < HD / 16; d++) nstf_mma_zero(acc[d]);

    const int64_t kv_end = pos0 + t1; /* keys [0, kv_end) */
    for (int64_t kv0 = 0; kv0 < kv_end; kv0 += AB_T(HD)) {
        __syncthreads(); /* the previous tile is no longer read */
        ab_load_rows<HD>(sk, LD, k, k_stride, (int64_t)hkv * HD, kv0, AB_T(HD), kv_end, tid, nt);
        ab_load_rows<HD>(sv, LD, v, v_stride, (int64_t)hkv * HD, kv0, AB_T(HD), kv_end, tid, nt);
        nstf_cp_commit();
        nstf_cp_wait<0>();
        __syncthreads();
        nstf_mma_c s[AB_T(HD) / 16], dp[AB_T(HD) / 16];
#pragma unroll
        for (int j = 0; j < AB_T(HD) / 16; j++) {
            nstf_mma_zero(s[j]);
            nstf_mma_zero(dp[j]);
        }
#pragma unroll 2
        for (int d = 0; d < HD / 16; d++) {
            nstf_mma_a qa, ga;
            nstf_mma_load_a(qa, sq + wave * 16 * LD + d * 16, LD);
            nstf_mma_load_a(ga, sdo + wave * 16 * LD + d * 16, LD);
#pragma unroll
            for (int j = 0; j < AB_T(HD) / 16; j++) {
                nstf_mma_b kb, vb;
                nstf_mma_load_b(kb, sk + j * 16 * LD + d * 16, LD);
                nstf_mma_load_b(vb, sv + j * 16 * LD + d * 16, LD);
                nstf_mma(s[j], qa, kb);  /* S = Q K^T */
                nstf_mma(dp[j], ga, vb); /* dP = dO V^T */
            }
        }
#pragma unroll
        for (int j = 0; j < AB_T(HD) / 16; j++)
#pragma unroll
            for (int e = 0; e < NSTF_MMA_C_N; e++) {
                const int r = nstf_mma_c_slot(e);
                const int64_t key = kv0 + j * 16 + nstf_mma_c_col(e);
                const bool on = valid[r] && key < kv_end && key <= qpos[r];
                const float p = on ? nstf_exp2(s[j].x[e] * scale_log2 - lse2[r]) : 0.0f;
                s[j].x[e] = p * (dp[j].x[e] - dd[r]); /* dS */
            }
#pragma unroll
        for (int j = 0; j < AB_T(HD) / 16; j++) {
            nstf_mma_a da;
            nstf_mma_c_to_a(da, s[j], scr);
#pragma unroll
            for (int d = 0; d < HD / 16; d++) {
                nstf_mma_b kb;
                nstf_mma_load_b_kn(kb, sk + j * 16 * LD + d * 16, LD);
                nstf_mma(acc[d], da, kb); /* dQ += dS K */
            }
        }
    }
#pragma unroll
    for (int d = 0; d < HD / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            const int64_t t = t0 + wave * 16 + nstf_mma_c_row(e);
            if (t >= n_tok) continue;
            dq[t * dq_stride + (int64_t)h * HD + d * 16 + nstf_mma_c_col(e)] = nstf_mma_f2bf(acc[d].x[e] * scale);
        }
}

template <int HD>
__global__ void __launch_bounds__(AB_NW *NSTF_WAVE)
    attn_bwd_dkv_kernel(const u16 *__restrict__ q, int64_t q_stride, const u16 *__restrict__ k, int64_t k_stride,
                        const u16 *__restrict__ v, int64_t v_stride, const u16 *__restrict__ dout, int64_t do_stride,
                        const float *__restrict__ lse, const float *__restrict__ D, u16 *__restrict__ dk,
                        int64_t dk_stride, u16 *__restrict__ dv, int64_t dv_stride, int64_t n_tok, int64_t pos0,
                        int n_heads, int n_kv, float scale_log2, float scale) {
    constexpr int LD = HD + 8;
    extern __shared__ __align__(16) u16 smem[];
    u16 *sk = smem;                       /* [AB_ROWS][LD] */
    u16 *sv = sk + AB_ROWS * LD;          /* [AB_ROWS][LD] */
    u16 *sq = sv + AB_ROWS * LD;          /* [AB_T(HD)][LD] */
    u16 *sdo = sq + AB_T(HD) * LD;            /* [AB_T(HD)][LD] */
    float *slse = (float *)(sdo + AB_T(HD) * LD); /* [AB_T(HD)] lse * log2(e) */
    float *sdd = slse + AB_T(HD);             /* [AB_T(HD)] D */
    u16 *scratch = (u16 *)(sdd + AB_T(HD));

    constexpr int DO = HD / AB_DSPLIT(HD); /* output dims of this block */
    const int tid = threadIdx.x, nt = AB_NW * NSTF_WAVE, wave = tid / NSTF_WAVE;
    const int group = n_heads / n_kv, hkv = (int)(blockIdx.y % n_kv), d0 = (int)blockIdx.z * DO;
    const int64_t n_keys = pos0 + n_tok, j0 = (int64_t)blockIdx.x * AB_ROWS; /* early (heavy) keys first */
    u16 *scr = scratch + wave * 16 * NSTF_MMA_SCRATCH_LD;
    /* sequence blockIdx.y / n_kv of a batch: its first query and key rows
     * (row offsets rather than moved pointers: fewer live registers) */
    const int64_t qr = (int64_t)(blockIdx.y / n_kv) * n_tok, kr = (int64_t)(blockIdx.y / n_kv) * n_keys;

    ab_load_rows<HD>(sk, LD, k, k_stride, (int64_t)hkv * HD, kr + j0, AB_ROWS, kr + n_keys, tid, nt);
    ab_load_rows<HD>(sv, LD, v, v_stride, (int64_t)hkv * HD, kr + j0, AB_ROWS, kr + n_keys, tid, nt);
    nstf_cp_commit();

    nstf_mma_c dka[DO / 16], dva[DO / 16];
#pragma unroll
    for (int d = 0; d < DO / 16; d++) {
        nstf_mma_zero(dka[d]);
        nstf_mma_zero(dva[d]);
    }
    /* the queries that see key j0: positions pos0 + t >= j0 */
    int64_t t_start = j0 > pos0 ? j0 - pos0 : 0;
    t_start -= t_start % AB_T(HD);
    for (int h = hkv * group; h < (hkv + 1) * group; h++) {
        for (int64_t tq0 = t_start; tq0 < n_tok; tq0 += AB_T(HD)) {
            __syncthreads(); /* the previous tile is no longer read */
            ab_load_rows<HD>(sq, LD, q, q_stride, (int64_t)h * HD, qr + tq0, AB_T(HD), qr + n_tok, tid, nt);
            ab_load_rows<HD>(sdo, LD, dout, do_stride, (int64_t)h * HD, qr + tq0, AB_T(HD), qr + n_tok, tid, nt);
            nstf_cp_commit();
            for (int i = tid; i < AB_T(HD); i += nt) {
                const int64_t t = tq0 + i;
                slse[i] = t < n_tok ? lse[(qr + t) * n_heads + h] * AB_LOG2E : 0.0f;
                sdd[i] = t < n_tok ? D[(qr + t) * n_heads + h] : 0.0f;
            }
            nstf_cp_wait<0>();
            __syncthreads();
            nstf_mma_c st[AB_T(HD) / 16], dpt[AB_T(HD) / 16];
#pragma unroll
            for (int j = 0; j < AB_T(HD) / 16; j++) {
                nstf_mma_zero(st[j]);
                nstf_mma_zero(dpt[j]);
            }
#pragma unroll 2
            for (int d = 0; d < HD / 16; d++) {
                nstf_mma_a ka, va;
                nstf_mma_load_a(ka, sk + wave * 16 * LD + d * 16, LD);
                nstf_mma_load_a(va, sv + wave * 16 * LD + d * 16, LD);
#pragma unroll
                for (int j = 0; j < AB_T(HD) / 16; j++) {
                    nstf_mma_b qb, gb;
                    nstf_mma_load_b(qb, sq + j * 16 * LD + d * 16, LD);
                    nstf_mma_load_b(gb, sdo + j * 16 * LD + d * 16, LD);
                    nstf_mma(st[j], ka, qb);  /* S^T = K Q^T */
                    nstf_mma(dpt[j], va, gb); /* dP^T = V dO^T */
                }
            }
#pragma unroll
            for (int j = 0; j < AB_T(HD) / 16; j++)
#pragma unroll
                for (int e = 0; e < NSTF_MMA_C_N; e++) {
                    const int64_t key = j0 + wave * 16 + nstf_mma_c_row(e);
                    const int qi = j * 16 + nstf_mma_c_col(e);
                    const int64_t t = tq0 + qi;
                    const bool on = t < n_tok && key < n_keys && key <= pos0 + t;
                    const float p = on ? nstf_exp2(st[j].x[e] * scale_log2 - slse[qi]) : 0.0f;
                    dpt[j].x[e] = p * (dpt[j].x[e] - sdd[qi]); /* dS^T */
                    st[j].x[e] = p;                            /* P^T */
                }
#pragma unroll
            for (int j = 0; j < AB_T(HD) / 16; j++) {
                nstf_mma_a pa, da;
                nstf_mma_c_to_a(pa, st[j], scr);
                nstf_mma_c_to_a(da, dpt[j], scr);
#pragma unroll
                for (int d = 0; d < DO / 16; d++) {
                    nstf_mma_b gb, qb;
                    nstf_mma_load_b_kn(gb, sdo + j * 16 * LD + d0 + d * 16, LD);
                    nstf_mma_load_b_kn(qb, sq + j * 16 * LD + d0 + d * 16, LD);
                    nstf_mma(dva[d], pa, gb); /* dV += P^T dO */
                    nstf_mma(dka[d], da, qb); /* dK += dS^T Q */
                }
            }
        }
    }
    nstf_cp_wait<0>(); /* a block whose keys no query sees committed K/V only */
#pragma unroll
    for (int d = 0; d < DO / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            const int64_t key = j0 + wave * 16 + nstf_mma_c_row(e);
            if (key >= n_keys) continue;
            const int64_t col = (int64_t)hkv * HD + d0 + d * 16 + nstf_mma_c_col(e);
            dk[(kr + key) * dk_stride + col] = nstf_mma_f2bf(dka[d].x[e] * scale);
            dv[(kr + key) * dv_stride + col] = nstf_mma_f2bf(dva[d].x[e]);
        }
}

/* ---------------------------------------------------------------- host ---- */

template <int HD>
static nstf_status ab_launch(const u16 *q, int64_t q_stride, const u16 *k, int64_t k_stride, const u16 *v,
                             int64_t v_stride, const u16 *out, int64_t o_stride, const u16 *dout, int64_t do_stride,
                             const float *lse, u16 *dq, int64_t dq_stride, u16 *dk, int64_t dk_stride, u16 *dv,
                             int64_t dv_stride, int64_t n_tok, int64_t n_seq, int64_t pos0, int n_heads, int n_kv,
                             float scale, float *D, gpuStream_t s) {
    int n_sm = 0, wave = 0;
    NSTF_TRY(nstf_mma_device(&n_sm, &wave));
    const size_t smem = ab_smem_bytes<HD>();
    static unsigned long long attr_set = 0; /* a bit per device (nstf_gpu_device_done) */
    if (!nstf_gpu_device_done(&attr_set)) {
        GPU_CHECK(gpuFuncSetAttribute((const void *)attn_bwd_dq_kernel<HD>,
                                      gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        GPU_CHECK(gpuFuncSetAttribute((const void *)attn_bwd_dkv_kernel<HD>,
                                      gpuFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        nstf_gpu_device_mark(&attr_set);
    }
    const int64_t rows = n_seq * n_tok * n_heads, dot_blocks = (rows + 255) / 256;
    attn_bwd_dot_kernel<<<(unsigned)(dot_blocks < NSTF_GPU_MAX_GRID ? dot_blocks : NSTF_GPU_MAX_GRID), 256, 0, s>>>(
        out, o_stride, dout, do_stride, D, n_seq * n_tok, n_heads, HD);
    GPU_LAUNCH_CHECK(s);
    const float sl2 = scale * AB_LOG2E;
    const int64_t n_qt = (n_tok + AB_ROWS - 1) / AB_ROWS, n_kt = (pos0 + n_tok + AB_ROWS - 1) / AB_ROWS;
    attn_bwd_dq_kernel<HD><<<dim3((unsigned)n_qt, (unsigned)(n_heads * n_seq)), AB_NW * wave, smem, s>>>(
        q, q_stride, k, k_stride, v, v_stride, dout, do_stride, lse, D, dq, dq_stride, n_tok, pos0, n_heads, n_kv,
        sl2, scale);
    GPU_LAUNCH_CHECK(s);
    attn_bwd_dkv_kernel<HD><<<dim3((unsigned)n_kt, (unsigned)(n_kv * n_seq), AB_DSPLIT(HD)), AB_NW * wave, smem, s>>>(
        q, q_stride, k, k_stride, v, v_stride, dout, do_stride, lse, D, dk, dk_stride, dv, dv_stride, n_tok, pos0,
        n_heads, n_kv, sl2, scale);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

#if defined(NSTF_GPU_CUDA)
#include "attn_bwd_wgmma.h"
#endif

/* D (dO . O) per token and head; the sm_90a kernels also keep the
 * log2-scaled log-sum-exp laid out per head there */
extern "C" size_t nstf_gpu_flash_attn_bwd_scratch_bytes(int64_t n_tok, int n_heads) {
    return 2 * (size_t)n_tok * (size_t)n_heads * sizeof(float);
}

extern "C" nstf_status nstf_gpu_flash_attn_bwd_batch(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                                     int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                                     const uint16_t *out, int64_t o_stride, const uint16_t *dout,
                                                     int64_t do_stride, const float *lse, uint16_t *dq,
                                                     int64_t dq_stride, uint16_t *dk, int64_t dk_stride, uint16_t *dv,
                                                     int64_t dv_stride, int64_t n_tok, int64_t n_seq, int64_t pos0,
                                                     int n_heads, int n_kv_heads, int head_dim, float scale,
                                                     void *scratch, size_t scratch_bytes, void *stream) {
    if (!q || !k || !v || !out || !dout || !lse || !dq || !dk || !dv || !scratch)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: NULL pointer");
    if (head_dim != 64 && head_dim != 128)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "flash_attn_bwd: head_dim %d (supported: 64, 128)", head_dim);
    if (n_seq < 1 || (n_seq > 1 && pos0 != 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: %lld sequences at %lld (a batch starts at 0)",
                              (long long)n_seq, (long long)pos0);
    if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0 || (int64_t)n_heads * n_seq > 65535)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: %d heads, %d kv heads, %lld sequences", n_heads,
                              n_kv_heads, (long long)n_seq);
    if (n_tok <= 0 || pos0 < 0 || (n_tok + AB_ROWS - 1) / AB_ROWS > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_RANGE, "flash_attn_bwd: %lld tokens at %lld", (long long)n_tok,
                              (long long)pos0);
    const int64_t qd = (int64_t)n_heads * head_dim, kvd = (int64_t)n_kv_heads * head_dim;
    if (q_stride < qd || o_stride < qd || do_stride < qd || dq_stride < qd || k_stride < kvd || v_stride < kvd ||
        dk_stride < kvd || dv_stride < kvd ||
        (q_stride | k_stride | v_stride | o_stride | do_stride | dq_stride | dk_stride | dv_stride) % 8 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: token strides too small or not multiples of 8");
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)dout) % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: q, k, v, dout must be 16-byte aligned");
    if (scratch_bytes < nstf_gpu_flash_attn_bwd_scratch_bytes(n_seq * n_tok, n_heads))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "flash_attn_bwd: scratch of %zu bytes is too small",
                              scratch_bytes);
    gpuStream_t s = (gpuStream_t)stream;
    float *D = (float *)scratch;
#if defined(NSTF_GPU_CUDA)
    /* sm_90a: the wgmma kernels (attn_bwd_wgmma.h) unless NSTF_FLASH=mma */
    if (nstf_switch_int(NSTF_SW_FLASH) != 0 && attn_bwd_wgmma_usable() &&
        attn_bwd_wgmma_fits(dq, dk, dv)) {
        if (head_dim == 64)
            return attn_bwd_wgmma_launch<64>(q, q_stride, k, k_stride, v, v_stride, out, o_stride, dout, do_stride,
                                             lse, dq, dq_stride, dk, dk_stride, dv, dv_stride, n_tok, n_seq, pos0,
                                             n_heads, n_kv_heads, scale, D, s);
        return attn_bwd_wgmma_launch<128>(q, q_stride, k, k_stride, v, v_stride, out, o_stride, dout, do_stride, lse,
                                          dq, dq_stride, dk, dk_stride, dv, dv_stride, n_tok, n_seq, pos0, n_heads,
                                          n_kv_heads, scale, D, s);
    }
#endif
    if (head_dim == 64)
        return ab_launch<64>(q, q_stride, k, k_stride, v, v_stride, out, o_stride, dout, do_stride, lse, dq,
                             dq_stride, dk, dk_stride, dv, dv_stride, n_tok, n_seq, pos0, n_heads, n_kv_heads, scale,
                             D, s);
    return ab_launch<128>(q, q_stride, k, k_stride, v, v_stride, out, o_stride, dout, do_stride, lse, dq, dq_stride,
                          dk, dk_stride, dv, dv_stride, n_tok, n_seq, pos0, n_heads, n_kv_heads, scale, D, s);
}

extern "C" nstf_status nstf_gpu_flash_attn_bwd(const uint16_t *q, int64_t q_stride, const uint16_t *k,
                                               int64_t k_stride, const uint16_t *v, int64_t v_stride,
                                               const uint16_t *out, int64_t o_stride, const uint16_t *dout,
                                               int64_t do_stride, const float *lse, uint16_t *dq, int64_t dq_stride,
                                               uint16_t *dk, int64_t dk_stride, uint16_t *dv, int64_t dv_stride,
                                               int64_t n_tok, int64_t pos0, int n_heads, int n_kv_heads,
                                               int head_dim, float scale, void *scratch, size_t scratch_bytes,
                                               void *stream) {
    return nstf_gpu_flash_attn_bwd_batch(q, q_stride, k, k_stride, v, v_stride, out, o_stride, dout, do_stride, lse,
                                         dq, dq_stride, dk, dk_stride, dv, dv_stride, n_tok, 1, pos0, n_heads,
                                         n_kv_heads, head_dim, scale, scratch, scratch_bytes, stream);
}
