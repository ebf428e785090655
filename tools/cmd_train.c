/* cmd_train.c — `nstf train`: train a model from a GGUF base (full
 * fine-tune or LoRA) or from scratch at a named shape, on the CPU or a
 * GPU (include/nstf_train.h). On a terminal a progress bar on stderr
 * (step, loss, tokens/s, ETA: cli_util's); elsewhere a line every
 * --print-every steps (step, loss, learning rate, gradient norm, tokens/s,
 * MFU on a GPU, ETA); a JSON object per step with --log, atomic
 * checkpoints with --ckpt-dir, --resume, evaluation, the memory plan
 * (--plan), and the trained model exported as a GGUF (--out) or, with
 * LoRA, the adapters too (--lora-out). --profile times every op of one
 * step (the second) with the backend's marks and prints the table. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli_util.h"
#include "dist/proc.h"
#include "gen_model.h"
#include "nstf_train.h"
#include "prof/profiler.h"

int cmd_train(int argc, char **argv);

static void usage(void) {
    printf("usage: nstf train (-m BASE.gguf | --shape NAME) --data FILE [options]\n"
           "  -m FILE           base model (GGUF or HF folder) to fine-tune\n"
           "  --shape NAME      train from scratch: tiny, smollm2-135m, llama32-1b, llama3-8b\n"
           "                    (random N(0, 0.02) weights in bf16, norms 1, a byte-level tokenizer)\n"
           "  --data FILE       token shard, folder of *.tok shards (nstf tokenize), or a text file\n"
           "  --steps N         optimizer steps (default 100)\n"
           "  --batch B         sequences per micro-batch (default 4)\n"
           "  --seq T           tokens per sequence (default 256)\n"
           "  --accum K         micro-batches per step: gradient accumulation (default 1)\n"
           "  --lr LR           peak learning rate (default 3e-4); --min-lr (default lr/10)\n"
           "  --warmup N        linear warm-up steps, then cosine decay (default steps/20)\n"
           "  --wd X, --clip X  weight decay (0.1), global-norm clipping (1; 0 off)\n"
           "  --lora R          train rank-R adapters on a frozen base (--lora-targets q,k,v,o,gate,up,down)\n"
           "  --device D        cpu, gpu or auto (default)   -t N  CPU threads\n"
           "  --dp N            data parallel over N ranks (GPUs 0..N-1, or N CPU ranks sharing -t): each\n"
           "                    trains on its --batch x --accum sequences of a step, the gradients are\n"
           "                    summed over the ranks before the update (default 1); --dp-timeout MS:\n"
           "                    a rank that makes no progress this long fails the run (default 30000).\n"
           "                    Or one process per rank: mpirun -np N nstf train ... (GPU: each\n"
           "                    process takes its place on its machine; rank 0 prints, logs and writes)\n"
           "  --zero 0|1        with --dp > 1, 1 is ZeRO-1: the AdamW moments cut into one slot per rank\n"
           "                    (gradients reduce-scattered, each rank updates its slot, the weights\n"
           "                    all-gathered); 0 replicates the update. The same results (bit for bit on\n"
           "                    CPU ranks and on two GPUs). Default 1 on CPU ranks (measured no slower),\n"
           "                    0 on GPUs (measured 0.8%% slower on two); with --dp 1 it changes nothing\n"
           "  --recompute M     none (default), attn or full: activation checkpointing per layer\n"
           "  --plan            print the memory plan and exit (1 if the run does not fit)\n"
           "  --out FILE        write the trained model (GGUF; LoRA merged) at the end; --out-type T (bf16)\n"
           "  --lora-out FILE   write the LoRA adapters (llama.cpp adapter GGUF) at the end\n"
           "  --log FILE        one JSON object per step (step, loss, lr, grad_norm, tokens_per_s, mfu, ...)\n"
           "  --ckpt-dir DIR    checkpoints (atomic) every --ckpt-every N steps and at the end\n"
           "  --resume DIR      continue the run saved in DIR\n"
           "  --stop-at K       stop after step K (the schedule still spans --steps; checkpointed with --ckpt-dir)\n"
           "  --eval-data FILE  evaluation data; --eval-every K steps, --eval-batches N (8)\n"
           "  --seed N          data order and LoRA initialization (default 1)\n"
           "  --print-every N   without a terminal: a line every N steps (default 10), and the\n"
           "                    first and last; on a terminal a progress bar instead\n"
           "  --profile         time every op of the second step (GPU: events around each op, so\n"
           "                    that step runs without overlap) and print the per-op table to stderr\n"
           "  -q                no progress bar or step lines\n");
}

static void fmt_eta(double s, char *buf, size_t cap) {
    if (s < 0 || s > 1e9) snprintf(buf, cap, "-");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

static cli_progress g_bar; /* steps, on a terminal (tty stays false until the steps begin) */

