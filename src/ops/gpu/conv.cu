/* conv.cu — the conv2d ladder's launcher (nstf_gpu_conv2d: checks, level
 * choice) and its levels 0 and 1: the direct convolution, one thread per
 * output element, in 64- and then 256-thread groups. Outputs are numbered
 * in y's own layout order, so consecutive threads store consecutive
 * addresses, and each thread reads its taps in the layout's contiguous
 * order (c, r, s for NCHW; r, s, c for NHWC). Levels 2-3 are in
 * conv_tiled.cu, level 4 in conv_igemm.cu. */
#include "conv_common.h"
#include "ops/conv.h"

template <bool NHWC, bool YBF16, int BLOCK>
__global__ void __launch_bounds__(BLOCK)
    conv_direct_kernel(conv_params cp, const u16 *__restrict__ x, const u16 *__restrict__ w,
                       const float *__restrict__ bias, void *__restrict__ y, int64_t total) {
    const int64_t step = (int64_t)gridDim.x * BLOCK;
    for (int64_t i = (int64_t)blockIdx.x * BLOCK + threadIdx.x; i < total; i += step) {
        int64_t n, k, p, q, t;
        if (NHWC) {
            k = i % cp.k, t = i / cp.k;
            q = t % cp.q, t /= cp.q;
            p = t % cp.p, n = t / cp.p;
        } else {
            q = i % cp.q, t = i / cp.q;
            p = t % cp.p, t /= cp.p;
            k = t % cp.k, n = t / cp.k;
        }
        const int64_t c0 = (k / cp.kg) * cp.cg;
        const int64_t h0 = p * cp.sh - cp.ph, w0 = q * cp.sw - cp.pw;
        float acc = 0.0f;
        if (NHWC) {
            for (int64_t r = 0; r < cp.r; r++) {
                const int64_t h = h0 + r * cp.dh;
                if (h < 0 || h >= cp.h) continue;
                for (int64_t s = 0; s < cp.s; s++) {
                    const int64_t wi = w0 + s * cp.dw;
                    if (wi < 0 || wi >= cp.w) continue;
                    const u16 *xp = x + conv_x_at(cp, true, n, c0, h, wi);
                    const u16 *wp = w + conv_w_at(cp, true, k, 0, r, s);
                    for (int64_t c = 0; c < cp.cg; c++) acc = fmaf(conv_bf(xp[c]), conv_bf(wp[c]), acc);
                }
            }
        } else {
            for (int64_t c = 0; c < cp.cg; c++) {
                const u16 *xc = x + conv_x_at(cp, false, n, c0 + c, 0, 0);
                const u16 *wc = w + conv_w_at(cp, false, k, c, 0, 0);
                for (int64_t r = 0; r < cp.r; r++) {
                    const int64_t h = h0 + r * cp.dh;
                    if (h < 0 || h >= cp.h) continue;
                    for (int64_t s = 0; s < cp.s; s++) {
                        const int64_t wi = w0 + s * cp.dw;
                        if (wi < 0 || wi >= cp.w) continue;
                        acc = fmaf(conv_bf(xc[h * cp.w + wi]), conv_bf(wc[r * cp.s + s]), acc);
                    }
                }
            }
        }
        conv_store(y, i, acc, bias, k, YBF16);
    }
}

template <int BLOCK>
static nstf_status conv_direct_launch(const conv_params &cp, bool nhwc, const u16 *x, const u16 *w, const float *bias,
                                      void *y, bool y_bf16, gpuStream_t s) {
    const int64_t total = cp.n * cp.k * cp.p * cp.q;
    const int64_t blocks = (total + BLOCK - 1) / BLOCK;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    if (nhwc && y_bf16)
        conv_direct_kernel<true, true, BLOCK><<<grid, BLOCK, 0, s>>>(cp, x, w, bias, y, total);
    else if (nhwc)
        conv_direct_kernel<true, false, BLOCK><<<grid, BLOCK, 0, s>>>(cp, x, w, bias, y, total);
    else if (y_bf16)
        conv_direct_kernel<false, true, BLOCK><<<grid, BLOCK, 0, s>>>(cp, x, w, bias, y, total);
    else
        conv_direct_kernel<false, false, BLOCK><<<grid, BLOCK, 0, s>>>(cp, x, w, bias, y, total);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

/* ---------------------------------------------------------------- host ---- */

static nstf_status conv_params_of(const nstf_conv2d_desc *d, conv_params *cp) {
    int64_t P = 0, Q = 0;
    NSTF_TRY(nstf_conv2d_out_size(d, &P, &Q));
    *cp = conv_params{d->n, d->c, d->h, d->w, d->k, d->r, d->s, P, Q, d->c / d->groups, d->k / d->groups,
                      d->stride_h, d->stride_w, d->pad_h, d->pad_w, d->dil_h, d->dil_w, d->groups};
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_conv2d_supported(const nstf_conv2d_desc *d, int level) {
    conv_params cp;
    NSTF_TRY(conv_params_of(d, &cp));
    if (level == -1) level = NSTF_CONV_LEVELS - 1;
    if (level < 0 || level >= NSTF_CONV_LEVELS)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: level %d (0 .. %d, or -1 for the fastest)", level,
                              NSTF_CONV_LEVELS - 1);
    if (level <= 1) return NSTF_OK;
    if (level <= 3) {
        int cc = 0;
        size_t smem = 0;
        return conv_tiled_plan(cp, level == 3, &cc, &smem);
    }
    return conv_igemm_check(cp);
}

extern "C" nstf_status nstf_gpu_conv2d(const nstf_conv2d_desc *d, int level, const uint16_t *x, const uint16_t *w,
                                       const float *bias, void *y, nstf_type y_type, void *stream) {
    if (!x || !w || !y) return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: NULL tensor");
    if (((uintptr_t)x | (uintptr_t)w | (uintptr_t)y) % 2 != 0 || (uintptr_t)bias % 4 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: tensors must be aligned to their element size");
    if (y_type != NSTF_TYPE_F32 && y_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d: output type %s (want F32 or BF16)",
                              nstf_type_name(y_type));
    if (y_type == NSTF_TYPE_F32 && (uintptr_t)y % 4 != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: an F32 output must be 4-byte aligned");
    NSTF_TRY(nstf_gpu_conv2d_supported(d, level));
    conv_params cp;
    NSTF_TRY(conv_params_of(d, &cp));
    if (level == -1) level = NSTF_CONV_LEVELS - 1;
    const bool nhwc = d->layout == NSTF_CONV_NHWC, y_bf16 = y_type == NSTF_TYPE_BF16;
    const u16 *xs = (const u16 *)x, *ws = (const u16 *)w;
    gpuStream_t s = (gpuStream_t)stream;
    switch (level) {
    case 0: return conv_direct_launch<64>(cp, nhwc, xs, ws, bias, y, y_bf16, s);
    case 1: return conv_direct_launch<256>(cp, nhwc, xs, ws, bias, y, y_bf16, s);
    case 2: return conv_tiled_launch(cp, nhwc, 0, xs, ws, bias, y, y_bf16, s);
    case 3: return conv_tiled_launch(cp, nhwc, 1, xs, ws, bias, y, y_bf16, s);
    default: return conv_igemm_launch(cp, nhwc, xs, ws, bias, y, y_bf16, s);
    }
}
