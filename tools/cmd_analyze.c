/* cmd_analyze.c — `nstf analyze -m MODEL -f TEXT`: per-matrix
 * sensitivity (src/opt/analyze.h) as a markdown table or JSON, and a
 * chart (--svg, analyze_svg.c), with a progress bar on a terminal. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/analyze.h"
#include "opt/lowrank.h"

int cmd_analyze(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf analyze -m MODEL -f TEXT [options]\n"
            "\n"
            "For each layer matrix and candidate, the model with only that matrix changed against the\n"
            "unmodified one over TEXT: KL divergence of the final distributions, perplexity and its change.\n"
            "\n"
            "  -m, --model FILE      GGUF model (best an F32/F16/BF16 one: candidates start from its values)\n"
            "  -f, --file FILE       the text\n"
            "  -n, --tokens N        tokens of it evaluated (default 128)\n"
            "      --types LIST      candidate types (default Q8_0,Q6_K,Q5_K,Q4_K,IQ4_NL,IQ4_XS,Q4_0,Q3_K,Q2_K;\n"
            "                        types without a quantizer are skipped and said so)\n"
            "      --lowrank R       also the rank-r factorization removing fraction R of each matrix's\n"
            "                        parameters (default 0.5; 0: none)\n"
            "      --calib FILE      calibration text: activation-aware factorization (default: plain SVD)\n"
            "      --targets LIST    matrices (attn_q,...,ffn_down or all; default all)\n"
            "      --layers A-B      layers A..B only (default all)\n"
            "      --fast            layer 0's attention matrices, 16 tokens, Q8_0 and Q4_0, rank at 0.5 (tests)\n"
            "      --json            JSON instead of the markdown table\n"
            "      --svg FILE        also a chart: KL against bits per weight for every matrix and candidate,\n"
            "                        and the mean KL per layer and candidate\n"
            "  -t, --threads N       CPU threads (default all)\n");
}

/* the library's (done, total, what) callback on the CLI's bar */
static void progress(void *user, int done, int total, const char *what) {
    cli_progress_show(user, (uint64_t)done, (uint64_t)total, what);
}

static void print_md(const char *model, int n_tok, const nstf_analyze_result *r) {
    printf("model %s, %d tokens, perplexity %.4f unmodified\n\n", model, n_tok, r->base.ppl);
    if (r->skipped[0]) printf("skipped: %s\n\n", r->skipped);
    printf("| tensor | candidate | bits/weight | KL | perplexity | change | top-1 |\n");
    printf("|---|---|---:|---:|---:|---:|---:|\n");
    for (int i = 0; i < r->n_rows; i++) {
        const nstf_analyze_row *w = &r->rows[i];
        printf("| %s | %s | %.2f | %.6f | %.4f | %+.3f%% | %.3f |\n", w->tensor, w->candidate, w->bpw, w->score.kl,
               w->score.ppl, 100.0 * (w->score.ppl / r->base.ppl - 1), w->score.top1);
    }
}

static void print_json(const char *model, int n_tok, const nstf_analyze_result *r) {
    printf("{\"model\": \"");
    for (const char *c = model; *c; c++) {
        if (*c == '"' || *c == '\\') printf("\\%c", *c);
        else if ((unsigned char)*c < 0x20) printf("\\u%04x", *c);
        else putchar(*c);
    }
    printf("\", \"tokens\": %d, \"perplexity\": %.6f, \"skipped\": \"%s\", \"rows\": [", n_tok, r->base.ppl, r->skipped);
    for (int i = 0; i < r->n_rows; i++) {
        const nstf_analyze_row *w = &r->rows[i];
        printf("%s\n  {\"tensor\": \"%s\", \"layer\": %d, \"candidate\": \"%s\", \"bpw\": %.4f, \"kl\": %.8g, "
               "\"perplexity\": %.6f, \"ppl_change\": %.8g, \"top1\": %.6f}",
               i ? "," : "", w->tensor, w->layer, w->candidate, w->bpw, w->score.kl, w->score.ppl,
               w->score.ppl / r->base.ppl - 1, w->score.top1);
    }
    printf("\n]}\n");
}

