/* trainer.c — the training run behind include/nstf_train.h: parameters
 * checked, the model and its tokenizer, the device, the memory plan (and
 * the refusal of a run that does not fit), the data loaders, the schedule,
 * and one optimizer step at a time with its figures (loss, learning rate,
 * gradient norm, tokens/s, MFU). Checkpoints are checkpoint.c, the GGUF
 * export train_export.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/mem.h"
#include "core/switches.h"
#include "dist/proc.h"
#include "io/hf_model.h"
#include "model/trainer.h"

nstf_train_params nstf_train_default_params(void) {
    nstf_train_params p = {0};
    p.batch = 4;
    p.seq = 256;
    p.grad_accum = 1;
    p.steps = 100;
    p.lr = 3e-4;
    p.min_lr = -1; /* lr / 10 */
    p.warmup = -1; /* steps / 20 */
    p.weight_decay = 0.1;
    p.beta1 = 0.9;
    p.beta2 = 0.95;
    p.eps = 1e-8;
    p.clip = 1.0;
    p.lora_targets = "q,k,v,o,gate,up,down";
    p.device = "auto";
    p.recompute = "none";
    p.seed = 1;
    p.eval_batches = 8;
    p.dp = 1;
    p.zero = -1;
    return p;
}

/* ---- parameters ------------------------------------------------------------------------------ */

static nstf_status parse_recompute(const char *s, nstf_recompute *out) {
    if (!s || !strcmp(s, "none")) *out = NSTF_RECOMPUTE_NONE;
    else if (!strcmp(s, "attn")) *out = NSTF_RECOMPUTE_ATTN;
    else if (!strcmp(s, "full")) *out = NSTF_RECOMPUTE_FULL;
    else return nstf_set_error(NSTF_ERR_INVALID_ARG, "--recompute %s: use none, attn or full", s);
    return NSTF_OK;
}

static nstf_status parse_targets(const char *s, unsigned *mask) {
    static const char *const names[LORA_N] = {"q", "k", "v", "o", "gate", "up", "down"};
    *mask = 0;
    const char *p = s ? s : "";
    while (*p) {
        size_t n = strcspn(p, ",");
        int k = 0;
        for (; k < LORA_N; k++)
            if (strlen(names[k]) == n && strncmp(p, names[k], n) == 0) break;
        if (k == LORA_N)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "--lora-targets %s: '%.*s' is not one of q, k, v, o, gate, up, down",
                                  s, (int)n, p);
        *mask |= 1u << k;
        p += n + (p[n] == ',');
    }
    if (!*mask) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--lora-targets: no matrix named");
    return NSTF_OK;
}

