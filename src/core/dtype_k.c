/* dtype_k.c — scalar reference (de)quantization of the 256-element
 * super-block types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (ggml's K-quants) and
 * IQ4_XS.
 *
 * Layouts (byte offsets in one super-block; element e = 0..255):
 *   Q2_K  scales[16] @0 (low nibble scale, high nibble min, one per 16),
 *         qs[64] @16, d @80, dmin @82. e = 128n + 32j + l (n < 2, j < 4,
 *         l < 32): q = (qs[32n + l] >> 2j) & 3, sub-block e / 16.
 *   Q3_K  hmask[32] @0, qs[64] @32, scales[12] @96, d @108. Low two bits as
 *         Q2_K; the third is bit (4n + j) of hmask[l], and a clear bit
 *         subtracts 4 (q in -4..3). Sixteen 6-bit scales: low nibbles in
 *         bytes 0..7 (i and i + 8 share byte i % 8), high pairs in bytes
 *         8..11 (bits 2 * (i / 4) of byte 8 + i % 4); scale - 32.
 *   Q4_K  d @0, dmin @2, scales[12] @4, qs[128] @16. e = 64j + 32h + l:
 *         q = (qs[32j + l] >> 4h) & 15, sub-block 2j + h; 6-bit scale and
 *         min of sub-block s per nstf_k4_scale_min.
 *   Q5_K  as Q4_K with qh[32] @16 and qs[128] @48: bit (2j + h) of qh[l]
 *         is bit 4 of q.
 *   Q6_K  ql[128] @0, qh[64] @128, scales[16] (int8) @192, d @208.
 *         e = 128n + 32k + l: low nibble of ql[64n + l + 32 (k & 1)]
 *         (k < 2) or its high nibble (k >= 2), two high bits
 *         (qh[32n + l] >> 2k) & 3; q - 32; scale of e / 16.
 *   IQ4_XS d @0, scales_h (u16) @2, scales_l[4] @4, qs[128] @8: sub-block
 *         b (32 values) has scale ((scales_l[b/2] >> 4(b%2)) & 15 |
 *         ((scales_h >> 2b) & 3) << 4) - 32 and IQ4_NL-layout nibbles
 *         qs[16b..16b+15].
 * Dequantization uses ggml's fp32 operations in ggml's order (d * sc first,
 * then * q, then - dmin * m), so results match gguf-py bit for bit.
 *
 * Quantizers (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) follow ggml's reference
 * algorithms without an importance matrix, operation for operation: per
 * sub-block a weighted min/scale search (Q4_K, Q5_K: weights
 * sqrt(mean x^2) + |x|, 20 / 15 candidate scales; Q2_K: weights |x|,
 * absolute error, 16 candidates) or a symmetric scale search (Q6_K:
 * weights x^2, 18 candidates; Q3_K: weights x^2, coordinate descent on the
 * codes), then quantization of the sub-block scales relative to the
 * largest one (4-bit Q2_K, 6-bit Q3_K / Q4_K / Q5_K, int8 Q6_K), and a
 * final requantization of every value against the stored scales. */
#include <math.h>
#include <string.h>

#include "core/dtype.h"

#define QK_K NSTF_QK_K

