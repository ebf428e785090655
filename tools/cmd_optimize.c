/* cmd_optimize.c — `nstf optimize -m IN -f TEXT --budget-ppl P% -o OUT`:
 * the planner (src/opt/plan.h). Chooses per layer matrix a type or a
 * low-rank factorization and (--allow-sparse) per layer the attention
 * under the perplexity budget, prints the plan and the trade-off table
 * (size, perplexity, KL, top-1, tokens/s of the evaluation forward, the
 * decode evaluation's perplexity / KL and one-token steps per second, for
 * the original, each pure strategy and the plan), writes OUT, then
 * reloads it and prints its own row: what the file gives. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "core/clock.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/imatrix.h"
#include "opt/plan.h"

int cmd_optimize(int argc, char **argv);

static void usage(FILE *f) {
    fprintf(f,
            "usage: nstf optimize -m IN.gguf -f TEXT --budget-ppl P[%%] -o OUT.gguf [options]\n"
            "\n"
            "Per layer matrix a tensor type or a low-rank factorization (activation-aware SVD), chosen from\n"
            "measured sensitivities so that the perplexity on TEXT rises at most P percent, with the least\n"
            "size; per layer the attention kind (dense, or sparse with --allow-sparse). Prints the trade-off\n"
            "table and writes OUT with the plan in its metadata (nstf.plan.strategy, nstf.plan.attn_sparse,\n"
            "nstf.plan.sparse_topk / _block / _window).\n"
            "\n"
            "  -m, --model FILE      input GGUF (best F32/F16/BF16)\n"
            "  -f, --file FILE       the text: sensitivities, the budget and the table are measured on it\n"
            "  -n, --tokens N        its tokens used (default 128)\n"
            "  -o, --output FILE     the optimized GGUF\n"
            "      --budget-ppl P    perplexity budget in percent (a trailing %% is accepted)\n"
            "      --calib FILE      calibration text of the factorization (default: TEXT)\n"
            "      --lowrank R       the low-rank candidate removes fraction R of each matrix's parameters\n"
            "                        (default 0.3; 0: types only)\n"
            "      --types LIST      candidate types (default Q8_0,Q6_K,Q5_K,Q5_1,Q5_0,Q4_K,Q4_1,IQ4_NL,IQ4_XS,Q4_0,Q3_K,Q2_K)\n"
            "      --imatrix FILE    importance weights of every quantization (nstf imatrix)\n"
            "      --rest TARGET     the rule of the tensors outside the layer matrices (default Q4_K_M)\n"
            "      --allow-sparse    let layers take sparse decode attention: measured by decode steps past\n"
            "                        the first position where a step drops blocks (top-k x block + window\n"
            "                        + 2 blocks; TEXT must reach 8 tokens beyond it, else every layer\n"
            "                        stays dense and the note says so)\n"
            "      --sparse-attn K[,W] the one sparse configuration measured: top-k blocks K, window W\n"
            "                        (default: top-k 8, 16 and 32, window 64, the planner picks)\n"
            "      --sparse-block B  positions per block (4..64, default 16)\n"
            "      --sparse-share F  fraction of the budget left to sparse attention (default 0.5)\n"
            "  -t, --threads N       CPU threads (default: the physical cores)\n");
}

static void print_row(const nstf_plan_row *r, uint64_t n_weights, bool scored) {
    printf("| %s | %.2f | %.3f | %.4f | %.6f | %.3f | %.1f |", r->name, r->bytes / 1048576.0,
           8.0 * (double)r->bytes / (double)n_weights, r->score.ppl, r->score.kl, r->score.top1, r->tok_s);
    if (scored) printf(" %.4f | %.6f |", r->decode.ppl, r->decode.kl);
    printf(" %.1f |\n", r->decode_tok_s);
}

int cmd_optimize(int argc, char **argv) {
    const char *model = NULL, *file = NULL, *out = NULL, *calib = NULL, *imatrix = NULL;
    int n_tok = 128, n_types = 0;
    float f;
    nstf_type types[16];
    nstf_plan_params p = {0};
    p.lowrank_reduce = 0.3;
    p.sparse_share = -1;
    nstf_quant_target_parse("Q4_K_M", &p.rest);
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.n_threads = cli_default_threads();
    const char *type_list = "Q8_0,Q6_K,Q5_K,Q5_1,Q5_0,Q4_K,Q4_1,IQ4_NL,IQ4_XS,Q4_0,Q3_K,Q2_K";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
#define VAL() do { if (!(v = cli_value(argc, argv, &i))) return 2; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { VAL(); model = v; }
        else if (!strcmp(a, "-f") || !strcmp(a, "--file")) { VAL(); file = v; }
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) { VAL(); out = v; }
        else if (!strcmp(a, "-n") || !strcmp(a, "--tokens")) { VAL(); if (!cli_parse_int(a, v, 2, 1 << 20, &n_tok)) return 2; }
        else if (!strcmp(a, "--calib")) { VAL(); calib = v; }
        else if (!strcmp(a, "--lowrank")) { VAL(); if (!cli_parse_float(a, v, 0, 0.999, &f)) return 2; p.lowrank_reduce = f; }
        else if (!strcmp(a, "--types")) { VAL(); type_list = v; }
        else if (!strcmp(a, "--rest")) {
            VAL();
            if (!nstf_quant_target_parse(v, &p.rest)) { cli_err("--rest: unknown target '%s' (%s)", v, nstf_quant_target_list()); return 2; }
        }
        else if (!strcmp(a, "--budget-ppl")) { VAL(); if (!cli_parse_percent(a, v, 1e-6, 1e6, &p.budget_ppl)) return 2; }
        else if (!strcmp(a, "--allow-sparse")) p.allow_sparse = true;
        else if (!strcmp(a, "--imatrix")) { VAL(); imatrix = v; }
        else if (!strcmp(a, "--sparse-attn")) { VAL(); if (!cli_parse_sparse(a, v, &p.sparse_topk, &p.sparse_window)) return 2; }
        else if (!strcmp(a, "--sparse-block")) { VAL(); if (!cli_parse_int(a, v, 4, 64, &p.sparse_block)) return 2; }
        else if (!strcmp(a, "--sparse-share")) { VAL(); if (!cli_parse_float(a, v, 0, 0.95f, &f)) return 2; p.sparse_share = f; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) { VAL(); if (!cli_parse_threads(a, v, &sp.n_threads)) return 2; }
        else return cli_unknown_option(a, usage);
#undef VAL
    }
    if (!model || !file || !out) { cli_err("need -m IN, -f TEXT and -o OUT (see --help)"); return 2; }
    if (!(p.budget_ppl > 0)) { cli_err("need --budget-ppl P (percent)"); return 2; }
    if (!cli_parse_types("--types", type_list, types, &n_types, 16, true)) return 2;
    p.types = types;
    p.n_types = n_types;
    cli_stages b;
    cli_stages_init(&b, "sensitivity");
    p.progress = cli_stages_cb;
    p.progress_user = &b;
    int rc = 1, n = 0, n_cal = 0;
    int32_t *ids = NULL, *cal = NULL;
    float *ref = NULL, *lp = NULL, *ref_dec = NULL;
    nstf_session *s = NULL;
    nstf_plan plan = {0};
    nstf_imatrix *im = NULL;
    char *text = cli_read_file(file, "text"), *ctext = calib ? cli_read_file(calib, "calibration text") : NULL;
    if (!text || (calib && !ctext)) goto done;
    if (imatrix && nstf_imatrix_load(imatrix, &im) != NSTF_OK) goto lib_err;
    p.imatrix = im;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) goto lib_err;
    if (nstf_eval_tokenize(s, text, n_tok, &ids, &n) != NSTF_OK) goto lib_err;
    if (nstf_eval_tokenize(s, ctext ? ctext : text, 512, &cal, &n_cal) != NSTF_OK) goto lib_err;
    p.calib = cal;
    p.n_calib = n_cal;
    if (nstf_plan_make(s, ids, n, &p, &plan) != NSTF_OK) goto lib_err;
    printf("plan: perplexity budget %+.3f%% on %s (%d tokens); KL budget %.6g after %d measured mixes\n",
           100 * p.budget_ppl, file, n, plan.mix.budget_kl, plan.mix.n_measured);
    if (plan.note[0]) printf("note: %s\n", plan.note);
    for (int l = 0; l < plan.n_layers; l++) printf("  layer %2d: %s\n", l, plan.strategy[l]);
    const bool scored = plan.decode_scored;
    printf("\n(measured on this machine, %d threads: prefill tokens/s of the evaluation forward of the %d tokens\n"
           "with its log-softmax; decode tokens/s of one-token steps at positions %d..%d after a prefill of %d%s)\n",
           sp.n_threads, n, plan.decode_first, n - 1, plan.decode_first,
           scored ? "; decode perplexity and KL: those steps' predictions, against the original's dense steps" : "");
    printf("\n| strategy | MiB | bits/weight | perplexity | KL | top-1 | prefill tokens/s |%s decode tokens/s |\n"
           "|---|---:|---:|---:|---:|---:|---:|%s---:|\n",
           scored ? " decode perplexity | decode KL |" : "", scored ? "---:|---:|" : "");
    for (int i = 0; i < plan.n_rows; i++) print_row(&plan.rows[i], plan.mix.n_weights, scored);
    /* the input's log-probabilities, then the written file's */
    const int nv = nstf_session_n_vocab(s);
    const int first = plan.decode_first;
    nstf_eval_score dsc;
    ref = malloc((size_t)n * (size_t)nv * 4);
    lp = malloc((size_t)n * (size_t)nv * 4);
    ref_dec = malloc((size_t)(n - first) * (size_t)nv * 4);
    if (!ref || !lp || !ref_dec) { cli_err("out of memory"); goto done; }
    if (nstf_eval_logprobs(s, ids, n, ref) != NSTF_OK) goto lib_err;
    if (nstf_plan_decode_eval(s, ids, n, first, NULL, ref_dec, &dsc, NULL) != NSTF_OK) goto lib_err;
    if (nstf_plan_write(s, &plan, &p, model, out) != NSTF_OK) goto lib_err;
    nstf_plan_detach(&plan);
    nstf_session_close(s);
    s = NULL;
    if (nstf_session_open(out, &sp, &s) != NSTF_OK) goto lib_err;
    if (nstf_eval_logprobs(s, ids, n, lp) != NSTF_OK) goto lib_err; /* warm-up: the mapping's first touch */
    const double t1 = nstf_time_ms();
    if (nstf_eval_logprobs(s, ids, n, lp) != NSTF_OK) goto lib_err;
    nstf_plan_row fr = {.bytes = plan.mix.total_bytes, .tok_s = 1e3 * n / (nstf_time_ms() - t1)};
    snprintf(fr.name, sizeof fr.name, "plan (written file)");
    nstf_eval_scores(lp, ref, ids, n, nv, 0, &fr.score);
    /* the file's own sparse layers (its plan) run these steps */
    if (nstf_plan_decode_eval(s, ids, n, first, ref_dec, lp, &fr.decode, &fr.decode_tok_s) != NSTF_OK) goto lib_err;
    print_row(&fr, plan.mix.n_weights, scored);
    const nstf_plan_row *pm = &plan.rows[plan.n_rows - 1];
    printf("\nwritten: %s, perplexity %.6f (original %.6f, %+.4f%%)\n", out, fr.score.ppl, plan.rows[0].score.ppl,
           100 * (fr.score.ppl / plan.rows[0].score.ppl - 1));
    if (scored)
        printf("decode perplexity %.6f (plan in memory %.6f; original %.6f, %+.4f%%)\n", fr.decode.ppl, pm->decode.ppl,
               plan.rows[0].decode.ppl, 100 * (fr.decode.ppl / plan.rows[0].decode.ppl - 1));
    rc = 0;
    goto done;
lib_err:
    cli_stages_end(&b);
    cli_lib_err();
done:
    cli_stages_end(&b);
    nstf_plan_free(&plan);
    nstf_imatrix_free(im);
    free(ref);
    free(lp);
    free(ref_dec);
    free(text);
    free(ctext);
    nstf_free(ids);
    nstf_free(cal);
    nstf_session_close(s);
    return rc;
}
