/* gpu_harness.h — the one harness of the GPU op tests (test_ops_gpu.cu,
 * test_gemm_gpu.cu, test_attention_gpu.cu): C++, on top of tests/test_util.h
 * (counted CHECKs, the seeded RNG, NMSE). It owns
 *
 *  - cases: a case is one output line, "PASS|FAIL <name>  <detail>", made of
 *    any number of CHECKs; it fails when one of its checks fails. The last
 *    line of a test is gh_finish()'s count of cases and of checks.
 *  - device buffers (gh_buf): [guard][pad][payload][guard]. The payload is
 *    poisoned at allocation (GH_POISON bytes: 0xff, a NaN in f32 and in bf16)
 *    unless filled from the host, and can be poisoned again before each run
 *    (gh_poison). The guards (TEST_GUARD_BYTE, 0xa5, the CPU tests' host
 *    guard too) are GH_GUARD bytes before and after every payload; `pad`
 *    (guard bytes too) shifts the payload off 256-byte alignment. The guard
 *    is a byte the poison is not, so a kernel that copies poison past the end
 *    of a buffer is caught as well.
 *  - gh_launched(): after every launch, three checks: the launcher returned
 *    NSTF_OK, the stream synchronizes without error, and the guards of every
 *    live buffer (inputs, outputs, scratch) are intact.
 *  - gh_compare(): one output against its fp64 reference under its own
 *    tolerance (gh_tol): NMSE <= a bound (fp32 outputs: 1e-7), or the bf16
 *    rule below against a naive result. Every compared value must be
 *    finite (NaN/Inf fails). A case may compare several outputs, each with
 *    its own tolerance: rmsnorm's x (fp32) and y (bf16) today, and the
 *    gradients of a backward op (dX, dW, ... each checked against the CPU
 *    gradient) in the gradient mode to come.
 *
 * The bf16 rule, defined here once (gh_within_2x_naive):
 *     NMSE(kernel, fp64 ref) <= 2 * NMSE(naive, fp64 ref) + GH_NAIVE_FLOOR
 * where NMSE(a, r) = sum (a - r)^2 / sum r^2 and "naive" is a plain
 * implementation in the kernel's precision (bf16 inputs and bf16 operands of
 * the matrix products, fp32 math and sequential fp32 accumulation, bf16
 * output), computed by the test on the host. GH_NAIVE_FLOOR = 1e-24 is
 * an RMS error of 1e-12 of the reference's RMS: it only decides when the
 * naive result is exact (NMSE 0), and then the kernel must be exact too.
 * Of the two earlier forms, this keeps the tighter of each part: the ratio is
 * on NMSE (an RMS ratio of 2 allowed 4x the NMSE) and the floor is the
 * RMS-relative 1e-12 (an NMSE floor of 1e-12 is an RMS error of 1e-6 of the
 * reference, under which a few bf16-ulp errors in a large output could hide
 * when the naive result was exact). */
#ifndef NSTF_GPU_HARNESS_H
#define NSTF_GPU_HARNESS_H

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <string>
#include <vector>

#include "ops/gpu/gpu_api.h"
#include "test_util.h" /* CHECK, g_checks / g_fails, test_rng, nmse, TEST_POISON_BYTE, TEST_GUARD_BYTE */

#define GH_GUARD 256 /* guard bytes on each side of a payload (keeps its 256-byte alignment) */
#define GH_POISON TEST_POISON_BYTE
#define GH_NAIVE_FLOOR 1e-24

/* ---- the harness's own failures (not a kernel's): stop the test ---------- */

static inline void gh_must(nstf_status st, const char *what) {
    if (st == NSTF_OK) return;
    fprintf(stderr, "harness: %s: %s\n", what, nstf_last_error());
    exit(2);
}

/* ---- cases --------------------------------------------------------------- */

struct gh_state {
    bool open = false;
    int fails_at_begin = 0;
    int n_cases = 0, n_case_fails = 0;
    std::string name, detail;
};
static gh_state g_gh;

static inline void gh_vappend(std::string &s, const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    s += buf;
}

