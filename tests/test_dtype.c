/* test_dtype.c — type table, fp16/bf16 conversions, quantize/dequantize
 * round trips against fp64 with stated tolerances. */
#include "core/dtype.h"
#include "test_util.h"

static void test_fp16(void) {
    /* every half value converts to float and back exactly (NaNs stay NaN) */
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = nstf_fp16_to_f32((uint16_t)h);
        uint16_t back = nstf_f32_to_fp16(f);
        if (isnan(f) ? !isnan(nstf_fp16_to_f32(back)) : back != h) bad++;
    }
    CHECK(bad == 0, "%d half values do not round-trip", bad);
    CHECK(nstf_f32_to_fp16(65520.0f) == 0x7c00, "65520 rounds to inf");
    CHECK(nstf_f32_to_fp16(65504.0f) == 0x7bff, "max half");
    CHECK(nstf_f32_to_fp16(1.0f + 1.0f / 2048) == 0x3c00, "tie rounds to even");
    CHECK(nstf_f32_to_fp16(5.9604645e-08f) == 0x0001, "smallest subnormal");
    CHECK(nstf_f32_to_fp16(2.9802322e-08f) == 0x0000, "half of smallest subnormal ties to 0");
}

static void test_bf16(void) {
    CHECK(nstf_f32_to_bf16(1.0f) == 0x3f80, "1.0");
    CHECK(nstf_bf16_to_f32(0x3f80) == 1.0f, "1.0 back");
    CHECK(nstf_f32_to_bf16(1.00390625f) == 0x3f80, "tie to even down");
    CHECK(nstf_f32_to_bf16(1.01171875f) == 0x3f82, "tie to even up");
    CHECK(isnan(nstf_bf16_to_f32(nstf_f32_to_bf16(NAN))), "NaN stays NaN");
}

static void test_quant(void) {
    test_rng r = {0x1234567};
    const int64_t n = 32 * 257;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    double *ref = malloc(n * 8);
    for (int64_t i = 0; i < n; i++) { x[i] = rng_normal(&r); ref[i] = x[i]; }
    /* Round-trip NMSE bounds: each is a few times the expected quantization
     * noise of the format on Gaussian data (uniform rounding error of step
     * d: d^2/12 relative to unit variance). */
    struct { nstf_type t; double tol; } cases[] = {
        {NSTF_TYPE_F32, 0.0}, {NSTF_TYPE_F16, 1e-7}, {NSTF_TYPE_BF16, 1e-5},
        {NSTF_TYPE_Q8_0, 1e-4}, {NSTF_TYPE_Q4_0, 2e-2}, {NSTF_TYPE_Q4_1, 2e-2},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        uint64_t bytes;
        CHECK(nstf_type_row_bytes(cases[c].t, n, &bytes), "row bytes %s", nstf_type_name(cases[c].t));
        void *q = malloc(bytes);
        nstf_quantize_row(cases[c].t, x, q, n);
        nstf_dequantize_row(cases[c].t, q, y, n);
        /* the same bytes at an odd address (a GGUF with general.alignment 1)
         * dequantize identically; the sanitizer build checks the reads */
        unsigned char *odd = malloc(bytes + 1);
        float *y2 = malloc(n * 4);
        memcpy(odd + 1, q, bytes);
        nstf_dequantize_row(cases[c].t, odd + 1, y2, n);
        CHECK(memcmp(y, y2, (size_t)n * 4) == 0, "%s: unaligned dequantization differs", nstf_type_name(cases[c].t));
        free(odd);
        free(y2);
        double e = nmse(y, ref, n);
        CHECK(e <= cases[c].tol, "%s round trip NMSE %.3g > %.3g", nstf_type_name(cases[c].t), e, cases[c].tol);
        free(q);
    }
    uint64_t b;
    CHECK(!nstf_type_row_bytes(NSTF_TYPE_Q4_0, 33, &b), "33 is not a multiple of the block");
    CHECK(!nstf_type_row_bytes(NSTF_TYPE_F32, INT64_MAX, &b), "overflow is caught");
    CHECK(!nstf_type_valid(7) && !nstf_type_valid(12), "K-quants and removed ids are not valid");
    free(x); free(y); free(ref);
}

int main(void) {
    test_fp16();
    test_bf16();
    test_quant();
    return test_finish("test_dtype");
}
