/* cmd_perplexity.c — `nstf perplexity -m MODEL -f TEXT [-c 512] [-b N]
 * [--chunks N] [--kl-base FILE] [--save-logits FILE]`: llama.cpp's
 * llama-perplexity (nstf_perplexity in nstf_tools.h), printing what it
 * prints: the running perplexity after each window ("[1]x,[2]y,...") and
 * the final estimate on stdout, the statistics of the KL divergence against
 * a base model with --kl-base. A progress line on stderr when it is a
 * terminal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_util.h"
#include "dist/proc.h"
#include "nstf_tools.h"

int cmd_perplexity(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf perplexity -m MODEL -f TEXT [options]\n"
            "  perplexity of MODEL on the text of file TEXT, as llama.cpp's llama-perplexity computes it:\n"
            "  windows of -c tokens (BOS first when the model adds it), the second half of each scored\n"
            "  -c, --ctx-size N      window (default 512)\n"
            "  -b, --batch-size N    tokens per forward (default: the window)\n"
            "  --chunks N            windows to run (default: all the text holds)\n"
            "  --save-logits FILE    save this model's log-probabilities (llama.cpp's --kl-divergence-base file)\n"
            "  --kl-base FILE        KL divergence, top-1 agreement and perplexity against a base model's saved\n"
            "                        log-probabilities (their tokens are used; -f is not needed)\n"
            "  -t, --threads N       CPU threads (default: every core)\n"
            "  --device cpu|gpu|auto where to run (default auto)\n"
            "  --tp N, --gpus LIST   tensor parallel over N GPUs (as nstf run); or one process per rank:\n"
            "                        mpirun -np N nstf perplexity ...\n"
            "  -ctk, -ctv T          KV cache type of K and V: q8_0, or auto (the device's own; default)\n"
            "  --precise             CPU: fp32 activations in every matmul\n"
            "  -v                    model and device details\n");
}

/* Progress and the running perplexity, as llama-perplexity prints it. */
typedef struct {
    bool tty, kl;
} progress_ctx;

static void on_chunk(void *user, int chunk, int n_chunk, double ppl, double seconds) {
    const progress_ctx *p = user;
    if (!p->kl) {
        printf("[%d]%.4lf,", chunk, ppl);
        fflush(stdout);
    }
    if (p->tty) {
        const double eta = seconds / chunk * (n_chunk - chunk);
        fprintf(stderr, "\rperplexity: window %d/%d, PPL %.4f, %.1f s, ETA %.0f s   ", chunk, n_chunk, ppl, seconds, eta);
        if (chunk == n_chunk) fputc('\n', stderr);
        fflush(stderr);
    }
}

static char *read_text(const char *path, size_t *len) {
    FILE *f = !strcmp(path, "-") ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got; buf && (got = fread(buf + n, 1, cap - n, f)) > 0;) {
        n += got;
        if (n == cap) {
            char *b = realloc(buf, cap *= 2);
            if (!b) free(buf);
            buf = b;
        }
    }
    bool bad = ferror(f);
    if (f != stdin) fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static void print_kl(const nstf_ppl_result *r) {
    printf("====== Perplexity statistics ======\n");
    printf("Mean PPL(Q)                   : %10.6lf ± %10.6lf\n", r->ppl, r->ppl_unc);
    printf("Mean PPL(base)                : %10.6lf ± %10.6lf\n", r->ppl_base, r->ppl_base_unc);
    printf("Mean ln(PPL(Q)/PPL(base))     : %10.6lf ± %10.6lf\n", r->ln_ratio, r->ln_ratio_unc);
    printf("\n====== KL divergence statistics ======\n");
    printf("Mean    KLD: %10.6lf ± %10.6lf\n", r->kld, r->kld_unc);
    static const char *const names[NSTF_PPL_N_PCT] = {"Maximum KLD", "99.9%   KLD", "99.0%   KLD", "95.0%   KLD",
                                                      "90.0%   KLD", "Median  KLD", "10.0%   KLD", " 5.0%   KLD",
                                                      " 1.0%   KLD", " 0.1%   KLD", "Minimum KLD"};
    for (int i = 0; i < NSTF_PPL_N_PCT; i++) printf("%s: %10.6f\n", names[i], r->kld_pct[i]);
    printf("\n====== Token probability statistics ======\n");
    printf("Mean    Δp: %6.3lf ± %5.3lf %%\n", 100.0 * r->p_diff, 100.0 * r->p_diff_unc);
    printf("Maximum |Δp|: %6.3lf%%\n", 100.0 * r->p_diff_max);
    printf("RMS Δp    : %6.3lf ± %5.3lf %%\n", 100.0 * r->p_diff_rms, 100.0 * r->p_diff_rms_unc);
    printf("Same top p: %6.3lf ± %5.3lf %%\n", 100.0 * r->same_top, 100.0 * r->same_top_unc);
}

