/* cmd_quantize_auto.c — `nstf quantize IN OUT auto --calib TEXT BUDGET`:
 * adaptive precision (src/opt/adaptive.h). Measures each layer matrix's
 * sensitivity to each candidate type over the calibration text (or reads
 * a table saved earlier), chooses a type per matrix under the budget,
 * writes the GGUF, then reopens it and prints its perplexity, KL and top-1
 * against the input model over the evaluation text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli_util.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/adaptive.h"
#include "opt/imatrix.h"

int cmd_quantize_auto(int argc, char **argv);

static const char k_default_types[] = "Q8_0,Q6_K,Q5_K,Q5_1,Q5_0,Q4_K,Q4_1,IQ4_NL,IQ4_XS,Q4_0,Q3_K,Q2_K";

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf quantize IN.gguf OUT.gguf auto --calib TEXT BUDGET [options]\n"
            "\n"
            "Adaptive precision: a type per layer matrix, chosen from each matrix's measured sensitivity\n"
            "(KL divergence of the model with that matrix alone re-quantized, over TEXT) by an exact\n"
            "knapsack under the budget; then OUT is written, reopened and evaluated against IN.\n"
            "\n"
            "BUDGET, exactly one of:\n"
            "      --target-size N[K|M|G]  tensor data of OUT at most N bytes (K/M/G: KiB/MiB/GiB)\n"
            "      --target-bpw B          at most B bits per weight over all tensors\n"
            "      --budget-kl X           least size whose summed KL is at most X (nats/token)\n"
            "      --budget-ppl P[%%]       least size whose perplexity on TEXT rises at most P percent\n"
            "                              (mixes measured in memory, bisection on the KL budget)\n"
            "options:\n"
            "      --calib FILE            calibration text (required)\n"
            "      --calib-tokens N        its tokens used (default 128)\n"
            "      --types LIST            candidate types (default %s;\n"
            "                              each matrix also keeps its own type as a candidate)\n"
            "      --rest TARGET           the rule for the tensors outside the layer matrices\n"
            "                              (default Q4_K_M: output / tied embeddings Q6_K, or Q8_0)\n"
            "      --eval FILE             text of the final check (default: the calibration text)\n"
            "      --eval-tokens N         its tokens (default 512)\n"
            "      --sensitivity FILE      read the sensitivity table from FILE (written by --save-sensitivity)\n"
            "      --save-sensitivity FILE write the measured table (tensor, type, KL per line)\n"
            "      --dry-run               print the plan; write nothing\n"
            "      --imatrix FILE          importance weights of every quantization (nstf imatrix): the\n"
            "                              sensitivities, the mixes and OUT\n"
            "      --allow-requantize      accept a quantized IN (its matrices are then re-quantized from\n"
            "                              their dequantized values)\n"
            "  -t, --threads N             threads (default: the physical cores)\n",
            k_default_types);
}

static bool parse_size(const char *s, uint64_t *out) {
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'K' || *end == 'k') mul = 1024.0, end++;
    else if (*end == 'M' || *end == 'm') mul = 1048576.0, end++;
    else if (*end == 'G' || *end == 'g') mul = 1073741824.0, end++;
    if (end == s || *end || !(v > 0) || v * mul >= 1.8e19) {
        cli_err("--target-size: want a positive byte count (optionally K, M or G), got '%s'", s);
        return false;
    }
    *out = (uint64_t)(v * mul);
    return true;
}

static void sens_progress(void *user, int done, int total, const char *what) {
    cli_stages_cb(user, "sensitivity", done, total, what);
}

static bool save_sens(const char *path, const nstf_analyze_result *r) {
    FILE *f = fopen(path, "w");
    if (!f) {
        cli_err("cannot write %s", path);
        return false;
    }
    fprintf(f, "# nstf sensitivity: tensor, candidate type, KL against the unmodified model; base perplexity %.6f\n",
            r->base.ppl);
    for (int i = 0; i < r->n_rows; i++)
        fprintf(f, "%s\t%s\t%.10g\t%.6f\t%.6f\n", r->rows[i].tensor, r->rows[i].candidate, r->rows[i].score.kl,
                r->rows[i].score.ppl, r->rows[i].score.top1);
    const bool ok = fclose(f) == 0;
    if (!ok) cli_err("writing %s failed", path);
    return ok;
}

static bool load_sens(const char *path, nstf_analyze_result *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f) {
        cli_err("cannot open the sensitivity table %s", path);
        return false;
    }
    char line[512];
    int cap = 0, ln = 0;
    bool ok = true;
    while (ok && fgets(line, sizeof line, f)) {
        ln++;
        if (line[0] == '#' || line[0] == '\n') continue;
        if (r->n_rows == cap) {
            cap = cap ? 2 * cap : 1024;
            nstf_analyze_row *nr = realloc(r->rows, (size_t)cap * sizeof *nr);
            if (!nr) { ok = false; break; }
            r->rows = nr;
        }
        nstf_analyze_row *w = &r->rows[r->n_rows];
        memset(w, 0, sizeof *w);
        nstf_type t;
        if (sscanf(line, "%63s %31s %lf %lf %lf", w->tensor, w->candidate, &w->score.kl, &w->score.ppl,
                   &w->score.top1) != 5 ||
            !nstf_type_from_name(w->candidate, &t) || !isfinite(w->score.kl)) {
            cli_err("%s:%d: want 'tensor type KL perplexity top-1'", path, ln);
            ok = false;
            break;
        }
        r->n_rows++;
    }
    fclose(f);
    if (ok && r->n_rows == 0) cli_err("%s: no rows", path), ok = false;
    if (!ok) free(r->rows), memset(r, 0, sizeof *r);
    return ok;
}

static nstf_status add_keys(void *user, nstf_gguf_writer *w) {
    const nstf_adaptive_plan *plan = user;
    NSTF_TRY(nstf_gguf_writer_set_u32(w, "nstf.adaptive.version", 1));
    NSTF_TRY(nstf_gguf_writer_set_f32(w, "nstf.adaptive.kl_sum", (float)plan->kl_sum));
    return NSTF_OK;
}

static void print_plan(const nstf_adaptive_plan *plan) {
    int count[32] = {0};
    uint64_t bytes[32] = {0};
    for (int i = 0; i < plan->n; i++)
        if ((unsigned)plan->e[i].type < 32) count[plan->e[i].type]++, bytes[plan->e[i].type] += plan->e[i].bytes;
    printf("| type | matrices | MiB |\n|---|---:|---:|\n");
    for (int t = 0; t < 32; t++)
        if (count[t]) printf("| %s | %d | %.2f |\n", nstf_type_name((uint32_t)t), count[t], bytes[t] / 1048576.0);
    printf("\nlayer: types of attn_q attn_k attn_v attn_output ffn_gate ffn_up ffn_down\n");
    for (int i = 0; i < plan->n; i += 7) {
        printf("  %3d:", i / 7);
        for (int k = 0; k < 7 && i + k < plan->n; k++) printf(" %-5s", nstf_type_name(plan->e[i + k].type));
        printf("\n");
    }
    printf("\ntensor data %llu bytes (%.2f MiB), %.4f bits per weight; summed KL %.6g",
           (unsigned long long)plan->total_bytes, plan->total_bytes / 1048576.0,
           8.0 * (double)plan->total_bytes / (double)plan->n_weights, plan->kl_sum);
    if (plan->budget_bytes) printf(" (budget %llu bytes)", (unsigned long long)plan->budget_bytes);
    if (plan->n_measured)
        printf("\nperplexity budget: KL budget %.6g after %d measured mixes; on the calibration text %.4f", plan->budget_kl,
               plan->n_measured, plan->measured.ppl);
    printf("\n");
}

int cmd_quantize_auto(int argc, char **argv) {
    const char *pos[3] = {NULL, NULL, NULL}, *imatrix = NULL, *calib = NULL, *eval = NULL, *sens_in = NULL, *sens_out = NULL;
    int n_pos = 0, calib_tokens = 128, eval_tokens = 512, n_types = 0;
    bool dry = false, allow_requant = false;
    nstf_type types[16];
    nstf_adaptive_params p = {0};
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.n_threads = cli_default_threads();
    if (!cli_parse_types("--types", k_default_types, types, &n_types, 16, true)) return 2;
    nstf_quant_target_parse("Q4_K_M", &p.rest);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        float f;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--calib")) { VAL(); calib = v; }
        else if (!strcmp(a, "--calib-tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &calib_tokens)) return 2; }
        else if (!strcmp(a, "--eval")) { VAL(); eval = v; }
        else if (!strcmp(a, "--eval-tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &eval_tokens)) return 2; }
        else if (!strcmp(a, "--types")) { VAL(); if (!cli_parse_types(a, v, types, &n_types, 16, true)) return 2; }
        else if (!strcmp(a, "--rest")) {
            VAL();
            if (!nstf_quant_target_parse(v, &p.rest)) { cli_err("--rest: unknown target '%s' (%s)", v, nstf_quant_target_list()); return 2; }
        }
        else if (!strcmp(a, "--target-size")) { VAL(); if (!parse_size(v, &p.target_bytes)) return 2; }
        else if (!strcmp(a, "--target-bpw")) { VAL(); if (!cli_parse_float(a, v, 0.5, 64, &f)) return 2; p.target_bpw = f; }
        else if (!strcmp(a, "--budget-kl")) { VAL(); if (!cli_parse_float(a, v, 1e-9, 100, &f)) return 2; p.budget_kl = f; }
        else if (!strcmp(a, "--budget-ppl")) { VAL(); if (!cli_parse_percent(a, v, 1e-6, 1e6, &p.budget_ppl)) return 2; }
        else if (!strcmp(a, "--sensitivity")) { VAL(); sens_in = v; }
        else if (!strcmp(a, "--save-sensitivity")) { VAL(); sens_out = v; }
        else if (!strcmp(a, "--dry-run")) dry = true;
        else if (!strcmp(a, "--allow-requantize")) allow_requant = true;
        else if (!strcmp(a, "--imatrix")) { VAL(); imatrix = v; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            VAL();
            if (!cli_parse_int(a, v, 1, 1024, &sp.n_threads)) return 2;
            cli_check_threads(sp.n_threads);
        }
        else if (a[0] == '-' && a[1]) return cli_unknown_option(a, usage);
        else if (n_pos < 3) pos[n_pos++] = a;
        else { cli_err("too many arguments (IN OUT auto)"); return 2; }
#undef VAL
    }
    const int n_budgets = (p.target_bytes > 0) + (p.target_bpw > 0) + (p.budget_kl > 0) + (p.budget_ppl > 0);
    if (n_pos != 3 || strcasecmp(pos[2], "auto")) { cli_err("need IN OUT auto (see --help)"); return 2; }
    if (!calib) { cli_err("auto needs --calib TEXT: the text the sensitivities are measured on"); return 2; }
    if (n_budgets != 1) {
        cli_err("auto needs exactly one budget: --target-size, --target-bpw, --budget-kl or --budget-ppl (got %d)",
                n_budgets);
        return 2;
    }
    p.types = types;
    p.n_types = n_types;
    cli_stages b;
    cli_stages_init(&b, "sensitivity");
    p.progress = cli_stages_cb;
    p.progress_user = &b;

    int rc = 1, n_cal = 0, n_ev = 0;
    int32_t *cal = NULL, *ev = NULL;
    float *ref = NULL, *lp = NULL;
    nstf_session *s = NULL;
    nstf_analyze_result sens = {0};
    nstf_adaptive_plan plan = {0};
    nstf_quant_override *ov = NULL;
    nstf_imatrix *im = NULL;
    bool sens_malloc = false;
    char *ctext = cli_read_file(calib, "calibration text"), *etext = eval ? cli_read_file(eval, "evaluation text") : NULL;
    if (!ctext || (eval && !etext)) goto done;
    if (imatrix && nstf_imatrix_load(imatrix, &im) != NSTF_OK) goto lib_err;
    p.imatrix = im;
    if (nstf_session_open(pos[0], &sp, &s) != NSTF_OK) goto lib_err;
    if (nstf_eval_tokenize(s, ctext, calib_tokens, &cal, &n_cal) != NSTF_OK) goto lib_err;
    if (nstf_eval_tokenize(s, etext ? etext : ctext, eval_tokens, &ev, &n_ev) != NSTF_OK) goto lib_err;
    if (sens_in) {
        if (!load_sens(sens_in, &sens)) goto done;
        sens_malloc = true;
    } else {
        nstf_analyze_params ap = {0};
        ap.types = types;
        ap.n_types = n_types;
        ap.imatrix = im;
        ap.progress = sens_progress;
        ap.progress_user = &b;
        if (nstf_analyze_run(s, cal, n_cal, &ap, &sens) != NSTF_OK) goto lib_err;
        if (sens_out && !save_sens(sens_out, &sens)) goto done;
    }
    if (nstf_adaptive_plan_make(s, cal, n_cal, &p, &sens, &plan) != NSTF_OK) goto lib_err;
    print_plan(&plan);
    if (dry) {
        rc = 0;
        goto done;
    }
    /* the input's log-probabilities over the evaluation text, then OUT */
    const int nv = nstf_session_n_vocab(s);
    ref = malloc((size_t)n_ev * (size_t)nv * 4);
    lp = malloc((size_t)n_ev * (size_t)nv * 4);
    if (!ref || !lp) { cli_err("out of memory for %d x %d log-probabilities", n_ev, nv); goto done; }
    if (nstf_eval_logprobs(s, ev, n_ev, ref) != NSTF_OK) goto lib_err;
    nstf_session_close(s);
    s = NULL;
    if (!(ov = nstf_adaptive_overrides(&plan))) goto lib_err;
    nstf_quant_params qp = {.target = p.rest, .overrides = ov, .n_overrides = plan.n, .allow_requantize = allow_requant, .imatrix = im,
                            .n_threads = sp.n_threads, .add_keys = add_keys, .add_keys_user = &plan};
    cli_progress wbar;
    cli_progress_init(&wbar, "writing", "MiB", 1.0 / (1 << 20));
    qp.progress = cli_progress_cb;
    qp.progress_user = &wbar;
    const nstf_status wst = nstf_quantize_file(pos[0], pos[1], &qp);
    cli_progress_end(&wbar);
    if (wst != NSTF_OK) goto lib_err;
    if (nstf_session_open(pos[1], &sp, &s) != NSTF_OK) goto lib_err;
    if (nstf_eval_logprobs(s, ev, n_ev, lp) != NSTF_OK) goto lib_err;
    nstf_eval_score base, mix;
    nstf_eval_scores(ref, NULL, ev, n_ev, nv, 0, &base);
    nstf_eval_scores(lp, ref, ev, n_ev, nv, 0, &mix);
    printf("final check (%s, %d tokens, one window): perplexity %.6f, input %.6f (%+.4f%%), KL %.6g, top-1 %.4f\n",
           eval ? eval : calib, n_ev, mix.ppl, base.ppl, 100 * (mix.ppl / base.ppl - 1), mix.kl, mix.top1);
    fprintf(stderr, "nstf quantize: %s -> %s (auto, %.2f MiB of tensor data)\n", pos[0], pos[1],
            plan.total_bytes / 1048576.0);
    rc = 0;
    goto done;
lib_err:
    cli_stages_end(&b);
    cli_lib_err();
done:
    cli_stages_end(&b);
    if (sens_malloc) free(sens.rows), memset(&sens, 0, sizeof sens);
    nstf_analyze_result_free(&sens);
    nstf_adaptive_plan_free(&plan);
    nstf_free(ov);
    nstf_imatrix_free(im);
    free(ref);
    free(lp);
    free(ctext);
    free(etext);
    nstf_free(cal);
    nstf_free(ev);
    nstf_session_close(s);
    return rc;
}
