/* test_gemm_gpu.cu — nstf_gpu_gemm_bf16 (and nstf_gpu_gemm_f16, fp16
 * operands, on a subset of the shapes) against an fp64 host reference on
 * random bf16 (fp16) data: every epilogue (none, residual f32/bf16 incl. in place,
 * SwiGLU), f32 and bf16 output, M = 1 .. 4096 and N, K that are not tile
 * multiples, every kernel the device can take: each case runs with the
 * default choice (wgmma on Hopper), then with each wgmma tile width forced
 * (the switch NSTF_GEMM=wgmma256/128/64, set with nstf_switch_set) and with
 * NSTF_GEMM=mma (the portable kernel,
 * both block configurations); each run is one case line naming the kernel.
 * Row lengths (N) multiple of 8, even and odd exercise the 16-byte, paired
 * and single-element epilogues. Metric (tests/gpu_harness.h): the bf16 rule,
 * NMSE vs fp64 at most 2x the NMSE of a naive host GEMM (bf16 inputs, fp32
 * sequential accumulation, fp32 epilogue, bf16 output); fp32 outputs must
 * also have NMSE <= 1e-10 vs fp64. Outputs are poisoned before each run,
 * every buffer's guards checked after each launch, NaN/Inf fail (for
 * fp16 operands the naive GEMM takes the same fp16 inputs). Also
 * nstf_gpu_bf16_to_f16 bit for bit against the host's nstf_f32_to_fp16 on
 * every bf16 bit pattern (saturation, infinities, NaN, subnormals), and
 * nstf_gpu_transpose_bf16 bit for bit, and the rows of C bit for bit the
 * same whatever M is (what the serving engine's prompt rows rely on).
 * Exit 77 = no GPU. */
#include "core/switches.h"
#include "gpu_harness.h"

#define T_F32 NSTF_TYPE_F32
#define T_BF16 NSTF_TYPE_BF16

static double silu_d(double x) { return x / (1.0 + exp(-x)); }
static float silu_f(float x) { return x / (1.0f + expf(-x)); }
static float bf2f(uint16_t b) { return nstf_bf16_to_f32(b); }
static uint16_t f2bf(float f) { return nstf_f32_to_bf16(f); }

/* the kernels the cases ran on (nstf_gpu_gemm_path names) */
static const char *g_path_seen[8];
static int g_n_paths = 0;
static void note_path(const char *p) {
    for (int i = 0; i < g_n_paths; i++)
        if (strcmp(g_path_seen[i], p) == 0) return;
    if (g_n_paths < 8) g_path_seen[g_n_paths++] = p;
}

/* The kernel choice: NULL for the default, else an NSTF_GEMM value (the
 * registry reads the environment once; a test sets the switch itself). */
static void force_gemm(const char *choice) {
    CHECK(nstf_switch_set(NSTF_SW_GEMM, choice) == NSTF_OK, "NSTF_GEMM=%s: %s", choice ? choice : "(default)",
          nstf_last_error());
}

struct gemm_case {
    int64_t m, n, k;
    int epi;
    nstf_type c_type, r_type;
    int in_place;
    int f16; /* fp16 operands: nstf_gpu_gemm_f16 */
};

/* c_off: C (and an in-place R) start c_off bytes off alignment, to take
 * the paired and single-element epilogues of the wgmma path */
