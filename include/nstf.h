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
    int n_batch;        /* most prompt tokens per forward; 0 (default): 2048 on a
                           GPU (512 where that does not fit), 512 on the CPU */
    int n_threads;      /* CPU threads; 0 = the physical cores */
    const char *device; /* "cpu", "gpu" or "auto" (default: GPU if present) */
    bool verbose;       /* log model and device details to stderr */
    bool precise;       /* CPU: fp32 activations in every matmul (slower; matches
                           fp32 references to rounding); same as cpu_act_bits 32 */
    bool deterministic; /* CPU: bitwise-identical results for any thread count
                           (and run to run); slightly slower decode */
    int cpu_act_bits;   /* CPU: activations of quantized matmuls. 0 = 16 (the
                           default: 8-bit blocks plus their 8-bit rounding
                           residual, as close to fp32 as --precise in the
                           logits); 8 = one 8-bit block (fastest; llama.cpp's
                           accuracy); 32 = fp32 (as precise) */
    const char *chat_template; /* NULL: the model's own (ChatML when it has
                           none); or one of NSTF_CHAT_TEMPLATE_NAMES */
    int n_gpu_layers;   /* on a GPU: how many layers run there; 0 (default) or
                           >= the layer count: all of the model; N between:
                           the embedding and layers 0..N-1 on the GPU, the rest
                           and the output head on the CPU (llama.cpp's -ngl;
                           its -ngl 0 is device "cpu") */
    /* Sparse decode attention (Quest: each generated token attends to block
     * 0, the recent window and the top-k blocks of the cache by an upper
     * bound of their scores; prompts are still processed densely).
     *   sparse_attn  0: as the model file's plan says (GGUF
     *                   nstf.plan.attn_sparse, one flag per layer, with
     *                   nstf.plan.sparse_topk / _block / _window), dense
     *                   without one; 1: every layer sparse; -1: dense
     *   sparse_topk, sparse_window (positions), sparse_block (positions per
     *                   block, 4..64): 0 = the plan's value, else 16, 64, 16 */
    int sparse_attn;
    int sparse_topk;
    int sparse_window;
    int sparse_block;
    /* Tensor parallel: the model split over n_tp devices (0 or 1: none),
     * Megatron-style (heads, feed-forward width and vocabulary shared out;
     * two all-reduces per layer). On a GPU: the GPUs listed in gpus
     * ("0,1"; NULL: 0..n_tp-1), through NCCL (RCCL); on the CPU (device
     * "cpu"): n_tp CPU backends sharing the threads. tp_timeout_ms: a
     * rank that makes no progress for this long aborts the group with an
     * error naming it (0: 30000). */
    int n_tp;
    const char *gpus;
    int tp_timeout_ms;
    /* KV cache type of keys and of values (llama.cpp's --cache-type-k /
     * --cache-type-v): NULL, "" or "auto" = the backend's own (f32 on the
     * CPU, bf16 on a GPU); "q8_0" = Q8_0 (int8 codes and an fp16 scale per
     * 32: 1.06 bytes a value, about half a bf16 cache). K and V take the
     * same type. Q8_0 is not taken with sparse attention, a paged cache
     * (the server's), nor GPU execution levels 0, 1 and 4. */
    const char *cache_type_k;
    const char *cache_type_v;
} nstf_session_params;

/* Why generation stopped. */
typedef enum nstf_stop {
    NSTF_STOP_NONE = 0,
    NSTF_STOP_N_PREDICT = 1,    /* n_predict tokens were generated */
    NSTF_STOP_EOG = 2,          /* an end-of-generation token was sampled */
    NSTF_STOP_STRING = 3,       /* the output ended with one of the stop strings */
    NSTF_STOP_CONTEXT_FULL = 4, /* the KV cache is full and context_shift is off */
    NSTF_STOP_CALLBACK = 5,     /* the piece callback returned false */
    NSTF_STOP_INTERRUPTED = 6,  /* *interrupt became non-zero */
} nstf_stop;

/* Generation controls other than sampling (llama.cpp's meanings). */
typedef struct nstf_gen_params {
    int n_predict;              /* tokens to generate: >= 0; -1 no limit (until an
                                   end of generation, or the context is full
                                   without context_shift); -2 until the context is
                                   full. Default 128. */
    bool ignore_eos;            /* keep going past end-of-generation tokens */
    bool context_shift;         /* when the context is full: keep the first
                                   n_keep tokens, drop the oldest half of the rest,
                                   re-evaluate the kept tail at its new positions
                                   and go on (llama.cpp's context shift) */
    int n_keep;                 /* tokens a shift keeps at the start; -1 = the
                                   whole first prompt. Default 0. */
    const char *const *stop;    /* stop strings (reverse prompts): stop once the
                                   generated text ends with one; n_stop of them */
    int n_stop;
    const volatile int *interrupt; /* when non-NULL and non-zero: stop at the next
                                   forward pass (a signal handler may set it) */
} nstf_gen_params;