static nstf_status check_params(const nstf_train_params *p) {
    if (!p->model || !*p->model) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no model: give -m BASE.gguf or --shape NAME");
    if (p->batch < 1 || p->seq < 2 || p->grad_accum < 1 || p->steps < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "--batch %d, --seq %d, --accum %d, --steps %lld: each must be at least 1 (--seq 2)",
                              p->batch, p->seq, p->grad_accum, (long long)p->steps);
    if (!isfinite(p->lr) || p->lr <= 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--lr %g: the learning rate must be a finite number above 0", p->lr);
    if (!isfinite(p->min_lr) || p->min_lr > p->lr)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--min-lr %g must be finite and at most --lr %g", p->min_lr, p->lr);
    if (!isfinite(p->weight_decay) || p->weight_decay < 0 || !(p->beta1 >= 0 && p->beta1 < 1) ||
        !(p->beta2 >= 0 && p->beta2 < 1) || !(p->eps > 0) || !isfinite(p->clip))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "optimizer settings out of range (weight decay %g, betas %g %g, eps %g, clip %g)",
                              p->weight_decay, p->beta1, p->beta2, p->eps, p->clip);
    if (p->lora_rank < 0 || p->lora_rank > 4096)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--lora %d: the rank must be in 1..4096", p->lora_rank);
    if (p->warmup < 0 || p->warmup > p->steps)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--warmup %lld must be in 0..--steps %lld", (long long)p->warmup,
                              (long long)p->steps);
    if (!p->data || !*p->data) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no training data: give --data FILE");
    if (p->eval_batches < 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--eval-batches %d", p->eval_batches);
    if (p->dp_timeout_ms < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--dp-timeout %d ms", p->dp_timeout_ms);
    if (p->dp < 1 || p->dp > NSTF_COMM_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--dp %d: data-parallel ranks must be in 1..%d", p->dp, NSTF_COMM_MAX);
    if (p->zero < -1 || p->zero > 1) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--zero %d: use 0 or 1", p->zero);
    return NSTF_OK;
}

/* The defaults that depend on other settings. */
static nstf_train_params resolve(const nstf_train_params *in) {
    nstf_train_params p = *in;
    if (p.min_lr < 0) p.min_lr = p.lr / 10;
    if (p.warmup < 0) p.warmup = p.steps / 20;
    if (!p.device) p.device = "auto";
    if (!p.lora_targets) p.lora_targets = "q,k,v,o,gate,up,down";
    return p;
}

/* The device: a GPU when asked (or, with auto, when one answers), else
 * the CPU in its precise, deterministic mode (fp32 activations, results
 * independent of the thread count). */
static nstf_status open_backend(const nstf_train_params *p, int rank, nstf_backend **be) {
    *be = NULL;
    const bool gpu = !strcmp(p->device, "gpu"), cpu = !strcmp(p->device, "cpu"), aut = !strcmp(p->device, "auto");
    if (!gpu && !cpu && !aut) return nstf_set_error(NSTF_ERR_INVALID_ARG, "--device %s: use cpu, gpu or auto", p->device);
    if (gpu && !nstf_backend_gpu_built())
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--device gpu: this build has no GPU backend (build with NSTF_CUDA=ON)");
    if (gpu && nstf_backend_gpu_count() < 1) return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--device gpu: no GPU found");
    /* the ranks on this machine: all of them, or, launched by mpirun, the
     * processes here (rank: this one's place among them) */
    const int here = nstf_proc_active() ? nstf_proc_local_size() : p->dp;
    if (gpu && here > nstf_backend_gpu_count())
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "--dp %d: this machine has %d GPUs for %d ranks", p->dp,
                              nstf_backend_gpu_count(), here);
    if ((gpu || aut) && nstf_backend_gpu_built() && nstf_backend_gpu_count() >= here) {
        nstf_status st = nstf_backend_gpu_create(rank, be);
        if (st == NSTF_OK || gpu) return st;
    }
    /* the CPU ranks of this machine share the threads (every core by default) */
    int threads = p->n_threads;
    if (here > 1) {
        if (threads <= 0) threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
        threads = threads / here > 0 ? threads / here : 1;
    }
    const nstf_cpu_params cp = {threads, true, true, 32}; /* training: fp32 activations */
    return nstf_backend_cpu_create(&cp, be);
}

static nstf_status open_model(const char *path, nstf_llama **m, nstf_tokenizer **tok) {
    nstf_gguf *g = NULL;
    NSTF_TRY(nstf_model_file_open(path, &g));
    nstf_status st = nstf_llama_load(g, m);
    if (st != NSTF_OK) {
        nstf_gguf_close(g);
        return st;
    }
    if (!tok) return NSTF_OK;
    st = nstf_tokenizer_from_gguf(g, tok);
    if (st == NSTF_OK && nstf_tokenizer_n_vocab(*tok) != (*m)->cfg.n_vocab)
        st = nstf_set_error(NSTF_ERR_FORMAT, "%s: tokenizer has %d tokens but the embedding has %d rows", path,
                            nstf_tokenizer_n_vocab(*tok), (*m)->cfg.n_vocab);
    return st;
}

/* The optimizer state's slots: the ranks with ZeRO-1, else 1 (whole).
 * --zero's default is on for CPU ranks, where it is measured to give the
 * replicated run's bits and to be no slower (docs/TRAINING.md), and off
 * on GPUs until it is timed there. */
static int zero_shards(const nstf_train_params *p, const nstf_backend *be) {
    if (p->dp < 2) return 1;
    return p->zero > 0 || (p->zero < 0 && be->host_memory) ? p->dp : 1;
}

static nstf_status shape_of(const nstf_train_params *p, const nstf_backend *be, train_shape *sh) {
    memset(sh, 0, sizeof *sh);
    sh->shards = zero_shards(p, be);
    sh->n_seq = p->batch;
    sh->seq_len = p->seq;
    sh->lora_rank = p->lora_rank;
    NSTF_TRY(parse_recompute(p->recompute, &sh->recompute));
    if (p->lora_rank > 0) NSTF_TRY(parse_targets(p->lora_targets, &sh->lora_mask));
    return NSTF_OK;
}

/* ---- the plan ---------------------------------------------------------------------------------- */

nstf_status nstf_train_plan_get(const nstf_train_params *in, nstf_train_plan *out) {
    memset(out, 0, sizeof *out);
    const nstf_train_params p = resolve(in);
    NSTF_TRY(check_params(&p));
    train_shape sh = {0};
    nstf_llama *m = NULL;
    nstf_backend *be = NULL;
    nstf_status st = open_model(p.model, &m, NULL);
    if (st == NSTF_OK) st = open_backend(&p, 0, &be);
    if (st == NSTF_OK) st = shape_of(&p, be, &sh);
    train_mem mem;
    if (st == NSTF_OK) st = nstf_train_mem_plan(m, be, &sh, &mem);
    for (int k = 0; st == NSTF_OK && k < 3; k++) { /* the activations of every mode */
        train_shape s2 = sh;
        train_mem m2;
        s2.recompute = (nstf_recompute)k;
        st = nstf_train_mem_plan(m, be, &s2, &m2);
        uint64_t *dst[3] = {&out->act_none, &out->act_attn, &out->act_full};
        *dst[k] = m2.activations;
    }
    if (st == NSTF_OK) {
        out->weights = mem.weights, out->copy = mem.copy, out->grads = mem.grads, out->optimizer = mem.optimizer;
        out->frozen = mem.frozen, out->activations = mem.activations, out->act_grads = mem.act_grads;
        out->workspace = mem.workspace, out->io = mem.io;
        out->n_params = mem.n_params, out->n_frozen = mem.n_frozen;
        out->host = be->host_memory;
        nstf_backend_mem bm;
        be->vt->mem(be, &bm);
        out->total = mem.weights + mem.copy + mem.grads + mem.optimizer + mem.activations + mem.act_grads +
                     mem.workspace + mem.io + (be->host_memory ? 0 : mem.frozen) + bm.reserve;
        out->available = bm.free;
        out->fits = !bm.free || out->total <= bm.free;
        out->dp = p.dp;
        out->shards = sh.shards;
        snprintf(out->device, sizeof out->device, "%s", be->device);
    }
    nstf_backend_free(be);
    nstf_llama_free(m);
    return st;
}

static double mib(uint64_t b) { return (double)b / (1 << 20); }

void nstf_train_plan_print(const nstf_train_plan *pl, const nstf_train_params *p, FILE *f) {
    fprintf(f, "memory plan on %s: batch %d x %d tokens, %s, recompute %s", pl->device, p->batch, p->seq,
            p->lora_rank > 0 ? "LoRA" : "full fine-tune", p->recompute ? p->recompute : "none");
    if (pl->dp > 1)
        fprintf(f, "; per rank of --dp %d, %s", pl->dp,
                pl->shards > 1 ? "ZeRO-1 (optimizer state in slots)" : "the update replicated (--zero 0)");
    fputc('\n', f);
    if (p->lora_rank > 0)
        fprintf(f, "  %-22s %10.1f MiB  (%lld parameters as stored%s)\n", "frozen base", mib(pl->frozen),
                (long long)pl->n_frozen, pl->host ? ", mapped from the file" : "");
    fprintf(f, "  %-22s %10.1f MiB  (%lld trainable parameters, fp32%s)\n", "weights (master)", mib(pl->weights),
            (long long)pl->n_params,
            pl->shards > 1 ? "; whole on every rank: the forward reads them, each rank updates its slot" : "");
    if (pl->copy) fprintf(f, "  %-22s %10.1f MiB  (bf16)\n", "compute copy", mib(pl->copy));
    fprintf(f, "  %-22s %10.1f MiB\n", "gradients", mib(pl->grads));
    if (pl->shards > 1)
        fprintf(f, "  %-22s %10.1f MiB  (AdamW m, v: this rank's slot, 1/%d of %.1f MiB)\n", "optimizer",
                mib(pl->optimizer), pl->shards, mib(pl->optimizer) * pl->shards);
    else fprintf(f, "  %-22s %10.1f MiB  (AdamW m, v)\n", "optimizer", mib(pl->optimizer));
    fprintf(f, "  %-22s %10.1f MiB  (none %.1f, attn %.1f, full %.1f)\n", "activations", mib(pl->activations),
            mib(pl->act_none), mib(pl->act_attn), mib(pl->act_full));
    fprintf(f, "  %-22s %10.1f MiB\n", "activation gradients", mib(pl->act_grads));
    fprintf(f, "  %-22s %10.1f MiB  (the ops' scratch)\n", "workspace", mib(pl->workspace));
    fprintf(f, "  %-22s %10.1f MiB  (batch, positions, attention cache rows)\n", "batch", mib(pl->io));
    fprintf(f, "  %-22s %10.1f MiB  of %.1f MiB %s: %s\n", "total", mib(pl->total), mib(pl->available),
            pl->host ? "available" : "free", pl->fits ? "fits" : "DOES NOT FIT");
}

/* ---- open, close ------------------------------------------------------------------------------ */

/* The device's dense bf16 rate, for MFU (its data sheet; 0: unknown). */
static double peak_flops(const nstf_backend *be) {
    if (be->host_memory) return 0;
    static const struct { const char *name; double flops; } k[] = {
        {"H100", 989.4e12}, {"H200", 989.4e12}, {"A100", 312e12}, {"MI300X", 1307.4e12}, {"MI250", 362.1e12}};
    for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
        if (strstr(be->device, k[i].name)) return k[i].flops;
    return 0;
}

static char *dup_strs(nstf_train_params *p) {
    const char **f[] = {&p->model, &p->data, &p->eval_data, &p->lora_targets, &p->device, &p->recompute};
    size_t n = 0;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) n += *f[i] ? strlen(*f[i]) + 1 : 0;
    char *b = nstf_alloc(n + 1, "parameters"), *at = b;
    for (size_t i = 0; b && i < sizeof f / sizeof f[0]; i++) {
        if (!*f[i]) continue;
        strcpy(at, *f[i]);
        *f[i] = at;
        at += strlen(at) + 1;
    }
    return b;
}

