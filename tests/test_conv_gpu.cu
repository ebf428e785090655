/* test_conv_gpu.cu — every level of the conv2d ladder (nstf_gpu_conv2d,
 * levels 0-4) against the fp64 reference (nstf_ref_conv2d) on ragged
 * shapes: odd sizes, stride 2, dilation 2, asymmetric stride / padding /
 * dilation, groups (and depthwise), 1x1 and 7x7 filters, channel counts
 * that take and that miss the 16-byte paths, tiles with ragged edges and
 * several channel chunks; each in NCHW and NHWC, bf16 and fp32 output, with
 * and without bias, and once more with x, w and y off 16-byte alignment
 * (the element-wise fallbacks of levels 3 and 4); larger grids that take
 * level 4's bigger tiles on a GPU of 132 SMs; 64-channel multiples, which
 * Hopper runs on wgmma + TMA in NHWC.
 *
 * Metrics and buffers (tests/gpu_harness.h): bf16 output: the harness's
 * bf16 rule against the naive same-precision loop (nstf_ref_conv2d_f32,
 * rounded to bf16); fp32 output: NMSE against fp64 <= 1e-10 (the matrix
 * units' truncating fp32 adds stay far below it; a lost tap, channel or
 * tile does not). One PASS/FAIL line per level and case. Outputs are
 * poisoned (NaN) before each run, every buffer's guards are checked after
 * each launch, non-finite outputs fail. Invalid arguments must be refused.
 * Exit 77 without a GPU. */
#include "gpu_harness.h"
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
    gh_must(nstf_conv2d_out_size(&d, &P, &Q), "conv2d out size");
    nstf_conv2d_sizes(&d, &nx, &nw, &ny);
    test_rng rng = {seed};
    std::vector<float> fx(nx), fw(nw), bias(cc.k), naive(ny);
    std::vector<double> ref(ny);
    const float wscale = 1.0f / sqrtf((float)(cc.c / cc.g * cc.r * cc.s));
    for (int64_t i = 0; i < nx; i++) fx[i] = gh_bf(rng_uniform(&rng));
    for (int64_t i = 0; i < nw; i++) fw[i] = gh_bf(rng_uniform(&rng) * wscale);
    for (int64_t i = 0; i < cc.k; i++) bias[i] = 0.5f * rng_uniform(&rng);
    const float *hb = with_bias ? bias.data() : NULL;
    gh_must(nstf_ref_conv2d(&d, fx.data(), fw.data(), hb, ref.data()), "fp64 reference");
    gh_must(nstf_ref_conv2d_f32(&d, fx.data(), fw.data(), hb, naive.data()), "naive reference");
    for (int64_t i = 0; i < ny; i++) naive[i] = gh_bf(naive[i]); /* the naive output is bf16 */

    const nstf_type yt = y_bf16 ? NSTF_TYPE_BF16 : NSTF_TYPE_F32;
    const size_t y_el = y_bf16 ? 2 : 4;
    const std::vector<uint16_t> hx = gh_to_bf16(fx), hw = gh_to_bf16(fw);
    gh_buf dx = gh_alloc(nx * 2, hx.data(), off), dw = gh_alloc(nw * 2, hw.data(), off);
    gh_buf dy = gh_alloc((size_t)ny * y_el, NULL, off * (y_el / 2));
    gh_buf dbias = gh_alloc(cc.k * 4, bias.data());
    for (int level = 0; level < NSTF_CONV_LEVELS; level++) {
        gh_begin("L%d %s n%lld c%lld %lldx%lld k%lld %lldx%lld s%d,%d p%d,%d d%d,%d g%d %s%s%s", level, k_lay[lay],
                 (long long)cc.n, (long long)cc.c, (long long)cc.h, (long long)cc.w, (long long)cc.k, (long long)cc.r,
                 (long long)cc.s, cc.sh, cc.sw, cc.ph, cc.pw, cc.dh, cc.dw, cc.g, y_bf16 ? "bf16" : "f32",
                 with_bias ? " bias" : "", off ? " misaligned" : "");
        gh_poison(dy);
        const nstf_status st = nstf_gpu_conv2d(&d, level, dx.as<uint16_t>(), dw.as<uint16_t>(),
                                               with_bias ? dbias.as<float>() : NULL, dy.p(), yt, NULL);
        if (!gh_launched(st, "conv2d")) continue;
        const std::vector<float> got = gh_fetch_floats(dy, yt, ny);
        gh_compare("y", got.data(), ref.data(), ny, y_bf16 ? gh_tol_naive(naive.data()) : gh_tol_nmse(1e-10));
    }
    gh_end();
    gh_free(dx), gh_free(dw), gh_free(dy), gh_free(dbias);
}

static void check_refusals(void) {
    gh_begin("refusals");
    gh_buf buf = gh_alloc(4096);
    void *d = buf.p();
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
    gh_free(buf);
    gh_end();
}

int main(void) {
    if (!gh_init("test_conv_gpu")) return TEST_SKIP;
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
        /* level 4 takes the largest tile whose grid fills the SMs: these two
         * grids fill an H100's / H200's 132 SMs with 128 x 128 tiles (140
         * blocks, a ragged N tile) and with 128 x 64 tiles (137 blocks); the
         * cases above take 64 x 64 tiles there */
        {4, 72, 47, 47, 200, 3, 3, 1, 1, 1, 1, 1, 1, 1},
        {4, 24, 66, 66, 40, 3, 3, 1, 1, 1, 1, 1, 1, 1},
        /* 64-channel multiples: in NHWC, Hopper's wgmma + TMA path (4-D boxes
         * of x, zero-filled padding): ragged position tiles and a ragged
         * channel tile, stride 2 with two chunks per tap, dilation 2, 1x1
         * with an odd channel count (single stores), asymmetric stride and
         * padding, 7x7 outputs (two images a box) */
        {2, 64, 13, 11, 72, 3, 3, 1, 1, 1, 1, 1, 1, 1},
        {3, 128, 15, 14, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1},
        {1, 64, 12, 16, 40, 3, 3, 1, 1, 2, 2, 2, 2, 1},
        {2, 64, 9, 9, 33, 1, 1, 1, 1, 0, 0, 1, 1, 1},
        {1, 64, 17, 19, 130, 3, 3, 2, 1, 1, 2, 1, 1, 1},
        {5, 64, 7, 7, 96, 3, 3, 1, 1, 1, 1, 1, 1, 1},
    };
    uint64_t seed = 1;
    for (const conv_case &c : cases)
        for (int lay = 0; lay < 2; lay++)
            for (int yb = 0; yb < 2; yb++, seed++) run_case(c, (nstf_conv_layout)lay, yb == 0, (seed & 1) == 0, 0, seed);
    /* off 16-byte alignment: the element-wise loads of levels 3 and 4 */
    run_case(cases[5], NSTF_CONV_NHWC, true, true, 2, seed++);
    run_case(cases[6], NSTF_CONV_NCHW, false, true, 2, seed++);
    run_case(cases[9], NSTF_CONV_NHWC, false, false, 2, seed++);
    /* a grid of 64 tiles of 128 positions and 256 channels: the wgmma path's
     * 128-channel tile on 132 SMs (the cases above take 64), NHWC only */
    const conv_case wide = {8, 64, 32, 32, 256, 3, 3, 1, 1, 1, 1, 1, 1, 1};
    run_case(wide, NSTF_CONV_NHWC, true, true, 0, seed++);
    run_case(wide, NSTF_CONV_NHWC, false, false, 0, seed++);
    check_refusals();
    return gh_finish("test_conv_gpu");
}
