/* gemv_k_v1.cu — study 1 of the super-block decode GEMV (Q4_K, Q6_K, one
 * token) on integer dot products, against the library's kernel
 * (nstf_gpu_gemv: gemvk_i8.cu, which came out of this study; gemvk.cu's
 * float kernel before it) and the copy rate, in one run on one card.
 *
 * The idea under study:
 *  - x is quantized once per GEMV input, not staged by every block: per 32
 *    elements a scale dx = max|x| / 32639 and x / dx rounded to a 16-bit
 *    integer q, kept as two int8 planes (q = 256 hi + lo), plus the exact
 *    fp32 sum of the 32 values (for Q4_K's min term). One tiny kernel
 *    (xq16) writes that; the GEMV reads it through L1 (8.6 KB for 4096
 *    inputs), so a block has no staging phase and no __syncthreads.
 *  - A warp owns RPW rows; its 32 lanes cover four super-blocks per step
 *    (8 lanes per super-block, 16 bytes of codes each, 16-byte loads that
 *    bypass L1). UNR steps' loads are issued before any is consumed.
 *  - Codes meet x in dp4a: per 4 codes two dp4a (hi and lo plane), the
 *    sums exact in int32; per sub-block one conversion and fma.
 * Error: |x - dx q| <= dx / 2 = max|x| / 65278 per element, well inside a
 * bf16 rounding of x (2^-9 relative); the check below prints NMSE against
 * a double reference for both kernels.
 *
 * Usage: gemv_k_v1 [REPS [SHAPE [VARIANT]]] (substrings of the names).
 * Not a production kernel: the study's numbers are in docs/PERFORMANCE.md
 * ("Q4_K and Q6_K decode GEMV on integer dot products"); a persistent
 * variant with a ring of steps in flight per warp measured 0.7-0.9x of
 * these and was dropped. */
#include "ops/gpu/gpu_api.h"
#include "ops/gpu/quant.h"
#include "../common/gpu_time.h" /* time_batch_ms; bench_util.h: DEV_CHECK, bf2f / f2bf, core/dtype.h */

#include <algorithm>
#include <vector>

