/* matmul_k_impl.h — the SIMD kernels of the super-block types, written once
 * and included by matmul_k.c per instruction set with
 *   KFN(name)         the instance's name suffix
 *   KTARGET           its function target attribute (empty for the build's own AVX2)
 *   MADDS(acc, p, s)  acc (8 x int32) += pairwise products of p and s (16 x int16):
 *                     vpmaddwd + vpaddd, or VNNI's vpdpwssd (same result)
 * so AVX2 and AVX-512 compute the same integers in the same order.
 *
 * One weight row against RN <= 4 tokens: per 32 values the row's codes
 * are unpacked once to bytes (unsigned codes; IQ4_XS: signed code-book
 * values through the sign trick) and meet each token's q8k bytes in
 * vpmaddubsw, then MADDS with the sub-block scales as int16 (one scale per
 * 16 lanes' half for the 16-value sub-blocks). Code offsets (Q3_K -4,
 * Q6_K -32) and mins come out of the integer sums through the tokens'
 * bsums. Per super-block the int32 lanes are converted once and scaled by
 * d * d_x. */

/* From 16 int8 scales, the int16 scale vector of one 32-value chunk:
 * 8 lanes of sc[a] then 8 of sc[b] (a == b for the 32-value sub-blocks).
 * One byte shuffle and one widening, no scalar extraction. */
static KTARGET ALWAYS_INLINE __m256i KFN(scales2)(__m128i sc8, int a, int b) {
    const __m128i idx = _mm_setr_epi8((char)a, (char)a, (char)a, (char)a, (char)a, (char)a, (char)a,
                                      (char)a, (char)b, (char)b, (char)b, (char)b, (char)b, (char)b,
                                      (char)b, (char)b);
    return _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc8, idx));
}

static KTARGET ALWAYS_INLINE float KFN(hsum)(__m256 a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static KTARGET ALWAYS_INLINE void KFN(krow)(const nstf_type wt, const int RN, const uint8_t *w,
                                            const nstf_q8k *xq, int64_t t0, float *y,
                                            int64_t ldy) {
    const int64_t nsb = xq->nsb, bb = wt == NSTF_TYPE_Q2_K ? 84 : wt == NSTF_TYPE_Q3_K ? 110
                                          : wt == NSTF_TYPE_Q4_K ? 144 : wt == NSTF_TYPE_Q5_K ? 176
                                          : wt == NSTF_TYPE_Q6_K ? 210 : 136;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < RN; t++) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nsb; b++) {
        const uint8_t *blk = w + b * bb;
        const int8_t *xqs[4];
        const int16_t *xbs[4];
        float dx[4];
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) {
            const int64_t xb = (t0 + t) * nsb + b;
            xqs[t] = xq->q + xb * 256;
            xbs[t] = xq->bsums + xb * 16;
            dx[t] = xq->d[xb];
        }
        __m256i isum[4];
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) isum[t] = _mm256_setzero_si256();
        float d = 0.0f, dmin = 0.0f;
        __m256i mins16 = _mm256_setzero_si256(); /* per-16 mins (types with mins) */

        if (wt == NSTF_TYPE_Q4_K || wt == NSTF_TYPE_Q5_K) {
            const bool five = wt == NSTF_TYPE_Q5_K;
            d = nstf_fp16_to_f32(nstf_load_u16(blk));
            dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 2));
            const __m128i sm = k4_scales_mins(blk + 4); /* sc0..7, m0..7 */
            mins16 = _mm256_cvtepu8_epi16(
                _mm_shuffle_epi8(sm, _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15)));
            const uint8_t *qs = blk + (five ? 48 : 16);
            __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
            const __m256i m10 = _mm256_set1_epi8(0x10);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                __m256i lo = _mm256_and_si256(v, m4);
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if (five) { /* bits 2j, 2j+1 of each qh byte (hb shifted by 2j so far) */
                    lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
                    hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hb, 3), m10));
                    hb = _mm256_srli_epi16(hb, 2);
                }
                const __m256i slo = KFN(scales2)(sm, 2 * j, 2 * j);
                const __m256i shi = KFN(scales2)(sm, 2 * j + 1, 2 * j + 1);
#pragma GCC unroll 4
                for (int t = 0; t < RN; t++) {
                    __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)(xqs[t] + 64 * j)));
                    __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(xqs[t] + 64 * j + 32)));
                    isum[t] = MADDS(isum[t], p0, slo);
                    isum[t] = MADDS(isum[t], p1, shi);
                }
            }
        } else if (wt == NSTF_TYPE_Q6_K) {
            d = nstf_fp16_to_f32(nstf_load_u16(blk + 208));
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(blk + 192));
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            const __m256i m30 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                const __m256i A = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
                const __m256i B = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
                const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
                __m256i wq[4];
                wq[0] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                wq[1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                wq[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m30));
                wq[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                        _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
#pragma GCC unroll 4
                for (int k = 0; k < 4; k++) {
                    const int c = 4 * n + k; /* 32-value chunk: sub-blocks 2c, 2c+1 */
                    const __m256i s2 = KFN(scales2)(sc8, 2 * c, 2 * c + 1);
#pragma GCC unroll 4
                    for (int t = 0; t < RN; t++)
                        isum[t] = MADDS(isum[t], _mm256_maddubs_epi16(wq[k], _mm256_loadu_si256((const __m256i *)(xqs[t] + 32 * c))), s2);
                }
            }
            /* codes are q + 32: subtract 32 * sum(sc * bsums) */
