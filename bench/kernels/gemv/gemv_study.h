/* gemv_study.h — what the numbered decode-GEMV studies share
 * (gemv_k_v1.cu, gemv_q40_v2.cu): the weight load that bypasses L1, x
 * quantized once (xq16: per 32 elements the two int8 planes of the 16-bit
 * fixed point and the pair (dx, sum)), and the host side of a case: real
 * quantized rows, a bf16 x, their double reference and the NMSE of an
 * output against it. Not a production header. */
#ifndef NSTF_BENCH_GEMV_STUDY_H
#define NSTF_BENCH_GEMV_STUDY_H

#include "ops/gpu/gpu_api.h"
#include "ops/gpu/quant.h"
#include "../common/gpu_time.h" /* time_batch_ms; bench_util.h: DEV_CHECK, bf2f / f2bf, core/dtype.h */

#include <algorithm>
#include <utility>
#include <vector>

#define CK DEV_CHECK
#define NK(call)                                                                                     \
    do {                                                                                             \
        if ((call) != NSTF_OK) { fprintf(stderr, "%s: %s\n", #call, nstf_last_error()); exit(1); }   \
    } while (0)

/* 16 bytes of weights, not kept in L1 (x lives there). */
static __device__ __forceinline__ uint4 study_ld_w(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* One warp per 32 elements: the two planes (element order) and (dx, sum).
 * dx = max|x| / 32639, q = round(x / dx) = 256 hi + lo. */
__global__ void xq16_kernel(const uint16_t *__restrict__ x, int n, int8_t *__restrict__ xh, int8_t *__restrict__ xl,
                            float2 *__restrict__ ds) {
    const int blk = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (blk * 32 >= n) return;
    const float v = __uint_as_float((uint32_t)x[blk * 32 + lane] << 16);
    float amax = fabsf(v), sum = v;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    }
    const float inv = amax > 0.0f ? 32639.0f / amax : 0.0f;
    const int q = __float2int_rn(v * inv);
    const int hi = (q + 128) >> 8, lo = q - 256 * hi;
    xh[blk * 32 + lane] = (int8_t)hi;
    xl[blk * 32 + lane] = (int8_t)lo;
    if (lane == 0) ds[blk] = make_float2(amax / 32639.0f, sum);
}

/* A warp's RPW row sums reduced over its lanes, stored as bf16 by lane 0. */
template <int RPW>
static __device__ __forceinline__ void study_store_rows(const float (&acc)[RPW], int row0, int n_out, uint16_t *y,
                                                        int lane) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && row0 + r < n_out) ((nstf_bf16 *)y)[row0 + r] = nstf_float_to_bf16(v);
    }
}

/* A study kernel: (w, row_bytes, xh, xl, ds, y, n_in, n_out). */
typedef void (*study_fn)(const uint8_t *, size_t, const int8_t *, const int8_t *, const float2 *, uint16_t *, int, int);

struct study_shape {
    const char *name;
    int n_in, n_out;
};

/* A case's host side: the first n_check rows are real quantized rows of t
 * (values with every 7th larger), x bf16 (every 13th larger), ref their
 * products in double. */
struct study_case {
    nstf_type t;
    int n_in, n_out, n_check;
    uint64_t rb;
    std::vector<uint8_t> hw;
    std::vector<uint16_t> hx;
    std::vector<double> ref;
};

static uint64_t g_study_rng = 0x9e3779b97f4a7c15ull;
static inline double study_urand(void) { return 0.5 * (bench_uniform(&g_study_rng) + 1.0); } /* [0, 1) */

/* false: n_in is not whole blocks of t, or the quantizer refused */
static inline bool study_case_make(nstf_type t, const study_shape &sh, study_case &c) {
    c.t = t, c.n_in = sh.n_in, c.n_out = sh.n_out, c.n_check = std::min(sh.n_out, 2048);
    if (!nstf_type_row_bytes(t, sh.n_in, &c.rb)) return false;
    c.hw.assign((size_t)c.rb * c.n_check, 0);
    std::vector<float> row(sh.n_in), deq(sh.n_in);
    for (int r = 0; r < c.n_check; r++) {
        for (int i = 0; i < sh.n_in; i++) row[i] = (float)((study_urand() - 0.5) * (1.0 + 3.0 * (i % 7 == 0)));
        if (!nstf_quantize_row(t, row.data(), c.hw.data() + (size_t)r * c.rb, sh.n_in)) return false;
    }
    c.hx.resize(sh.n_in);
    for (int i = 0; i < sh.n_in; i++) c.hx[i] = f2bf((float)((study_urand() - 0.5) * 4.0 * (i % 13 == 0 ? 8.0 : 1.0)));
    c.ref.resize(c.n_check);
    for (int r = 0; r < c.n_check; r++) {
        nstf_dequantize_row(t, c.hw.data() + (size_t)r * c.rb, deq.data(), sh.n_in);
        double acc = 0;
        for (int i = 0; i < sh.n_in; i++) acc += (double)deq[i] * bf2f(c.hx[i]);
        c.ref[r] = acc;
    }
    return true;
}

/* n_copies device copies of a matrix of n_out rows whose rows repeat the
 * n_check host rows of `rows` (the case's, or a re-laid copy of them). */
