/* opt_test.h — what the optimization tests (test_adaptive, test_optimize)
 * share: a generated text of random words, and the perplexity of a model
 * file recomputed the way their commands' final checks compute it. */
#ifndef NSTF_TEST_OPT_TEST_H
#define NSTF_TEST_OPT_TEST_H

#include "cli_run.h"
#include "core/mem.h"
#include "nstf_tools.h"
#include "opt/evaluate.h"
#include "opt/plan.h"
#include "test_util.h"

/* About n_chars of words drawn from words[n_words], into text [cap]. */
static inline void opt_test_text(char *text, size_t cap, size_t n_chars, uint64_t seed, const char *const *words,
                                 int n_words) {
    size_t k = 0;
    test_rng r = {seed};
    text[0] = 0;
    while (k < n_chars && k < cap - 64) k += (size_t)snprintf(text + k, cap - k, "%s ", words[rng_next(&r) % (uint64_t)n_words]);
}

/* The CLI tests' inputs: about 3000 characters of words[n_words] (seed
 * text_seed) into text [cap] and the file textf, and a tiny F16 model from
 * `nstf gen-model` (seed model_seed) at model; false after a failed CHECK. */
static inline bool opt_test_inputs(char *text, size_t cap, uint64_t text_seed, const char *const *words, int n_words,
                                   const char *textf, const char *model, const char *model_seed) {
    opt_test_text(text, cap, 3000, text_seed, words, n_words);
    FILE *f = fopen(textf, "w");
    CHECK(f != NULL, "write %s", textf);
    if (!f) return false;
    fputs(text, f);
    fclose(f);
    const int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f16", "--seed", model_seed,
                                             "-o", model, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    return rc == 0;
}

/* Perplexity of `model` over the first n_tok tokens of text (CPU, one
 * window), as `nstf quantize auto` / `nstf optimize` print it; with
 * decode_first > 0, that of the planner's decode evaluation (one-token
 * steps from decode_first; a file's sparse plan is applied by the
 * session). */
static inline double opt_test_reload_ppl_at(const char *model, const char *text, int n_tok, int decode_first) {
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    sp.n_threads = 2;
    nstf_session *s;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) return NAN;
    int32_t *ids = NULL;
    int n = 0;
    double ppl = NAN;
    if (nstf_eval_tokenize(s, text, n_tok, &ids, &n) == NSTF_OK && n > decode_first) {
        float *lp = malloc((size_t)n * (size_t)nstf_session_n_vocab(s) * 4);
        nstf_eval_score sc;
        const nstf_status st = !lp               ? NSTF_ERR_OOM
                               : decode_first > 0 ? nstf_plan_decode_eval(s, ids, n, decode_first, NULL, lp, &sc, NULL)
                                                  : nstf_eval_logprobs(s, ids, n, lp);
        if (st == NSTF_OK) {
            if (decode_first == 0) nstf_eval_scores(lp, NULL, ids, n, nstf_session_n_vocab(s), 0, &sc);
            ppl = sc.ppl;
        }
        free(lp);
    }
    nstf_free(ids);
    nstf_session_close(s);
    return ppl;
}

static inline double opt_test_reload_ppl(const char *model, const char *text, int n_tok) {
    return opt_test_reload_ppl_at(model, text, n_tok, 0);
}

#endif
