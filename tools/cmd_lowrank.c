/* cmd_lowrank.c — `nstf lowrank`: factor a model's layer matrices into
 * low-rank pairs (plain or activation-aware SVD, src/opt/lowrank.h) and
 * write the factorized GGUF; or, with --eval and --sweep, measure the
 * perplexity and KL of plain and activation-aware factorizations at
 * several parameter reductions without writing anything. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli_util.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/evaluate.h"
#include "opt/lowrank.h"

int cmd_lowrank(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf lowrank -m MODEL -o OUT [options]\n"
            "       nstf lowrank -m MODEL --eval TEXT --sweep R1,R2,.. [--calib TEXT] [options]\n"
            "\n"
            "Factor the layer matrices W [n_out, n_in] into B [n_out, r] A [r, n_in] (docs/OPTIMIZE.md).\n"
            "\n"
            "  -m, --model FILE      input GGUF (F32/F16/BF16 or quantized; factors are made from W in fp32)\n"
            "  -o, --output FILE     the factorized GGUF\n"
            "      --calib FILE      calibration text: activation-aware SVD (SVD-LLM); without it, plain SVD\n"
            "      --calib-tokens N  tokens of it used (default 512)\n"
            "      --energy F        rank rule: smallest r keeping fraction F of the (whitened) energy (default 0.95)\n"
            "      --min-saving S    ... a matrix whose rank saves less than S of its parameters stays dense (0.1)\n"
            "      --reduce R        remove fraction R of the targeted parameters instead of --energy\n"
            "      --alloc A         how --reduce is spread: uniform (every matrix alike, default) or energy;\n"
            "                        with --sweep also both\n"
            "      --targets LIST    attn_q,attn_k,attn_v,attn_output,ffn_gate,ffn_up,ffn_down or all (default)\n"
            "      --layers A-B      layers A..B only (default all)\n"
            "      --type T          factor type: f32, f16 (default) or bf16\n"
            "  -t, --threads N       CPU threads (default all)\n"
            "      --rank-multiple N round every rank down to a multiple of N (at least N), so that both\n"
            "                        factors quantize: 32 for Q8_0/Q4_0/Q5_0, 256 for the K-quants (default 1)\n"
            "      --ranks           print the rank each matrix got (0: left dense)\n"
            "      --eval FILE       measure on this text instead of writing (with --sweep)\n"
            "      --eval-tokens N   tokens of it scored (default 512)\n"
            "      --sweep LIST      reductions to measure, e.g. 0.1,0.2,0.3,0.4,0.5\n");
}

static void progress(void *user, int done, int total, const char *name) {
    (void)user;
    if (!isatty(2)) return;
    fprintf(stderr, "\r  SVD %d/%d %-28s", done, total, name);
    if (done == total) fprintf(stderr, "\r%60s\r", "");
    fflush(stderr);
}

static bool parse_layers(const char *v, nstf_lowrank_params *p) {
    int a, b;
    if (sscanf(v, "%d-%d", &a, &b) != 2 || a < 0 || b < a) {
        fprintf(stderr, "nstf: --layers wants A-B (e.g. 0-3), got '%s'\n", v);
        return false;
    }
    p->layer0 = a;
    p->layer1 = b + 1;
    return true;
}

/* Tokens of a text file, through the session's tokenizer. */
static int32_t *text_tokens(nstf_session *s, const char *path, const char *what, int max, int *n) {
    char *text = cli_read_file(path, what);
    if (!text) return NULL;
    int32_t *ids = NULL;
    if (nstf_eval_tokenize(s, text, max, &ids, n) != NSTF_OK) fprintf(stderr, "nstf: %s: %s\n", path, nstf_last_error());
    free(text);
    return ids;
}

/* The sweep: the unmodified model's scores, then each reduction for each
 * method, as one markdown table. */
