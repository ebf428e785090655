/* conv_tiled.cu — levels 2 and 3 of the conv2d ladder: direct convolution
 * through shared-memory tiles.
 *
 * A group of 256 threads (16 x 16) computes a 32 x 32 tile of output
 * positions of one image for 8 output channels of one group; each thread
 * owns 2 x 2 positions, (ty + 16 i, tx + 16 j), times the 8 channels: 32
 * fp32 accumulators. Interleaving the positions by 16 (rather than a 2 x 2
 * block per thread) keeps consecutive threads on consecutive output
 * columns, so NCHW stores coalesce and shared-memory reads of a row hit
 * consecutive words at stride 1. The input channels are walked in chunks:
 * each chunk stages the input patch the tile reads ([cc][ih][iw] fp32,
 * ih = 31 stride_h + (r-1) dil_h + 1, zero where the patch falls on the
 * padding) and the chunk's filters of the 8 channels, then every thread
 * accumulates over the chunk's channels and taps from shared memory. The
 * chunk is as many channels as fit 48 KiB (the default shared-memory limit
 * of a group on NVIDIA, under the 64 KiB LDS of AMD).
 *
 * Level 2 loads both operands element by element and keeps the filters as
 * [kb][cc][r][s]. Level 3 loads them in 16-byte pieces (any contiguous run
 * of global memory, cut at 8-element boundaries; ragged ends element-wise),
 * keeps the filters as [cc][r][s][kb] so a thread reads its 8 channels' tap
 * as two 16-byte shared loads, and stores 8 channels at once in NHWC. */
#include "conv_common.h"

#define CT_T 32       /* output tile: CT_T x CT_T positions */
#define CT_KB 8       /* output channels per group */
#define CT_THREADS 256
#define CT_SMEM_BUDGET (48 * 1024)

/* The 8-element aligned group gi of the contiguous run g[a .. a + len):
 * put(j, value) for every j of the run in that group, through one 16-byte
 * load when the group lies inside the run. g is 16-byte aligned, a >= 0. */
template <class Put>
static __device__ __forceinline__ void conv_vec_group(const u16 *g, int64_t a, int len, int gi, const Put &put) {
    const int64_t g0 = (a / 8 + gi) * 8;
    const int64_t lo = g0 - a;
    if (lo >= len) return;
    if (lo >= 0 && lo + 8 <= len) {
        const uint4 v = *(const uint4 *)(g + g0);
        const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            put((int)lo + 2 * e, __uint_as_float(u[e] << 16));
            put((int)lo + 2 * e + 1, __uint_as_float(u[e] & 0xffff0000u));
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const int64_t j = lo + e;
            if (j >= 0 && j < len) put((int)j, conv_bf(g[g0 + e]));
        }
    }
}

/* groups of 8 a run of len elements can touch */
static __device__ __forceinline__ int conv_n_groups(int len) { return len / 8 + 2; }