#define CK DEV_CHECK
#define NK(call)                                                                                     \
    do {                                                                                             \
        if ((call) != NSTF_OK) { fprintf(stderr, "%s: %s\n", #call, nstf_last_error()); exit(1); }   \
    } while (0)

/* ---- device -------------------------------------------------------------- */

static __device__ __forceinline__ int v1_dp4a(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }

/* 16 bytes of weights, not kept in L1 (x lives there). */
static __device__ __forceinline__ uint4 v1_ld_w(const uint8_t *p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* One warp per 32 elements: the two planes and (dx, sum). */
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

static __device__ __forceinline__ uint32_t v1_byte(uint32_t w, int i) { return (w >> (8 * i)) & 0xffu; }

/* Q4_K. Lane: super-block 4 step + lane / 8, code chunk c = lane % 8 =
 * (pair p, half h): bytes qs[16 c .. 16 c + 15] hold elements
 * 64 p + 16 h + i (low nibbles, sub-block 2p) and 64 p + 32 + 16 h + i
 * (high nibbles, sub-block 2p + 1). */
template <int RPW, int UNR>
__global__ void __launch_bounds__(256)
gemv_q4k_v1(const uint8_t *__restrict__ w, size_t row_bytes, const int8_t *__restrict__ xh,
            const int8_t *__restrict__ xl, const float2 *__restrict__ ds, uint16_t *__restrict__ y, int n_in,
            int n_out) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= n_out) return;
    const uint8_t *wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) wr[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
    const int nsb = n_in / 256, sbl = lane >> 3, c = lane & 7, p = c >> 1, h = c & 1;
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    for (int s0 = 0; s0 < nsb; s0 += 4 * UNR) {
        uint4 q[UNR][RPW], hd[UNR][RPW];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int sb = s0 + 4 * u + sbl;
            if (sb < nsb) {
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const uint8_t *b = wr[r] + (size_t)sb * 144;
                    q[u][r] = v1_ld_w(b + 16 + 16 * c);
                    hd[u][r] = *(const uint4 *)b;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int sb = s0 + 4 * u + sbl;
            if (sb >= nsb) break;
            const int e = 256 * sb + 64 * p + 16 * h;
            const uint4 xa = *(const uint4 *)(xh + e), xb = *(const uint4 *)(xh + e + 32);
            const uint4 la = *(const uint4 *)(xl + e), lb = *(const uint4 *)(xl + e + 32);
            const float4 dd = *(const float4 *)(ds + 8 * sb + 2 * p); /* dx0, sum0, dx1, sum1 */
            const uint32_t xav[4] = {xa.x, xa.y, xa.z, xa.w}, xbv[4] = {xb.x, xb.y, xb.z, xb.w};
            const uint32_t lav[4] = {la.x, la.y, la.z, la.w}, lbv[4] = {lb.x, lb.y, lb.z, lb.w};
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t qv[4] = {q[u][r].x, q[u][r].y, q[u][r].z, q[u][r].w};
                int a0 = 0, b0 = 0, a1 = 0, b1 = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint32_t lo = qv[k] & 0x0f0f0f0fu, hi = (qv[k] >> 4) & 0x0f0f0f0fu;
                    a0 = v1_dp4a(lo, xav[k], a0);
                    b0 = v1_dp4a(lo, lav[k], b0);
                    a1 = v1_dp4a(hi, xbv[k], a1);
                    b1 = v1_dp4a(hi, lbv[k], b1);
                }
                const uint4 H = hd[u][r];
                const float d = nstf_h2f(H.x), dmin = nstf_h2f(H.x >> 16);
                uint32_t sc0, m0, sc1, m1;
                if (p < 2) { /* j = 2p, 2p + 1 < 4: scales[j] & 63, scales[j + 4] & 63 */
                    sc0 = v1_byte(H.y, 2 * p) & 63, sc1 = v1_byte(H.y, 2 * p + 1) & 63;
                    m0 = v1_byte(H.z, 2 * p) & 63, m1 = v1_byte(H.z, 2 * p + 1) & 63;
                } else { /* j >= 4: low / high nibble of scales[j + 4], top bits of scales[j - 4] / [j] */
                    const int j0 = 2 * p - 4;
                    const uint32_t s80 = v1_byte(H.w, j0), s81 = v1_byte(H.w, j0 + 1);
                    sc0 = (s80 & 15) | ((v1_byte(H.y, j0) >> 6) << 4);
                    sc1 = (s81 & 15) | ((v1_byte(H.y, j0 + 1) >> 6) << 4);
                    m0 = (s80 >> 4) | ((v1_byte(H.z, j0) >> 6) << 4);
                    m1 = (s81 >> 4) | ((v1_byte(H.z, j0 + 1) >> 6) << 4);
                }
                const float S0 = (float)(a0 * 256 + b0), S1 = (float)(a1 * 256 + b1);
                const float t = fmaf((float)sc0 * dd.x, S0, (float)sc1 * dd.z * S1);
                /* the min term once per sub-block: the h = 0 lane (the x sums cover all 32) */
                const float mn = h ? 0.0f : fmaf((float)m0, dd.y, (float)m1 * dd.w);
                acc[r] = fmaf(d, t, fmaf(-dmin, mn, acc[r]));
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && row0 + r < n_out) ((nstf_bf16 *)y)[row0 + r] = nstf_float_to_bf16(v);
    }
}

/* Q6_K (210 bytes: ql[128], qh[64], scales[16] int8, d). Lane: super-block
 * 4 step + lane / 8, c = lane % 8 = (half n, g): ql[64 n + 16 g ..] holds
 * elements 128 n + 16 g + i (low nibbles, scale 8 n + g) and 128 n + 64 +
 * 16 g + i (high, scale 8 n + 4 + g); their top bits are qh[32 n + 16 (g &
 * 1) + i] at bits 2 (g >> 1) and 4 + 2 (g >> 1). Blocks are 2-byte aligned:
 * runs load as five words and realign (quant.h). */
