/* gpu_measure.c — GPU measurements for the CLI: the execution-level matrix
 * of `nstf bench --levels` (forward time per level, its split into
 * attention / feed-forward / normalization / residual from an event-
 * bracketed profiling pass, kernels per forward, device memory by kind,
 * speed-up over L0, and a sweep over prefill batch and context depth), and
 * `nstf profile --device gpu` (per-kernel table against a roofline measured
 * on the card, Chrome trace of GPU op spans, roofline SVG). Every time is
 * from GPU events. Compiled to stubs without a GPU backend. */
#include "gpu_measure.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)

#include "ops/gpu/gpu_api.h"
#include "prof/roofline.h"
#include "prof/timer.h"
#include "prof/trace.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void rand_toks(int32_t *t, int n, int nv, uint64_t *rng) {
    for (int i = 0; i < n; i++) {
        uint64_t x = *rng;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        *rng = x;
        t[i] = (int32_t)(x % (uint64_t)nv);
    }
}

/* Median ms of `reps` forwards of n tokens at pos0 (after 2 untimed ones). */
static nstf_status time_fwd(nstf_llama_gpu *g, const int32_t *toks, int n, int pos0, int reps, double *ms_out) {
    void *ev0 = NULL, *ev1 = NULL, *st = nstf_llama_gpu_stream(g);
    double ms[64];
    if (reps > 64) reps = 64;
    NSTF_TRY(nstf_gpu_event_create(&ev0));
    nstf_status rc = nstf_gpu_event_create(&ev1);
    for (int r = -2; rc == NSTF_OK && r < reps; r++) {
        float m = 0;
        rc = nstf_gpu_event_record(ev0, st);
        if (rc == NSTF_OK) rc = nstf_llama_gpu_forward(g, toks, n, pos0, false, NULL, NULL);
        if (rc == NSTF_OK) rc = nstf_gpu_event_record(ev1, st);
        if (rc == NSTF_OK) rc = nstf_gpu_event_ms(ev0, ev1, &m);
        if (r >= 0) ms[r] = m;
    }
    nstf_gpu_event_destroy(ev0);
    nstf_gpu_event_destroy(ev1);
    if (rc != NSTF_OK) return rc;
    qsort(ms, (size_t)reps, sizeof ms[0], cmp_d);
    *ms_out = ms[reps / 2];
    return NSTF_OK;
}

/* One profiled forward: time per category (ms). */
static nstf_status prof_fwd(nstf_llama_gpu *g, const int32_t *toks, int n, int pos0, double cat[NSTF_GPU_N_CAT]) {
    NSTF_TRY(nstf_llama_gpu_set_prof(g, true, 0));
    nstf_status rc = nstf_llama_gpu_forward(g, toks, n, pos0, false, NULL, NULL);
    int nr = 0;
    const nstf_gpu_op *ops = nstf_llama_gpu_prof_ops(g, &nr, NULL);
    for (int c = 0; c < NSTF_GPU_N_CAT; c++) cat[c] = 0;
    for (int i = 0; rc == NSTF_OK && i < nr; i++) cat[ops[i].cat] += ops[i].t1_ms - ops[i].t0_ms;
    nstf_status r2 = nstf_llama_gpu_set_prof(g, false, 0);
    return rc != NSTF_OK ? rc : r2;
}

#define MIB(x) ((double)(x) / (1 << 20))

