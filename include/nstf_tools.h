/* nstf_tools.h — the library's internal interface for its own command-line
 * tools (tools/), tests and benchmarks: session accessors and controls
 * that nstf.h does not promise to other programs. No struct of the
 * library is visible through it; what a tool needs of one is a function
 * here. Not a stable API. */
#ifndef NSTF_TOOLS_H
#define NSTF_TOOLS_H

#include <stdbool.h>
#include <stdint.h>

#include "nstf.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the model and the run ------------------------------------------------ */

int nstf_session_n_vocab(const nstf_session *s);
int nstf_session_n_layers(const nstf_session *s);
int nstf_session_n_ctx(const nstf_session *s);
int nstf_session_n_batch(const nstf_session *s);
/* The session's GGUF file (as opened) and its tensor bytes / parameters. */
const char *nstf_session_path(const nstf_session *s);

/* One forward of n tokens at pos0..: the last token's logits (every
 * token's with all_logits) to the host buffer `logits` (may be NULL), and
 * the greedy token to *argmax when given (computed on the backend). */
nstf_status nstf_session_forward(nstf_session *s, const int32_t *tokens, int n, int pos0, bool all_logits,
                                 float *logits, int32_t *argmax);
/* Evaluate tokens starting at pos0 in chunks of n_batch; leaves the last
 * token's logits in the session's logits buffer (nstf_session_logits). */
nstf_status nstf_session_prefill(nstf_session *s, const int32_t *tokens, int n, int pos0);
/* Teacher-forced evaluation from position 0: logits of every token, written
 * to out [n, n_vocab]. n <= n_ctx. */
nstf_status nstf_session_eval_all(nstf_session *s, const int32_t *tokens, int n, float *out);
/* [n_vocab] the last prefill's logits. */
const float *nstf_session_logits(const nstf_session *s);
/* The model's tokens for text (malloc'd *ids), with BOS first when the
 * model adds one; parse_special: special-token text becomes those tokens. */
nstf_status nstf_session_tokenize_alloc(nstf_session *s, const char *text, size_t len, bool parse_special,
                                        int32_t **ids, int64_t *n);

/* ---- perplexity (src/model/perplexity.c) ------------------------------------ *
 * llama.cpp's llama-perplexity on the session's model: windows of n_ctx
 * tokens from position 0, BOS in place of each window's first token when
 * the model adds BOS, the second half scored; with kl_base, the KL
 * divergence and top-1 agreement against the base model's saved
 * log-probabilities (llama.cpp's --kl-divergence-base file, which
 * save_logits writes). */
#define NSTF_PPL_N_PCT 11
typedef struct nstf_ppl_params {
    int n_ctx;            /* window; 0 with kl_base: the file's */
    int n_batch;          /* tokens per forward, <= the session's batch */
    int n_chunks;         /* windows to run; < 0: all */
    const char *kl_base;  /* base log-probabilities to compare with (its tokens are used), or NULL */
    const char *save_logits; /* write this run's log-probabilities (without kl_base), or NULL */
    void (*progress)(void *user, int chunk, int n_chunk, double ppl, double seconds); /* after each window */
    void *user;
} nstf_ppl_params;
typedef struct nstf_ppl_result {
    int n_ctx, n_chunk;
    int64_t count;        /* scored positions */
    double ppl, ppl_unc;  /* exp(mean nll) and its standard error (llama.cpp's +/-) */
    double seconds;
    /* with kl_base: */
    double ppl_base, ppl_base_unc, ln_ratio, ln_ratio_unc; /* ln(PPL / PPL(base)) */
    double kld, kld_unc;  /* mean KL(base || model) in nats */
    /* KL percentiles: max, 99.9, 99, 95, 90, median, 10, 5, 1, 0.1, min */
    double kld_pct[NSTF_PPL_N_PCT];
    double p_diff, p_diff_unc, p_diff_rms, p_diff_rms_unc, p_diff_max; /* p(token) - p_base(token) */
    double same_top, same_top_unc; /* fraction of positions whose top-1 token both share */
} nstf_ppl_result;
/* tokens: the text's tokens (ignored with kl_base). */
nstf_status nstf_perplexity(nstf_session *s, const int32_t *tokens, int64_t n_tokens, const nstf_ppl_params *p,
                            nstf_ppl_result *r);

