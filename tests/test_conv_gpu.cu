/* test_conv_gpu.cu — every level of the conv2d ladder (nstf_gpu_conv2d,
 * levels 0-4) against the fp64 reference (nstf_ref_conv2d) on ragged
 * shapes: odd sizes, stride 2, dilation 2, asymmetric stride / padding /
 * dilation, groups (and depthwise), 1x1 and 7x7 filters, channel counts
 * that take and that miss the 16-byte paths, tiles with ragged edges and
 * several channel chunks; each in NCHW and NHWC, bf16 and fp32 output, with
 * and without bias, and once more with x, w and y off 16-byte alignment
 * (the element-wise fallbacks of levels 3 and 4).
 *
 * Metrics (tests/gpu_mm_test.h): bf16 output: RMS error against fp64 at
 * most 2x that of the naive same-precision loop (nstf_ref_conv2d_f32,
 * rounded to bf16); fp32 output: NMSE against fp64 <= 1e-10 (the matrix
 * units' truncating fp32 adds stay far below it; a lost tap, channel or
 * tile does not). Outputs are poisoned (NaN), a guard region after each is
 * checked, non-finite outputs fail. Invalid arguments must be refused.
 * Exit 77 without a GPU. */
#include "gpu_mm_test.h"
#include "ops/conv.h"

struct conv_case {
    int64_t n, c, h, w, k, r, s;
    int sh, sw, ph, pw, dh, dw, g;
};

static const char *k_lay[2] = {"NCHW", "NHWC"};

/* off: bytes added to x and w, and off x (element size / 2) to y (2: off
 * 16-byte alignment by one element, y by one element too) */
