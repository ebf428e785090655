/* conv_ref.c — the scalar references of conv2d (ops/conv.h): fp64 (the
 * oracle of every GPU level) and the naive fp32 loop (the error budget of
 * the bf16 kernels). Plain loops over outputs; a filter tap that falls on
 * the padding reads 0. */
#include <stdbool.h>

#include "ops/conv.h"

/* One output element without bias: the sum over k's group of channels and
 * the taps, in the layout's natural order (c, r, s for NCHW; r, s, c for
 * NHWC, where channels are contiguous), accumulated in double or (f32) in
 * float. */
static double conv_point(const nstf_conv2d_desc *d, const float *x, const float *w, int64_t n, int64_t k, int64_t p,
                         int64_t q, bool f32) {
    const int64_t Cg = d->c / d->groups, Kg = d->k / d->groups, c0 = (k / Kg) * Cg;
    const bool nhwc = d->layout == NSTF_CONV_NHWC;
    const int64_t e0 = nhwc ? d->r : Cg, e1 = nhwc ? d->s : d->r, e2 = nhwc ? Cg : d->s;
    double acc = 0.0;
    float accf = 0.0f;
    for (int64_t i0 = 0; i0 < e0; i0++)
        for (int64_t i1 = 0; i1 < e1; i1++)
            for (int64_t i2 = 0; i2 < e2; i2++) {
                const int64_t cg = nhwc ? i2 : i0, r = nhwc ? i0 : i1, s = nhwc ? i1 : i2;
                const int64_t h = p * d->stride_h - d->pad_h + r * d->dil_h;
                const int64_t wi = q * d->stride_w - d->pad_w + s * d->dil_w;
                if (h < 0 || h >= d->h || wi < 0 || wi >= d->w) continue;
                const float a = x[nstf_conv_x_at(d, n, c0 + cg, h, wi)], b = w[nstf_conv_w_at(d, k, cg, r, s)];
                if (f32)
                    accf += a * b;
                else
                    acc += (double)a * (double)b;
            }
    return f32 ? (double)accf : acc;
}

nstf_status nstf_ref_conv2d(const nstf_conv2d_desc *d, const float *x, const float *w, const float *bias,
                            double *y) {
    int64_t P, Q;
    NSTF_TRY(nstf_conv2d_out_size(d, &P, &Q));
    if (!x || !w || !y) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_ref_conv2d: NULL tensor");
    for (int64_t n = 0; n < d->n; n++)
        for (int64_t k = 0; k < d->k; k++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++)
                    y[nstf_conv_y_at(d, P, Q, n, k, p, q)] =
                        conv_point(d, x, w, n, k, p, q, false) + (bias ? (double)bias[k] : 0.0);
    return NSTF_OK;
}

nstf_status nstf_ref_conv2d_f32(const nstf_conv2d_desc *d, const float *x, const float *w, const float *bias,
                                float *y) {
    int64_t P, Q;
    NSTF_TRY(nstf_conv2d_out_size(d, &P, &Q));
    if (!x || !w || !y) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_ref_conv2d_f32: NULL tensor");
    for (int64_t n = 0; n < d->n; n++)
        for (int64_t k = 0; k < d->k; k++)
            for (int64_t p = 0; p < P; p++)
                for (int64_t q = 0; q < Q; q++)
                    y[nstf_conv_y_at(d, P, Q, n, k, p, q)] =
                        (float)conv_point(d, x, w, n, k, p, q, true) + (bias ? bias[k] : 0.0f);
    return NSTF_OK;
}
