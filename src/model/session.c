/* session.c — load a model into a session, pick the device (CPU, or the GPU
 * when the build has a backend and a device answers), prefill, generate. */
#include "model/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"
#include "dist/proc.h"
#include "io/hf_model.h"
#include "io/utf8.h"

uint64_t nstf_time_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
}

nstf_status nstf_session_cache_type(const char *k, const char *v, bool *q8) {
    const char *t[2] = {k && *k ? k : "auto", v && *v ? v : "auto"};
    bool is_q8[2];
    for (int i = 0; i < 2; i++) {
        if (strcmp(t[i], "auto") != 0 && strcmp(t[i], "q8_0") != 0)
            return nstf_set_error(NSTF_ERR_INVALID_ARG,
                                  "--cache-type-%c %s: use q8_0, or auto (the device's own: f32 on the CPU, bf16 on a "
                                  "GPU)",
                                  i ? 'v' : 'k', t[i]);
        is_q8[i] = strcmp(t[i], "q8_0") == 0;
    }
    if (is_q8[0] != is_q8[1])
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "--cache-type-k %s with --cache-type-v %s: keys and values take the same cache type", t[0],
                              t[1]);
    *q8 = is_q8[0];
    return NSTF_OK;
}

/* Prompt tokens per forward pass when the caller leaves n_batch 0. On a
 * GPU the 8B shape's prefill of 8192 tokens runs at 25.5k tokens/s in
 * passes of 512 and 32.0k in passes of 2048 (one H200, docs/PERFORMANCE.md,
 * "The 8B shape against llama.cpp"): the GEMMs need the larger M. The
 * workspace grows with it (about 1.4 GiB at 2048 for the 8B shape), so a
 * GPU where it does not fit falls back to SESSION_BATCH_CPU. */
#define SESSION_BATCH_GPU 2048
#define SESSION_BATCH_CPU 512

nstf_session_params nstf_session_default_params(void) {
    nstf_session_params p = {.n_ctx = 0, .n_batch = 0, .n_threads = 0, .device = "auto", .verbose = false};
    return p;
}

/* A run (or a stage: layers [l0, l1)) of the session's shape on be. */
static nstf_status run_create(nstf_session *s, nstf_backend *be, int n_ctx, int l0, int l1, bool embed, bool output,
                              nstf_llama_run **out) {
    const nstf_session_shape *h = &s->shape;
    const nstf_llama_run_shape sh = {n_ctx, s->params.n_batch, h->n_seq, l0, l1, embed, output, h->kv_block,
                                     h->kv_blocks, s->kv_q8};
    return nstf_llama_run_create_shaped(s->model, be, &sh, out);
}

/* Place the model on the GPU when asked (gpu) or possible (auto). gpu: any
 * failure is the session's error. auto: a missing device or a failing
 * start leaves s->run NULL (the CPU runs) and says why with --verbose. */