static void run_case(const conv_case &cc, nstf_conv_layout lay, bool y_bf16, bool with_bias, size_t off,
                     uint64_t seed) {
    const nstf_conv2d_desc d = {cc.n, cc.c, cc.h, cc.w, cc.k, cc.r, cc.s, cc.sh, cc.sw, cc.ph, cc.pw, cc.dh, cc.dw, cc.g, lay};
    int64_t P, Q, nx, nw, ny;
    CHECK(nstf_conv2d_out_size(&d, &P, &Q) == NSTF_OK, "%s", nstf_last_error());
    nstf_conv2d_sizes(&d, &nx, &nw, &ny);
    test_rng rng = {seed};
    uint16_t *hx = (uint16_t *)malloc(nx * 2), *hw = (uint16_t *)malloc(nw * 2);
    float *fx = (float *)malloc(nx * 4), *fw = (float *)malloc(nw * 4), *bias = (float *)malloc(cc.k * 4);
    const float wscale = 1.0f / sqrtf((float)(cc.c / cc.g * cc.r * cc.s));
    for (int64_t i = 0; i < nx; i++) fx[i] = bf2f(hx[i] = f2bf(rng_uniform(&rng)));
    for (int64_t i = 0; i < nw; i++) fw[i] = bf2f(hw[i] = f2bf(rng_uniform(&rng) * wscale));
    for (int64_t i = 0; i < cc.k; i++) bias[i] = 0.5f * rng_uniform(&rng);
    double *ref = (double *)malloc(ny * 8);
    float *naive = (float *)malloc(ny * 4), *got = (float *)malloc(ny * 4);
    CHECK(nstf_ref_conv2d(&d, fx, fw, with_bias ? bias : NULL, ref) == NSTF_OK, "%s", nstf_last_error());
    CHECK(nstf_ref_conv2d_f32(&d, fx, fw, with_bias ? bias : NULL, naive) == NSTF_OK, "%s", nstf_last_error());
    for (int64_t i = 0; i < ny; i++) naive[i] = round_bf(naive[i]); /* the naive output is bf16 */

    const size_t y_el = y_bf16 ? 2 : 4, y_bytes = (size_t)ny * y_el, yoff = off * (y_el / 2);
    char *dx = (char *)dev_alloc_poisoned(nx * 2 + off), *dw = (char *)dev_alloc_poisoned(nw * 2 + off);
    char *dy = (char *)dev_alloc_poisoned(y_bytes + yoff);
    float *dbias = (float *)dev_alloc_poisoned(cc.k * 4);
    DEV_CHECK(gpuMemcpy(dx + off, hx, nx * 2, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dw + off, hw, nw * 2, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dbias, bias, cc.k * 4, gpuMemcpyHostToDevice));
    void *hy = malloc(y_bytes);
    const double rr = rms(ref, ny);
    int64_t bad_n = 0;
    const double en = rms_err(naive, ref, ny, &bad_n);
    for (int level = 0; level < NSTF_CONV_LEVELS; level++) {
        DEV_CHECK(gpuMemset(dy, 0xff, y_bytes + yoff + DEV_GUARD)); /* poison again */
        nstf_status st = nstf_gpu_conv2d(&d, level, (const uint16_t *)(dx + off), (const uint16_t *)(dw + off),
                                         with_bias ? dbias : NULL, dy + yoff, y_bf16 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32,
                                         NULL);
        CHECK(st == NSTF_OK, "level %d: %s", level, nstf_last_error());
        if (st != NSTF_OK) continue;
        DEV_CHECK(gpuDeviceSynchronize());
        const int guard = dev_fetch_guarded(hy, dy + yoff, y_bytes);
        for (int64_t i = 0; i < ny; i++) got[i] = y_bf16 ? bf2f(((uint16_t *)hy)[i]) : ((float *)hy)[i];
        int64_t bad = 0;
        const double ek = rms_err(got, ref, ny, &bad);
        const double nm = rr > 0 ? (ek / rr) * (ek / rr) : ek * ek;
        const bool ok = guard && bad == 0 && (y_bf16 ? within_2x_naive(ek, en, rr) != 0 : nm <= 1e-10);
        printf("  L%d %s n%lld c%lld %lldx%lld k%lld %lldx%lld s%d,%d p%d,%d d%d,%d g%d -> %lldx%lld %s%s%s  err %.3e "
               "naive %.3e (ref rms %.3e)%s\n",
               level, k_lay[lay], (long long)cc.n, (long long)cc.c, (long long)cc.h, (long long)cc.w, (long long)cc.k,
               (long long)cc.r, (long long)cc.s, cc.sh, cc.sw, cc.ph, cc.pw, cc.dh, cc.dw, cc.g, (long long)P,
               (long long)Q, y_bf16 ? "bf16" : "f32 ", with_bias ? " bias" : "", off ? " misaligned" : "", ek, en, rr,
               ok ? "" : "  FAIL");
        CHECK(guard, "level %d: guard region overwritten", level);
        CHECK(bad == 0, "level %d: %lld non-finite outputs", level, (long long)bad);
        if (y_bf16)
            CHECK(within_2x_naive(ek, en, rr), "level %d: error %.3e > 2x naive %.3e", level, ek, en);
        else
            CHECK(nm <= 1e-10, "level %d: fp32 output NMSE %.3e > 1e-10", level, nm);
    }
    DEV_CHECK(gpuFree(dx));
    DEV_CHECK(gpuFree(dw));
    DEV_CHECK(gpuFree(dy));
    DEV_CHECK(gpuFree(dbias));
    free(hx), free(hw), free(fx), free(fw), free(bias), free(ref), free(naive), free(got), free(hy);
}

