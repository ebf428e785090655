/* dequant_v1.cu — study 1 of the prefill's dequantization (get_rows.cu:
 * a whole weight matrix to bf16 before the tile GEMM). Since the GPU keeps
 * Q4_0, IQ4_NL and Q8_0 rows in its split layout (quant.h), prompt
 * processing of those files came out 1-3% slower while decode gained: the
 * dequantization reads the split rows. Question: is the split layout
 * slower to dequantize, or the kernel's shape (8 values a thread), and
 * what shape is fastest for either layout? In one run on one card:
 *
 *  - "lib": nstf_gpu_get_rows on the split copy, ids NULL (the library's
 *    prefill path), and "lib ids": with the row ids 0 .. n - 1, as the
 *    prefill passed them before this study.
 *  - "file 8", "split 8": the library's shape (a thread per 8 values,
 *    quant.h's dq8) on the file's rows and on the split rows; "split 8
 *    ids": the row's id loaded first, as a gather does; "split 8 pdl":
 *    with the programmatic dependent launch's wait and trigger at the
 *    start, as the library's kernels have them; "sm8", "sm32": at most 8
 *    or 32 blocks an SM, each thread looping over the groups (grid-stride).
 *  - "file 32", "split 32": a thread per block of 32 values (four dq8
 *    calls, the loads issued before the stores).
 *  - "split 32 wide": a thread per block, the codes in 16-byte loads
 *    (Q8_0: two, 4-bit types: one), four 16-byte stores.
 *
 * Every variant's output must equal the library's bit for bit (the
 * library's is checked against nstf_dequantize_row here on a few rows,
 * and in test_ops_gpu on every type). Rows: Q8_0 and Q4_0 from the
 * library's quantizer; IQ4_NL (which it does not make) random codes under
 * a fixed scale. GB/s counts the bytes read and
 * written once; % of the copy rate (read + write of 1 GiB).
 *
 * Usage: dequant_v1 [REPS [SHAPE [VARIANT]]] (substrings of the names).
 * Not a production kernel: numbers in docs/PERFORMANCE.md. */
#include "ops/gpu/gpu_api.h"
#include "ops/gpu/quant.h"
#include "../common/gpu_time.h" /* time_batch_ms, copy_rate_gbs; bench_util.h: DEV_CHECK, core/dtype.h */

#include <string.h>
#include <vector>