template <bool NHWC, bool VEC, bool YBF16>
__global__ void __launch_bounds__(CT_THREADS, 1)
    conv_tiled_kernel(conv_params cp, const u16 *__restrict__ x, const u16 *__restrict__ w,
                      const float *__restrict__ bias, void *__restrict__ y, int cc_max, int ih, int iw, int sx_floats,
                      int vload, int vstore) {
    extern __shared__ __align__(16) float conv_sm[];
    float *sx = conv_sm;              /* [cc_max][ih][iw] */
    float *sw = conv_sm + sx_floats;  /* VEC: [cc_max][r][s][CT_KB]; else [CT_KB][cc_max][r][s] */
    const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
    const int64_t tiles_q = (cp.q + CT_T - 1) / CT_T;
    const int64_t p0 = (int64_t)(blockIdx.x / tiles_q) * CT_T, q0 = (int64_t)(blockIdx.x % tiles_q) * CT_T;
    const int64_t kblocks = (cp.kg + CT_KB - 1) / CT_KB;
    const int64_t g = blockIdx.y / kblocks, kb0 = (blockIdx.y % kblocks) * CT_KB;
    const int kb_n = (int)(cp.kg - kb0 < CT_KB ? cp.kg - kb0 : CT_KB);
    const int64_t n = blockIdx.z, k0 = g * cp.kg + kb0, c0 = g * cp.cg;
    const int64_t gh0 = p0 * cp.sh - cp.ph, gw0 = q0 * cp.sw - cp.pw; /* the patch's origin in x */
    const int R = (int)cp.r, S = (int)cp.s, RS = R * S;
    const int sh = cp.sh, sw_ = cp.sw, dh = cp.dh, dw = cp.dw;

    float acc[2][2][CT_KB];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int kb = 0; kb < CT_KB; kb++) acc[i][j][kb] = 0.0f;

    for (int64_t cc0 = 0; cc0 < cp.cg; cc0 += cc_max) {
        const int cc_n = (int)(cp.cg - cc0 < cc_max ? cp.cg - cc0 : cc_max);
        __syncthreads(); /* the previous chunk has been read */
        /* ---- the input patch ---- */
        const int patch = cc_n * ih * iw;
        for (int e = tid; e < patch; e += CT_THREADS) {
            int cc, yy, xx;
            if (NHWC) {
                cc = e % cc_n, xx = (e / cc_n) % iw, yy = e / (cc_n * iw);
            } else {
                xx = e % iw, yy = (e / iw) % ih, cc = e / (iw * ih);
            }
            const int64_t gh = gh0 + yy, gw = gw0 + xx;
            const bool in = gh >= 0 && gh < cp.h && gw >= 0 && gw < cp.w;
            if (VEC && vload) { /* only the padding here; the 16-byte pass below fills the rest */
                if (!in) sx[(cc * ih + yy) * iw + xx] = 0.0f;
            } else {
                sx[(cc * ih + yy) * iw + xx] = in ? conv_bf(x[conv_x_at(cp, NHWC, n, c0 + cc0 + cc, gh, gw)]) : 0.0f;
            }
        }
        if (VEC && vload) {
            if (NHWC) { /* per position: the chunk's channels are one run */
                const int G = conv_n_groups(cc_n), items = ih * iw * G;
                for (int it = tid; it < items; it += CT_THREADS) {
                    const int pos = it / G, gi = it % G, yy = pos / iw, xx = pos % iw;
                    const int64_t gh = gh0 + yy, gw = gw0 + xx;
                    if (gh < 0 || gh >= cp.h || gw < 0 || gw >= cp.w) continue;
                    float *dst = sx + yy * iw + xx;
                    conv_vec_group(x, conv_x_at(cp, true, n, c0 + cc0, gh, gw), cc_n, gi,
                                   [&](int j, float v) { dst[j * ih * iw] = v; });
                }
            } else { /* per channel row: the patch's columns inside the image are one run */
                const int64_t lo = gw0 < 0 ? 0 : gw0, hi = gw0 + iw < cp.w ? gw0 + iw : cp.w;
                const int len = (int)(hi - lo);
                if (len > 0) {
                    const int G = conv_n_groups(len), items = cc_n * ih * G;
                    for (int it = tid; it < items; it += CT_THREADS) {
                        const int row = it / G, gi = it % G, cc = row / ih, yy = row % ih;
                        const int64_t gh = gh0 + yy;
                        if (gh < 0 || gh >= cp.h) continue;
                        float *dst = sx + (cc * ih + yy) * iw + (lo - gw0);
                        conv_vec_group(x, conv_x_at(cp, false, n, c0 + cc0 + cc, gh, lo), len, gi,
                                       [&](int j, float v) { dst[j] = v; });
                    }
                }
            }
        }
        /* ---- the filters of the group's channels (zero past kb_n) ---- */
        const int fil = CT_KB * cc_n * RS;
        for (int e = tid; e < fil; e += CT_THREADS) {
            const int kb = e / (cc_n * RS), cc = (e / RS) % cc_n, rs = e % RS;
            const int o = VEC ? (cc * RS + rs) * CT_KB + kb : (kb * cc_max + cc) * RS + rs;
            if (VEC && vload && kb < kb_n) continue; /* the 16-byte pass below */
            sw[o] = kb < kb_n ? conv_bf(w[conv_w_at(cp, NHWC, k0 + kb, cc0 + cc, rs / S, rs % S)]) : 0.0f;
        }
        if (VEC && vload) {
            if (NHWC) { /* per (channel, tap): the chunk's input channels are one run */
                const int G = conv_n_groups(cc_n), items = kb_n * RS * G;
                for (int it = tid; it < items; it += CT_THREADS) {
                    const int row = it / G, gi = it % G, kb = row / RS, rs = row % RS;
                    float *dst = sw + rs * CT_KB + kb;
                    conv_vec_group(w, conv_w_at(cp, true, k0 + kb, cc0, rs / S, rs % S), cc_n, gi,
                                   [&](int j, float v) { dst[j * RS * CT_KB] = v; });
                }
            } else { /* per channel: the chunk's [cc][r][s] is one run */
                const int len = cc_n * RS, G = conv_n_groups(len), items = kb_n * G;
                for (int it = tid; it < items; it += CT_THREADS) {
                    const int kb = it / G, gi = it % G;
                    float *dst = sw + kb;
                    conv_vec_group(w, conv_w_at(cp, false, k0 + kb, cc0, 0, 0), len, gi,
                                   [&](int j, float v) { dst[j * CT_KB] = v; });
                }
            }
        }
        __syncthreads();
        /* ---- accumulate ---- */
        for (int cc = 0; cc < cc_n; cc++) {
            const float *xc = sx + cc * ih * iw;
            for (int r = 0; r < R; r++)
                for (int s = 0; s < S; s++) {
                    float wv[CT_KB];
                    if (VEC) {
                        const float4 *wp = (const float4 *)(sw + ((cc * R + r) * S + s) * CT_KB);
                        const float4 a = wp[0], b = wp[1];
                        wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w;
                        wv[4] = b.x, wv[5] = b.y, wv[6] = b.z, wv[7] = b.w;
                    } else {
#pragma unroll
                        for (int kb = 0; kb < CT_KB; kb++) wv[kb] = sw[(kb * cc_max + cc) * RS + r * S + s];
                    }
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const float *row = xc + ((ty + 16 * i) * sh + r * dh) * iw + s * dw;
#pragma unroll
                        for (int j = 0; j < 2; j++) {
                            const float xv = row[(tx + 16 * j) * sw_];
#pragma unroll
                            for (int kb = 0; kb < CT_KB; kb++) acc[i][j][kb] = fmaf(xv, wv[kb], acc[i][j][kb]);
                        }
                    }
                }
        }
    }

    /* ---- store ---- */
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int64_t p = p0 + ty + 16 * i, q = q0 + tx + 16 * j;
            if (p >= cp.p || q >= cp.q) continue;
            if (VEC && NHWC && vstore && kb_n == CT_KB) { /* 8 consecutive channels */
                const int64_t o = conv_y_at(cp, true, n, k0, p, q);
                float v[CT_KB];
#pragma unroll
                for (int kb = 0; kb < CT_KB; kb++) v[kb] = acc[i][j][kb] + (bias ? bias[k0 + kb] : 0.0f);
                if (YBF16) {
                    unsigned u[4];
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        u[e] = (unsigned)nstf_float_to_bf16(v[2 * e]).bits |
                               ((unsigned)nstf_float_to_bf16(v[2 * e + 1]).bits << 16);
                    *(uint4 *)((u16 *)y + o) = make_uint4(u[0], u[1], u[2], u[3]);
                } else {
                    float4 *d = (float4 *)((float *)y + o);
                    d[0] = make_float4(v[0], v[1], v[2], v[3]);
                    d[1] = make_float4(v[4], v[5], v[6], v[7]);
                }
                continue;
            }
