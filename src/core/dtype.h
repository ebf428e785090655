/* dtype.h — tensor element types, block layouts and scalar conversions.
 *
 * Type ids are GGUF's (ggml_type) so that a file's type id is used as is.
 * Quantized types store blocks of 32 elements:
 *   Q8_0: { fp16 d; int8  qs[32]; }         x[i] = d * qs[i]            (34 B)
 *   Q4_0: { fp16 d; uint8 qs[16]; }         x[i] = d * (q[i] - 8)       (18 B)
 *   Q4_1: { fp16 d; fp16 m; uint8 qs[16]; } x[i] = d * q[i] + m         (20 B)
 * where for Q4_x element j < 16 is the low nibble of qs[j] and element
 * j + 16 is its high nibble (ggml's layout). */
#ifndef NSTF_CORE_DTYPE_H
#define NSTF_CORE_DTYPE_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

typedef enum nstf_type {
    NSTF_TYPE_F32 = 0,
    NSTF_TYPE_F16 = 1,
    NSTF_TYPE_Q4_0 = 2,
    NSTF_TYPE_Q4_1 = 3,
    NSTF_TYPE_Q8_0 = 8,
    NSTF_TYPE_BF16 = 30,
} nstf_type;

#define NSTF_QK 32 /* elements per quantized block */

typedef struct { uint16_t d; int8_t qs[NSTF_QK]; } nstf_block_q8_0;
typedef struct { uint16_t d; uint8_t qs[NSTF_QK / 2]; } nstf_block_q4_0;
typedef struct { uint16_t d, m; uint8_t qs[NSTF_QK / 2]; } nstf_block_q4_1;
_Static_assert(sizeof(nstf_block_q8_0) == 34, "Q8_0 block is 34 bytes");
_Static_assert(sizeof(nstf_block_q4_0) == 18, "Q4_0 block is 18 bytes");
_Static_assert(sizeof(nstf_block_q4_1) == 20, "Q4_1 block is 20 bytes");

/* True for the six types the engine supports. */
bool nstf_type_valid(uint32_t type_id);
/* "F32", "Q4_1", ...; "?" for an unknown id. */
const char *nstf_type_name(uint32_t type_id);
/* Parse a name (case-insensitive). Returns false if unknown. */
bool nstf_type_from_name(const char *name, nstf_type *out);
/* Elements per block (1 for float types, 32 for quantized). */
int64_t nstf_type_block_elems(nstf_type t);
/* Bytes per block. */
int64_t nstf_type_block_bytes(nstf_type t);
/* Bytes of `n` elements; false if n is not a multiple of the block size or
 * the product overflows. */
bool nstf_type_row_bytes(nstf_type t, int64_t n, uint64_t *out);

/* IEEE half <-> float, round-to-nearest-even. */
static inline float nstf_fp16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: renormalize */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400)) { mant <<= 1; exp--; }
            mant &= 0x3ff;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
uint16_t nstf_f32_to_fp16(float f);

/* A 16-bit value at any address. Tensor data in a GGUF file need only be
 * 1-byte aligned (general.alignment may be 1), so block fields are read
 * through byte pointers, never through a block struct pointer. */
static inline uint16_t nstf_load_u16(const void *p) {
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

/* bfloat16 <-> float; float->bf16 rounds to nearest even, NaN stays NaN. */
static inline float nstf_bf16_to_f32(uint16_t b) {
    uint32_t bits = (uint32_t)b << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static inline uint16_t nstf_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (uint16_t)(bits >> 16);
}

/* Reference (scalar) conversions of `n` elements; n must be a multiple of
 * the type's block size. quantize follows ggml's rounding so that files we
 * write are read identically by other engines. */
void nstf_dequantize_row(nstf_type t, const void *src, float *dst, int64_t n);
void nstf_quantize_row(nstf_type t, const float *src, void *dst, int64_t n);

#endif
