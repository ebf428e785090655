/* flash_common.h — the device core shared by flash_attn.cu (prefill) and
 * flash_decode.cu (split-KV decode): one wave's 16 query rows against one
 * K/V tile in shared memory, with the online softmax (running row max m,
 * per-lane partial row sum l, fp32 output accumulators o), plus the loaders
 * that read a key/value row either from the KV cache (positions < pos0) or
 * from this call's new k/v (positions >= pos0), so the kernels never read a
 * cache row that this same launch writes.
 *
 * Scores are kept in the log2 domain: x = q.k * scale * log2(e), p = 2^(x - m).
 * A row whose keys are all masked so far keeps m = -inf; it uses 0 as the
 * subtraction base so no inf - inf appears (its p are all 0). */
#ifndef NSTF_FLASH_COMMON_H
#define NSTF_FLASH_COMMON_H

#include "mma.h"

typedef unsigned short u16;

#define FLASH_NEG_INF (-__builtin_huge_valf())

/* RDNA3 (wave32 WMMA): an A fragment is a whole 16-element row per lane (8
 * VGPRs), so Q in registers costs 64 VGPRs at head_dim 128 and the state
 * spills; there Q stays in shared memory (the kernels keep their Q tile
 * there anyway) and is re-read per use. Elsewhere Q lives in registers. */
#if defined(NSTF_MMA_WMMA)
#define FLASH_Q_IN_SMEM 1
#endif

template <int HD> struct flash_state {
#if defined(FLASH_Q_IN_SMEM)
    const u16 *sq;
    int ld;
#else
    nstf_mma_a q[HD / 16];
#endif
    nstf_mma_c o[HD / 16];
    float m[NSTF_MMA_C_ROWS], l[NSTF_MMA_C_ROWS];
    int64_t qpos[NSTF_MMA_C_ROWS]; /* absolute position of each row slot's token */
};

template <int HD> NSTF_DEV void flash_state_init(flash_state<HD> &st, const u16 *sq, int ld) {
#if defined(FLASH_Q_IN_SMEM)
    st.sq = sq;
    st.ld = ld;
#endif
#pragma unroll
    for (int d = 0; d < HD / 16; d++) {
#if !defined(FLASH_Q_IN_SMEM)
        nstf_mma_load_a(st.q[d], sq + d * 16, ld);
#endif
        nstf_mma_zero(st.o[d]);
    }
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        st.m[r] = FLASH_NEG_INF;
        st.l[r] = 0.0f;
    }
}

/* One K/V tile of BKV keys at absolute positions kv0.. (sk, sv: [BKV][ld]).
 * Keys at positions >= kv_end or > the row's qpos are masked, and with a
 * sliding window (window > 0) those at or below qpos - window. */
template <int HD, int BKV>
NSTF_DEV void flash_tile(flash_state<HD> &st, const u16 *sk, const u16 *sv, int ld, int64_t kv0, int64_t kv_end,
                         float scale_log2, bool need_mask, int window, u16 *scratch) {
    nstf_mma_c s[BKV / 16];
#pragma unroll
    for (int j = 0; j < BKV / 16; j++) {
        nstf_mma_zero(s[j]);
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            nstf_mma_b kb;
            nstf_mma_load_b(kb, sk + j * 16 * ld + d * 16, ld);
#if defined(FLASH_Q_IN_SMEM)
            nstf_mma_a qa;
            nstf_mma_load_a(qa, st.sq + d * 16, st.ld);
            nstf_mma(s[j], qa, kb);
#else
            nstf_mma(s[j], st.q[d], kb);
#endif
        }
    }
    float mnew[NSTF_MMA_C_ROWS];
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) mnew[r] = st.m[r];
#pragma unroll
    for (int j = 0; j < BKV / 16; j++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            float x = s[j].x[e] * scale_log2;
            if (need_mask) {
                int64_t key = kv0 + j * 16 + nstf_mma_c_col(e);
                const int64_t qp = st.qpos[nstf_mma_c_slot(e)];
                if (key >= kv_end || key > qp || (window > 0 && key + window <= qp)) x = FLASH_NEG_INF;
            }
            s[j].x[e] = x;
            mnew[nstf_mma_c_slot(e)] = fmaxf(mnew[nstf_mma_c_slot(e)], x);
        }
    float base[NSTF_MMA_C_ROWS], alpha[NSTF_MMA_C_ROWS];
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) {
        mnew[r] = nstf_mma_row_max(mnew[r]);
        base[r] = nstf_softmax_base(mnew[r]);
        alpha[r] = nstf_exp2(st.m[r] - base[r]); /* m = -inf -> 0 */
        st.m[r] = mnew[r];
        st.l[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < BKV / 16; j++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) {
            float p = nstf_exp2(s[j].x[e] - base[nstf_mma_c_slot(e)]);
            st.l[nstf_mma_c_slot(e)] += p;
            s[j].x[e] = p;
        }
#pragma unroll
    for (int d = 0; d < HD / 16; d++)
#pragma unroll
        for (int e = 0; e < NSTF_MMA_C_N; e++) st.o[d].x[e] *= alpha[nstf_mma_c_slot(e)];
#pragma unroll
    for (int kk = 0; kk < BKV / 16; kk++) {
        nstf_mma_a pa;
        nstf_mma_c_to_a(pa, s[kk], scratch);
#pragma unroll
        for (int d = 0; d < HD / 16; d++) {
            nstf_mma_b vb;
            nstf_mma_load_b_kn(vb, sv + kk * 16 * ld + d * 16, ld);
            nstf_mma(st.o[d], pa, vb);
        }
    }
}

