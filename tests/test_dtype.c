/* test_dtype.c — type table, fp16/bf16 conversions, quantize/dequantize
 * round trips against fp64 with stated tolerances, and bit-exact agreement
 * with gguf-py (tests/data/dequant_ref.bin, made by
 * scripts/ref/make_dequant_ref.py):
 *  - nstf_dequantize_row of every type equals gguf-py's floats bit for bit
 *    on random and adversarial blocks;
 *  - nstf_quantize_row equals gguf-py's bytes bit for bit for every type
 *    gguf-py quantizes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, BF16, F16);
 *  - the K-quant quantizers (Q2_K .. Q6_K), IQ4_NL's and IQ4_XS's (gguf-py has none)
 *    equal ggml's own reference quantizer's bytes bit for bit, and gguf-py's
 *    dequantization of those bytes equals ours (tests/data/kquant_ref.bin,
 *    made by scripts/ref/make_kquant_ref.py).
 * The K-quant quantizers are also held to an error bound relative to each
 * sub-block's stored scale, see test_kquant_bound. */
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
    const int64_t n = 256 * 33; /* whole blocks of 32 and of 256 */
    float *x = malloc(n * 4), *y = malloc(n * 4);
    double *ref = malloc(n * 8);
    for (int64_t i = 0; i < n; i++) { x[i] = rng_normal(&r); ref[i] = x[i]; }
    /* Round-trip NMSE bounds: each is a few times the expected quantization
     * noise of the format on Gaussian data (uniform rounding error of step
     * d: d^2/12 relative to unit variance). */
    struct { nstf_type t; double tol; } cases[] = {
        {NSTF_TYPE_F32, 0.0}, {NSTF_TYPE_F16, 1e-7}, {NSTF_TYPE_BF16, 1e-5},
        {NSTF_TYPE_Q8_0, 1e-4}, {NSTF_TYPE_Q4_0, 2e-2}, {NSTF_TYPE_Q4_1, 2e-2},
        {NSTF_TYPE_Q5_0, 5e-3}, {NSTF_TYPE_Q5_1, 5e-3}, {NSTF_TYPE_Q4_K, 1e-2},
        {NSTF_TYPE_Q5_K, 2.5e-3}, {NSTF_TYPE_Q6_K, 6e-4}, {NSTF_TYPE_Q3_K, 4.5e-2}, {NSTF_TYPE_Q2_K, 0.18},
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
        printf("%s round trip NMSE %.3g (bound %.3g)\n", nstf_type_name(cases[c].t), e, cases[c].tol);
        free(q);
    }
    uint64_t b;
    CHECK(!nstf_type_row_bytes(NSTF_TYPE_Q4_0, 33, &b), "33 is not a multiple of the block");
    CHECK(!nstf_type_row_bytes(NSTF_TYPE_F32, INT64_MAX, &b), "overflow is caught");
    CHECK(!nstf_type_row_bytes(NSTF_TYPE_Q4_K, 32 * 9, &b), "288 is not a multiple of 256");
    CHECK(nstf_type_row_bytes(NSTF_TYPE_Q6_K, 512, &b) && b == 420, "Q6_K row bytes");
    CHECK(!nstf_type_valid(4) && !nstf_type_valid(9) && !nstf_type_valid(15) && !nstf_type_valid(16),
          "removed ids, Q8_1, Q8_K and IQ2 are not valid tensor types");
    CHECK(!nstf_quantize_row((nstf_type)4, x, y, 256), "a removed type id: refused");
    free(x); free(y); free(ref);
}

