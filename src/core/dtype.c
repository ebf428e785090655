/* dtype.c — type table, fp16 conversion and the scalar reference
 * (de)quantization of the float types and the 32-element block types; the
 * 256-element K-quants live in dtype_k.c. The quantizers follow ggml's
 * reference rounding (quantize_row_*_ref); tests/test_dtype.c checks both
 * directions bit for bit against gguf-py. */
#include "core/dtype.h"

#include <math.h>
#include <strings.h>

#include "core/mem.h"

typedef struct { nstf_type t; const char *name; int64_t elems, bytes; } type_info;
static const type_info k_types[] = {
    {NSTF_TYPE_F32, "F32", 1, 4},
    {NSTF_TYPE_F16, "F16", 1, 2},
    {NSTF_TYPE_Q4_0, "Q4_0", NSTF_QK, sizeof(nstf_block_q4_0)},
    {NSTF_TYPE_Q4_1, "Q4_1", NSTF_QK, sizeof(nstf_block_q4_1)},
    {NSTF_TYPE_Q5_0, "Q5_0", NSTF_QK, 22},
    {NSTF_TYPE_Q5_1, "Q5_1", NSTF_QK, 24},
    {NSTF_TYPE_Q8_0, "Q8_0", NSTF_QK, sizeof(nstf_block_q8_0)},
    {NSTF_TYPE_Q2_K, "Q2_K", NSTF_QK_K, 84},
    {NSTF_TYPE_Q3_K, "Q3_K", NSTF_QK_K, 110},
    {NSTF_TYPE_Q4_K, "Q4_K", NSTF_QK_K, 144},
    {NSTF_TYPE_Q5_K, "Q5_K", NSTF_QK_K, 176},
    {NSTF_TYPE_Q6_K, "Q6_K", NSTF_QK_K, 210},
    {NSTF_TYPE_IQ4_NL, "IQ4_NL", NSTF_QK, 18},
    {NSTF_TYPE_IQ4_XS, "IQ4_XS", NSTF_QK_K, 136},
    {NSTF_TYPE_BF16, "BF16", 1, 2},
};

const int8_t nstf_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                      1,    13,   25,  38,  53,  69,  89,  113};
#define N_TYPES (sizeof k_types / sizeof k_types[0])

static const type_info *find(uint32_t id) {
    for (size_t i = 0; i < N_TYPES; i++)
        if ((uint32_t)k_types[i].t == id) return &k_types[i];
    return NULL;
}

bool nstf_type_valid(uint32_t id) { return find(id) != NULL; }
const char *nstf_type_name(uint32_t id) {
    const type_info *ti = find(id);
    return ti ? ti->name : "?";
}
bool nstf_type_from_name(const char *name, nstf_type *out) {
    for (size_t i = 0; i < N_TYPES; i++)
        if (strcasecmp(name, k_types[i].name) == 0) {
            *out = k_types[i].t;
            return true;
        }
    return false;
}
int64_t nstf_type_block_elems(nstf_type t) {
    const type_info *ti = find((uint32_t)t);
    return ti ? ti->elems : 0;
}
int64_t nstf_type_block_bytes(nstf_type t) {
    const type_info *ti = find((uint32_t)t);
    return ti ? ti->bytes : 0;
}
bool nstf_type_row_bytes(nstf_type t, int64_t n, uint64_t *out) {
    const type_info *ti = find((uint32_t)t);
    if (!ti || n < 0 || n % ti->elems != 0) return false;
    return nstf_mul_ok((uint64_t)(n / ti->elems), (uint64_t)ti->bytes, out);
}
bool nstf_type_is_quantized(nstf_type t) {
    return nstf_type_valid((uint32_t)t) && t != NSTF_TYPE_F32 && t != NSTF_TYPE_F16 &&
           t != NSTF_TYPE_BF16;
}
bool nstf_type_can_quantize(nstf_type t) {
    return nstf_type_valid((uint32_t)t);
}

