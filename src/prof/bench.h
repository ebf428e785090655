/* bench.h — the timed tests of `nstf bench` on an open session, in
 * llama-bench's terms:
 *   pp N  process N random tokens as one prompt (chunks of n_batch) from
 *         the given depth; the whole prefill is timed;
 *   tg N  generate N tokens one forward at a time from the given depth;
 *         as llama-bench, each forward brings its logits back to the host
 *         and the next token is drawn at random (or, argmax_only, only the
 *         greedy token computed on the backend comes back: 4 bytes);
 *   depth D: D random tokens are in the KV cache before the test (filled
 *         once, untimed; the test only writes positions >= D).
 * One untimed warm-up run precedes the timed repetitions (a full prompt
 * for pp, one token for tg, as llama-bench does). Times come from the
 * backend's timer (nstf_bench_timer), so a GPU backend times with events.
 *
 * Execution levels (L0 separate kernels ... L3 graph/persistent) belong to
 * GPU backends; nstf_bench_n_levels() is the hook, and the CPU backend has
 * exactly one level. */
#ifndef NSTF_PROF_BENCH_H
#define NSTF_PROF_BENCH_H

#include <stdbool.h>
#include <stdint.h>

#include "nstf.h"
#include "prof/timer.h"

typedef struct nstf_bench_model_info {
    char model_type[128]; /* "llama 135M Q4_1" */
    uint64_t size;        /* bytes of tensor data */
    uint64_t n_params;
} nstf_bench_model_info;

void nstf_bench_model_info_get(const nstf_session *s, nstf_bench_model_info *out);

/* The session's backend name as llama-bench writes it ("CPU") and its timer
 * (two of the backend's time marks: a clock on the CPU, events on a GPU). */
const char *nstf_bench_backend(const nstf_session *s);
nstf_timer nstf_bench_timer(nstf_session *s);

/* The fields of a llama-bench record that describe the backend, true for
 * the session: KV cache element type ("f32", "bf16"), layers on a GPU, and
 * whether attention runs without a materialized score matrix. */
typedef struct nstf_bench_backend_info {
    const char *type_k, *type_v;
    int n_gpu_layers;
    bool flash_attn;
} nstf_bench_backend_info;
void nstf_bench_backend_info_get(const nstf_session *s, nstf_bench_backend_info *out);

/* Execution levels of the session's backend (1 on the CPU), and selecting
 * one (level >= n_levels is NSTF_ERR_UNSUPPORTED naming the backend). */
int nstf_bench_n_levels(const nstf_session *s);
nstf_status nstf_bench_set_level(nstf_session *s, int level);

typedef struct nstf_bench_test {
    int n_prompt, n_gen, n_depth; /* exactly one of n_prompt, n_gen > 0 */
    int reps;                     /* timed repetitions, >= 1 */
    bool warmup;
    bool argmax_only;             /* tg: bring back only the greedy token (4 bytes)
                                     instead of the logits, as llama-bench does */
} nstf_bench_test;

/* Run one test; samples_ns[reps] receives each repetition's time. The
 * session's context must hold n_depth + n_prompt + n_gen positions.
 * rng is a caller-held xorshift state for the random tokens. */
nstf_status nstf_bench_run(nstf_session *s, const nstf_bench_test *t, uint64_t *rng, uint64_t *samples_ns);

/* A random token id in [0, n_vocab) from the xorshift state rng. */
int32_t nstf_bench_token(uint64_t *rng, int n_vocab);

/* One batched decode step as nstf serve runs it (bench_batch.c): n_seq
 * sequences of a paged KV cache, each with n_depth positions already
 * there, decode one token each in one forward that asks for every row's
 * greedy token on the backend (n_seq ids cross to the host), or with
 * logits_host every row's logits copied to the host as well (what rows
 * that draw or report log-probabilities cost). The session must be opened
 * shaped (nstf_session_open_shaped) for at least n_seq sequences over
 * blocks of nstf_bench_batch_block positions, nstf_bench_batch_blocks(n_seq,
 * n_depth) of them, with a batch of at least n_seq tokens. Wall time of
 * each step, the forward's last copy to the host included. */
#define nstf_bench_batch_block 16
typedef struct nstf_bench_batch_test {
    int n_seq, n_depth, reps;
    bool warmup, logits_host;
} nstf_bench_batch_test;
int nstf_bench_batch_blocks(int n_seq, int n_depth);
/* A session shaped for tests of up to max_seq sequences at depth n_depth
 * (p's n_batch and n_ctx are set from them). */
nstf_status nstf_bench_batch_open(const char *model, const nstf_session_params *p, int max_seq, int n_depth,
                                  nstf_session **out);
nstf_status nstf_bench_decode_batch(nstf_session *s, const nstf_bench_batch_test *t, uint64_t *rng,
                                    uint64_t *samples_ns);

#endif
