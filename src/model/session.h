/* session.h — what a session holds (internal): the model, its tokenizer,
 * the backend it runs on and the model placed there. The public face is
 * nstf.h; tools use the accessors of nstf_tools.h. */
#ifndef NSTF_MODEL_SESSION_H
#define NSTF_MODEL_SESSION_H

#include "backend/backend.h"
#include "core/clock.h"
#include "io/tokenizer.h"
#include "model/llama.h"
#include "model/sampler.h"
#include "nstf_tools.h"

/* The run a session places the model in: n_seq sequence slots, and a
 * paged KV cache of kv_blocks blocks of kv_block positions (0: each
 * sequence has n_ctx contiguous positions). nstf_session_open: 1, 0, 0. */
typedef struct nstf_session_shape {
    int n_seq, kv_block, kv_blocks;
} nstf_session_shape;

struct nstf_session {
    nstf_session_params params;
    nstf_session_shape shape;
    nstf_llama *model;
    nstf_tokenizer *tok;
    nstf_backend *be;
    nstf_llama_run *run;   /* the model on be, or the first stage of a split */
    nstf_backend *be_cpu;  /* a split's second backend (the CPU), or NULL */
    nstf_llama_run *run_cpu; /* a split's last stage (on be_cpu), or NULL */
    float *logits;      /* [n_vocab] host copy of the last token's logits */
    int n_ctx, n_batch; /* of the run */
    double load_ms;
};

/* nstf_session_open with the run shaped for serving several sequences
 * (shape NULL: one sequence). A device that cannot hold such a run fails
 * the open (gpu) or leaves it to the CPU (auto), as any other failure. */
nstf_status nstf_session_open_shaped(const char *model_path, const nstf_session_params *p,
                                     const nstf_session_shape *shape, nstf_session **out);

#endif
