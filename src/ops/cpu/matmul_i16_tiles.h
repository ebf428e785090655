/* matmul_i16_tiles.h — the SIMD tiles of matmul_i16.c, included once per
 * instruction set with
 *   I16FN(name)   the variant's name for a function (name_avx2, name_vnni)
 *   I16TARGET     its target attribute (empty for the build's AVX2)
 *   I16_IL        1: from 3 tokens the rows interleaved (vpdpwssd: VNNI only)
 *   MADD2(a, x, b, y)  the int32 lanes of a.x + b.y over int16 pairs:
 *                 two vpmaddwd and an add on AVX2, vpmaddwd then vpdpwssd
 *                 with AVX-512 VNNI (the same integers: every sum is exact
 *                 in int32, so both variants give the same bits)
 * and defines I16FN(k_tiles), the table of tiles by kind and token count.
 * It needs matmul_i16.c's xq16, tile_fn, kinds, store_tile, bytes32 and codes32. */


static I16TARGET ALWAYS_INLINE void I16FN(tile)(const int kind, const int RN, const uint8_t *w, uint64_t row_bytes, int rm,
                                    const xq16 *x, int64_t t0, float *y, int64_t ldy) {
    const int bb = bytes32(kind);
    const bool has_m = kind == K_Q4_1 || kind == K_Q5_1;
    const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
    const uint8_t *wr[8];
    nstf_q32_rows8(w, row_bytes, rm, wr);
    const int64_t nb = x->nb;
    const int16_t *xq = x->q + t0 * nb * QK;
    const float *xd = x->d + t0 * nb, *xs = x->s + t0 * nb;
    __m256 acc[RN_I16];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = _mm256_setzero_ps();
    /* decode (RN <= 2) streams the weights: prefetch the next tile's rows
     * at the pace this one consumes its own */
    const uint8_t *pf = w + 8 * row_bytes;
    for (int64_t b = 0; b < nb; b++) {
        const uint64_t off = (uint64_t)b * (uint64_t)bb;
        if (RN <= 2) {
            nstf_q32_prefetch(pf, 8 * bb);
            pf += 8 * bb;
        }
        __m256 mv = _mm256_setzero_ps();
        const __m256 dv = nstf_q32_scales8(wr, off, has_m, &mv);
#if I16_IL
        /* from 3 tokens, the rows interleaved: the block's int16 codes are
         * transposed so that int32 lane r of W[p] holds row r's pair p
         * (elements 2p, 2p+1); vpdpwssd of W[p] with token t's pair p
         * broadcast then adds pair p of all 8 rows at once, and a token's 8
         * sums come out in lanes with no reduction tree (the transposes are
         * shared by the tile's tokens). The same integers (each block's sum
         * is exact in int32) and the same float steps: the same bits. */
        if (RN >= 3) {
            __m256i s8[RN_I16];
#pragma GCC unroll 8
            for (int t = 0; t < RN; t++) s8[t] = _mm256_setzero_si256();
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* pairs 8h .. 8h + 7: elements 16h .. 16h + 15 */
                __m256i v[8], W[8];
#pragma GCC unroll 8
                for (int r = 0; r < 8; r++) {
                    const __m256i c = codes32(kind, wr[r] + off, iq4);
                    v[r] = _mm256_cvtepi8_epi16(h ? _mm256_extracti128_si256(c, 1) : _mm256_castsi256_si128(c));
                }
                nstf_q32_tr8(v, W);
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++)
#pragma GCC unroll 8
                    for (int t = 0; t < RN; t++) {
                        int32_t xp;
                        memcpy(&xp, xq + (t * nb + b) * QK + 16 * h + 2 * p, 4);
                        s8[t] = _mm256_dpwssd_epi32(s8[t], W[p], _mm256_set1_epi32(xp));
                    }
            }
#pragma GCC unroll 8
            for (int t = 0; t < RN; t++) {
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8[t]),
                                         _mm256_mul_ps(dv, _mm256_broadcast_ss(xd + t * nb + b)), acc[t]);
                if (has_m) acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + t * nb + b), acc[t]);
            }
            continue;
        }