#pragma unroll
            for (int kb = 0; kb < CT_KB; kb++)
                if (kb < kb_n) conv_store(y, conv_y_at(cp, NHWC, n, k0 + kb, p, q), acc[i][j][kb], bias, k0 + kb, YBF16);
        }
}

/* ---------------------------------------------------------------- host ---- */

nstf_status conv_tiled_plan(const conv_params &cp, int vec, int *cc_max, size_t *smem) {
    const int64_t ih = (int64_t)(CT_T - 1) * cp.sh + (cp.r - 1) * cp.dh + 1;
    const int64_t iw = (int64_t)(CT_T - 1) * cp.sw + (cp.s - 1) * cp.dw + 1;
    const int64_t per_c = ih * iw + CT_KB * cp.r * cp.s; /* floats per channel of a chunk */
    int64_t cc = (CT_SMEM_BUDGET / 4 - 4) / per_c;
    if (cc < 1)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "conv2d level %d: one channel's input patch (%lldx%lld) and filters need %lld bytes "
                              "of shared memory, more than %d (stride or dilation too large for the tiles)",
                              vec ? 3 : 2, (long long)ih, (long long)iw, (long long)(per_c * 4), CT_SMEM_BUDGET);
    if (cc > cp.cg) cc = cp.cg;
    const int64_t kblocks = (cp.kg + CT_KB - 1) / CT_KB;
    const int64_t tiles = ((cp.p + CT_T - 1) / CT_T) * ((cp.q + CT_T - 1) / CT_T);
    if (cp.groups * kblocks > 65535 || cp.n > 65535 || tiles > 0x7fffffff)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "conv2d level %d: grid too large (%lld tiles, %lld channel blocks, "
                              "batch %lld)", vec ? 3 : 2, (long long)tiles, (long long)(cp.groups * kblocks),
                              (long long)cp.n);
    *cc_max = (int)cc;
    const int64_t sx = (cc * ih * iw + 3) / 4 * 4;
    *smem = (size_t)(sx + cc * CT_KB * cp.r * cp.s) * sizeof(float);
    return NSTF_OK;
}