static void check_refusals(void) {
    void *d = dev_alloc_poisoned(4096);
    const uint16_t *p = (const uint16_t *)d;
    nstf_conv2d_desc ok = {1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, NSTF_CONV_NCHW};
    CHECK(nstf_gpu_conv2d(&ok, 5, p, p, NULL, d, NSTF_TYPE_BF16, NULL) == NSTF_ERR_INVALID_ARG, "level 5 accepted");
    CHECK(nstf_gpu_conv2d(&ok, -2, p, p, NULL, d, NSTF_TYPE_BF16, NULL) == NSTF_ERR_INVALID_ARG, "level -2 accepted");
    CHECK(nstf_gpu_conv2d(&ok, 0, p, p, NULL, d, NSTF_TYPE_F16, NULL) == NSTF_ERR_UNSUPPORTED, "F16 output accepted");
    CHECK(nstf_gpu_conv2d(&ok, 0, NULL, p, NULL, d, NSTF_TYPE_BF16, NULL) == NSTF_ERR_INVALID_ARG, "NULL x accepted");
    CHECK(nstf_gpu_conv2d(&ok, 0, (const uint16_t *)((char *)d + 1), p, NULL, d, NSTF_TYPE_BF16, NULL) ==
              NSTF_ERR_INVALID_ARG, "odd x accepted");
    nstf_conv2d_desc bad = ok;
    bad.groups = 3;
    CHECK(nstf_gpu_conv2d(&bad, 0, p, p, NULL, d, NSTF_TYPE_BF16, NULL) == NSTF_ERR_INVALID_ARG, "groups 3 accepted");
    /* a dilation whose patch cannot fit shared memory: levels 2-3 refuse, the others take it */
    nstf_conv2d_desc wide = {1, 1, 300, 300, 1, 3, 3, 4, 4, 0, 0, 64, 64, 1, NSTF_CONV_NCHW};
    CHECK(nstf_gpu_conv2d_supported(&wide, 2) == NSTF_ERR_UNSUPPORTED && nstf_gpu_conv2d_supported(&wide, 3) ==
              NSTF_ERR_UNSUPPORTED, "the oversized patch was accepted by the tiled levels");
    CHECK(nstf_gpu_conv2d_supported(&wide, 0) == NSTF_OK && nstf_gpu_conv2d_supported(&wide, 4) == NSTF_OK &&
              nstf_gpu_conv2d_supported(&wide, -1) == NSTF_OK,
          "levels 0 and 4 refused a valid shape: %s", nstf_last_error());
    DEV_CHECK(gpuFree(d));
}

int main(void) {
    int n_dev = 0;
    if (gpuGetDeviceCount(&n_dev) != gpuSuccess || n_dev == 0) {
        printf("test_conv_gpu: no GPU, skipped\n");
        return 77;
    }
    const conv_case cases[] = {
        {2, 5, 11, 13, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1},      /* odd sizes */
        {1, 6, 17, 15, 9, 3, 3, 2, 2, 1, 1, 1, 1, 1},      /* stride 2 */
        {2, 4, 13, 11, 6, 3, 3, 1, 1, 2, 2, 2, 2, 1},      /* dilation 2 */
        {2, 12, 9, 10, 18, 3, 3, 2, 1, 1, 1, 1, 2, 3},     /* groups, asymmetric stride and dilation */
        {1, 16, 15, 14, 16, 5, 5, 1, 1, 2, 2, 1, 1, 16},   /* depthwise 5x5 */
        {2, 32, 19, 21, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1},    /* 16-byte A pieces in NHWC, k < 64 */
        {1, 72, 35, 33, 136, 3, 3, 1, 1, 1, 1, 1, 1, 1},   /* channel chunks, two N tiles, ragged tiles */
        {2, 3, 37, 41, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1},     /* a stem: 7x7 stride 2 on 3 channels */
        {1, 32, 12, 12, 48, 3, 3, 2, 2, 1, 1, 1, 1, 2},    /* groups of 16 channels */
        {3, 64, 7, 9, 96, 1, 1, 1, 1, 0, 0, 1, 1, 1},      /* 1x1 */
        {2, 8, 10, 23, 12, 2, 5, 1, 3, 0, 2, 2, 1, 1},     /* even filter, asymmetric everything */
        {1, 16, 40, 70, 24, 3, 3, 2, 2, 1, 1, 1, 1, 1},    /* several tiles along both axes */
    };
    uint64_t seed = 1;
    for (const conv_case &c : cases)
        for (int lay = 0; lay < 2; lay++)
            for (int yb = 0; yb < 2; yb++) run_case(c, (nstf_conv_layout)lay, yb == 0, (seed & 1) == 0, 0, seed++);
    /* off 16-byte alignment: the element-wise loads of levels 3 and 4 */
    run_case(cases[5], NSTF_CONV_NHWC, true, true, 2, seed++);
    run_case(cases[6], NSTF_CONV_NCHW, false, true, 2, seed++);
    run_case(cases[9], NSTF_CONV_NHWC, false, false, 2, seed++);
    check_refusals();
    return test_finish("test_conv_gpu");
}