static float h2f(const uint8_t *p) { return nstf_fp16_to_f32(nstf_load_u16(p)); }
static void f2h(uint8_t *p, float f) {
    uint16_t h = nstf_f32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* Round to nearest, ties to even, for |f| < 2^22 (ggml's nearest_int). */
static inline int nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* ---- dequantization -------------------------------------------------------- */

static void deq_q2_k(const uint8_t *b, float *y) {
    const float d = h2f(b + 80), dmin = h2f(b + 82);
    const uint8_t *sc = b, *qs = b + 16;
    for (int e = 0; e < QK_K; e++) {
        int n = e / 128, j = (e % 128) / 32, l = e % 32, s = sc[e / 16];
        float dl = d * (float)(s & 0xF), ml = dmin * (float)(s >> 4);
        y[e] = dl * (float)((qs[32 * n + l] >> (2 * j)) & 3) - ml;
    }
}

static void deq_q3_k(const uint8_t *b, float *y) {
    const float d = h2f(b + 108);
    int8_t sc[16];
    nstf_q3k_scales(b + 96, sc);
    const uint8_t *hm = b, *qs = b + 32;
    for (int e = 0; e < QK_K; e++) {
        int n = e / 128, j = (e % 128) / 32, l = e % 32;
        int q = ((qs[32 * n + l] >> (2 * j)) & 3) - (((hm[l] >> (4 * n + j)) & 1) ? 0 : 4);
        float dl = d * (float)sc[e / 16];
        y[e] = dl * (float)q;
    }
}

static void deq_q45_k(const uint8_t *b, float *y, bool five) {
    const float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int e = 0; e < QK_K; e++) {
        int j = e / 64, h = (e % 64) / 32, l = e % 32;
        uint8_t sc, m;
        nstf_k4_scale_min(2 * j + h, scales, &sc, &m);
        int q = (qs[32 * j + l] >> (4 * h)) & 15;
        if (five) q |= ((qh[l] >> (2 * j + h)) & 1) << 4;
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        y[e] = d1 * (float)q - m1;
    }
}

static void deq_q6_k(const uint8_t *b, float *y) {
    const float d = h2f(b + 208);
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int e = 0; e < QK_K; e++) {
        int n = e / 128, k = (e % 128) / 32, l = e % 32;
        int lo = (ql[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        int q = (lo | (((qh[32 * n + l] >> (2 * k)) & 3) << 4)) - 32;
        y[e] = d * (float)sc[e / 16] * (float)q;
    }
}

static void deq_iq4_xs(const uint8_t *b, float *y) {
    const float d = h2f(b);
    const uint16_t sh = nstf_load_u16(b + 2);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < QK_K / 32; s++) {
        int ls = ((sl[s / 2] >> (4 * (s % 2))) & 0xF) | (((sh >> (2 * s)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        for (int j = 0; j < 16; j++) {
            y[32 * s + j] = dl * (float)nstf_iq4nl_values[qs[16 * s + j] & 0xF];
            y[32 * s + j + 16] = dl * (float)nstf_iq4nl_values[qs[16 * s + j] >> 4];
        }
    }
}

void nstf_dequantize_row_k(nstf_type t, const uint8_t *src, float *dst, int64_t n) {
    const int64_t bb = nstf_type_block_bytes(t);
    for (int64_t i = 0; i < n / QK_K; i++, src += bb, dst += QK_K) {
        switch (t) {
        case NSTF_TYPE_Q2_K: deq_q2_k(src, dst); break;
        case NSTF_TYPE_Q3_K: deq_q3_k(src, dst); break;
        case NSTF_TYPE_Q4_K: deq_q45_k(src, dst, false); break;
        case NSTF_TYPE_Q5_K: deq_q45_k(src, dst, true); break;
        case NSTF_TYPE_Q6_K: deq_q6_k(src, dst); break;
        case NSTF_TYPE_IQ4_XS: deq_iq4_xs(src, dst); break;
        default: return;
        }
    }
}

/* ---- quantization ---------------------------------------------------------- */

/* Asymmetric codes L[i] in 0..nmax for x ~ scale * L - min with weights w:
 * start from the min/max grid, then try nstep + 1 grids with
 * (nmax + rmin + rdelta * is) steps over [min, max], each refined by the
 * weighted least-squares scale and offset (offset clamped to <= 0), keeping
 * the lowest weighted squared error (use_mad: weighted absolute error, as
 * ggml's Q2_K). Returns the scale; *neg_min = -offset (>= 0). */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *neg_min, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        for (int i = 0; i < n; i++) L[i] = 0;
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min), scale = 1.0f / iscale, best_err = 0.0f;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        float diff = scale * (float)L[i] + min - x[i];
        best_err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
    }
    uint8_t aux[32];
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * (x[i] - min));
            l = l < 0 ? 0 : l > nmax ? nmax : l;
            aux[i] = (uint8_t)l;
            sum_l += w[i] * (float)l;
            sum_l2 += w[i] * (float)l * (float)l;
            sum_xl += w[i] * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)aux[i] + this_min - x[i];
                err += w[i] * (use_mad ? fabsf(diff) : diff * diff);
            }
            if (err < best_err) {
                memcpy(L, aux, (size_t)n);
                best_err = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* Symmetric codes L[i] = nmax + l, l in -nmax..nmax-1, weights qw (NULL:
 * x^2; ggml's make_qx_quants with rmse_type 1): the least-squares scale
 * for the grid through the largest |x|, then for 18 nearby grids
 * (nmax +- 0.1k), keeping the best weighted fit. */
/* The value of largest magnitude (the first one of it), and |it|. */
static float largest(int n, const float *x, float *amax) {
    float max = 0;
    *amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > *amax) { *amax = ax; max = x[i]; }
    }
    return max;
}