/* ggml's block sizes and bytes (ggml.c type_traits), by type id. */
static void test_table(void) {
    static const struct { uint32_t id; const char *name; int64_t elems, bytes; } k[] = {
        {0, "F32", 1, 4},        {1, "F16", 1, 2},        {2, "Q4_0", 32, 18},
        {3, "Q4_1", 32, 20},     {6, "Q5_0", 32, 22},     {7, "Q5_1", 32, 24},
        {8, "Q8_0", 32, 34},     {10, "Q2_K", 256, 84},   {11, "Q3_K", 256, 110},
        {12, "Q4_K", 256, 144},  {13, "Q5_K", 256, 176},  {14, "Q6_K", 256, 210},
        {20, "IQ4_NL", 32, 18},  {23, "IQ4_XS", 256, 136}, {30, "BF16", 1, 2},
    };
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++) {
        nstf_type t;
        CHECK(nstf_type_valid(k[i].id), "type %u valid", k[i].id);
        CHECK(!strcmp(nstf_type_name(k[i].id), k[i].name), "name of %u: %s", k[i].id, nstf_type_name(k[i].id));
        CHECK(nstf_type_from_name(k[i].name, &t) && (uint32_t)t == k[i].id, "parse %s", k[i].name);
        CHECK(nstf_type_block_elems((nstf_type)k[i].id) == k[i].elems &&
                  nstf_type_block_bytes((nstf_type)k[i].id) == k[i].bytes,
              "%s block %lld/%lld", k[i].name, (long long)nstf_type_block_elems((nstf_type)k[i].id),
              (long long)nstf_type_block_bytes((nstf_type)k[i].id));
    }
}

/* Every section of a reference file (layout: make_dequant_ref.py); marks
 * the types covered in seen_dq / seen_q [32]. */
static void check_ref_file(const char *path, bool *seen_dq, bool *seen_q) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    char magic[8];
    uint32_t vlen = 0, n_sec = 0;
    char ver[128] = {0};
    CHECK(fread(magic, 1, 8, f) == 8 && !memcmp(magic, "NSTFDQ01", 8), "magic");
    CHECK(fread(&vlen, 4, 1, f) == 1 && vlen < sizeof ver && fread(ver, 1, vlen, f) == vlen, "version");
    CHECK(fread(&n_sec, 4, 1, f) == 1, "section count");
    for (uint32_t s = 0; s < n_sec; s++) {
        uint32_t h[4];
        if (fread(h, 4, 4, f) != 4) { CHECK(0, "section %u header", s); break; }
        uint32_t id = h[0], kind = h[1], n = h[2], nbytes = h[3];
        nstf_type t = (nstf_type)id;
        uint64_t rb = 0;
        CHECK(nstf_type_valid(id) && nstf_type_row_bytes(t, n, &rb) && rb == nbytes,
              "section %u: type %u with %u elements in %u bytes", s, id, n, nbytes);
        uint8_t *q = malloc(nbytes), *mine_q = malloc(nbytes);
        float *v = malloc((size_t)n * 4), *mine = malloc((size_t)n * 4);
        size_t got = kind == 0 ? fread(q, 1, nbytes, f) + fread(v, 4, n, f)
                               : fread(v, 4, n, f) + fread(q, 1, nbytes, f);
        CHECK(got == (size_t)nbytes + n, "section %u truncated", s);
        if (got == (size_t)nbytes + n && rb == nbytes) {
            if (kind == 0) {
                nstf_dequantize_row(t, q, mine, n);
                int64_t diff = 0, first = -1;
                for (uint32_t i = 0; i < n; i++)
                    if (memcmp(&mine[i], &v[i], 4)) { diff++; if (first < 0) first = i; }
                CHECK(diff == 0, "%s: %s dequantization: %lld of %u values differ (first #%lld: %.9g vs %.9g)",
                      path, nstf_type_name(id), (long long)diff, n, (long long)first,
                      first >= 0 ? mine[first] : 0.0, first >= 0 ? v[first] : 0.0);
                if (id < 32) seen_dq[id] = true;
            } else {
                bool ok = nstf_quantize_row(t, v, mine_q, n);
                int64_t bb = nstf_type_block_bytes(t), bad_blocks = 0, first = -1;
                for (uint32_t i = 0; ok && i < nbytes; i += (uint32_t)bb)
                    if (memcmp(mine_q + i, q + i, (size_t)bb)) { bad_blocks++; if (first < 0) first = i / bb; }
                CHECK(ok && bad_blocks == 0, "%s: %s quantization: %lld blocks differ (first #%lld)", path,
                      nstf_type_name(id), (long long)bad_blocks, (long long)first);
                if (id < 32) seen_q[id] = true;
            }
        }
        free(q); free(mine_q); free(v); free(mine);
    }
    fclose(f);
    printf("%s: %u sections (%s)\n", path, n_sec, ver);
}

