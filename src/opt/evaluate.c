/* evaluate.c — a text's tokens, every position's log-probabilities, and
 * NLL / perplexity / KL / top-1 scores (evaluate.h). */
#include "opt/evaluate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"

nstf_status nstf_eval_tokenize(nstf_session *s, const char *text, int max_tokens, int32_t **ids, int *n) {
    *ids = NULL;
    *n = 0;
    int32_t *all = NULL;
    int64_t n_all = 0;
    NSTF_TRY(nstf_tokenizer_encode(s->tok, text, strlen(text), nstf_tokenizer_wants_bos(s->tok), false, &all,
                                   &n_all));
    int64_t keep = n_all < s->n_ctx ? n_all : s->n_ctx;
    if (max_tokens > 0 && keep > max_tokens) keep = max_tokens;
    if (keep < 2) {
        free(all);
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "the text has %lld tokens; scoring needs at least 2",
                              (long long)n_all);
    }
    *ids = nstf_alloc((size_t)keep * sizeof **ids, "token ids");
    if (*ids) memcpy(*ids, all, (size_t)keep * sizeof **ids);
    free(all);
    if (!*ids) return NSTF_ERR_OOM;
    *n = (int)keep;
    return NSTF_OK;
}

void nstf_eval_log_softmax(float *row, int64_t n) {
    float mx = row[0];
    for (int64_t i = 1; i < n; i++) mx = row[i] > mx ? row[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)row[i] - mx);
    const float lse = (float)(mx + log(sum));
    for (int64_t i = 0; i < n; i++) row[i] -= lse;
}

nstf_status nstf_eval_logprobs(nstf_session *s, const int32_t *ids, int n, float *logp) {
    NSTF_TRY(nstf_session_eval_all(s, ids, n, logp));
    const int64_t nv = s->model->cfg.n_vocab;
    for (int t = 0; t < n; t++) nstf_eval_log_softmax(logp + (int64_t)t * nv, nv);
    return NSTF_OK;
}

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

void nstf_eval_scores(const float *logp, const float *ref, const int32_t *ids, int n, int n_vocab, int first,
                      nstf_eval_score *out) {
    double nll = 0, kl = 0;
    int agree = 0, m = 0;
    for (int t = first < 0 ? 0 : first; t + 1 < n; t++, m++) {
        const float *lp = logp + (int64_t)t * n_vocab;
        nll -= lp[ids[t + 1]];
        if (!ref) continue;
        const float *lr = ref + (int64_t)t * n_vocab;
        double k = 0;
        for (int i = 0; i < n_vocab; i++) k += exp((double)lr[i]) * ((double)lr[i] - lp[i]);
        kl += k;
        agree += argmax(lp, n_vocab) == argmax(lr, n_vocab);
    }
    out->n_scored = m;
    out->nll = m ? nll / m : 0;
    out->ppl = exp(out->nll);
    out->kl = m && ref ? kl / m : 0;
    out->top1 = m && ref ? (double)agree / m : 1;
}