#pragma GCC unroll 4
            for (int t = 0; t < RN; t++)
                isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xbs[t]), sc16), 5));
        } else if (wt == NSTF_TYPE_Q3_K || wt == NSTF_TYPE_Q2_K) {
            const bool three = wt == NSTF_TYPE_Q3_K;
            __m128i sc8;
            if (three) {
                d = nstf_fp16_to_f32(nstf_load_u16(blk + 108));
                sc8 = nstf_q3k_scales16(blk + 96);
            } else {
                d = nstf_fp16_to_f32(nstf_load_u16(blk + 80));
                dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 82));
                const __m128i raw = _mm_loadu_si128((const __m128i *)blk);
                sc8 = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
                mins16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F)));
            }
            const uint8_t *qs = blk + (three ? 32 : 16);
            const __m256i hm = three ? _mm256_loadu_si256((const __m256i *)blk) : _mm256_setzero_si256();
            const __m256i m04 = _mm256_set1_epi8(4);
#pragma GCC unroll 2
            for (int n = 0; n < 2; n++) {
                const __m256i Q = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) {
                    const int c = 4 * n + j, hbit = 4 * n + j;
                    __m256i wq = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3);
                    if (three) { /* bit hbit of hmask[l] -> bit 2 */
                        __m256i h = hbit <= 2 ? _mm256_slli_epi16(hm, 2 - hbit) : _mm256_srli_epi16(hm, hbit - 2);
                        wq = _mm256_or_si256(wq, _mm256_and_si256(h, m04));
                    }
                    const __m256i s2 = KFN(scales2)(sc8, 2 * c, 2 * c + 1);
#pragma GCC unroll 4
                    for (int t = 0; t < RN; t++)
                        isum[t] = MADDS(isum[t], _mm256_maddubs_epi16(wq, _mm256_loadu_si256((const __m256i *)(xqs[t] + 32 * c))), s2);
                }
            }
            if (three) { /* codes are q + 4: subtract 4 * sum(sc * bsums) */
                const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
#pragma GCC unroll 4
                for (int t = 0; t < RN; t++)
                    isum[t] = _mm256_sub_epi32(isum[t], _mm256_slli_epi32(_mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xbs[t]), sc16), 2));
            }
        } else { /* IQ4_XS */
            d = nstf_fp16_to_f32(nstf_load_u16(blk));
            const uint16_t sh = nstf_load_u16(blk + 2);
            const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
#pragma GCC unroll 8
            for (int s = 0; s < 8; s++) {
                const int ls = ((blk[4 + s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
                __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(blk + 8 + 16 * s)));
                v = _mm256_and_si256(_mm256_srlv_epi64(v, _mm256_setr_epi64x(0, 0, 4, 4)), m4);
                const __m256i wv = _mm256_shuffle_epi8(table, v);
                const __m256i aw = _mm256_sign_epi8(wv, wv);
                const __m256i s1 = _mm256_set1_epi16((short)(ls - 32));
#pragma GCC unroll 4
                for (int t = 0; t < RN; t++) {
                    const __m256i xv = _mm256_loadu_si256((const __m256i *)(xqs[t] + 32 * s));
                    isum[t] = MADDS(isum[t], _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), s1);
                }
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < RN; t++) {
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[t]), _mm256_set1_ps(d * dx[t]), acc[t]);
            if (wt == NSTF_TYPE_Q2_K || wt == NSTF_TYPE_Q4_K || wt == NSTF_TYPE_Q5_K) {
                const __m256i mm = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)xbs[t]), mins16);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dmin * dx[t]), acc[t]);
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < RN; t++) y[t * ldy] = KFN(hsum)(acc[t]);
}

#define KROWS(T)                                                                               \
    static KTARGET void KFN(krows_##T)(const uint8_t *w, uint64_t rb, int rm, const nstf_q8k *xq, \
                                       int64_t t0, int rn, float *y, int64_t ldy) {            \
        for (int r = 0; r < rm; r++) {                                                         \
            const uint8_t *wr = w + (uint64_t)r * rb;                                          \
            switch (rn) {                                                                      \
            case 1: KFN(krow)(NSTF_TYPE_##T, 1, wr, xq, t0, y + r, ldy); break;                \
            case 2: KFN(krow)(NSTF_TYPE_##T, 2, wr, xq, t0, y + r, ldy); break;                \
            case 3: KFN(krow)(NSTF_TYPE_##T, 3, wr, xq, t0, y + r, ldy); break;                \
            default: KFN(krow)(NSTF_TYPE_##T, 4, wr, xq, t0, y + r, ldy); break;               \
            }                                                                                  \
        }                                                                                      \
    }
KROWS(Q2_K)
KROWS(Q3_K)
KROWS(Q4_K)
KROWS(Q5_K)
KROWS(Q6_K)
KROWS(IQ4_XS)
#undef KROWS

static void KFN(ktile)(nstf_type wt, const uint8_t *w, uint64_t rb, int rm, const nstf_q8k *xq,
                       int64_t t0, int rn, float *y, int64_t ldy) {
    switch (wt) {
    case NSTF_TYPE_Q2_K: KFN(krows_Q2_K)(w, rb, rm, xq, t0, rn, y, ldy); break;
    case NSTF_TYPE_Q3_K: KFN(krows_Q3_K)(w, rb, rm, xq, t0, rn, y, ldy); break;
    case NSTF_TYPE_Q4_K: KFN(krows_Q4_K)(w, rb, rm, xq, t0, rn, y, ldy); break;
    case NSTF_TYPE_Q5_K: KFN(krows_Q5_K)(w, rb, rm, xq, t0, rn, y, ldy); break;
    case NSTF_TYPE_Q6_K: KFN(krows_Q6_K)(w, rb, rm, xq, t0, rn, y, ldy); break;
    default: KFN(krows_IQ4_XS)(w, rb, rm, xq, t0, rn, y, ldy); break;
    }
}
