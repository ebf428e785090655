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

/* ---- the Q8_0 KV cache -----------------------------------------------------
 * A cache row (one position, every kv head) is kv_rb bytes (a multiple of
 * 16; nstf_kv_row_bytes, ops.h): the n_kv * HD int8 codes, then one fp16
 * scale d per 32 of them (kv head h's block j at scale h * HD / 32 + j),
 * value = d * code. Rows are written by flash_write_cache_q8; the decode
 * kernel stages a tile's codes and scales in shared memory
 * (flash_stage_q8) and widens them to bf16 (d * code rounded once) into
 * the tile flash_tile reads (flash_fill_q8). */

/* 8 codes (a uint2) times d, as 8 bf16 (a uint4). No int-to-float
 * conversions (a quarter-rate instruction): the byte permute builds the
 * float 2^23 + (code + 128) (the code's byte with its top bit flipped in
 * the low mantissa), and subtracting 2^23 + 128 leaves the code exactly;
 * code * d is exact in fp32 (8 x 11 significant bits), rounded once to
 * bf16. */
NSTF_DEV uint4 flash_q8_to_bf16x8(uint2 q, float d) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t src = (i < 2 ? q.x : q.y) ^ 0x80808080u, b = 2 * (i & 1);
        const float lo = __uint_as_float(__byte_perm(src, 0x4B000000u, 0x7540u + b)) - 8388736.0f;
        const float hi = __uint_as_float(__byte_perm(src, 0x4B000000u, 0x7540u + b + 1)) - 8388736.0f;
        w[i] = nstf_mma_pack2(lo * d, hi * d);
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* A staged tile: K codes [BKV][HD], V codes, K scales [BKV][HD / 16
 * bytes], V scales. */
template <int HD, int BKV> static constexpr size_t flash_q8_stage_bytes() {
    return (size_t)2 * BKV * HD + (size_t)2 * BKV * (HD / 16);
}

/* A row of the tile that comes from the Q8_0 cache. */
NSTF_DEV bool flash_q8_cached(int64_t p, int64_t pos0, int64_t kv_end) { return p < pos0 && p < kv_end; }

/* The codes and scales of the cached rows of the tile at kv0 (p < pos0,
 * p < kv_end) into the staging stg, by threads tid of nt: cp.async where
 * it exists (the copies stay in flight under other tiles' math; the caller
 * commits the group), else plain copies. */
template <int HD, int BKV>
NSTF_DEV void flash_stage_q8(uint8_t *stg, const uint8_t *kc, const uint8_t *vc, int64_t kv_rb, int64_t kv0,
                             int64_t kv_end, int64_t pos0, int n_kv, int hkv, int tid, int nt) {
    constexpr int QC = HD / 16, SB = HD / 16; /* code chunks and scale bytes of a row */
    for (int c = tid; c < BKV * QC; c += nt) {
        const int row = c / QC, ch = c % QC;
        const int64_t p = kv0 + row;
        if (!flash_q8_cached(p, pos0, kv_end)) continue;
        const int64_t r = p * kv_rb + (int64_t)hkv * HD + ch * 16;
        nstf_cp16(stg + row * HD + ch * 16, kc + r, true);
        nstf_cp16(stg + BKV * HD + row * HD + ch * 16, vc + r, true);
    }
    for (int row = tid; row < BKV; row += nt) {
        const int64_t p = kv0 + row;
        if (!flash_q8_cached(p, pos0, kv_end)) continue;
        const int64_t r = p * kv_rb + (int64_t)n_kv * HD + (int64_t)hkv * SB;
        nstf_cp_small<SB>(stg + 2 * BKV * HD + row * SB, kc + r);
        nstf_cp_small<SB>(stg + 2 * BKV * HD + BKV * SB + row * SB, vc + r);
    }
}

/* The bf16 tile sk, sv [BKV][ld] at kv0: the staged cached rows widened
 * (after their copies landed and the threads that issued them met these),
 * this call's rows (p >= pos0) read from kn / vn, zeros past kv_end. */