static nstf_status open_gpu(nstf_session *s, int n_ctx) {
    const nstf_session_params *p = &s->params;
    const bool want = strcmp(p->device, "gpu") == 0, maybe = strcmp(p->device, "auto") == 0;
    if (!want && !maybe) return NSTF_OK;
    if (!nstf_backend_gpu_built()) {
        if (p->verbose) fprintf(stderr, "nstf: this build has no GPU backend; running on the CPU\n");
        return NSTF_OK;
    }
    if (nstf_backend_gpu_count() < 1) {
        if (want)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                                  "--device gpu: no GPU found (no device visible, or the driver is missing or "
                                  "failed to start)");
        if (p->verbose) fprintf(stderr, "nstf: no GPU found; running on the CPU\n");
        return NSTF_OK;
    }
    const int L = s->model->cfg.n_layers, ngl = p->n_gpu_layers <= 0 || p->n_gpu_layers > L ? L : p->n_gpu_layers;
    const int batch0 = p->n_batch; /* 0: the default, larger on a GPU (SESSION_BATCH_GPU) */
    if (!batch0) s->params.n_batch = SESSION_BATCH_GPU;
    nstf_status st = nstf_backend_gpu_create(0, &s->be);
    if (st == NSTF_OK) st = run_create(s, s->be, n_ctx, 0, ngl, true, ngl == L, &s->run);
    if (st == NSTF_ERR_OOM && !batch0) { /* the default's larger workspace does not fit: the CPU's default */
        if (p->verbose) fprintf(stderr, "nstf: batch %d does not fit on the GPU (%s); batch %d\n", SESSION_BATCH_GPU,
                                nstf_last_error(), SESSION_BATCH_CPU);
        s->params.n_batch = SESSION_BATCH_CPU;
        st = run_create(s, s->be, n_ctx, 0, ngl, true, ngl == L, &s->run);
    }
    if (st == NSTF_OK && ngl < L) { /* the rest of the layers and the output head on the CPU */
        const nstf_cpu_params cp = {p->n_threads, p->precise, p->deterministic, p->cpu_act_bits};
        st = nstf_backend_cpu_create(&cp, &s->be_cpu);
        if (st == NSTF_OK) st = run_create(s, s->be_cpu, n_ctx, ngl, L, false, true, &s->run_cpu);
        if (st == NSTF_OK) s->run->next = s->run_cpu;
    }
    if (st != NSTF_OK) {
        nstf_llama_run_free(s->run_cpu);
        nstf_backend_free(s->be_cpu);
        nstf_llama_run_free(s->run);
        nstf_backend_free(s->be);
        s->run = s->run_cpu = NULL;
        s->be = s->be_cpu = NULL;
        s->params.n_batch = batch0;
        if (want) return st;
        if (p->verbose) fprintf(stderr, "nstf: GPU not used (%s); running on the CPU\n", nstf_last_error());
    }
    return NSTF_OK;
}

/* A tensor-parallel run over p->n_tp backends: GPUs (the list p->gpus,
 * or 0..n-1) unless the device is "cpu". Launched by mpirun, this process
 * opens its rank's backend only: the GPU of its place on its machine (the
 * list's entry there), or its share of the threads. */
static nstf_status open_tp(nstf_session *s, int n_ctx) {
    const nstf_session_params *p = &s->params;
    const int n = p->n_tp;
    if (n > 16) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--tp %d: at most 16 ranks", n);
    const int self = nstf_proc_active() ? nstf_proc_rank() : -1; /* (create_tp checks n against the launch) */
    const bool cpu = strcmp(p->device, "cpu") == 0 || (strcmp(p->device, "auto") == 0 && nstf_backend_gpu_count() < 1);
    int dev[16];
    const char *g = p->gpus;
    for (int r = 0; r < n; r++) {
        dev[r] = r;
        if (!g || cpu) continue;
        char *end;
        const long v = strtol(g, &end, 10);
        if (end == g || v < 0 || v > 1023)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "--gpus '%s': give %d device numbers, such as 0,1", p->gpus, n);
        dev[r] = (int)v;
        g = *end == ',' ? end + 1 : end;
    }
    if (g && !cpu && *g)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--gpus '%s' lists more devices than --tp %d", p->gpus, n);
    nstf_status st = NSTF_OK;
    const int here = self >= 0 ? nstf_proc_local_size() : n; /* the ranks on this machine */
    for (int r = 0; r < n && st == NSTF_OK; r++) {
        if (self >= 0 && r != self) continue;
        if (cpu) {
            const int th = p->n_threads ? (p->n_threads + here - 1) / here : 0;
            const nstf_cpu_params cp = {th, p->precise, p->deterministic, p->cpu_act_bits};
            st = nstf_backend_cpu_create(&cp, &s->be_tp[r]);
        } else {
            st = nstf_backend_gpu_create(dev[self >= 0 ? nstf_proc_local_rank() : r], &s->be_tp[r]);
        }
    }
    if (st == NSTF_OK) {
        const nstf_session_shape *h = &s->shape;
        if (!p->n_batch) s->params.n_batch = cpu ? SESSION_BATCH_CPU : SESSION_BATCH_GPU;
        const nstf_llama_run_shape sh = {n_ctx, p->n_batch, h->n_seq, 0, s->model->cfg.n_layers, true, true,
                                         h->kv_block, h->kv_blocks, s->kv_q8};
        st = nstf_llama_run_create_tp(s->model, s->be_tp, n, &sh, p->tp_timeout_ms, &s->run);
    }
    if (st != NSTF_OK) {
        for (int r = 0; r < n; r++) nstf_backend_free(s->be_tp[r]);
        memset(s->be_tp, 0, sizeof s->be_tp);
        return st;
    }
    s->be = s->be_tp[self >= 0 ? self : 0];
    s->be_tp[self >= 0 ? self : 0] = NULL; /* (freed as s->be) */
    if (p->verbose && self <= 0)
        fprintf(stderr, "nstf: tensor parallel over %d ranks (%s), rank 0 on %s\n", n, nstf_llama_run_tp_transport(s->run),
                s->be->device);
    return NSTF_OK;
}

