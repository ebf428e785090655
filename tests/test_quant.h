/* test_quant.h — weights of any stored type for the tests: rows quantized
 * with the reference quantizer where core/dtype.h has one, and random
 * codes under sane scales for the types without (Q2_K, Q3_K, IQ4_NL,
 * IQ4_XS: every code pattern is a valid block; the fp16 scale fields get
 * values in [0.002, 0.022] so products stay far from overflow). C and C++
 * (the GPU tests include it too). */
#ifndef NSTF_TEST_QUANT_H
#define NSTF_TEST_QUANT_H

#include <stdint.h>
#include <string.h>

#include "core/dtype.h"
#include "test_util.h"

/* Random codes for `bytes` bytes of whole blocks of type t, with sane fp16
 * scales (and, for Q2_K, mins). */
static inline void test_random_blocks(nstf_type t, uint8_t *w, uint64_t bytes, test_rng *rng) {
    int off[2] = {-1, -1};
    switch (t) {
    case NSTF_TYPE_Q2_K: off[0] = 80; off[1] = 82; break;
    case NSTF_TYPE_Q3_K: off[0] = 108; break;
    default: off[0] = 0; break; /* IQ4_NL, IQ4_XS */
    }
    const int64_t bb = nstf_type_block_bytes(t);
    for (uint64_t i = 0; i < bytes; i++) w[i] = (uint8_t)(rng_next(rng) >> 56);
    for (uint64_t b = 0; b + (uint64_t)bb <= bytes; b += (uint64_t)bb)
        for (int k = 0; k < 2; k++)
            if (off[k] >= 0) {
                uint16_t h = nstf_f32_to_fp16(0.002f + 0.01f * (rng_uniform(rng) + 1.0f));
                memcpy(w + b + off[k], &h, 2);
            }
}

/* One row of n values (src) as type t into dst: F32/F16/BF16 converted,
 * the reference quantizer where there is one, else random blocks. */
static inline void test_quantize_row(nstf_type t, const float *src, uint8_t *dst, int64_t n, test_rng *rng) {
    uint64_t rb = 0;
    (void)nstf_type_row_bytes(t, n, &rb);
    if (t == NSTF_TYPE_F32) {
        memcpy(dst, src, (size_t)n * 4);
    } else if (t == NSTF_TYPE_F16 || t == NSTF_TYPE_BF16) {
        for (int64_t i = 0; i < n; i++) {
            const uint16_t h = t == NSTF_TYPE_F16 ? nstf_f32_to_fp16(src[i]) : nstf_f32_to_bf16(src[i]);
            memcpy(dst + 2 * i, &h, 2);
        }
    } else if (nstf_type_can_quantize(t)) {
        nstf_quantize_row(t, src, dst, n);
    } else {
        test_random_blocks(t, dst, rb, rng);
    }
}

#endif
