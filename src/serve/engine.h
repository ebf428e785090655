/* engine.h — the serving engine: a model placed for n_seq sequences over a
 * paged KV cache, and a scheduler thread that runs them by continuous
 * batching.
 *
 * Every step the scheduler (1) drops cancelled and timed-out requests,
 * (2) admits waiting requests in arrival order while a sequence slot is
 * free and the pool has blocks for their tokens (after the prefix they
 * share with cached blocks), (3) gives every running sequence that
 * decodes one token and fills what is left of the step's token budget
 * (n_batch) with prefill chunks of the others, oldest first, (4) makes
 * sure each has blocks for its new positions, preempting the youngest
 * running request when the pool is out (its blocks are freed and it waits
 * at the head of the queue to be recomputed, with what it generated, when
 * blocks free up), (5) runs the whole step as ONE forward (one pass over
 * the weights for every sequence), with the logits of only the rows that
 * sample: their greedy tokens computed by the backend, and only the rows
 * that draw or report log-probabilities copied to the host; prompt rows
 * computed alike whatever their number (nstf_batch.row_invariant: a
 * repeated seeded request gives the same tokens though the prefix cache
 * left it fewer prompt rows to compute), and (6) samples, detokenizes,
 * checks stop strings and limits, and hands the new text to the
 * request's reader.
 *
 * Requests and readers: nstf_engine_submit queues a request; its reader
 * (an HTTP connection) takes the output as it comes with
 * nstf_engine_req_read, may cancel it at any time (a client that went
 * away), and releases it when done. Text is handed out only where it is
 * final: never the start of a possible stop string, never half a UTF-8
 * character. The engine holds its own reference while it runs a request,
 * so a reader may release a request the engine still holds. */
#ifndef NSTF_SERVE_ENGINE_H
#define NSTF_SERVE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "io/tokenizer.h"
#include "serve/metrics.h"

typedef struct nstf_engine nstf_engine;
typedef struct nstf_engine_req nstf_engine_req;

typedef struct nstf_engine_params {
    const char *model;  /* GGUF file or HF folder */
    int n_seq;          /* sequences decoded together (default 4) */
    int n_ctx;          /* KV cache positions in all, shared by the sequences (default 4096) */
    int kv_block;       /* positions per KV block (default 16) */
    int n_batch;        /* tokens per step: decodes plus prefill chunks (default 256) */
    int max_queue;      /* requests waiting for a slot beyond which submit refuses (default 64) */
    int n_threads;      /* CPU threads (0: every core) */
    const char *device; /* "cpu", "gpu" or "auto" */
    int n_tp;           /* tensor parallel (nstf_session_params' n_tp, gpus, tp_timeout_ms) */
    const char *gpus;
    int tp_timeout_ms;
    bool verbose;
} nstf_engine_params;

#define NSTF_MAX_STOP 4
#define NSTF_MAX_TOP_LOGPROBS 20

typedef struct nstf_serve_gen_params {
    float temperature;  /* 0: greedy */
    float top_p;        /* (0, 1] */
    uint64_t seed;
    int max_tokens;     /* >= 1 */
    const char *stop[NSTF_MAX_STOP]; /* copied at submit */
    int n_stop;
    int logprobs;       /* -1: none; else report each token's log-probability and this many alternatives */
    double timeout_s;   /* 0: none */
    bool ignore_eos;    /* generate past end-of-generation tokens (benchmarks) */
} nstf_serve_gen_params;

/* One generated token with its log-probability under the model (the
 * log-softmax of its logits, before temperature or truncation) and its
 * most likely alternatives. */
typedef struct nstf_gen_token {
    int32_t id;
    int64_t text_at;    /* byte offset of its piece in the output text */
    int32_t n_bytes;    /* its piece's length */
    float logprob;
    int n_top;
    int32_t top_id[NSTF_MAX_TOP_LOGPROBS];
    float top_logprob[NSTF_MAX_TOP_LOGPROBS];
} nstf_gen_token;

typedef enum nstf_engine_code {
    NSTF_ENGINE_OK = 0,
    NSTF_ENGINE_FULL,      /* submit: the queue is full (try again later) */
    NSTF_ENGINE_DRAINING,  /* submit: the server is shutting down */
    NSTF_ENGINE_TOO_LONG,  /* submit: prompt + max_tokens exceed a sequence's context */
    NSTF_ENGINE_TIMEOUT,   /* read: the request ran past its time limit */
    NSTF_ENGINE_FAILED,    /* a forward failed, or memory ran out */
} nstf_engine_code;

