/* roofline.c — ceiling measurements, the cache file and the SVG chart. */
#include "prof/roofline.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

#include "core/mem.h"
#include "core/switches.h"
#include "core/xml.h"
#include "model/session.h"
#include "prof/report.h"
#include "prof/timer.h"

/* ---- measurements --------------------------------------------------------- */

typedef struct {
    const uint8_t *src;
    uint8_t *dst;
    size_t bytes;
} copy_job;

static void copy_worker(void *ctx, int ith, int nth) {
    copy_job *j = ctx;
    int64_t lo, hi;
    nstf_split_range((int64_t)j->bytes, 4096, ith, nth, &lo, &hi);
    if (hi > lo) memcpy(j->dst + lo, j->src + lo, (size_t)(hi - lo));
}

enum { FMA_ITERS = 1 << 22, N_ACC = 12 };

typedef struct {
    volatile float sink[256];
    volatile int32_t isink[256];
} peak_job;

#if defined(__AVX2__) && defined(__FMA__)
/* The chains are named variables, not an array: at -O2 an array of
 * vectors indexed in an inner loop stays in memory and the loop measures
 * store forwarding instead of the FMA units. */
#define REP12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define REP6(X) X(0) X(1) X(2) X(3) X(4) X(5)
static void fma_worker(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    (void)nth;
#define DECL(k) __m256 acc##k = _mm256_set1_ps(0.001f * (float)(k + ith));
    REP12(DECL)
#undef DECL
    const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < FMA_ITERS / 8; i++) {
#define STEP(k) acc##k = _mm256_fmadd_ps(acc##k, m, c);
        REP12(STEP)
#undef STEP
    }
    __m256 s = acc0;
#define SUM(k) s = _mm256_add_ps(s, acc##k);
    REP12(SUM)
#undef SUM
    float out[8];
    _mm256_storeu_ps(out, s);
    j->sink[ith & 255] = out[0];
}
#define FMA_FLOPS_PER_THREAD (2.0 * 8 * N_ACC * (FMA_ITERS / 8))

enum { N_ACC8 = 6 };
static void int8_worker(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    (void)nth;
#define DECL(k) __m256i acc##k = _mm256_set1_epi32(k + ith), w##k = _mm256_set1_epi8((char)(3 + k));
    REP6(DECL)
#undef DECL
    __m256i x = _mm256_set1_epi8(-2);
    const __m256i ones = _mm256_set1_epi16(1);
    for (int i = 0; i < FMA_ITERS / 32; i++) {
        /* an empty asm makes the inputs opaque each iteration, so the
         * compiler cannot hoist the loop-invariant products */
#define HIDE(k) __asm__ volatile("" : "+x"(w##k));
        REP6(HIDE)
#undef HIDE
        __asm__ volatile("" : "+x"(x));
        /* the quantized matmul's inner step: 32 byte multiply-accumulates */
#define STEP(k) acc##k = _mm256_add_epi32(acc##k, _mm256_madd_epi16(_mm256_maddubs_epi16(w##k, x), ones));
        REP6(STEP)
#undef STEP
    }
    __m256i s = acc0;
#define SUM(k) s = _mm256_add_epi32(s, acc##k);
    REP6(SUM)
#undef SUM
    int32_t out[8];
    _mm256_storeu_si256((__m256i *)out, s);
    j->isink[ith & 255] = out[0];
}
#define INT8_OPS_PER_THREAD (2.0 * 32 * N_ACC8 * (FMA_ITERS / 32))
#else
/* Portable fallback: scalar chains the compiler may vectorize. */
static void fma_worker(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    (void)nth;
    float acc[N_ACC];
    for (int a = 0; a < N_ACC; a++) acc[a] = 0.001f * (float)(a + ith);
    for (int i = 0; i < FMA_ITERS; i++)
        for (int a = 0; a < N_ACC; a++) acc[a] = fmaf(acc[a], 0.999999f, 1e-7f);
    float s = 0;
    for (int a = 0; a < N_ACC; a++) s += acc[a];
    j->sink[ith & 255] = s;
}
#define FMA_FLOPS_PER_THREAD (2.0 * N_ACC * FMA_ITERS)

