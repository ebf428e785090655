/* gemv_q40_v2.cu — study 2 of the one-token integer GEMV: Q4_0 at the
 * 8B and 1B shapes, where the library's kernel (gemvk_i8.cu) reads 45% of
 * the copy rate or less. Two questions, each against the library's kernel
 * (nstf_gpu_gemv) and the copy rate, in one run on one card:
 *
 *  1. What does staging x cost? The library's blocks each quantize all of
 *     x into shared memory (16-bit fixed point per 32 elements, two int8
 *     planes). Here x is quantized once by a tiny kernel (xq16, as in
 *     study 1) and the GEMV reads the planes through L1 ("L1" variants),
 *     or copies them into shared memory without arithmetic ("sm").
 *  2. What does the file's 18-byte block cost? Its 16 bytes of codes are
 *     2-byte aligned: a lane loads five words and realigns them. The
 *     "split" layout keeps a row's bytes but puts its nb scales first and
 *     its nb runs of 16 codes after them (16-byte aligned when nb is a
 *     multiple of 8): one 16-byte load of codes that bypasses L1, one
 *     2-byte load of the scale, no realignment. The "file" variants read
 *     the file's layout with the library's loads.
 *
 * A warp owns RPW rows; its lanes take 8 blocks per group of 256 inputs
 * and 4 groups per step; UNR steps' loads are issued before any is used.
 * Error: the same fixed point as the library's kernel, so the same bound:
 * NMSE within 2x of the bf16 output rounding against a double reference.
 *
 * The study led to the library's split rows (quant.h, nstf_gpu_weights_
 * relayout): its "production" column reads the split copy since then.
 *
 * Usage: gemv_q40_v2 [REPS [SHAPE [VARIANT]]] (substrings of the names).
 * Not a production kernel: numbers in docs/PERFORMANCE.md. */
#include "gemv_study.h" /* study_ld_w, xq16_kernel, the case's host side */

/* ---- device -------------------------------------------------------------- */

/* One lane's block: 16 bytes of codes (low nibbles elements 0..15, high
 * 16..31) and the scale. */
template <bool SPLIT> struct q40_unit {
    uint32_t q[SPLIT ? 4 : 5];
    uint32_t d; /* file layout: bit 16 = the run is 2 mod 4 */
};

template <bool SPLIT>
static __device__ __forceinline__ q40_unit<SPLIT> q40_load(const uint8_t *__restrict__ row, int nb, int blk) {
    q40_unit<SPLIT> u;
    if constexpr (SPLIT) {
        const uint4 q = study_ld_w(row + 2 * (size_t)nb + 16 * (size_t)blk);
        u.q[0] = q.x, u.q[1] = q.y, u.q[2] = q.z, u.q[3] = q.w;
        u.d = nstf_ld_u16(row + 2 * blk);
    } else {
        const uint8_t *b = row + (size_t)blk * 18;
        const nstf_run16 r = nstf_ld_run16_a2(b + 2);
#pragma unroll
        for (int k = 0; k < 5; k++) u.q[k] = r.w[k];
        u.d = nstf_ld_u16(b) | ((uint32_t)((uintptr_t)(b + 2) & 2) << 15);
    }
    return u;
}

/* XS: copy the planes into shared memory first (no arithmetic), else read
 * them through L1. */
