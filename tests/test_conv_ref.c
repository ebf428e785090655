/* test_conv_ref.c — the conv2d references (ops/conv.h) against PyTorch.
 *
 * tests/data/conv2d_ref.txt (scripts/ref/make_conv_ref.py; torch's fp64
 * F.conv2d on ragged cases: odd sizes, stride 2, dilation 2, groups,
 * depthwise, 1x1, 7x7, asymmetric stride/padding, with and without bias):
 *   1. nstf_ref_conv2d in NCHW: max |y - torch| <= 1e-12 (both fp64; only
 *      the summation order differs: observed ~1e-15);
 *   2. the same case laid out in NHWC (x, y channels last, w [k][r][s][c/g]):
 *      the same bound after transposing back;
 *   3. nstf_ref_conv2d_f32 (the naive fp32 loop) in both layouts: NMSE
 *      against torch <= 1e-7, the fp32 bound of CONVENTIONS.md;
 * and the descriptor's checks: output sizes of known layers (ResNet-50's
 * stem 224 -> 112, a stride-2 3x3 56 -> 28), FLOPs, and every invalid
 * descriptor refused with a message (zero or negative sizes, groups not
 * dividing the channels, a dilated filter larger than the padded input,
 * sizes whose product overflows). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/conv.h"
#include "test_util.h"

#define REF NSTF_SOURCE_DIR "/tests/data/conv2d_ref.txt"

/* Reads "tag v v v ..." into a new array; returns the count or -1. */
static int64_t read_values(FILE *f, const char *tag, double **out) {
    char t[8];
    if (fscanf(f, " %7s", t) != 1 || strcmp(t, tag) != 0) return -1;
    int64_t cap = 1024, n = 0;
    double *v = malloc((size_t)cap * sizeof *v);
    int ch;
    while (v && (ch = fgetc(f)) != EOF && ch != '\n') {
        if (ch == ' ') continue;
        ungetc(ch, f);
        if (n == cap) {
            double *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v);
            if (!nv) break;
            v = nv;
        }
        if (fscanf(f, "%lf", &v[n]) != 1) break;
        n++;
    }
    *out = v;
    return n;
}

static float *to_f32(const double *v, int64_t n) {
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++) f[i] = (float)v[i];
    return f;
}

/* NCHW -> NHWC of [n][c][h][w] (and [k][cg][r][s] -> [k][r][s][cg]) */
static void nchw_to_nhwc(const float *src, float *dst, int64_t n, int64_t c, int64_t h, int64_t w) {
    for (int64_t a = 0; a < n; a++)
        for (int64_t ci = 0; ci < c; ci++)
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) dst[((a * h + y) * w + x) * c + ci] = src[((a * c + ci) * h + y) * w + x];
}