/* The profiled step's table: per op label, calls, time, share, rate. */
static void print_profile(nstf_prof *pr, int64_t step, double step_ms) {
    const uint64_t total = nstf_prof_sort_sites(pr);
    fprintf(stderr, "profile of step %lld: %.2f ms in ops (the step took %.2f ms)\n", (long long)step,
            (double)total * 1e-6, step_ms);
    fprintf(stderr, "  %-28s %7s %10s %6s %9s\n", "op", "calls", "ms", "share", "TFLOP/s");
    for (int i = 0; i < pr->n_sites; i++) {
        const nstf_prof_site *x = &pr->sites[i];
        const double ms = (double)x->total_ns * 1e-6;
        fprintf(stderr, "  %-28s %7lld %10.3f %5.1f%%", x->label, (long long)x->calls, ms,
                total ? 100.0 * (double)x->total_ns / (double)total : 0.0);
        if (x->flops > 0 && x->total_ns > 0) fprintf(stderr, " %9.1f\n", x->flops / ((double)x->total_ns * 1e3));
        else fprintf(stderr, " %9s\n", "-");
    }
    if (pr->dropped) fprintf(stderr, "  (%lld op calls not recorded)\n", (long long)pr->dropped);
}

/* In a launch by mpirun, a rank's error ends every process of the launch
 * (the others would wait for this rank until their timeout). */
static int fail(nstf_trainer *t, FILE *log, const char *ckpt, int64_t saved) {
    cli_progress_end(&g_bar); /* the error goes below the bar */
    char who[32] = "";
    if (nstf_proc_active() && strncmp(nstf_last_error(), "rank ", 5) != 0)
        snprintf(who, sizeof who, "rank %d of %d: ", nstf_proc_rank(), nstf_proc_size());
    if (ckpt && saved >= 0 && !strstr(nstf_last_error(), "is kept"))
        fprintf(stderr, "nstf: %s%s; the last checkpoint (step %lld) in %s is kept\n", who, nstf_last_error(),
                (long long)saved, ckpt);
    else fprintf(stderr, "nstf: %s%s\n", who, nstf_last_error());
    cli_launch_end(1); /* (returns only outside a launch) */
    nstf_trainer_close(t);
    if (log) fclose(log);
    return 1;
}