int nstf_gpu_levels_matrix(const char *model, int reps) {
    enum { PP = 512, DEPTH_MAX = 8192 };
    static const int batches[] = {1, 8, 32}, depths[] = {128, 1024, 8192};
    nstf_session_params sp = nstf_session_default_params();
    sp.n_ctx = DEPTH_MAX + PP + 8;
    sp.n_batch = PP;
    sp.device = "gpu";
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    nstf_llama_gpu *g = s->gpu;
    const int nv = s->model->cfg.n_vocab;
    int32_t *toks = malloc(sizeof(int32_t) * PP);
    if (!toks) {
        nstf_session_close(s);
        return 1;
    }
    uint64_t rng = 0x2545f4914f6cdd1dull;
    rand_toks(toks, PP, nv, &rng);
    double pf[NSTF_GPU_N_LEVELS], dc[NSTF_GPU_N_LEVELS], pcat[NSTF_GPU_N_LEVELS][NSTF_GPU_N_CAT],
        dcat[NSTF_GPU_N_LEVELS][NSTF_GPU_N_CAT], sweep[NSTF_GPU_N_LEVELS][6];
    int64_t pk[NSTF_GPU_N_LEVELS], dk[NSTF_GPU_N_LEVELS], nodes = 0;
    nstf_gpu_mem mem[NSTF_GPU_N_LEVELS];
    nstf_status st = NSTF_OK;
    /* fill the cache to the deepest depth once at L3 (the contents do not
     * depend on the level; each timed step only writes its own position) */
    st = nstf_llama_gpu_set_level(g, 3);
    for (int p = 0; st == NSTF_OK && p < DEPTH_MAX; p += PP) st = nstf_llama_gpu_forward(g, toks, PP, p, false, NULL, NULL);
    for (int L = 0; st == NSTF_OK && L < NSTF_GPU_N_LEVELS; L++) {
        st = nstf_llama_gpu_set_level(g, L);
        if (st == NSTF_OK) st = time_fwd(g, toks, PP, 0, reps, &pf[L]);
        pk[L] = nstf_llama_gpu_kernels(g);
        if (st == NSTF_OK) st = time_fwd(g, toks, 1, PP, reps * 4, &dc[L]);
        dk[L] = nstf_llama_gpu_kernels(g);
        if (L == 3) nodes = nstf_llama_gpu_graph_nodes(g);
        if (st == NSTF_OK) st = prof_fwd(g, toks, PP, 0, pcat[L]);
        if (st == NSTF_OK) st = prof_fwd(g, toks, 1, PP, dcat[L]);
        for (int b = 0; st == NSTF_OK && b < 3; b++) st = time_fwd(g, toks, batches[b], 0, reps, &sweep[L][b]);
        for (int d = 0; st == NSTF_OK && d < 3; d++) st = time_fwd(g, toks, 1, depths[d], reps * 4, &sweep[L][3 + d]);
        nstf_llama_gpu_mem(g, &mem[L]);
        fprintf(stderr, "nstf: levels: L%d done\n", L);
    }
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf: bench --levels: %s\n", nstf_last_error());
        free(toks);
        nstf_session_close(s);
        return 1;
    }
    static const char *lname[] = {"L0 baseline", "L1 fused", "L2 tiled", "L3 ultra"};
    printf("\n### %s — %s (bf16 KV cache, context %d, median of %d; decode median of %d)\n\n", model, s->device,
           sp.n_ctx, reps, reps * 4);
    printf("Forward time split (ms) from a profiling pass with events around every op; `total` is the timed\n"
           "forward without per-op events. Prefill = %d tokens from position 0; decode = 1 token at depth %d.\n\n",
           PP, PP);
    printf("| level | phase | total ms | speed-up vs L0 | attention | feed-forward | normalization | residual | other "
           "| kernels / forward |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int ph = 0; ph < 2; ph++)
        for (int L = 0; L < NSTF_GPU_N_LEVELS; L++) {
            const double *c = ph ? dcat[L] : pcat[L];
            double t = ph ? dc[L] : pf[L], t0 = ph ? dc[0] : pf[0];
            char kern[48];
            if (ph && L == 3) snprintf(kern, sizeof kern, "1 graph (%lld nodes)", (long long)nodes);
            else snprintf(kern, sizeof kern, "%lld", (long long)(ph ? dk[L] : pk[L]));
            printf("| %s | %s | %.3f | %.2fx | %.3f | %.3f | %.3f | %.3f | %.3f | %s |\n", lname[L],
                   ph ? "decode" : "prefill", t, t0 / t, c[NSTF_GPU_CAT_ATTN], c[NSTF_GPU_CAT_FFN],
                   c[NSTF_GPU_CAT_NORM], c[NSTF_GPU_CAT_RESID], c[NSTF_GPU_CAT_OTHER], kern);
        }
    printf("\nPeak device memory by kind (MiB):\n\n| level | weights | KV cache | activations | workspace | total "
           "|\n|---|---:|---:|---:|---:|---:|\n");
    for (int L = 0; L < NSTF_GPU_N_LEVELS; L++)
        printf("| %s | %.1f | %.1f | %.1f | %.1f | %.1f |\n", lname[L], MIB(mem[L].weights), MIB(mem[L].kv_cache),
               MIB(mem[L].activations), MIB(mem[L].workspace),
               MIB(mem[L].weights + mem[L].kv_cache + mem[L].activations + mem[L].workspace));
    printf("\nSweep: ms per forward (speed-up over L0). Prefill of B tokens from position 0; decode of 1 token at "
           "context depth D.\n\n| level | B=1 | B=8 | B=32 | D=128 | D=1024 | D=8192 |\n|---|---:|---:|---:|---:|---:|---:|\n");
    for (int L = 0; L < NSTF_GPU_N_LEVELS; L++) {
        printf("| %s |", lname[L]);
        for (int i = 0; i < 6; i++) printf(" %.3f (%.2fx) |", sweep[L][i], sweep[0][i] / sweep[L][i]);
        printf("\n");
    }
    printf("\nWorkspace = dequantization buffer + argmax/flash-decode scratch, plus for L0/L1 the fp32 score "
           "matrix [n_heads, %d, %d].\n", PP, sp.n_ctx);
    free(toks);
    nstf_session_close(s);
    return 0;
}

