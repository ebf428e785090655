/* conv.c — the conv2d descriptor: its checks, output size, element counts,
 * FLOPs, and the names of the GPU ladder's levels (ops/gpu/conv*.cu). */
#include "ops/conv.h"

#include "core/mem.h"

static const char *const k_level_names[NSTF_CONV_LEVELS] = {
    "L0 direct, 64-thread groups",
    "L1 direct, 256-thread groups",
    "L2 shared-memory tiles, 2x2 outputs per thread",
    "L3 tiles + vectorized loads",
    "L4 implicit GEMM on the matrix units",
};

int nstf_conv2d_levels(void) { return NSTF_CONV_LEVELS; }

const char *nstf_conv2d_level_name(int level) {
    return level >= 0 && level < NSTF_CONV_LEVELS ? k_level_names[level] : "unknown level";
}

#define CONV_MAX_ELEMS ((uint64_t)1 << 62)

static bool prod_ok(uint64_t *acc, int64_t v) { return nstf_mul_ok(*acc, (uint64_t)v, acc) && *acc < CONV_MAX_ELEMS; }

nstf_status nstf_conv2d_out_size(const nstf_conv2d_desc *d, int64_t *p, int64_t *q) {
    if (!d) return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: NULL descriptor");
    if (d->n <= 0 || d->c <= 0 || d->h <= 0 || d->w <= 0 || d->k <= 0 || d->r <= 0 || d->s <= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: sizes must be positive (n %lld c %lld h %lld w %lld, k %lld r %lld s %lld)",
                              (long long)d->n, (long long)d->c, (long long)d->h, (long long)d->w, (long long)d->k,
                              (long long)d->r, (long long)d->s);
    if (d->stride_h <= 0 || d->stride_w <= 0 || d->dil_h <= 0 || d->dil_w <= 0 || d->pad_h < 0 || d->pad_w < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: stride %dx%d and dilation %dx%d must be positive, padding %dx%d >= 0",
                              d->stride_h, d->stride_w, d->dil_h, d->dil_w, d->pad_h, d->pad_w);
    if (d->groups <= 0 || d->c % d->groups != 0 || d->k % d->groups != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: groups %d must divide the channels in (%lld) and out (%lld)",
                              d->groups, (long long)d->c, (long long)d->k);
    if (d->layout != NSTF_CONV_NCHW && d->layout != NSTF_CONV_NHWC)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "conv2d: unknown layout %d", (int)d->layout);
    if (d->h > (1 << 30) || d->w > (1 << 30) || d->r > (1 << 20) || d->s > (1 << 20))
        return nstf_set_error(NSTF_ERR_RANGE, "conv2d: image %lldx%lld or filter %lldx%lld too large", (long long)d->h,
                              (long long)d->w, (long long)d->r, (long long)d->s);
    const int64_t eh = (int64_t)d->dil_h * (d->r - 1) + 1, ew = (int64_t)d->dil_w * (d->s - 1) + 1;
    const int64_t hp = d->h + 2 * (int64_t)d->pad_h, wp = d->w + 2 * (int64_t)d->pad_w;
    if (eh > hp || ew > wp)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "conv2d: the dilated filter (%lldx%lld) is larger than the padded input (%lldx%lld)",
                              (long long)eh, (long long)ew, (long long)hp, (long long)wp);
    const int64_t P = (hp - eh) / d->stride_h + 1, Q = (wp - ew) / d->stride_w + 1;
    uint64_t nx = 1, nw = 1, ny = 1;
    if (!prod_ok(&nx, d->n) || !prod_ok(&nx, d->c) || !prod_ok(&nx, d->h) || !prod_ok(&nx, d->w) ||
        !prod_ok(&nw, d->k) || !prod_ok(&nw, d->c / d->groups) || !prod_ok(&nw, d->r) || !prod_ok(&nw, d->s) ||
        !prod_ok(&ny, d->n) || !prod_ok(&ny, d->k) || !prod_ok(&ny, P) || !prod_ok(&ny, Q))
        return nstf_set_error(NSTF_ERR_RANGE, "conv2d: tensor sizes overflow");
    if (p) *p = P;
    if (q) *q = Q;
    return NSTF_OK;
}

void nstf_conv2d_sizes(const nstf_conv2d_desc *d, int64_t *nx, int64_t *nw, int64_t *ny) {
    int64_t P = 0, Q = 0;
    if (nstf_conv2d_out_size(d, &P, &Q) != NSTF_OK) P = Q = 0;
    *nx = d->n * d->c * d->h * d->w;
    *nw = d->k * (d->c / (d->groups > 0 ? d->groups : 1)) * d->r * d->s;
    *ny = d->n * d->k * P * Q;
}

double nstf_conv2d_flops(const nstf_conv2d_desc *d) {
    int64_t P = 0, Q = 0;
    if (nstf_conv2d_out_size(d, &P, &Q) != NSTF_OK) return 0.0;
    return 2.0 * (double)d->n * (double)d->k * (double)P * (double)Q * (double)(d->c / d->groups) * (double)d->r *
           (double)d->s;
}
