/* session_tools.c — the accessors of nstf_tools.h: what the command-line
 * tools, tests and benchmarks may ask of a session and its backend. */
#include "backend/backend.h"
#include "model/session.h"

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
const char *nstf_session_kv_type(const nstf_session *s) { return s->be->kv_type == NSTF_TYPE_F32 ? "f32" : "bf16"; }

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