static inline uint8_t *study_upload(const study_case &c, const std::vector<uint8_t> &rows, int n_copies) {
    const size_t wbytes = (size_t)c.rb * c.n_out;
    uint8_t *w;
    CK(cudaMalloc(&w, wbytes * n_copies));
    CK(cudaMemset(w, 0x11, wbytes * n_copies));
    for (int r = 0; r < c.n_out; r += c.n_check)
        CK(cudaMemcpy(w + (size_t)r * c.rb, rows.data(), (size_t)c.rb * std::min(c.n_check, c.n_out - r),
                      cudaMemcpyHostToDevice));
    return w;
}

/* NMSE of the checked rows of y (bf16, device) against the reference, and
 * that of the reference rounded to bf16 (the output's own rounding). */
static inline std::pair<double, double> study_nmse(const study_case &c, const uint16_t *y) {
    std::vector<uint16_t> hy(c.n_check);
    CK(cudaMemcpy(hy.data(), y, (size_t)c.n_check * 2, cudaMemcpyDeviceToHost));
    double e = 0, n2 = 0, bfe = 0;
    for (int r = 0; r < c.n_check; r++) {
        const double d = bf2f(hy[r]) - c.ref[r];
        e += d * d, n2 += c.ref[r] * c.ref[r];
        const double b = bf2f(f2bf((float)c.ref[r])) - c.ref[r];
        bfe += b * b;
    }
    return std::make_pair(e / n2, bfe / n2);
}

/* The device side of a case: x (bf16) and y, x quantized once (xq16). */
struct study_dev {
    uint16_t *x, *y;
    int8_t *xh, *xl;
    float2 *ds;
};
static inline study_dev study_dev_make(const study_case &c) {
    study_dev d;
    CK(cudaMalloc(&d.x, c.n_in * 2));
    CK(cudaMalloc(&d.y, (size_t)c.n_out * 2));
    CK(cudaMalloc(&d.xh, c.n_in));
    CK(cudaMalloc(&d.xl, c.n_in));
    CK(cudaMalloc(&d.ds, (size_t)(c.n_in / 32) * sizeof(float2)));
    CK(cudaMemcpy(d.x, c.hx.data(), c.n_in * 2, cudaMemcpyHostToDevice));
    return d;
}
static inline void study_dev_free(study_dev &d) {
    CK(cudaFree(d.x));
    CK(cudaFree(d.y));
    CK(cudaFree(d.xh));
    CK(cudaFree(d.xl));
    CK(cudaFree(d.ds));
}
static inline void study_xq(const study_case &c, const study_dev &d, cudaStream_t s) {
    xq16_kernel<<<(c.n_in / 32 + 7) / 8, 256, 0, s>>>(d.x, c.n_in, d.xh, d.xl, d.ds);
}

/* The library's kernel (nstf_gpu_gemv) on w, timed over its n_copies
 * copies, and xq16 alone; prints the case's line. */
struct study_base {
    double bytes, pms, xms, copy_gbs;
    std::pair<double, double> ep; /* its NMSE, the bf16 rounding's */
};
static inline study_base study_production(const char *name, const study_case &c, const study_dev &d, const uint8_t *w,
                                   int n_copies, double copy_gbs, int reps, cudaStream_t s) {
    study_base b;
    const size_t wbytes = (size_t)c.rb * c.n_out;
    b.copy_gbs = copy_gbs;
    b.bytes = (double)wbytes + c.n_in * 2.0 + c.n_out * 2.0;
    NK(nstf_gpu_gemv(c.t, w, d.x, d.y, NSTF_TYPE_BF16, 1, c.n_in, c.n_out, s));
    CK(cudaStreamSynchronize(s));
    b.ep = study_nmse(c, d.y);
    b.pms = time_batch_ms(s, 3, 20, reps, [&](int i) {
        NK(nstf_gpu_gemv(c.t, w + (size_t)(i % n_copies) * wbytes, d.x, d.y, NSTF_TYPE_BF16, 1, c.n_in, c.n_out, s));
    });
    b.xms = time_batch_ms(s, 3, 20, reps, [&](int) { study_xq(c, d, s); });
    printf("%-24s %7.1f MB  copy-rate time %6.2f us | production %7.2f us (%5.0f GB/s, %4.1f%%) nmse %.1e "
           "(bf16 rounding %.1e) | xq16 %5.2f us\n",
           name, wbytes / 1e6, b.bytes / (copy_gbs * 1e9) * 1e6, b.pms * 1e3, b.bytes / (b.pms * 1e-3) / 1e9,
           100.0 * b.bytes / (b.pms * 1e-3) / 1e9 / copy_gbs, b.ep.first, b.ep.second, b.xms * 1e3);
    return b;
}

/* A variant's line: ms a launch, its NMSE; ok when within 2x the bf16
 * rounding of the reference. */
static inline bool study_report(const char *name, double ms, std::pair<double, double> ev, const study_base &b) {
    const bool ok = ev.first <= 2.0 * b.ep.second + 1e-9 && ev.first == ev.first;
    const double gbs = b.bytes / (ms * 1e-3) / 1e9;
    printf("    %-16s %7.2f us (%5.0f GB/s, %4.1f%%) nmse %.1e %s  x%.2f vs production (with xq16 x%.2f)\n", name,
           ms * 1e3, gbs, 100.0 * gbs / b.copy_gbs, ev.first, ok ? "ok" : "FAIL", b.pms / ms, b.pms / (ms + b.xms));
    return ok;
}

#endif