/* Prints the case's line; it passed when none of its checks failed. */
static inline void gh_end(void) {
    if (!g_gh.open) return;
    const bool ok = g_fails == g_gh.fails_at_begin;
    printf("%s %-62s %s\n", ok ? "PASS" : "FAIL", g_gh.name.c_str(), g_gh.detail.c_str());
    fflush(stdout);
    g_gh.n_cases++;
    g_gh.n_case_fails += !ok;
    g_gh.open = false;
}

/* Starts a case (printf-style name); an open case is ended first. */
__attribute__((format(printf, 1, 2))) static inline void gh_begin(const char *fmt, ...) {
    if (g_gh.open) gh_end();
    g_gh.open = true;
    g_gh.fails_at_begin = g_fails;
    g_gh.name.clear();
    g_gh.detail.clear();
    va_list ap;
    va_start(ap, fmt);
    gh_vappend(g_gh.name, fmt, ap);
    va_end(ap);
}

/* Adds to the case's detail text (printed after its name). */
__attribute__((format(printf, 1, 2))) static inline void gh_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (!g_gh.detail.empty()) g_gh.detail += ' ';
    gh_vappend(g_gh.detail, fmt, ap);
    va_end(ap);
}

/* The last line: "<name>: C cases (P passed, F failed), K checks (P passed,
 * F failed)"; returns the exit code (0 when every check passed, else 1). */
static inline int gh_finish(const char *name) {
    gh_end();
    printf("%s: %d cases (%d passed, %d failed), %d checks (%d passed, %d failed)\n", name, g_gh.n_cases,
           g_gh.n_cases - g_gh.n_case_fails, g_gh.n_case_fails, g_checks, g_checks - g_fails, g_fails);
    return g_fails ? 1 : 0;
}

/* False (after printing "<name>: no GPU, skipped") when there is no device:
 * main then returns TEST_SKIP (77). Otherwise prints device 0's line. */
static inline bool gh_init(const char *name) {
    if (nstf_gpu_device_count() < 1) {
        printf("%s: no GPU, skipped\n", name);
        return false;
    }
    nstf_gpu_info info;
    gh_must(nstf_gpu_query(0, &info), "device query");
    printf("device 0: %s (%s), %d SMs/CUs, wave %d, %.1f GiB (%.1f free), L2 %.0f MiB\n", info.name, info.arch,
           info.n_sm, info.wave_size, info.total_mem / 1073741824.0, info.free_mem / 1073741824.0,
           info.l2_bytes / 1048576.0);
    return true;
}

/* ---- device buffers with guard regions ----------------------------------- */

struct gh_buf {
    unsigned char *base = nullptr; /* the allocation: [GH_GUARD + pad][bytes][GH_GUARD] */
    size_t bytes = 0, front = 0;   /* front = GH_GUARD + pad */
    void *p() const { return base + front; }
    template <typename T> T *as() const { return (T *)(base + front); }
};

/* Every live buffer, for the guard check after each launch. */
static std::vector<gh_buf> g_gh_live;

/* `bytes` of device memory filled from `src`, or poisoned when src is NULL;
 * `pad` extra guard bytes in front shift the payload off alignment. */
static inline gh_buf gh_alloc(size_t bytes, const void *src = nullptr, size_t pad = 0) {
    gh_buf b;
    b.bytes = bytes;
    b.front = GH_GUARD + pad;
    gh_must(nstf_gpu_malloc((void **)&b.base, b.front + bytes + GH_GUARD), "gpu malloc");
    gh_must(nstf_gpu_memset(b.base, TEST_GUARD_BYTE, b.front, nullptr), "memset");
    gh_must(nstf_gpu_memset(b.p(), GH_POISON, bytes, nullptr), "memset");
    gh_must(nstf_gpu_memset(b.base + b.front + bytes, TEST_GUARD_BYTE, GH_GUARD, nullptr), "memset");
    if (src && bytes) gh_must(nstf_gpu_memcpy_h2d(b.p(), src, bytes, nullptr), "h2d");
    gh_must(nstf_gpu_stream_sync(nullptr), "sync");
    g_gh_live.push_back(b);
    return b;
}
/* A weight matrix [n_out, n_in] of type t from the host, rewritten into
 * the GPU's row layout as the backend does after its upload
 * (nstf_gpu_weights_relayout: Q4_0, IQ4_NL and Q8_0 rows of a multiple of
 * 256 elements, Q6_K rows of a multiple of 2048). */
