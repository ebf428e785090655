/* test_optimize.c — the planner (`nstf optimize`, src/opt/plan.h) end to
 * end on a tiny random model from `nstf gen-model` (2 layers, F16) and a
 * generated text, through the CLI:
 *  - types only (--lowrank 0), budget 1%: the output reloads; its
 *    perplexity, recomputed here from the file, equals the one printed
 *    (to the 6 decimals printed) and is within the budget of the
 *    original's; nstf.plan.strategy holds one string per layer naming all
 *    seven matrices and "attn=dense"; nstf.plan.attn_sparse one 0 per
 *    layer (--allow-sparse with the default configurations: 96 tokens do
 *    not reach past top-k 8 x 16 + 64, so every layer stays dense and
 *    the note says why); the trade-off table has the original, the pure
 *    strategies and the plan;
 *  - sparse attention measured (--allow-sparse --sparse-attn 2,8
 *    --sparse-block 4: decode steps from position 24 drop blocks): at
 *    least one layer sparse, the strategies' "attn=sparse" match the
 *    nstf.plan.attn_sparse flags, nstf.plan.sparse_topk / _block /
 *    _window are 2 / 4 / 8; the every-layer-sparse row's decode KL is > 0
 *    (blocks were dropped) while its teacher-forced perplexity equals the
 *    original's (sparse attention acts on one-token steps only); the
 *    written file's decode perplexity, recomputed here from a fresh
 *    session on the file (its plan applied by the session), equals the
 *    plan's printed in memory, within the budget of the original's;
 *  - with the low-rank candidate (skipped without LAPACKE): --types BF16
 *    and a loose budget make every matrix factorized (F16 factors are
 *    smaller than BF16 at 30% fewer parameters); the file holds lr_a /
 *    lr_b factors and no dense layer matrix, the strategies say "rank",
 *    and it reloads to the printed perplexity;
 *  - bad input: no budget, no output: one line on stderr. */
#include <unistd.h>

#include "cli_run.h"
#include "opt_test.h"
#include "core/mem.h"
#include "io/gguf.h"
#include "nstf_tools.h"
#include "opt/evaluate.h"
#include "opt/lowrank.h"
#include "opt/plan.h"

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }


/* The plan's keys: strategy strings (each containing `want` for every
 * layer, and "attn=sparse" exactly where nstf.plan.attn_sparse is 1);
 * counts of sparse layers, factor tensors and dense layer matrices; the
 * sparse configuration keys (0 when absent). */
static void check_keys(const char *path, const char *want, int *n_sparse, int *n_factors, int *n_dense, int cfg[3]) {
    nstf_gguf *g;
    *n_sparse = *n_factors = *n_dense = 0;
    CHECK(nstf_gguf_open(path, &g) == NSTF_OK, "open %s: %s", path, nstf_last_error());
    if (!g) return;
    const nstf_gguf_kv *st = NULL, *sp = NULL;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (nstf_gguf_str_eq(g->kv[i].key, "nstf.plan.strategy")) st = &g->kv[i];
        if (nstf_gguf_str_eq(g->kv[i].key, "nstf.plan.attn_sparse")) sp = &g->kv[i];
    }
    cfg[0] = (int)nstf_gguf_get_u32_or(g, "nstf.plan.sparse_topk", 0);
    cfg[1] = (int)nstf_gguf_get_u32_or(g, "nstf.plan.sparse_block", 0);
    cfg[2] = (int)nstf_gguf_get_u32_or(g, "nstf.plan.sparse_window", 0);
    CHECK(st && st->type == NSTF_GGUF_ARRAY && st->arr_type == NSTF_GGUF_STRING && st->arr_n == 2,
          "nstf.plan.strategy: a string per layer");
    CHECK(sp && sp->type == NSTF_GGUF_ARRAY && sp->arr_type == NSTF_GGUF_UINT8 && sp->arr_n == 2,
          "nstf.plan.attn_sparse: a u8 per layer");
    if (st && st->arr_n == 2 && st->arr_strs && sp && sp->arr_n == 2) {
        const uint8_t *v = sp->arr_data;
        for (int l = 0; l < 2; l++) {
            const nstf_gguf_str *e = &st->arr_strs[l];
            char buf[512] = {0};
            memcpy(buf, e->ptr, e->len < sizeof buf - 1 ? (size_t)e->len : sizeof buf - 1);
            CHECK(v[l] <= 1, "attn_sparse[%d] = %u", l, v[l]);
            *n_sparse += v[l] == 1;
            /* "=Q": a quantized type (IQ4_NL's name too) */
            const bool has = strstr(buf, want) || (!strcmp(want, "=Q") && strstr(buf, "=IQ"));
            CHECK(strstr(buf, "attn_q=") && strstr(buf, "ffn_down=") && has &&
                      strstr(buf, v[l] ? "attn=sparse" : "attn=dense"),
                  "layer %d strategy '%s' (want '%s', flag %u)", l, buf, want, v[l]);
        }
    }
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        char name[128] = {0};
        memcpy(name, g->tensors[i].name.ptr, g->tensors[i].name.len < 127 ? g->tensors[i].name.len : 127);
        if (strstr(name, ".lr_a.") || strstr(name, ".lr_b.")) (*n_factors)++;
        else if (!strncmp(name, "blk.", 4) && g->tensors[i].n_dims == 2) (*n_dense)++;
    }
    nstf_gguf_close(g);
}