void nstf_trainer_close(nstf_trainer *t) {
    if (!t) return;
    nstf_comm_free(t->comm);
    for (int r = 0; r < NSTF_COMM_MAX; r++) nstf_train_free(t->trs[r]);
    nstf_data_close(t->data);
    nstf_data_close(t->eval);
    for (int r = 0; r < NSTF_COMM_MAX; r++) nstf_backend_free(t->bes[r]);
    nstf_tokenizer_free(t->tok);
    nstf_llama_free(t->model);
    nstf_free(t->batch);
    nstf_free(t->strs);
    nstf_free(t);
}

typedef struct create_job {
    nstf_trainer *t;
    const train_shape *sh;
} create_job;

static nstf_status create_rank(void *ctx, int r) {
    create_job *j = ctx;
    return nstf_train_create(j->t->model, j->t->bes[r], j->sh, j->t->p.seed, &j->t->trs[r]);
}

/* After the ranks' jobs: rank 0's device current on this thread again (a
 * backend allocation makes its device current), for what rank 0 does here
 * (evaluation, checkpoints, export). */
static nstf_status make_current(nstf_trainer *t) {
    void *p = NULL;
    NSTF_TRY(t->be->vt->alloc(t->be, 1, &p));
    t->be->vt->free(t->be, p);
    return NSTF_OK;
}

