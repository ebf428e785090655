/* test_analyze.c — per-matrix sensitivity (src/opt/analyze.h, `nstf
 * analyze`) on SmolLM2 (skipped, 77, without the model), fast: layer 0's
 * attn_k and attn_v, 16 tokens, fp32 activations.
 *  - rows: one per matrix and candidate run (F32, Q8_0, Q4_0 and the rank
 *    at 50%); IQ4_XS, whose super-block of 256 does not divide the rows of
 *    576, gives none (and no type is skipped for want of a quantizer);
 *  - the unmodified model's perplexity equals the one computed directly;
 *    the F32 candidate (the matrix's own values, fp32) changes the logits
 *    by rounding only: KL <= 1e-7, top-1 100%; Q4_0 moves them more
 *    than Q8_0 (KL) for each matrix; every KL and perplexity is finite;
 *  - the model is its own again afterwards: logits bit for bit;
 *  - `nstf analyze --fast --json --svg F` prints the rows as JSON (the
 *    low-rank candidate only with LAPACKE) and draws one point per row;
 *  - the chart on a made-up result: names escaped, every row a point with
 *    its tooltip, a non-finite KL and an empty result refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_run.h"
#include "nstf_tools.h"
#include "opt/analyze.h"
#include "opt/lowrank.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

static const char *k_text = "Sensitivity analysis changes one matrix at a time and measures how far the model's "
                            "predictions move from the original ones over a short text.";

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *b = calloc(1, 1 << 20);
    if (b) b[fread(b, 1, (1 << 20) - 1, f)] = 0;
    fclose(f);
    return b;
}

static int count(const char *s, const char *what) {
    int n = 0;
    for (const char *p = s; p && (p = strstr(p, what)); p += strlen(what)) n++;
    return n;
}

/* the chart of a made-up result */
static void svg_unit(void) {
    nstf_analyze_row rows[5] = {0};
    for (int i = 0; i < 5; i++) {
        snprintf(rows[i].tensor, sizeof rows[i].tensor, "blk.%d.attn_q.weight", i % 3);
        snprintf(rows[i].candidate, sizeof rows[i].candidate, i % 2 ? "Q4_0" : "Q8_0");
        rows[i].layer = i % 3;
        rows[i].bpw = i % 2 ? 4.5 : 8.5;
        rows[i].score.kl = i ? 1e-4 * i : 0; /* a zero KL sits on the floor */
        rows[i].score.ppl = 10.0 + i;
    }
    snprintf(rows[4].tensor, sizeof rows[4].tensor, "a<b>&\"c'");
    nstf_analyze_result r = {.base = {.ppl = 10.0}, .rows = rows, .n_rows = 5};
    char path[] = "/tmp/nstf_test_analyze_svg_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) close(fd);
    CHECK(nstf_analyze_svg(path, "t<1>", &r) == NSTF_OK, "svg: %s", nstf_last_error());
    char *b = slurp(path);
    CHECK(b && !strncmp(b, "<svg ", 5) && strstr(b, "</svg>\n") && count(b, "<title>") == 5 &&
              strstr(b, "a&lt;b&gt;&amp;&quot;c&apos;") && strstr(b, "t&lt;1&gt;") && !strstr(b, "a<b"),
          "the chart: 5 points with tooltips, names escaped");
    CHECK(b && count(b, "<polyline") == 2, "one line per candidate in the per-layer panel");
    free(b);
    rows[2].score.kl = NAN;
    CHECK(nstf_analyze_svg(path, "t", &r) == NSTF_ERR_INVALID_ARG, "a non-finite KL is refused");
    r.n_rows = 0;
    CHECK(nstf_analyze_svg(path, "t", &r) == NSTF_ERR_INVALID_ARG, "an empty result is refused");
    unlink(path);
}

