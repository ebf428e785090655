/* sampler.h — turns logits into the next token.
 *
 * Order of the chain (llama.cpp's default): repetition penalty over the
 * last `repeat_last_n` tokens -> top-k -> top-p -> min-p -> temperature ->
 * draw. temp <= 0 is greedy (argmax after the penalty). All buffers are
 * allocated once at init; sampling allocates nothing. */
#ifndef NSTF_MODEL_SAMPLER_H
#define NSTF_MODEL_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h" /* nstf.h: nstf_sampler_params */

nstf_sampler_params nstf_sampler_default_params(void);
/* Checks the ranges: temp >= 0, 0 < top_p <= 1, 0 <= min_p <= 1,
 * repeat_penalty > 0, repeat_last_n >= 0. */
nstf_status nstf_sampler_check_params(const nstf_sampler_params *p);

typedef struct nstf_sampler {
    nstf_sampler_params p;
    int n_vocab;
    uint64_t rng[2];  /* xoroshiro128+ state */
    int32_t *idx;     /* [n_vocab] candidate ids */
    float *val;       /* [n_vocab] candidate logits, then draw weights */
    float *prob;      /* [n_vocab] untempered probabilities of the candidates */
    int32_t *recent;  /* [repeat_last_n] ring of recent tokens */
    int n_recent, recent_head;
} nstf_sampler;

nstf_status nstf_sampler_init(nstf_sampler *s, const nstf_sampler_params *p, int n_vocab);
void nstf_sampler_free(nstf_sampler *s);
/* Record a token (prompt or generated) for the repetition penalty. */
void nstf_sampler_accept(nstf_sampler *s, int32_t id);
/* The chain up to the draw on logits [n_vocab] (not modified): returns the
 * number n >= 1 of candidates left; idx[0..n) are their ids in candidate
 * order (higher penalised logit first, the lower id first among equal
 * ones) and val[0..n) their unnormalised draw weights exp((l - l_max) / temp)
 * (greedy: the one first maximum, weight 1). For tests and for callers that
 * draw themselves. */
int nstf_sampler_candidates(nstf_sampler *s, const float *logits);
/* Pick the next token from logits [n_vocab] (not modified): the candidates,
 * then one uniform draw (greedy draws nothing). */
int32_t nstf_sampler_sample(nstf_sampler *s, const float *logits);
/* A uniform draw in [0, 1) from the sampler's generator (for tests). */
double nstf_sampler_uniform(nstf_sampler *s);

#endif