/* The chat template: the one named (a family's plain form), else the
 * model's, else plain ChatML. */
static nstf_status pick_template(nstf_session *s, const char *name) {
    if (name) {
        const char *t = nstf_chat_family_template(name);
        if (!t)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "unknown chat template '%s' (%s)", name, NSTF_CHAT_TEMPLATE_NAMES);
        if (!(s->tmpl = strdup(t))) return nstf_set_error(NSTF_ERR_OOM, "out of memory");
        s->tmpl_family = nstf_chat_family(t);
        return NSTF_OK;
    }
    s->tmpl = nstf_chat_template_of(s->model->file);
    s->tmpl_from_model = s->tmpl != NULL;
    s->tmpl_family = nstf_chat_family(s->tmpl);
    return NSTF_OK;
}

nstf_status nstf_session_forward(nstf_session *s, const int32_t *tokens, int n, int pos0, bool all_logits,
                                 float *logits, int32_t *argmax) {
    return nstf_llama_forward_seq(s->run, tokens, n, pos0, all_logits, logits, argmax);
}

nstf_status nstf_session_open(const char *path, const nstf_session_params *pp, nstf_session **out) {
    return nstf_session_open_shaped(path, pp, NULL, out);
}

nstf_status nstf_session_open_shaped(const char *path, const nstf_session_params *pp, const nstf_session_shape *shape,
                                     nstf_session **out) {
    *out = NULL;
    nstf_session_params p = pp ? *pp : nstf_session_default_params();
    if (!path || !*path) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no model path given");
    if (p.n_ctx < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "context size %d must be positive", p.n_ctx);
    if (p.n_batch < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "batch size %d must be positive", p.n_batch);
    if (p.n_threads < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "thread count %d must be positive", p.n_threads);
    if (p.n_tp < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "tensor-parallel rank count %d", p.n_tp);
    if (p.n_gpu_layers < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "GPU layer count %d must be >= 0 (0: all)", p.n_gpu_layers);
    if (!p.device) p.device = "auto";
    if (strcmp(p.device, "cpu") != 0 && strcmp(p.device, "auto") != 0 && strcmp(p.device, "gpu") != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "unknown device '%s' (use cpu, gpu or auto)", p.device);
    if (strcmp(p.device, "gpu") == 0 && !nstf_backend_gpu_built())
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--device gpu: this build has no GPU backend (build with NSTF_CUDA=ON or NSTF_HIP=ON)");

    bool kv_q8 = false;
    NSTF_TRY(nstf_session_cache_type(p.cache_type_k, p.cache_type_v, &kv_q8));
    if (kv_q8 && p.sparse_attn > 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--cache-type q8_0 with sparse attention is not supported");

    double t0 = nstf_time_ms();
    nstf_session *s = nstf_calloc(1, sizeof *s, "session");
    if (!s) return NSTF_ERR_OOM;
    s->params = p;
    s->kv_q8 = kv_q8;
    s->shape = shape ? *shape : (nstf_session_shape){1, 0, 0};
    nstf_gguf *g = NULL;
    nstf_status st = nstf_model_file_open(path, &g);
    if (st == NSTF_OK) {
        st = nstf_llama_load(g, &s->model);
        if (st != NSTF_OK) nstf_gguf_close(g);
    }
    if (st == NSTF_OK) st = nstf_tokenizer_from_gguf(g, &s->tok);
    if (st == NSTF_OK && nstf_tokenizer_n_vocab(s->tok) != s->model->cfg.n_vocab)
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding has %d rows", path,
                            nstf_tokenizer_n_vocab(s->tok), s->model->cfg.n_vocab);
    if (st == NSTF_OK) {
        int n_ctx = p.n_ctx ? p.n_ctx : (s->model->cfg.n_ctx_train < 4096 ? s->model->cfg.n_ctx_train : 4096);
        if (p.n_ctx > s->model->cfg.n_ctx_train && p.verbose)
            fprintf(stderr, "nstf: context %d is longer than the %d the model was trained for\n", p.n_ctx,
                    s->model->cfg.n_ctx_train);
        s->params.n_ctx = n_ctx;
        if (p.n_tp > 1) st = open_tp(s, n_ctx);
        else st = open_gpu(s, n_ctx);
        if (st == NSTF_OK && !s->run) {
            if (!s->params.n_batch) s->params.n_batch = SESSION_BATCH_CPU;
            const nstf_cpu_params cp = {p.n_threads, p.precise, p.deterministic, p.cpu_act_bits};
            st = nstf_backend_cpu_create(&cp, &s->be);
            if (st == NSTF_OK) st = run_create(s, s->be, n_ctx, 0, s->model->cfg.n_layers, true, true, &s->run);
        }
    }
    if (st == NSTF_OK) {
        s->n_ctx = s->run->s.n_ctx;
        s->n_batch = s->run->s.n_batch;
        s->logits = nstf_alloc((size_t)s->model->cfg.n_vocab * sizeof(float), "logits");
        s->hist = nstf_alloc((size_t)s->n_ctx * sizeof(int32_t), "token history");
        if (!s->logits || !s->hist) st = NSTF_ERR_OOM;
    }
    if (st == NSTF_OK) st = nstf_session_sparse_apply(s);
    if (st == NSTF_OK) st = pick_template(s, p.chat_template);
    if (st != NSTF_OK) {
        nstf_session_close(s);
        return st;
    }
    s->load_ms = nstf_time_ms() - t0;
    if (p.verbose) {
        const nstf_llama_config *c = &s->model->cfg;
        fprintf(stderr, "nstf: %s: %s, %d layers, dim %d, %d heads (%d kv, head %d), ffn %d, vocab %d, trained ctx %d\n",
                path, c->arch->name, c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->n_vocab,
                c->n_ctx_train);
        const nstf_llama_state *rs = &s->run->s;
        nstf_backend_mem mem;
        s->be->vt->mem(s->be, &mem);
        fprintf(stderr, "nstf: device %s\nnstf: context %d, batch %d, weights %.1f MiB, state %.1f MiB, workspace %.1f "
                "MiB, loaded in %.0f ms\n",
                s->be->device, s->n_ctx, s->n_batch, (double)s->run->wbytes / (1 << 20),
                (double)rs->block_bytes / (1 << 20), (double)mem.workspace / (1 << 20), s->load_ms);
        if (s->run_cpu)
            fprintf(stderr, "nstf: split: embedding and layers 0-%d on the GPU, layers %d-%d and the output on the CPU "
                    "(%d threads; state %.1f MiB there)\n",
                    s->run->l1 - 1, s->run_cpu->l0, s->run_cpu->l1 - 1, nstf_pool_size(nstf_backend_cpu_pool(s->be_cpu)),
                    (double)s->run_cpu->s.block_bytes / (1 << 20));
    }
    *out = s;
    return NSTF_OK;
}

