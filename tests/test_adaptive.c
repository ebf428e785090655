/* test_adaptive.c — adaptive precision end to end (`nstf quantize IN OUT
 * auto`, src/opt/adaptive.h) on a tiny random model from `nstf gen-model`
 * (2 layers, F16) and a generated calibration text, through the CLI:
 *  - size budget (--target-bpw 6, and --target-size at a byte count): the
 *    written file's tensor data is at most the budget, and within the
 *    smallest candidate step of it (the knapsack spends the budget);
 *    matrices have several types; the printed final-check perplexity is
 *    what reloading the file and evaluating it gives (to the 6 decimals
 *    printed);
 *  - the sensitivity table saved by --save-sensitivity and read back by
 *    --sensitivity gives the same plan (the same file bytes), and with
 *    --types Q8_0 only Q8_0 (or the own F16) is chosen from it;
 *  - accuracy budgets: --budget-kl X prints a summed KL <= X; --budget-ppl
 *    P% with the evaluation text equal to the calibration tokens gives a
 *    final-check perplexity change <= P% (the file is the mix measured in
 *    memory, bit for bit, since both quantize the same fp32 values);
 *  - a larger size budget never gives a larger summed KL;
 *  - bad input: no budget, two budgets, no --calib, a budget below the
 *    fixed tensors, an unreadable sensitivity table: one line on stderr. */
#include <unistd.h>

#include "cli_run.h"
#include "opt_test.h"
#include "core/mem.h"
#include "io/gguf.h"
#include "nstf_tools.h"
#include "opt/evaluate.h"

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static uint64_t tensor_bytes(const char *path, int *n_types) {
    nstf_gguf *g;
    if (nstf_gguf_open(path, &g) != NSTF_OK) return 0;
    uint64_t b = 0;
    bool seen[32] = {0};
    *n_types = 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        b += g->tensors[i].n_bytes;
        if (g->tensors[i].n_dims >= 2 && (unsigned)g->tensors[i].type < 32 && !seen[g->tensors[i].type])
            seen[g->tensors[i].type] = true, (*n_types)++;
    }
    nstf_gguf_close(g);
    return b;
}

static double number_after(const char *s, const char *key) {
    const char *p = strstr(s, key);
    return p ? strtod(p + strlen(key), NULL) : NAN;
}