typedef struct nstf_gen_stats {
    int64_t n_prompt;   /* prompt tokens evaluated */
    int64_t n_gen;      /* tokens generated (sampled) */
    int64_t n_decode;   /* single-token forward passes run while generating */
    double prompt_ms;   /* wall time of prompt processing */
    double gen_ms;      /* wall time of generation (sampling + the n_decode passes) */
    double load_ms;     /* model load time */
    nstf_stop stop;     /* why generation stopped */
    int64_t n_shifts;   /* context shifts (each re-evaluates the kept tail) */
    int64_t n_past;     /* tokens in the KV cache afterwards */
} nstf_gen_stats;

/* Called with each generated token's bytes (possibly a partial UTF-8
 * sequence); return false to stop generating. */
typedef bool (*nstf_piece_fn)(void *user, int32_t token, const char *piece, size_t len);

nstf_sampler_params nstf_sampler_default_params(void);
nstf_session_params nstf_session_default_params(void);
nstf_gen_params nstf_gen_default_params(void);

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
    int n_batch;         /* the session's prompt tokens per forward pass (its
                            default resolved for the device) */
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

/* The same with every control: special set parses special tokens written
 * in a raw prompt (<|im_start|>, ...) as those tokens (a chat prompt's
 * template tokens always are; the user's text is taken as text either
 * way only in the sense that the template wraps it). The prompt must be
 * valid UTF-8; an error names the offset of the first bad byte in it. A
 * stop other than an error is reported in stats->stop, not as a failure. */
nstf_status nstf_session_complete(nstf_session *s, const char *prompt, bool chat, const char *system,
                                  bool special, const nstf_sampler_params *sp, const nstf_gen_params *gp,
                                  nstf_piece_fn cb, void *user, nstf_gen_stats *stats);

/* The chat templates by name (--chat-template; nstf_session_params.chat_template). */
#define NSTF_CHAT_TEMPLATE_NAMES "chatml, llama3, llama2, mistral-v1, mistral-v3, mistral-v3-tekken or mistral-v7"
bool nstf_chat_template_known(const char *name);

/* The chat template a chat prompt is rendered with: one of
 * NSTF_CHAT_TEMPLATE_NAMES; *from_model (may be NULL) says whether the model's file names
 * it (false: the session's chat_template, or ChatML by default for a
 * model without one). NULL when the model's template is not one of those
 * (rendering a chat then fails with a message). */
const char *nstf_session_chat_template(const nstf_session *s, bool *from_model);

/* ---- conversations --------------------------------------------------------- */

/* A multi-turn chat on a session: the history stays in the KV cache, so a
 * turn evaluates only its new tokens (the end of the previous answer's
 * turn, the user's message, the assistant header) before generating. The
 * sampler (its generator and repetition window) runs on across turns. */
typedef struct nstf_conv nstf_conv;

/* system: the system message (NULL: the template's default). */
nstf_status nstf_conv_open(nstf_session *s, const char *system, const nstf_sampler_params *sp,
                           nstf_conv **out);
void nstf_conv_close(nstf_conv *c);
/* One user turn; the answer is streamed through cb and kept in the
 * history (also when stopped early: by n_predict, a stop string, the
 * callback or an interrupt). */
nstf_status nstf_conv_turn(nstf_conv *c, const char *user_text, const nstf_gen_params *gp, nstf_piece_fn cb,
                           void *user, nstf_gen_stats *stats);
/* Forget every turn (the system message stays). */
void nstf_conv_clear(nstf_conv *c);
/* Replace the system message (NULL: the template's default) and forget
 * the turns. */
nstf_status nstf_conv_set_system(nstf_conv *c, const char *system);
/* Messages so far (the system message not counted), and tokens in the
 * KV cache. */
int nstf_conv_n_messages(const nstf_conv *c);
int nstf_conv_n_past(const nstf_conv *c);
/* The conversation as JSON ({"system": ..., "messages": [{"role", "content"}]})
 * to path, and back: load replaces the conversation (its tokens are
 * evaluated at the next turn). */
nstf_status nstf_conv_save(const nstf_conv *c, const char *path);
nstf_status nstf_conv_load(nstf_conv *c, const char *path);

/* A seed from the clock and process id, for when none is given. */
uint64_t nstf_time_seed(void);

/* Version of the library. */
#define NSTF_VERSION_STRING "0.1.0"

#ifdef __cplusplus
}
#endif
#endif