uint16_t nstf_f32_to_fp16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t absx = x & 0x7fffffffu;
    if (absx > 0x7f800000u) return (uint16_t)(sign | 0x7e00); /* NaN */
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* overflow -> inf */
    if (absx < 0x38800000u) {                                  /* subnormal or zero */
        if (absx < 0x33000000u) return (uint16_t)sign;
        /* value = m * 2^(e-150); the half subnormal unit is 2^-24, so
         * q = m >> (126 - e), rounded to nearest even. */
        uint32_t e = absx >> 23, m = (absx & 0x7fffff) | 0x800000;
        uint32_t sh = 126 - e;
        uint32_t q = m >> sh, rem = m & ((1u << sh) - 1), halfway = 1u << (sh - 1);
        if (rem > halfway || (rem == halfway && (q & 1))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t e = (absx >> 23) - 127 + 15, m = absx & 0x7fffff;
    uint32_t h = (e << 10) | (m >> 13), rem = m & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into exponent: correct */
    return (uint16_t)(sign | h);
}

void nstf_dequantize_row(nstf_type t, const void *src, float *dst, int64_t n) {
    /* byte pointers throughout: src may have any alignment (see nstf_load_u16) */
    const uint8_t *p = src;
    switch (t) {
    case NSTF_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case NSTF_TYPE_F16:
        for (int64_t i = 0; i < n; i++) dst[i] = nstf_fp16_to_f32(nstf_load_u16(p + 2 * i));
        break;
    case NSTF_TYPE_BF16:
        for (int64_t i = 0; i < n; i++) dst[i] = nstf_bf16_to_f32(nstf_load_u16(p + 2 * i));
        break;
    case NSTF_TYPE_Q8_0:
        for (int64_t i = 0; i < n / NSTF_QK; i++, p += sizeof(nstf_block_q8_0)) {
            float d = nstf_fp16_to_f32(nstf_load_u16(p));
            const int8_t *qs = (const int8_t *)(p + 2);
            for (int j = 0; j < NSTF_QK; j++) dst[i * NSTF_QK + j] = d * qs[j];
        }
        break;
    case NSTF_TYPE_Q4_0:
        for (int64_t i = 0; i < n / NSTF_QK; i++, p += sizeof(nstf_block_q4_0)) {
            float d = nstf_fp16_to_f32(nstf_load_u16(p));
            const uint8_t *qs = p + 2;
            for (int j = 0; j < NSTF_QK / 2; j++) {
                dst[i * NSTF_QK + j] = d * ((qs[j] & 0x0f) - 8);
                dst[i * NSTF_QK + j + 16] = d * ((qs[j] >> 4) - 8);
            }
        }
        break;
    case NSTF_TYPE_Q4_1:
        for (int64_t i = 0; i < n / NSTF_QK; i++, p += sizeof(nstf_block_q4_1)) {
            float d = nstf_fp16_to_f32(nstf_load_u16(p)), m = nstf_fp16_to_f32(nstf_load_u16(p + 2));
            const uint8_t *qs = p + 4;
            for (int j = 0; j < NSTF_QK / 2; j++) {
                dst[i * NSTF_QK + j] = d * (qs[j] & 0x0f) + m;
                dst[i * NSTF_QK + j + 16] = d * (qs[j] >> 4) + m;
            }
        }
        break;
    case NSTF_TYPE_Q5_0:
    case NSTF_TYPE_Q5_1: {
        const bool q51 = t == NSTF_TYPE_Q5_1;
        const int bb = q51 ? 24 : 22;
        for (int64_t i = 0; i < n / NSTF_QK; i++, p += bb) {
            float d = nstf_fp16_to_f32(nstf_load_u16(p));
            float m = q51 ? nstf_fp16_to_f32(nstf_load_u16(p + 2)) : 0.0f;
            uint32_t qh;
            memcpy(&qh, p + (q51 ? 4 : 2), 4);
            const uint8_t *qs = p + (q51 ? 8 : 6);
            for (int j = 0; j < NSTF_QK / 2; j++) {
                int q0 = (qs[j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
                int q1 = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
                if (q51) {
                    dst[i * NSTF_QK + j] = d * (float)q0 + m;
                    dst[i * NSTF_QK + j + 16] = d * (float)q1 + m;
                } else {
                    dst[i * NSTF_QK + j] = d * (float)(q0 - 16);
                    dst[i * NSTF_QK + j + 16] = d * (float)(q1 - 16);
                }
            }
        }
    } break;
    case NSTF_TYPE_IQ4_NL:
        for (int64_t i = 0; i < n / NSTF_QK; i++, p += 18) {
            float d = nstf_fp16_to_f32(nstf_load_u16(p));
            const uint8_t *qs = p + 2;
            for (int j = 0; j < NSTF_QK / 2; j++) {
                dst[i * NSTF_QK + j] = d * (float)nstf_iq4nl_values[qs[j] & 0x0f];
                dst[i * NSTF_QK + j + 16] = d * (float)nstf_iq4nl_values[qs[j] >> 4];
            }
        }
        break;
    default: nstf_dequantize_row_k(t, p, dst, n); break;
    }
}

void nstf_pack_q5(const int q[NSTF_QK], uint8_t *qh_out, uint8_t *qs) {
    uint32_t qh = 0;
    for (int j = 0; j < NSTF_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
        qh |= ((uint32_t)(q[j] >> 4) & 1) << j;
        qh |= ((uint32_t)(q[j + 16] >> 4) & 1) << (j + 16);
    }
    memcpy(qh_out, &qh, 4);
}

bool nstf_quantize_row(nstf_type t, const float *src, void *dst, int64_t n) {
    if (!nstf_type_can_quantize(t)) return false;
    switch (t) {
    case NSTF_TYPE_F32: memcpy(dst, src, (size_t)n * 4); break;
    case NSTF_TYPE_F16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nstf_f32_to_fp16(src[i]);
    } break;
    case NSTF_TYPE_BF16: {
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++) d[i] = nstf_f32_to_bf16(src[i]);
    } break;
    case NSTF_TYPE_Q8_0: {
        nstf_block_q8_0 *b = dst;
        for (int64_t i = 0; i < n / NSTF_QK; i++) {
            const float *x = src + i * NSTF_QK;
            float amax = 0.0f;
            for (int j = 0; j < NSTF_QK; j++) amax = fmaxf(amax, fabsf(x[j]));
            float d = amax / 127.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = nstf_f32_to_fp16(d);
            for (int j = 0; j < NSTF_QK; j++) b[i].qs[j] = (int8_t)roundf(x[j] * id);
        }
    } break;
    case NSTF_TYPE_Q4_0: {
        nstf_block_q4_0 *b = dst;
        for (int64_t i = 0; i < n / NSTF_QK; i++) {
            const float *x = src + i * NSTF_QK;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < NSTF_QK; j++)
                if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
            float d = max / -8.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = nstf_f32_to_fp16(d);
            for (int j = 0; j < NSTF_QK / 2; j++) {
                int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
                q0 = q0 > 15 ? 15 : q0;
                q1 = q1 > 15 ? 15 : q1;
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
    } break;
    case NSTF_TYPE_Q4_1: {
        nstf_block_q4_1 *b = dst;
        for (int64_t i = 0; i < n / NSTF_QK; i++) {
            const float *x = src + i * NSTF_QK;
            float min = x[0], max = x[0];
            for (int j = 1; j < NSTF_QK; j++) { min = fminf(min, x[j]); max = fmaxf(max, x[j]); }
            float d = (max - min) / 15.0f, id = d ? 1.0f / d : 0.0f;
            b[i].d = nstf_f32_to_fp16(d);
            b[i].m = nstf_f32_to_fp16(min);
            for (int j = 0; j < NSTF_QK / 2; j++) {
                int q0 = (int)((x[j] - min) * id + 0.5f), q1 = (int)((x[j + 16] - min) * id + 0.5f);
                q0 = q0 > 15 ? 15 : q0;
                q1 = q1 > 15 ? 15 : q1;
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
    } break;
    case NSTF_TYPE_Q5_0: { /* ggml quantize_row_q5_0_ref: d = max / -16, q = trunc(x/d + 16.5) */
        uint8_t *b = dst;
        for (int64_t i = 0; i < n / NSTF_QK; i++, b += 22) {
            const float *x = src + i * NSTF_QK;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < NSTF_QK; j++)
                if (fabsf(x[j]) > amax) { amax = fabsf(x[j]); max = x[j]; }
            float d = max / -16.0f, id = d ? 1.0f / d : 0.0f;
            uint16_t dh = nstf_f32_to_fp16(d);
            memcpy(b, &dh, 2);
            int q[NSTF_QK];
            for (int j = 0; j < NSTF_QK; j++) {
                int v = (int)(int8_t)(x[j] * id + 16.5f);
                q[j] = v > 31 ? 31 : v;
            }
            nstf_pack_q5(q, b + 2, b + 6);
        }
    } break;
    case NSTF_TYPE_Q5_1: { /* ggml quantize_row_q5_1_ref: d = (max - min) / 31 */
        uint8_t *b = dst;
        for (int64_t i = 0; i < n / NSTF_QK; i++, b += 24) {
            const float *x = src + i * NSTF_QK;
            float min = x[0], max = x[0];
            for (int j = 1; j < NSTF_QK; j++) { min = fminf(min, x[j]); max = fmaxf(max, x[j]); }
            float d = (max - min) / 31.0f, id = d ? 1.0f / d : 0.0f;
            uint16_t dh = nstf_f32_to_fp16(d), mh = nstf_f32_to_fp16(min);
            memcpy(b, &dh, 2);
            memcpy(b + 2, &mh, 2);
            int q[NSTF_QK];
            for (int j = 0; j < NSTF_QK; j++) {
                int v = (int)((x[j] - min) * id + 0.5f);
                q[j] = v > 31 ? 31 : v;
            }
            nstf_pack_q5(q, b + 4, b + 8);
        }
    } break;
    default: return nstf_quantize_row_k(t, src, dst, n);
    }
    return true;
}