void nstf_session_close(nstf_session *s) {
    if (!s) return;
    nstf_llama_run_free(s->run_cpu);
    nstf_backend_free(s->be_cpu);
    nstf_llama_run_free(s->run);
    for (int r = 0; r < 16; r++) nstf_backend_free(s->be_tp[r]); /* (s->be is one of them, taken out) */
    nstf_backend_free(s->be);
    nstf_free(s->logits);
    nstf_free(s->hist);
    free(s->tmpl);
    nstf_tokenizer_free(s->tok);
    nstf_llama_free(s->model);
    nstf_free(s);
}

/* Prefill; the last chunk's logits go to s->logits, or only its greedy
 * token to *argmax when that is given on a GPU session. */
static nstf_status prefill(nstf_session *s, const int32_t *tokens, int n, int pos0, int32_t *argmax) {
    if (pos0 + n > s->n_ctx)
        return nstf_set_error(NSTF_ERR_RANGE,
                              "the prompt (%d tokens) does not fit the context of %d tokens; raise -c or shorten it",
                              pos0 + n, s->n_ctx);
    for (int i = 0; i < n; i += s->n_batch) {
        int chunk = n - i < s->n_batch ? n - i : s->n_batch;
        bool last = i + chunk >= n;
        NSTF_TRY(nstf_llama_forward_prompt(s->run, tokens + i, chunk, pos0 + i, last && !argmax ? s->logits : NULL,
                                           last ? argmax : NULL));
    }
    return NSTF_OK;
}

