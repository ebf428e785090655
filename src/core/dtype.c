/* dtype.c — type table and scalar reference (de)quantization.
 * The quantizers follow ggml's reference rounding (quantize_row_*_ref). */
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
    {NSTF_TYPE_Q8_0, "Q8_0", NSTF_QK, sizeof(nstf_block_q8_0)},
    {NSTF_TYPE_BF16, "BF16", 1, 2},
};
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
    }
}

void nstf_quantize_row(nstf_type t, const float *src, void *dst, int64_t n) {
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
    }
}