int cmd_perplexity(int argc, char **argv) {
    const char *model = NULL, *text_path = NULL, *device = "auto", *gpus = NULL, *ctk = NULL, *ctv = NULL;
    int n_tp = 0;
    nstf_ppl_params pp = {0, 0, -1, NULL, NULL, NULL, NULL};
    int n_ctx = 0, n_batch = 0, threads = 0;
    bool precise = false, verbose = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--precise")) { precise = true; continue; }
        if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) { verbose = true; continue; }
        if (!(v = cli_value(argc, argv, &i))) return 2;
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) text_path = v;
        else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            if (!cli_parse_int(a, v, 2, 1 << 20, &n_ctx)) return 2;
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            if (!cli_parse_int(a, v, 1, 1 << 20, &n_batch)) return 2;
        } else if (!strcmp(a, "--chunks")) {
            if (!cli_parse_int(a, v, 1, 1 << 30, &pp.n_chunks)) return 2;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (!cli_parse_int(a, v, 1, 4096, &threads)) return 2;
        } else if (!strcmp(a, "--kl-base") || !strcmp(a, "--kl-divergence-base")) pp.kl_base = v;
        else if (!strcmp(a, "--save-logits")) pp.save_logits = v;
        else if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--gpus")) gpus = v;
        else if (!strcmp(a, "-ctk") || !strcmp(a, "--cache-type-k")) ctk = v;
        else if (!strcmp(a, "-ctv") || !strcmp(a, "--cache-type-v")) ctv = v;
        else if (!strcmp(a, "--tp")) {
            if (!cli_parse_int(a, v, 1, 16, &n_tp)) return 2;
        } else {
            fprintf(stderr, "nstf perplexity: unknown option '%s' (nstf perplexity --help)\n", a);
            return 2;
        }
    }
    if (!model || (!text_path && !pp.kl_base)) {
        fprintf(stderr, "nstf perplexity: %s (nstf perplexity --help)\n",
                !model ? "no model given: -m MODEL" : "no text given: -f TEXT");
        return 2;
    }
    if (pp.kl_base && pp.save_logits) {
        fprintf(stderr, "nstf perplexity: --save-logits and --kl-base exclude each other\n");
        return 2;
    }
    if (n_ctx % 2) {
        fprintf(stderr, "nstf perplexity: -c %d: the window must be even\n", n_ctx);
        return 2;
    }
    /* the window from the base file when comparing and no -c was given */
    int win = n_ctx ? n_ctx : 512;
    if (pp.kl_base && !n_ctx) {
        FILE *f = fopen(pp.kl_base, "rb");
        unsigned char h[12];
        if (f && fread(h, 1, 12, f) == 12 && !memcmp(h, "_logits_", 8)) win = h[8] | h[9] << 8 | h[10] << 16 | h[11] << 24;
        if (f) fclose(f);
        if (win < 2 || win > 1 << 20) win = 512; /* nstf_perplexity reports the bad file */
    }
    pp.n_ctx = n_ctx;
    pp.n_batch = n_batch && n_batch < win ? n_batch : win;
    /* under mpirun: one tensor-parallel rank per process; rank 0 reports
     * and writes --save-logits */
    {
        const int lrc = cli_launch_tp(&n_tp, NULL);
        if (lrc >= 0) return lrc;
    }
    const bool quiet = nstf_proc_active() && nstf_proc_rank() > 0;
    if (quiet) pp.save_logits = NULL;

    nstf_session_params sp = nstf_session_default_params();
    sp.n_ctx = win;
    sp.n_batch = pp.n_batch;
    sp.n_threads = threads;
    sp.device = device;
    sp.n_tp = n_tp;
    sp.gpus = gpus;
    sp.precise = precise;
    sp.verbose = verbose;
    sp.cache_type_k = ctk;
    sp.cache_type_v = ctv;
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        fprintf(stderr, "nstf perplexity: %s\n", nstf_last_error());
        return cli_launch_end(1);
    }
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    nstf_status st = NSTF_OK;
    if (!pp.kl_base) {
        pp.n_ctx = win;
        size_t len = 0;
        char *text = read_text(text_path, &len);
        if (!text) {
            fprintf(stderr, "nstf perplexity: %s: cannot read the text\n", text_path);
            nstf_session_close(s);
            return cli_launch_end(1);
        }
        st = nstf_session_tokenize_alloc(s, text, len, false, &ids, &n_ids);
        free(text);
        if (st == NSTF_OK && !quiet)
            fprintf(stderr, "perplexity: %s: %lld tokens, %lld windows of %d, batch %d, %s\n", text_path,
                    (long long)n_ids, (long long)(n_ids / win), win, pp.n_batch, nstf_session_device(s));
    }
    progress_ctx pc = {isatty(2) != 0, pp.kl_base != NULL};
    pp.progress = quiet ? NULL : on_chunk;
    pp.user = &pc;
    nstf_ppl_result r;
    if (st == NSTF_OK) st = nstf_perplexity(s, ids, n_ids, &pp, &r);
    if (st == NSTF_OK) {
        if (pp.kl_base) {
            print_kl(&r);
        } else {
            printf("\nFinal estimate: PPL = %.4lf +/- %.5lf\n", r.ppl, r.ppl_unc);
        }
        if (!quiet)
            fprintf(stderr, "perplexity: %d windows of %d (%lld positions scored) in %.2f s\n", r.n_chunk, r.n_ctx,
                    (long long)r.count, r.seconds);
        if (pp.save_logits) fprintf(stderr, "perplexity: log-probabilities saved to %s\n", pp.save_logits);
    } else {
        fprintf(stderr, "%snstf perplexity: %s\n", pc.tty ? "\n" : "", nstf_last_error());
    }
    free(ids);
    nstf_session_close(s);
    return cli_launch_end(st == NSTF_OK ? 0 : 1);
}