#endif
        __m256i wlo[8], whi[8];
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m256i c = codes32(kind, wr[r] + off, iq4);
            wlo[r] = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(c));
            whi[r] = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(c, 1));
        }
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const __m256i xlo = _mm256_load_si256((const __m256i *)(xq + (t * nb + b) * QK));
            const __m256i xhi = _mm256_load_si256((const __m256i *)(xq + (t * nb + b) * QK + 16));
            __m256i p[8];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                p[r] = MADD2(wlo[r], xlo, whi[r], xhi);
            const __m256i isum = nstf_q32_reduce8_i32(p);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dv, _mm256_broadcast_ss(xd + t * nb + b)),
                                     acc[t]);
            if (has_m) acc[t] = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(xs + t * nb + b), acc[t]);
        }
    }
    store_tile(RN, acc, rm, y, ldy);
}


/* Super-block tiles (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS): per super-block
 * the 8 rows are decoded to int16 into wq[chunk][row][32], with per chunk of
 * 32 a scale vector over the rows (dv: d * sc for Q4_K / Q5_K, d (ls - 32)
 * for IQ4_XS whose codes are the code book's values, d for Q2_K, Q3_K and
 * Q6_K whose 16-value scales are multiplied into their codes) and the mins'
 * (mv = -dmin * m; Q2_K's two per chunk, mv for elements 0..15 against sl,
 * mh for 16..31 against sh). Q2_K's q * sc <= 3 * 15 = 45; Q3_K's
 * |(q - 4) * sc| <= 4 * 32 = 128; Q6_K's
 * |(q - 32) * sc| <= 32 * 128 = 4096, so 16 products
 * with |x| <= 32767 stay below 2^31: the tree sums in int32 up to 4 lanes
 * of 4 products and finishes in fp32. */

/* The sums of RN tokens from t0 over super-block b's 8 decoded chunks
 * (wq, dvs, mvs, mhs), added to accm (in registers over the chunks). */
/* acc + a chunk's sums (lanes: rows) of block xb, scaled, with the mins */
static I16TARGET ALWAYS_INLINE __m256 I16FN(kadd)(const int kt, __m256 acc, __m256 sum, __m256 dv, __m256 mv, __m256 mh,
                                                  const xq16 *x, int64_t xb) {
    acc = _mm256_fmadd_ps(sum, _mm256_mul_ps(dv, _mm256_broadcast_ss(x->d + xb)), acc);
    if (kt == NSTF_TYPE_Q4_K || kt == NSTF_TYPE_Q5_K) acc = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(x->s + xb), acc);
    if (kt == NSTF_TYPE_Q2_K) {
        acc = _mm256_fmadd_ps(mv, _mm256_broadcast_ss(x->sl + xb), acc);
        acc = _mm256_fmadd_ps(mh, _mm256_broadcast_ss(x->sh + xb), acc);
    }
    return acc;
}