/* The value in column `col` (0: the strategy name) of the table row named `row`. */
static double cell(const char *out, const char *row, int col) {
    char key[96];
    snprintf(key, sizeof key, "| %s |", row);
    const char *p = strstr(out, key);
    if (!p) return NAN;
    p += 1;
    for (int c = 0; c < col; c++) {
        p = strchr(p, '|');
        if (!p) return NAN;
        p++;
    }
    return strtod(p, NULL);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_optimize_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char model[300], textf[300], out[300], cmd[400];
    path_in(model, sizeof model, "tiny.gguf");
    path_in(textf, sizeof textf, "text.txt");
    path_in(out, sizeof out, "plan.gguf");
    static char text[8192];
    static const char *const words[] = {"plan", "each", "layer", "under", "a", "budget", "of", "perplexity",
                                        "rank", "type", "size", "speed", "the", "matrix", "is", "kept"};
    opt_test_inputs(text, sizeof text, 7, words, 16, textf, model, "3");

    /* types only */
    int rc = run((const char *const[]){"optimize", "-m", model, "-f", textf, "-n", "96", "--budget-ppl", "1%",
                                        "--lowrank", "0", "--allow-sparse", "-o", out, "-t", "2", NULL});
    CHECK(rc == 0, "optimize: exit %d: %s", rc, g_err);
    const char *w = strstr(g_out, "written: ");
    const double printed = w && strstr(w, "perplexity ") ? strtod(strstr(w, "perplexity ") + 11, NULL) : NAN;
    const double orig = w && strstr(w, "(original ") ? strtod(strstr(w, "(original ") + 10, NULL) : NAN;
    const double again = opt_test_reload_ppl(out, text, 96);
    CHECK(fabs(printed - again) <= 5e-7 * (1 + 1e-9), "printed perplexity %.6f = reloaded %.9f", printed, again);
    CHECK(again <= orig * 1.01, "within the budget: %.6f <= 1.01 x %.6f", again, orig);
    CHECK(strstr(g_out, "| original |") && strstr(g_out, "| all Q8_0 |") && strstr(g_out, "| plan (in memory) |") &&
              strstr(g_out, "| plan (written file) |"),
          "the trade-off table's rows: %s", g_out);
    CHECK(strstr(g_out, "sparse attention not measured: 96 tokens") != NULL, "too short for sparse: the note says so");
    int n_sp, n_fact, n_dense, cfg[3];
    check_keys(out, "=Q", &n_sp, &n_fact, &n_dense, cfg);
    CHECK(n_sp == 0 && cfg[0] == 0, "too short: every layer dense (%d sparse), no configuration keys", n_sp);
    CHECK(n_fact == 0 && n_dense == 14, "types only: %d factors, %d dense matrices", n_fact, n_dense);
    printf("types only: perplexity %.4f (original %.4f)\n", again, orig);

    /* sparse attention measured: top-k 2 blocks of 4, window 8 (reach: 2 x 4 + 8 + 2 x 4 = 24) */
    rc = run((const char *const[]){"optimize", "-m", model, "-f", textf, "-n", "96", "--budget-ppl", "1%", "--lowrank",
                                    "0", "--allow-sparse", "--sparse-attn", "2,8", "--sparse-block", "4", "-o", out,
                                    "-t", "2", NULL});
    CHECK(rc == 0, "optimize --allow-sparse: exit %d: %s", rc, g_err);
    check_keys(out, "=Q", &n_sp, &n_fact, &n_dense, cfg);
    CHECK(n_sp >= 1, "at least one layer sparse: %d", n_sp);
    CHECK(cfg[0] == 2 && cfg[1] == 4 && cfg[2] == 8, "sparse keys: top-k %d, block %d, window %d", cfg[0], cfg[1],
          cfg[2]);
    const char *all_sp = "all layers sparse (top-k 2)";
    CHECK(cell(g_out, all_sp, 8) > 0, "every layer sparse: decode KL %g > 0 (blocks dropped)", cell(g_out, all_sp, 8));
    CHECK(cell(g_out, all_sp, 3) == cell(g_out, "original", 3), "every layer sparse: teacher-forced perplexity %g = "
          "the original's %g", cell(g_out, all_sp, 3), cell(g_out, "original", 3));
    const double dec_mem = cell(g_out, "plan (in memory)", 7), dec_orig = cell(g_out, "original", 7);
    const double dec_file = opt_test_reload_ppl_at(out, text, 96, 24);
    CHECK(fabs(dec_mem - dec_file) <= 5e-5 * dec_mem, "decode perplexity: in memory %.4f, the reloaded file %.6f",
          dec_mem, dec_file);
    CHECK(dec_file <= dec_orig * 1.01 + 1e-4, "decode perplexity within the budget: %.6f <= 1.01 x %.4f", dec_file,
          dec_orig);
    w = strstr(g_out, "\ndecode perplexity ");
    const double dec_printed = w ? strtod(w + 19, NULL) : NAN;
    CHECK(fabs(dec_printed - dec_file) <= 5e-7 * (1 + 1e-9), "printed %.6f = reloaded %.9f", dec_printed,
          dec_file);
    printf("sparse: %d of 2 layers, decode perplexity %.4f (original %.4f)\n", n_sp, dec_file, dec_orig);

    /* the low-rank candidate, made the smallest one */
    if (nstf_lowrank_available()) {
        rc = run((const char *const[]){"optimize", "-m", model, "-f", textf, "-n", "96", "--budget-ppl", "50",
                                        "--types", "BF16", "--lowrank", "0.3", "-o", out, "-t", "2", NULL});
        CHECK(rc == 0, "optimize with low-rank: exit %d: %s", rc, g_err);
        w = strstr(g_out, "written: ");
        const double p2 = w && strstr(w, "perplexity ") ? strtod(strstr(w, "perplexity ") + 11, NULL) : NAN;
        const double a2 = opt_test_reload_ppl(out, text, 96);
        CHECK(fabs(p2 - a2) <= 5e-7 * (1 + 1e-9), "factorized: printed perplexity %.6f = reloaded %.9f", p2, a2);
        check_keys(out, "=rank", &n_sp, &n_fact, &n_dense, cfg);
        CHECK(n_fact == 28 && n_dense == 0, "every matrix factorized: %d factors, %d dense", n_fact, n_dense);
        printf("low-rank: perplexity %.4f\n", a2);
    } else {
        printf("no LAPACKE: the low-rank part is not run\n");
    }

    expect_error("no budget", "--budget-ppl",
                 (const char *const[]){"optimize", "-m", model, "-f", textf, "-o", out, NULL});
    expect_error("no output", "-o OUT",
                 (const char *const[]){"optimize", "-m", model, "-f", textf, "--budget-ppl", "1", NULL});
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_optimize");
}