nstf_status nstf_trainer_on_ranks(nstf_trainer *t, nstf_comm_job fn, void *ctx) {
    if (t->dp == 1) return fn(ctx, 0);
    if (t->self >= 0) return nstf_comm_run(t->comm, fn, ctx);
    NSTF_TRY(nstf_comm_run(t->comm, fn, ctx));
    return make_current(t);
}

nstf_status nstf_trainer_open(const nstf_train_params *in, nstf_trainer **out) {
    *out = NULL;
    const nstf_train_params rp = resolve(in);
    NSTF_TRY(check_params(&rp));
    nstf_trainer *t = nstf_calloc(1, sizeof *t, "trainer");
    if (!t) return NSTF_ERR_OOM;
    t->p = rp;
    t->strs = dup_strs(&t->p);
    const nstf_train_params *p = &t->p;
    train_shape sh = {0};
    nstf_status st = t->strs ? NSTF_OK : NSTF_ERR_OOM;
    if (st == NSTF_OK) st = open_model(p->model, &t->model, &t->tok);
    /* launched by mpirun: this process is one rank of the launch's */
    t->self = nstf_proc_active() ? nstf_proc_rank() : -1;
    if (st == NSTF_OK && t->self >= 0 && p->dp != 1 && p->dp != nstf_proc_size())
        st = nstf_set_error(NSTF_ERR_INVALID_ARG,
                            "--dp %d: mpirun launched %d processes, one rank each (leave --dp out, or give %d)", p->dp,
                            nstf_proc_size(), nstf_proc_size());
    t->dp = t->self >= 0 ? nstf_proc_size() : p->dp;
    t->p.dp = t->dp;
    if (st == NSTF_OK && t->self >= 0)
        st = open_backend(p, nstf_proc_local_rank(), &t->bes[t->self]);
    for (int r = 0; r < t->dp && st == NSTF_OK && t->self < 0; r++) st = open_backend(p, r, &t->bes[r]);
    const int me = t->self >= 0 ? t->self : 0;
    t->be = t->bes[me];
    if (st == NSTF_OK) st = shape_of(p, t->be, &sh);
    if (st == NSTF_OK) st = nstf_data_open(p->data, t->model->cfg.n_vocab, p->seq, p->seed, true, t->tok, &t->data);
    if (st == NSTF_OK && p->eval_data)
        st = nstf_data_open(p->eval_data, t->model->cfg.n_vocab, p->seq, p->seed, false, t->tok, &t->eval);
    /* the replicas: the same initialization (seed) on every rank, each
     * made on its rank's thread (a GPU rank's device current there) */
    if (st == NSTF_OK && t->dp > 1 && t->self >= 0) st = nstf_comm_create_proc(t->be, p->dp_timeout_ms, &t->comm);
    else if (st == NSTF_OK && t->dp > 1) st = nstf_comm_create(t->bes, t->dp, p->dp_timeout_ms, &t->comm);
    const int stall = nstf_switch_int(NSTF_SW_DP_STALL_AT); /* a fault test's stalled rank */
    if (st == NSTF_OK && t->dp > 1 && stall > 0) nstf_comm_fault(t->comm, t->dp - 1, stall - 1);
    if (st == NSTF_OK) {
        create_job j = {t, &sh};
        st = nstf_trainer_on_ranks(t, create_rank, &j);
    }
    t->tr = t->trs[me];
    for (int r = 0; r < t->dp && st == NSTF_OK; r++)
        if (t->trs[r]) st = nstf_train_set_dp(t->trs[r], t->comm, r, t->dp);
    const int64_t per = (int64_t)t->dp * p->grad_accum * p->batch * (p->seq + 1);
    if (st == NSTF_OK && !(t->batch = nstf_alloc((size_t)per * sizeof(int32_t), "batch tokens"))) st = NSTF_ERR_OOM;
    if (st != NSTF_OK) {
        nstf_trainer_close(t);
        return st;
    }
    t->sched = (nstf_lr_schedule){p->lr, p->min_lr, p->warmup, p->steps};
    t->opt = (nstf_adamw_params){p->lr, p->beta1, p->beta2, p->eps, p->weight_decay};
    t->peak_flops = peak_flops(t->be);
    const nstf_llama_config *c = &t->model->cfg;
    snprintf(t->desc, sizeof t->desc,
             "%s%s: %d layers, dim %d, vocabulary %d; %s (%lld trainable parameters); %lld tokens per step "
             "(%d x %d x %d x %d ranks%s); data %lld tokens, %lld sequences",
             t->be->device,
             t->self >= 0 ? " and the other processes' ranks" : t->dp > 1 ? " and the other data-parallel ranks" : "",
             c->n_layers, c->dim, c->n_vocab,
             p->lora_rank > 0 ? "LoRA" : "full fine-tune", (long long)t->tr->mem.n_params,
             (long long)per / (p->seq + 1) * p->seq, p->grad_accum, p->batch, p->seq, t->dp,
             sh.shards > 1 ? ", ZeRO-1" : "",
             (long long)nstf_data_n_tokens(t->data), (long long)nstf_data_n_seq(t->data));
    *out = t;
    return NSTF_OK;
}