static I16TARGET ALWAYS_INLINE void I16FN(ktile_tokens)(const int kt, const int RN, const xq16 *x, int64_t t0, int64_t b,
                                       const int16_t (*wq)[8][32], const __m256i (*wil)[16], const float (*dvs)[8],
                                       const float (*mvs)[8], const float (*mhs)[8], __m256 *accm) {
    const int64_t nb = x->nb;
    __m256 acc[RN_I16];
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) acc[t] = accm[t];
    for (int c = 0; c < 8; c++) {
        const __m256 dv = _mm256_load_ps(dvs[c]), mv = _mm256_load_ps(mvs[c]);
        const __m256 mh = kt == NSTF_TYPE_Q2_K ? _mm256_load_ps(mhs[c]) : mv;
#if I16_IL
        /* from 3 tokens, the chunk's rows interleaved (wil, as the 32-element
         * tile's): lane r of a token's two int32 sums is row r's over the
         * pairs {0..3, 8..11} and {4..7, 12..15}, the two halves the tree
         * below finishes in fp32, added in its order: the same bits */
        if (RN >= 3) {
            __m256i sa[RN_I16], sb[RN_I16];
#pragma GCC unroll 8
            for (int t = 0; t < RN; t++) sa[t] = sb[t] = _mm256_setzero_si256();
#pragma GCC unroll 16
            for (int p = 0; p < 16; p++) {
                const __m256i W = _mm256_load_si256(&wil[c][p]);
#pragma GCC unroll 8
                for (int t = 0; t < RN; t++) {
                    int32_t xp;
                    memcpy(&xp, x->q + ((t0 + t) * nb + 8 * b + c) * QK + 2 * p, 4);
                    if (p % 8 < 4)
                        sa[t] = _mm256_dpwssd_epi32(sa[t], W, _mm256_set1_epi32(xp));
                    else
                        sb[t] = _mm256_dpwssd_epi32(sb[t], W, _mm256_set1_epi32(xp));
                }
            }
#pragma GCC unroll 8
            for (int t = 0; t < RN; t++) {
                const int64_t xb = (t0 + t) * nb + 8 * b + c;
                const __m256 sum = _mm256_add_ps(_mm256_cvtepi32_ps(sa[t]), _mm256_cvtepi32_ps(sb[t]));
                acc[t] = I16FN(kadd)(kt, acc[t], sum, dv, mv, mh, x, xb);
            }
            continue;
        }
#else
        (void)wil;
#endif
#pragma GCC unroll 8
        for (int t = 0; t < RN; t++) {
            const int64_t xb = (t0 + t) * nb + 8 * b + c;
            const __m256i xlo = _mm256_load_si256((const __m256i *)(x->q + xb * QK));
            const __m256i xhi = _mm256_load_si256((const __m256i *)(x->q + xb * QK + 16));
            __m256i p[8], a[4];
#pragma GCC unroll 8
            for (int r = 0; r < 8; r++)
                p[r] = MADD2(_mm256_load_si256((const __m256i *)wq[c][r]), xlo,
                             _mm256_load_si256((const __m256i *)(wq[c][r] + 16)), xhi);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++)
                a[r] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * r], p[2 * r + 1]),
                                        _mm256_unpackhi_epi32(p[2 * r], p[2 * r + 1]));
            const __m256 b0 = _mm256_cvtepi32_ps(
                _mm256_add_epi32(_mm256_unpacklo_epi64(a[0], a[1]), _mm256_unpackhi_epi64(a[0], a[1])));
            const __m256 b1 = _mm256_cvtepi32_ps(
                _mm256_add_epi32(_mm256_unpacklo_epi64(a[2], a[3]), _mm256_unpackhi_epi64(a[2], a[3])));
            const __m256 sum = _mm256_add_ps(_mm256_permute2f128_ps(b0, b1, 0x20), _mm256_permute2f128_ps(b0, b1, 0x31));
            acc[t] = I16FN(kadd)(kt, acc[t], sum, dv, mv, mh, x, xb);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < RN; t++) accm[t] = acc[t];
}

/* n_full groups of 8 tokens from t0, then a group of RN: each super-block
 * of the 8 rows is decoded once for all of them (up to TOK_CHUNK tokens;
 * it was once per 8), their sums kept in accs between super-blocks. */