template <int RPW, int UNR, bool SPLIT, bool XS>
__global__ void __launch_bounds__(256)
gemv_q40_v2(const uint8_t *__restrict__ w, size_t row_bytes, const int8_t *__restrict__ xh,
            const int8_t *__restrict__ xl, const float2 *__restrict__ ds, uint16_t *__restrict__ y, int n_in,
            int n_out) {
    extern __shared__ uint4 v2_smem[];
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * RPW;
    const int nb = n_in / 32, ngr = n_in / 256, sbl = lane >> 3, c = lane & 7;
    const uint8_t *wr[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) wr[r] = w + (size_t)min(row0 + r, n_out - 1) * row_bytes;
    q40_unit<SPLIT> raw[UNR][RPW];
    auto load = [&](int s0) {
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int g = s0 + 4 * u + sbl;
            if (g < ngr) {
#pragma unroll
                for (int r = 0; r < RPW; r++) raw[u][r] = q40_load<SPLIT>(wr[r], nb, 8 * g + c);
            }
        }
    };
    load(0);
    const int8_t *XH = xh, *XL = xl;
    const float2 *DS = ds;
    if constexpr (XS) {
        int8_t *sh = (int8_t *)v2_smem, *sl = sh + n_in;
        float2 *sd = (float2 *)(sl + n_in);
        for (int i = threadIdx.x; i < n_in / 16; i += blockDim.x) {
            ((uint4 *)sh)[i] = ((const uint4 *)xh)[i];
            ((uint4 *)sl)[i] = ((const uint4 *)xl)[i];
        }
        for (int i = threadIdx.x; i < nb; i += blockDim.x) sd[i] = ds[i];
        __syncthreads();
        XH = sh, XL = sl, DS = sd;
    }
    float acc[RPW];
#pragma unroll
    for (int r = 0; r < RPW; r++) acc[r] = 0.0f;
    for (int s0 = 0; s0 < ngr; s0 += 4 * UNR) {
        if (s0) load(s0);
#pragma unroll
        for (int u = 0; u < UNR; u++) {
            const int g = s0 + 4 * u + sbl;
            if (g >= ngr) break;
            const int blk = 8 * g + c, e = 32 * blk;
            const uint4 xa = *(const uint4 *)(XH + e), xb = *(const uint4 *)(XH + e + 16);
            const uint4 la = *(const uint4 *)(XL + e), lb = *(const uint4 *)(XL + e + 16);
            const float2 dd = DS[blk];
            const uint32_t xav[4] = {xa.x, xa.y, xa.z, xa.w}, xbv[4] = {xb.x, xb.y, xb.z, xb.w};
            const uint32_t lav[4] = {la.x, la.y, la.z, la.w}, lbv[4] = {lb.x, lb.y, lb.z, lb.w};
#pragma unroll
            for (int r = 0; r < RPW; r++) {
                const q40_unit<SPLIT> &U = raw[u][r];
                const uint32_t mis = SPLIT ? 0u : (U.d >> 16) & 1u;
                int ah = 0, al = 0;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    const uint32_t wq = SPLIT ? U.q[k] : nstf_run16_word(U.q, k, mis);
                    const uint32_t lo = wq & 0x0f0f0f0fu, hi = (wq >> 4) & 0x0f0f0f0fu;
                    ah = __dp4a((int)lo, (int)xav[k], ah);
                    al = __dp4a((int)lo, (int)lav[k], al);
                    ah = __dp4a((int)hi, (int)xbv[k], ah);
                    al = __dp4a((int)hi, (int)lbv[k], al);
                }
                const float S = dd.x * (float)(ah * 256 + al);
                acc[r] = fmaf(nstf_h2f(U.d), fmaf(-8.0f, dd.y, S), acc[r]);
            }
        }
    }
    if (row0 >= n_out) return;
    study_store_rows<RPW>(acc, row0, n_out, y, lane);
}

/* ---- host ---------------------------------------------------------------- */

struct variant {
    const char *name;
    study_fn fn;
    int rpw;
    bool split, xs;
};
#define V(L, S, X, R, U) {L " r" #R " u" #U, gemv_q40_v2<R, U, S, X>, R, S, X}
static const variant variants[] = {
    V("file L1", false, false, 1, 2),  V("file L1", false, false, 2, 2),  V("file L1", false, false, 4, 1),
    V("split L1", true, false, 1, 2),  V("split L1", true, false, 1, 4),  V("split L1", true, false, 2, 1),
    V("split L1", true, false, 2, 2),  V("split L1", true, false, 4, 1),  V("split L1", true, false, 4, 2),
    V("split sm", true, true, 1, 2),   V("split sm", true, true, 2, 2),   V("split sm", true, true, 4, 1),
};

static int g_reps = 7;

