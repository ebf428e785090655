/* session.h — what a session holds (internal): the model, its tokenizer,
 * and either the CPU run state and context or the GPU model (gpu != NULL).
 * The public face is nstf.h. */
#ifndef NSTF_MODEL_SESSION_H
#define NSTF_MODEL_SESSION_H

#include "io/tokenizer.h"
#include "model/llama.h"
#include "model/llama_gpu.h"
#include "model/sampler.h"

struct nstf_session {
    nstf_session_params params;
    nstf_llama *model;
    nstf_tokenizer *tok;
    nstf_llama_state state;
    nstf_pool *pool;
    nstf_cpu cpu;
    nstf_llama_gpu *gpu; /* set: the forward runs on the GPU; state/pool/cpu unused */
    float *gpu_logits;   /* GPU sessions: host copy of the last token's logits */
    float *logits;       /* the last token's logits: state.logits or gpu_logits */
    int n_ctx, n_batch;  /* of whichever backend runs the forward */
    char device[320];    /* "cpu" or the GPU's description line */
    double load_ms;
};

/* Teacher-forced evaluation from position 0: logits of every token, written
 * to out [n, n_vocab]. n <= n_ctx. Used by tests and benchmarks. */
nstf_status nstf_session_eval_all(nstf_session *s, const int32_t *tokens, int n, float *out);

/* Evaluate tokens starting at pos0 in chunks of n_batch; leaves the last
 * token's logits in s->logits. */
nstf_status nstf_session_prefill(nstf_session *s, const int32_t *tokens, int n, int pos0);

/* Monotonic clock in milliseconds. */
double nstf_time_ms(void);

#endif
