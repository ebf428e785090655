/* cmd_profile.c — `nstf profile`: run a prompt and a few decode steps with
 * the per-op profiler attached; print per-op time, FLOPs, bytes, achieved
 * rates and their place under the measured roofline; optionally write a
 * Chrome/Perfetto trace and a roofline SVG. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "nstf.h"
#include "nstf_tools.h"
#include "prof/bench.h"
#include "prof/memory.h"
#include "prof/profiler.h"
#include "prof/report.h"
#include "prof/roofline.h"
#include "prof/trace.h"

int cmd_profile(int argc, char **argv);

static void profile_usage(FILE *f) {
    fprintf(f,
            "usage: nstf profile -m MODEL [options]\n"
            "\n"
            "  -m, --model FILE          GGUF model\n"
            "  -p, --n-prompt N          prompt tokens profiled as one prefill (default 128; 0 = none)\n"
            "  -n, --n-gen N             decode steps profiled after the prompt (default 32; 0 = none)\n"
            "  -b, --batch-size N        prompt tokens per forward pass (default 512)\n"
            "  -t, --threads N           CPU threads (default: the physical cores)\n"
            "      --device DEV          cpu, gpu or auto (default auto); gpu: per-kernel times from events\n"
            "      --trace FILE          write a Chrome/Perfetto trace (JSON) of every op call\n"
            "      --svg FILE            write the roofline chart with one dot per op\n"
            "      --roofline-cache FILE where measured ceilings are kept (default ~/.cache/nstf/roofline.json)\n"
            "      --remeasure           measure the ceilings even if cached\n"
            "  -v, --verbose             memory table at load\n"
            "  -h, --help                this text\n"
            "\n"
            "Bytes are each op's compulsory traffic (inputs read once, outputs written once);\n"
            "roof%% is the achieved rate over the roofline's attainable rate at the op's intensity,\n"
            "against the int8 ceiling for quantized matmuls and the fp32 one otherwise.\n");
}

/* One row per op site: time, work, achieved rates and the place under the
 * roofline (int8 ceiling for int8 matmuls). GPU rates in TFLOP/s. */
static void print_table(const char *phase, int n_tok, double wall_ms, nstf_prof *p, const nstf_roofline *rl, bool gpu,
                        nstf_roofline_point *pts, int *n_pts, int series) {
    const uint64_t sum_ns = nstf_prof_sort_sites(p);
    printf("\n%s: %d tokens in %.3f ms (%.2f t/s, unprofiled); ops account for %.3f ms (profiled)\n", phase, n_tok,
           wall_ms, wall_ms > 0 ? n_tok / (wall_ms * 1e-3) : 0.0, (double)sum_ns * 1e-6);
    const double unit = gpu ? 1e12 : 1e9;
    printf("%-20s %7s %10s %10s %9s %9s %9s %8s %8s %6s %-7s\n", "op", "calls", "total ms", "mean us", "GFLOP", "MB",
           gpu ? "TFLOP/s" : "GFLOP/s", "GB/s", "FLOP/B", "roof%", "bound");
    for (int i = 0; i < p->n_sites; i++) {
        const nstf_prof_site *s = &p->sites[i];
        double secs = (double)s->total_ns * 1e-9;
        double fs = secs > 0 ? s->flops / secs : 0, gbs = secs > 0 ? s->bytes / secs / 1e9 : 0;
        double ai = s->bytes > 0 ? s->flops / s->bytes : 0;
        double att = nstf_roofline_attainable(rl, ai, s->int8);
        bool mem_bound = ai < nstf_roofline_ridge(rl, s->int8);
        printf("%-20s %7lld %10.3f %10.2f %9.4f %9.2f %9.2f %8.2f %8.2f %6.1f %-7s\n", s->label,
               (long long)s->calls, secs * 1e3, secs * 1e6 / (double)s->calls, s->flops / 1e9, s->bytes / 1e6,
               fs / unit, gbs, ai, att > 0 ? 100.0 * fs / 1e9 / att : 0.0, mem_bound ? "memory" : "compute");
        if (*n_pts < 2 * NSTF_PROF_MAX_SITES && s->flops > 0)
            pts[(*n_pts)++] = (nstf_roofline_point){s->label, ai, fs / 1e9, series};
    }
    if (p->dropped) printf("(%lld calls at further op sites were not counted)\n", (long long)p->dropped);
}