int cmd_train(int argc, char **argv) {
    nstf_train_params p = nstf_train_default_params();
    const char *shape = NULL, *out = NULL, *out_type = NULL, *lora_out = NULL, *log_path = NULL, *ckpt = NULL,
               *resume = NULL;
    int ckpt_every = 0, eval_every = 0, print_every = 10;
    uint64_t stop_at = 0;
    bool plan = false, quiet = false, profile = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage();
            return 0;
        }
        if (!strcmp(a, "--plan")) { plan = true; continue; }
        if (!strcmp(a, "-q")) { quiet = true; continue; }
        if (!strcmp(a, "--profile")) { profile = true; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        int iv = 0;
        uint64_t uv = 0;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) p.model = v;
        else if (!strcmp(a, "--shape")) shape = v;
        else if (!strcmp(a, "--data")) p.data = v;
        else if (!strcmp(a, "--eval-data")) p.eval_data = v;
        else if (!strcmp(a, "--out") || !strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--out-type")) out_type = v;
        else if (!strcmp(a, "--lora-out")) lora_out = v;
        else if (!strcmp(a, "--log")) log_path = v;
        else if (!strcmp(a, "--ckpt-dir")) ckpt = v;
        else if (!strcmp(a, "--resume")) resume = v;
        else if (!strcmp(a, "--device")) p.device = v;
        else if (!strcmp(a, "--recompute")) p.recompute = v;
        else if (!strcmp(a, "--lora-targets")) p.lora_targets = v;
        else if (!strcmp(a, "--steps")) { if (!cli_parse_u64(a, v, &uv) || uv < 1) { fprintf(stderr, "nstf: --steps must be at least 1\n"); return 2; } p.steps = (int64_t)uv; }
        else if (!strcmp(a, "--warmup")) { if (!cli_parse_u64(a, v, &uv)) return 2; p.warmup = (int64_t)uv; }
        else if (!strcmp(a, "--seed")) { if (!cli_parse_u64(a, v, &p.seed)) return 2; }
        else if (!strcmp(a, "--stop-at")) { if (!cli_parse_u64(a, v, &stop_at) || stop_at < 1) { fprintf(stderr, "nstf: --stop-at must be at least 1\n"); return 2; } }
        else if (!strcmp(a, "--batch")) { if (!cli_parse_int(a, v, 1, 1 << 20, &p.batch)) return 2; }
        else if (!strcmp(a, "--seq")) { if (!cli_parse_int(a, v, 2, 1 << 20, &p.seq)) return 2; }
        else if (!strcmp(a, "--accum")) { if (!cli_parse_int(a, v, 1, 1 << 20, &p.grad_accum)) return 2; }
        else if (!strcmp(a, "--dp")) { if (!cli_parse_int(a, v, 1, 16, &p.dp)) return 2; }
        else if (!strcmp(a, "--dp-timeout")) { if (!cli_parse_int(a, v, 1, 1 << 30, &p.dp_timeout_ms)) return 2; }
        else if (!strcmp(a, "--zero")) { if (!cli_parse_int(a, v, 0, 1, &p.zero)) return 2; }
        else if (!strcmp(a, "--lora")) { if (!cli_parse_int(a, v, 1, 4096, &p.lora_rank)) return 2; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { if (!cli_parse_int(a, v, 1, 4096, &p.n_threads)) return 2; }
        else if (!strcmp(a, "--ckpt-every")) { if (!cli_parse_int(a, v, 1, 1 << 30, &ckpt_every)) return 2; }
        else if (!strcmp(a, "--print-every")) { if (!cli_parse_int(a, v, 1, 1 << 30, &print_every)) return 2; }
        else if (!strcmp(a, "--eval-every")) { if (!cli_parse_int(a, v, 1, 1 << 30, &eval_every)) return 2; }
        else if (!strcmp(a, "--eval-batches")) { if (!cli_parse_int(a, v, 1, 1 << 20, &iv)) return 2; p.eval_batches = iv; }
        else if (!strcmp(a, "--lr")) { if (!cli_parse_double(a, v, 1e-30, 1e30, &p.lr)) return 2; }
        else if (!strcmp(a, "--min-lr")) { if (!cli_parse_double(a, v, 0, 1e30, &p.min_lr)) return 2; }
        else if (!strcmp(a, "--wd")) { if (!cli_parse_double(a, v, 0, 1e3, &p.weight_decay)) return 2; }
        else if (!strcmp(a, "--clip")) { if (!cli_parse_double(a, v, 0, 1e30, &p.clip)) return 2; }
        else if (!strcmp(a, "--beta1")) { if (!cli_parse_double(a, v, 0, 0.999999, &p.beta1)) return 2; }
        else if (!strcmp(a, "--beta2")) { if (!cli_parse_double(a, v, 0, 0.999999, &p.beta2)) return 2; }
        else {
            fprintf(stderr, "nstf train: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (!!p.model == !!shape) {
        fprintf(stderr, "nstf train: give one of -m BASE.gguf and --shape NAME (see --help)\n");
        return 2;
    }
    if (eval_every && !p.eval_data) {
        fprintf(stderr, "nstf train: --eval-every needs --eval-data\n");
        return 2;
    }
    /* started by mpirun as one of several: one data-parallel rank per
     * process; rank 0 prints, logs, evaluates and writes the model */
    {
        const int jrc = cli_launch_join();
        if (jrc >= 0) return jrc;
    }
    const int rank = nstf_proc_active() ? nstf_proc_rank() : 0;
    if (nstf_proc_active() && p.dp == 1) p.dp = nstf_proc_size();
    if (rank > 0) quiet = true, log_path = NULL, out = NULL, lora_out = NULL, eval_every = 0, profile = false;
    /* from scratch: the shape's random model, written once beside the run */
    char init[1100];
    if (shape) {
        const char *dir = ckpt ? ckpt : resume;
        if (!dir && !out) {
            fprintf(stderr, "nstf train: --shape needs --ckpt-dir (or --out) to keep its initial weights\n");
            return 2;
        }
        if (dir) {
            if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
                perror(dir);
                return 1;
            }
            snprintf(init, sizeof init, "%s/init-%s.gguf", dir, shape);
        } else {
            snprintf(init, sizeof init, "%s.init.gguf", out);
        }
        struct stat sb;
        int made = 1; /* (rank 0 of a launch writes it; the others wait for it) */
        if (rank == 0 && stat(init, &sb) != 0 && gen_model_file(shape, NSTF_TYPE_BF16, init, p.seed) != NSTF_OK) {
            fprintf(stderr, "nstf: %s\n", nstf_last_error());
            made = 0;
        }
        if (nstf_proc_active() && nstf_proc_bcast0(&made, sizeof made, p.dp_timeout_ms ? p.dp_timeout_ms : 30000) != NSTF_OK)
            return fail(NULL, NULL, NULL, -1); /* (the others take rank 0's word) */
        if (!made) return cli_launch_end(1);
        p.model = init;
    }
    if (plan) {
        nstf_train_plan pl;
        if (nstf_train_plan_get(&p, &pl) != NSTF_OK) {
            fprintf(stderr, "nstf: %s\n", nstf_last_error());
            return 1;
        }
        if (rank == 0) nstf_train_plan_print(&pl, &p, stdout);
        if (!pl.fits && rank == 0) fprintf(stderr, "nstf: the run does not fit: %.2f GiB needed, %.2f GiB %s\n",
                              (double)pl.total / (1u << 30), (double)pl.available / (1u << 30), pl.host ? "available" : "free");
        nstf_proc_leave(1000);
        return pl.fits ? 0 : 1;
    }
    FILE *log = NULL;
    if (log_path && !(log = fopen(log_path, "a"))) {
        perror(log_path);
        return 1;
    }
    nstf_trainer *t = NULL;
    if (nstf_trainer_open(&p, &t) != NSTF_OK) return fail(NULL, log, NULL, -1);
    int64_t saved = -1;
    if (resume) {
        if (nstf_trainer_resume(t, resume) != NSTF_OK) return fail(t, log, NULL, -1);
        saved = nstf_trainer_steps_done(t);
        if (!ckpt) ckpt = resume;
    }
    if (!quiet) fprintf(stderr, "nstf train: %s\n", nstf_trainer_describe(t));
    struct timespec ts0;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    const int64_t first = nstf_trainer_steps_done(t);
    const int64_t last = stop_at && (int64_t)stop_at < p.steps ? (int64_t)stop_at : p.steps;
    cli_progress_init(&g_bar, "training", NULL, 1.0);
    nstf_prof prof;
    memset(&prof, 0, sizeof prof);
    while (nstf_trainer_steps_done(t) < last) {
        nstf_train_stats s;
        /* --profile: the second step of the run (the first warms up) */
        const bool prof_now = profile && nstf_trainer_steps_done(t) == first + 1;
        if (prof_now && nstf_prof_attach_trainer(&prof, t, 1 << 16) != NSTF_OK) return fail(t, log, ckpt, saved);
        if (nstf_trainer_step(t, &s) != NSTF_OK) {
            if (prof_now) nstf_prof_detach(&prof);
            return fail(t, log, ckpt, saved);
        }
        if (prof_now) {
            const nstf_status pst = nstf_prof_collect(&prof);
            cli_progress_end(&g_bar);
            if (pst == NSTF_OK) print_profile(&prof, s.step, s.step_ms);
            nstf_prof_detach(&prof);
            if (pst != NSTF_OK) return fail(t, log, ckpt, saved);
        }
        if (!quiet && g_bar.tty) {
            char note[96];
            snprintf(note, sizeof note, "step %lld/%lld  loss %.4f  %.0f tok/s", (long long)s.step, (long long)last,
                     s.loss, s.tokens_per_s);
            cli_progress_show(&g_bar, (uint64_t)(s.step - first), (uint64_t)(last - first), note);
        } else if (!quiet && (s.step == first + 1 || s.step % print_every == 0 || s.step == last)) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            const double el = (double)(ts.tv_sec - ts0.tv_sec) + (double)(ts.tv_nsec - ts0.tv_nsec) * 1e-9;
            char eta[32], mfu[32] = "";
            fmt_eta(el / (double)(s.step - first) * (double)(last - s.step), eta, sizeof eta);
            if (s.mfu >= 0) snprintf(mfu, sizeof mfu, "  mfu %5.1f%%", 100 * s.mfu);
            fprintf(stderr, "step %lld/%lld  loss %.4f  lr %.3e  gnorm %.3f  %.0f tok/s%s  eta %s\n", (long long)s.step,
                    (long long)last, s.loss, s.lr, s.grad_norm, s.tokens_per_s, mfu, eta);
        }
        if (log) {
            fprintf(log,
                    "{\"step\": %lld, \"loss\": %.9g, \"lr\": %.9g, \"grad_norm\": %.9g, \"tokens\": %lld, "
                    "\"tokens_per_s\": %.6g, \"step_ms\": %.6g, \"mfu\": ",
                    (long long)s.step, s.loss, s.lr, s.grad_norm, (long long)s.tokens, s.tokens_per_s, s.step_ms);
            if (s.mfu >= 0) fprintf(log, "%.6g}\n", s.mfu);
            else fprintf(log, "null}\n");
            fflush(log);
        }
        if (eval_every && s.step % eval_every == 0) {
            double el_loss = 0;
            if (nstf_trainer_eval(t, &el_loss) != NSTF_OK) return fail(t, log, ckpt, saved);
            cli_progress_end(&g_bar); /* the bar stays above the eval line, drawn again below it */
            if (!quiet) fprintf(stderr, "step %lld  eval loss %.4f\n", (long long)s.step, el_loss);
            if (log) fprintf(log, "{\"step\": %lld, \"eval_loss\": %.9g}\n", (long long)s.step, el_loss), fflush(log);
        }
        if (ckpt && ((ckpt_every && s.step % ckpt_every == 0) || s.step == last)) {
            if (nstf_trainer_save(t, ckpt) != NSTF_OK) return fail(t, log, ckpt, saved);
            saved = s.step;
        }
    }
    cli_progress_end(&g_bar);
    if (out && nstf_trainer_export(t, out, out_type) != NSTF_OK) return fail(t, log, ckpt, saved);
    if (lora_out && nstf_trainer_export_lora(t, lora_out) != NSTF_OK) return fail(t, log, ckpt, saved);
    if (!quiet && out) fprintf(stderr, "nstf train: wrote %s\n", out);
    nstf_trainer_close(t);
    if (log) fclose(log);
    nstf_proc_leave(p.dp_timeout_ms ? p.dp_timeout_ms : 30000);
    return 0;
}
