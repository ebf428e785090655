/* api.h — the OpenAI API's JSON: request bodies of /v1/chat/completions
 * and /v1/completions parsed and checked (every field's type and range,
 * unknown and duplicate fields refused) into nstf_api_req, and the
 * responses, stream chunks and errors written in OpenAI's shapes.
 *
 * No model here: the HTTP layer tokenizes what a request holds and
 * passes token pieces (for logprobs) through a callback. Everything
 * written is valid UTF-8 JSON: invalid UTF-8 and NUL bytes in model
 * output become U+FFFD. */
#ifndef NSTF_SERVE_API_H
#define NSTF_SERVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"
#include "serve/engine.h"

typedef enum nstf_api_kind { NSTF_API_CHAT = 0, NSTF_API_COMPLETION = 1 } nstf_api_kind;

/* An error answer: HTTP status and OpenAI's
 * {"error": {"message", "type", "param", "code"}}. */
typedef struct nstf_api_error {
    int status;
    const char *type;  /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;  /* NULL or e.g. "context_length_exceeded" */
    char param[64];    /* the field at fault, or empty */
    char message[400];
} nstf_api_error;

#define NSTF_API_MAX_MSGS 1024

typedef struct nstf_api_req {
    nstf_api_kind kind;
    char *model;            /* as the client named it, or NULL */
    nstf_chat_msg *msgs;    /* chat: roles and contents (owned) */
    int n_msgs;
    char *prompt;           /* completion: the text, or NULL when given as token ids */
    int32_t *prompt_ids;    /* completion: token ids (checked against n_vocab) */
    int64_t n_prompt_ids;
    float temperature;      /* 0 .. 2, default 1 */
    float top_p;            /* 0 .. 1, default 1 (0: the most likely token) */
    int64_t max_tokens;     /* -1: not given */
    char *stop[NSTF_MAX_STOP];
    int n_stop;
    bool has_seed;
    uint64_t seed;
    bool stream, include_usage;
    int logprobs;           /* -1: none; else the alternatives per token (chat: top_logprobs) */
    bool ignore_eos;        /* an extension (llama.cpp's, vLLM's): generate past end-of-generation tokens */
} nstf_api_req;

/* Parse a body of n bytes for the endpoint `kind`; false fills err (a 4xx). */
bool nstf_api_parse(nstf_api_kind kind, const char *body, size_t n, int32_t n_vocab, nstf_api_req *out,
                    nstf_api_error *err);
void nstf_api_req_free(nstf_api_req *r);

void nstf_api_error_set(nstf_api_error *e, int status, const char *type, const char *code, const char *param,
                        const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* The error body (malloc'd; NULL when out of memory). */
char *nstf_api_error_json(const nstf_api_error *e);

/* The bytes of token id into buf (at most cap), returning its length. */
typedef int64_t (*nstf_api_piece_fn)(void *user, int32_t id, char *buf, size_t cap);

/* One answer, or one stream chunk of it. */
typedef struct nstf_api_out {
    nstf_api_kind kind;
    const char *id;               /* "chatcmpl-..." / "cmpl-..." */
    int64_t created;              /* Unix seconds */
    const char *model;
    const char *text;             /* the content, or the stream chunk's new text */
    int64_t n_text;
    const nstf_gen_token *toks;   /* tokens of that text, for logprobs */
    int n_toks;
    int logprobs;                 /* -1: none */
    const char *finish;           /* NULL: not finished (stream) */
    bool role;                    /* chat stream: the first chunk says the role */
    bool usage;                   /* include usage (the stream's last chunk has no choices) */
    int64_t n_prompt, n_gen, n_cached;
    nstf_api_piece_fn piece;
    void *piece_user;
} nstf_api_out;

/* A whole response (non-stream), a stream chunk, the stream's usage
 * chunk; GET /v1/models. All malloc'd, NULL when out of memory. */
char *nstf_api_response_json(const nstf_api_out *o);
char *nstf_api_chunk_json(const nstf_api_out *o);
char *nstf_api_usage_chunk_json(const nstf_api_out *o);
char *nstf_api_models_json(const char *model, int64_t created, int64_t n_ctx);

/* bytes as a valid UTF-8 string (invalid sequences and NUL: U+FFFD), malloc'd */
char *nstf_api_utf8(const char *s, int64_t n);

#endif