int main(void) {
    svg_unit();
    if (access(MODEL, R_OK) != 0) {
        printf("test_analyze: %s missing; skipped\n", MODEL);
        return 77;
    }
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.precise = true;
    sp.n_threads = 2;
    sp.n_ctx = 64;
    nstf_session *s = NULL;
    CHECK(nstf_session_open(MODEL, &sp, &s) == NSTF_OK, "open: %s", nstf_last_error());
    if (!s) return test_finish("test_analyze");
    int32_t *ids = NULL;
    int n = 0;
    CHECK(nstf_eval_tokenize(s, k_text, 16, &ids, &n) == NSTF_OK && n == 16, "tokenize: %s", nstf_last_error());
    const int nv = nstf_session_n_vocab(s);
    float *ref = malloc((size_t)n * nv * 4), *after = malloc((size_t)n * nv * 4);
    CHECK(nstf_eval_logprobs(s, ids, n, ref) == NSTF_OK, "reference: %s", nstf_last_error());
    nstf_eval_score base;
    nstf_eval_scores(ref, NULL, ids, n, nv, 0, &base);

    const nstf_type types[] = {NSTF_TYPE_F32, NSTF_TYPE_Q8_0, NSTF_TYPE_Q4_0, NSTF_TYPE_IQ4_XS};
    nstf_analyze_params p = {0};
    p.types = types;
    p.n_types = 4;
    p.lowrank_reduce = nstf_lowrank_available() ? 0.5 : 0;
    p.targets = NSTF_LR_K | NSTF_LR_V;
    p.layer0 = 0, p.layer1 = 1;
    nstf_analyze_result r;
    CHECK(nstf_analyze_run(s, ids, n, &p, &r) == NSTF_OK, "analyze: %s", nstf_last_error());
    const int per = 3 + (p.lowrank_reduce > 0);
    CHECK(r.n_rows == 2 * per, "%d rows (want %d)", r.n_rows, 2 * per);
    CHECK(r.skipped[0] == 0, "no type skipped for want of a quantizer: '%s'", r.skipped);
    CHECK(r.base.ppl == base.ppl, "base perplexity %.6f = %.6f computed directly", r.base.ppl, base.ppl);
    for (int i = 0; i < r.n_rows; i++) {
        const nstf_analyze_row *w = &r.rows[i];
        printf("  %-22s %-18s %5.2f bpw  KL %.3g  ppl %.4f  top-1 %.3f\n", w->tensor, w->candidate, w->bpw,
               w->score.kl, w->score.ppl, w->score.top1);
        CHECK(isfinite(w->score.kl) && w->score.kl > -1e-7 && isfinite(w->score.ppl), "%s %s: KL %g, ppl %g",
              w->tensor, w->candidate, w->score.kl, w->score.ppl);
        if (!strcmp(w->candidate, "F32"))
            CHECK(w->score.kl <= 1e-7 && w->score.top1 == 1.0, "%s F32: KL %.3g (tolerance 1e-7), top-1 %.3f",
                  w->tensor, w->score.kl, w->score.top1);
        if (!strcmp(w->candidate, "Q4_0") && i > 0 && !strcmp(r.rows[i - 1].candidate, "Q8_0"))
            CHECK(w->score.kl > r.rows[i - 1].score.kl, "%s: Q4_0 KL %.3g above Q8_0's %.3g", w->tensor,
                  w->score.kl, r.rows[i - 1].score.kl);
    }
    CHECK(nstf_eval_logprobs(s, ids, n, after) == NSTF_OK && !memcmp(ref, after, (size_t)n * nv * 4),
          "the model is its own again after the analysis");
    nstf_analyze_result_free(&r);
    nstf_session_close(s);
    free(ids), free(ref), free(after);

    /* the command line */
    char tmpl[] = "/tmp/nstf_test_analyze_XXXXXX";
    CHECK(mkdtemp(tmpl) != NULL, "mkdtemp");
    snprintf(g_dir, sizeof g_dir, "%s", tmpl);
    char text_path[300];
    snprintf(text_path, sizeof text_path, "%s/text.txt", g_dir);
    FILE *f = fopen(text_path, "w");
    if (f) fputs(k_text, f), fclose(f);
    char svg_path[300];
    snprintf(svg_path, sizeof svg_path, "%s/s.svg", g_dir);
    const char *args[] = {"analyze", "-m", MODEL, "-f", text_path, "--fast", "--json", "--svg", svg_path,
                          "-t", "2", NULL};
    const int rc = run(args);
    CHECK(rc == 0, "nstf analyze --fast --json --svg: exit %d: %s", rc, g_err);
    char *svg = slurp(svg_path);
    CHECK(svg && !strncmp(svg, "<svg ", 5) && count(svg, "<title>") == count(g_out, "\"tensor\":") &&
              count(svg, "<title>") > 0,
          "the chart has one point per JSON row (%d points, %d rows)", count(svg, "<title>"),
          count(g_out, "\"tensor\":"));
    free(svg);
    CHECK(g_out[0] == '{' && strstr(g_out, "\"rows\": [") && strstr(g_out, "blk.0.attn_output.weight") &&
              strstr(g_out, "\"candidate\": \"Q4_0\""),
          "JSON rows: %.300s", g_out);
    if (nstf_lowrank_available()) CHECK(strstr(g_out, "\"candidate\": \"rank ") != NULL, "the rank candidate's row");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("  (could not remove %s)\n", g_dir);
    return test_finish("test_analyze");
}