static bool same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        if (x != y) same = false;
        if (x == EOF || y == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_adaptive_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char model[300], calib[300], out[300], out2[300], sens[300], cmd[400];
    path_in(model, sizeof model, "tiny.gguf");
    path_in(calib, sizeof calib, "calib.txt");
    path_in(out, sizeof out, "mix.gguf");
    path_in(out2, sizeof out2, "mix2.gguf");
    path_in(sens, sizeof sens, "sens.tsv");
    /* a calibration text: varied words, so the byte tokenizer sees many ids */
    static char text[8192];
    static const char *const words[] = {"the", "model", "weights", "of", "a", "layer", "quantized", "to", "four",
                                        "bits", "keep", "most", "accuracy", "when", "chosen", "per", "matrix",
                                        "sensitivity", "budget", "size"};
    opt_test_inputs(text, sizeof text, 99, words, 20, calib, model, "5");

    /* size budget in bits per weight */
    int rc = run((const char *const[]){"quantize", model, out, "auto", "--calib", calib, "--calib-tokens", "96",
                                        "--eval-tokens", "200", "--target-bpw", "6", "--save-sensitivity", sens,
                                        "-t", "2", NULL});
    CHECK(rc == 0, "auto --target-bpw 6: exit %d: %s", rc, g_err);
    int n_types = 0;
    const uint64_t bytes = tensor_bytes(out, &n_types);
    uint64_t n_weights = 0;
    {
        nstf_gguf *g;
        CHECK(nstf_gguf_open(model, &g) == NSTF_OK, "open the model");
        for (uint64_t i = 0; i < g->n_tensors; i++) n_weights += g->tensors[i].n_elems;
        nstf_gguf_close(g);
    }
    const uint64_t budget = (uint64_t)(6.0 * (double)n_weights / 8);
    CHECK(bytes > 0 && bytes <= budget, "tensor data %llu bytes within the budget %llu", (unsigned long long)bytes,
          (unsigned long long)budget);
    /* the smallest step between two candidates of a 64 x 64 matrix (Q5_0 -> Q5_1: 128 bytes) bounds the slack
     * only loosely; a budget this far above the smallest mix is spent to within 2% */
    CHECK(bytes >= budget * 0.98, "the budget is spent: %llu of %llu bytes", (unsigned long long)bytes,
          (unsigned long long)budget);
    CHECK(n_types >= 2, "a mix: %d matrix types", n_types);
    const char *check_line = strstr(g_out, "final check");
    const double printed_ppl = check_line ? number_after(check_line, "perplexity ") : NAN;
    const double again = opt_test_reload_ppl(out, text, 200);
    CHECK(fabs(printed_ppl - again) <= 5e-7 * (1 + 1e-9), "printed perplexity %.6f = reloaded %.9f (to the 6 "
          "decimals printed)", printed_ppl, again);
    printf("target-bpw 6: %llu of %llu bytes, %d types, perplexity %.4f\n", (unsigned long long)bytes,
           (unsigned long long)budget, n_types, printed_ppl);
    const double kl_6 = number_after(g_out, "summed KL ");

    /* the saved table reproduces the plan */
    rc = run((const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--calib-tokens", "96",
                                    "--eval-tokens", "200", "--target-bpw", "6", "--sensitivity", sens, "-t", "2", NULL});
    CHECK(rc == 0 && same_file(out, out2), "the saved sensitivity table gives the same file (exit %d: %s)", rc, g_err);

    /* an exact byte budget, larger: no larger summed KL */
    char size_arg[32];
    snprintf(size_arg, sizeof size_arg, "%llu", (unsigned long long)(budget + budget / 5));
    rc = run((const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--sensitivity", sens,
                                    "--target-size", size_arg, "-t", "2", NULL});
    const uint64_t bytes2 = tensor_bytes(out2, &n_types);
    CHECK(rc == 0 && bytes2 <= budget + budget / 5, "--target-size %s: %llu bytes (exit %d: %s)", size_arg,
          (unsigned long long)bytes2, rc, g_err);
    CHECK(number_after(g_out, "summed KL ") <= kl_6, "a larger budget: summed KL %g <= %g",
          number_after(g_out, "summed KL "), kl_6);

    /* a saved table holds more types than asked for: only the asked ones are chosen */
    rc = run((const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--sensitivity", sens,
                                    "--types", "Q8_0", "--target-bpw", "10", "-t", "2", NULL});
    tensor_bytes(out2, &n_types);
    CHECK(rc == 0 && n_types == 2, "--types Q8_0 with a fuller table: %d matrix types (F16 and Q8_0; exit %d: %s)", n_types,
          rc, g_err);

    /* KL budget */
    rc = run((const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--sensitivity", sens,
                                    "--budget-kl", "1e-5", "-t", "2", NULL});
    CHECK(rc == 0 && number_after(g_out, "summed KL ") <= 1e-5, "--budget-kl 1e-5: summed KL %g (exit %d: %s)",
          number_after(g_out, "summed KL "), rc, g_err);

    /* perplexity budget, evaluated on the calibration tokens themselves */
    rc = run((const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--calib-tokens", "96",
                                    "--eval-tokens", "96", "--sensitivity", sens, "--budget-ppl", "0.05%", "-t", "2",
                                    NULL});
    const char *fc = strstr(g_out, "final check");
    const double change = fc ? number_after(fc, "(") : NAN;
    CHECK(rc == 0 && change <= 0.05, "--budget-ppl 0.05%%: final check %+.4f%% (exit %d: %s)", change, rc, g_err);
    printf("budget-ppl 0.05%%: %+.4f%%, %llu bytes\n", change, (unsigned long long)tensor_bytes(out2, &n_types));

    /* bad input */
    expect_error("no budget", "exactly one budget",
                 (const char *const[]){"quantize", model, out2, "auto", "--calib", calib, NULL});
    expect_error("two budgets", "exactly one budget",
                 (const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--target-bpw", "5",
                                       "--budget-kl", "0.1", NULL});
    expect_error("no calibration", "--calib",
                 (const char *const[]){"quantize", model, out2, "auto", "--target-bpw", "5", NULL});
    expect_error("budget too small", "does not hold",
                 (const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--sensitivity", sens,
                                       "--target-size", "1000", NULL});
    expect_error("bad table", "want 'tensor type KL",
                 (const char *const[]){"quantize", model, out2, "auto", "--calib", calib, "--sensitivity", calib,
                                       "--target-bpw", "5", NULL});
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_adaptive");
}
