/* conv.h — conv2d outside the model's op table (the convolution ladder of
 * kernels, its benchmark and the PyTorch ops): the descriptor's checks and
 * index maps, shared by the CPU references (ops/cpu/conv_ref.c) and the
 * GPU launcher (ops/gpu/conv.cu), and the references themselves.
 *
 * The descriptor and layouts are nstf_tools.h's (nstf_conv2d_desc): x, y in
 * NCHW or NHWC, w in [k][c/g][r][s] or [k][r][s][c/g] to match. */
#ifndef NSTF_OPS_CONV_H
#define NSTF_OPS_CONV_H

#include <stdint.h>

#include "core/status.h"
#include "nstf_tools.h"

#ifdef __cplusplus
extern "C" { /* the GPU tests and launchers are C++ */
#endif

#define NSTF_CONV_LEVELS 5

/* Element offsets of x[n, c, h, w], w[k, cg, r, s] and y[n, k, p, q] in the
 * descriptor's layout (C = d->c, Cg = d->c / groups). */
static inline int64_t nstf_conv_x_at(const nstf_conv2d_desc *d, int64_t n, int64_t c, int64_t h, int64_t w) {
    return d->layout == NSTF_CONV_NHWC ? ((n * d->h + h) * d->w + w) * d->c + c : ((n * d->c + c) * d->h + h) * d->w + w;
}
static inline int64_t nstf_conv_w_at(const nstf_conv2d_desc *d, int64_t k, int64_t cg, int64_t r, int64_t s) {
    const int64_t Cg = d->c / d->groups;
    return d->layout == NSTF_CONV_NHWC ? ((k * d->r + r) * d->s + s) * Cg + cg : ((k * Cg + cg) * d->r + r) * d->s + s;
}
static inline int64_t nstf_conv_y_at(const nstf_conv2d_desc *d, int64_t P, int64_t Q, int64_t n, int64_t k, int64_t p,
                                     int64_t q) {
    return d->layout == NSTF_CONV_NHWC ? ((n * P + p) * Q + q) * d->k + k : ((n * d->k + k) * P + p) * Q + q;
}

/* Element counts of x, w and y (after nstf_conv2d_out_size succeeded). */
void nstf_conv2d_sizes(const nstf_conv2d_desc *d, int64_t *nx, int64_t *nw, int64_t *ny);

/* The fp64 reference: y[n, k, p, q] = bias[k] + sum over c in k's group, r, s
 * of x[n, c, p*stride_h - pad_h + r*dil_h, q*stride_w - pad_w + s*dil_w] *
 * w[k, c mod Cg, r, s] (positions outside the input read 0), summed in
 * double. x, w as fp32 values, bias [k] or NULL; y in the layout.
 * torch: F.conv2d(x.double(), w.double(), bias.double(), stride, padding,
 * dilation, groups) */
nstf_status nstf_ref_conv2d(const nstf_conv2d_desc *d, const float *x, const float *w, const float *bias,
                            double *y);

/* The naive same-precision version (the error budget of the bf16 kernels):
 * the same loops accumulating in fp32 in the order c, r, s (NCHW) or r, s, c
 * (NHWC), bias added last. */
nstf_status nstf_ref_conv2d_f32(const nstf_conv2d_desc *d, const float *x, const float *w, const float *bias,
                                float *y);

#ifdef __cplusplus
}
#endif
#endif