#define CK DEV_CHECK
#define NK(call)                                                                                     \
    do {                                                                                             \
        if ((call) != NSTF_OK) { fprintf(stderr, "%s: %s\n", #call, nstf_last_error()); exit(1); }   \
    } while (0)

#define DQ_THREADS 256

static __device__ __forceinline__ uint32_t dq_pack(float a, float b) {
    return (uint32_t)nstf_float_to_bf16(a).bits | ((uint32_t)nstf_float_to_bf16(b).bits << 16);
}
static __device__ __forceinline__ void dq_store8(uint16_t *o, const float (&v)[8]) {
    *(uint4 *)o = make_uint4(dq_pack(v[0], v[1]), dq_pack(v[2], v[3]), dq_pack(v[4], v[5]), dq_pack(v[6], v[7]));
}

/* A thread per VPT values (8 or 32), dq8 per 8; nbs 0: the file's rows;
 * ids: the row's id loaded first (0 .. n_rows - 1); PDL: the programmatic
 * dependent launch's wait and trigger at the start, as the library's
 * kernels have them (executed even without such a launch). */
template <int T, int VPT, bool IDS, bool PDL = false>
__global__ void __launch_bounds__(DQ_THREADS)
dq_kernel(const uint8_t *__restrict__ w, size_t rb, int64_t n_rows, int64_t dim, uint16_t *__restrict__ out,
          int64_t nbs, const int32_t *__restrict__ ids) {
    if (PDL) {
        NSTF_PDL_WAIT();
        NSTF_PDL_TRIGGER();
    }
    const int64_t per_row = dim / VPT, total = n_rows * per_row;
    for (int64_t g = (int64_t)blockIdx.x * DQ_THREADS + threadIdx.x; g < total; g += (int64_t)gridDim.x * DQ_THREADS) {
        const int64_t r = g / per_row, i0 = (g - r * per_row) * VPT;
        const int64_t id = IDS ? ids[r] : r;
        float v[VPT / 8][8];
#pragma unroll
        for (int k = 0; k < VPT / 8; k++) dq8<T>(w + (size_t)id * rb, i0 + 8 * k, v[k], nbs);
#pragma unroll
        for (int k = 0; k < VPT / 8; k++) dq_store8(out + r * dim + i0 + 8 * k, v[k]);
    }
}

/* A thread per block of a split row: the codes in 16-byte loads. */
template <int T>
__global__ void __launch_bounds__(DQ_THREADS)
dq_wide_kernel(const uint8_t *__restrict__ w, size_t rb, int64_t n_rows, int64_t dim, uint16_t *__restrict__ out,
               int64_t nbs, const int32_t *__restrict__ ids) {
    constexpr int CB = nstf_q_block_bytes(T) - 2;
    const int64_t total = n_rows * nbs;
    for (int64_t g = (int64_t)blockIdx.x * DQ_THREADS + threadIdx.x; g < total; g += (int64_t)gridDim.x * DQ_THREADS) {
        const int64_t r = g / nbs, b = g - r * nbs;
        const uint8_t *row = w + (size_t)r * rb;
        const float d = nstf_h2f(nstf_ld_u16(row + 2 * b));
        const uint4 q0 = *(const uint4 *)(row + 2 * nbs + CB * b);
        uint4 q1 = q0;
        if constexpr (CB == 32) q1 = *(const uint4 *)(row + 2 * nbs + CB * b + 16);
        const uint32_t qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        float v[4][8];
#pragma unroll
        for (int k = 0; k < 4; k++)
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const int j = 8 * k + e; /* element j of the block */
                if constexpr (T == NSTF_TYPE_Q8_0) {
                    v[k][e] = d * (float)(int8_t)(qw[j / 4] >> (8 * (j % 4)));
                } else {
                    const uint32_t c = (qw[(j % 16) / 4] >> (8 * (j % 4) + 4 * (j / 16))) & 0xfu;
                    if constexpr (T == NSTF_TYPE_Q4_0) v[k][e] = d * (float)((int)c - 8);
                    else v[k][e] = d * (nstf_byte_2p23(nstf_iq4_lookup4(c), 0) - 8388736.0f);
                }
            }
#pragma unroll
        for (int k = 0; k < 4; k++) dq_store8(out + r * dim + 32 * b + 8 * k, v[k]);
    }
}

typedef void (*dq_fn)(const uint8_t *, size_t, int64_t, int64_t, uint16_t *, int64_t, const int32_t *);

struct variant {
    const char *name;
    bool split;  /* reads the split copy */
    int vpt;     /* values per thread */
    dq_fn fn[3]; /* Q8_0, Q4_0, IQ4_NL */
    int per_sm;  /* 0: a thread per VPT values; else at most per_sm blocks an SM, grid-stride */
};
#define DQ_FNS(VPT, IDS, PDL)                                                                                        \
    {dq_kernel<NSTF_TYPE_Q8_0, VPT, IDS, PDL>, dq_kernel<NSTF_TYPE_Q4_0, VPT, IDS, PDL>,                            \
     dq_kernel<NSTF_TYPE_IQ4_NL, VPT, IDS, PDL>}
static const variant variants[] = {
    {"file 8", false, 8, DQ_FNS(8, false, false), 0},
    {"split 8", true, 8, DQ_FNS(8, false, false), 0},
    {"split 8 ids", true, 8, DQ_FNS(8, true, false), 0},
    {"split 8 pdl", true, 8, DQ_FNS(8, false, true), 0},
    {"split 8 pdl sm8", true, 8, DQ_FNS(8, false, true), 8},
    {"split 8 pdl sm32", true, 8, DQ_FNS(8, false, true), 32},
    {"split 8 sm8", true, 8, DQ_FNS(8, false, false), 8},
    {"file 32", false, 32, DQ_FNS(32, false, false), 0},
    {"split 32", true, 32, DQ_FNS(32, false, false), 0},
    {"split 32 wide", true, 32,
     {dq_wide_kernel<NSTF_TYPE_Q8_0>, dq_wide_kernel<NSTF_TYPE_Q4_0>, dq_wide_kernel<NSTF_TYPE_IQ4_NL>}, 0},
};

struct shape {
    const char *name;
    int64_t n_in, n_out;
};

/* The file's row (nb blocks of 2 + cb bytes) in the split layout. */
static void to_split(const uint8_t *src, uint8_t *dst, int nb, int cb) {
    for (int b = 0; b < nb; b++) {
        memcpy(dst + 2 * b, src + (size_t)(2 + cb) * b, 2);
        memcpy(dst + 2 * (size_t)nb + (size_t)cb * b, src + (size_t)(2 + cb) * b + 2, (size_t)cb);
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? (atoi(argv[1]) > 0 ? atoi(argv[1]) : 1) : 7;
    const char *shape_filter = argc > 2 ? argv[2] : "", *var_filter = argc > 3 ? argv[3] : "";
    nstf_gpu_info info;
    cudaStream_t s;
    double copy_gbs;
    if (!study_open("dequant_v1", reps, &info, &s, &copy_gbs)) return 77;
    const shape shapes[] = {{"8B gate|up 4096->28672", 4096, 28672},
                            {"8B down 14336->4096", 14336, 4096},
                            {"1B gate|up 2048->16384", 2048, 16384}};
    const nstf_type types[3] = {NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_IQ4_NL};
    int bad = 0;
    printf("us (GB/s, %% of copy) per variant; bytes = weights read + bf16 written\n");
    for (const shape &sh : shapes) {
        if (!strstr(sh.name, shape_filter)) continue;
        for (int ti = 0; ti < 3; ti++) {
            const nstf_type t = types[ti];
            uint64_t rb = 0;
            if (!nstf_type_row_bytes(t, sh.n_in, &rb)) continue;
            const int nb = (int)(sh.n_in / 32), cb = nstf_q_block_bytes(t) - 2;
            /* 64 distinct quantized rows, repeated (the contents do not matter to the time) */
            const int n_real = 64;
            std::vector<uint8_t> hw((size_t)rb * sh.n_out), hs(hw.size());
            std::vector<float> row(sh.n_in);
            uint64_t rng = 0x9e3779b97f4a7c15ull;
            for (int r = 0; r < n_real; r++) {
                for (int64_t i = 0; i < sh.n_in; i++) row[i] = (float)bench_uniform(&rng);
                uint8_t *q = hw.data() + (size_t)r * rb;
                if (t == NSTF_TYPE_IQ4_NL) { /* random codes, the scale 1/64 */
                    for (uint64_t i = 0; i < rb; i++) q[i] = (uint8_t)(bench_uniform(&rng) * 127.0 + 128.0);
                    for (int b = 0; b < nb; b++) q[(size_t)18 * b] = 0x00, q[(size_t)18 * b + 1] = 0x24;
                } else if (!nstf_quantize_row(t, row.data(), q, sh.n_in)) {
                    printf("quantize failed\n");
                    return 1;
                }
            }
            for (int64_t r = n_real; r < sh.n_out; r++) memcpy(&hw[(size_t)r * rb], &hw[(size_t)(r % n_real) * rb], rb);
            for (int64_t r = 0; r < sh.n_out; r++) to_split(&hw[(size_t)r * rb], &hs[(size_t)r * rb], nb, cb);
            const size_t wbytes = hw.size(), obytes = (size_t)sh.n_out * sh.n_in * 2;
            uint8_t *w, *ws;
            uint16_t *out, *ref;
            int32_t *ids;
            CK(cudaMalloc(&w, wbytes));
            CK(cudaMalloc(&ws, wbytes));
            CK(cudaMalloc(&out, obytes));
            CK(cudaMalloc(&ref, obytes));
            CK(cudaMalloc(&ids, (size_t)sh.n_out * 4));
            CK(cudaMemcpy(w, hw.data(), wbytes, cudaMemcpyHostToDevice));
            CK(cudaMemcpy(ws, hs.data(), wbytes, cudaMemcpyHostToDevice));
            std::vector<int32_t> hid(sh.n_out);
            for (int64_t i = 0; i < sh.n_out; i++) hid[i] = (int32_t)i;
            CK(cudaMemcpy(ids, hid.data(), hid.size() * 4, cudaMemcpyHostToDevice));
            /* the library on the split copy, checked against the host dequantization */
            NK(nstf_gpu_get_rows(t, ws, sh.n_out, nullptr, ref, NSTF_TYPE_BF16, sh.n_out, sh.n_in, s));
            CK(cudaStreamSynchronize(s));
            std::vector<uint16_t> hr((size_t)n_real * sh.n_in);
            CK(cudaMemcpy(hr.data(), ref, hr.size() * 2, cudaMemcpyDeviceToHost));
            std::vector<float> deq(sh.n_in);
            for (int r = 0; r < n_real && !bad; r++) {
                nstf_dequantize_row(t, hw.data() + (size_t)r * rb, deq.data(), sh.n_in);
                for (int64_t i = 0; i < sh.n_in; i++)
                    if (hr[(size_t)r * sh.n_in + i] != f2bf(deq[i])) {
                        printf("lib differs from nstf_dequantize_row at row %d, element %lld\n", r, (long long)i);
                        bad++;
                        break;
                    }
            }
            const double mb = (double)(wbytes + obytes);
            for (int with_ids = 0; with_ids < 2; with_ids++) {
                const int32_t *li = with_ids ? ids : nullptr;
                const double lib_ms = time_batch_ms(s, 2, 10, reps, [&](int) {
                    NK(nstf_gpu_get_rows(t, ws, sh.n_out, li, out, NSTF_TYPE_BF16, sh.n_out, sh.n_in, s));
                });
                printf("%-24s %-7s %-14s %8.1f us (%5.0f GB/s, %5.1f%%)\n", sh.name, nstf_type_name(t),
                       with_ids ? "lib ids" : "lib", lib_ms * 1e3, mb / (lib_ms * 1e-3) / 1e9,
                       100.0 * mb / (lib_ms * 1e-3) / 1e9 / copy_gbs);
            }
            for (const variant &V : variants) {
                if (!strstr(V.name, var_filter)) continue;
                const uint8_t *wv = V.split ? ws : w;
                const int64_t nbs = V.split ? nb : 0;
                const int64_t work = sh.n_out * (sh.n_in / V.vpt);
                const unsigned grid = (unsigned)std::min<int64_t>((work + DQ_THREADS - 1) / DQ_THREADS,
                                                                  V.per_sm ? (int64_t)V.per_sm * info.n_sm : 8 * 65535);
                CK(cudaMemset(out, 0xff, obytes));
                V.fn[ti]<<<grid, DQ_THREADS, 0, s>>>(wv, rb, sh.n_out, sh.n_in, out, nbs, ids);
                CK(cudaStreamSynchronize(s));
                CK(cudaGetLastError());
                std::vector<uint16_t> ho(obytes / 2), hl(obytes / 2);
                CK(cudaMemcpy(ho.data(), out, obytes, cudaMemcpyDeviceToHost));
                CK(cudaMemcpy(hl.data(), ref, obytes, cudaMemcpyDeviceToHost));
                const bool same = ho == hl;
                if (!same) bad++;
                const double ms = time_batch_ms(s, 2, 10, reps, [&](int) {
                    V.fn[ti]<<<grid, DQ_THREADS, 0, s>>>(wv, rb, sh.n_out, sh.n_in, out, nbs, ids);
                });
                printf("%-24s %-7s %-14s %8.1f us (%5.0f GB/s, %5.1f%%)%s\n", sh.name, nstf_type_name(t), V.name,
                       ms * 1e3, mb / (ms * 1e-3) / 1e9, 100.0 * mb / (ms * 1e-3) / 1e9 / copy_gbs,
                       same ? "" : "  DIFFERS from lib");
            }
            CK(cudaFree(w));
            CK(cudaFree(ws));
            CK(cudaFree(out));
            CK(cudaFree(ref));
            CK(cudaFree(ids));
        }
    }
    printf("\n%s\n", bad ? "some variant FAILED its check" : "every variant equals the library bit for bit");
    return bad ? 1 : 0;
}