template <int HD, int BKV>
NSTF_DEV void flash_fill_q8(u16 *sk, u16 *sv, int ld, const uint8_t *stg, const u16 *kn, int64_t kn_stride,
                            const u16 *vn, int64_t vn_stride, int64_t kv0, int64_t kv_end, int64_t pos0, int hkv,
                            int tid, int nt) {
    constexpr int CH = HD / 8, SB = HD / 16;
    for (int c = tid; c < BKV * CH; c += nt) {
        const int row = c / CH, ch = c % CH;
        const int64_t p = kv0 + row;
        uint4 k = make_uint4(0, 0, 0, 0), v = k;
        if (flash_q8_cached(p, pos0, kv_end)) {
            const int si = row * SB + (ch / 4) * 2; /* the block of 32: 4 chunks of 8 */
            k = flash_q8_to_bf16x8(*(const uint2 *)(stg + row * HD + ch * 8),
                                   nstf_half_bits_to_float(*(const u16 *)(stg + 2 * BKV * HD + si)));
            v = flash_q8_to_bf16x8(*(const uint2 *)(stg + BKV * HD + row * HD + ch * 8),
                                   nstf_half_bits_to_float(*(const u16 *)(stg + 2 * BKV * HD + BKV * SB + si)));
        } else if (p < kv_end) {
            k = *(const uint4 *)(kn + (p - pos0) * kn_stride + (int64_t)hkv * HD + ch * 8);
            v = *(const uint4 *)(vn + (p - pos0) * vn_stride + (int64_t)hkv * HD + ch * 8);
        }
        *(uint4 *)(sk + row * ld + ch * 8) = k;
        *(uint4 *)(sv + row * ld + ch * 8) = v;
    }
}

/* flash_write_cache into a Q8_0 cache: one thread per block of 32 values
 * of k or v, d = amax / 127 (stored fp16), code = rint(x / d) (x * (1 /
 * d); 0 where amax is 0), as ggml's Q8_0; d at most the largest fp16
 * (values past 127 x 65504 clip), a NaN value code 0. */
template <int HD>
NSTF_DEV void flash_write_cache_q8(uint8_t *kc, uint8_t *vc, int64_t kv_rb, const u16 *kn, int64_t kn_stride,
                                   const u16 *vn, int64_t vn_stride, int64_t t0, int64_t t1, int64_t pos0, int n_kv,
                                   int hkv, int tid, int nt) {
    constexpr int NB = HD / 32;
    for (int64_t c = tid; c < (t1 - t0) * NB * 2; c += nt) {
        const bool is_v = c & 1;
        const int64_t t = t0 + (c >> 1) / NB;
        const int j = (int)((c >> 1) % NB);
        const u16 *src = (is_v ? vn + t * vn_stride : kn + t * kn_stride) + (int64_t)hkv * HD + j * 32;
        uint8_t *row = (is_v ? vc : kc) + (pos0 + t) * kv_rb;
        float x[32], amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint4 u = ((const uint4 *)src)[i];
            const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                x[8 * i + 2 * k] = __uint_as_float(w[k] << 16);
                x[8 * i + 2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
            }
        }
#pragma unroll
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
        const float d = fminf(amax / 127.0f, 65504.0f), id = d != 0.0f ? 1.0f / d : 0.0f; /* finite in fp16 */
        uint32_t q[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            uint32_t v = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                /* clipped to +-127, rounded to nearest even in the low
                 * mantissa bits of y + 1.5 2^23 (no int conversion, no
                 * library call on AMD); NaN 0 */
                const float y = x[4 * i + k] * id;
                const int c8 = y == y ? __float_as_int(fminf(fmaxf(y, -127.0f), 127.0f) + 12582912.0f) - 0x4B400000 : 0;
                v |= ((uint32_t)c8 & 0xffu) << (8 * k);
            }
            q[i] = v;
        }
        uint4 *dst = (uint4 *)(row + (int64_t)hkv * HD + j * 32);
        dst[0] = make_uint4(q[0], q[1], q[2], q[3]);
        dst[1] = make_uint4(q[4], q[5], q[6], q[7]);
        *(u16 *)(row + (int64_t)n_kv * HD + ((int64_t)hkv * NB + j) * 2) = nstf_float_to_half_bits(d);
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

/* kv_rb: 0 (a bf16 cache) or the row bytes of a Q8_0 cache: at least the
 * codes and scales of n_kv heads of hd, a multiple of 16. */
static inline nstf_status flash_check_kv_rb(const char *who, int64_t kv_rb, int n_kv, int hd) {
    const int64_t need = (int64_t)n_kv * hd + (int64_t)n_kv * hd / 16;
    if (kv_rb != 0 && (kv_rb < need || kv_rb % 16 != 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s: Q8_0 cache rows of %lld bytes (need %lld, a multiple of 16)",
                              who, (long long)kv_rb, (long long)need);
    return NSTF_OK;
}

#endif