static void int8_worker(void *ctx, int ith, int nth) {
    peak_job *j = ctx;
    (void)nth;
    int32_t acc[N_ACC];
    for (int a = 0; a < N_ACC; a++) acc[a] = a + ith;
    for (int i = 0; i < FMA_ITERS; i++)
        for (int a = 0; a < N_ACC; a++) acc[a] += (int8_t)(i & 7) * (int8_t)(a - 5);
    int32_t s = 0;
    for (int a = 0; a < N_ACC; a++) s += acc[a];
    j->isink[ith & 255] = s;
}
#define INT8_OPS_PER_THREAD (2.0 * N_ACC * FMA_ITERS)
#endif

/* Best of `reps` runs of fn over the pool, in seconds. */
static double best_time(nstf_pool *pool, nstf_pool_fn fn, void *ctx, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        uint64_t t0 = nstf_now_ns();
        nstf_pool_run(pool, fn, ctx);
        double dt = (double)(nstf_now_ns() - t0) * 1e-9;
        if (dt < best) best = dt;
    }
    return best;
}

nstf_status nstf_roofline_measure(nstf_pool *pool, nstf_roofline *out) {
    memset(out, 0, sizeof *out);
    out->n_threads = nstf_pool_size(pool);
    nstf_cpu_info(out->cpu, sizeof out->cpu);
    /* 256 MiB per buffer: eight times a large last-level cache */
    const size_t bytes = (size_t)256 << 20;
    uint8_t *src = nstf_alloc(bytes, "bandwidth test source"), *dst = nstf_alloc(bytes, "bandwidth test destination");
    if (!src || !dst) {
        nstf_free(src);
        nstf_free(dst);
        return NSTF_ERR_OOM;
    }
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    copy_job cj = {src, dst, bytes};
    double dt = best_time(pool, copy_worker, &cj, 5);
    out->mem_gbs = 2.0 * (double)bytes / dt / 1e9;
    nstf_free(src);
    nstf_free(dst);

    peak_job *pj = nstf_calloc(1, sizeof *pj, "peak test");
    if (!pj) return NSTF_ERR_OOM;
    dt = best_time(pool, fma_worker, pj, 3);
    out->fp32_gflops = FMA_FLOPS_PER_THREAD * out->n_threads / dt / 1e9;
    dt = best_time(pool, int8_worker, pj, 3);
    out->int8_gops = INT8_OPS_PER_THREAD * out->n_threads / dt / 1e9;
    nstf_free(pj);
    return NSTF_OK;
}

nstf_status nstf_roofline_for_session(nstf_session *s, const char *cache, bool remeasure, FILE *log,
                                      nstf_roofline *out) {
    nstf_backend *be = s->be;
    nstf_pool *pool = nstf_backend_cpu_pool(be);
    char key[sizeof out->cpu];
    int n_threads = pool ? nstf_pool_size(pool) : 0;
    if (pool) {
        nstf_cpu_info(key, sizeof key);
    } else { /* "GPU 0: NVIDIA H100 80GB HBM3, sm_90, ...": the name, not the free memory */
        snprintf(key, sizeof key, "%.127s", be->device);
        char *comma = strchr(key, ',');
        if (comma) *comma = 0;
    }
    if (!remeasure && nstf_roofline_load(cache, key, n_threads, out) == NSTF_OK) return NSTF_OK;
    if (pool) {
        if (log)
            fprintf(log, "nstf: measuring roofline ceilings (copy bandwidth, fp32 FMA, int8 dot) on %d threads...\n",
                    n_threads);
        NSTF_TRY(nstf_roofline_measure(pool, out));
    } else {
        if (log) fprintf(log, "nstf: measuring GPU roofline (device copy bandwidth, bf16 GEMM 8192^3)...\n");
        memset(out, 0, sizeof *out);
        snprintf(out->cpu, sizeof out->cpu, "%s", key);
        NSTF_TRY(nstf_backend_gpu_peaks(be, &out->mem_gbs, &out->fp32_gflops));
        out->int8_gops = out->fp32_gflops;
    }
    if (nstf_roofline_save(cache, out) != NSTF_OK && log) fprintf(log, "nstf: warning: %s\n", nstf_last_error());
    return NSTF_OK;
}

/* ---- cache ------------------------------------------------------------------- */

