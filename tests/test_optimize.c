/* test_optimize.c — the planner (`nstf optimize`, src/opt/plan.h) end to
 * end on a tiny random model from `nstf gen-model` (2 layers, F16) and a
 * generated text, through the CLI:
 *  - types only (--lowrank 0), budget 1%: the output reloads; its
 *    perplexity, recomputed here from the file, equals the one printed
 *    (to the 6 decimals printed) and is within the budget of the
 *    original's; nstf.plan.strategy holds one string per layer naming all
 *    seven matrices and "attn=dense"; nstf.plan.attn_sparse one 0 per
 *    layer (--allow-sparse: still dense, and the note says why); the
 *    trade-off table has the original, the pure strategies and the plan;
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

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }


/* The plan's keys: strategy strings (each containing `want` for every
 * layer), attn_sparse all 0; counts of factor tensors and dense layer
 * matrices. */
static void check_keys(const char *path, const char *want, int *n_factors, int *n_dense) {
    nstf_gguf *g;
    *n_factors = *n_dense = 0;
    CHECK(nstf_gguf_open(path, &g) == NSTF_OK, "open %s: %s", path, nstf_last_error());
    if (!g) return;
    const nstf_gguf_kv *st = NULL, *sp = NULL;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        if (nstf_gguf_str_eq(g->kv[i].key, "nstf.plan.strategy")) st = &g->kv[i];
        if (nstf_gguf_str_eq(g->kv[i].key, "nstf.plan.attn_sparse")) sp = &g->kv[i];
    }
    CHECK(st && st->type == NSTF_GGUF_ARRAY && st->arr_type == NSTF_GGUF_STRING && st->arr_n == 2,
          "nstf.plan.strategy: a string per layer");
    CHECK(sp && sp->type == NSTF_GGUF_ARRAY && sp->arr_type == NSTF_GGUF_UINT8 && sp->arr_n == 2,
          "nstf.plan.attn_sparse: a u8 per layer");
    if (sp && sp->arr_n == 2) {
        const uint8_t *v = sp->arr_data;
        CHECK(v[0] == 0 && v[1] == 0, "every layer dense (%u %u)", v[0], v[1]);
    }
    if (st && st->arr_n == 2 && st->arr_strs) {
        for (int l = 0; l < 2; l++) {
            const nstf_gguf_str *e = &st->arr_strs[l];
            char buf[512] = {0};
            memcpy(buf, e->ptr, e->len < sizeof buf - 1 ? (size_t)e->len : sizeof buf - 1);
            CHECK(strstr(buf, "attn_q=") && strstr(buf, "ffn_down=") && strstr(buf, "attn=dense") && strstr(buf, want),
                  "layer %d strategy '%s' (want '%s')", l, buf, want);
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
    opt_test_text(text, sizeof text, 3000, 7, words, 16);
    FILE *f = fopen(textf, "w");
    fputs(text, f);
    fclose(f);
    CHECK(run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f16", "--seed", "3", "-o", model, NULL}) == 0,
          "gen-model: %s", g_err);

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
    CHECK(strstr(g_out, "sparse attention: not measured") != NULL, "--allow-sparse is answered in the note");
    int n_fact, n_dense;
    check_keys(out, "=Q", &n_fact, &n_dense);
    CHECK(n_fact == 0 && n_dense == 14, "types only: %d factors, %d dense matrices", n_fact, n_dense);
    printf("types only: perplexity %.4f (original %.4f)\n", again, orig);

    /* the low-rank candidate, made the smallest one */
    if (nstf_lowrank_available()) {
        rc = run((const char *const[]){"optimize", "-m", model, "-f", textf, "-n", "96", "--budget-ppl", "50",
                                        "--types", "BF16", "--lowrank", "0.3", "-o", out, "-t", "2", NULL});
        CHECK(rc == 0, "optimize with low-rank: exit %d: %s", rc, g_err);
        w = strstr(g_out, "written: ");
        const double p2 = w && strstr(w, "perplexity ") ? strtod(strstr(w, "perplexity ") + 11, NULL) : NAN;
        const double a2 = opt_test_reload_ppl(out, text, 96);
        CHECK(fabs(p2 - a2) <= 5e-7 * (1 + 1e-9), "factorized: printed perplexity %.6f = reloaded %.9f", p2, a2);
        check_keys(out, "=rank", &n_fact, &n_dense);
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
