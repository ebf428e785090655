/* test_gemm_gpu.cu — nstf_gpu_gemm_bf16 against an fp64 host reference on
 * random bf16 data: every epilogue (none, residual f32/bf16 incl. in place,
 * SwiGLU), f32 and bf16 output, M = 1 .. 4096 and N, K that are not tile
 * multiples, every kernel the device can take: each case runs with the
 * default choice (wgmma on Hopper), then with each wgmma tile width forced
 * (the switch NSTF_GEMM=wgmma256/128/64, set with nstf_switch_set) and with
 * NSTF_GEMM=mma (the portable kernel,
 * both block configurations); each line names the kernel that ran. Row
 * lengths (N) multiple of 8, even and odd exercise the 16-byte, paired and
 * single-element epilogues. Metric: RMS error vs fp64 must
 * be <= 2x the RMS error of a naive host GEMM (bf16 inputs, fp32 sequential
 * accumulation, fp32 epilogue, bf16 output); fp32 outputs must also have
 * NMSE <= 1e-10 vs fp64; outputs
 * are poisoned, guard regions checked, NaN/Inf counted. Exit 77 = no GPU. */
#include "core/switches.h"
#include "gpu_mm_test.h"

#define T_F32 NSTF_TYPE_F32
#define T_BF16 NSTF_TYPE_BF16

static double silu_d(double x) { return x / (1.0 + exp(-x)); }
static float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* the kernels the cases ran on (nstf_gpu_gemm_path names) */
static const char *g_path_seen[8];
static int g_n_paths = 0;
static void note_path(const char *p) {
    for (int i = 0; i < g_n_paths; i++)
        if (strcmp(g_path_seen[i], p) == 0) return;
    if (g_n_paths < 8) g_path_seen[g_n_paths++] = p;
}

struct gemm_case {
    int64_t m, n, k;
    int epi;
    nstf_type c_type, r_type;
    int in_place;
};

/* c_off: C (and an in-place R) start c_off bytes into their allocation, to
 * take the paired and single-element epilogues of the wgmma path */
