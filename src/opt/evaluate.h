/* evaluate.h — the smallest evaluation the optimizations need: a text's
 * tokens, the logits of every position (teacher-forced), and the scores of
 * a model against the text and against reference logits (the unmodified
 * model's): mean negative log-likelihood of each next token, perplexity,
 * KL divergence of the final distributions and top-1 agreement. One window
 * from position 0 (no sliding windows, no BOS handling beyond the
 * tokenizer's own); `nstf perplexity` is the full tool. */
#ifndef NSTF_OPT_EVALUATE_H
#define NSTF_OPT_EVALUATE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "nstf.h"

/* The session's tokenization of text (with BOS where the model wants it),
 * at most max_tokens (0: the context) and at most the session's context.
 * *ids: free with nstf_free. Fails with fewer than 2 tokens. */
nstf_status nstf_eval_tokenize(nstf_session *s, const char *text, int max_tokens, int32_t **ids, int *n);

/* Log-probabilities of every position: logp [n, n_vocab] (log-softmax of
 * the logits; the caller allocates n * n_vocab floats). */
nstf_status nstf_eval_logprobs(nstf_session *s, const int32_t *ids, int n, float *logp);

/* row [n] <- log-softmax(row), in place (double sums). */
void nstf_eval_log_softmax(float *row, int64_t n);

typedef struct nstf_eval_score {
    double nll;  /* mean -log p(ids[t+1]) over t = first .. n-2 */
    double ppl;  /* exp(nll) */
    double kl;   /* mean KL(ref || model) over the same positions (0 without ref) */
    double top1; /* fraction of positions whose argmax equals ref's (1 without ref) */
    int n_scored;
} nstf_eval_score;

/* Scores of logp [n, n_vocab] against the text and ref (may be NULL),
 * positions first .. n-2 (first: context given before scoring starts). */
void nstf_eval_scores(const float *logp, const float *ref, const int32_t *ids, int n, int n_vocab, int first,
                      nstf_eval_score *out);

#endif
