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

/* The cache types of nstf_session_params ("auto", NULL or "": the
 * device's own; "q8_0") to whether the KV cache is Q8_0; an error names a
 * type it does not know, or K and V of different types. */
nstf_status nstf_session_cache_type(const char *k, const char *v, bool *q8);

struct nstf_session {
    nstf_session_params params;
    nstf_session_shape shape;
    bool kv_q8; /* the KV cache is Q8_0 (params.cache_type_k / _v) */
    nstf_llama *model;
    nstf_tokenizer *tok;
    nstf_backend *be;
    nstf_llama_run *run;   /* the model on be, or the first stage of a split */
    nstf_backend *be_tp[16]; /* a tensor-parallel run's other backends (this process's rank's is be), or NULL */
    nstf_backend *be_cpu;  /* a split's second backend (the CPU), or NULL */
    nstf_llama_run *run_cpu; /* a split's last stage (on be_cpu), or NULL */
    float *logits;      /* [n_vocab] host copy of the last token's logits */
    int n_ctx, n_batch; /* of the run */
    double load_ms;
    int32_t *hist;      /* [n_ctx] the tokens the KV cache holds, positions 0 .. n_past-1 */
    int n_past;
    int n_keep;         /* tokens a context shift keeps at the start */
    bool dev_greedy;    /* generation takes the backend's greedy token (next) */
    int32_t next;
    char *tmpl;         /* the chat template string (NULL: none, plain ChatML) */
    const char *tmpl_family; /* "chatml", "llama3", "llama2"; NULL: not renderable */
    bool tmpl_from_model;
};

/* nstf_session_open with the run shaped for serving several sequences
 * (shape NULL: one sequence). A device that cannot hold such a run fails
 * the open (gpu) or leaves it to the CPU (auto), as any other failure. */
nstf_status nstf_session_open_shaped(const char *model_path, const nstf_session_params *p,
                                     const nstf_session_shape *shape, nstf_session **out);

/* Sparse decode attention per the parameters and the file's plan
 * (session_sparse.c), on every stage of the run; called once the run is
 * placed. */
nstf_status nstf_session_sparse_apply(nstf_session *s);
/* Layers [n_layers] flagged 1 run the sparse decode attention at these
 * parameters on every stage (statistics zeroed: the next prefill rebuilds
 * them); layer NULL or all 0: every layer dense. The window is clamped to
 * the context. */
nstf_status nstf_session_sparse_set(nstf_session *s, const uint8_t *layer, int topk, int block, int window);

/* ---- generation pieces shared by session.c and conv.c ---- */

/* A growable NUL-terminated byte string. */
typedef struct nstf_text {
    char *p;
    size_t len, cap;
    bool oom;
} nstf_text;
bool nstf_text_add(nstf_text *t, const char *p, size_t n);

/* The text must be valid UTF-8; the error names `what` and the offset. */
nstf_status nstf_session_check_text(const char *what, const char *text);
/* Tokenize with the model's BOS rule (add_bos: where the model wants one). */
nstf_status nstf_session_tokenize_text(nstf_session *s, const char *text, size_t len, bool add_bos, bool special,
                                       int32_t **ids, int64_t *n);
/* Render messages with the session's chat template. */
nstf_status nstf_session_render(nstf_session *s, const nstf_chat_msg *msgs, int n, bool gen, char **out);
/* Forget the history after n_past tokens. */
void nstf_session_rewind(nstf_session *s, int n_past);
/* Evaluate n tokens after the history, shifting the context first when
 * gp allows and they do not fit; *stopped when interrupted (the history
 * then holds what was evaluated). */
nstf_status nstf_session_append(nstf_session *s, const int32_t *ids, int64_t n, const nstf_gen_params *gp,
                                nstf_gen_stats *st, bool *stopped);
/* Before a generation loop: whether it takes the backend's greedy token. */
nstf_status nstf_session_begin_gen(nstf_session *s, const nstf_sampler_params *sp);
/* Generate from the logits of the last evaluation: sample, stream, append
 * each token but the last to the history. emitted (may be NULL) receives
 * every piece passed to cb, evaluated (may be NULL) those of the tokens
 * appended to the history. Adds to st. */
nstf_status nstf_session_gen_loop(nstf_session *s, nstf_sampler *smp, const nstf_gen_params *gp, nstf_piece_fn cb,
                                  void *user, nstf_gen_stats *st, nstf_text *emitted, nstf_text *evaluated);

#endif