/* Median ms of `reps` forwards of n tokens at pos0, unprofiled, on the
 * backend's timer (after one untimed run). */
static nstf_status time_fwd(nstf_session *s, const int32_t *toks, int n, int pos0, int reps, double *ms) {
    nstf_timer t = nstf_bench_timer(s);
    uint64_t ns[16];
    if (reps > 16) reps = 16;
    for (int r = -1; r < reps; r++) {
        uint64_t e = 0;
        NSTF_TRY(nstf_timer_start(&t));
        NSTF_TRY(nstf_session_forward(s, toks, n, pos0, false, NULL, NULL));
        NSTF_TRY(nstf_timer_stop(&t, &e));
        if (r >= 0) ns[r] = e;
    }
    for (int i = 1; i < reps; i++) /* insertion sort: a handful of samples */
        for (int j = i; j > 0 && ns[j] < ns[j - 1]; j--) {
            uint64_t x = ns[j];
            ns[j] = ns[j - 1];
            ns[j - 1] = x;
        }
    *ms = (double)ns[reps / 2] * 1e-6;
    return NSTF_OK;
}

int cmd_profile(int argc, char **argv) {
    const char *model = NULL, *trace_path = NULL, *svg_path = NULL, *cache = NULL, *device = "auto";
    int n_prompt = 128, n_gen = 32, n_batch = 512, n_threads = 0;
    bool verbose = false, remeasure = false;
    cli_expand_args(&argc, &argv, profile_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            profile_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL();
            model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            VAL();
            if (!cli_parse_int(a, v, 0, 1 << 20, &n_prompt)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            VAL();
            if (!cli_parse_int(a, v, 0, 1 << 20, &n_gen)) return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            VAL();
            if (!cli_parse_int(a, v, 1, 1 << 16, &n_batch)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (!cli_parse_int(a, v, 1, 1024, &n_threads)) return 2;
        } else if (!strcmp(a, "--device")) {
            VAL();
            device = v;
        } else if (!strcmp(a, "--trace")) {
            VAL();
            trace_path = v;
        } else if (!strcmp(a, "--svg")) {
            VAL();
            svg_path = v;
        } else if (!strcmp(a, "--roofline-cache")) {
            VAL();
            cache = v;
        } else if (!strcmp(a, "--remeasure")) {
            remeasure = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else {
            return cli_unknown_option(a, profile_usage);
        }
#undef VAL
    }
    if (!model) {
        cli_err("no model given (-m MODEL)");
        return 2;
    }
    if (n_prompt == 0 && n_gen == 0) {
        cli_err("nothing to run (-p 0 and -n 0)");
        return 2;
    }
    nstf_session_params sp = nstf_session_default_params();
    sp.n_ctx = n_prompt + n_gen + 2;
    sp.n_batch = n_batch;
    sp.n_threads = n_threads;
    sp.device = device;
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    nstf_weights_touch(s, stderr, true);
    if (verbose) nstf_mem_report_print_session(stderr, s);

    /* ceilings: from the cache, or measured now (and cached) */
    char cache_buf[1024];
    if (!cache) {
        nstf_roofline_default_cache(cache_buf, sizeof cache_buf);
        cache = cache_buf;
    }
    const bool gpu = nstf_session_on_gpu(s);
    nstf_roofline rl;
    if (nstf_roofline_for_session(s, cache, remeasure, stderr, &rl) != NSTF_OK) {
        cli_err("%s", nstf_last_error());
        nstf_session_close(s);
        return 1;
    }
    if (gpu)
        printf("roofline (%s): copy %.1f GB/s, bf16 GEMM %.1f TFLOP/s (ridge %.1f FLOP/B); level L%d\n", rl.cpu,
               rl.mem_gbs, rl.fp32_gflops / 1e3, nstf_roofline_ridge(&rl, false),
               nstf_session_get_opt(s, NSTF_SESSION_LEVEL));
    else
        printf("roofline (%s, %d threads): memory %.2f GB/s, fp32 %.2f GFLOP/s (ridge %.2f FLOP/B), "
               "int8 %.2f GOP/s (ridge %.2f FLOP/B)\n",
               rl.cpu, rl.n_threads, rl.mem_gbs, rl.fp32_gflops, nstf_roofline_ridge(&rl, false), rl.int8_gops,
               nstf_roofline_ridge(&rl, true));

    int rc = 0;
    nstf_trace *trace = NULL;
    if (trace_path && nstf_trace_create(&trace) != NSTF_OK) {
        cli_lib_err();
        nstf_session_close(s);
        return 1;
    }
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(n_prompt > 1 ? n_prompt : 2));
    nstf_prof *prof = calloc(1, sizeof *prof);
    nstf_roofline_point *pts = calloc(2 * NSTF_PROF_MAX_SITES, sizeof *pts);
    int n_pts = 0;
    if (!toks || !prof || !pts) {
        cli_err("out of memory");
        rc = 1;
    }
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    const int nv = nstf_session_n_vocab(s);
    for (int i = 0; rc == 0 && i < (n_prompt > 1 ? n_prompt : 2); i++) {
        rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
        toks[i] = (int32_t)(rng % (uint64_t)nv);
    }
    /* unprofiled times (and warm-up: every code path runs once) */
    double wall_p = 0, wall_d = 0;
    if (rc == 0 && n_prompt > 0 && time_fwd(s, toks, n_prompt, 0, 5, &wall_p) != NSTF_OK) rc = 1;
    if (rc == 0 && n_gen > 0 && time_fwd(s, toks, 1, n_prompt, 9, &wall_d) != NSTF_OK) rc = 1;
    if (rc == 0) {
        prof->trace = trace;
        if (nstf_prof_attach(prof, s, 0) != NSTF_OK) rc = 1;
    }
    if (rc == 0 && n_prompt > 0) {
        uint64_t t0 = nstf_now_ns();
        if (nstf_session_prefill(s, toks, n_prompt, 0) != NSTF_OK || nstf_prof_collect(prof) != NSTF_OK) rc = 1;
        if (rc == 0) {
            if (trace) (void)nstf_trace_span(trace, "prefill", "phase", t0, nstf_now_ns(), -1, 0, 0);
            char phase[64];
            snprintf(phase, sizeof phase, "prefill (pp%d)", n_prompt);
            print_table(phase, n_prompt, wall_p, prof, &rl, gpu, pts, &n_pts, 0);
        }
    }
    if (rc == 0 && n_gen > 0) {
        nstf_prof_reset(prof);
        int32_t tok = toks[0];
        for (int i = 0; rc == 0 && i < n_gen; i++) {
            uint64_t a = nstf_now_ns();
            if (nstf_session_forward(s, &tok, 1, n_prompt + i, false, NULL, &tok) != NSTF_OK ||
                nstf_prof_collect(prof) != NSTF_OK)
                rc = 1;
            if (trace) (void)nstf_trace_span(trace, "decode", "phase", a, nstf_now_ns(), -1, 0, 0);
        }
        if (rc == 0) {
            char phase[64];
            snprintf(phase, sizeof phase, "decode (tg%d)", n_gen);
            print_table(phase, n_gen, wall_d * n_gen, prof, &rl, gpu, pts, &n_pts, 1);
        }
    }
    nstf_prof_detach(prof);
    if (rc == 1 && toks && prof && pts) cli_lib_err();
    if (rc == 0 && trace) {
        if (nstf_trace_save(trace, trace_path) != NSTF_OK) {
            cli_lib_err();
            rc = 1;
        } else {
            cli_err("trace of %lld spans written to %s", (long long)nstf_trace_n_spans(trace),
                    trace_path);
        }
    }
    if (rc == 0 && svg_path) {
        const char *names[2] = {n_prompt > 0 ? "prefill" : NULL, n_gen > 0 ? "decode" : NULL};
        if (nstf_roofline_svg(svg_path, &rl, pts, n_pts, names) != NSTF_OK) {
            cli_lib_err();
            rc = 1;
        } else {
            cli_err("roofline chart written to %s", svg_path);
        }
    }
    nstf_mem_report_print_session(stderr, s);
    fflush(stdout);
    nstf_trace_free(trace);
    free(toks);
    free(prof);
    free(pts);
    nstf_session_close(s);
    return rc;
}