static inline gh_buf gh_alloc_weights(nstf_type t, int64_t n_in, int64_t n_out, const void *src, size_t pad = 0) {
    uint64_t rb = 0;
    gh_must(nstf_type_row_bytes(t, n_in, &rb) ? NSTF_OK : NSTF_ERR_INVALID_ARG, "row bytes");
    gh_buf b = gh_alloc((size_t)rb * (size_t)n_out, src, pad);
    gh_must(nstf_gpu_weights_relayout(t, b.p(), n_in, n_out, nullptr), "relayout");
    gh_must(nstf_gpu_stream_sync(nullptr), "sync");
    return b;
}

/* The payload from the host (its guards untouched). */
static inline void gh_upload(const gh_buf &b, const void *src) {
    if (b.bytes) gh_must(nstf_gpu_memcpy_h2d(b.p(), src, b.bytes, nullptr), "h2d");
}
/* The payload poisoned again: an output the next run does not write shows. */
static inline void gh_poison(const gh_buf &b) {
    gh_must(nstf_gpu_memset(b.p(), GH_POISON, b.bytes, nullptr), "memset");
    gh_must(nstf_gpu_stream_sync(nullptr), "sync");
}
/* The payload to the host. */
static inline void gh_fetch(const gh_buf &b, void *dst) {
    if (b.bytes) gh_must(nstf_gpu_memcpy_d2h(dst, b.p(), b.bytes, nullptr), "d2h");
}
static inline void gh_free(gh_buf &b) {
    for (size_t i = 0; i < g_gh_live.size(); i++)
        if (g_gh_live[i].base == b.base) {
            g_gh_live.erase(g_gh_live.begin() + (long)i);
            break;
        }
    nstf_gpu_free(b.base);
    b.base = nullptr;
}

/* Whether both guards of b still hold TEST_GUARD_BYTE. */
static inline bool gh_guard_intact(const gh_buf &b) {
    std::vector<unsigned char> g(b.front > GH_GUARD ? b.front : GH_GUARD);
    bool ok = true;
    gh_must(nstf_gpu_memcpy_d2h(g.data(), b.base, b.front, nullptr), "d2h");
    for (size_t i = 0; i < b.front; i++) ok &= g[i] == TEST_GUARD_BYTE;
    gh_must(nstf_gpu_memcpy_d2h(g.data(), b.base + b.front + b.bytes, GH_GUARD, nullptr), "d2h");
    for (size_t i = 0; i < GH_GUARD; i++) ok &= g[i] == TEST_GUARD_BYTE;
    return ok;
}

/* After every launch: the status, the stream, every live buffer's guards
 * (three checks). True when all three hold. */
static inline bool gh_launched(nstf_status st, const char *what) {
    CHECK(st == NSTF_OK, "%s: %s", what, nstf_last_error());
    const nstf_status ss = nstf_gpu_stream_sync(nullptr);
    CHECK(ss == NSTF_OK, "%s: stream sync: %s", what, nstf_last_error());
    int broken = 0;
    for (const gh_buf &b : g_gh_live) broken += !gh_guard_intact(b);
    CHECK(broken == 0, "%s: %d buffer guard(s) overwritten", what, broken);
    if (broken) gh_note("GUARD BROKEN (%d)", broken);
    if (st != NSTF_OK) gh_note("error: %s", nstf_last_error());
    return st == NSTF_OK && ss == NSTF_OK && broken == 0;
}

/* ---- host data --------------------------------------------------------------- */

static inline float gh_bf(float f) { return nstf_bf16_to_f32(nstf_f32_to_bf16(f)); } /* round to bf16 */
static inline std::vector<uint16_t> gh_to_bf16(const std::vector<float> &v) {
    std::vector<uint16_t> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = nstf_f32_to_bf16(v[i]);
    return o;
}
static inline std::vector<float> gh_from_bf16(const std::vector<uint16_t> &v) {
    std::vector<float> o(v.size());
    for (size_t i = 0; i < v.size(); i++) o[i] = nstf_bf16_to_f32(v[i]);
    return o;
}
/* A device output of `type` (F32 or BF16 bits) read back as floats. */
static inline std::vector<float> gh_fetch_floats(const gh_buf &b, nstf_type type, size_t n) {
    std::vector<float> o(n);
    if (type == NSTF_TYPE_BF16) {
        std::vector<uint16_t> h(n);
        gh_fetch(b, h.data());
        o = gh_from_bf16(h);
    } else {
        gh_fetch(b, o.data());
    }
    return o;
}