nstf_status nstf_session_prefill(nstf_session *s, const int32_t *tokens, int n, int pos0) {
    return prefill(s, tokens, n, pos0, NULL);
}

nstf_status nstf_session_eval_all(nstf_session *s, const int32_t *tokens, int n, float *out) {
    if (n > s->n_ctx) return nstf_set_error(NSTF_ERR_RANGE, "%d tokens do not fit the context of %d", n, s->n_ctx);
    const int64_t nv = s->model->cfg.n_vocab;
    for (int i = 0; i < n; i += s->n_batch) {
        int chunk = n - i < s->n_batch ? n - i : s->n_batch;
        NSTF_TRY(nstf_session_forward(s, tokens + i, chunk, i, true, out + (int64_t)i * nv, NULL));
    }
    return NSTF_OK;
}


/* ---- the token history and generation ----------------------------------------
 * s->hist[0 .. n_past) are the tokens whose keys and values the cache holds
 * at positions 0 .. n_past - 1 (sequence 0). Everything below appends to it
 * or cuts it; nstf_session_forward / prefill called directly (benchmarks)
 * leave it alone. */

nstf_gen_params nstf_gen_default_params(void) {
    nstf_gen_params g = {.n_predict = 128, .n_keep = 0};
    return g;
}

static bool interrupted(const nstf_gen_params *gp) { return gp && gp->interrupt && *gp->interrupt; }

bool nstf_text_add(nstf_text *t, const char *p, size_t n) {
    if (t->oom) return false;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1) cap *= 2;
        char *q = realloc(t->p, cap);
        if (!q) {
            t->oom = true;
            return false;
        }
        t->p = q;
        t->cap = cap;
    }
    memcpy(t->p + t->len, p, n);
    t->len += n;
    t->p[t->len] = 0;
    return true;
}

void nstf_session_rewind(nstf_session *s, int n_past) {
    if (n_past < s->n_past) s->n_past = n_past < 0 ? 0 : n_past;
}

/* Evaluate n tokens after the history in chunks of n_batch (the last
 * token's logits, or its greedy token on a GPU session, come back), as
 * prompt rows (nstf_llama_forward_prompt: computed as nstf serve computes
 * them, whatever the chunk's size). Stops
 * between chunks when interrupted (*stopped set; the history holds what
 * was evaluated). Room must have been made. */
static nstf_status eval(nstf_session *s, const int32_t *ids, int64_t n, const nstf_gen_params *gp, bool *stopped) {
    for (int64_t i = 0; i < n; i += s->n_batch) {
        if (interrupted(gp)) {
            *stopped = true;
            return NSTF_OK;
        }
        const int chunk = n - i < s->n_batch ? (int)(n - i) : s->n_batch;
        const bool last = i + chunk >= n;
        NSTF_TRY(nstf_llama_forward_prompt(s->run, ids + i, chunk, s->n_past, last && !s->dev_greedy ? s->logits : NULL,
                                           last && s->dev_greedy ? &s->next : NULL));
        memcpy(s->hist + s->n_past, ids + i, (size_t)chunk * sizeof(int32_t));
        s->n_past += chunk;
    }
    return NSTF_OK;
}

