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
/* The token ids nstf_session_complete evaluates for this prompt (*ids is
 * malloc'd), and the bytes of one token (nstf_tokenizer_piece's contract). */
nstf_status nstf_session_prompt_tokens(nstf_session *s, const char *prompt, bool chat, const char *system,
                                       bool special, int32_t **ids, int64_t *n_ids);
int64_t nstf_session_token_piece(const nstf_session *s, int32_t id, char *buf, size_t cap);
/* The element type of the KV cache ("f32" on the CPU, "bf16" on a GPU). */
const char *nstf_session_kv_type(const nstf_session *s);

/* ---- the backend ------------------------------------------------------------ */

/* "CPU", "CUDA" or "HIP"; the device's one-line description; whether the
 * run is on a GPU; CPU threads (0 on a GPU). */
const char *nstf_session_backend_name(const nstf_session *s);
const char *nstf_session_device(const nstf_session *s);
bool nstf_session_on_gpu(const nstf_session *s);
int nstf_session_threads(const nstf_session *s);

/* Execution strategies of the backend (values as backend.h's options). */
typedef enum nstf_session_opt {
    NSTF_SESSION_LEVEL = 0,  /* execution level 0 .. n_levels-1 (GPU: L0 baseline .. L3 ultra) */
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

#ifdef __cplusplus
}
#endif
#endif