static void run_case(const gemm_case &tc, uint64_t seed, size_t c_off = 0) {
    const int64_t M = tc.m, N = tc.n, K = tc.k;
    const int64_t n_out = tc.epi == NSTF_GEMM_EPI_SWIGLU ? N / 2 : N;
    test_rng rng = {seed};
    std::vector<uint16_t> a(M * K), w(N * K);
    /* operands as bf16 or fp16 bit patterns; in() reads one back */
    auto enc = [&](float v) { return tc.f16 ? nstf_f32_to_fp16(v) : f2bf(v); };
    auto in = [&](uint16_t b) { return tc.f16 ? nstf_fp16_to_f32(b) : bf2f(b); };
    for (auto &x : a) x = enc(rng_uniform(&rng));
    for (auto &x : w) x = enc(rng_uniform(&rng) * 2.0f / sqrtf((float)K));
    /* residual, as its own dtype (values bf16-representable for bf16) */
    std::vector<float> res(M * N);
    for (auto &x : res) x = tc.r_type == T_BF16 ? gh_bf(rng_uniform(&rng)) : rng_uniform(&rng);

    /* fp64 reference and naive fp32 result (logical [M, n_out]) */
    std::vector<double> ref(M * n_out), accd(N);
    std::vector<float> naive(M * n_out), accf(N);
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double sd = 0;
            float sf = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = in(a[i * K + p]), y = in(w[j * K + p]);
                sd += x * y;
                sf += (float)x * (float)y;
            }
            accd[j] = sd;
            accf[j] = sf;
        }
        for (int64_t j = 0; j < n_out; j++) {
            double rd;
            float rf;
            if (tc.epi == NSTF_GEMM_EPI_SWIGLU) {
                /* packed rows: gate of column j at row 32*(j/16) + j%16, up 16 rows later */
                int64_t g = 32 * (j / 16) + j % 16;
                rd = silu_d(accd[g]) * accd[g + 16];
                rf = silu_f(accf[g]) * accf[g + 16];
            } else {
                rd = accd[j];
                rf = accf[j];
                if (tc.epi == NSTF_GEMM_EPI_RESIDUAL) {
                    rd += res[i * N + j];
                    rf += res[i * N + j];
                }
            }
            ref[i * n_out + j] = rd;
            naive[i * n_out + j] = gh_bf(rf); /* the naive output is bf16 */
        }
    }

    const size_t r_el = tc.r_type == T_BF16 ? 2 : 4;
    const size_t c_bytes = (size_t)(M * n_out) * (tc.c_type == T_BF16 ? 2 : 4);
    std::vector<unsigned char> hr;
    if (tc.epi == NSTF_GEMM_EPI_RESIDUAL) {
        hr.resize(M * N * r_el);
        for (int64_t i = 0; i < M * N; i++) {
            if (tc.r_type == T_BF16) ((uint16_t *)hr.data())[i] = f2bf(res[i]);
            else ((float *)hr.data())[i] = res[i];
        }
    }
    gh_buf da = gh_alloc(M * K * 2, a.data()), dw = gh_alloc(N * K * 2, w.data());
    gh_buf dc = gh_alloc(c_bytes, nullptr, c_off), dr;
    /* in place: R aliases C (same dtype, n_out == N) */
    const bool own_r = tc.epi == NSTF_GEMM_EPI_RESIDUAL && !tc.in_place;
    if (own_r) dr = gh_alloc(M * N * r_el, nullptr);
    void *r_ptr = tc.epi != NSTF_GEMM_EPI_RESIDUAL ? NULL : tc.in_place ? dc.p() : dr.p();
    static const char *const en_s[] = {"none", "residual", "swiglu"};
    /* every kernel: the default choice, then each forced one (NSTF_GEMM);
     * a forced choice that lands on a kernel already run is skipped */
    static const char *const env[] = {NULL, "wgmma256", "wgmma192", "wgmma128", "wgmma64", "mma"};
    const char *done[6];
    int n_done = 0;
    for (int pass = 0; pass < 6; pass++) {
        force_gemm(env[pass]);
        const char *path = nstf_gpu_gemm_path(M, N, K);
        int seen = 0;
        for (int i = 0; i < n_done; i++) seen |= strcmp(done[i], path) == 0;
        if (seen) continue;
        done[n_done++] = path;
        note_path(path);
        gh_begin("[%-16s] %s M=%-5lld N=%-5lld K=%-5lld epi=%-8s out=%s res=%s%s", path, tc.f16 ? "f16 " : "bf16",
                 (long long)M, (long long)N, (long long)K, en_s[tc.epi], tc.c_type == T_BF16 ? "bf16" : "f32 ",
                 tc.epi == NSTF_GEMM_EPI_RESIDUAL ? (tc.r_type == T_BF16 ? "bf16" : "f32 ") : "-   ",
                 tc.in_place ? " in-place" : "");
        if (c_off) gh_note("(C at byte offset %zu)", c_off);
        gh_poison(dc); /* poison again */
        if (r_ptr) gh_must(nstf_gpu_memcpy_h2d(r_ptr, hr.data(), M * N * r_el, NULL), "h2d");
        gh_launched((tc.f16 ? nstf_gpu_gemm_f16 : nstf_gpu_gemm_bf16)(da.as<const uint16_t>(),
                                                                      dw.as<const uint16_t>(), dc.p(), tc.c_type, r_ptr,
                                                                      tc.r_type, M, N, K,
                                                                      (nstf_gemm_epilogue)tc.epi, NULL),
                    "gemm");
        std::vector<float> got = gh_fetch_floats(dc, tc.c_type, M * n_out);
        gh_compare("out", got.data(), ref.data(), M * n_out, gh_tol_naive(naive.data()));
        /* fp32 output: besides the bf16 rule, NMSE <= 1e-10 vs fp64. The
         * matrix units' fp32 adders truncate (not round) the aligned
         * products, so the error can exceed a sequential fp32 loop's by a
         * small factor; 1e-10 still catches any lost tile, tail or
         * epilogue term. */
        if (tc.c_type == T_F32) gh_compare("out(f32)", got.data(), ref.data(), M * n_out, gh_tol_nmse(1e-10));
        gh_end();
    }
    force_gemm(NULL);
    gh_free(da); gh_free(dw); gh_free(dc);
    if (own_r) gh_free(dr);
}