/* gguf-py's reference (make_dequant_ref.py): every type's dequantization,
 * the quantization of the types gguf-py quantizes; ggml's K-quant
 * quantizers and gguf-py's dequantization of their output
 * (make_kquant_ref.py). */
static void test_gguf_py_ref(void) {
    bool seen_dq[32] = {0}, seen_q[32] = {0}, seen_kdq[32] = {0}, seen_kq[32] = {0};
    check_ref_file(NSTF_SOURCE_DIR "/tests/data/dequant_ref.bin", seen_dq, seen_q);
    check_ref_file(NSTF_SOURCE_DIR "/tests/data/kquant_ref.bin", seen_kdq, seen_kq);
    for (uint32_t id = 10; id <= 14; id++)
        CHECK(seen_kq[id] && seen_kdq[id], "no ggml quantization reference for %s", nstf_type_name(id));
    /* every type was covered, so a regenerated file cannot silently drop one */
    static const uint32_t dq_ids[] = {1, 2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23, 30};
    static const uint32_t q_ids[] = {1, 2, 3, 6, 7, 8, 30};
    for (size_t i = 0; i < sizeof dq_ids / sizeof dq_ids[0]; i++)
        CHECK(seen_dq[dq_ids[i]], "no dequantization reference for %s", nstf_type_name(dq_ids[i]));
    for (size_t i = 0; i < sizeof q_ids / sizeof q_ids[0]; i++)
        CHECK(seen_q[q_ids[i]], "no quantization reference for %s", nstf_type_name(q_ids[i]));
}

/* K-quant quantizers (no gguf-py counterpart): error bounds relative to
 * the stored scales. step(s) = d * sc_s, the quantization step of
 * sub-block s (Q6_K: d * |sc_s|); the block's scale is its largest step.
 *  A. Every super-block, any data: RMS error over the super-block <= 0.5 x
 *     the block's scale. (Rounding alone gives <= 0.5 step; a sub-block
 *     much smaller than the largest one can also clip, by less than its
 *     6-bit scale's rounding, 0.5 d per code unit: far below the bound.)
 *  B. Homogeneous (Gaussian) super-blocks: every sub-block's RMS error
 *     <= 0.5 x its own step (half a step per value without clipping), and
 *     the mean over all sub-blocks <= 0.31 step (uniform rounding error:
 *     1/sqrt(12) = 0.289; measured values are printed).
 * Adversarial super-blocks (A only): all-zero (must come back as zeros),
 * one constant sub-block among small values, one large outlier. */
