/* cmd_bench.c — `nstf bench`: llama-bench compatible prompt-processing and
 * generation throughput (pp512 / tg128), markdown / CSV / JSON / JSONL
 * output with llama-bench's field names, and a regression check against a
 * saved run. The reusable parts live in src/prof/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "dist/proc.h"
#include "levels.h"
#include "nstf.h"
#include "nstf_tools.h"
#include "prof/bench.h"
#include "prof/memory.h"
#include "prof/regress.h"
#include "prof/report.h"
#include "prof/stats.h"

int cmd_bench(int argc, char **argv);

static void bench_usage(FILE *f) {
    fprintf(f,
            "usage: nstf bench -m MODEL [options]\n"
            "\n"
            "  -m, --model FILE[,FILE]   GGUF model(s); repeat or give a comma list\n"
            "  -p, --n-prompt N[,N]      prompt tests: process N random tokens (default 512; 0 = none)\n"
            "  -n, --n-gen N[,N]         generation tests: generate N tokens (default 128; 0 = none)\n"
            "  -d, --n-depth D[,D]       tokens already in the KV cache before each test (default 0)\n"
            "  -b, --batch-size N[,N]    prompt tokens per forward pass (default 512)\n"
            "  -t, --threads N[,N]       CPU threads (default: the physical cores)\n"
            "  -r, --repetitions N       timed runs per test (default 5)\n"
            "      --no-warmup           skip the untimed warm-up run\n"
            "      --tg-argmax           tg: bring back only the greedy token computed on the device\n"
            "                            (4 bytes) instead of the logits, as llama-bench does\n"
            "      --device DEV          cpu, gpu or auto (default auto)\n"
            "      --tp N                tensor parallel over N GPUs (or N CPU ranks with --device cpu);\n"
            "                            or one process per rank: mpirun -np N nstf bench ...\n"
            "      --gpus LIST           the GPUs of --tp, such as 0,1 (default 0..N-1)\n"
            "      --act-bits N          CPU activations of quantized matmuls: 16 (default), 8 or 32\n"
            "      --sparse-attn K[,W]   sparse decode attention in every layer (top-k blocks, window\n"
            "                            positions; as nstf run); --sparse-block N (default 16)\n"
            "      --dense-attn          dense attention even where the model file plans sparse\n"
            "  -ctk, --cache-type-k T    KV cache type: auto (the device's own: f32 on the CPU, bf16 on a\n"
            "                            GPU) or q8_0; -ctv, --cache-type-v T the same for V (K and V\n"
            "                            take the same type)\n"
            "      --decode-batch B[,B]  instead of pp/tg: one batched decode step of B sequences over a\n"
            "                            paged KV cache at depth -d (default 512), as nstf serve runs it:\n"
            "                            ms per step with every row's greedy token on the device, and with\n"
            "                            every row's logits to the host; each against the first B\n"
            "  -o, --output FMT          md, csv, json or jsonl (default md)\n"
            "      --baseline FILE       compare with a saved json/jsonl run (llama-bench's or ours)\n"
            "      --tolerance T         allowed slowdown for --baseline, e.g. 5%% (default 5%%)\n"
            "      --level L             execution level 0..4 (GPU backends, default 3; 4: the decode step as\n"
            "                            one persistent kernel where the weights allow, else as 3; the\n"
            "                            CPU has only level 0)\n"
            "      --levels              compare every execution level of the backend\n"
            "  -v, --verbose             memory table at load, progress lines\n"
            "  -h, --help                this text\n"
            "\n"
            "Results go to stdout; progress, memory lines and the baseline comparison to stderr.\n"
            "Exit status: 0 ok, 1 error, 2 bad arguments, 3 a regression beyond the tolerance.\n");
}

#define MAX_LIST 32

typedef struct {
    int v[MAX_LIST];
    int n;
} int_list;

static bool parse_list(const char *flag, const char *s, long min, long max, int_list *out) {
    out->n = 0;
    char buf[512];
    if (strlen(s) >= sizeof buf) {
        cli_err("%s list is too long", flag);
        return false;
    }
    strcpy(buf, s);
    for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
        if (out->n == MAX_LIST) {
            cli_err("%s takes at most %d values", flag, MAX_LIST);
            return false;
        }
        if (!cli_parse_int(flag, tok, min, max, &out->v[out->n])) return false;
        out->n++;
    }
    if (out->n == 0) {
        cli_err("%s needs at least one value", flag);
        return false;
    }
    return true;
}

/* --decode-batch: one table per model, a row per B (bench_batch.c). */
static int decode_batch(const char *model, const int *bs, int n_b, int depth, int reps, bool warmup,
                        const char *device, int threads) {
    int max_b = 0;
    for (int i = 0; i < n_b; i++) max_b = bs[i] > max_b ? bs[i] : max_b;
    nstf_session_params sp = nstf_session_default_params();
    sp.n_threads = threads;
    sp.device = device;
    nstf_session *s = NULL;
    if (nstf_bench_batch_open(model, &sp, max_b, depth, &s) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    nstf_weights_touch(s, stderr, true);
    uint64_t *ns = calloc((size_t)reps, sizeof *ns), rng = 0x2545f4914f6cdd1dull;
    double *ms = calloc((size_t)reps, sizeof *ms);
    if (!ns || !ms) {
        free(ns);
        free(ms);
        nstf_session_close(s);
        cli_err("out of memory");
        return 1;
    }
    printf("%s on %s, depth %d, %d steps each (median ms)\n\n", model, nstf_session_device(s), depth, reps);
    printf("| sequences | greedy ids to host | x first | all logits to host | x first |\n");
    printf("|---:|---:|---:|---:|---:|\n");
    double first[2] = {0, 0};
    int rc = 0;
    for (int i = 0; i < n_b && rc == 0; i++) {
        double med[2];
        for (int lh = 0; lh < 2 && rc == 0; lh++) {
            const nstf_bench_batch_test t = {bs[i], depth, reps, warmup, lh == 1};
            if (nstf_bench_decode_batch(s, &t, &rng, ns) != NSTF_OK) {
                cli_err("--decode-batch %d: %s", bs[i], nstf_last_error());
                rc = 1;
                break;
            }
            for (int k = 0; k < reps; k++) ms[k] = (double)ns[k] / 1e6;
            med[lh] = nstf_stats_compute(ms, reps).median;
            if (i == 0) first[lh] = med[lh];
        }
        if (rc == 0)
            printf("| %d | %.3f | %.2fx | %.3f | %.2fx |\n", bs[i], med[0], med[0] / first[0], med[1], med[1] / first[1]);
    }
    free(ns);
    free(ms);
    nstf_session_close(s);
    return rc;
}

typedef struct {
    char model[512];
    char test[64];
    char backend[16];
    int n_threads;
    double avg_ts;
} done_test;

int cmd_bench(int argc, char **argv) {
    char *models[MAX_LIST];
    int n_models = 0;
    int_list n_prompt = {{512}, 1}, n_gen = {{128}, 1}, n_depth = {{0}, 1}, n_batch = {{512}, 1}, threads = {{0}, 1},
             dec_batch = {{0}, 0};
    bool depth_set = false;
    int reps = 5, level = 0, act_bits = 0, sparse = 0, sp_topk = 0, sp_window = 0, sp_block = 0;
    bool warmup = true, verbose = false, levels = false, level_set = false, tg_argmax = false;
    const char *device = "auto", *baseline = NULL, *gpus = NULL, *ctk = NULL, *ctv = NULL;
    int n_tp = 0;
    double tolerance = 0.05;
    nstf_bench_format fmt = NSTF_BENCH_FORMAT_MD;
    threads.v[0] = nstf_cpu_physical_count();
    static char model_buf[4096];
    size_t model_used = 0;

    cli_expand_args(&argc, &argv, bench_usage);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            VAL();
            size_t len = strlen(v);
            if (model_used + len + 1 > sizeof model_buf) {
                cli_err("-m: model list is too long");
                return 2;
            }
            char *copy = model_buf + model_used;
            memcpy(copy, v, len + 1);
            model_used += len + 1;
            for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) {
                if (n_models == MAX_LIST) {
                    cli_err("-m: at most %d models", MAX_LIST);
                    return 2;
                }
                models[n_models++] = tok;
            }
        } else if (!strcmp(a, "-p") || !strcmp(a, "--n-prompt")) {
            VAL();
            if (!parse_list(a, v, 0, 1 << 20, &n_prompt)) return 2;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-gen")) {
            VAL();
            if (!parse_list(a, v, 0, 1 << 20, &n_gen)) return 2;
        } else if (!strcmp(a, "-d") || !strcmp(a, "--n-depth")) {
            VAL();
            if (!parse_list(a, v, 0, 1 << 22, &n_depth)) return 2;
            depth_set = true;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            VAL();
            if (!parse_list(a, v, 1, 1 << 16, &n_batch)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (!parse_list(a, v, 1, 1024, &threads)) return 2;
        } else if (!strcmp(a, "-r") || !strcmp(a, "--repetitions")) {
            VAL();
            if (!cli_parse_int(a, v, 1, 1000, &reps)) return 2;
        } else if (!strcmp(a, "--no-warmup")) {
            warmup = false;
        } else if (!strcmp(a, "--device")) {
            VAL();
            device = v;
        } else if (!strcmp(a, "--tp")) {
            VAL();
            if (!cli_parse_int(a, v, 1, 16, &n_tp)) return 2;
        } else if (!strcmp(a, "--gpus")) {
            VAL();
            gpus = v;
        } else if (!strcmp(a, "--act-bits")) {
            VAL();
            if (!cli_parse_act_bits(a, v, &act_bits)) return 2;
        } else if (!strcmp(a, "--sparse-attn")) {
            VAL();
            if (!cli_parse_sparse(a, v, &sp_topk, &sp_window)) return 2;
            sparse = 1;
        } else if (!strcmp(a, "--sparse-block")) {
            VAL();
            if (!cli_parse_int(a, v, 4, 64, &sp_block)) return 2;
        } else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k") || !strcmp(a, "-ctv") ||
                   !strcmp(a, "--cache-type-v")) {
            VAL();
            if (strcmp(v, "q8_0") && strcmp(v, "auto")) {
                cli_err("%s '%s': q8_0, or auto (the device's own: f32 on the CPU, bf16 on a GPU)", a, v);
                return 2;
            }
            *(a[3] == 'k' || !strcmp(a, "--cache-type-k") ? &ctk : &ctv) = v;
        } else if (!strcmp(a, "--decode-batch")) {
            VAL();
            if (!parse_list(a, v, 1, 4096, &dec_batch)) return 2;
        } else if (!strcmp(a, "--dense-attn")) {
            sparse = -1;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            VAL();
            if (!nstf_bench_format_parse(v, &fmt)) {
                cli_err("-o '%s': use md, csv, json or jsonl", v);
                return 2;
            }
        } else if (!strcmp(a, "--baseline")) {
            VAL();
            baseline = v;
        } else if (!strcmp(a, "--tolerance")) {
            VAL();
            if (!nstf_parse_tolerance(v, &tolerance)) {
                cli_err("--tolerance '%s': give a percentage such as 5%%", v);
                return 2;
            }
        } else if (!strcmp(a, "--level")) {
            VAL();
            if (!cli_parse_int(a, v, 0, 4, &level)) return 2;
            level_set = true;
        } else if (!strcmp(a, "--levels")) {
            levels = true;
        } else if (!strcmp(a, "--tg-argmax")) {
            tg_argmax = true;
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else {
            return cli_unknown_option(a, bench_usage);
        }
#undef VAL
    }
    if (n_models == 0) {
        cli_err("no model given (-m MODEL)");
        return 2;
    }
    /* under mpirun: one tensor-parallel rank per process, rank 0 prints */
    if (nstf_proc_launched() && (dec_batch.n > 0 || levels)) {
        cli_err("under mpirun, bench measures the tensor-parallel run only (no --decode-batch or --levels)");
        return 2;
    }
    {
        const int lrc = cli_launch_tp(&n_tp, NULL);
        if (lrc >= 0) return lrc;
    }
    if (dec_batch.n > 0) {
        int rc = 0;
        for (int mi = 0; mi < n_models && rc == 0; mi++)
            rc = decode_batch(models[mi], dec_batch.v, dec_batch.n, depth_set ? n_depth.v[0] : 512, reps, warmup,
                              device, threads.v[0]);
        return rc;
    }
    if (levels && strcmp(device, "gpu") == 0) { /* the GPU level matrix, one model after another */
        int rc = 0;
        for (int mi = 0; mi < n_models && rc == 0; mi++) rc = nstf_levels_matrix(models[mi], reps);
        return rc;
    }
    nstf_baseline base = {0};
    if (baseline && nstf_baseline_load(baseline, &base) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    int max_p = 0, max_n = 0, max_d = 0, max_reps = reps;
    for (int i = 0; i < n_prompt.n; i++) max_p = n_prompt.v[i] > max_p ? n_prompt.v[i] : max_p;
    for (int i = 0; i < n_gen.n; i++) max_n = n_gen.v[i] > max_n ? n_gen.v[i] : max_n;
    for (int i = 0; i < n_depth.n; i++) max_d = n_depth.v[i] > max_d ? n_depth.v[i] : max_d;
    int n_ctx = max_d + (max_p > max_n ? max_p : max_n);
    if (n_ctx < 1) n_ctx = 1;

    char cpu_info[256];
    nstf_cpu_info(cpu_info, sizeof cpu_info);
    uint64_t *samples = calloc((size_t)max_reps, sizeof *samples);
    done_test *done = NULL;
    int n_done = 0;
    if (!samples) {
        cli_err("out of memory");
        return 1;
    }
    uint64_t rng = 0x2545f4914f6cdd1dull;
    int rc = 0;
    nstf_bench_write_header(stdout, fmt);
    bool first = true;
    for (int mi = 0; mi < n_models && rc == 0; mi++) {
        for (int ti = 0; ti < threads.n && rc == 0; ti++) {
            for (int bi = 0; bi < n_batch.n && rc == 0; bi++) {
                nstf_session_params sp = nstf_session_default_params();
                sp.n_ctx = n_ctx;
                sp.n_batch = n_batch.v[bi];
                sp.n_threads = threads.v[ti];
                sp.device = device;
                sp.n_tp = n_tp;
                sp.gpus = gpus;
                sp.cpu_act_bits = act_bits;
                sp.sparse_attn = sparse;
                if (sp_topk) sp.sparse_topk = sp_topk;
                if (sp_window) sp.sparse_window = sp_window;
                if (sp_block) sp.sparse_block = sp_block;
                sp.cache_type_k = ctk;
                sp.cache_type_v = ctv;
                nstf_session *s = NULL;
                if (nstf_session_open(models[mi], &sp, &s) != NSTF_OK) {
                    cli_lib_err();
                    rc = 1;
                    break;
                }
                if (ti == 0 && bi == 0) nstf_weights_touch(s, stderr, true);
                if (sparse == 1 && ti == 0 && bi == 0)
                    fprintf(stderr, "nstf bench: sparse decode attention in every layer (top-k %d blocks of %d, window %d)\n",
                            sp.sparse_topk ? sp.sparse_topk : 16, sp.sparse_block ? sp.sparse_block : 16,
                            sp.sparse_window ? sp.sparse_window : 64);
                if (verbose) nstf_mem_report_print_session(stderr, s);
                if (levels && mi == 0 && ti == 0 && bi == 0 && nstf_bench_n_levels(s) == 1)
                    fprintf(stderr, "nstf: bench --levels: the %s backend has only one execution level (L0); "
                                    "levels L1-L4 are GPU execution strategies\n", nstf_bench_backend(s));
                if (level_set && nstf_bench_set_level(s, level) != NSTF_OK) {
                    cli_lib_err();
                    nstf_session_close(s);
                    rc = 1;
                    break;
                }
                if (!level_set) level = nstf_session_get_opt(s, NSTF_SESSION_LEVEL); /* the backend's default */
                nstf_bench_model_info info;
                nstf_bench_model_info_get(s, &info);
                nstf_bench_backend_info bi_info;
                nstf_bench_backend_info_get(s, &bi_info);
                for (int di = 0; di < n_depth.n && rc == 0; di++) {
                    for (int k = 0; k < n_prompt.n + n_gen.n && rc == 0; k++) {
                        nstf_bench_test t = {0, 0, n_depth.v[di], reps, warmup, tg_argmax};
                        if (k < n_prompt.n) t.n_prompt = n_prompt.v[k];
                        else t.n_gen = n_gen.v[k - n_prompt.n];
                        if (t.n_prompt == 0 && t.n_gen == 0) continue;
                        char name[64];
                        nstf_bench_test_name(t.n_prompt, t.n_gen, t.n_depth, name, sizeof name);
                        if (verbose) cli_err("%s: %s, %d threads", models[mi], name, threads.v[ti]);
                        if (nstf_bench_run(s, &t, &rng, samples) != NSTF_OK) {
                            cli_err("%s: %s", name, nstf_last_error());
                            rc = 1;
                            break;
                        }
                        nstf_bench_result r = {
                            .build_commit = nstf_build_commit(), .build_number = nstf_build_number(),
                            .cpu_info = cpu_info, .gpu_info = nstf_session_on_gpu(s) ? nstf_session_device(s) : "", .backends = nstf_bench_backend(s),
                            .model_filename = models[mi], .model_type = info.model_type,
                            .model_size = info.size, .model_n_params = info.n_params,
                            .n_batch = n_batch.v[bi], .n_ubatch = n_batch.v[bi], .n_threads = threads.v[ti],
                            .type_k = bi_info.type_k, .type_v = bi_info.type_v,
                            .n_gpu_layers = bi_info.n_gpu_layers, .flash_attn = bi_info.flash_attn,
                            .use_mmap = true, .embeddings = false, .devices = device,
                            .n_prompt = t.n_prompt, .n_gen = t.n_gen, .n_depth = t.n_depth, .level = level,
                            .samples_ns = samples, .n_samples = reps};
                        nstf_bench_result_stamp(&r);
                        nstf_bench_write_result(stdout, fmt, &r, first);
                        first = false;
                        nstf_stats ts;
                        nstf_bench_result_stats(&r, NULL, &ts);
                        done_test *nd = realloc(done, (size_t)(n_done + 1) * sizeof *nd);
                        if (!nd) {
                            cli_err("out of memory");
                            rc = 1;
                            break;
                        }
                        done = nd;
                        snprintf(done[n_done].model, sizeof done[n_done].model, "%s", models[mi]);
                        snprintf(done[n_done].test, sizeof done[n_done].test, "%s", name);
                        snprintf(done[n_done].backend, sizeof done[n_done].backend, "%s", r.backends);
                        done[n_done].n_threads = threads.v[ti];
                        done[n_done].avg_ts = ts.mean;
                        n_done++;
                    }
                }
                if (ti == threads.n - 1 && bi == n_batch.n - 1 && (!nstf_proc_active() || nstf_proc_rank() == 0)) {
                    /* memory at exit of this model (a launch's rank 0's) */
                    nstf_mem_report_print_session(stderr, s);
                }
                nstf_session_close(s);
            }
        }
    }
    nstf_bench_write_footer(stdout, fmt, nstf_build_commit(), nstf_build_number());
    if (rc == 0 && baseline) {
        int n_reg = 0;
        for (int i = 0; i < n_done; i++) {
            char msg[512];
            nstf_compare c = nstf_baseline_compare(&base, done[i].model, done[i].test, done[i].backend,
                                                   done[i].n_threads, done[i].avg_ts, tolerance, msg, sizeof msg);
            static const char *tag[] = {"ok", "improved", "REGRESSION", "new"};
            fprintf(stderr, "baseline: %s: %s\n", tag[c], msg);
            n_reg += c == NSTF_COMPARE_REGRESSED;
        }
        if (n_reg) {
            cli_err("%d test%s slower than the baseline beyond %g%%", n_reg,
                    n_reg > 1 ? "s" : "", 100.0 * tolerance);
            rc = 3;
        }
    }
    nstf_baseline_free(&base);
    free(done);
    free(samples);
    return cli_launch_end(rc);
}