void nstf_roofline_default_cache(char *buf, size_t cap) {
    const char *xdg = nstf_switch_str(NSTF_SW_XDG_CACHE_HOME), *home = nstf_switch_str(NSTF_SW_HOME);
    if (xdg && *xdg) snprintf(buf, cap, "%s/nstf/roofline.json", xdg);
    else if (home && *home) snprintf(buf, cap, "%s/.cache/nstf/roofline.json", home);
    else snprintf(buf, cap, ".nstf-roofline.json");
}

nstf_status nstf_roofline_load(const char *path, const char *cpu, int n_threads, nstf_roofline *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "no roofline cache at '%s'", path);
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "cpu"), *t = cJSON_GetObjectItemCaseSensitive(root, "n_threads"),
                *m = cJSON_GetObjectItemCaseSensitive(root, "mem_gbs"), *p = cJSON_GetObjectItemCaseSensitive(root, "fp32_gflops"),
                *q = cJSON_GetObjectItemCaseSensitive(root, "int8_gops");
    nstf_status s = NSTF_OK;
    if (!cJSON_IsString(c) || !cJSON_IsNumber(t) || !cJSON_IsNumber(m) || !cJSON_IsNumber(p) || !cJSON_IsNumber(q) ||
        !(m->valuedouble > 0) || !(p->valuedouble > 0) || !(q->valuedouble > 0))
        s = nstf_set_error(NSTF_ERR_FORMAT, "roofline cache '%s' is malformed", path);
    else if (strcmp(c->valuestring, cpu) != 0 || t->valueint != n_threads)
        s = nstf_set_error(NSTF_ERR_RANGE, "roofline cache '%s' is for another CPU or thread count", path);
    else {
        memset(out, 0, sizeof *out);
        snprintf(out->cpu, sizeof out->cpu, "%s", c->valuestring);
        out->n_threads = t->valueint;
        out->mem_gbs = m->valuedouble;
        out->fp32_gflops = p->valuedouble;
        out->int8_gops = q->valuedouble;
    }
    cJSON_Delete(root);
    return s;
}

static void make_parent_dirs(const char *path) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        mkdir(dir, 0755); /* existing directories are fine; failures show at fopen */
        *p = '/';
    }
}

nstf_status nstf_roofline_save(const char *path, const nstf_roofline *r) {
    make_parent_dirs(path);
    FILE *f = fopen(path, "w");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot write roofline cache '%s': %s", path, strerror(errno));
    fputs("{\"cpu\": \"", f);
    nstf_json_write_string(f, r->cpu);
    fprintf(f, "\", \"n_threads\": %d, \"mem_gbs\": %.3f, \"fp32_gflops\": %.3f, \"int8_gops\": %.3f}\n",
            r->n_threads, r->mem_gbs, r->fp32_gflops, r->int8_gops);
    if (fclose(f) != 0) return nstf_set_error(NSTF_ERR_IO, "error writing roofline cache '%s'", path);
    return NSTF_OK;
}

/* ---- model ------------------------------------------------------------------- */

double nstf_roofline_attainable(const nstf_roofline *r, double intensity, bool int8) {
    double peak = int8 ? r->int8_gops : r->fp32_gflops, mem = r->mem_gbs * intensity;
    return mem < peak ? mem : peak;
}

double nstf_roofline_ridge(const nstf_roofline *r, bool int8) {
    return (int8 ? r->int8_gops : r->fp32_gflops) / r->mem_gbs;
}

/* ---- SVG ------------------------------------------------------------------------ */

typedef struct {
    double x0, x1, y0, y1; /* log10 ranges */
    double left, top, w, h;
} axes;

static double px(const axes *a, double v) { return a->left + (log10(v) - a->x0) / (a->x1 - a->x0) * a->w; }
static double py(const axes *a, double v) { return a->top + a->h - (log10(v) - a->y0) / (a->y1 - a->y0) * a->h; }