int main(void) {
    if (!gh_init("test_gemm_gpu")) return TEST_SKIP;
    const int64_t shapes[][3] = {
        {1, 256, 64},    {7, 100, 72},   {33, 130, 200}, {100, 257, 264},
        {512, 384, 520}, {64, 64, 8},    {300, 4224, 136}, /* 300x4224: the 128x128 configuration */
        /* wgmma tile widths on a 132-SM H100: 2048x2000 -> 128x256,
         * 4096x300 -> 128x128, 512x2000 -> 128x64; K tails of 8 */
        {2048, 2000, 72}, {4096, 300, 40}, {512, 2000, 136}, {129, 520, 1000},
    };
    uint64_t seed = 1;
    for (const auto &s : shapes) {
        const int64_t M = s[0], N = s[1], K = s[2];
        run_case({M, N, K, NSTF_GEMM_EPI_NONE, T_F32, T_F32, 0, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_NONE, T_BF16, T_F32, 0, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_F32, 0, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_F32, 1, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_BF16, 0, 0}, seed++);
    }
    const int64_t sw[][3] = {{1, 64, 64},     {33, 224, 72},    {100, 96, 264},
                             {512, 4352, 64}, {300, 1024, 136}, {2048, 2048, 40}};
    for (const auto &s : sw) {
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0, 0}, seed++);
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0, 0}, seed++);
    }
    /* C not 16-byte aligned: the wgmma path's paired (8- or 4-byte) and
     * single-element epilogues */
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0, 0}, seed++, 4);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0, 0}, seed++, 2);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0, 0}, seed++, 8);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0, 0}, seed++, 4);
    run_case({257, 520, 72, NSTF_GEMM_EPI_NONE, T_F32, T_F32, 0, 0}, seed++, 8);
    run_case({257, 520, 72, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1, 0}, seed++, 4);
    run_case({257, 520, 72, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1, 0}, seed++, 2);
    /* fp16 operands (F16 weights): every epilogue on shapes that reach
     * each kernel, and values beyond bf16's precision (the fp16 rounding
     * of the inputs is what the reference takes) */
    const int64_t hs[][3] = {{7, 100, 72}, {512, 384, 520}, {300, 4224, 136}, {2048, 2000, 72},
                             {4096, 300, 40}, {512, 2000, 136}};
    for (const auto &s : hs) {
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_NONE, T_F32, T_F32, 0, 1}, seed++);
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_NONE, T_BF16, T_F32, 0, 1}, seed++);
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1, 1}, seed++);
    }
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0, 1}, seed++);
    run_case({2048, 2048, 40, NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0, 1}, seed++);
    /* bf16 -> fp16 conversion: every bf16 bit pattern, bit for bit */
    {
        gh_begin("bf16_to_f16: all 65536 bf16 values");
        const int64_t n = 65536;
        std::vector<uint16_t> x(n), want(n), got(n);
        for (int64_t i = 0; i < n; i++) {
            x[i] = (uint16_t)i;
            const float f = bf2f((uint16_t)i);
            if (f != f) {
                want[i] = 0x7e00; /* any NaN: compared as "is a NaN" below */
            } else {
                const float c = isinf(f) ? f : f > 65504.0f ? 65504.0f : f < -65504.0f ? -65504.0f : f;
                want[i] = nstf_f32_to_fp16(c);
            }
        }
        gh_buf dx = gh_alloc(n * 2, x.data()), dy = gh_alloc(n * 2, nullptr);
        int64_t bad = 0, first = -1;
        for (int vec = 0; vec < 2; vec++) { /* 16-byte pieces, then one element at a time (odd count) */
            gh_poison(dy);
            const int64_t cnt = vec ? n : n - 1;
            gh_launched(nstf_gpu_bf16_to_f16(dx.as<const uint16_t>(), dy.as<uint16_t>(), cnt, NULL), "bf16_to_f16");
            gh_must(nstf_gpu_memcpy_d2h(got.data(), dy.p(), (size_t)cnt * 2, NULL), "d2h");
            for (int64_t i = 0; i < cnt; i++) {
                const bool want_nan = bf2f(x[i]) != bf2f(x[i]);
                const bool got_nan = (got[i] & 0x7c00) == 0x7c00 && (got[i] & 0x3ff) != 0;
                if (want_nan ? !got_nan : got[i] != want[i]) {
                    if (first < 0) first = i;
                    bad++;
                }
            }
        }
        CHECK(bad == 0, "%lld conversions differ (first: bf16 0x%04llx -> 0x%04x, want 0x%04x)", (long long)bad,
              (long long)first, first >= 0 ? got[first] : 0, first >= 0 ? want[first] : 0);
        CHECK(nstf_gpu_bf16_to_f16(NULL, dy.as<uint16_t>(), 8, NULL) == NSTF_ERR_INVALID_ARG, "NULL x must be refused");
        gh_note("round to nearest even, saturation at 65504, infinities and NaN kept");
        gh_free(dx);
        gh_free(dy);
        gh_end();
    }
    /* the gradient GEMMs' transpose: bit for bit, odd shapes, a row stride
     * beyond the columns */
    {
        const int64_t ts[][3] = {{1, 1, 1}, {37, 72, 72}, {64, 1536, 1544}, {1000, 33, 40}, {129, 4097, 4104}};
        for (const auto &t : ts) {
            const int64_t rows = t[0], cols = t[1], ld = t[2];
            gh_begin("transpose_bf16 %lld x %lld (stride %lld)", (long long)rows, (long long)cols, (long long)ld);
            std::vector<uint16_t> x(rows * ld), y(rows * cols);
            test_rng rng = {seed++};
            for (auto &v : x) v = f2bf(rng_uniform(&rng));
            gh_buf dx = gh_alloc(x.size() * 2, x.data()), dy = gh_alloc(y.size() * 2, nullptr);
            gh_launched(nstf_gpu_transpose_bf16(dx.as<const uint16_t>(), ld, dy.as<uint16_t>(), rows, cols, NULL),
                        "transpose");
            gh_must(nstf_gpu_memcpy_d2h(y.data(), dy.p(), y.size() * 2, NULL), "d2h");
            int64_t bad = 0;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t c = 0; c < cols; c++) bad += y[c * rows + r] != x[r * ld + c];
            CHECK(bad == 0, "%lld elements differ", (long long)bad);
            gh_free(dx);
            gh_free(dy);
            gh_end();
        }
    }
    /* row invariance: a row of C must not depend on how many rows A has
     * (no split-K; each output sums its K slices in one order). The
     * serving engine relies on it: it runs prompt rows on the GEMM whatever
     * their count (nstf_batch.row_invariant), so that a prompt recomputed
     * after a prefix-cache hit (fewer rows) gives the same numbers. Each M
     * against the rows of one M = 300 call, bit for bit, on the default
     * kernel choice (M past 128 changes the tile count, so also the wgmma
     * tile width the choice takes) */
    {
        const int64_t inv[][2] = {{576, 576}, {2048, 1536}, {3072, 2048}};
        const int64_t ms[] = {1, 2, 3, 8, 9, 19, 64, 128, 129, 300};
        for (const auto &s : inv) {
            const int64_t N = s[0], K = s[1], MM = 300;
            gh_begin("gemm rows independent of M: N=%lld K=%lld, M = 1 .. %lld vs M = %lld", (long long)N, (long long)K,
                     (long long)MM, (long long)MM);
            std::vector<uint16_t> a(MM * K), w(N * K);
            test_rng rng = {seed++};
            for (auto &v : a) v = f2bf(rng_uniform(&rng) * 2.0f - 1.0f);
            for (auto &v : w) v = f2bf((rng_uniform(&rng) * 2.0f - 1.0f) * 0.05f);
            gh_buf da = gh_alloc(a.size() * 2, a.data()), dw = gh_alloc(w.size() * 2, w.data());
            gh_buf dc = gh_alloc((size_t)(MM * N) * 4, nullptr);
            std::vector<float> full(MM * N), part(MM * N);
            gh_launched(nstf_gpu_gemm_bf16(da.as<const uint16_t>(), dw.as<const uint16_t>(), dc.p(), T_F32, NULL, T_F32,
                                           MM, N, K, NSTF_GEMM_EPI_NONE, NULL),
                        "gemm");
            gh_must(nstf_gpu_memcpy_d2h(full.data(), dc.p(), full.size() * 4, NULL), "d2h");
            int64_t bad_m = -1, bad = 0;
            for (const int64_t m : ms) {
                gh_poison(dc);
                gh_launched(nstf_gpu_gemm_bf16(da.as<const uint16_t>(), dw.as<const uint16_t>(), dc.p(), T_F32, NULL,
                                               T_F32, m, N, K, NSTF_GEMM_EPI_NONE, NULL),
                            "gemm");
                gh_must(nstf_gpu_memcpy_d2h(part.data(), dc.p(), (size_t)(m * N) * 4, NULL), "d2h");
                const int64_t d = memcmp(part.data(), full.data(), (size_t)(m * N) * 4) != 0;
                if (d && bad_m < 0) bad_m = m;
                bad += d;
            }
            CHECK(bad == 0, "%lld of %d row counts give other bits (first M = %lld, kernel %s there, %s at M = %lld)",
                  (long long)bad, (int)(sizeof ms / sizeof ms[0]), (long long)bad_m,
                  nstf_gpu_gemm_path(bad_m > 0 ? bad_m : 1, N, K), nstf_gpu_gemm_path(MM, N, K), (long long)MM);
            gh_note("kernels: %s (M <= 128), %s (M = %lld)", nstf_gpu_gemm_path(1, N, K), nstf_gpu_gemm_path(MM, N, K),
                    (long long)MM);
            gh_free(da);
            gh_free(dw);
            gh_free(dc);
            gh_end();
        }
    }
    /* argument validation: errors, not crashes */
    {
        gh_begin("gemm: argument validation");
        gh_buf b = gh_alloc(4096, nullptr);
        uint16_t *d = b.as<uint16_t>();
        CHECK(nstf_gpu_gemm_bf16(d, d, d, T_F32, NULL, T_F32, 4, 4, 12, NSTF_GEMM_EPI_NONE, NULL) == NSTF_ERR_UNSUPPORTED,
              "K %% 8 != 0 must be refused");
        CHECK(nstf_gpu_gemm_bf16(d + 1, d, d, T_F32, NULL, T_F32, 4, 4, 8, NSTF_GEMM_EPI_NONE, NULL) ==
                  NSTF_ERR_INVALID_ARG, "misaligned A must be refused");
        CHECK(nstf_gpu_gemm_bf16(d, d, d, T_F32, NULL, T_F32, 4, 48, 8, NSTF_GEMM_EPI_SWIGLU, NULL) == NSTF_ERR_INVALID_ARG,
              "SwiGLU with N %% 32 != 0 must be refused");
        CHECK(nstf_gpu_gemm_bf16(d, d, d, T_F32, NULL, T_F32, 4, 4, 8, NSTF_GEMM_EPI_RESIDUAL, NULL) == NSTF_ERR_INVALID_ARG,
              "residual without R must be refused");
        CHECK(nstf_gpu_transpose_bf16(d, 4, d + 64, 4, 8, NULL) == NSTF_ERR_INVALID_ARG,
              "a transpose stride below the columns must be refused");
        CHECK(nstf_gpu_swiglu_packed_row(17, 64) == 64 + 1 && nstf_gpu_swiglu_packed_row(33, 64) == 17,
              "packed row map");
        gh_note("K %% 8, misaligned A, SwiGLU N %% 32, residual without R refused; packed row map");
        gh_free(b);
        gh_end();
    }
    printf("kernels run:");
    for (int i = 0; i < g_n_paths; i++) printf(" [%s]", g_path_seen[i]);
    printf("\n");
    /* on Hopper every wgmma tile width must have been exercised */
    int n_wg = 0;
    for (int i = 0; i < g_n_paths; i++) n_wg += strncmp(g_path_seen[i], "wgmma", 5) == 0;
    gh_begin("gemm: kernels exercised");
    CHECK(n_wg == 0 || n_wg == 4, "only %d of the 4 wgmma tile widths were exercised", n_wg);
    gh_note("%d kernels, %d of them wgmma (0 or all 4 required)", g_n_paths, n_wg);
    return gh_finish("test_gemm_gpu");
}