static int sweep(nstf_session *s, nstf_lowrank *lr[2], const nstf_lowrank_params *base, bool both, const int32_t *ids,
                 int n, const double *red, int n_red) {
    const int nv = nstf_session_n_vocab(s);
    float *ref = nstf_alloc((size_t)n * (size_t)nv * 4, "reference log-probabilities"),
          *lp = nstf_alloc((size_t)n * (size_t)nv * 4, "log-probabilities");
    if (!ref || !lp || nstf_eval_logprobs(s, ids, n, ref) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        nstf_free(ref), nstf_free(lp);
        return 1;
    }
    nstf_eval_score b;
    nstf_eval_scores(ref, NULL, ids, n, nv, 0, &b);
    printf("| method | allocation | reduction | targeted params | perplexity | change | KL | top-1 |\n");
    printf("|---|---|---:|---:|---:|---:|---:|---:|\n");
    printf("| none | - | 0 | - | %.4f | - | 0 | 1 |\n", b.ppl);
    fflush(stdout);
    int rc = 0;
    for (int al = 0; al < (both ? 2 : 1); al++)
    for (int i = 0; i < n_red && rc == 0; i++)
        for (int k = 0; k < 2 && rc == 0; k++) {
            if (!lr[k]) continue;
            nstf_lowrank_params p = *base;
            p.reduce = red[i];
            if (both) p.alloc = al ? NSTF_LR_ENERGY_AT : NSTF_LR_UNIFORM;
            uint64_t before = 0, after = 0;
            nstf_eval_score sc;
            if (nstf_lowrank_apply(lr[k], &p, &before, &after) != NSTF_OK || nstf_eval_logprobs(s, ids, n, lp) != NSTF_OK) {
                fprintf(stderr, "nstf: %s\n", nstf_last_error());
                rc = 1;
                break;
            }
            nstf_eval_scores(lp, ref, ids, n, nv, 0, &sc);
            printf("| %s | %s | %.2f | %.1f%% | %.4f | %+.2f%% | %.5f | %.3f |\n", k ? "SVD-LLM (whitened)" : "plain SVD",
                   p.alloc == NSTF_LR_UNIFORM ? "uniform" : "energy", red[i], 100.0 * (double)after / (double)before,
                   sc.ppl, 100.0 * (sc.ppl / b.ppl - 1), sc.kl, sc.top1);
            fflush(stdout);
            nstf_lowrank_restore(lr[k]);
        }
    nstf_free(ref), nstf_free(lp);
    return rc;
}