int cmd_analyze(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *calib = NULL, *svg = NULL;
    bool json = false, fast = false;
    int n_tok = 128, n_types = 0;
    float reduce = 0.5f;
    nstf_type types[16];
    nstf_analyze_params p = {0};
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    if (!cli_parse_types("--types", "Q8_0,Q6_K,Q5_K,Q4_K,IQ4_NL,IQ4_XS,Q4_0,Q3_K,Q2_K", types, &n_types, 16, false)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); file = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &n_tok)) return 2; }
        else if (!strcmp(a, "--types")) { VAL(); if (!cli_parse_types(a, v, types, &n_types, 16, false)) return 2; }
        else if (!strcmp(a, "--lowrank")) { VAL(); if (!cli_parse_float(a, v, 0, 0.999, &reduce)) return 2; }
        else if (!strcmp(a, "--calib")) { VAL(); calib = v; }
        else if (!strcmp(a, "--targets")) {
            VAL();
            if (!nstf_lowrank_parse_targets(v, &p.targets)) { fprintf(stderr, "nstf: --targets: unknown matrix in '%s'\n", v); return 2; }
        }
        else if (!strcmp(a, "--layers")) {
            VAL();
            if (sscanf(v, "%d-%d", &p.layer0, &p.layer1) != 2 || p.layer0 < 0 || p.layer1 < p.layer0) {
                fprintf(stderr, "nstf: --layers wants A-B, got '%s'\n", v);
                return 2;
            }
            p.layer1++;
        }
        else if (!strcmp(a, "--fast")) fast = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!strcmp(a, "--svg")) { VAL(); svg = v; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_int(a, v, 1, 1024, &sp.n_threads)) return 2; }
        else { fprintf(stderr, "nstf analyze: unknown option '%s'\n", a); usage(stderr); return 2; }
#undef VAL
    }
    if (!model || !file) { usage(stderr); return 2; }
    if (fast) {
        p.layer0 = 0, p.layer1 = 1, n_tok = 16, reduce = 0.5f;
        p.targets = NSTF_LR_Q | NSTF_LR_K | NSTF_LR_V | NSTF_LR_O;
        if (!cli_parse_types("--types", "Q8_0,Q4_0", types, &n_types, 16, false)) return 2;
    }
    if (reduce > 0 && !nstf_lowrank_available()) {
        fprintf(stderr, "nstf: this build has no LAPACKE: the low-rank candidate is left out (install liblapacke-dev)\n");
        reduce = 0;
    }
    p.types = types;
    p.n_types = n_types;
    p.lowrank_reduce = reduce;
    cli_progress bar;
    cli_progress_init(&bar, "analyze", NULL, 1.0);
    p.progress = progress;
    p.progress_user = &bar;
    nstf_session *s = NULL;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        return 1;
    }
    int rc = 1, n = 0, n_cal = 0;
    int32_t *ids = NULL, *cal = NULL;
    char *text = cli_read_file(file, "text"), *ctext = calib ? cli_read_file(calib, "calibration text") : NULL;
    nstf_analyze_result r = {0};
    if (!text || (calib && !ctext)) goto done;
    if (nstf_eval_tokenize(s, text, n_tok, &ids, &n) != NSTF_OK ||
        (ctext && nstf_eval_tokenize(s, ctext, 512, &cal, &n_cal) != NSTF_OK)) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        goto done;
    }
    p.calib = cal;
    p.n_calib = n_cal;
    const nstf_status st = nstf_analyze_run(s, ids, n, &p, &r);
    cli_progress_end(&bar);
    if (st != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        goto done;
    }
    if (json) print_json(model, n, &r);
    else print_md(model, n, &r);
    if (svg && nstf_analyze_svg(svg, model, &r) != NSTF_OK) {
        fprintf(stderr, "nstf: %s\n", nstf_last_error());
        goto done;
    }
    rc = 0;
done:
    nstf_analyze_result_free(&r);
    free(text);
    free(ctext);
    nstf_free(ids);
    nstf_free(cal);
    nstf_session_close(s);
    return rc;
}