template <bool NHWC, bool VEC, bool YBF16>
static nstf_status conv_tiled_go(const conv_params &cp, int cc, const u16 *x, const u16 *w, const float *bias, void *y,
                                 gpuStream_t s) {
    const int ih = (int)((CT_T - 1) * cp.sh + (cp.r - 1) * cp.dh + 1), iw = (int)((CT_T - 1) * cp.sw + (cp.s - 1) * cp.dw + 1);
    const int sx = (cc * ih * iw + 3) / 4 * 4;
    const size_t smem = (size_t)(sx + cc * CT_KB * (int)(cp.r * cp.s)) * sizeof(float);
    const int vload = ((uintptr_t)x | (uintptr_t)w) % 16 == 0;
    const int vstore = NHWC && cp.k % CT_KB == 0 && cp.kg % CT_KB == 0 && (uintptr_t)y % 16 == 0;
    const dim3 grid((unsigned)(((cp.p + CT_T - 1) / CT_T) * ((cp.q + CT_T - 1) / CT_T)),
                    (unsigned)(cp.groups * ((cp.kg + CT_KB - 1) / CT_KB)), (unsigned)cp.n);
    conv_tiled_kernel<NHWC, VEC, YBF16><<<grid, CT_THREADS, smem, s>>>(cp, x, w, bias, y, cc, ih, iw, sx, vload, vstore);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

nstf_status conv_tiled_launch(const conv_params &cp, bool nhwc, int vec, const u16 *x, const u16 *w,
                              const float *bias, void *y, bool y_bf16, gpuStream_t s) {
    int cc = 0;
    size_t smem = 0;
    NSTF_TRY(conv_tiled_plan(cp, vec, &cc, &smem));
    const int sel = (nhwc ? 4 : 0) | (vec ? 2 : 0) | (y_bf16 ? 1 : 0);
    switch (sel) {
    case 0: return conv_tiled_go<false, false, false>(cp, cc, x, w, bias, y, s);
    case 1: return conv_tiled_go<false, false, true>(cp, cc, x, w, bias, y, s);
    case 2: return conv_tiled_go<false, true, false>(cp, cc, x, w, bias, y, s);
    case 3: return conv_tiled_go<false, true, true>(cp, cc, x, w, bias, y, s);
    case 4: return conv_tiled_go<true, false, false>(cp, cc, x, w, bias, y, s);
    case 5: return conv_tiled_go<true, false, true>(cp, cc, x, w, bias, y, s);
    case 6: return conv_tiled_go<true, true, false>(cp, cc, x, w, bias, y, s);
    default: return conv_tiled_go<true, true, true>(cp, cc, x, w, bias, y, s);
    }
}