/* Finishes the row sums (l was a per-lane partial). */
template <int HD> NSTF_DEV void flash_finish_l(flash_state<HD> &st) {
#pragma unroll
    for (int r = 0; r < NSTF_MMA_C_ROWS; r++) st.l[r] = nstf_mma_row_sum(st.l[r]);
}

/* The source of key/value row at absolute position p for kv head hkv. */
NSTF_DEV const u16 *flash_kv_row(const u16 *cache, const u16 *fresh, int64_t fresh_stride, int64_t p, int64_t pos0,
                                 int n_kv, int hkv, int HD) {
    return p < pos0 ? cache + (p * n_kv + hkv) * HD : fresh + (p - pos0) * fresh_stride + (int64_t)hkv * HD;
}

/* Cooperative load of BKV key rows and value rows (positions kv0..) into
 * sk / sv [BKV][ld] by threads tid of nt; rows at or past kv_end are zeros.
 * part -1: every row; 0: only the cache rows (p < pos0); 1: only the rest
 * (so the cache rows of a tile can be loaded before the kernel waits for
 * the one that writes this call's k, v). */
template <int HD, int BKV>
NSTF_DEV void flash_load_kv(u16 *sk, u16 *sv, int ld, const u16 *kc, const u16 *vc, const u16 *kn, int64_t kn_stride,
                            const u16 *vn, int64_t vn_stride, int64_t kv0, int64_t kv_end, int64_t pos0, int n_kv,
                            int hkv, int tid, int nt, int part = -1) {
    constexpr int CH = HD / 8; /* 16-byte chunks per row */
    for (int c = tid; c < BKV * CH; c += nt) {
        int row = c / CH, ch = c % CH;
        int64_t p = kv0 + row;
        if ((part == 0 && p >= pos0) || (part == 1 && p < pos0)) continue;
        bool valid = p < kv_end;
        int64_t pp = valid ? p : 0;
        const u16 *ks = flash_kv_row(kc, kn, kn_stride, pp, pos0, n_kv, hkv, HD) + ch * 8;
        const u16 *vs = flash_kv_row(vc, vn, vn_stride, pp, pos0, n_kv, hkv, HD) + ch * 8;
        nstf_cp16(sk + row * ld + ch * 8, ks, valid);
        nstf_cp16(sv + row * ld + ch * 8, vs, valid);
    }
}

/* This call's k, v rows for tokens [t0, t1) of kv head hkv into the cache. */
template <int HD>
NSTF_DEV void flash_write_cache(u16 *kc, u16 *vc, const u16 *kn, int64_t kn_stride, const u16 *vn, int64_t vn_stride,
                                int64_t t0, int64_t t1, int64_t pos0, int n_kv, int hkv, int tid, int nt) {
    constexpr int CH = HD / 8;
    for (int64_t c = tid; c < (t1 - t0) * CH; c += nt) {
        int64_t t = t0 + c / CH;
        int ch = (int)(c % CH);
        int64_t dst = ((pos0 + t) * n_kv + hkv) * HD + ch * 8;
        *(uint4 *)(kc + dst) = *(const uint4 *)(kn + t * kn_stride + (int64_t)hkv * HD + ch * 8);
        *(uint4 *)(vc + dst) = *(const uint4 *)(vn + t * vn_stride + (int64_t)hkv * HD + ch * 8);
    }
}

/* Shared argument checks of the two launchers. */
static inline nstf_status flash_check_args(const char *who, const void *q, int64_t q_stride, const void *k,
                                           int64_t k_stride, const void *v, int64_t v_stride, const void *kc,
                                           const void *vc, const void *out, int64_t out_stride, int64_t n_tok,
                                           int64_t pos0, int64_t n_ctx, int n_heads, int n_kv, int hd) {
    if (!q || !k || !v || !kc || !vc || !out) return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: NULL pointer", who);
    if (hd != 64 && hd != 128)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "%s: head_dim %d (supported: 64, 128)", who, hd);
    if (n_heads <= 0 || n_kv <= 0 || n_heads % n_kv != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: n_heads %d not a multiple of n_kv_heads %d", who, n_heads,
                              n_kv);
    if (n_tok <= 0 || pos0 < 0 || n_ctx <= 0 || pos0 > n_ctx - n_tok)
        return nstf_set_error(NSTF_ERR_RANGE, "%s: positions [%lld, %lld) outside the cache of %lld", who,
                              (long long)pos0, (long long)(pos0 + n_tok), (long long)n_ctx);
    if (q_stride < (int64_t)n_heads * hd || k_stride < (int64_t)n_kv * hd || v_stride < (int64_t)n_kv * hd ||
        out_stride < (int64_t)n_heads * hd || (q_stride | k_stride | v_stride | out_stride) % 8 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: token strides too small or not multiples of 8", who);
    if (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)kc | (uintptr_t)vc | (uintptr_t)out) % 16 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: pointers must be 16-byte aligned", who);
    return NSTF_OK;
}

#endif