/* What a read hands out: the text and tokens produced since the last read
 * (malloc'd; nstf_gen_chunk_free), and at the end the outcome. */
typedef struct nstf_gen_chunk {
    char *text;           /* new text, NUL-terminated (may be empty) */
    int64_t n_text;
    nstf_gen_token *toks; /* new tokens (with logprobs when asked for) */
    int n_toks;
    bool done;            /* nothing follows */
    const char *finish;   /* done: "stop" or "length" (NULL with an error) */
    nstf_engine_code error;
    char message[200];    /* error: what happened */
    int64_t n_prompt, n_gen, n_cached; /* tokens: prompt, generated, prompt taken from the prefix cache */
} nstf_gen_chunk;

typedef struct nstf_engine_stats {
    int n_seq, running, waiting, max_queue;
    int kv_blocks, kv_block, kv_used, kv_cached;
    int64_t kv_hits, kv_evicted;
    int64_t n_ctx_seq;                 /* positions one sequence may use */
    int64_t submitted, finished, cancelled, timed_out, failed, preempted, rejected_full;
    int64_t prompt_tokens, prompt_cached, gen_tokens, steps, step_tokens;
    nstf_hist ttft, itl, e2e, queue, batch_tokens, batch_seqs;
    bool draining;
} nstf_engine_stats;

nstf_engine_params nstf_engine_default_params(void);
/* Load the model, place it for p->n_seq sequences over the paged cache
 * and start the scheduler thread. */
nstf_status nstf_engine_create(const nstf_engine_params *p, nstf_engine **out);
/* Under mpirun, a rank other than 0 of a tensor-parallel server: open the
 * same session as rank 0's engine (p must be its parameters) and run the
 * forwards rank 0's engine sends until it stops (nstf_llama_tp_follow). */
nstf_status nstf_engine_follow(const nstf_engine_params *p);
/* Stop the scheduler (requests still there end with an error) and free
 * everything. Every reader must have released its requests. */
void nstf_engine_free(nstf_engine *e);

/* The model's name (the file's base name), its tokenizer and GGUF (for
 * chat templates), the positions one sequence may use. */
const char *nstf_engine_model_name(const nstf_engine *e);
int64_t nstf_engine_n_ctx(const nstf_engine *e);
/* A prompt's tokens: text as-is (chat false) or messages rendered with
 * the model's chat template (chat true), as `nstf run` encodes them.
 * *ids is malloc'd. */
nstf_status nstf_engine_tokenize(const nstf_engine *e, const char *text, bool chat, const nstf_chat_msg *msgs,
                                 int n_msgs, int32_t **ids, int64_t *n_ids);
int32_t nstf_engine_n_vocab(const nstf_engine *e);
/* The bytes of token id (nstf_tokenizer_piece): its length, -1 for an id
 * outside the vocabulary. */
int64_t nstf_engine_piece(const nstf_engine *e, int32_t id, char *buf, size_t cap);

/* Queue a request for prompt[0..n) (copied). NSTF_ENGINE_OK gives *out,
 * which the caller reads and releases. */
nstf_engine_code nstf_engine_submit(nstf_engine *e, const nstf_serve_gen_params *gp, const int32_t *prompt, int64_t n,
                                    nstf_engine_req **out);
/* Wait up to timeout_ms for output and take what is new; false when
 * nothing came (chunk then holds nothing to free). */
bool nstf_engine_req_read(nstf_engine_req *r, int timeout_ms, nstf_gen_chunk *chunk);
void nstf_gen_chunk_free(nstf_gen_chunk *c);
/* The reader is gone: the scheduler drops the request at its next step
 * (its blocks and slot freed). */
void nstf_engine_req_cancel(nstf_engine_req *r);
void nstf_engine_req_release(nstf_engine_req *r);

/* Refuse new requests from now on and wait until every accepted one has
 * finished (or timeout_s passed: false). */
bool nstf_engine_drain(nstf_engine *e, double timeout_s);
void nstf_engine_stats_get(nstf_engine *e, nstf_engine_stats *out);

#endif