nstf_status nstf_roofline_svg(const char *path, const nstf_roofline *r, const nstf_roofline_point *pts, int n,
                              const char *const series_names[2]) {
    if (!(r->mem_gbs > 0) || !(r->fp32_gflops > 0) || !(r->int8_gops > 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "roofline ceilings must be positive");
    double peak = fmax(r->fp32_gflops, r->int8_gops);
    double imin = 0.1, imax = 10.0 * nstf_roofline_ridge(r, r->int8_gops > r->fp32_gflops);
    double gmin = 1e30;
    for (int i = 0; i < n; i++) {
        if (!(pts[i].intensity > 0) || !(pts[i].gflops > 0)) continue;
        imin = fmin(imin, pts[i].intensity);
        imax = fmax(imax, pts[i].intensity);
        gmin = fmin(gmin, pts[i].gflops);
    }
    gmin = fmin(gmin, r->mem_gbs * imin);
    axes a = {floor(log10(imin)), ceil(log10(imax * 1.01)), floor(log10(gmin)), ceil(log10(peak * 2)), 80, 40, 760, 480};
    FILE *f = fopen(path, "w");
    if (!f) return nstf_set_error(NSTF_ERR_IO, "cannot write SVG '%s': %s", path, strerror(errno));
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"900\" height=\"600\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"900\" height=\"600\" fill=\"white\"/>\n");
    fputs("<text x=\"450\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">Roofline: ", f);
    nstf_xml_text(f, r->cpu);
    fprintf(f, " (%d threads)</text>\n", r->n_threads);
    /* decade grid and labels */
    for (double e = a.x0; e <= a.x1 + 1e-9; e++) {
        double x = px(&a, pow(10, e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x, a.top, x, a.top + a.h);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n", x, a.top + a.h + 15, pow(10, e));
    }
    for (double e = a.y0; e <= a.y1 + 1e-9; e++) {
        double y = py(&a, pow(10, e));
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", a.left, y, a.left + a.w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%g</text>\n", a.left - 5, y + 4, pow(10, e));
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n", a.left,
            a.top, a.w, a.h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">arithmetic intensity (FLOP/byte)</text>\n",
            a.left + a.w / 2, a.top + a.h + 35);
    fprintf(f, "<text transform=\"translate(20,%.1f) rotate(-90)\" text-anchor=\"middle\">GFLOP/s</text>\n",
            a.top + a.h / 2);
    /* roofs: memory slope up to each ceiling, then flat */
    const double xlo = pow(10, a.x0), xhi = pow(10, a.x1);
    const struct { double peak; const char *name, *color; } roofs[2] = {
        {r->fp32_gflops, "fp32 FMA", "#1f77b4"}, {r->int8_gops, "int8 dot", "#d62728"}};
    for (int k = 0; k < 2; k++) {
        double ridge = roofs[k].peak / r->mem_gbs, xs = xlo, ys = r->mem_gbs * xlo;
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%.1f,%.1f %.1f,%.1f %.1f,%.1f\"/>\n",
                roofs[k].color, px(&a, xs), py(&a, ys), px(&a, ridge), py(&a, roofs[k].peak), px(&a, xhi),
                py(&a, roofs[k].peak));
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%s %.1f GFLOP/s</text>\n",
                a.left + a.w - 5, py(&a, roofs[k].peak) - 4, roofs[k].color, roofs[k].name, roofs[k].peak);
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">memory %.1f GB/s</text>\n", px(&a, xlo) + 5,
            py(&a, r->mem_gbs * xlo) - 6, r->mem_gbs);
    static const char *dot_color[2] = {"#2ca02c", "#9467bd"};
    for (int i = 0; i < n; i++) {
        if (!(pts[i].intensity > 0) || !(pts[i].gflops > 0)) continue;
        int sr = pts[i].series == 1;
        double x = px(&a, pts[i].intensity), y = py(&a, pts[i].gflops);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n", x, y, dot_color[sr]);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"9\" fill=\"%s\">", x + 6, y + 3, dot_color[sr]);
        nstf_xml_text(f, pts[i].label);
        fputs("</text>\n", f);
    }
    for (int k = 0; k < 2 && series_names; k++) {
        if (!series_names[k]) continue;
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/><text x=\"%.1f\" y=\"%.1f\">", a.left + 15,
                a.top + 15 + 16 * k, dot_color[k], a.left + 25, a.top + 19 + 16 * k);
        nstf_xml_text(f, series_names[k]);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
    if (fclose(f) != 0) return nstf_set_error(NSTF_ERR_IO, "error writing SVG '%s'", path);
    return NSTF_OK;
}