template <int RPW, int UNR>
__global__ void __launch_bounds__(256)
gemv_q6k_v1(const uint8_t *__restrict__ w, size_t row_bytes, const int8_t *__restrict__ xh,
            const int8_t *__restrict__ xl, const float2 *__restrict__ ds, uint16_t *__restrict__ y, int n_in,
            int n_out) {
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    if (row0 >= n_out) return;
    const uint8_t *wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) wr[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
    const int nsb = n_in / 256, sbl = lane >> 3, c = lane & 7, n = c >> 2, g = c & 3;
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    for (int s0 = 0; s0 < nsb; s0 += 4 * UNR) {
        nstf_run16 ql[UNR][RPW], qh[UNR][RPW];
        uint32_t sc[UNR][RPW];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int sb = s0 + 4 * u + sbl;
            if (sb < nsb) {
#pragma unroll
                for (int r = 0; r < RPW; r++) {
                    const uint8_t *b = wr[r] + (size_t)sb * 210;
                    ql[u][r] = nstf_ld_run16_a2(b + 64 * n + 16 * g);
                    qh[u][r] = nstf_ld_run16_a2(b + 128 + 32 * n + 16 * (g & 1));
                    sc[u][r] = b[192 + 8 * n + g] | ((uint32_t)b[196 + 8 * n + g] << 8) | (nstf_ld_u16(b + 208) << 16);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int sb = s0 + 4 * u + sbl;
            if (sb >= nsb) break;
            const int e = 256 * sb + 128 * n + 16 * g; /* low run; high run at e + 64 */
            const uint4 xa = *(const uint4 *)(xh + e), xb = *(const uint4 *)(xh + e + 64);
            const uint4 la = *(const uint4 *)(xl + e), lb = *(const uint4 *)(xl + e + 64);
            const float dx0 = ds[e / 32].x, dx1 = ds[e / 32 + 2].x;
            const uint32_t xav[4] = {xa.x, xa.y, xa.z, xa.w}, xbv[4] = {xb.x, xb.y, xb.z, xb.w};
            const uint32_t lav[4] = {la.x, la.y, la.z, la.w}, lbv[4] = {lb.x, lb.y, lb.z, lb.w};
            const int sh = 2 * (g >> 1);
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint32_t mis = (uint32_t)((uintptr_t)(wr[r] + (size_t)sb * 210) & 2);
                int a0 = 0, b0 = 0, a1 = 0, b1 = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint32_t L = nstf_run16_word(ql[u][r].w, k, mis), Hh = nstf_run16_word(qh[u][r].w, k, mis);
                    const uint32_t lo = __vsub4((L & 0x0f0f0f0fu) | (((Hh >> sh) & 0x03030303u) << 4), 0x20202020u);
                    const uint32_t hi =
                        __vsub4(((L >> 4) & 0x0f0f0f0fu) | (((Hh >> (sh + 4)) & 0x03030303u) << 4), 0x20202020u);
                    a0 = v1_dp4a(lo, xav[k], a0);
                    b0 = v1_dp4a(lo, lav[k], b0);
                    a1 = v1_dp4a(hi, xbv[k], a1);
                    b1 = v1_dp4a(hi, lbv[k], b1);
                }
                const uint32_t s = sc[u][r];
                const float d = nstf_h2f(s >> 16);
                const float t = fmaf((float)(int8_t)(s & 0xff) * dx0, (float)(a0 * 256 + b0),
                                     (float)(int8_t)((s >> 8) & 0xff) * dx1 * (float)(a1 * 256 + b1));
                acc[r] = fmaf(d, t, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        float v = acc[r];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && row0 + r < n_out) ((nstf_bf16 *)y)[row0 + r] = nstf_float_to_bf16(v);
    }
}

/* ---- host ---------------------------------------------------------------- */

typedef void (*v1_fn)(const uint8_t *, size_t, const int8_t *, const int8_t *, const float2 *, uint16_t *, int, int);
struct variant {
    const char *name;
    v1_fn fn;
    int rpw;
};
#define V(T, R, U) {#T " r" #R " u" #U, gemv_##T##_v1<R, U>, R}
static const variant q4k_variants[] = {V(q4k, 1, 2), V(q4k, 2, 1), V(q4k, 2, 2), V(q4k, 4, 1), V(q4k, 4, 2)};
static const variant q6k_variants[] = {V(q6k, 1, 2), V(q6k, 2, 1), V(q6k, 2, 2), V(q6k, 4, 1), V(q6k, 4, 2)};

static int g_reps = 7;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double urand(void) { return 0.5 * (bench_uniform(&g_rng) + 1.0); } /* [0, 1) */

struct shape {
    const char *name;
    int n_in, n_out;
};

int main(int argc, char **argv) {
    if (argc > 1) g_reps = std::max(1, atoi(argv[1]));
    const char *shape_filter = argc > 2 ? argv[2] : "", *var_filter = argc > 3 ? argv[3] : "";
    if (nstf_gpu_device_count() < 1) { printf("gemv_k_v1: no GPU\n"); return 77; }
    nstf_gpu_info info;
    NK(nstf_gpu_query(0, &info));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    const double copy_gbs = copy_rate_gbs(s, g_reps); /* the ceiling */
    printf("device: %s (%s), %d SMs; copy %.0f GB/s (read+write of 1 GiB)\n", info.name, info.arch, info.n_sm,
           copy_gbs);

    const shape shapes[] = {{"8B q/o 4096->4096", 4096, 4096},       {"8B k/v 4096->1024", 4096, 1024},
                            {"8B gate/up 4096->14336", 4096, 14336}, {"8B gate|up 4096->28672", 4096, 28672},
                            {"8B down 14336->4096", 14336, 4096},    {"8B logits 4096->128256", 4096, 128256},
                            {"1B q/o 2048->2048", 2048, 2048},       {"1B gate/up 2048->8192", 2048, 8192},
                            {"1B down 8192->2048", 8192, 2048},      {"ragged 768->1001", 768, 1001}};
    const nstf_type types[] = {NSTF_TYPE_Q4_K, NSTF_TYPE_Q6_K};
    int bad = 0;
    for (nstf_type t : types) {
        const variant *vars = t == NSTF_TYPE_Q4_K ? q4k_variants : q6k_variants;
        const int n_vars = t == NSTF_TYPE_Q4_K ? (int)(sizeof q4k_variants / sizeof q4k_variants[0])
                                              : (int)(sizeof q6k_variants / sizeof q6k_variants[0]);
        printf("\n%s: us (GB/s, %% of copy); v1 times exclude xq16 (its own column)\n", nstf_type_name(t));
        for (const shape &sh : shapes) {
            if (t == NSTF_TYPE_Q4_K && sh.n_out == 128256) continue; /* logits are Q6_K in Q4_K_M */
            if (!strstr(sh.name, shape_filter)) continue;
            uint64_t rb = 0;
            if (!nstf_type_row_bytes(t, sh.n_in, &rb)) continue;
            const size_t wbytes = rb * (size_t)sh.n_out;
            const int n_copies = (int)std::max<uint64_t>(1, ((256ull << 20) + wbytes - 1) / wbytes);
            /* correctness on the first copy: real quantized rows (at most 2048, repeated) */
            const int n_check = std::min(sh.n_out, 2048);
            std::vector<uint8_t> hw((size_t)rb * n_check);
            std::vector<float> row(sh.n_in);
            for (int r = 0; r < n_check; r++) {
                for (int i = 0; i < sh.n_in; i++) row[i] = (float)((urand() - 0.5) * (1.0 + 3.0 * (i % 7 == 0)));
                if (!nstf_quantize_row(t, row.data(), hw.data() + (size_t)r * rb, sh.n_in)) { printf("quantize failed\n"); return 1; }
            }
            std::vector<uint16_t> hx(sh.n_in);
            for (int i = 0; i < sh.n_in; i++) hx[i] = f2bf((float)((urand() - 0.5) * 4.0 * (i % 13 == 0 ? 8.0 : 1.0)));
            uint8_t *w;
            CK(cudaMalloc(&w, wbytes * n_copies));
            CK(cudaMemset(w, 0x11, wbytes * n_copies));
            for (int r = 0; r < sh.n_out; r += n_check)
                CK(cudaMemcpy(w + (size_t)r * rb, hw.data(), (size_t)rb * std::min(n_check, sh.n_out - r),
                              cudaMemcpyHostToDevice));
            uint16_t *x, *y;
            int8_t *xh, *xl;
            float2 *ds;
            CK(cudaMalloc(&x, sh.n_in * 2));
            CK(cudaMalloc(&y, (size_t)sh.n_out * 2));
            CK(cudaMalloc(&xh, sh.n_in));
            CK(cudaMalloc(&xl, sh.n_in));
            CK(cudaMalloc(&ds, (size_t)(sh.n_in / 32) * sizeof(float2)));
            CK(cudaMemcpy(x, hx.data(), sh.n_in * 2, cudaMemcpyHostToDevice));
            /* the double reference of the checked rows */
            std::vector<double> ref(n_check);
            std::vector<float> deq(sh.n_in);
            for (int r = 0; r < n_check; r++) {
                nstf_dequantize_row(t, hw.data() + (size_t)r * rb, deq.data(), sh.n_in);
                double acc = 0;
                for (int i = 0; i < sh.n_in; i++) acc += (double)deq[i] * bf2f(hx[i]);
                ref[r] = acc;
            }
            std::vector<uint16_t> hy(sh.n_out);
            auto nmse = [&]() {
                CK(cudaMemcpy(hy.data(), y, (size_t)sh.n_out * 2, cudaMemcpyDeviceToHost));
                double e = 0, n2 = 0, bfe = 0;
                for (int r = 0; r < n_check; r++) {
                    const double d = bf2f(hy[r]) - ref[r];
                    e += d * d, n2 += ref[r] * ref[r];
                    const double b = bf2f(f2bf((float)ref[r])) - ref[r];
                    bfe += b * b;
                }
                return std::make_pair(e / n2, bfe / n2);
            };
            const int xblocks = (sh.n_in / 32 + 7) / 8;
            auto xq = [&]() { xq16_kernel<<<xblocks, 256, 0, s>>>(x, sh.n_in, xh, xl, ds); };
            const double bytes = (double)wbytes + sh.n_in * 2.0 + sh.n_out * 2.0;
            NK(nstf_gpu_gemv(t, w, x, y, NSTF_TYPE_BF16, 1, sh.n_in, sh.n_out, s));
            CK(cudaStreamSynchronize(s));
            const auto ep = nmse();
            const double pms = time_batch_ms(s, 3, 20, g_reps, [&](int i) {
                NK(nstf_gpu_gemv(t, w + (size_t)(i % n_copies) * wbytes, x, y, NSTF_TYPE_BF16, 1, sh.n_in, sh.n_out, s));
            });
            const double xms = time_batch_ms(s, 3, 20, g_reps, [&](int) { xq(); });
            printf("%-24s %7.1f MB  copy-rate time %6.2f us | production %7.2f us (%5.0f GB/s, %4.1f%%) nmse %.1e "
                   "(bf16 rounding %.1e) | xq16 %5.2f us\n",
                   sh.name, wbytes / 1e6, bytes / (copy_gbs * 1e9) * 1e6, pms * 1e3, bytes / (pms * 1e-3) / 1e9,
                   100.0 * bytes / (pms * 1e-3) / 1e9 / copy_gbs, ep.first, ep.second, xms * 1e3);
            for (int v = 0; v < n_vars; v++) {
                const variant &V = vars[v];
                if (!strstr(V.name, var_filter)) continue;
                const int groups = (sh.n_out + V.rpw - 1) / V.rpw;
                const int blocks = (groups + 7) / 8;
                CK(cudaMemset(y, 0xff, (size_t)sh.n_out * 2));
                xq();
                V.fn<<<blocks, 256, 0, s>>>(w, rb, xh, xl, ds, y, sh.n_in, sh.n_out);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                const auto ev = nmse();
                const bool ok = ev.first <= 2.0 * ep.second + 1e-9 && ev.first == ev.first;
                if (!ok) bad++;
                const double ms = time_batch_ms(s, 3, 20, g_reps, [&](int i) {
                    V.fn<<<blocks, 256, 0, s>>>(w + (size_t)(i % n_copies) * wbytes, rb, xh, xl, ds, y, sh.n_in,
                                               sh.n_out);
                });
                printf("    %-12s %7.2f us (%5.0f GB/s, %4.1f%%) nmse %.1e %s  x%.2f vs production (with xq16 x%.2f)\n",
                       V.name, ms * 1e3, bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_gbs,
                       ev.first, ok ? "ok" : "FAIL", pms / ms, pms / (ms + xms));
            }
            CK(cudaFree(w));
            CK(cudaFree(x));
            CK(cudaFree(y));
            CK(cudaFree(xh));
            CK(cudaFree(xl));
            CK(cudaFree(ds));
        }
    }
    printf("\n%s\n", bad ? "some variant FAILED its check" : "all variants within 2x the bf16 rounding of the reference");
    CK(cudaStreamDestroy(s));
    return bad ? 1 : 0;
}