const char *nstf_trainer_describe(const nstf_trainer *t) { return t->desc; }
int64_t nstf_trainer_steps_done(const nstf_trainer *t) { return t->step; }

/* ---- steps ------------------------------------------------------------------------------------- */

static nstf_status fill(nstf_data *d, int32_t *dst, int64_t n_seq, int seq) {
    for (int64_t i = 0; i < n_seq; i++) NSTF_TRY(nstf_data_next(d, dst + i * (seq + 1)));
    return NSTF_OK;
}

/* One step on rank r: its slice of the batch. */
typedef struct dp_job {
    nstf_trainer *t;
    double loss[NSTF_COMM_MAX], norm[NSTF_COMM_MAX];
} dp_job;

static nstf_status dp_rank(void *ctx, int r) {
    dp_job *j = ctx;
    nstf_trainer *t = j->t;
    const nstf_train_params *p = &t->p;
    const int64_t per = (int64_t)p->grad_accum * p->batch * (p->seq + 1);
    NSTF_TRY(nstf_train_step(t->trs[r], t->batch + r * per, p->grad_accum, t->step, &t->opt, p->clip, &j->loss[r],
                             &j->norm[r]));
    /* every rank's share of the loss (a launch by mpirun holds its own only) */
    if (t->self >= 0) NSTF_TRY(nstf_comm_host_allgather(t->comm, r, &j->loss[r], j->loss, sizeof j->loss[0]));
    return NSTF_OK;
}