/* ---- profile ----------------------------------------------------------------- */

static nstf_status measure_roofline(nstf_roofline *rl, const char *name) {
    memset(rl, 0, sizeof *rl);
    snprintf(rl->cpu, sizeof rl->cpu, "%.127s", name);
    const size_t bytes = (size_t)1 << 30;
    const int64_t n = 8192;
    void *a = NULL, *b = NULL, *c = NULL, *ev0 = NULL, *ev1 = NULL;
    nstf_status st = nstf_gpu_malloc(&a, bytes);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&b, bytes);
    if (st == NSTF_OK) st = nstf_gpu_malloc(&c, (size_t)(n * n * 4));
    if (st == NSTF_OK) st = nstf_gpu_event_create(&ev0);
    if (st == NSTF_OK) st = nstf_gpu_event_create(&ev1);
    if (st == NSTF_OK) st = nstf_gpu_memset(a, 0, bytes, NULL);
    if (st == NSTF_OK) st = nstf_gpu_memset(b, 0, bytes, NULL);
    double best_cp = 1e30, best_mm = 1e30;
    for (int r = 0; st == NSTF_OK && r < 6; r++) {
        float ms = 0;
        st = nstf_gpu_event_record(ev0, NULL);
        if (st == NSTF_OK) st = nstf_gpu_memcpy_d2d(b, a, bytes, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev1, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(ev0, ev1, &ms);
        if (r > 0 && ms < best_cp) best_cp = ms;
        /* GEMM n x n x n on the bf16 matrix units (operands: the zeroed buffers) */
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev0, NULL);
        if (st == NSTF_OK)
            st = nstf_gpu_gemm_bf16(a, b, c, NSTF_TYPE_F32, NULL, NSTF_TYPE_F32, n, n, n, NSTF_GEMM_EPI_NONE, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_record(ev1, NULL);
        if (st == NSTF_OK) st = nstf_gpu_event_ms(ev0, ev1, &ms);
        if (r > 0 && ms < best_mm) best_mm = ms;
    }
    nstf_gpu_event_destroy(ev0);
    nstf_gpu_event_destroy(ev1);
    (void)nstf_gpu_free(a);
    (void)nstf_gpu_free(b);
    (void)nstf_gpu_free(c);
    if (st != NSTF_OK) return st;
    rl->mem_gbs = 2.0 * (double)bytes / (best_cp * 1e-3) / 1e9; /* read + write */
    rl->fp32_gflops = 2.0 * (double)n * n * n / (best_mm * 1e-3) / 1e9;
    rl->int8_gops = rl->fp32_gflops;
    rl->n_threads = 0;
    return NSTF_OK;
}

typedef struct site {
    const char *label;
    int64_t calls;
    double ms, flops, bytes;
} site;

static int cmp_site(const void *a, const void *b) {
    const site *x = a, *y = b;
    return x->ms < y->ms ? 1 : x->ms > y->ms ? -1 : 0;
}