static void check_case(FILE *f, int *n_cases) {
    char name[64];
    long long v[15];
    if (fscanf(f, " %63s", name) != 1) return;
    for (int i = 0; i < 15; i++)
        if (fscanf(f, "%lld", &v[i]) != 1) {
            CHECK(0, "case %s: bad header", name);
            return;
        }
    nstf_conv2d_desc d = {v[0], v[1], v[2], v[3], v[4], v[5], v[6], (int)v[7], (int)v[8], (int)v[9], (int)v[10],
                          (int)v[11], (int)v[12], (int)v[13], NSTF_CONV_NCHW};
    const bool has_bias = v[14] != 0;
    double *xd = NULL, *wd = NULL, *bd = NULL, *yd = NULL;
    int64_t nx = read_values(f, "x", &xd), nw = read_values(f, "w", &wd);
    int64_t nb = has_bias ? read_values(f, "b", &bd) : 0, ny = read_values(f, "y", &yd);
    int64_t ex, ew, ey, P = 0, Q = 0;
    CHECK(nstf_conv2d_out_size(&d, &P, &Q) == NSTF_OK, "case %s: %s", name, nstf_last_error());
    nstf_conv2d_sizes(&d, &ex, &ew, &ey);
    CHECK(nx == ex && nw == ew && ny == ey && nb == (has_bias ? d.k : 0), "case %s: sizes %lld %lld %lld", name,
          (long long)nx, (long long)nw, (long long)ny);
    if (nx != ex || nw != ew || ny != ey) goto done;
    {
        float *x = to_f32(xd, nx), *w = to_f32(wd, nw), *b = has_bias ? to_f32(bd, nb) : NULL;
        float *xh = malloc((size_t)nx * sizeof *xh), *wh = malloc((size_t)nw * sizeof *wh);
        double *y = malloc((size_t)ny * sizeof *y), *yh = malloc((size_t)ny * sizeof *yh);
        float *yf = malloc((size_t)ny * sizeof *yf), *yhf = malloc((size_t)ny * sizeof *yhf);
        float *tmp = malloc((size_t)ny * sizeof *tmp);
        /* 1. NCHW */
        CHECK(nstf_ref_conv2d(&d, x, w, b, y) == NSTF_OK, "%s", nstf_last_error());
        double md = 0;
        for (int64_t i = 0; i < ny; i++) md = fmax(md, fabs(y[i] - yd[i]));
        CHECK(md <= 1e-12, "case %s NCHW: max |diff| %.3g", name, md);
        /* 2. NHWC */
        nstf_conv2d_desc dh = d;
        dh.layout = NSTF_CONV_NHWC;
        nchw_to_nhwc(x, xh, d.n, d.c, d.h, d.w);
        nchw_to_nhwc(w, wh, d.k, d.c / d.groups, d.r, d.s);
        CHECK(nstf_ref_conv2d(&dh, xh, wh, b, yh) == NSTF_OK, "%s", nstf_last_error());
        double mh = 0;
        for (int64_t a = 0; a < d.n; a++)
            for (int64_t k = 0; k < d.k; k++)
                for (int64_t p = 0; p < P; p++)
                    for (int64_t q = 0; q < Q; q++)
                        mh = fmax(mh, fabs(yh[((a * P + p) * Q + q) * d.k + k] - yd[((a * d.k + k) * P + p) * Q + q]));
        CHECK(mh <= 1e-12, "case %s NHWC: max |diff| %.3g", name, mh);
        /* 3. the naive fp32 loop, both layouts */
        CHECK(nstf_ref_conv2d_f32(&d, x, w, b, yf) == NSTF_OK, "%s", nstf_last_error());
        CHECK(nstf_ref_conv2d_f32(&dh, xh, wh, b, yhf) == NSTF_OK, "%s", nstf_last_error());
        for (int64_t a = 0; a < d.n; a++)
            for (int64_t k = 0; k < d.k; k++)
                for (int64_t pq = 0; pq < P * Q; pq++) tmp[(a * d.k + k) * P * Q + pq] = yhf[(a * P * Q + pq) * d.k + k];
        const double e1 = nmse(yf, yd, ny), e2 = nmse(tmp, yd, ny);
        CHECK(e1 <= 1e-7 && e2 <= 1e-7, "case %s fp32: NMSE %.3g (NCHW) %.3g (NHWC)", name, e1, e2);
        (*n_cases)++;
        free(x), free(w), free(b), free(xh), free(wh), free(y), free(yh), free(yf), free(yhf), free(tmp);
    }
done:
    free(xd), free(wd), free(bd), free(yd);
}