/* The attention tests' softmax of one row scored twice (fp64 reference sd,
 * fp32 naive sf, n keys, maxima md, mf): each score replaced by its
 * exponential less the maximum; the two sums returned in *ld, *lf. */
static inline void gh_softmax_exp(double *sd, float *sf, int64_t n, double md, float mf, double *ld, float *lf) {
    *ld = 0;
    *lf = 0;
    for (int64_t p = 0; p < n; p++) {
        sd[p] = exp(sd[p] - md);
        sf[p] = expf(sf[p] - mf);
        *ld += sd[p];
        *lf += sf[p];
    }
}

/* ---- tolerances and the comparison of one output ---------------------------- */

/* The bf16 rule (see the top of this file). A NaN error fails it. */
static inline bool gh_within_2x_naive(double nmse_kernel, double nmse_naive) {
    return nmse_kernel <= 2.0 * nmse_naive + GH_NAIVE_FLOOR;
}

enum gh_tol_kind { GH_TOL_NMSE, GH_TOL_2X_NAIVE };
struct gh_tol {
    gh_tol_kind kind;
    double max_nmse;    /* GH_TOL_NMSE: the bound */
    const float *naive; /* GH_TOL_2X_NAIVE: the naive result, same length as the output */
};
static inline gh_tol gh_tol_nmse(double max_nmse) { return {GH_TOL_NMSE, max_nmse, nullptr}; }
static inline gh_tol gh_tol_fp32(void) { return gh_tol_nmse(1e-7); } /* fp32 ops vs fp64 */
static inline gh_tol gh_tol_naive(const float *naive) { return {GH_TOL_2X_NAIVE, 0.0, naive}; }

struct gh_result {
    double nmse, nmse_naive; /* nmse_naive: NAN without a naive result */
    int64_t nonfinite;
    bool ok;
};

/* Compares output `label` (n values) with its fp64 reference under `tol`:
 * two checks (every value finite; the tolerance), and a note for the line. */
static inline gh_result gh_compare(const char *label, const float *got, const double *ref, int64_t n, gh_tol tol) {
    gh_result r;
    r.nonfinite = count_nonfinite(got, n);
    r.nmse = nmse(got, ref, n);
    r.nmse_naive = tol.kind == GH_TOL_2X_NAIVE ? nmse(tol.naive, ref, n) : NAN;
    const bool within = tol.kind == GH_TOL_2X_NAIVE ? gh_within_2x_naive(r.nmse, r.nmse_naive)
                                                    : r.nmse <= tol.max_nmse;
    CHECK(r.nonfinite == 0, "%s: %lld of %lld values are NaN/Inf", label, (long long)r.nonfinite, (long long)n);
    if (tol.kind == GH_TOL_2X_NAIVE) {
        CHECK(within, "%s: NMSE %.3e > 2 x naive %.3e", label, r.nmse, r.nmse_naive);
        gh_note("%s nmse=%.3g naive=%.3g", label, r.nmse, r.nmse_naive);
    } else {
        CHECK(within, "%s: NMSE %.3e > %.0e", label, r.nmse, tol.max_nmse);
        gh_note("%s nmse=%.3g (<=%.0e)", label, r.nmse, tol.max_nmse);
    }
    if (r.nonfinite) gh_note("nonfinite=%lld", (long long)r.nonfinite);
    r.ok = within && r.nonfinite == 0;
    return r;
}
/* The same with a float reference (the scalar nstf_ref_* compute in double
 * and store float): widened, so the metric is the same NMSE. */
static inline gh_result gh_compare(const char *label, const float *got, const float *ref, int64_t n, gh_tol tol) {
    std::vector<double> r(ref, ref + n);
    return gh_compare(label, got, r.data(), n, tol);
}

#endif
