/* session_tools.c — the accessors of nstf_tools.h: what the command-line
 * tools, tests and benchmarks may ask of a session and its backend. */
#include "backend/backend.h"
#include "model/session.h"

#include <stdio.h>

#include "core/clock.h"
#include "dist/comm.h"
#include "ops/gpu/gpu_api.h"

_Static_assert((int)NSTF_SESSION_LEVEL == (int)NSTF_OPT_LEVEL && (int)NSTF_SESSION_GRAPHS == (int)NSTF_OPT_GRAPHS &&
                   (int)NSTF_SESSION_FUSED == (int)NSTF_OPT_FUSED,
               "nstf_session_opt and nstf_backend_opt disagree");

int nstf_session_n_vocab(const nstf_session *s) { return s->model->cfg.n_vocab; }
int nstf_session_n_layers(const nstf_session *s) { return s->model->cfg.n_layers; }
int nstf_session_n_ctx(const nstf_session *s) { return s->n_ctx; }
int nstf_session_n_batch(const nstf_session *s) { return s->n_batch; }
const char *nstf_session_path(const nstf_session *s) { return s->model->file->path; }
const float *nstf_session_logits(const nstf_session *s) { return s->logits; }
int64_t nstf_session_token_piece(const nstf_session *s, int32_t id, char *buf, size_t cap) {
    return nstf_tokenizer_piece(s->tok, id, buf, cap);
}
const char *nstf_session_kv_type(const nstf_session *s) {
    return s->kv_q8 ? "q8_0" : s->be->kv_type == NSTF_TYPE_F32 ? "f32" : s->be->kv_type == NSTF_TYPE_F16 ? "f16" : "bf16";
}

nstf_status nstf_session_tokenize_alloc(nstf_session *s, const char *text, size_t len, bool parse_special,
                                        int32_t **ids, int64_t *n) {
    return nstf_tokenizer_encode(s->tok, text, len, nstf_tokenizer_wants_bos(s->tok), parse_special, ids, n);
}

const char *nstf_session_backend_name(const nstf_session *s) { return s->be->vt->name; }
const char *nstf_session_device(const nstf_session *s) { return s->be->device; }
bool nstf_session_on_gpu(const nstf_session *s) { return !s->be->host_memory; }

int nstf_session_threads(const nstf_session *s) {
    nstf_pool *pool = nstf_backend_cpu_pool(s->be);
    return pool ? nstf_pool_size(pool) : 0;
}

int nstf_session_n_levels(const nstf_session *s) { return s->be->vt->n_levels; }
int nstf_session_get_opt(const nstf_session *s, nstf_session_opt opt) {
    return s->be->vt->get_opt(s->be, (nstf_backend_opt)opt);
}
nstf_status nstf_session_set_opt(nstf_session *s, nstf_session_opt opt, int value) {
    return s->be->vt->set_opt(s->be, (nstf_backend_opt)opt, value);
}
int64_t nstf_session_kernels(const nstf_session *s) { return s->be->vt->kernels(s->be); }
int64_t nstf_session_graph_kernels(const nstf_session *s) { return s->be->vt->graph_kernels(s->be); }
const char *nstf_l4_kind_name(int kind) {
    static const char *const k[NSTF_L4_KINDS] = {"embedding", "qkv+rope", "attention", "out-proj",
                                                 "gate/up",   "down",     "logits"};
    return kind >= 0 && kind < NSTF_L4_KINDS ? k[kind] : "?";
}
const char *nstf_session_l4_status(nstf_session *s, int64_t *instructions) {
    return nstf_backend_gpu_l4_status(s->be, instructions);
}
nstf_status nstf_session_l4_profile(nstf_session *s, bool on) { return nstf_backend_gpu_l4_profile(s->be, on); }
nstf_status nstf_session_l4_profile_get(nstf_session *s, nstf_l4_profile *out) {
    return nstf_backend_gpu_l4_profile_get(s->be, out);
}

void nstf_session_mem_get(const nstf_session *s, nstf_session_mem *out) {
    nstf_backend_mem mem;
    s->be->vt->mem(s->be, &mem);
    const nstf_llama_state *st = &s->run->s;
    out->weights = s->run->wbytes;
    out->kv_cache = st->kv_bytes;
    out->activations = st->block_bytes > st->kv_bytes ? st->block_bytes - st->kv_bytes : 0;
    out->workspace = mem.workspace;
}

const char *nstf_gpu_runtime(void) { return nstf_backend_gpu_runtime(); }
int nstf_gpu_count(void) { return nstf_backend_gpu_count(); }
nstf_status nstf_gpu_describe(int dev, char *buf, size_t cap) { return nstf_backend_gpu_line(dev, buf, cap); }

nstf_status nstf_gpu_link_measure(int a, int b, char *kind, size_t cap, int *peer, double *gbs, double *lat_us) {
    nstf_gpu_link l;
    NSTF_TRY(nstf_gpu_link_query(a, b, &l));
    snprintf(kind, cap, "%s", l.link);
    *peer = l.access;
    return nstf_gpu_p2p_measure(a, b, (size_t)256 << 20, gbs, lat_us);
}

typedef struct ar_job {
    nstf_comm *c;
    nstf_backend **be;
    float *buf[NSTF_COMM_MAX];
    int64_t n;
    int reps;
} ar_job;

static nstf_status ar_rank(void *ctx, int r) {
    ar_job *j = ctx;
    for (int i = 0; i < j->reps; i++) NSTF_TRY(nstf_comm_allreduce(j->c, r, j->buf[r], j->n));
    return j->be[r]->vt->sync(j->be[r]);
}

nstf_status nstf_gpu_allreduce_time(int n, uint64_t bytes, int reps, double *us, char *transport, size_t cap) {
    if (n < 1 || n > NSTF_COMM_MAX || reps < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "all-reduce over %d GPUs", n);
    nstf_backend *be[NSTF_COMM_MAX] = {0};
    ar_job j = {.be = be, .n = (int64_t)(bytes / sizeof(float)), .reps = 1};
    nstf_status st = NSTF_OK;
    for (int r = 0; r < n && st == NSTF_OK; r++) st = nstf_backend_gpu_create(r, &be[r]);
    for (int r = 0; r < n && st == NSTF_OK; r++) {
        st = be[r]->vt->alloc(be[r], bytes, (void **)&j.buf[r]);
        if (st == NSTF_OK) st = be[r]->vt->zero(be[r], j.buf[r], bytes);
    }
    if (st == NSTF_OK) st = nstf_comm_create(be, n, 0, &j.c);
    if (st == NSTF_OK) st = nstf_comm_run(j.c, ar_rank, &j); /* warm-up */
    if (st == NSTF_OK) {
        j.reps = reps;
        const double t0 = nstf_time_ms();
        st = nstf_comm_run(j.c, ar_rank, &j);
        *us = (nstf_time_ms() - t0) * 1e3 / reps;
        snprintf(transport, cap, "%s", nstf_comm_transport(j.c));
    }
    nstf_comm_free(j.c);
    for (int r = 0; r < n; r++)
        if (be[r]) {
            if (j.buf[r]) be[r]->vt->free(be[r], j.buf[r]);
            nstf_backend_free(be[r]);
        }
    return st;
}
