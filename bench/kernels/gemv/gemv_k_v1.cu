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
#include "gemv_study.h" /* study_ld_w, xq16_kernel, the case's host side */

/* ---- device -------------------------------------------------------------- */

static __device__ __forceinline__ int v1_dp4a(uint32_t a, uint32_t b, int c) { return __dp4a((int)a, (int)b, c); }

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
                    q[u][r] = study_ld_w(b + 16 + 16 * c);
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
    study_store_rows<RPW>(acc, row0, n_out, y, lane);
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
    study_store_rows<RPW>(acc, row0, n_out, y, lane);
}

/* ---- host ---------------------------------------------------------------- */

struct variant {
    const char *name;
    study_fn fn;
    int rpw;
};
#define V(T, R, U) {#T " r" #R " u" #U, gemv_##T##_v1<R, U>, R}
static const variant q4k_variants[] = {V(q4k, 1, 2), V(q4k, 2, 1), V(q4k, 2, 2), V(q4k, 4, 1), V(q4k, 4, 2)};
static const variant q6k_variants[] = {V(q6k, 1, 2), V(q6k, 2, 1), V(q6k, 2, 2), V(q6k, 4, 1), V(q6k, 4, 2)};

static int g_reps = 7;


int main(int argc, char **argv) {
    if (argc > 1) g_reps = std::max(1, atoi(argv[1]));
    const char *shape_filter = argc > 2 ? argv[2] : "", *var_filter = argc > 3 ? argv[3] : "";
    nstf_gpu_info info;
    cudaStream_t s;
    double copy_gbs;
    if (!study_open("gemv_k_v1", g_reps, &info, &s, &copy_gbs)) return 77;

    const study_shape shapes[] = {{"8B q/o 4096->4096", 4096, 4096},       {"8B k/v 4096->1024", 4096, 1024},
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
        for (const study_shape &sh : shapes) {
            if (t == NSTF_TYPE_Q4_K && sh.n_out == 128256) continue; /* logits are Q6_K in Q4_K_M */
            if (!strstr(sh.name, shape_filter)) continue;
            study_case cs;
            if (!nstf_type_row_bytes(t, sh.n_in, &cs.rb)) continue;
            /* correctness on the first copy: real quantized rows (at most 2048, repeated) */
            if (!study_case_make(t, sh, cs)) { printf("quantize failed\n"); return 1; }
            const uint64_t rb = cs.rb;
            const size_t wbytes = rb * (size_t)sh.n_out;
            const int n_copies = (int)std::max<uint64_t>(1, ((256ull << 20) + wbytes - 1) / wbytes);
            uint8_t *w = study_upload(cs, cs.hw, n_copies);
            study_dev d = study_dev_make(cs);
            const study_base base = study_production(sh.name, cs, d, w, n_copies, copy_gbs, g_reps, s);
            for (int v = 0; v < n_vars; v++) {
                const variant &V = vars[v];
                if (!strstr(V.name, var_filter)) continue;
                const int groups = (sh.n_out + V.rpw - 1) / V.rpw;
                const int blocks = (groups + 7) / 8;
                CK(cudaMemset(d.y, 0xff, (size_t)sh.n_out * 2));
                study_xq(cs, d, s);
                V.fn<<<blocks, 256, 0, s>>>(w, rb, d.xh, d.xl, d.ds, d.y, sh.n_in, sh.n_out);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                const auto ev = study_nmse(cs, d.y);
                const double ms = time_batch_ms(s, 3, 20, g_reps, [&](int i) {
                    V.fn<<<blocks, 256, 0, s>>>(w + (size_t)(i % n_copies) * wbytes, rb, d.xh, d.xl, d.ds, d.y,
                                               sh.n_in, sh.n_out);
                });
                if (!study_report(V.name, ms, ev, base)) bad++;
            }
            CK(cudaFree(w));
            study_dev_free(d);
        }
    }
    printf("\n%s\n", bad ? "some variant FAILED its check" : "all variants within 2x the bf16 rounding of the reference");
    CK(cudaStreamDestroy(s));
    return bad ? 1 : 0;
}