/* llama.cpp's context shift: keep hist[0, n_keep), drop the oldest half of
 * the rest, and evaluate the kept tail again at its new positions (RoPE is
 * applied to the cached keys, so moving them would need a re-rotation;
 * evaluating again is exact). False when nothing can be dropped. */
static nstf_status shift(nstf_session *s, const nstf_gen_params *gp, nstf_gen_stats *st, bool *shifted, bool *stopped) {
    const int keep = s->n_keep < s->n_past ? s->n_keep : s->n_past, n_left = s->n_past - keep, n_discard = n_left / 2;
    *shifted = n_discard > 0;
    if (!*shifted) return NSTF_OK;
    const int n_tail = n_left - n_discard;
    memmove(s->hist + keep, s->hist + keep + n_discard, (size_t)n_tail * sizeof(int32_t));
    s->n_past = keep;
    st->n_shifts++;
    if (s->params.verbose)
        fprintf(stderr, "nstf: context shift: kept %d + %d tokens, dropped %d\n", keep, n_tail, n_discard);
    /* the tail is evaluated from a copy: eval writes into hist */
    int32_t *tail = nstf_alloc((size_t)(n_tail > 0 ? n_tail : 1) * sizeof(int32_t), "context shift");
    if (!tail) return NSTF_ERR_OOM;
    memcpy(tail, s->hist + keep, (size_t)n_tail * sizeof(int32_t));
    nstf_status r = eval(s, tail, n_tail, gp, stopped);
    nstf_free(tail);
    return r;
}

nstf_status nstf_session_append(nstf_session *s, const int32_t *ids, int64_t n, const nstf_gen_params *gp,
                                nstf_gen_stats *st, bool *stopped) {
    *stopped = false;
    if (n <= 0) return NSTF_OK;
    while (s->n_past + n > s->n_ctx) {
        bool shifted = false;
        if (gp && gp->context_shift && n <= s->n_ctx - s->n_keep - 1) NSTF_TRY(shift(s, gp, st, &shifted, stopped));
        if (*stopped) return NSTF_OK;
        if (!shifted && !s->n_past)
            return nstf_set_error(NSTF_ERR_RANGE,
                                  "the prompt is %lld tokens but the context holds %d; raise -c or shorten the prompt",
                                  (long long)n, s->n_ctx);
        if (!shifted)
            return nstf_set_error(NSTF_ERR_RANGE, "%lld more tokens do not fit the context (%d of %d in use); raise -c%s",
                                  (long long)n, s->n_past, s->n_ctx,
                                  gp && gp->context_shift ? "" : " or use --context-shift");
    }
    return eval(s, ids, n, gp, stopped);
}

nstf_status nstf_session_tokenize_text(nstf_session *s, const char *text, size_t len, bool add_bos, bool special,
                                       int32_t **ids, int64_t *n) {
    return nstf_tokenizer_encode(s->tok, text, len, add_bos && nstf_tokenizer_wants_bos(s->tok), special, ids, n);
}

/* The user's text must be UTF-8: say where it is not, in its own offsets. */
nstf_status nstf_session_check_text(const char *what, const char *text) {
    const char *why = "";
    int64_t bad = nstf_utf8_check((const uint8_t *)text, strlen(text), &why);
    if (bad < 0) return NSTF_OK;
    return nstf_set_error(NSTF_ERR_INVALID_ARG, "%s is not valid UTF-8: byte 0x%02X at offset %lld (%s)", what,
                          (unsigned)(uint8_t)text[bad], (long long)bad, why);
}

static bool ends_with_stop(const nstf_text *t, const nstf_gen_params *gp) {
    for (int i = 0; gp && i < gp->n_stop; i++) {
        const size_t k = gp->stop[i] ? strlen(gp->stop[i]) : 0;
        if (k && t->len >= k && !memcmp(t->p + t->len - k, gp->stop[i], k)) return true;
    }
    return false;
}