static I16TARGET ALWAYS_INLINE void I16FN(ktile)(const int kt, const int RN, const uint8_t *w, uint64_t row_bytes, int rm,
                                     const xq16 *x, int64_t t0, int n_full, float *y, int64_t ldy) {
    const uint64_t bb = (uint64_t)nstf_type_block_bytes((nstf_type)kt);
    const uint8_t *wr[8];
    nstf_q32_rows8(w, row_bytes, rm, wr);
    const int64_t nb = x->nb;
    __m256 accs[TOK_CHUNK / RN_I16][RN_I16];
    for (int g = 0; g <= n_full; g++)
        for (int t = 0; t < RN_I16; t++) accs[g][t] = _mm256_setzero_ps();
    _Alignas(32) int16_t wq[8][8][32];
    _Alignas(32) float dvs[8][8], mvs[8][8], mhs[8][8];
#if I16_IL
    __m256i wil[8][16]; /* chunk c's rows interleaved: lane r of wil[c][p] is row r's pair p */
#else
    const __m256i (*wil)[16] = NULL;
#endif
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb / 8; b++) {
        for (int r = 0; r < 8; r++) {
            const uint8_t *blk = wr[r] + (uint64_t)b * (uint64_t)bb;
            __m256i c8[8];
            if (kt == NSTF_TYPE_Q2_K) { /* chunk c = 4n + j: bits 2j of qs[32n..]; 16-value scales and mins */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 80)), dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 82));
                const __m256i m3 = _mm256_set1_epi8(3);
                for (int n = 0; n < 2; n++) {
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(blk + 16 + 32 * n));
                    for (int j = 0; j < 4; j++) {
                        const int c = 4 * n + j;
                        const __m256i v = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3);
                        _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_castsi256_si128(v)),
                                                                                   _mm256_set1_epi16(blk[2 * c] & 0xF)));
                        _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                           _mm256_mullo_epi16(_mm256_cvtepu8_epi16(_mm256_extracti128_si256(v, 1)),
                                                              _mm256_set1_epi16(blk[2 * c + 1] & 0xF)));
                        dvs[c][r] = d;
                        mvs[c][r] = -dmin * (float)(blk[2 * c] >> 4);
                        mhs[c][r] = -dmin * (float)(blk[2 * c + 1] >> 4);
                    }
                }
            } else if (kt == NSTF_TYPE_Q3_K) { /* chunk c = 4n + j: bits 2j of qs[32n..], bit c of hmask, minus 4 */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 108));
                _Alignas(16) int8_t sc[16];
                _mm_store_si128((__m128i *)sc, nstf_q3k_scales16(blk + 96));
                const __m256i hm = _mm256_loadu_si256((const __m256i *)blk), m3 = _mm256_set1_epi8(3),
                              m04 = _mm256_set1_epi8(4);
                for (int n = 0; n < 2; n++) {
                    const __m256i Q = _mm256_loadu_si256((const __m256i *)(blk + 32 + 32 * n));
                    for (int j = 0; j < 4; j++) {
                        const int c = 4 * n + j;
                        const __m256i h = c <= 2 ? _mm256_slli_epi16(hm, 2 - c) : _mm256_srli_epi16(hm, c - 2);
                        const __m256i v = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Q, 2 * j), m3),
                                                                          _mm256_and_si256(h, m04)),
                                                          m04);
                        _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                                                                   _mm256_set1_epi16(sc[2 * c])));
                        _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                           _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                                              _mm256_set1_epi16(sc[2 * c + 1])));
                        dvs[c][r] = d;
                        mvs[c][r] = 0.0f;
                    }
                }
            } else if (kt == NSTF_TYPE_IQ4_XS) { /* sub-block c: 16 bytes at 8 + 16 c, as an IQ4_NL block's */
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk));
                const uint16_t sh = nstf_load_u16(blk + 2);
                const __m256i iq4 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)nstf_iq4nl_values));
                for (int c = 0; c < 8; c++) {
                    const int ls = ((blk[4 + c / 2] >> (4 * (c % 2))) & 0xF) | (((sh >> (2 * c)) & 3) << 4);
                    const __m256i v = _mm256_shuffle_epi8(iq4, nstf_q32_nibbles(blk + 8 + 16 * c));
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16), _mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)));
                    dvs[c][r] = d * (float)(ls - 32);
                    mvs[c][r] = 0.0f;
                }
            } else if (kt == NSTF_TYPE_Q6_K) {
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk + 208));
                const __m256i m30 = _mm256_set1_epi8(0x30), o32 = _mm256_set1_epi8(32);
                for (int n = 0; n < 2; n++) {
                    const __m256i A = _mm256_loadu_si256((const __m256i *)(blk + 64 * n));
                    const __m256i B = _mm256_loadu_si256((const __m256i *)(blk + 64 * n + 32));
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * n));
                    c8[4 * n] = _mm256_or_si256(_mm256_and_si256(A, m4), _mm256_and_si256(_mm256_slli_epi16(H, 4), m30));
                    c8[4 * n + 1] = _mm256_or_si256(_mm256_and_si256(B, m4), _mm256_and_si256(_mm256_slli_epi16(H, 2), m30));
                    c8[4 * n + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(A, 4), m4), _mm256_and_si256(H, m30));
                    c8[4 * n + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(B, 4), m4),
                                                    _mm256_and_si256(_mm256_srli_epi16(H, 2), m30));
                }
                for (int c = 0; c < 8; c++) {
                    const __m256i v = _mm256_sub_epi8(c8[c], o32);
                    const int8_t *sc = (const int8_t *)blk + 192 + 2 * c;
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_castsi256_si128(v)),
                                                                               _mm256_set1_epi16(sc[0])));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16),
                                       _mm256_mullo_epi16(_mm256_cvtepi8_epi16(_mm256_extracti128_si256(v, 1)),
                                                          _mm256_set1_epi16(sc[1])));
                    dvs[c][r] = d;
                    mvs[c][r] = 0.0f;
                }
            } else {
                const bool five = kt == NSTF_TYPE_Q5_K;
                const float d = nstf_fp16_to_f32(nstf_load_u16(blk)), dmin = nstf_fp16_to_f32(nstf_load_u16(blk + 2));
                const uint8_t *qs = blk + (five ? 48 : 16);
                __m256i hb = five ? _mm256_loadu_si256((const __m256i *)(blk + 16)) : _mm256_setzero_si256();
                const __m256i m10 = _mm256_set1_epi8(0x10);
                for (int j = 0; j < 4; j++) {
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
                    c8[2 * j] = _mm256_and_si256(v, m4);
                    c8[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    if (five) { /* bits 2j, 2j+1 of each qh byte (hb shifted by 2j so far) */
                        c8[2 * j] = _mm256_or_si256(c8[2 * j], _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10));
                        c8[2 * j + 1] = _mm256_or_si256(c8[2 * j + 1], _mm256_and_si256(_mm256_slli_epi16(hb, 3), m10));
                        hb = _mm256_srli_epi16(hb, 2);
                    }
                }
                for (int c = 0; c < 8; c++) {
                    uint8_t sc, m;
                    nstf_k4_scale_min(c, blk + 4, &sc, &m);
                    _mm256_store_si256((__m256i *)wq[c][r], _mm256_cvtepu8_epi16(_mm256_castsi256_si128(c8[c])));
                    _mm256_store_si256((__m256i *)(wq[c][r] + 16), _mm256_cvtepu8_epi16(_mm256_extracti128_si256(c8[c], 1)));
                    dvs[c][r] = d * (float)sc;
                    mvs[c][r] = -dmin * (float)m;
                }
            }
        }
