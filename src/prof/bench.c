/* bench.c — pp/tg tests on a session, the backend hooks (name, timer,
 * execution levels) and the model description llama-bench prints. */
#include "prof/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#if defined(NSTF_HAVE_CUDA) || defined(NSTF_HAVE_HIP)
#include "ops/gpu/gpu_api.h"
#define BENCH_GPU 1
#endif

void nstf_bench_model_info_get(const nstf_session *s, nstf_bench_model_info *out) {
    memset(out, 0, sizeof *out);
    const nstf_gguf *g = s->model->file;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        out->size += g->tensors[i].n_bytes;
        out->n_params += g->tensors[i].n_elems;
    }
    char params[32];
    double p = (double)out->n_params;
    if (p >= 1e9) snprintf(params, sizeof params, "%.1fB", p / 1e9);
    else if (p >= 1e6) snprintf(params, sizeof params, "%.0fM", p / 1e6);
    else snprintf(params, sizeof params, "%.0fK", p / 1e3);
    /* the weight type of the layers' matrices names the quantization, as
     * llama.cpp's file type does */
    nstf_type t = s->model->cfg.n_layers > 0 ? s->model->w.layers[0].wq.type : s->model->w.tok_embd.type;
    snprintf(out->model_type, sizeof out->model_type, "llama %s %s", params, nstf_type_name(t));
}

const char *nstf_bench_backend(const nstf_session *s) {
#if defined(NSTF_HAVE_HIP)
    if (s->gpu) return "HIP";
#elif defined(NSTF_HAVE_CUDA)
    if (s->gpu) return "CUDA";
#endif
    (void)s;
    return "CPU";
}

#ifdef BENCH_GPU
/* GPU timer: events recorded on the session's stream; ctx is the stream,
 * the two events are made once per process (bench runs one timer at a time). */
static void *g_ev[2];

static nstf_status gpu_timer_start(nstf_timer *t) {
    if (!g_ev[0]) {
        NSTF_TRY(nstf_gpu_event_create(&g_ev[0]));
        NSTF_TRY(nstf_gpu_event_create(&g_ev[1]));
    }
    return nstf_gpu_event_record(g_ev[0], t->ctx);
}

static nstf_status gpu_timer_stop(nstf_timer *t, uint64_t *ns) {
    float ms = 0;
    NSTF_TRY(nstf_gpu_event_record(g_ev[1], t->ctx));
    NSTF_TRY(nstf_gpu_event_ms(g_ev[0], g_ev[1], &ms));
    *ns = (uint64_t)((double)ms * 1e6);
    return NSTF_OK;
}
#endif

nstf_timer nstf_bench_timer(const nstf_session *s) {
#ifdef BENCH_GPU
    if (s->gpu) {
        nstf_timer t = {0};
        t.name = "gpu events";
        t.ctx = nstf_llama_gpu_stream(s->gpu);
        t.start = gpu_timer_start;
        t.stop = gpu_timer_stop;
        return t;
    }
#endif
    (void)s;
    return nstf_timer_cpu();
}

int nstf_bench_n_levels(const nstf_session *s) {
#ifdef BENCH_GPU
    if (s->gpu) return NSTF_GPU_N_LEVELS;
#endif
    (void)s;
    return 1;
}

nstf_status nstf_bench_set_level(nstf_session *s, int level) {
#ifdef BENCH_GPU
    if (s->gpu) return nstf_llama_gpu_set_level(s->gpu, level);
#endif
    int n = nstf_bench_n_levels(s);
    if (level < 0 || level >= n)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "execution level %d: the %s backend has only one level (L0); levels L1-L3 are GPU "
                              "execution strategies",
                              level, nstf_bench_backend(s));
    return NSTF_OK;
}

static int32_t rand_token(uint64_t *rng, int n_vocab) {
    uint64_t x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    return (int32_t)((x * 2685821657736338717ull >> 33) % (uint64_t)n_vocab);
}

static nstf_status prompt(nstf_session *s, int32_t *toks, int n, int pos0, uint64_t *rng) {
    const int nv = s->model->cfg.n_vocab;
    for (int i = 0; i < n; i++) toks[i] = rand_token(rng, nv);
    return nstf_session_prefill(s, toks, n, pos0);
}

static nstf_status generate(nstf_session *s, int n, int pos0, uint64_t *rng) {
    int32_t tok = rand_token(rng, s->model->cfg.n_vocab);
    for (int i = 0; i < n; i++) {
#ifdef BENCH_GPU
        if (s->gpu) { /* greedy on the device: only the token comes back */
            NSTF_TRY(nstf_llama_gpu_forward(s->gpu, &tok, 1, pos0 + i, false, NULL, &tok));
            continue;
        }
#endif
        NSTF_TRY(nstf_session_prefill(s, &tok, 1, pos0 + i));
        nstf_cpu_argmax(&s->cpu, s->state.logits, &tok, 1, s->model->cfg.n_vocab);
    }
    return NSTF_OK;
}

nstf_status nstf_bench_run(nstf_session *s, const nstf_bench_test *t, uint64_t *rng, uint64_t *samples_ns) {
    if (t->reps < 1 || t->n_prompt < 0 || t->n_gen < 0 || t->n_depth < 0 || (t->n_prompt > 0) == (t->n_gen > 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "a bench test needs one of n_prompt, n_gen > 0 and reps >= 1");
    int64_t need = (int64_t)t->n_depth + t->n_prompt + t->n_gen;
    if (need > s->n_ctx) /* s->n_ctx: of whichever backend runs the forward */
        return nstf_set_error(NSTF_ERR_RANGE, "test needs %lld positions but the context holds %d", (long long)need,
                              s->n_ctx);
    int n_toks = t->n_depth > t->n_prompt ? t->n_depth : t->n_prompt;
    int32_t *toks = nstf_alloc((size_t)(n_toks > 0 ? n_toks : 1) * sizeof *toks, "bench tokens");
    if (!toks) return NSTF_ERR_OOM;
    nstf_status st = NSTF_OK;
    if (t->n_depth > 0) st = prompt(s, toks, t->n_depth, 0, rng);
    if (st == NSTF_OK && t->warmup)
        st = t->n_prompt > 0 ? prompt(s, toks, t->n_prompt, t->n_depth, rng) : generate(s, 1, t->n_depth, rng);
    nstf_timer timer = nstf_bench_timer(s);
    for (int r = 0; st == NSTF_OK && r < t->reps; r++) {
        st = nstf_timer_start(&timer);
        if (st == NSTF_OK)
            st = t->n_prompt > 0 ? prompt(s, toks, t->n_prompt, t->n_depth, rng) : generate(s, t->n_gen, t->n_depth, rng);
        if (st == NSTF_OK) st = nstf_timer_stop(&timer, &samples_ns[r]);
    }
    nstf_free(toks);
    return st;
}