static void test_kquant_bound(void) {
    /* bounds per type: A (any super-block, x the block's scale), B (each
     * homogeneous sub-block, x its step), mean of B; the same for every
     * K-quant (Q2_K's step: d * its 4-bit scale; Q3_K's: d * |scale - 32|) */
    const struct { nstf_type t; double a, b, mean; } cases[] = {
        {NSTF_TYPE_Q2_K, 0.5, 0.5, 0.31}, {NSTF_TYPE_Q3_K, 0.5, 0.5, 0.31}, {NSTF_TYPE_Q4_K, 0.5, 0.5, 0.31},
        {NSTF_TYPE_Q5_K, 0.5, 0.5, 0.31}, {NSTF_TYPE_Q6_K, 0.5, 0.5, 0.31},
    };
    const int64_t n_blk = 64, n = 256 * n_blk;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc((size_t)n_blk * 210);
    test_rng r = {0xfeed};
    for (int64_t i = 0; i < n; i++) {
        float scale = (i / 256) % 3 == 0 ? 0.02f : (i / 256) % 3 == 1 ? 1.0f : 50.0f;
        x[i] = rng_normal(&r) * scale;
    }
    const int64_t zero_blk = 5, const_blk = 6, outlier_blk = 7;
    for (int64_t i = 0; i < 256; i++) x[zero_blk * 256 + i] = 0.0f;
    for (int64_t i = 0; i < 32; i++) x[const_blk * 256 + i] = 1.5f;
    x[outlier_blk * 256 + 17] = 1000.0f;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        nstf_type t = cases[c].t;
        CHECK(nstf_quantize_row(t, x, q, n), "%s quantize", nstf_type_name(t));
        nstf_dequantize_row(t, q, y, n);
        const int64_t bb = nstf_type_block_bytes(t), sub = t == NSTF_TYPE_Q4_K || t == NSTF_TYPE_Q5_K ? 32 : 16;
        double sum_rel = 0, worst_b = 0, worst_a = 0;
        int64_t n_sub = 0, bad_a = 0, bad_b = 0;
        for (int64_t b = 0; b < n_blk; b++) {
            const uint8_t *blk = q + b * bb;
            const bool adversarial = b == zero_blk || b == const_blk || b == outlier_blk;
            double step[16], max_step = 0, se_blk = 0;
            int8_t sc3[16];
            if (t == NSTF_TYPE_Q3_K) nstf_q3k_scales(blk + 96, sc3);
            for (int64_t s = 0; s < 256 / sub; s++) {
                if (t == NSTF_TYPE_Q6_K) {
                    step[s] = fabs((double)nstf_fp16_to_f32(nstf_load_u16(blk + 208)) * (int8_t)blk[192 + s]);
                } else if (t == NSTF_TYPE_Q3_K) {
                    step[s] = fabs((double)nstf_fp16_to_f32(nstf_load_u16(blk + 108)) * sc3[s]);
                } else if (t == NSTF_TYPE_Q2_K) {
                    step[s] = (double)nstf_fp16_to_f32(nstf_load_u16(blk + 80)) * (blk[s] & 0xF);
                } else {
                    uint8_t sc, m;
                    nstf_k4_scale_min((int)s, blk + 4, &sc, &m);
                    step[s] = (double)nstf_fp16_to_f32(nstf_load_u16(blk)) * sc;
                }
                if (step[s] > max_step) max_step = step[s];
                double se = 0;
                for (int64_t i = 0; i < sub; i++) {
                    double e = (double)y[b * 256 + s * sub + i] - x[b * 256 + s * sub + i];
                    se += e * e;
                }
                se_blk += se;
                if (adversarial) continue;
                double rel = sqrt(se / (double)sub) / step[s];
                bad_b += !(rel <= cases[c].b);
                if (rel > worst_b) worst_b = rel;
                sum_rel += rel;
                n_sub++;
            }
            double rel_a = max_step > 0 ? sqrt(se_blk / 256) / max_step : sqrt(se_blk);
            bad_a += !(rel_a <= cases[c].a);
            if (rel_a > worst_a) worst_a = rel_a;
            if (b == zero_blk) {
                int nz = 0;
                for (int64_t i = 0; i < 256; i++) nz += y[b * 256 + i] != 0.0f;
                CHECK(nz == 0, "%s: an all-zero block dequantizes to %d non-zeros", nstf_type_name(t), nz);
            }
        }
        double mean = sum_rel / (double)n_sub;
        CHECK(bad_a == 0, "%s: %lld super-blocks with RMS error > %.2f x the block's scale (worst %.3f)",
              nstf_type_name(t), (long long)bad_a, cases[c].a, worst_a);
        CHECK(bad_b == 0, "%s: %lld sub-blocks with RMS error > %.2f step (worst %.3f)", nstf_type_name(t),
              (long long)bad_b, cases[c].b, worst_b);
        CHECK(mean <= cases[c].mean, "%s: mean RMS error %.3f step > %.2f", nstf_type_name(t), mean, cases[c].mean);
        printf("%s: RMS error per sub-block %.3f step on average (bound %.2f), worst %.3f (bound %.2f); "
               "per super-block worst %.3f x the block's scale (bound %.2f)\n",
               nstf_type_name(t), mean, cases[c].mean, worst_b, cases[c].b, worst_a, cases[c].a);
    }
    free(x); free(y); free(q);
}

int main(void) {
    test_fp16();
    test_bf16();
    test_quant();
    test_table();
    test_gguf_py_ref();
    test_kquant_bound();
    return test_finish("test_dtype");
}