/* The file's row (nb blocks of 18 bytes) in the split layout: nb scales, then nb runs of 16 codes. */
static void to_split(const uint8_t *src, uint8_t *dst, int nb) {
    for (int b = 0; b < nb; b++) {
        memcpy(dst + 2 * b, src + 18 * b, 2);
        memcpy(dst + 2 * nb + 16 * b, src + 18 * b + 2, 16);
    }
}

int main(int argc, char **argv) {
    if (argc > 1) g_reps = std::max(1, atoi(argv[1]));
    const char *shape_filter = argc > 2 ? argv[2] : "", *var_filter = argc > 3 ? argv[3] : "";
    nstf_gpu_info info;
    cudaStream_t s;
    double copy_gbs;
    if (!study_open("gemv_q40_v2", g_reps, &info, &s, &copy_gbs)) return 77;
    const study_shape shapes[] = {{"8B q/o 4096->4096", 4096, 4096},      {"8B q|k|v 4096->6144", 4096, 6144},
                            {"8B gate|up 4096->28672", 4096, 28672}, {"8B down 14336->4096", 14336, 4096},
                            {"1B q/o 2048->2048", 2048, 2048},       {"1B gate|up 2048->16384", 2048, 16384},
                            {"1B down 8192->2048", 8192, 2048}};
    const nstf_type t = NSTF_TYPE_Q4_0;
    int bad = 0;
    printf("Q4_0: us (GB/s, %% of copy); the variants' times exclude xq16 (its own column)\n");
    for (const study_shape &sh : shapes) {
        if (!strstr(sh.name, shape_filter)) continue;
        study_case cs;
        if (!study_case_make(t, sh, cs)) { printf("quantize failed\n"); return 1; }
        const uint64_t rb = cs.rb;
        const int nb = sh.n_in / 32;
        const size_t wbytes = rb * (size_t)sh.n_out;
        const int n_copies = (int)std::max<uint64_t>(1, ((256ull << 20) + wbytes - 1) / wbytes);
        std::vector<uint8_t> hs(cs.hw.size());
        for (int r = 0; r < cs.n_check; r++) to_split(cs.hw.data() + (size_t)r * rb, hs.data() + (size_t)r * rb, nb);
        uint8_t *w = study_upload(cs, cs.hw, n_copies), *ws = study_upload(cs, hs, n_copies);
        study_dev d = study_dev_make(cs);
        /* the library reads these rows in its split layout since the study (quant.h) */
        const study_base base =
            study_production(sh.name, cs, d, nstf_gpu_split_codes(NSTF_TYPE_Q4_0, sh.n_in) ? ws : w, n_copies, copy_gbs, g_reps, s);
        for (const variant &V : variants) {
            if (!strstr(V.name, var_filter)) continue;
            const int blocks = ((sh.n_out + V.rpw - 1) / V.rpw + 7) / 8;
            const size_t smem = V.xs ? (size_t)2 * sh.n_in + (size_t)nb * sizeof(float2) : 0;
            if (smem > 48 * 1024) CK(cudaFuncSetAttribute(V.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            const uint8_t *wv = V.split ? ws : w;
            CK(cudaMemset(d.y, 0xff, (size_t)sh.n_out * 2));
            study_xq(cs, d, s);
            V.fn<<<blocks, 256, smem, s>>>(wv, rb, d.xh, d.xl, d.ds, d.y, sh.n_in, sh.n_out);
            CK(cudaStreamSynchronize(s));
            CK(cudaGetLastError());
            const auto ev = study_nmse(cs, d.y);
            const double ms = time_batch_ms(s, 3, 20, g_reps, [&](int i) {
                V.fn<<<blocks, 256, smem, s>>>(wv + (size_t)(i % n_copies) * wbytes, rb, d.xh, d.xl, d.ds, d.y,
                                               sh.n_in, sh.n_out);
            });
            if (!study_report(V.name, ms, ev, base)) bad++;
        }
        CK(cudaFree(w));
        CK(cudaFree(ws));
        study_dev_free(d);
    }
    printf("\n%s\n", bad ? "some variant FAILED its check" : "all variants within 2x the bf16 rounding of the reference");
    CK(cudaStreamDestroy(s));
    return bad ? 1 : 0;
}