nstf_status nstf_trainer_step(nstf_trainer *t, nstf_train_stats *out) {
    const nstf_train_params *p = &t->p;
    const double t0 = nstf_time_ms();
    NSTF_TRY(fill(t->data, t->batch, (int64_t)t->dp * p->grad_accum * p->batch, p->seq));
    t->opt.lr = nstf_lr_cosine(&t->sched, t->step);
    dp_job j = {.t = t};
    NSTF_TRY(nstf_trainer_on_ranks(t, dp_rank, &j));
    double loss = 0;
    for (int r = 0; r < t->dp; r++) loss += j.loss[r]; /* the ranks' shares of the mean */
    const double norm = j.norm[t->self >= 0 ? t->self : 0]; /* the same on every rank */
    const double ms = nstf_time_ms() - t0;
    const int64_t toks = (int64_t)t->dp * p->grad_accum * p->batch * p->seq;
    t->step++;
    t->tokens += toks;
    t->last_loss = loss;
    nstf_train_stats s = {t->step, loss, t->opt.lr, norm, ms, 0, -1, t->tokens};
    s.tokens_per_s = ms > 0 ? (double)toks / (ms / 1e3) : 0;
    if (t->peak_flops > 0) s.mfu = nstf_train_flops_per_token(t->tr) * s.tokens_per_s / t->peak_flops;
    if (out) *out = s;
    return NSTF_OK;
}

nstf_status nstf_trainer_eval(nstf_trainer *t, double *loss) {
    const nstf_train_params *p = &t->p;
    if (!t->eval) return nstf_set_error(NSTF_ERR_INVALID_ARG, "no evaluation data (--eval-data)");
    /* the same leading sequences every time */
    NSTF_TRY(nstf_data_seek(t->eval, 0, 0));
    const int64_t have = nstf_data_n_seq(t->eval) / p->batch;
    const int n_mb = (int)(have < p->eval_batches ? have : p->eval_batches);
    if (n_mb < 1)
        return nstf_set_error(NSTF_ERR_FORMAT, "evaluation data %s holds %lld sequences of %d tokens, fewer than one batch of %d",
                              p->eval_data, (long long)nstf_data_n_seq(t->eval), p->seq, p->batch);
    double sum = 0;
    for (int mb = 0; mb < n_mb; mb++) {
        double l = 0;
        NSTF_TRY(fill(t->eval, t->batch, p->batch, p->seq));
        NSTF_TRY(nstf_train_eval(t->tr, t->batch, 1, &l));
        sum += l;
    }
    *loss = sum / n_mb;
    return NSTF_OK;
}