nstf_status nstf_session_gen_loop(nstf_session *s, nstf_sampler *smp, const nstf_gen_params *gp, nstf_piece_fn cb,
                                  void *user, nstf_gen_stats *st, nstf_text *emitted, nstf_text *evaluated) {
    const double t0 = nstf_time_ms();
    const int64_t limit = gp->n_predict >= 0 ? gp->n_predict : INT64_MAX;
    char piece[256];
    nstf_status r = NSTF_OK;
    st->stop = NSTF_STOP_NONE;
    while (st->n_gen < limit) {
        if (interrupted(gp)) {
            st->stop = NSTF_STOP_INTERRUPTED;
            break;
        }
        const int32_t tok = s->dev_greedy ? s->next : nstf_sampler_sample(smp, s->logits);
        nstf_sampler_accept(smp, tok);
        st->n_gen++;
        if (!gp->ignore_eos && nstf_tokenizer_is_eog(s->tok, tok)) {
            st->stop = NSTF_STOP_EOG;
            break;
        }
        int64_t len = nstf_tokenizer_piece(s->tok, tok, piece, sizeof piece);
        if (len < 0) len = 0;
        if (len > (int64_t)sizeof piece) len = sizeof piece;
        if (emitted && !nstf_text_add(emitted, piece, (size_t)len)) {
            r = nstf_set_error(NSTF_ERR_OOM, "out of memory holding the generated text");
            break;
        }
        if (cb && !cb(user, tok, piece, (size_t)len)) {
            st->stop = NSTF_STOP_CALLBACK;
            break;
        }
        if (emitted && ends_with_stop(emitted, gp)) {
            st->stop = NSTF_STOP_STRING;
            break;
        }
        if (st->n_gen >= limit) break;
        if (s->n_past >= s->n_ctx) {
            bool shifted = false, stopped = false;
            if (gp->context_shift && gp->n_predict != -2) r = shift(s, gp, st, &shifted, &stopped);
            if (r != NSTF_OK) break;
            if (stopped) {
                st->stop = NSTF_STOP_INTERRUPTED;
                break;
            }
            if (!shifted) {
                st->stop = NSTF_STOP_CONTEXT_FULL;
                break;
            }
        }
        r = nstf_session_forward(s, &tok, 1, s->n_past, false, s->dev_greedy ? NULL : s->logits,
                                 s->dev_greedy ? &s->next : NULL);
        if (r != NSTF_OK) break;
        s->hist[s->n_past++] = tok;
        st->n_decode++;
        if (evaluated && !nstf_text_add(evaluated, piece, (size_t)len)) {
            r = nstf_set_error(NSTF_ERR_OOM, "out of memory holding the conversation");
            break;
        }
    }
    if (r == NSTF_OK && st->stop == NSTF_STOP_NONE) st->stop = NSTF_STOP_N_PREDICT;
    st->gen_ms += nstf_time_ms() - t0;
    st->n_past = s->n_past;
    return r;
}

nstf_status nstf_session_begin_gen(nstf_session *s, const nstf_sampler_params *sp) {
    /* greedy without penalties on a GPU: the argmax runs on the device and
     * only the token comes back (the same first-maximum rule as the sampler) */
    s->dev_greedy = !s->be->host_memory && sp->temp <= 0.0f && sp->repeat_penalty == 1.0f;
    return NSTF_OK;
}

/* A chat of one user turn (with the system message) or the raw prompt, as
 * the text to tokenize. *text is malloc'd (chat) or NULL (raw: use prompt). */
nstf_status nstf_session_render(nstf_session *s, const nstf_chat_msg *msgs, int n, bool gen, char **out) {
    if (!s->tmpl_family)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "the model's chat template is not one this engine renders (ChatML, Llama-3, Llama-2); "
                              "choose one with --chat-template");
    return nstf_chat_render_template(s->tmpl, msgs, n, gen, out);
}

bool nstf_chat_template_known(const char *name) { return nstf_chat_family_template(name) != NULL; }

const char *nstf_session_chat_template(const nstf_session *s, bool *from_model) {
    if (from_model) *from_model = s->tmpl_from_model;
    return s->tmpl_family;
}

