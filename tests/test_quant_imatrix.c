/* test_quant_imatrix.c — importance-weighted quantization
 * (nstf_quantize_row_w, core/dtype.h):
 *  - bit for bit against ggml's own quantizer with an importance matrix
 *    (ggml_quantize_chunk with quant_weights, which runs
 *    quantize_row_*_impl) for Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
 *    Q5_K, Q6_K, IQ4_NL, IQ4_XS (tests/data/imatrix_quant_ref.bin, made by
 *    scripts/ref/make_imatrix_quant_ref.py): every block equal;
 *  - without weights it is nstf_quantize_row, byte for byte, and Q8_0
 *    ignores weights (as ggml);
 *  - on synthetic rows (Gaussian values, log-normal column weights, 64
 *    rows of 512), the weighted error sum_j qw_j (x_j - dequant_j)^2 of the
 *    weighted quantizer is at most that of the unweighted one, summed over
 *    the rows, for every weighted type (the point of the weights; the
 *    measured ratios are printed). */
#include <string.h>

#include "core/dtype.h"
#include "test_util.h"

static void test_ggml_ref(const char *path) {
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL, "cannot open %s", path);
    if (!f) return;
    char magic[8], ver[128] = {0};
    uint32_t vlen = 0, n_sec = 0;
    CHECK(fread(magic, 1, 8, f) == 8 && !memcmp(magic, "NSTFIM01", 8), "magic");
    CHECK(fread(&vlen, 4, 1, f) == 1 && vlen < sizeof ver && fread(ver, 1, vlen, f) == vlen, "version");
    CHECK(fread(&n_sec, 4, 1, f) == 1 && n_sec == 11, "11 sections (%u)", n_sec);
    for (uint32_t s = 0; s < n_sec; s++) {
        uint32_t h[4];
        if (fread(h, 4, 4, f) != 4) { CHECK(0, "section %u header", s); break; }
        const nstf_type t = (nstf_type)h[0];
        const uint32_t per_row = h[1], rows = h[2], nbytes = h[3];
        uint64_t rb = 0;
        CHECK(nstf_type_valid(h[0]) && nstf_type_row_bytes(t, per_row, &rb) && rb * rows == nbytes,
              "section %u: type %u, %u x %u values in %u bytes", s, h[0], rows, per_row, nbytes);
        if (rb * rows != nbytes || per_row > 4096 || rows > 64) break;
        float *x = malloc((size_t)rows * per_row * 4), *w = malloc((size_t)per_row * 4);
        uint8_t *q = malloc(nbytes), *mine = malloc(nbytes);
        const bool got = fread(x, 4, (size_t)rows * per_row, f) == (size_t)rows * per_row &&
                         fread(w, 4, per_row, f) == per_row && fread(q, 1, nbytes, f) == nbytes;
        CHECK(got, "section %u truncated", s);
        int64_t bad = 0, first = -1;
        const int64_t bb = nstf_type_block_bytes(t);
        for (uint32_t r = 0; got && r < rows; r++)
            CHECK(nstf_quantize_row_w(t, x + (size_t)r * per_row, mine + r * rb, per_row, w), "%s row %u",
                  nstf_type_name(t), r);
        for (uint32_t i = 0; got && i < nbytes; i += (uint32_t)bb)
            if (memcmp(mine + i, q + i, (size_t)bb)) { bad++; if (first < 0) first = i / bb; }
        CHECK(got && bad == 0, "%s with weights: %lld of %u blocks differ from ggml's (first #%lld)",
              nstf_type_name(t), (long long)bad, nbytes / (uint32_t)bb, (long long)first);
        free(x); free(w); free(q); free(mine);
    }
    fclose(f);
    printf("%s: %u sections (%s)\n", path, n_sec, ver);
}

/* sum_j w_j (x_j - y_j)^2 */
static double werr(const float *x, const float *y, const float *w, int n) {
    double e = 0;
    for (int j = 0; j < n; j++) e += (double)w[j] * ((double)x[j] - y[j]) * ((double)x[j] - y[j]);
    return e;
}

static void test_weighted_error(void) {
    enum { N = 512, ROWS = 64 };
    static const nstf_type types[] = {NSTF_TYPE_Q4_0, NSTF_TYPE_Q4_1, NSTF_TYPE_Q5_0, NSTF_TYPE_Q5_1, NSTF_TYPE_Q2_K,
                                      NSTF_TYPE_Q3_K, NSTF_TYPE_Q4_K, NSTF_TYPE_Q5_K, NSTF_TYPE_Q6_K, NSTF_TYPE_IQ4_NL,
                                      NSTF_TYPE_IQ4_XS};
    test_rng r = {77};
    static float x[ROWS][N], w[N], y[N];
    static uint8_t a[N * 2], b[N * 2];
    for (int j = 0; j < N; j++) w[j] = expf(1.5f * (float)rng_normal(&r));
    for (int i = 0; i < ROWS; i++)
        for (int j = 0; j < N; j++) x[i][j] = (float)rng_normal(&r) * (i % 3 == 0 ? 0.05f : 1.0f);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const nstf_type t = types[k];
        double e_plain = 0, e_weighted = 0;
        bool same_unweighted = true;
        for (int i = 0; i < ROWS; i++) {
            CHECK(nstf_quantize_row(t, x[i], a, N) && nstf_quantize_row_w(t, x[i], b, N, NULL), "%s", nstf_type_name(t));
            uint64_t rb = 0;
            nstf_type_row_bytes(t, N, &rb);
            same_unweighted &= memcmp(a, b, (size_t)rb) == 0;
            nstf_dequantize_row(t, a, y, N);
            e_plain += werr(x[i], y, w, N);
            CHECK(nstf_quantize_row_w(t, x[i], b, N, w), "%s weighted", nstf_type_name(t));
            nstf_dequantize_row(t, b, y, N);
            e_weighted += werr(x[i], y, w, N);
        }
        CHECK(same_unweighted, "%s: no weights = nstf_quantize_row", nstf_type_name(t));
        CHECK(e_weighted <= e_plain, "%s: weighted error %.6g <= unweighted %.6g", nstf_type_name(t), e_weighted,
              e_plain);
        printf("%-5s weighted error / unweighted: %.3f\n", nstf_type_name(t), e_weighted / e_plain);
    }
    /* Q8_0 takes no weights */
    CHECK(nstf_quantize_row(NSTF_TYPE_Q8_0, x[1], a, N) && nstf_quantize_row_w(NSTF_TYPE_Q8_0, x[1], b, N, w) &&
              !memcmp(a, b, N / 32 * 34),
          "Q8_0 ignores the weights");
}

int main(void) {
    test_ggml_ref(NSTF_SOURCE_DIR "/tests/data/imatrix_quant_ref.bin");
    test_weighted_error();
    return test_finish("test_quant_imatrix");
}
