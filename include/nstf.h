/* nstf.h — the public C API of the NSTF engine.
 *
 * Conventions:
 *  - Every fallible function returns an nstf_status. NSTF_OK is 0. On any
 *    other value a one-line message (what failed, where, what to do) can be
 *    read with nstf_last_error() on the calling thread until the next
 *    failing call on that thread.
 *  - The library never calls exit() or abort() on bad input.
 *  - Sizes, offsets and counts are 64-bit.
 */
#ifndef NSTF_H
#define NSTF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nstf_status {
    NSTF_OK = 0,
    NSTF_ERR_INVALID_ARG = 1, /* a caller-supplied value is out of its domain */
    NSTF_ERR_IO = 2,          /* open/read/write/mmap failed */
    NSTF_ERR_FORMAT = 3,      /* a file is malformed or truncated */
    NSTF_ERR_UNSUPPORTED = 4, /* valid input the engine cannot handle (arch, type) */
    NSTF_ERR_OOM = 5,         /* host or device allocation failed */
    NSTF_ERR_RANGE = 6,       /* a limit was exceeded (context length, ids) */
    NSTF_ERR_GPU = 7,         /* a GPU runtime call failed */
    NSTF_ERR_INTERNAL = 8,    /* a bug: please report */
} nstf_status;

/* The message recorded by the last failing call on this thread. */
const char *nstf_last_error(void);
/* A short name for a status code ("malformed file"). */
const char *nstf_status_str(nstf_status s);

/* ---- generation ----------------------------------------------------------- */

/* Sampling: repetition penalty -> top-k -> top-p -> min-p -> temperature ->
 * draw (llama.cpp's default order). temp <= 0 is greedy. */
typedef struct nstf_sampler_params {
    float temp;           /* 0 = greedy; default 0.8 */
    int top_k;            /* <= 0: off; default 40 */
    float top_p;          /* 1.0: off; default 0.95 */
    float min_p;          /* 0.0: off; default 0.05 */
    float repeat_penalty; /* 1.0: off; default 1.0 */
    int repeat_last_n;    /* tokens the penalty looks back over; default 64 */
    uint64_t seed;        /* generator seed; same seed, same text */
} nstf_sampler_params;

typedef struct nstf_session nstf_session;

typedef struct nstf_session_params {
    int n_ctx;          /* KV cache positions; 0 = min(trained context, 4096) */
    int n_batch;        /* most prompt tokens per forward; default 512 */
    int n_threads;      /* CPU threads; 0 = every core */
    const char *device; /* "cpu", "gpu" or "auto" (default: GPU if present) */
    bool verbose;       /* log model and device details to stderr */
    bool precise;       /* CPU: fp32 activations in every matmul (slower; matches
                           fp32 references to rounding) instead of 8-bit blocks */
    bool deterministic; /* CPU: bitwise-identical results for any thread count
                           (and run to run); slightly slower decode */
    int n_gpu_layers;   /* on a GPU: how many layers run there; 0 (default) or
                           >= the layer count: all of the model; N between:
                           the embedding and layers 0..N-1 on the GPU, the rest
                           and the output head on the CPU (llama.cpp's -ngl;
                           its -ngl 0 is device "cpu") */
} nstf_session_params;

typedef struct nstf_gen_stats {
    int64_t n_prompt;   /* prompt tokens evaluated */
    int64_t n_gen;      /* tokens generated (sampled) */
    int64_t n_decode;   /* single-token forward passes run while generating */
    double prompt_ms;   /* wall time of prompt processing */
    double gen_ms;      /* wall time of generation (sampling + the n_decode passes) */
    double load_ms;     /* model load time */
} nstf_gen_stats;

/* Called with each generated token's bytes (possibly a partial UTF-8
 * sequence); return false to stop generating. */
typedef bool (*nstf_piece_fn)(void *user, int32_t token, const char *piece, size_t len);

nstf_sampler_params nstf_sampler_default_params(void);
nstf_session_params nstf_session_default_params(void);

/* Load a GGUF model and prepare a session (KV cache, threads). */
nstf_status nstf_session_open(const char *model_path, const nstf_session_params *p,
                              nstf_session **out);
void nstf_session_close(nstf_session *s);

/* Generate up to n_predict tokens after `prompt`. With chat set, the prompt
 * is one user turn rendered with the model's chat template (system may be
 * NULL for the template's default). The KV cache is reset first. Stops at
 * an end-of-generation token unless ignore_eos. */
nstf_status nstf_session_generate(nstf_session *s, const char *prompt, bool chat,
                                  const char *system, const nstf_sampler_params *sp,
                                  int n_predict, bool ignore_eos, nstf_piece_fn cb, void *user,
                                  nstf_gen_stats *stats);

/* ---- tokens, logits and the model's facts (what a binding needs) ---------- */

typedef struct nstf_model_info {
    int n_vocab;         /* rows of the logits */
    int n_ctx;           /* the session's context (KV cache positions) */
    int n_ctx_train;     /* context the model was trained for */
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn_dim;
    int32_t bos, eos;    /* token ids; -1 when the model has none */
    bool add_bos;        /* whether the model's tokenizer adds BOS to a prompt */
    const char *backend; /* "CPU", "CUDA" or "HIP" */
    const char *device;  /* one line describing the device */
} nstf_model_info;

/* The model's shape and where it runs. Strings are owned by the session. */
nstf_status nstf_session_info(const nstf_session *s, nstf_model_info *out);

/* Encode `len` bytes of UTF-8 text into token ids, as generation encodes a
 * prompt. add_bos: 1 yes, 0 no, -1 as the model's tokenizer wants (the
 * prompt of nstf_session_generate). parse_special: control tokens written
 * in the text ("<|im_start|>") become their ids. *n_ids is set to the
 * number of ids the text encodes to; at most `cap` are written to ids, and
 * when cap is smaller the call fails with NSTF_ERR_RANGE (call again with
 * *n_ids). Invalid UTF-8 is NSTF_ERR_INVALID_ARG naming the byte offset. */
nstf_status nstf_session_tokenize(nstf_session *s, const char *text, size_t len, int add_bos,
                                  bool parse_special, int32_t *ids, int64_t cap, int64_t *n_ids);

/* The text of n ids (their pieces concatenated; a SentencePiece model drops
 * the space its dummy prefix put before the first word). *len is set to the
 * byte length; at most `cap` bytes are written to buf (no NUL), and when
 * cap is smaller the call fails with NSTF_ERR_RANGE (call again with *len).
 * An id outside [0, n_vocab) is NSTF_ERR_RANGE. */
nstf_status nstf_session_detokenize(nstf_session *s, const int32_t *ids, int64_t n, char *buf,
                                    size_t cap, size_t *len);

/* Teacher-forced evaluation of n tokens at positions 0..n-1 (the KV cache is
 * overwritten from position 0). With all_logits, logits [n, n_vocab] of
 * every position are written (logits[t] predicts token t+1); otherwise
 * [n_vocab] of the last one. 1 <= n <= n_ctx; every id in [0, n_vocab). */
nstf_status nstf_session_eval(nstf_session *s, const int32_t *tokens, int64_t n, bool all_logits,
                              float *logits);

/* A seed from the clock and process id, for when none is given. */
uint64_t nstf_time_seed(void);

/* Version of the library. */
#define NSTF_VERSION_STRING "0.1.0"

#ifdef __cplusplus
}
#endif
#endif
