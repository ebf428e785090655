/* gemv_k_v2.cu — study 2 of the super-block decode GEMV: the Q4_K
 * kernel's loads alone, without its arithmetic, to learn whether the
 * access pattern or the arithmetic keeps gemvk_i8.cu's Q4_K GEMV at
 * 45-55% of the copy rate on the 8B shapes (its measurements are in
 * docs/PERFORMANCE.md, "Q4_K decode GEMV: the loads alone").
 *
 * Every probe reads the whole Q4_K matrix once, folds the words it read
 * into one value per row (so nothing is dead) and stores it; no x, no
 * dot products. Probes:
 *  - "hdrH":  gemvk_i8.cu's pattern: a warp owns RPW rows; per step lane
 *             c of super-block sbl (4 per step) loads 16 bytes of codes
 *             (L1 bypassed) and the header as HDR says (probe_gk8);
 *  - "rowrun": a warp owns RPW rows and reads each as one run, 512
 *             contiguous bytes a step (32 lanes x 16 bytes);
 *  - "flat":  the matrix as one run of bytes, 512 per warp step (the
 *             read-only ceiling at that occupancy).
 * Occupancy can be capped by dynamic shared memory (bpsm in main: 0 as
 * many blocks as the registers allow; 2 or 3 per SM, what the production
 * kernel's 94 / 74 registers give). A first run with all three read the
 * same within 3%, so only 0 is on the list.
 * Usage: gemv_k_v2 [REPS]. Not a production kernel. */
#include "gemv_study.h" /* study_ld_w, CK */

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define QK 144 /* bytes of a Q4_K super-block */

static __device__ __forceinline__ uint32_t fold(uint4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

/* A warp's RPW row values summed over its lanes, stored by lane 0. */
template <int RPW>
static __device__ __forceinline__ void store_rows(const uint32_t (&acc)[RPW], int row0, int n_out, uint32_t *y,
                                                  int lane) {
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        uint32_t v = acc[r];
#pragma unroll
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && row0 + r < n_out) y[row0 + r] = v;
    }
}

/* HDR: 0 no header, 1 the header through L1 (gemvk_i8.cu), 2 the header
 * bypassing L1 as the codes do, 3 the header from lanes 0..3 of the
 * super-block's 8 (4 bytes each) broadcast by shuffles, 4 the split
 * layout: the row's codes (128 bytes a super-block) first, then its
 * headers (16 bytes each), so a step's 4 headers are 64 contiguous bytes. */
template <int RPW, int UNR, int HDR>
__global__ void __launch_bounds__(256) probe_gk8(const uint8_t *__restrict__ w, size_t rb, uint32_t *__restrict__ y,
                                                 int nsb, int n_out) {
    const int lane = threadIdx.x & 31, row0 = (blockIdx.x * 8 + threadIdx.x / 32) * RPW;
    if (row0 >= n_out) return;
    const int sbl = lane >> 3, c = lane & 7;
    uint32_t acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0;
    for (int s0 = 0; s0 < nsb; s0 += 4 * UNR) {
        uint4 q[UNR][RPW], h[UNR][RPW];
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int sb = s0 + 4 * u + sbl;
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const uint8_t *row = w + (size_t)min(row0 + r, n_out - 1) * rb;
                const int g = min(sb, nsb - 1);
                const uint8_t *b = row + (size_t)g * QK;
                if (HDR == 4) {
                    q[u][r] = study_ld_w(row + 128 * (size_t)g + 16 * c);
                    h[u][r] = *(const uint4 *)(row + 128 * (size_t)nsb + 16 * (size_t)g);
                } else {
                    q[u][r] = study_ld_w(b + 16 + 16 * c);
                    if (HDR == 1) h[u][r] = *(const uint4 *)b;
                    if (HDR == 2) h[u][r] = study_ld_w(b);
                    if (HDR == 3) h[u][r].x = c < 4 ? *(const uint32_t *)(b + 4 * c) : 0u;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < UNR; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                uint32_t hv = 0;
                if (HDR == 1 || HDR == 2 || HDR == 4) hv = fold(h[u][r]);
                if (HDR == 3) { /* the four words from lanes 8 sbl .. 8 sbl + 3 */
                    const int l0 = lane & ~7;
                    hv = __shfl_sync(0xffffffffu, h[u][r].x, l0) ^ __shfl_sync(0xffffffffu, h[u][r].x, l0 + 1) ^
                         __shfl_sync(0xffffffffu, h[u][r].x, l0 + 2) ^ __shfl_sync(0xffffffffu, h[u][r].x, l0 + 3);
                }
                acc[r] += fold(q[u][r]) ^ hv;
            }
    }
    store_rows<RPW>(acc, row0, n_out, y, lane);
}

template <int RPW, int UNR>
__global__ void __launch_bounds__(256) probe_rowrun(const uint8_t *__restrict__ w, size_t rb, uint32_t *__restrict__ y,
                                                    int nsb, int n_out) {
    const int lane = threadIdx.x & 31, row0 = (blockIdx.x * 8 + threadIdx.x / 32) * RPW;
    if (row0 >= n_out) return;
    const int n16 = (int)(rb / 16);
    uint32_t acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0;
    for (int i0 = 0; i0 < n16; i0 += 32 * UNR) {
        uint4 q[UNR][RPW];
#pragma unroll
        for (int u = 0; u < UNR; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const int i = min(i0 + 32 * u + lane, n16 - 1);
                q[u][r] = study_ld_w(w + (size_t)min(row0 + r, n_out - 1) * rb + 16 * (size_t)i);
            }
#pragma unroll
        for (int u = 0; u < UNR; u++)
#pragma unroll
            for (int r = 0; r < RPW; r++) acc[r] += fold(q[u][r]);
    }
    store_rows<RPW>(acc, row0, n_out, y, lane);
}