int cmd_lowrank(int argc, char **argv) {
    const char *model = NULL, *out = NULL, *calib = NULL, *eval = NULL, *sweep_list = NULL, *type = "f16";
    int calib_tokens = 512, eval_tokens = 512;
    nstf_lowrank_params p = {0};
    p.alloc = NSTF_LR_ENERGY;
    p.keep = 0.95;
    bool reduce_set = false, energy_alloc = false, both = false, ranks = false;
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        float f;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { VAL(); out = v; }
        else if (!strcmp(a, "--calib")) { VAL(); calib = v; }
        else if (!strcmp(a, "--calib-tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &calib_tokens)) return 2; }
        else if (!strcmp(a, "--energy")) { VAL(); if (!cli_parse_float(a, v, 1e-6, 1, &f)) return 2; p.keep = f; }
        else if (!strcmp(a, "--min-saving")) { VAL(); if (!cli_parse_float(a, v, 0, 0.99, &f)) return 2; p.min_saving = f; }
        else if (!strcmp(a, "--reduce")) { VAL(); if (!cli_parse_float(a, v, 1e-3, 0.999, &f)) return 2; p.reduce = f; reduce_set = true; }
        else if (!strcmp(a, "--alloc")) {
            VAL();
            if (strcmp(v, "uniform") && strcmp(v, "energy") && strcmp(v, "both")) {
                fprintf(stderr, "nstf: --alloc is uniform, energy or both (with --sweep)\n");
                return 2;
            }
            energy_alloc = !strcmp(v, "energy");
            both = !strcmp(v, "both");
        }
        else if (!strcmp(a, "--targets")) {
            VAL();
            if (!nstf_lowrank_parse_targets(v, &p.targets)) { fprintf(stderr, "nstf: --targets: unknown matrix in '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--layers")) { VAL(); if (!parse_layers(v, &p)) return 2; }
        else if (!strcmp(a, "--type")) { VAL(); type = v; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_int(a, v, 1, 1024, &sp.n_threads)) return 2; }
        else if (!strcmp(a, "--eval")) { VAL(); eval = v; }
        else if (!strcmp(a, "--eval-tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &eval_tokens)) return 2; }
        else if (!strcmp(a, "--sweep")) { VAL(); sweep_list = v; }
        else if (!strcmp(a, "--ranks")) ranks = true;
        else if (!strcmp(a, "--rank-multiple")) { VAL(); if (!cli_parse_int(a, v, 1, 1 << 16, &p.rank_multiple)) return 2; }
        else { fprintf(stderr, "nstf lowrank: unknown option '%s'\n", a); usage(stderr); return 2; }
#undef VAL
    }
    nstf_type ftype;
    if (!model || (!out && !eval) || (eval && !sweep_list)) { usage(stderr); return 2; }
    if (!nstf_type_from_name(type, &ftype) || (ftype != NSTF_TYPE_F32 && ftype != NSTF_TYPE_F16 && ftype != NSTF_TYPE_BF16)) {
        fprintf(stderr, "nstf: --type is f32, f16 or bf16\n");
        return 2;
    }
    double red[16];
    int n_red = 0;
    for (const char *q = sweep_list; q && *q && n_red < 16;) {
        char *end;
        red[n_red] = strtod(q, &end);
        if (end == q || !(red[n_red] > 0 && red[n_red] < 1)) { fprintf(stderr, "nstf: --sweep wants reductions in (0, 1)\n"); return 2; }
        n_red++;
        q = *end == ',' ? end + 1 : end;
    }
    if (reduce_set || sweep_list) p.alloc = energy_alloc ? NSTF_LR_ENERGY_AT : NSTF_LR_UNIFORM;
    p.progress = progress;
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    int rc = 1, n_cal = 0, n_ev = 0;
    int32_t *cal = calib ? text_tokens(s, calib, "calibration text", calib_tokens, &n_cal) : NULL,
            *ev = eval ? text_tokens(s, eval, "evaluation text", eval_tokens, &n_ev) : NULL;
    nstf_lowrank *lr[2] = {NULL, NULL};
    if ((calib && !cal) || (eval && !ev)) goto done;
    if (eval) { /* plain always, activation-aware with a calibration text */
        nstf_lowrank_params q = p;
        q.whiten = false;
        if (nstf_lowrank_create(s, NULL, 0, &q, &lr[0]) != NSTF_OK) goto fail;
        q.whiten = true;
        if (cal && nstf_lowrank_create(s, cal, n_cal, &q, &lr[1]) != NSTF_OK) goto fail;
        rc = sweep(s, lr, &p, both, ev, n_ev, red, n_red);
        goto done;
    }
    p.whiten = cal != NULL;
    uint64_t before = 0, after = 0;
    if (nstf_lowrank_create(s, cal, n_cal, &p, &lr[0]) != NSTF_OK || nstf_lowrank_apply(lr[0], &p, &before, &after) != NSTF_OK ||
        nstf_lowrank_write(lr[0], out, ftype) != NSTF_OK)
        goto fail;
    int n_fact = 0;
    for (int i = 0; i < nstf_lowrank_count(lr[0]); i++) {
        const char *name = NULL;
        const int64_t r = nstf_lowrank_rank_of(lr[0], i, &name);
        n_fact += r > 0;
        if (ranks) printf("%s %lld\n", name, (long long)r);
    }
    fprintf(stderr, "nstf: %s: %d of %d matrices factored (%s SVD), targeted parameters %.1f%% of %llu\n", out, n_fact,
            nstf_lowrank_count(lr[0]), cal ? "activation-aware" : "plain", 100.0 * (double)after / (double)before,
            (unsigned long long)before);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "nstf: %s\n", nstf_last_error());
done:
    nstf_lowrank_free(lr[0]);
    nstf_lowrank_free(lr[1]);
    nstf_free(cal);
    nstf_free(ev);
    nstf_session_close(s);
    return rc;
}