static void run_case(const gemm_case &tc, uint64_t seed, size_t c_off = 0) {
    const int64_t M = tc.m, N = tc.n, K = tc.k;
    const int64_t n_out = tc.epi == NSTF_GEMM_EPI_SWIGLU ? N / 2 : N;
    test_rng rng = {seed};
    uint16_t *a = (uint16_t *)malloc(M * K * 2), *w = (uint16_t *)malloc(N * K * 2);
    for (int64_t i = 0; i < M * K; i++) a[i] = f2bf(rng_uniform(&rng));
    for (int64_t i = 0; i < N * K; i++) w[i] = f2bf(rng_uniform(&rng) * 2.0f / sqrtf((float)K));
    /* residual, as its own dtype (values bf16-representable for bf16) */
    float *res = (float *)malloc(M * N * 4);
    for (int64_t i = 0; i < M * N; i++) res[i] = tc.r_type == T_BF16 ? round_bf(rng_uniform(&rng)) : rng_uniform(&rng);

    /* fp64 reference and naive fp32 result (logical [M, n_out]) */
    double *ref = (double *)malloc(M * n_out * 8);
    float *naive = (float *)malloc(M * n_out * 4);
    double *accd = (double *)malloc(N * 8);
    float *accf = (float *)malloc(N * 4);
    for (int64_t i = 0; i < M; i++) {
        for (int64_t j = 0; j < N; j++) {
            double sd = 0;
            float sf = 0;
            for (int64_t p = 0; p < K; p++) {
                double x = bf2f(a[i * K + p]), y = bf2f(w[j * K + p]);
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
            naive[i * n_out + j] = round_bf(rf); /* the naive output is bf16 */
        }
    }

    const size_t c_el = tc.c_type == T_BF16 ? 2 : 4, r_el = tc.r_type == T_BF16 ? 2 : 4;
    const size_t c_bytes = (size_t)(M * n_out) * c_el;
    void *da = dev_alloc_poisoned(M * K * 2), *dw = dev_alloc_poisoned(N * K * 2);
    DEV_CHECK(gpuMemcpy(da, a, M * K * 2, gpuMemcpyHostToDevice));
    DEV_CHECK(gpuMemcpy(dw, w, N * K * 2, gpuMemcpyHostToDevice));
    void *dc_alloc = dev_alloc_poisoned(c_bytes + c_off), *dr = NULL, *hr = NULL;
    void *dc = (char *)dc_alloc + c_off;
    if (tc.epi == NSTF_GEMM_EPI_RESIDUAL) {
        hr = malloc(M * N * r_el);
        for (int64_t i = 0; i < M * N; i++) {
            if (tc.r_type == T_BF16) ((uint16_t *)hr)[i] = f2bf(res[i]);
            else ((float *)hr)[i] = res[i];
        }
        dr = tc.in_place ? dc : dev_alloc_poisoned(M * N * r_el); /* in place: R aliases C, same dtype */
    }
    void *hc = malloc(c_bytes);
    float *got = (float *)malloc(M * n_out * 4);
    /* every kernel: the default choice, then each forced one (NSTF_GEMM);
     * a forced choice that lands on a kernel already run is skipped */
    static const char *const env[] = {NULL, "wgmma256", "wgmma128", "wgmma64", "mma"};
    const char *done[5];
    int n_done = 0;
    for (int pass = 0; pass < 5; pass++) {
        if (nstf_switch_set(NSTF_SW_GEMM, env[pass]) != NSTF_OK) { /* counted only when it fails */
            CHECK(false, "NSTF_GEMM=%s: %s", env[pass] ? env[pass] : "(default)", nstf_last_error());
            continue;
        }
        const char *path = nstf_gpu_gemm_path(M, N, K);
        int seen = 0;
        for (int i = 0; i < n_done; i++) seen |= strcmp(done[i], path) == 0;
        if (seen) continue;
        done[n_done++] = path;
        note_path(path);
        DEV_CHECK(gpuMemset(dc_alloc, 0xff, c_bytes + c_off)); /* poison again */
        if (dr) DEV_CHECK(gpuMemcpy(dr, hr, M * N * r_el, gpuMemcpyHostToDevice));
        nstf_status st = nstf_gpu_gemm_bf16((const uint16_t *)da, (const uint16_t *)dw, dc, tc.c_type, dr, tc.r_type,
                                            M, N, K, (nstf_gemm_epilogue)tc.epi, NULL);
        CHECK(st == NSTF_OK, "gemm M=%lld N=%lld K=%lld: status %d", (long long)M, (long long)N, (long long)K, (int)st);
        DEV_CHECK(gpuDeviceSynchronize());
        int guard = dev_fetch_guarded(hc, dc, c_bytes);
        for (int64_t i = 0; i < M * n_out; i++)
            got[i] = tc.c_type == T_BF16 ? bf2f(((uint16_t *)hc)[i]) : ((float *)hc)[i];
        int64_t bad = 0, bad_n = 0;
        double ek = rms_err(got, ref, M * n_out, &bad), en = rms_err(naive, ref, M * n_out, &bad_n);
        double rr = rms(ref, M * n_out);
        const char *en_s[] = {"none", "residual", "swiglu"};
        /* fp32 output: besides the 2x-naive rule, NMSE <= 1e-10 vs fp64. The
         * matrix units' fp32 adders truncate (not round) the aligned products,
         * so the error can exceed a sequential fp32 loop's by a small factor;
         * 1e-10 still catches any lost tile, tail or epilogue term. */
        const double nmse = rr > 0 ? (ek / rr) * (ek / rr) : ek * ek;
        const int f32_ok = tc.c_type == T_BF16 || nmse <= 1e-10;
        int ok = guard && bad == 0 && within_2x_naive(ek, en, rr) && f32_ok;
        printf("  [%-16s] M=%-5lld N=%-5lld K=%-5lld epi=%-8s out=%s res=%s%s  err %.3e naive %.3e (ref rms %.3e)%s\n",
               path, (long long)M, (long long)N, (long long)K, en_s[tc.epi], tc.c_type == T_BF16 ? "bf16" : "f32 ",
               tc.epi == NSTF_GEMM_EPI_RESIDUAL ? (tc.r_type == T_BF16 ? "bf16" : "f32 ") : "-   ",
               tc.in_place ? " in-place" : "", ek, en, rr, ok ? "" : "  FAIL");
        if (c_off) printf("    (C at byte offset %zu)\n", c_off);
        CHECK(guard, "guard region overwritten");
        CHECK(bad == 0, "%lld non-finite outputs", (long long)bad);
        CHECK(within_2x_naive(ek, en, rr), "error %.3e > 2x naive %.3e", ek, en);
        CHECK(f32_ok, "fp32 output NMSE %.3e > 1e-10", nmse);
    }
    (void)nstf_switch_set(NSTF_SW_GEMM, NULL);

    DEV_CHECK(gpuFree(da));
    DEV_CHECK(gpuFree(dw));
    DEV_CHECK(gpuFree(dc_alloc));
    if (dr && !tc.in_place) DEV_CHECK(gpuFree(dr));
    free(hr);
    free(a); free(w); free(res); free(ref); free(naive); free(accd); free(accf); free(hc); free(got);
}

int main(void) {
    int n_dev = 0;
    if (gpuGetDeviceCount(&n_dev) != gpuSuccess || n_dev == 0) {
        printf("test_gemm_gpu: no GPU, skipped\n");
        return 77;
    }
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
        run_case({M, N, K, NSTF_GEMM_EPI_NONE, T_F32, T_F32, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_NONE, T_BF16, T_F32, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_F32, 0}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_F32, 1}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1}, seed++);
        run_case({M, N, K, NSTF_GEMM_EPI_RESIDUAL, T_F32, T_BF16, 0}, seed++);
    }
    const int64_t sw[][3] = {{1, 64, 64},     {33, 224, 72},    {100, 96, 264},
                             {512, 4352, 64}, {300, 1024, 136}, {2048, 2048, 40}};
    for (const auto &s : sw) {
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0}, seed++);
        run_case({s[0], s[1], s[2], NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0}, seed++);
    }
    /* C not 16-byte aligned: the wgmma path's paired (8- or 4-byte) and
     * single-element epilogues */
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0}, seed++, 4);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_BF16, T_F32, 0}, seed++, 2);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0}, seed++, 8);
    run_case({300, 1024, 136, NSTF_GEMM_EPI_SWIGLU, T_F32, T_F32, 0}, seed++, 4);
    run_case({257, 520, 72, NSTF_GEMM_EPI_NONE, T_F32, T_F32, 0}, seed++, 8);
    run_case({257, 520, 72, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1}, seed++, 4);
    run_case({257, 520, 72, NSTF_GEMM_EPI_RESIDUAL, T_BF16, T_BF16, 1}, seed++, 2);
    /* argument validation: errors, not crashes */
    {
        void *d = dev_alloc_poisoned(4096);
        CHECK(nstf_gpu_gemm_bf16((uint16_t *)d, (uint16_t *)d, d, T_F32, NULL, T_F32, 4, 4, 12, NSTF_GEMM_EPI_NONE, NULL) == NSTF_ERR_UNSUPPORTED,
              "K %% 8 != 0 must be refused");
        CHECK(nstf_gpu_gemm_bf16((uint16_t *)((char *)d + 2), (uint16_t *)d, d, T_F32, NULL, T_F32, 4, 4, 8, NSTF_GEMM_EPI_NONE, NULL) ==
                  NSTF_ERR_INVALID_ARG, "misaligned A must be refused");
        CHECK(nstf_gpu_gemm_bf16((uint16_t *)d, (uint16_t *)d, d, T_F32, NULL, T_F32, 4, 48, 8, NSTF_GEMM_EPI_SWIGLU, NULL) == NSTF_ERR_INVALID_ARG,
              "SwiGLU with N %% 32 != 0 must be refused");
        CHECK(nstf_gpu_gemm_bf16((uint16_t *)d, (uint16_t *)d, d, T_F32, NULL, T_F32, 4, 4, 8, NSTF_GEMM_EPI_RESIDUAL, NULL) == NSTF_ERR_INVALID_ARG,
              "residual without R must be refused");
        CHECK(nstf_gpu_swiglu_packed_row(17, 64) == 64 + 1 && nstf_gpu_swiglu_packed_row(33, 64) == 17,
              "packed row map");
        DEV_CHECK(gpuFree(d));
    }
    printf("kernels run:");
    for (int i = 0; i < g_n_paths; i++) printf(" [%s]", g_path_seen[i]);
    printf("\n");
    /* on Hopper every wgmma tile width must have been exercised */
    int n_wg = 0;
    for (int i = 0; i < g_n_paths; i++) n_wg += strncmp(g_path_seen[i], "wgmma", 5) == 0;
    CHECK(n_wg == 0 || n_wg == 3, "only %d of the 3 wgmma tile widths were exercised", n_wg);
    return test_finish("test_gemm_gpu");
}
