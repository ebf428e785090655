/* bench.c — pp/tg tests on a session, what llama-bench prints of the
 * backend (name, timer, levels, KV type) and of the model. */
#include "prof/bench.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/mem.h"
#include "model/session.h"

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

const char *nstf_bench_backend(const nstf_session *s) { return s->be->vt->name; }

void nstf_bench_backend_info_get(const nstf_session *s, nstf_bench_backend_info *out) {
    const nstf_backend *be = s->be;
    out->type_k = out->type_v = nstf_session_kv_type(s);
    out->n_gpu_layers = be->host_memory ? 0 : s->model->cfg.n_layers;
    /* the CPU and the GPU from level 2 attend with an online softmax over
     * tiles; GPU levels 0 and 1 materialize the score matrix */
    out->flash_attn = be->host_memory || be->vt->get_opt(be, NSTF_OPT_LEVEL) >= 2;
}

/* The timer on two of the backend's marks (the profiler, when attached,
 * uses the others: these are the last two it reserved, or 0 and 1). */
static nstf_status mark_start(nstf_timer *t) {
    nstf_backend *be = t->ctx;
    NSTF_TRY(be->vt->marks_reserve(be, 2));
    return be->vt->mark(be, 0);
}

static nstf_status mark_stop(nstf_timer *t, uint64_t *ns) {
    nstf_backend *be = t->ctx;
    NSTF_TRY(be->vt->mark(be, 1));
    return be->vt->mark_ns(be, 0, 1, ns);
}

nstf_timer nstf_bench_timer(nstf_session *s) {
    nstf_timer t = {0};
    t.name = s->be->host_memory ? "monotonic clock" : "gpu events";
    t.ctx = s->be;
    t.start = mark_start;
    t.stop = mark_stop;
    return t;
}

int nstf_bench_n_levels(const nstf_session *s) { return s->be->vt->n_levels; }

nstf_status nstf_bench_set_level(nstf_session *s, int level) {
    return s->be->vt->set_opt(s->be, NSTF_OPT_LEVEL, level);
}

int32_t nstf_bench_token(uint64_t *rng, int n_vocab) {
    uint64_t x = *rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *rng = x;
    return (int32_t)((x * 2685821657736338717ull >> 33) % (uint64_t)n_vocab);
}

static nstf_status prompt(nstf_session *s, int32_t *toks, int n, int pos0, uint64_t *rng) {
    const int nv = s->model->cfg.n_vocab;
    for (int i = 0; i < n; i++) toks[i] = nstf_bench_token(rng, nv);
    return nstf_session_prefill(s, toks, n, pos0);
}

static nstf_status generate(nstf_session *s, int n, int pos0, bool argmax_only, uint64_t *rng) {
    const int nv = s->model->cfg.n_vocab;
    int32_t tok = nstf_bench_token(rng, nv);
    for (int i = 0; i < n; i++) {
        if (argmax_only) { /* greedy on the backend: only the token comes back */
            NSTF_TRY(nstf_session_forward(s, &tok, 1, pos0 + i, false, NULL, &tok));
        } else { /* the logits come back, as llama_decode does; the next token is random */
            NSTF_TRY(nstf_session_forward(s, &tok, 1, pos0 + i, false, s->logits, NULL));
            tok = nstf_bench_token(rng, nv);
        }
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
        st = t->n_prompt > 0 ? prompt(s, toks, t->n_prompt, t->n_depth, rng) : generate(s, 1, t->n_depth, t->argmax_only, rng);
    nstf_timer timer = nstf_bench_timer(s);
    for (int r = 0; st == NSTF_OK && r < t->reps; r++) {
        st = nstf_timer_start(&timer);
        if (st == NSTF_OK)
            st = t->n_prompt > 0 ? prompt(s, toks, t->n_prompt, t->n_depth, rng) : generate(s, t->n_gen, t->n_depth, t->argmax_only, rng);
        if (st == NSTF_OK) st = nstf_timer_stop(&timer, &samples_ns[r]);
    }
    nstf_free(toks);
    return st;
}