#if I16_IL
        if (n_full > 0 || RN >= 3) /* the interleaved rows of each chunk, for the tokens' tiles */
            for (int c = 0; c < 8; c++)
#pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    __m256i v[8];
#pragma GCC unroll 8
                    for (int r = 0; r < 8; r++) v[r] = _mm256_load_si256((const __m256i *)(wq[c][r] + 16 * h));
                    nstf_q32_tr8(v, wil[c] + 8 * h);
                }
#endif
        for (int g = 0; g < n_full; g++)
            I16FN(ktile_tokens)(kt, RN_I16, x, t0 + 8 * g, b, wq, wil, dvs, mvs, mhs, accs[g]);
        I16FN(ktile_tokens)(kt, RN, x, t0 + 8 * n_full, b, wq, wil, dvs, mvs, mhs, accs[n_full]);
    }
    for (int g = 0; g < n_full; g++) store_tile(RN_I16, accs[g], rm, y + 8 * g * ldy, ldy);
    store_tile(RN, accs[n_full], rm, y + 8 * n_full * ldy, ldy);
}

#define DEF_TILE(K, RN, KIND)                                                                                      \
    static I16TARGET void I16FN(tile_##K##_##RN)(const uint8_t *w, uint64_t rb, int rm, const xq16 *x, int64_t t0,  \
                                                 int n_full, float *y, int64_t ldy) {                               \
        (void)n_full;                                                                                              \
        I16FN(tile)(KIND, RN, w, rb, rm, x, t0, y, ldy);                                                           \
    }