/* The token ids nstf_session_complete evaluates for this prompt (*ids is
 * malloc'd), and the bytes of one token (nstf_tokenizer_piece's contract). */
nstf_status nstf_session_prompt_tokens(nstf_session *s, const char *prompt, bool chat, const char *system,
                                       bool special, int32_t **ids, int64_t *n_ids);
int64_t nstf_session_token_piece(const nstf_session *s, int32_t id, char *buf, size_t cap);
/* The element type of the KV cache ("f32" on the CPU, "bf16" on a GPU). */
const char *nstf_session_kv_type(const nstf_session *s);
/* Sparse decode attention of the session (nstf_session_params.sparse_*):
 * the number of sparse layers (0: dense) and the parameters in use. */
int nstf_session_sparse(const nstf_session *s, int *topk, int *block, int *window);
/* Change top-k and window between forwards (a session that has sparse
 * layers; top-k 0..1024, window 0..n_ctx). The statistics are kept. */
nstf_status nstf_session_sparse_tune(nstf_session *s, int topk, int window);

/* ---- the backend ------------------------------------------------------------ */

/* "CPU", "CUDA" or "HIP"; the device's one-line description; whether the
 * run is on a GPU; CPU threads (0 on a GPU). */
const char *nstf_session_backend_name(const nstf_session *s);
const char *nstf_session_device(const nstf_session *s);
bool nstf_session_on_gpu(const nstf_session *s);
int nstf_session_threads(const nstf_session *s);

/* Execution strategies of the backend (values as backend.h's options). */
typedef enum nstf_session_opt {
    NSTF_SESSION_LEVEL = 0,  /* execution level 0 .. n_levels-1 (GPU: L0 baseline .. L4 persistent) */
    NSTF_SESSION_GRAPHS = 1, /* replay the decode step from a captured graph */
    NSTF_SESSION_FUSED = 2,  /* fused kernels where the weights allow */
} nstf_session_opt;
int nstf_session_n_levels(const nstf_session *s);
int nstf_session_get_opt(const nstf_session *s, nstf_session_opt opt);
nstf_status nstf_session_set_opt(nstf_session *s, nstf_session_opt opt, int value);
/* Kernels the backend launched so far (a graph replay counts 1; the CPU
 * counts ops), and the kernels of its captured decode step (0: none). */
int64_t nstf_session_kernels(const nstf_session *s);
int64_t nstf_session_graph_kernels(const nstf_session *s);
/* The timeline of a level-4 decode step (one persistent kernel) by kind of
 * instruction: how many, the time from the barrier before them to the last
 * block's end of work (work), and from there until block 0 left the barrier
 * after them (wait: the barrier's latency), in microseconds, summed; total
 * from the kernel's start to the last instruction's end. Turned on before
 * the steps to look at (each step then records), read after one. */
enum { NSTF_L4_KINDS = 7 };
typedef struct nstf_l4_profile {
    int n_ins;
    double total_us;
    int count[NSTF_L4_KINDS];
    double work_us[NSTF_L4_KINDS], wait_us[NSTF_L4_KINDS];
} nstf_l4_profile;
const char *nstf_l4_kind_name(int kind); /* "embedding", "qkv+rope", "attention", "out-proj", "gate/up", "down", "logits" */
nstf_status nstf_session_l4_profile(nstf_session *s, bool on);
/* Level 4's program for this session's model: its instructions (0: none
 * recorded yet) and why the step runs as level 3 instead (NULL: it does
 * not, or nothing was tried yet). */