static float fit_scale_sym(int n, int nmax, const float *x, uint8_t *L, const float *qw) {
    float amax, max = largest(n, x, &amax);
    if (amax < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = -(float)nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (uint8_t)(l + nmax);
        float w = qw ? qw[i] : x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale * x[i]);
            l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
            float w = qw ? qw[i] : x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++) {
                int l = nearest_int(iscale * x[i]);
                L[i] = (uint8_t)(nmax + (l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Non-negative codes L[i] in 0..nmax for x ~ scale * L with weights w
 * (ggml's make_qp_quants, the importance-weighted K-quants' scale codes):
 * the grid through max(x) and 8 nearby (nmax +- 0.1k), the best weighted
 * squared error kept, then up to 5 passes of coordinate descent on the
 * weighted fit. Returns the scale (0: every x below 1e-15). */
static float fit_scale_pos(int n, int nmax, const float *x, uint8_t *L, const float *w) {
    float max = 0;
    for (int i = 0; i < n; i++) max = x[i] > max ? x[i] : max;
    if (max < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    float iscale = (float)nmax / max, best_mse = 0;
    const float scale = 1 / iscale;
    for (int i = 0; i < n; i++) {
        const float diff = x[i] - scale * (float)nearest_int(iscale * x[i]);
        best_mse += w[i] * diff * diff;
    }
    for (int is = -4; is <= 4; is++) {
        if (is == 0) continue;
        const float iscale_is = (0.1f * (float)is + (float)nmax) / max, scale_is = 1 / iscale_is;
        float mse = 0;
        for (int i = 0; i < n; i++) {
            int l = nearest_int(iscale_is * x[i]);
            l = l < nmax ? l : nmax;
            const float diff = x[i] - scale_is * (float)l;
            mse += w[i] * diff * diff;
        }
        if (mse < best_mse) {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    float sumlx = 0, suml2 = 0;
    int Li[QK_K / 16];
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        Li[i] = l < nmax ? l : nmax;
        sumlx += w[i] * x[i] * (float)Li[i];
        suml2 += w[i] * (float)Li[i] * (float)Li[i];
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float slx = sumlx - w[i] * x[i] * (float)Li[i], sl2 = suml2 - w[i] * (float)Li[i] * (float)Li[i];
            if (slx > 0 && sl2 > 0) {
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = new_l < nmax ? new_l : nmax;
                if (new_l != Li[i]) {
                    slx += w[i] * x[i] * (float)new_l;
                    sl2 += w[i] * (float)new_l * (float)new_l;
                    if (slx * slx * suml2 > sumlx * sumlx * sl2) {
                        Li[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (uint8_t)Li[i];
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Q4_K (five = false) or Q5_K super-block. qw NULL: ggml's reference
 * (weights av_x + |x|, scale and min codes against the largest); else its
 * quantize_row_q4_K_impl / q5_K_impl: weights qw sqrt(sigma2 + x^2), the
 * finer grid search, the codes of the scales and mins fitted by
 * fit_scale_pos weighted by each sub-block's summed weight. */
static void quant_q45_k(const float *x, uint8_t *b, bool five, const float *qw) {
    const int nmax = five ? 31 : 15;
    uint8_t L[QK_K], *scales = b + 4, ls_w[8], lm_w[8];
    float sc[8], mins[8], w[32], sw[8], max_scale = 0, max_min = 0;
    float sum_x2_all = 0;
    for (int l = 0; qw && l < QK_K; l++) sum_x2_all += x[l] * x[l];
    const float sigma2 = 2 * sum_x2_all / QK_K;
    for (int j = 0; j < 8; j++) {
        const float *xs = x + 32 * j;
        if (qw) {
            sw[j] = 0;
            for (int l = 0; l < 32; l++) sw[j] += w[l] = qw[32 * j + l] * sqrtf(sigma2 + xs[l] * xs[l]);
            sc[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], -0.9f, 0.05f, 36, false);
            continue;
        }
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += xs[l] * xs[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) w[l] = av_x + fabsf(xs[l]);
        sc[j] = fit_scale_min(32, nmax, xs, w, L + 32 * j, &mins[j], five ? -0.5f : -1.0f, 0.1f,
                              five ? 15 : 20, false);
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float d_block = max_scale / 63.0f, m_block = max_min / 63.0f;
    if (qw) {
        d_block = fit_scale_pos(8, 63, sc, ls_w, sw);
        m_block = fit_scale_pos(8, 63, mins, lm_w, sw);
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        int ls = nearest_int(inv_scale * sc[j]), lm = nearest_int(inv_min * mins[j]);
        ls = (uint8_t)ls > 63 ? 63 : (uint8_t)ls; /* ggml stores to uint8_t, then MIN(63) */
        lm = (uint8_t)lm > 63 ? 63 : (uint8_t)lm;
        if (qw) ls = ls_w[j] > 63 ? 63 : ls_w[j], lm = lm_w[j] > 63 ? 63 : lm_w[j];
        if (j < 4) {
            scales[j] = (uint8_t)ls;
            scales[j + 4] = (uint8_t)lm;
        } else {
            scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
            scales[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    f2h(b, d_block);
    f2h(b + 2, m_block);
    for (int j = 0; j < 8; j++) {
        uint8_t s, m;
        nstf_k4_scale_min(j, scales, &s, &m);
        const float d = h2f(b) * (float)s;
        if (!d) continue;
        const float dm = h2f(b + 2) * (float)m;
        for (int i = 0; i < 32; i++) {
            int l = nearest_int((x[32 * j + i] + dm) / d);
            L[32 * j + i] = (uint8_t)(l < 0 ? 0 : l > nmax ? nmax : l);
        }
    }
    uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    if (five) memset(qh, 0, 32);
    for (int j = 0; j < 4; j++)
        for (int l = 0; l < 32; l++) {
            int l1 = L[64 * j + l], l2 = L[64 * j + 32 + l];
            if (five) {
                qh[l] |= (uint8_t)(((l1 >> 4) << (2 * j)) | ((l2 >> 4) << (2 * j + 1)));
                l1 &= 15;
                l2 &= 15;
            }
            qs[32 * j + l] = (uint8_t)(l1 | (l2 << 4));
        }
}

/* Q2_K / Q3_K low bits: codes L[256] (0..3) into qs[64], value
 * 128n + 32j + l at bits 2j of qs[32n + l]. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Ln = L + 128 * n;
            qs[32 * n + l] = (uint8_t)(Ln[l] | (Ln[l + 32] << 2) | (Ln[l + 64] << 4) | (Ln[l + 96] << 6));
        }
}

/* Q2_K super-block (ggml's quantize_row_q2_K_ref): per 16-value sub-block
 * an asymmetric 2-bit fit with weights |x| and absolute error (grids
 * nmax - 0.5 + 0.1 is, is = 0..15); scales and mins quantized to 4 bits
 * against the largest of each (d = max_scale / 15, dmin = max_min / 15);
 * then every value re-coded against the stored scale and min. */
static void quant_q2_k(const float *x, uint8_t *b, const float *qw) {
    uint8_t L[QK_K], *scales = b, *qs = b + 16;
    float w[16], sc[16], mins[16], sw[16], max_scale = 0, max_min = 0;
    float sum_x2 = 0;
    for (int l = 0; qw && l < QK_K; l++) sum_x2 += x[l] * x[l];
    const float sigma2 = sum_x2 / QK_K;
    for (int j = 0; j < 16; j++) {
        if (qw) { /* ggml's quantize_row_q2_K_impl */
            sw[j] = 0;
            for (int l = 0; l < 16; l++) sw[j] += w[l] = qw[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sc[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.9f, 0.05f, 36, false);
            continue;
        }
        for (int l = 0; l < 16; l++) w[l] = fabsf(x[16 * j + l]);
        sc[j] = fit_scale_min(16, 3, x + 16 * j, w, L + 16 * j, &mins[j], -0.5f, 0.1f, 15, true);
        if (sc[j] > max_scale) max_scale = sc[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    memset(scales, 0, 16);
    if (qw) {
        uint8_t Ls[16], Lm[16];
        f2h(b + 80, fit_scale_pos(16, 15, sc, Ls, sw));
        f2h(b + 82, fit_scale_pos(16, 15, mins, Lm, sw));
        for (int j = 0; j < 16; j++) scales[j] = (uint8_t)(Ls[j] | (Lm[j] << 4));
    } else {
        if (max_scale > 0) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < 16; j++) scales[j] = (uint8_t)nearest_int(iscale * sc[j]);
            f2h(b + 80, max_scale / 15.0f);
        } else {
            f2h(b + 80, 0.0f);
        }
        if (max_min > 0) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < 16; j++) scales[j] |= (uint8_t)(nearest_int(iscale * mins[j]) << 4);
            f2h(b + 82, max_min / 15.0f);
        } else {
            f2h(b + 82, 0.0f);
        }
    }
    for (int j = 0; j < 16; j++) {
        const float d = h2f(b + 80) * (float)(scales[j] & 0xF);
        if (!d) continue;
        const float dm = h2f(b + 82) * (float)(scales[j] >> 4);
        for (int i = 0; i < 16; i++) {
            int l = nearest_int((x[16 * j + i] + dm) / d);
            L[16 * j + i] = (uint8_t)(l < 0 ? 0 : l > 3 ? 3 : l);
        }
    }
    pack_2bit(L, qs);
}

/* Symmetric codes l in -nmax..nmax-1 (stored as l + nmax) with weights
 * x^2, ggml's make_q3_quants with do_rmse: the grid through the largest
 * |x|, then up to 5 passes of coordinate descent moving one code at a time
 * while the weighted fit sum(w x l)^2 / sum(w l^2) improves. An all-zero
 * (< 1e-15) group gives codes 0 and scale 0. Returns the scale. */
static float fit_scale_q3(int n, int nmax, const float *x, int8_t *L) {
    float amax, max = largest(n, x, &amax);
    if (amax < 1e-15f) {
        for (int i = 0; i < n; i++) L[i] = 0;
        return 0.0f;
    }
    const float iscale = -(float)nmax / max;
    float sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * x[i]);
        l = l < -nmax ? -nmax : l > nmax - 1 ? nmax - 1 : l;
        L[i] = (int8_t)l;
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int itry = 0; itry < 5; itry++) {
        int n_changed = 0;
        for (int i = 0; i < n; i++) {
            float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = new_l < -nmax ? -nmax : new_l > nmax - 1 ? nmax - 1 : new_l;
                if (new_l != L[i]) {
                    slx += w * x[i] * (float)new_l;
                    sl2 += w * (float)new_l * (float)new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed++;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return sumlx / suml2;
}

/* Q3_K super-block (ggml's quantize_row_q3_K_ref): per 16-value sub-block
 * the symmetric 3-bit fit above; the 16 scales quantized to 6 bits against
 * the largest in magnitude (d = -max / 32, codes -32..31 stored + 32);
 * every value re-coded against its stored scale (-4..3); the code's third
 * bit goes to hmask, the low two to qs. */
static void quant_q3_k(const float *x, uint8_t *b, const float *qw) {
    int8_t L[QK_K];
    uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
    float sc[16], amax, max_scale = 0;
    memset(scales, 0, 12);
    if (qw) { /* ggml's quantize_row_q3_K_impl: weighted sub-block fits, the 6-bit scales fitted weighted too */
        float sum_x2 = 0, w[16], sw[16];
        uint8_t Lu[16], Ls[16];
        for (int l = 0; l < QK_K; l++) sum_x2 += x[l] * x[l];
        const float sigma2 = 2 * sum_x2 / QK_K;
        for (int j = 0; j < 16; j++) {
            sw[j] = 0;
            for (int l = 0; l < 16; l++) sw[j] += w[l] = qw[16 * j + l] * sqrtf(sigma2 + x[16 * j + l] * x[16 * j + l]);
            sc[j] = fit_scale_sym(16, 4, x + 16 * j, Lu, w);
        }
        f2h(b + 108, fit_scale_sym(16, 32, sc, Ls, sw));
        for (int j = 0; j < 16; j++) {
            const int l = Ls[j];
            if (j < 8) scales[j] = (uint8_t)(l & 0xF);
            else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
    } else {
        for (int j = 0; j < 16; j++) sc[j] = fit_scale_q3(16, 4, x + 16 * j, L + 16 * j);
        max_scale = largest(16, sc, &amax);
    }
    if (!qw && max_scale != 0) {
        const float iscale = -32.0f / max_scale;
        for (int j = 0; j < 16; j++) {
            int l = (int8_t)nearest_int(iscale * sc[j]); /* ggml stores to int8_t first */
            l = (l < -32 ? -32 : l > 31 ? 31 : l) + 32;
            if (j < 8) scales[j] = (uint8_t)(l & 0xF);
            else scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
            scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
        }
        f2h(b + 108, 1.0f / iscale);
    } else if (!qw) {
        f2h(b + 108, 0.0f);
    }
    int8_t stored[16];
    nstf_q3k_scales(scales, stored);
    for (int j = 0; j < 16; j++) {
        const float d = h2f(b + 108) * (float)stored[j];
        if (!d) continue;
        for (int i = 0; i < 16; i++) {
            int l = nearest_int(x[16 * j + i] / d);
            L[16 * j + i] = (int8_t)((l < -4 ? -4 : l > 3 ? 3 : l) + 4);
        }
    }
    memset(hmask, 0, 32);
    for (int e = 0; e < QK_K; e++) /* the high bit of value e: bit e / 32 of hmask[e % 32] */
        if (L[e] > 3) {
            hmask[e % 32] |= (uint8_t)(1u << (e / 32));
            L[e] = (int8_t)(L[e] - 4);
        }
    pack_2bit((const uint8_t *)L, qs);
}

/* Q6_K super-block; qw (NULL: ggml's reference) weights the sub-block fits
 * (ggml's quantize_row_q6_K_impl). */
static void quant_q6_k(const float *x, uint8_t *b, const float *qw) {
    uint8_t L[QK_K];
    float sc[16], max_abs;
    for (int s = 0; s < 16; s++) sc[s] = fit_scale_sym(16, 32, x + 16 * s, L + 16 * s, qw ? qw + 16 * s : NULL);
    const float max_scale = largest(16, sc, &max_abs);
    if (max_abs < 1e-15f) {
        memset(b, 0, 210);
        return;
    }
    float iscale = -128.0f / max_scale;
    f2h(b + 208, 1.0f / iscale);
    int8_t *scales = (int8_t *)(b + 192);
    for (int s = 0; s < 16; s++) {
        int v = nearest_int(iscale * sc[s]);
        scales[s] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int s = 0; s < 16; s++) {
        float d = h2f(b + 208) * (float)scales[s];
        if (!d) continue;
        for (int i = 0; i < 16; i++) {
            int l = nearest_int(x[16 * s + i] / d);
            L[16 * s + i] = (uint8_t)((l < -32 ? -32 : l > 31 ? 31 : l) + 32);
        }
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int n = 0; n < 2; n++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *Ln = L + 128 * n;
            ql[64 * n + l] = (uint8_t)((Ln[l] & 0xF) | ((Ln[l + 64] & 0xF) << 4));
            ql[64 * n + l + 32] = (uint8_t)((Ln[l + 32] & 0xF) | ((Ln[l + 96] & 0xF) << 4));
            qh[32 * n + l] = (uint8_t)((Ln[l] >> 4) | ((Ln[l + 32] >> 4) << 2) |
                                       ((Ln[l + 64] >> 4) << 4) | ((Ln[l + 96] >> 4) << 6));
        }
}

static bool quantize_k(nstf_type t, const float *src, uint8_t *dst, int64_t n, const float *qw) {
    const int64_t bb = nstf_type_block_bytes(t);
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K, dst += bb) {
        const float *w = qw ? qw + i * QK_K : NULL;
        switch (t) {
        case NSTF_TYPE_Q2_K: quant_q2_k(src, dst, w); break;
        case NSTF_TYPE_Q3_K: quant_q3_k(src, dst, w); break;
        case NSTF_TYPE_Q4_K: quant_q45_k(src, dst, false, w); break;
        case NSTF_TYPE_Q5_K: quant_q45_k(src, dst, true, w); break;
        case NSTF_TYPE_Q6_K: quant_q6_k(src, dst, w); break;
        default: return false;
        }
    }
    return true;
}

/* The index of the table value nearest x (the upper one on a tie), the
 * table ascending. */
static int iq4_nearest(float x) {
    const int8_t *v = nstf_iq4nl_values;
    if (x <= v[0]) return 0;
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (x < v[mid]) hi = mid;
        else lo = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

/* The weighted fit of x to d * v[l] with the codes l of the scale 1/id:
 * sum w q x and sum w q^2 (ggml's order, fp32). */
static void iq4_fit(const float *x, const float *w, float id, float *sqx, float *sq2) {
    float a = 0, b = 0;
    for (int j = 0; j < 32; j++) {
        const float q = nstf_iq4nl_values[iq4_nearest(id * x[j])];
        a += w[j] * q * x[j];
        b += w[j] * q * q;
    }
    *sqx = a, *sq2 = b;
}

/* The best scale of one block of 32 (ggml's quantize_row_iq4_nl_impl for
 * a block): weights w, a first scale from the value of largest magnitude
 * (it maps to the table's -127), then 15 scales (itry - 127) / max, itry
 * = -7..7, the one of least weighted error kept as sum w q x / sum w q^2;
 * 0 for a block of zeros. */
static float iq4_block_scale(const float *x, const float *w) {
    float amax = 0, max = 0;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) amax = fabsf(x[j]), max = x[j];
    if (amax < 1e-15f) return 0;
    float sqx, sq2, d = -max / (float)nstf_iq4nl_values[0];
    iq4_fit(x, w, 1 / d, &sqx, &sq2);
    d = sqx / sq2;
    float best = d * sqx;
    for (int itry = -7; itry <= 7; itry++) {
        iq4_fit(x, w, (float)(itry + nstf_iq4nl_values[0]) / max, &sqx, &sq2);
        if (sq2 > 0 && sqx * sqx > best * sq2) d = sqx / sq2, best = d * sqx;
    }
    return d;
}

/* The weights of one block of 32 of a super-block of sb values: x^2, or
 * with importance weights qw sqrt(s2 + x^2), s2 = 2 / sb sum of the
 * super-block's x^2. */
static void iq4_weights(const float *x, const float *qw, float s2, float *w) {
    for (int j = 0; j < 32; j++) w[j] = qw ? qw[j] * sqrtf(s2 + x[j] * x[j]) : x[j] * x[j];
}

static float iq4_s2(const float *x, int sb) {
    float s2 = 0;
    for (int j = 0; j < sb; j++) s2 += x[j] * x[j];
    return s2 * (2.f / (float)sb);
}

/* The 16 bytes of two nibbles per value of one block of 32 codes. */
static void iq4_pack(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
}

/* IQ4_NL (ggml's quantize_iq4_nl): a block's scale as above, stored fp16;
 * the codes the nearest table values of x / d (d in fp32). */
static void quant_iq4_nl(const float *x, uint8_t *dst, const float *qw) {
    float w[32];
    uint8_t L[32];
    iq4_weights(x, qw, iq4_s2(x, 32), w);
    const float d = iq4_block_scale(x, w);
    f2h(dst, d);
    const float id = d ? 1 / d : 0;
    for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_nearest(id * x[j]);
    iq4_pack(L, dst + 2);
}

/* IQ4_XS (ggml's quantize_iq4_xs): the 8 blocks' scales as above; the
 * super-block's d = -(the scale of largest magnitude) / 32 in fp16, each
 * block's scale as a 6-bit l = nearest(scale / d) in -32..31 (stored l +
 * 32: 4 low bits in scales_l, 2 high bits in scales_h), and its codes the
 * nearest table values of x / (d l). */
static void quant_iq4_xs(const float *x, uint8_t *dst, const float *qw) {
    float w[32], sc[8], max_scale = 0, amax_scale = 0;
    uint8_t L[32];
    const float s2 = iq4_s2(x, 256);
    for (int ib = 0; ib < 8; ib++) {
        iq4_weights(x + 32 * ib, qw ? qw + 32 * ib : NULL, s2, w);
        sc[ib] = iq4_block_scale(x + 32 * ib, w);
        if (fabsf(sc[ib]) > amax_scale) amax_scale = fabsf(sc[ib]), max_scale = sc[ib];
    }
    const float d = -max_scale / 32;
    f2h(dst, d);
    const float id = d ? 1 / d : 0.f;
    uint16_t sh = 0;
    memset(dst + 4, 0, 4);
    for (int ib = 0; ib < 8; ib++) {
        int l = nearest_int(id * sc[ib]);
        l = l < -32 ? -32 : l > 31 ? 31 : l;
        const float dl = d * (float)l, idl = dl ? 1 / dl : 0.f;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)iq4_nearest(idl * x[32 * ib + j]);
        iq4_pack(L, dst + 8 + 16 * ib);
        l += 32;
        dst[4 + ib / 2] |= (uint8_t)((l & 0xf) << (4 * (ib % 2)));
        sh |= (uint16_t)((l >> 4) << (2 * ib));
    }
    dst[2] = (uint8_t)(sh & 0xff), dst[3] = (uint8_t)(sh >> 8);
}

/* A row of IQ4_NL or IQ4_XS, importance weights qw or NULL. */
static void quantize_iq4(nstf_type t, const float *src, uint8_t *dst, int64_t n, const float *qw) {
    const int64_t be = nstf_type_block_elems(t), bb = nstf_type_block_bytes(t);
    for (int64_t i = 0; i < n / be; i++) {
        const float *w = qw ? qw + be * i : NULL;
        if (t == NSTF_TYPE_IQ4_NL) quant_iq4_nl(src + be * i, dst + bb * i, w);
        else quant_iq4_xs(src + be * i, dst + bb * i, w);
    }
}

bool nstf_quantize_row_k(nstf_type t, const float *src, uint8_t *dst, int64_t n) {
    if (t == NSTF_TYPE_IQ4_NL || t == NSTF_TYPE_IQ4_XS) {
        quantize_iq4(t, src, dst, n, NULL);
        return true;
    }
    return quantize_k(t, src, dst, n, NULL);
}

/* Q4_0 / Q4_1 / Q5_0 / Q5_1 with weights (ggml's quantize_row_q4_0_impl
 * ... q5_1_impl): per block of 32 the weights qw sqrt(sigma2 + x^2),
 * sigma2 the row's mean square; the symmetric types by fit_scale_sym
 * (make_qx_quants), the offset ones by fit_scale_min's finer search
 * (make_qkx3_quants). */
static void quantize_32w(nstf_type t, const float *src, uint8_t *dst, int64_t n, const float *qw) {
    float sum_x2 = 0, w[32];
    for (int64_t j = 0; j < n; j++) sum_x2 += src[j] * src[j];
    const float sigma2 = sum_x2 / (float)n;
    const bool five = t == NSTF_TYPE_Q5_0 || t == NSTF_TYPE_Q5_1, offset = t == NSTF_TYPE_Q4_1 || t == NSTF_TYPE_Q5_1;
    const int64_t bb = nstf_type_block_bytes(t);
    for (int64_t i = 0; i < n / 32; i++, dst += bb) {
        const float *x = src + 32 * i;
        uint8_t L[32];
        int q[32];
        for (int j = 0; j < 32; j++) w[j] = qw[32 * i + j] * sqrtf(sigma2 + x[j] * x[j]);
        if (offset) {
            float neg_min;
            f2h(dst, fit_scale_min(32, five ? 31 : 15, x, w, L, &neg_min, -0.9f, 0.05f, 36, false));
            f2h(dst + 2, -neg_min);
        } else {
            f2h(dst, fit_scale_sym(32, five ? 16 : 8, x, L, w));
        }
        uint8_t *qs = dst + (offset ? 4 : 2) + (five ? 4 : 0);
        if (five) {
            for (int j = 0; j < 32; j++) q[j] = L[j];
            nstf_pack_q5(q, dst + (offset ? 4 : 2), qs);
        } else {
            for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | (L[j + 16] << 4));
        }
    }
}

bool nstf_quantize_row_w(nstf_type t, const float *src, void *dst, int64_t n, const float *qw) {
    if (!qw || !nstf_type_can_quantize(t)) return nstf_quantize_row(t, src, dst, n);
    switch (t) {
    case NSTF_TYPE_Q4_0: case NSTF_TYPE_Q4_1: case NSTF_TYPE_Q5_0: case NSTF_TYPE_Q5_1:
        quantize_32w(t, src, dst, n, qw);
        return true;
    case NSTF_TYPE_Q2_K: case NSTF_TYPE_Q3_K: case NSTF_TYPE_Q4_K: case NSTF_TYPE_Q5_K: case NSTF_TYPE_Q6_K:
        return quantize_k(t, src, dst, n, qw);
    case NSTF_TYPE_IQ4_NL: case NSTF_TYPE_IQ4_XS:
        quantize_iq4(t, src, dst, n, qw);
        return true;
    default: return nstf_quantize_row(t, src, dst, n); /* F32, F16, BF16, Q8_0: ggml takes no weights */
    }
}