nstf_status nstf_session_prompt_tokens(nstf_session *s, const char *prompt, bool chat, const char *system,
                                       bool special, int32_t **ids, int64_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!prompt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no prompt given");
    NSTF_TRY(nstf_session_check_text("the prompt", prompt));
    if (system) NSTF_TRY(nstf_session_check_text("the system message", system));
    char *text = NULL;
    if (chat) {
        nstf_chat_msg msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (nstf_chat_msg){"system", system};
        msgs[nm++] = (nstf_chat_msg){"user", prompt};
        NSTF_TRY(nstf_session_render(s, msgs, nm, true, &text));
    }
    const char *in = chat ? text : prompt;
    nstf_status r = nstf_session_tokenize_text(s, in, strlen(in), true, chat || special, ids, n_ids);
    free(text);
    if (r == NSTF_OK && *n_ids == 0) {
        free(*ids);
        *ids = NULL;
        r = nstf_set_error(NSTF_ERR_INVALID_ARG, "the prompt is empty and the model adds no BOS token");
    }
    return r;
}

nstf_status nstf_session_complete(nstf_session *s, const char *prompt, bool chat, const char *system, bool special,
                                  const nstf_sampler_params *sp, const nstf_gen_params *gpp, nstf_piece_fn cb,
                                  void *user, nstf_gen_stats *stats) {
    nstf_gen_stats st = {0};
    st.load_ms = s->load_ms;
    if (stats) *stats = st;
    const nstf_gen_params gp = gpp ? *gpp : nstf_gen_default_params();
    if (gp.n_predict < -2) return nstf_set_error(NSTF_ERR_INVALID_ARG, "-n %d: use a count >= 0, -1 or -2", gp.n_predict);
    if (gp.n_keep < -1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--keep %d: use a count >= 0 or -1", gp.n_keep);
    nstf_sampler_params spp = sp ? *sp : nstf_sampler_default_params();
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    NSTF_TRY(nstf_session_prompt_tokens(s, prompt, chat, system, special, &ids, &n_ids));
    if (n_ids >= s->n_ctx) {
        nstf_status e = nstf_set_error(NSTF_ERR_RANGE,
                                       "the prompt is %lld tokens but the context holds %d; raise -c or shorten the prompt",
                                       (long long)n_ids, s->n_ctx);
        free(ids);
        return e;
    }
    nstf_sampler smp;
    nstf_status r = nstf_sampler_init(&smp, &spp, s->model->cfg.n_vocab);
    if (r != NSTF_OK) {
        free(ids);
        return r;
    }
    for (int64_t i = 0; i < n_ids; i++) nstf_sampler_accept(&smp, ids[i]);
    nstf_session_begin_gen(s, &spp);
    s->n_past = 0;
    s->n_keep = gp.n_keep < 0 || gp.n_keep >= n_ids ? (int)n_ids
                                                     : gp.n_keep + (n_ids && ids[0] == nstf_tokenizer_bos(s->tok));
    const double t0 = nstf_time_ms();
    bool stopped = false;
    r = nstf_session_append(s, ids, n_ids, &gp, &st, &stopped);
    st.prompt_ms = nstf_time_ms() - t0;
    st.n_prompt = n_ids;
    free(ids);
    nstf_text out = {0};
    if (r == NSTF_OK && stopped) st.stop = NSTF_STOP_INTERRUPTED;
    else if (r == NSTF_OK) r = nstf_session_gen_loop(s, &smp, &gp, cb, user, &st, gp.n_stop ? &out : NULL, NULL);
    free(out.p);
    nstf_sampler_free(&smp);
    st.n_past = s->n_past;
    if (stats) *stats = st;
    return r;
}

nstf_status nstf_session_generate(nstf_session *s, const char *prompt, bool chat, const char *system,
                                  const nstf_sampler_params *sp, int n_predict, bool ignore_eos,
                                  nstf_piece_fn cb, void *user, nstf_gen_stats *stats) {
    if (n_predict < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "-n %d must be >= 0", n_predict);
    nstf_gen_params gp = nstf_gen_default_params();
    gp.n_predict = n_predict;
    gp.ignore_eos = ignore_eos;
    return nstf_session_complete(s, prompt, chat, system, false, sp, &gp, cb, user, stats);
}