static void check_descriptors(void) {
    int64_t P = 0, Q = 0;
    nstf_conv2d_desc stem = {32, 3, 224, 224, 64, 7, 7, 2, 2, 3, 3, 1, 1, 1, NSTF_CONV_NHWC};
    CHECK(nstf_conv2d_out_size(&stem, &P, &Q) == NSTF_OK && P == 112 && Q == 112, "stem %lldx%lld", (long long)P,
          (long long)Q);
    CHECK(nstf_conv2d_flops(&stem) == 2.0 * 32 * 64 * 112 * 112 * 3 * 49, "stem flops %.6g", nstf_conv2d_flops(&stem));
    nstf_conv2d_desc s2 = {1, 128, 56, 56, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1, NSTF_CONV_NCHW};
    CHECK(nstf_conv2d_out_size(&s2, &P, &Q) == NSTF_OK && P == 28 && Q == 28, "s2 %lldx%lld", (long long)P, (long long)Q);
    nstf_conv2d_desc dw = {1, 8, 9, 9, 8, 3, 3, 1, 1, 2, 2, 2, 2, 8, NSTF_CONV_NCHW};
    CHECK(nstf_conv2d_out_size(&dw, &P, &Q) == NSTF_OK && P == 9 && Q == 9, "dilated %lldx%lld", (long long)P,
          (long long)Q);
    CHECK(nstf_conv2d_flops(&dw) == 2.0 * 8 * 81 * 9, "depthwise flops %.6g", nstf_conv2d_flops(&dw));

    struct {
        const char *what;
        nstf_conv2d_desc d;
    } bad[] = {
        {"zero batch", {0, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, NSTF_CONV_NCHW}},
        {"negative width", {1, 3, 8, -8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, NSTF_CONV_NCHW}},
        {"zero stride", {1, 3, 8, 8, 4, 3, 3, 0, 1, 1, 1, 1, 1, 1, NSTF_CONV_NCHW}},
        {"zero dilation", {1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 0, 1, 1, NSTF_CONV_NCHW}},
        {"negative padding", {1, 3, 8, 8, 4, 3, 3, 1, 1, -1, 1, 1, 1, 1, NSTF_CONV_NCHW}},
        {"groups not dividing c", {1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 2, NSTF_CONV_NCHW}},
        {"groups not dividing k", {1, 4, 8, 8, 3, 3, 3, 1, 1, 1, 1, 1, 1, 2, NSTF_CONV_NCHW}},
        {"filter past the padded input", {1, 3, 4, 4, 4, 3, 3, 1, 1, 0, 0, 2, 2, 1, NSTF_CONV_NCHW}},
        {"unknown layout", {1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, (nstf_conv_layout)7}},
        {"overflow", {1 << 30, 1 << 20, 1 << 20, 1 << 20, 4, 1, 1, 1, 1, 0, 0, 1, 1, 1, NSTF_CONV_NCHW}},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        nstf_status st = nstf_conv2d_out_size(&bad[i].d, &P, &Q);
        CHECK(st != NSTF_OK && strstr(nstf_last_error(), "conv2d") != NULL, "%s accepted (%s)", bad[i].what,
              nstf_last_error());
        CHECK(nstf_conv2d_flops(&bad[i].d) == 0.0, "%s: flops of an invalid descriptor", bad[i].what);
    }
    CHECK(nstf_ref_conv2d(&bad[0].d, (const float *)&P, (const float *)&P, NULL, (double *)&P) != NSTF_OK,
          "the reference ran an invalid descriptor");
    CHECK(nstf_conv2d_levels() == 5 && strstr(nstf_conv2d_level_name(4), "implicit GEMM") &&
              strcmp(nstf_conv2d_level_name(5), "unknown level") == 0,
          "level names");
}

int main(void) {
    FILE *f = fopen(REF, "r");
    if (!f) {
        fprintf(stderr, "test_conv_ref: cannot open %s\n", REF);
        return 1;
    }
    char line[512];
    int n_cases = 0;
    while (fscanf(f, " %511s", line) == 1) {
        if (line[0] == '#') {
            if (!fgets(line, sizeof line, f)) break;
            continue;
        }
        CHECK(strcmp(line, "case") == 0, "unexpected '%s'", line);
        if (strcmp(line, "case") != 0) break;
        check_case(f, &n_cases);
    }
    fclose(f);
    CHECK(n_cases == 8, "%d cases read (want 8)", n_cases);
    check_descriptors();
    return test_finish("test_conv_ref");
}
