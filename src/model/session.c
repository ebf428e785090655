/* session.c — load a model into a session, pick the device (CPU, or the GPU
 * when the build has a backend and a device answers), prefill, generate. */
#include "model/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"
#include "io/hf_model.h"

uint64_t nstf_time_seed(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
}

nstf_session_params nstf_session_default_params(void) {
    nstf_session_params p = {.n_ctx = 0, .n_batch = 512, .n_threads = 0, .device = "auto", .verbose = false};
    return p;
}

/* A run (or a stage: layers [l0, l1)) of the session's shape on be. */
static nstf_status run_create(nstf_session *s, nstf_backend *be, int n_ctx, int l0, int l1, bool embed, bool output,
                              nstf_llama_run **out) {
    const nstf_session_shape *h = &s->shape;
    const nstf_llama_run_shape sh = {n_ctx, s->params.n_batch, h->n_seq, l0, l1, embed, output, h->kv_block,
                                     h->kv_blocks};
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
    nstf_status st = nstf_backend_gpu_create(0, &s->be);
    if (st == NSTF_OK) st = run_create(s, s->be, n_ctx, 0, ngl, true, ngl == L, &s->run);
    if (st == NSTF_OK && ngl < L) { /* the rest of the layers and the output head on the CPU */
        const nstf_cpu_params cp = {p->n_threads, p->precise, p->deterministic};
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
        if (want) return st;
        if (p->verbose) fprintf(stderr, "nstf: GPU not used (%s); running on the CPU\n", nstf_last_error());
    }
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
    if (p.n_batch < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "batch size %d must be positive", p.n_batch);
    if (p.n_threads < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "thread count %d must be positive", p.n_threads);
    if (p.n_gpu_layers < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "GPU layer count %d must be >= 0 (0: all)", p.n_gpu_layers);
    if (!p.device) p.device = "auto";
    if (strcmp(p.device, "cpu") != 0 && strcmp(p.device, "auto") != 0 && strcmp(p.device, "gpu") != 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "unknown device '%s' (use cpu, gpu or auto)", p.device);
    if (strcmp(p.device, "gpu") == 0 && !nstf_backend_gpu_built())
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--device gpu: this build has no GPU backend (build with NSTF_CUDA=ON or NSTF_HIP=ON)");

    double t0 = nstf_time_ms();
    nstf_session *s = nstf_calloc(1, sizeof *s, "session");
    if (!s) return NSTF_ERR_OOM;
    s->params = p;
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
        st = open_gpu(s, n_ctx);
        if (st == NSTF_OK && !s->run) {
            const nstf_cpu_params cp = {p.n_threads, p.precise, p.deterministic};
            st = nstf_backend_cpu_create(&cp, &s->be);
            if (st == NSTF_OK) st = run_create(s, s->be, n_ctx, 0, s->model->cfg.n_layers, true, true, &s->run);
        }
    }
    if (st == NSTF_OK) {
        s->n_ctx = s->run->s.n_ctx;
        s->n_batch = s->run->s.n_batch;
        s->logits = nstf_alloc((size_t)s->model->cfg.n_vocab * sizeof(float), "logits");
        if (!s->logits) st = NSTF_ERR_OOM;
    }
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
    nstf_backend_free(s->be);
    nstf_free(s->logits);
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
        NSTF_TRY(nstf_session_forward(s, tokens + i, chunk, pos0 + i, false, last && !argmax ? s->logits : NULL,
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

nstf_status nstf_session_generate(nstf_session *s, const char *prompt, bool chat, const char *system,
                                  const nstf_sampler_params *sp, int n_predict, bool ignore_eos,
                                  nstf_piece_fn cb, void *user, nstf_gen_stats *stats) {
    nstf_gen_stats st = {0};
    st.load_ms = s->load_ms;
    if (!prompt) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no prompt given");
    if (n_predict < 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "-n %d must be >= 0", n_predict);
    nstf_sampler_params spp = sp ? *sp : nstf_sampler_default_params();
    char *text = NULL;
    if (chat) {
        nstf_chat_msg msgs[2];
        int nm = 0;
        if (system) msgs[nm++] = (nstf_chat_msg){"system", system};
        msgs[nm++] = (nstf_chat_msg){"user", prompt};
        NSTF_TRY(nstf_chat_render(s->model->file, msgs, nm, true, &text));
    }
    const char *in = chat ? text : prompt;
    int32_t *ids = NULL;
    int64_t n_ids = 0;
    nstf_status r = nstf_tokenizer_encode(s->tok, in, strlen(in), nstf_tokenizer_wants_bos(s->tok), chat, &ids, &n_ids);
    free(text);
    if (r != NSTF_OK) return r;
    if (n_ids == 0) {
        free(ids);
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "the prompt is empty and the model adds no BOS token");
    }
    if (n_ids >= s->n_ctx) {
        nstf_status e = nstf_set_error(NSTF_ERR_RANGE,
                                       "the prompt is %lld tokens but the context holds %d; raise -c or shorten the prompt",
                                       (long long)n_ids, s->n_ctx);
        free(ids);
        return e;
    }
    nstf_sampler smp;
    r = nstf_sampler_init(&smp, &spp, s->model->cfg.n_vocab);
    if (r != NSTF_OK) {
        free(ids);
        return r;
    }
    for (int64_t i = 0; i < n_ids; i++) nstf_sampler_accept(&smp, ids[i]);

    /* greedy without penalties on a GPU: the argmax runs on the device and
     * only the token comes back (the same first-maximum rule as the sampler) */
    const bool dev_greedy = !s->be->host_memory && spp.temp <= 0.0f && spp.repeat_penalty == 1.0f;
    int32_t next = 0;
    double t0 = nstf_time_ms();
    r = prefill(s, ids, (int)n_ids, 0, dev_greedy ? &next : NULL);
    double t1 = nstf_time_ms();
    st.n_prompt = n_ids;
    st.prompt_ms = t1 - t0;
    int pos = (int)n_ids;
    char piece[256];
    while (r == NSTF_OK && st.n_gen < n_predict) {
        int32_t tok = dev_greedy ? next : nstf_sampler_sample(&smp, s->logits);
        nstf_sampler_accept(&smp, tok);
        st.n_gen++;
        if (!ignore_eos && nstf_tokenizer_is_eog(s->tok, tok)) break;
        int64_t len = nstf_tokenizer_piece(s->tok, tok, piece, sizeof piece);
        if (len < 0) len = 0;
        if (len > (int64_t)sizeof piece) len = sizeof piece;
        if (cb && !cb(user, tok, piece, (size_t)len)) break;
        if (st.n_gen >= n_predict) break;
        if (pos >= s->n_ctx) break; /* context full: stop, as llama.cpp does without shifting */
        r = nstf_session_forward(s, &tok, 1, pos, false, dev_greedy ? NULL : s->logits, dev_greedy ? &next : NULL);
        pos++;
        st.n_decode++;
    }
    st.gen_ms = nstf_time_ms() - t1;
    nstf_sampler_free(&smp);
    free(ids);
    if (stats) *stats = st;
    return r;
}