static void add_ops(site *sites, int *n_sites, const nstf_gpu_op *ops, int nr, nstf_trace *tr, double *t_off_ms) {
    double end = 0;
    for (int i = 0; i < nr; i++) {
        const nstf_gpu_op *o = &ops[i];
        int k = 0;
        while (k < *n_sites && strcmp(sites[k].label, o->label)) k++;
        if (k == *n_sites) {
            if (*n_sites == 64) continue;
            sites[k] = (site){o->label, 0, 0, 0, 0};
            (*n_sites)++;
        }
        sites[k].calls++;
        sites[k].ms += o->t1_ms - o->t0_ms;
        sites[k].flops += o->flops;
        sites[k].bytes += o->bytes;
        if (tr)
            (void)nstf_trace_span(tr, o->label, "gpu", (uint64_t)((*t_off_ms + o->t0_ms) * 1e6),
                                  (uint64_t)((*t_off_ms + o->t1_ms) * 1e6), o->layer, o->flops, o->bytes);
        if (o->t1_ms > end) end = o->t1_ms;
    }
    *t_off_ms += end + 0.05;
}

static void print_sites(const char *phase, site *sites, int n, double wall_ms, const nstf_roofline *rl,
                        nstf_roofline_point *pts, int *n_pts, int series) {
    qsort(sites, (size_t)n, sizeof *sites, cmp_site);
    double sum = 0;
    for (int i = 0; i < n; i++) sum += sites[i].ms;
    printf("\n%s: forward %.3f ms (events, unprofiled); kernels account for %.3f ms (profiled)\n", phase, wall_ms, sum);
    printf("%-16s %6s %10s %9s %9s %9s %8s %8s %7s %6s %-7s\n", "op", "calls", "total ms", "mean us", "GFLOP", "MB",
           "TFLOP/s", "GB/s", "FLOP/B", "roof%", "bound");
    for (int i = 0; i < n; i++) {
        const site *s = &sites[i];
        double secs = s->ms * 1e-3, tf = secs > 0 ? s->flops / secs / 1e12 : 0, gb = secs > 0 ? s->bytes / secs / 1e9 : 0;
        double ai = s->bytes > 0 ? s->flops / s->bytes : 0;
        double att = nstf_roofline_attainable(rl, ai, false);
        bool mem_bound = ai < nstf_roofline_ridge(rl, false);
        double roof = mem_bound ? (rl->mem_gbs > 0 ? 100.0 * gb / rl->mem_gbs : 0) : (att > 0 ? 100.0 * tf * 1e3 / att : 0);
        printf("%-16s %6lld %10.3f %9.2f %9.3f %9.2f %8.2f %8.1f %7.2f %6.1f %-7s\n", s->label, (long long)s->calls,
               s->ms, 1e3 * s->ms / (double)s->calls, s->flops / 1e9, s->bytes / 1e6, tf, gb, ai, roof,
               mem_bound ? "memory" : "compute");
        if (*n_pts < 128 && s->flops > 0) pts[(*n_pts)++] = (nstf_roofline_point){s->label, ai, tf * 1e3, series};
    }
}