/* The matrix as flat bytes: warp g of G reads 512-byte pieces g, g + G, ... */
template <int UNR>
__global__ void __launch_bounds__(256) probe_flat(const uint8_t *__restrict__ w, size_t rb, uint32_t *__restrict__ y,
                                                  int nsb, int n_out) {
    const int lane = threadIdx.x & 31, wg = blockIdx.x * 8 + threadIdx.x / 32, nw = gridDim.x * 8;
    const size_t n512 = rb * (size_t)n_out / 512;
    uint32_t acc = 0;
    for (size_t p0 = wg; p0 < n512; p0 += (size_t)nw * UNR) {
        uint4 q[UNR];
#pragma unroll
        for (int u = 0; u < UNR; u++) q[u] = study_ld_w(w + 512 * min(p0 + (size_t)nw * u, n512 - 1) + 16 * lane);
#pragma unroll
        for (int u = 0; u < UNR; u++) acc += fold(q[u]);
    }
    for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0 && wg < n_out) y[wg] = acc;
}

typedef void (*probe_fn)(const uint8_t *, size_t, uint32_t *, int, int);
struct probe {
    const char *name;
    probe_fn fn;
    int rpw; /* rows per warp; 0: flat (grid from the SM count) */
};
#define G(R, U, H) {"hdr" #H " r" #R " u" #U, probe_gk8<R, U, H>, R}
static const probe probes[] = {
    G(4, 1, 1), G(2, 2, 1), G(4, 1, 0), G(2, 2, 0), G(4, 1, 2), G(2, 2, 2),
    G(4, 1, 3), G(2, 2, 3), G(4, 1, 4), G(2, 2, 4),
    {"rowrun r4 u1", probe_rowrun<4, 1>, 4}, {"rowrun r2 u2", probe_rowrun<2, 2>, 2}, {"rowrun r4 u2", probe_rowrun<4, 2>, 4},
    {"flat u1", probe_flat<1>, 0},          {"flat u4", probe_flat<4>, 0},
};

int main(int argc, char **argv) {
    const int reps = argc > 1 ? std::max(1, atoi(argv[1])) : 7;
    nstf_gpu_info info;
    cudaStream_t s;
    double copy_gbs;
    if (!study_open("gemv_k_v2", reps, &info, &s, &copy_gbs)) return 77;
    printf("Q4_K matrices read once per launch (no arithmetic); us (GB/s, %% of copy); "
           "blocks/SM set by dynamic shared memory\n");
    const study_shape shapes[] = {{"8B q/o 4096->4096", 4096, 4096},
                                  {"8B gate/up 4096->14336", 4096, 14336},
                                  {"8B gate|up 4096->28672", 4096, 28672},
                                  {"8B down 14336->4096", 14336, 4096}};
    const int bpsm[] = {0}; /* blocks per SM, 0: as many as fit (3, 2: the production kernel's) */
    for (const probe &p : probes)
        CK(cudaFuncSetAttribute(p.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    for (const study_shape &sh : shapes) {
        const size_t rb = (size_t)sh.n_in / 256 * QK, wbytes = rb * sh.n_out;
        const int n_copies = (int)std::max<size_t>(1, ((256ull << 20) + wbytes - 1) / wbytes);
        uint8_t *w;
        uint32_t *y;
        CK(cudaMalloc(&w, wbytes * n_copies));
        CK(cudaMemset(w, 0x5a, wbytes * n_copies));
        CK(cudaMalloc(&y, (size_t)sh.n_out * 4));
        printf("\n%s: %.1f MB, copy-rate time %.2f us\n", sh.name, wbytes / 1e6, wbytes / (copy_gbs * 1e9) * 1e6);
        for (const probe &p : probes)
            for (int b : bpsm) {
                const size_t smem = b ? (size_t)(228 * 1024 / b - 2048) : 0;
                const int blocks = p.rpw ? (sh.n_out + 8 * p.rpw - 1) / (8 * p.rpw) : info.n_sm * (b ? b : 8);
                const double ms = time_batch_ms(s, 3, 20, reps, [&](int i) {
                    p.fn<<<blocks, 256, smem, s>>>(w + (size_t)(i % n_copies) * wbytes, rb, y, sh.n_in / 256, sh.n_out);
                });
                CK(cudaGetLastError());
                const double gbs = wbytes / (ms * 1e-3) / 1e9;
                printf("    %-16s %s %7.2f us (%5.0f GB/s, %4.1f%%)\n", p.name,
                       b == 0 ? "all  " : b == 3 ? "3/SM " : "2/SM ", ms * 1e3, gbs, 100.0 * gbs / copy_gbs);
            }
        CK(cudaFree(w));
        CK(cudaFree(y));
    }
    CK(cudaStreamDestroy(s));
    return 0;
}