const char *nstf_session_l4_status(nstf_session *s, int64_t *instructions);
nstf_status nstf_session_l4_profile_get(nstf_session *s, nstf_l4_profile *out);
/* Bytes on the device by kind. */
typedef struct nstf_session_mem {
    uint64_t weights, kv_cache, activations, workspace;
} nstf_session_mem;
void nstf_session_mem_get(const nstf_session *s, nstf_session_mem *out);

/* ---- devices ------------------------------------------------------------------ */

/* Processors this process may run on, and the physical cores among them
 * (the default thread count). */
int nstf_cpu_count(void);
int nstf_cpu_physical_count(void);

/* The GPU runtime this build has ("CUDA", "HIP"; NULL: none), the visible
 * GPUs, and one line describing GPU dev. */
const char *nstf_gpu_runtime(void);
int nstf_gpu_count(void);
nstf_status nstf_gpu_describe(int dev, char *buf, size_t cap);
/* The link from GPU a to GPU b (`nstf devices --topology`): its kind in
 * words ("NVLink", "xGMI", "PCIe", "none (host)"), peer access, and the
 * measured peer-copy bandwidth of 256 MiB (GB/s) and latency of 4 bytes
 * (us). */
nstf_status nstf_gpu_link_measure(int a, int b, char *kind, size_t cap, int *peer, double *gbs, double *lat_us);
/* A tensor-parallel all-reduce of `bytes` (fp32) over GPUs 0..n-1: the
 * mean time of `reps` queued back to back (us), and the transport. */
nstf_status nstf_gpu_allreduce_time(int n, uint64_t bytes, int reps, double *us, char *transport, size_t cap);

/* ---- convolution (the conv2d ladder: kernels, benchmark, PyTorch ops) ------- */

/* Memory layout of a conv2d's input and output, and of its filter:
 *   NCHW: x [n][c][h][w], y [n][k][p][q], w [k][c/groups][r][s] (PyTorch's)
 *   NHWC: x [n][h][w][c], y [n][p][q][k], w [k][r][s][c/groups] (channels_last) */
typedef enum nstf_conv_layout {
    NSTF_CONV_NCHW = 0,
    NSTF_CONV_NHWC = 1,
} nstf_conv_layout;

/* y = conv2d(x, w) + bias, PyTorch's F.conv2d(x, w, bias, stride, padding,
 * dilation, groups): output p = (h + 2 pad_h - dil_h (r - 1) - 1) / stride_h
 * + 1 rows, q likewise. */
typedef struct nstf_conv2d_desc {
    int64_t n, c, h, w; /* input: batch, channels, height, width */
    int64_t k, r, s;    /* output channels, filter height and width */
    int stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
    int groups;         /* divides c and k */
    nstf_conv_layout layout;
} nstf_conv2d_desc;

/* Checks the descriptor (positive sizes, strides and dilations; padding >= 0;
 * groups dividing c and k; a non-empty output; every element count below
 * 2^62) and gives the output height and width. */
nstf_status nstf_conv2d_out_size(const nstf_conv2d_desc *d, int64_t *p, int64_t *q);

/* Multiply-adds x 2 of one forward (the FLOPs of a TFLOP/s figure). */
double nstf_conv2d_flops(const nstf_conv2d_desc *d);

/* The GPU ladder (levels 0 .. nstf_conv2d_levels()-1, see gpu_api.h's
 * nstf_gpu_conv2d) on random bf16 data on the current device: ms per call
 * (mean of `reps` timed back to back with GPU events after one warm-up
 * call), y of y_type F32 or BF16. NSTF_ERR_UNSUPPORTED without a GPU
 * backend or device, or when the level does not take the shape. */
int nstf_conv2d_levels(void);
const char *nstf_conv2d_level_name(int level);
nstf_status nstf_conv2d_bench(const nstf_conv2d_desc *d, int level, int y_bf16, int reps, double *ms);

#ifdef __cplusplus
}
#endif
#endif