int nstf_gpu_profile(nstf_session *s, int n_prompt, int n_gen, const char *trace_path, const char *svg_path,
                     const char *cache, bool remeasure) {
    nstf_llama_gpu *g = s->gpu;
    nstf_gpu_info info;
    nstf_roofline rl;
    if (nstf_gpu_query(0, &info) != NSTF_OK) goto fail0;
    if (remeasure || nstf_roofline_load(cache, info.name, 0, &rl) != NSTF_OK) {
        fprintf(stderr, "nstf: measuring GPU roofline (device copy bandwidth, bf16 GEMM 8192^3)...\n");
        if (measure_roofline(&rl, info.name) != NSTF_OK) goto fail0;
        if (nstf_roofline_save(cache, &rl) != NSTF_OK) fprintf(stderr, "nstf: warning: %s\n", nstf_last_error());
    }
    printf("roofline (%s): copy %.1f GB/s, bf16 GEMM %.1f TFLOP/s (ridge %.1f FLOP/B); level L%d; NVTX %s\n", rl.cpu,
           rl.mem_gbs, rl.fp32_gflops / 1e3, nstf_roofline_ridge(&rl, false), nstf_llama_gpu_level(g),
           nstf_gpu_have_ranges() ? "on" : "unavailable");
    nstf_trace *tr = NULL;
    if (trace_path && nstf_trace_create(&tr) != NSTF_OK) goto fail0;
    /* GPU spans are placed on the trace's clock from the moment it was made */
    double off = (double)nstf_now_ns() * 1e-6;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prompt > 1 ? n_prompt : 2));
    site *sp = calloc(64, sizeof *sp), *sd = calloc(64, sizeof *sd);
    nstf_roofline_point *pts = calloc(128, sizeof *pts);
    int nsp = 0, nsd = 0, n_pts = 0, rc = 0, nr = 0;
    double wall_p = 0, wall_d = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    if (!toks || !sp || !sd || !pts) rc = 1;
    if (rc == 0) rand_toks(toks, n_prompt > 1 ? n_prompt : 2, s->model->cfg.n_vocab, &rng);
    /* unprofiled timings (and warm-up) */
    if (rc == 0 && n_prompt > 1 && time_fwd(g, toks, n_prompt, 0, 5, &wall_p) != NSTF_OK) rc = 1;
    if (rc == 0 && n_gen > 0 && time_fwd(g, toks, 1, n_prompt, 9, &wall_d) != NSTF_OK) rc = 1;
    if (rc == 0 && nstf_llama_gpu_set_prof(g, true, 0) != NSTF_OK) rc = 1;
    if (rc == 0 && n_prompt > 1) {
        if (nstf_llama_gpu_forward(g, toks, n_prompt, 0, false, NULL, NULL) != NSTF_OK) rc = 1;
        const nstf_gpu_op *ops = nstf_llama_gpu_prof_ops(g, &nr, NULL);
        if (rc == 0) add_ops(sp, &nsp, ops, nr, tr, &off);
    }
    for (int i = 0; rc == 0 && i < n_gen; i++) {
        if (nstf_llama_gpu_forward(g, toks + (i % 2), 1, n_prompt + i, false, NULL, NULL) != NSTF_OK) rc = 1;
        const nstf_gpu_op *ops = nstf_llama_gpu_prof_ops(g, &nr, NULL);
        if (rc == 0) add_ops(sd, &nsd, ops, nr, tr, &off);
    }
    (void)nstf_llama_gpu_set_prof(g, false, 0);
    if (rc == 0) {
        if (nsp) print_sites("prefill", sp, nsp, wall_p, &rl, pts, &n_pts, 0);
        if (nsd) print_sites("decode", sd, nsd, wall_d, &rl, pts, &n_pts, 1);
        if (tr && nstf_trace_save(tr, trace_path) != NSTF_OK) rc = 1;
        static const char *const names[2] = {"prefill", "decode"};
        if (rc == 0 && svg_path && nstf_roofline_svg(svg_path, &rl, pts, n_pts, names) != NSTF_OK) rc = 1;
        if (rc == 0 && tr) printf("trace: %s (%lld GPU op spans)\n", trace_path, (long long)nstf_trace_n_spans(tr));
        if (rc == 0 && svg_path) printf("roofline: %s\n", svg_path);
    }
    if (rc) fprintf(stderr, "nstf: profile: %s\n", nstf_last_error());
    nstf_trace_free(tr);
    free(toks);
    free(sp);
    free(sd);
    free(pts);
    return rc;
fail0:
    fprintf(stderr, "nstf: profile: %s\n", nstf_last_error());
    return 1;
}

#else

int nstf_gpu_levels_matrix(const char *model, int reps) {
    (void)model, (void)reps;
    fprintf(stderr, "nstf: bench --levels: this build has no GPU backend\n");
    return 1;
}

int nstf_gpu_profile(nstf_session *s, int n_prompt, int n_gen, const char *trace_path, const char *svg_path,
                     const char *cache, bool remeasure) {
    (void)s, (void)n_prompt, (void)n_gen, (void)trace_path, (void)svg_path, (void)cache, (void)remeasure;
    fprintf(stderr, "nstf: profile: this build has no GPU backend\n");
    return 1;
}

#endif