#define DEF_KTILE(K, RN, KIND)                                                                                     \
    static I16TARGET void I16FN(tile_##K##_##RN)(const uint8_t *w, uint64_t rb, int rm, const xq16 *x, int64_t t0,  \
                                                 int n_full, float *y, int64_t ldy) {                               \
        I16FN(ktile)(KIND, RN, w, rb, rm, x, t0, n_full, y, ldy);                                                  \
    }
#define DEF_TILES(K, KIND)                                                                            \
    DEF_TILE(K, 1, KIND) DEF_TILE(K, 2, KIND) DEF_TILE(K, 3, KIND) DEF_TILE(K, 4, KIND)               \
    DEF_TILE(K, 5, KIND) DEF_TILE(K, 6, KIND) DEF_TILE(K, 7, KIND) DEF_TILE(K, 8, KIND)
#define DEF_KTILES(K, KIND)                                                                           \
    DEF_KTILE(K, 1, KIND) DEF_KTILE(K, 2, KIND) DEF_KTILE(K, 3, KIND) DEF_KTILE(K, 4, KIND)           \
    DEF_KTILE(K, 5, KIND) DEF_KTILE(K, 6, KIND) DEF_KTILE(K, 7, KIND) DEF_KTILE(K, 8, KIND)
DEF_TILES(Q4_0, K_Q4_0)
DEF_TILES(Q4_1, K_Q4_1)
DEF_TILES(Q5_0, K_Q5_0)
DEF_TILES(Q5_1, K_Q5_1)
DEF_TILES(Q8_0, K_Q8_0)
DEF_TILES(IQ4_NL, K_IQ4_NL)
DEF_KTILES(Q4_K, NSTF_TYPE_Q4_K)
DEF_KTILES(Q5_K, NSTF_TYPE_Q5_K)
DEF_KTILES(Q6_K, NSTF_TYPE_Q6_K)
DEF_KTILES(IQ4_XS, NSTF_TYPE_IQ4_XS)
DEF_KTILES(Q3_K, NSTF_TYPE_Q3_K)
DEF_KTILES(Q2_K, NSTF_TYPE_Q2_K)
#define TILE_ROW(K)                                                                                                \
    {I16FN(tile_##K##_1), I16FN(tile_##K##_2), I16FN(tile_##K##_3), I16FN(tile_##K##_4),                           \
     I16FN(tile_##K##_5), I16FN(tile_##K##_6), I16FN(tile_##K##_7), I16FN(tile_##K##_8)},
static const tile_fn I16FN(k_tiles)[N_KINDS][RN_I16] = {TILE_ROW(Q4_0) TILE_ROW(Q4_1) TILE_ROW(Q5_0) TILE_ROW(Q5_1)
                                                            TILE_ROW(Q8_0) TILE_ROW(IQ4_NL) TILE_ROW(Q4_K)
                                                                TILE_ROW(Q5_K) TILE_ROW(Q6_K) TILE_ROW(IQ4_XS)
                                                                    TILE_ROW(Q3_K) TILE_ROW(Q2_K)};
#undef DEF_TILE
#undef DEF_KTILE
#undef DEF_TILES
#undef DEF_KTILES
#undef TILE_ROW
