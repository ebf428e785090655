/* train.c — a model placed on a backend for training (train.h): the
 * parameter table and its flat arrays, the views the ops read, the
 * activation and gradient buffers, all from two allocations carved by
 * size tables that the memory plan (`nstf train --plan`) reads too; the
 * initial weights (the base's tensors dequantized to fp32, or LoRA
 * adapters), and the flat arrays' way to and from the host (checkpoints).
 * The step itself is train_step.c. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/train.h"
#include "ops/gpu/gpu_api.h" /* the GPU cross-entropy's chunk and scratch */

#define ALIGN 256u
#define PAD 8 /* tensors start at multiples of 8 elements: 16-byte rows of the bf16 copy */

const char *const nstf_lora_names[LORA_N] = {"attn_q", "attn_k", "attn_v", "attn_output",
                                             "ffn_gate", "ffn_up", "ffn_down"};

static uint64_t esize(nstf_type t) {
    uint64_t b = 4;
    (void)nstf_type_row_bytes(t, 1, &b);
    return b;
}

/* ---- the parameter table ---------------------------------------------------------------- */

/* A trainable tensor before offsets: its GGUF name and shape. */
typedef struct pdesc {
    char name[80];
    int64_t rows, cols; /* a vector: rows 1 */
    bool decay;
} pdesc;

/* The layer matrices in LORA_* order: rows (n_out) and cols (n_in). */
static void layer_mat_shape(const nstf_llama_config *c, int k, int64_t *rows, int64_t *cols) {
    const int64_t qd = (int64_t)c->n_heads * c->head_dim, kvd = (int64_t)c->n_kv_heads * c->head_dim;
    const int64_t r[LORA_N] = {qd, kvd, kvd, c->dim, c->ffn_dim, c->ffn_dim, c->dim};
    const int64_t i[LORA_N] = {c->dim, c->dim, c->dim, qd, c->dim, c->dim, c->ffn_dim};
    *rows = r[k];
    *cols = i[k];
}

/* The table's entries in flat order (matrices, which decay, first; the
 * norms last), or with LoRA the adapters (A then Bt of each). Returns the
 * count; writes up to cap. */
static int pdescs(const nstf_llama_config *c, const train_shape *sh, pdesc *d, int cap) {
    int n = 0;
#define ADD(r_, c_, decay_, ...)                                                   \
    do {                                                                           \
        if (n < cap) {                                                             \
            snprintf(d[n].name, sizeof d[n].name, __VA_ARGS__);                    \
            d[n].rows = (r_), d[n].cols = (c_), d[n].decay = (decay_);             \
        }                                                                          \
        n++;                                                                       \
    } while (0)
    if (sh->lora_rank > 0) {
        for (int l = 0; l < c->n_layers; l++)
            for (int k = 0; k < LORA_N; k++) {
                if (!(sh->lora_mask & (1u << k))) continue;
                int64_t rows, cols;
                layer_mat_shape(c, k, &rows, &cols);
                ADD(sh->lora_rank, cols, true, "blk.%d.%s.weight.lora_a", l, nstf_lora_names[k]);
                ADD(sh->lora_rank, rows, true, "blk.%d.%s.weight.lora_b", l, nstf_lora_names[k]);
            }
        return n;
    }
    ADD(c->n_vocab, c->dim, true, "token_embd.weight");
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < LORA_N; k++) {
            int64_t rows, cols;
            layer_mat_shape(c, k, &rows, &cols);
            ADD(rows, cols, true, "blk.%d.%s.weight", l, nstf_lora_names[k]);
        }
    if (!c->tied_output) ADD(c->n_vocab, c->dim, true, "output.weight");
    for (int l = 0; l < c->n_layers; l++) {
        ADD(1, c->dim, false, "blk.%d.attn_norm.weight", l);
        ADD(1, c->dim, false, "blk.%d.ffn_norm.weight", l);
    }
    ADD(1, c->dim, false, "output_norm.weight");
#undef ADD
    return n;
}

/* Offsets of the table (names into one block); *n_flat the arrays' length. */
static nstf_status ptab_build(nstf_train *t) {
    const int n = pdescs(&t->c, &t->sh, NULL, 0);
    pdesc *d = nstf_calloc((size_t)n, sizeof *d, "parameter list");
    t->ptab = nstf_calloc((size_t)n, sizeof *t->ptab, "parameter table");
    t->names = nstf_calloc((size_t)n, sizeof d->name, "parameter names");
    if (!d || !t->ptab || !t->names) {
        nstf_free(d);
        return NSTF_ERR_OOM;
    }
    (void)pdescs(&t->c, &t->sh, d, n);
    int64_t off = 0;
    for (int i = 0; i < n; i++) {
        char *nm = t->names + (size_t)i * sizeof d->name;
        memcpy(nm, d[i].name, sizeof d->name);
        t->ptab[i] = (nstf_param_tensor){nm, off, d[i].rows * d[i].cols, d[i].decay};
        off += (t->ptab[i].n + PAD - 1) / PAD * PAD;
    }
    t->n_ptab = n;
    t->n_flat = off;
    nstf_free(d);
    return NSTF_OK;
}

static int ptab_find(const nstf_train *t, const char *name) {
    for (int i = 0; i < t->n_ptab; i++)
        if (strcmp(t->ptab[i].name, name) == 0) return i;
    return -1;
}

/* ---- the activation size table ----------------------------------------------------------- */

enum { A_X, A_XMID, A_XN1, A_XN2, A_QKV, A_ATT, A_LSE, A_GU, A_HS, A_N };

/* Whether the recompute mode keeps tensor k of every layer (else it lives
 * in the one live set). */
static bool saved(nstf_recompute mode, int k) {
    switch (mode) {
    case NSTF_RECOMPUTE_NONE: return true;
    case NSTF_RECOMPUTE_ATTN: return k == A_X || k == A_XMID || k == A_XN2 || k == A_GU;
    case NSTF_RECOMPUTE_FULL: return k == A_X;
    }
    return true;
}

typedef struct carve {
    uint64_t off;
    bool ok;
} carve;

static uint64_t take(carve *cv, uint64_t a, uint64_t b) {
    uint64_t bytes = 0, r = 0, at = cv->off;
    if (!cv->ok || !nstf_mul_ok(a, b, &bytes) || !nstf_add_ok(bytes, ALIGN - 1, &r) ||
        !nstf_add_ok(cv->off, r & ~(uint64_t)(ALIGN - 1), &cv->off))
        cv->ok = false;
    return at;
}

/* Bytes per token of activation tensor k. */
static uint64_t act_bytes_per_tok(const nstf_llama_config *c, uint64_t es, int k) {
    const uint64_t dim = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim,
                   kvd = (uint64_t)c->n_kv_heads * c->head_dim, ffn = (uint64_t)c->ffn_dim;
    switch (k) {
    case A_X:
    case A_XMID: return 4 * dim;
    case A_XN1:
    case A_XN2: return es * dim;
    case A_QKV: return es * (qd + 2 * kvd);
    case A_ATT: return es * qd;
    case A_LSE: return 4 * (uint64_t)c->n_heads;
    case A_GU: return es * 2 * ffn;
    case A_HS: return es * ffn;
    }
    return 0;
}

/* The activation block's size table; with base, carve t's pointers. The
 * plan splits it into activations (saved, live, final) and their
 * gradients and the batch's I/O buffers. */
static nstf_status acts_plan(nstf_train *t, const nstf_backend *be, char *base, uint64_t *total, train_mem *mem) {
    const nstf_llama_config *c = &t->c;
    const uint64_t es = esize(be->act_type), n = (uint64_t)t->n;
    const uint64_t dim = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim,
                   kvd = (uint64_t)c->n_kv_heads * c->head_dim, ffn = (uint64_t)c->ffn_dim,
                   r = (uint64_t)t->sh.lora_rank;
    const int L = c->n_layers;
    carve cv = {0, true};
    uint64_t at_live[A_N], at[A_N];
    for (int k = 0; k < A_N; k++)
        at_live[k] = saved(t->sh.recompute, k) ? 0 : take(&cv, n, act_bytes_per_tok(c, es, k));
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < A_N; k++) {
            at[k] = saved(t->sh.recompute, k) ? take(&cv, n, act_bytes_per_tok(c, es, k)) : at_live[k];
            if (base) {
                void *p = base + at[k];
                train_acts *a = &t->acts[l];
                switch (k) {
                case A_X: a->x = p; break;
                case A_XMID: a->xmid = p; break;
                case A_XN1: a->xn1 = p; break;
                case A_XN2: a->xn2 = p; break;
                case A_QKV: a->qkv = p; break;
                case A_ATT: a->att = p; break;
                case A_LSE: a->lse = p; break;
                case A_GU: a->gu = p; break;
                case A_HS: a->hs = p; break;
                }
            }
        }
        for (int k = 0; k < LORA_N; k++) {
            if (!r || !(t->sh.lora_mask & (1u << k))) continue;
            const uint64_t o = take(&cv, n, es * r);
            if (base) t->acts[l].u[k] = base + o;
        }
    }
    const uint64_t o_xf = take(&cv, n, 4 * dim), o_xnf = take(&cv, n, es * dim);
    const uint64_t acts_end = cv.off;
    const uint64_t o_dx = take(&cv, n, 4 * dim), o_dxn = take(&cv, n, 4 * dim), o_dh = take(&cv, n, 4 * dim);
    const uint64_t o_dxa = es != 4 ? take(&cv, n, es * dim) : 0;
    const uint64_t o_dhs = take(&cv, n, es * ffn), o_dgu = take(&cv, n, es * 2 * ffn);
    const uint64_t o_datt = take(&cv, n, es * qd), o_dqkv = take(&cv, n, es * (qd + 2 * kvd));
    const uint64_t o_du = r ? take(&cv, n, es * r) : 0;
    const uint64_t grads_end = cv.off;
    const uint64_t o_ids = take(&cv, n, 4), o_tgt = take(&cv, n, 4), o_pos = take(&cv, n, 4), o_loss = take(&cv, 1, 8);
    if (!cv.ok)
        return nstf_set_error(NSTF_ERR_RANGE, "training activations for %d x %d tokens overflow", t->sh.n_seq,
                              t->sh.seq_len);
    *total = cv.off;
    if (mem) {
        mem->activations = acts_end;
        mem->act_grads = grads_end - acts_end;
        mem->io = cv.off - grads_end;
    }
    if (!base) return NSTF_OK;
    t->acts[L].x = (float *)(base + o_xf);
    t->xnf = base + o_xnf;
    t->dX = (float *)(base + o_dx);
    t->dxn = (float *)(base + o_dxn);
    t->dh = (float *)(base + o_dh);
    t->dX_act = es != 4 ? (void *)(base + o_dxa) : (void *)t->dX;
    t->dhs = base + o_dhs;
    t->dgu = base + o_dgu;
    t->datt = base + o_datt;
    t->dqkv = base + o_dqkv;
    t->du = r ? base + o_du : NULL;
    t->d_ids = (int32_t *)(base + o_ids);
    t->d_tgt = (int32_t *)(base + o_tgt);
    t->d_pos = (int32_t *)(base + o_pos);
    t->d_loss = (double *)(base + o_loss);
    return NSTF_OK;
}

/* Bytes of the parameter block: w, g (fp32, n_pad), m, v (fp32, one
 * slot with ZeRO-1) and the compute copy (n_pad). */
static nstf_status params_plan(const nstf_train *t, const nstf_backend *be, uint64_t off[5], uint64_t *total) {
    carve cv = {0, true};
    for (int i = 0; i < 4; i++) off[i] = take(&cv, (uint64_t)(i < 2 ? t->n_pad : t->shard_len), 4);
    off[4] = be->act_type != NSTF_TYPE_F32 ? take(&cv, (uint64_t)t->n_pad, esize(be->act_type)) : 0;
    if (!cv.ok) return nstf_set_error(NSTF_ERR_RANGE, "%lld parameters overflow the plan", (long long)t->n_flat);
    *total = cv.off;
    return NSTF_OK;
}

/* The largest scratch any training op of this shape asks its backend for
 * (one buffer, grown to the largest): the cross-entropy's logits chunk, a
 * frozen matrix dequantized for its input gradient (CPU), the attention
 * backward's row dots and log-sum-exps, RMSNorm's per-row factors and dw
 * partials (at most 512 row chunks), and on a GPU the embedding backward's
 * hash of the ids (a power of two >= 2n slots of 8 bytes, and 4 bytes a
 * token). Not counted: the weight gradient's k-split partial sums on
 * Hopper (their splits depend on the device's SM count; tens of MB at
 * the SmolLM2 shape, beside the cross-entropy's 1.56 GiB). */
static uint64_t ops_scratch(const nstf_train *t, const nstf_backend *be) {
    const uint64_t n = (uint64_t)t->n, dim = (uint64_t)t->c.dim, V = (uint64_t)t->c.n_vocab;
    uint64_t ce;
    if (be->host_memory) {
        const uint64_t tc = n < 256 ? n : 256, vc = V < 1024 ? V : 1024; /* NSTF_CE_TOK, NSTF_CE_VOCAB */
        ce = 4 * tc * (2 * dim + vc);
    } else {
        const int64_t rows = nstf_gpu_cross_entropy_rows((int64_t)n, (int64_t)dim, (int64_t)V, NSTF_GPU_CE_BUDGET);
        ce = nstf_gpu_cross_entropy_scratch_bytes((int64_t)n, rows, (int64_t)dim, (int64_t)V);
    }
    uint64_t s = ce;
    const uint64_t rms = 4 * (n + 512 * dim), att = 8 * n * (uint64_t)t->c.n_heads;
    if (rms > s) s = rms;
    if (att > s) s = att;
    if (!be->host_memory) {
        uint64_t slots = 64;
        while (slots < 2 * n) slots *= 2;
        if (8 * slots + 4 * n > s) s = 8 * slots + 4 * n;
    }
    if (t->sh.lora_rank && be->host_memory) {
        const uint64_t big = 4 * dim * (uint64_t)(t->c.ffn_dim > t->c.n_heads * t->c.head_dim ? t->c.ffn_dim
                                                                                                : t->c.n_heads * t->c.head_dim);
        if (big > s) s = big;
    }
    return s;
}

/* ---- plan and create -------------------------------------------------------------------------- */

static nstf_status train_init(nstf_train *t, const nstf_llama *m, const nstf_backend *be, const train_shape *sh) {
    t->m = m;
    t->c = m->cfg;
    t->sh = *sh;
    if (sh->n_seq < 1 || sh->seq_len < 1 || sh->lora_rank < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "batch %d x %d tokens (LoRA rank %d): each must be positive",
                              sh->n_seq, sh->seq_len, sh->lora_rank);
    if (sh->lora_rank > 0 && !(sh->lora_mask & ((1u << LORA_N) - 1)))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "LoRA without a matrix to adapt");
    if (sh->lora_rank % 8 && !be->host_memory)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "--lora %d: on a GPU the rank must be a multiple of 8 (its matmuls move rows in "
                              "16-byte pieces)",
                              sh->lora_rank);
    /* the training step has no backward yet for what the newer families add */
    const char *missing = m->w.rope_factors ? "RoPE frequency factors (Llama 3.x)"
                          : t->c.sliding_window > 0 ? "a sliding window (Mistral)"
                                                    : NULL;
    for (int l = 0; !missing && l < t->c.n_layers; l++) {
        const nstf_llama_layer *L = &m->w.layers[l];
        if (L->bq || L->bk || L->bv) missing = "QKV biases (Qwen2)";
        else if (L->q_norm || L->k_norm) missing = "per-head q/k norms (Qwen3)";
        else if (L->wq.factors || L->wk.factors || L->wv.factors || L->wo.factors || L->w_gate.factors ||
                 L->w_up.factors || L->w_down.factors)
            missing = "low-rank factorized matrices (nstf lowrank)";
    }
    if (missing)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "training: this model has %s, which the training step does not differentiate yet "
                              "(Llama and SmolLM2-style models train)",
                              missing);
    t->n = (int64_t)sh->n_seq * sh->seq_len;
    if (t->n > ((int64_t)1 << 30)) return nstf_set_error(NSTF_ERR_RANGE, "%lld tokens per micro-batch", (long long)t->n);
    if (sh->seq_len > t->c.n_ctx_train)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "--seq %d is longer than the model's context of %d tokens",
                              sh->seq_len, t->c.n_ctx_train);
    t->rows = be->act_type != NSTF_TYPE_F32 && sh->lora_rank == 0;
    NSTF_TRY(ptab_build(t));
    /* ZeRO-1: w, g and the copy padded to whole slots, m and v one slot */
    const int shards = sh->shards > 1 ? sh->shards : 1;
    if (shards > NSTF_COMM_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "optimizer state in %d shards (1..%d)", shards, NSTF_COMM_MAX);
    t->n_pad = t->shard_len = t->n_flat;
    if (shards > 1) {
        NSTF_TRY(nstf_comm_shard_len(t->n_flat, shards, NSTF_TRAIN_SHARD_ALIGN, &t->shard_len));
        t->n_pad = t->shard_len * shards; /* checked by nstf_comm_shard_len */
    }
    return NSTF_OK;
}

static void ptab_free(nstf_train *t) {
    nstf_free(t->ptab);
    nstf_free(t->names);
    t->ptab = NULL;
    t->names = NULL;
}

nstf_status nstf_train_mem_plan(const nstf_llama *m, const nstf_backend *be, const train_shape *sh, train_mem *mem) {
    nstf_train t = {0};
    memset(mem, 0, sizeof *mem);
    nstf_status st = train_init(&t, m, be, sh);
    uint64_t off[5], pbytes = 0, abytes = 0;
    if (st == NSTF_OK) st = params_plan(&t, be, off, &pbytes);
    if (st == NSTF_OK) st = acts_plan(&t, be, NULL, &abytes, mem);
    if (st == NSTF_OK) {
        mem->weights = off[1] - off[0];
        mem->grads = off[2] - off[1];
        mem->optimizer = pbytes - off[2] - (off[4] ? pbytes - off[4] : 0);
        mem->copy = off[4] ? pbytes - off[4] : 0;
        for (int i = 0; i < t.n_ptab; i++) mem->n_params += t.ptab[i].n;
        mem->workspace = ops_scratch(&t, be);
        if (sh->lora_rank > 0) {
            /* the base as stored, and the output matrix dequantized once */
            const nstf_gguf *g = m->file;
            for (uint64_t i = 0; g && i < g->n_tensors; i++) {
                mem->frozen += g->tensors[i].n_bytes;
                mem->n_frozen += (int64_t)g->tensors[i].n_elems;
            }
            mem->frozen += (uint64_t)m->cfg.n_vocab * (uint64_t)m->cfg.dim * esize(be->act_type);
        }
    }
    ptab_free(&t);
    return st;
}

/* fp32 rows of a stored matrix (or vector) into dst. */
static void dequant_rows(const void *src, nstf_type type, int64_t rows, int64_t cols, float *dst) {
    uint64_t rb = 0;
    (void)nstf_type_row_bytes(type, cols, &rb);
    for (int64_t r = 0; r < rows; r++)
        nstf_dequantize_row(type, (const unsigned char *)src + (uint64_t)r * rb, dst + r * cols, cols);
}

/* The base's value of trainable tensor i (full fine-tune), fp32. */
static void base_values(const nstf_train *t, int i, float *dst) {
    const nstf_llama_config *c = &t->c;
    const nstf_llama_weights *w = &t->m->w;
    const char *nm = t->ptab[i].name;
    int l = -1;
    char kind[64] = "";
    if (sscanf(nm, "blk.%d.%63[^.]", &l, kind) == 2) {
        const nstf_llama_layer *L = &w->layers[l];
        if (!strcmp(kind, "attn_norm")) memcpy(dst, L->attn_norm, (size_t)c->dim * 4);
        else if (!strcmp(kind, "ffn_norm")) memcpy(dst, L->ffn_norm, (size_t)c->dim * 4);
        else {
            const nstf_matrix *mats[LORA_N] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
            for (int k = 0; k < LORA_N; k++)
                if (!strcmp(kind, nstf_lora_names[k]))
                    dequant_rows(mats[k]->data, mats[k]->type, mats[k]->n_out, mats[k]->n_in, dst);
        }
    } else if (!strcmp(nm, "token_embd.weight")) {
        dequant_rows(w->tok_embd.data, w->tok_embd.type, w->tok_embd.n_out, w->tok_embd.n_in, dst);
    } else if (!strcmp(nm, "output.weight")) {
        dequant_rows(w->output.data, w->output.type, w->output.n_out, w->output.n_in, dst);
    } else if (!strcmp(nm, "output_norm.weight")) {
        memcpy(dst, w->out_norm, (size_t)c->dim * 4);
    }
}

/* xorshift64* in [-1, 1) */
static double lora_uniform(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 2685821657736338717ull) >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* Initial values of every tensor, uploaded tensor by tensor (with the
 * compute copy); the moments and gradients start at zero. */
static nstf_status params_init(nstf_train *t, uint64_t seed) {
    nstf_backend *be = t->be;
    int64_t most = 0;
    for (int i = 0; i < t->n_ptab; i++) most = t->ptab[i].n > most ? t->ptab[i].n : most;
    float *h = nstf_alloc((size_t)most * sizeof(float), "initial weights");
    uint16_t *h16 = t->wc ? nstf_alloc((size_t)most * sizeof(uint16_t), "initial compute copy") : NULL;
    if (!h || (t->wc && !h16)) {
        nstf_free(h);
        return NSTF_ERR_OOM;
    }
    nstf_status st = NSTF_OK;
    uint64_t rng = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
    for (int i = 0; st == NSTF_OK && i < t->n_ptab; i++) {
        const nstf_param_tensor *p = &t->ptab[i];
        if (t->sh.lora_rank > 0) {
            const size_t ln = strlen(p->name);
            const bool is_a = ln > 7 && strcmp(p->name + ln - 7, ".lora_a") == 0;
            const int64_t cols = p->n / t->sh.lora_rank;
            for (int64_t k = 0; k < p->n; k++) h[k] = is_a ? (float)(lora_uniform(&rng) / sqrt((double)cols)) : 0.0f;
        } else {
            base_values(t, i, h);
        }
        st = be->vt->upload(be, t->w + p->offset, h, (uint64_t)p->n * 4);
        if (st == NSTF_OK && t->wc) {
            for (int64_t k = 0; k < p->n; k++) h16[k] = nstf_f32_to_bf16(h[k]);
            st = be->vt->upload(be, (uint16_t *)t->wc + p->offset, h16, (uint64_t)p->n * 2);
        }
    }
    nstf_free(h);
    nstf_free(h16);
    return st;
}

/* A compute view of trainable tensor name as a [rows, cols] matrix. */
static nstf_matrix cview(const nstf_train *t, const char *name, int64_t rows, int64_t cols) {
    const int i = ptab_find(t, name);
    const int64_t off = i >= 0 ? t->ptab[i].offset : 0;
    const nstf_type ty = t->wc ? t->be->act_type : NSTF_TYPE_F32;
    const void *d = t->wc ? (const void *)((const char *)t->wc + (uint64_t)off * esize(ty)) : (const void *)(t->w + off);
    nstf_matrix m = {d, ty, cols, rows, NULL};
    return m;
}

static float *gview(const nstf_train *t, const char *name) {
    const int i = ptab_find(t, name);
    return i >= 0 ? t->g + t->ptab[i].offset : NULL;
}

static const float *wview(const nstf_train *t, const char *name) {
    const int i = ptab_find(t, name);
    return i >= 0 ? t->w + t->ptab[i].offset : NULL;
}

/* What the ops read: the compute copy and master norms (full fine-tune),
 * or the frozen base with the adapters' views (LoRA). */
static void views(nstf_train *t) {
    const nstf_llama_config *c = &t->c;
    char nm[96];
    for (int l = 0; l < c->n_layers; l++) {
        train_layer *L = &t->layers[l];
        if (t->sh.lora_rank > 0) {
            L->w = t->frozen->w.layers[l];
            for (int k = 0; k < LORA_N; k++) {
                L->has_lora[k] = (t->sh.lora_mask >> k) & 1u;
                if (!L->has_lora[k]) continue;
                int64_t rows, cols;
                layer_mat_shape(c, k, &rows, &cols);
                snprintf(nm, sizeof nm, "blk.%d.%s.weight.lora_a", l, nstf_lora_names[k]);
                L->lora[k].a = cview(t, nm, t->sh.lora_rank, cols);
                L->lora[k].ga = gview(t, nm);
                snprintf(nm, sizeof nm, "blk.%d.%s.weight.lora_b", l, nstf_lora_names[k]);
                L->lora[k].bt = cview(t, nm, t->sh.lora_rank, rows);
                L->lora[k].gbt = gview(t, nm);
            }
            continue;
        }
        nstf_matrix *mats[LORA_N] = {&L->w.wq, &L->w.wk, &L->w.wv, &L->w.wo, &L->w.w_gate, &L->w.w_up, &L->w.w_down};
        float **grads[LORA_N] = {&L->g_q, &L->g_k, &L->g_v, &L->g_o, &L->g_gate, &L->g_up, &L->g_down};
        for (int k = 0; k < LORA_N; k++) {
            int64_t rows, cols;
            layer_mat_shape(c, k, &rows, &cols);
            snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, nstf_lora_names[k]);
            *mats[k] = cview(t, nm, rows, cols);
            *grads[k] = gview(t, nm);
        }
        snprintf(nm, sizeof nm, "blk.%d.attn_norm.weight", l);
        L->w.attn_norm = wview(t, nm);
        L->g_attn_norm = gview(t, nm);
        snprintf(nm, sizeof nm, "blk.%d.ffn_norm.weight", l);
        L->w.ffn_norm = wview(t, nm);
        L->g_ffn_norm = gview(t, nm);
    }
    if (t->sh.lora_rank > 0) {
        t->tok_embd = t->frozen->w.tok_embd;
        t->out_norm = t->frozen->w.out_norm;
        return;
    }
    const int ie = ptab_find(t, "token_embd.weight");
    t->tok_embd = (nstf_matrix){t->w + t->ptab[ie].offset, NSTF_TYPE_F32, c->dim, c->n_vocab, NULL};
    t->g_tok_embd = t->g + t->ptab[ie].offset;
    const char *out = c->tied_output ? "token_embd.weight" : "output.weight";
    t->ce_w = cview(t, out, c->n_vocab, c->dim);
    t->g_output = gview(t, out);
    t->out_norm = wview(t, "output_norm.weight");
    t->g_out_norm = gview(t, "output_norm.weight");
}

/* LoRA: the frozen output matrix as the cross-entropy reads it (F32 on the
 * CPU, the activation type on a GPU), dequantized once by the GET_ROWS row. */
static nstf_status frozen_output(nstf_train *t) {
    nstf_backend *be = t->be;
    const nstf_matrix *o = &t->frozen->w.output;
    const nstf_type want = be->host_memory ? NSTF_TYPE_F32 : be->act_type;
    if (o->type == want) {
        t->ce_w = *o;
        return NSTF_OK;
    }
    const int64_t V = o->n_out, dim = o->n_in;
    uint64_t bytes = 0;
    if (!nstf_mul_ok((uint64_t)V * (uint64_t)dim, esize(want), &bytes)) return nstf_set_error(NSTF_ERR_RANGE, "output matrix");
    NSTF_TRY(be->vt->alloc(be, bytes, &t->ce_copy));
    int32_t *ids = nstf_alloc((size_t)V * sizeof(int32_t), "row ids");
    void *d_ids = NULL;
    nstf_status st = ids ? be->vt->alloc(be, (uint64_t)V * 4, &d_ids) : NSTF_ERR_OOM;
    for (int64_t i = 0; ids && i < V; i++) ids[i] = (int32_t)i;
    if (st == NSTF_OK) st = be->vt->upload(be, d_ids, ids, (uint64_t)V * 4);
    if (st == NSTF_OK) {
        nstf_op_args a = {.op = NSTF_OP_GET_ROWS, .label = "output_dequant", .layer = -1};
        a.get_rows.table = o;
        a.get_rows.ids = d_ids;
        a.get_rows.out = (nstf_view){t->ce_copy, want, dim};
        a.get_rows.n = V;
        st = nstf_backend_op(be, &a);
    }
    if (st == NSTF_OK) st = be->vt->sync(be);
    if (d_ids) be->vt->free(be, d_ids);
    nstf_free(ids);
    t->ce_w = (nstf_matrix){t->ce_copy, want, dim, V, NULL};
    return st;
}

static double gib(uint64_t b) { return (double)b / (1u << 30); }

nstf_status nstf_train_create(const nstf_llama *m, nstf_backend *be, const train_shape *sh, uint64_t seed,
                              nstf_train **out) {
    *out = NULL;
    nstf_train *t = nstf_calloc(1, sizeof *t, "training state");
    if (!t) return NSTF_ERR_OOM;
    t->be = be;
    nstf_status st = train_init(t, m, be, sh);
    if (st == NSTF_OK) st = nstf_train_mem_plan(m, be, sh, &t->mem);
    if (st == NSTF_OK) {
        nstf_backend_mem bm;
        be->vt->mem(be, &bm);
        const train_mem *p = &t->mem;
        const uint64_t need = p->weights + p->copy + p->grads + p->optimizer + p->activations + p->act_grads +
                              p->workspace + p->io + (be->host_memory ? 0 : p->frozen) + bm.reserve;
        if (bm.free && need > bm.free)
            st = nstf_set_error(NSTF_ERR_OOM,
                                "training needs %.2f GiB on %s (weights %.2f, copy %.2f, gradients %.2f, optimizer "
                                "%.2f, frozen base %.2f, activations %.2f, activation gradients %.2f, workspace %.2f) "
                                "but %.2f GiB are free; lower --batch or --seq, use --recompute attn or full, or LoRA",
                                gib(need), be->device, gib(p->weights), gib(p->copy), gib(p->grads), gib(p->optimizer),
                                be->host_memory ? 0.0 : gib(p->frozen), gib(p->activations), gib(p->act_grads),
                                gib(p->workspace), gib(bm.free));
    }
    t->layers = st == NSTF_OK ? nstf_calloc((size_t)t->c.n_layers, sizeof *t->layers, "layers") : NULL;
    t->acts = st == NSTF_OK ? nstf_calloc((size_t)t->c.n_layers + 1, sizeof *t->acts, "activations") : NULL;
    t->h_ids = st == NSTF_OK ? nstf_alloc((size_t)t->n * sizeof(int32_t), "batch ids") : NULL;
    t->h_tgt = st == NSTF_OK ? nstf_alloc((size_t)t->n * sizeof(int32_t), "batch targets") : NULL;
    if (st == NSTF_OK && (!t->layers || !t->acts || !t->h_ids || !t->h_tgt)) st = NSTF_ERR_OOM;
    /* the backend's own workspace; LoRA: the frozen base placed as for inference */
    if (st == NSTF_OK && sh->lora_rank > 0) st = nstf_llama_run_create(m, be, 1, 1, 1, &t->frozen);
    if (st == NSTF_OK && sh->lora_rank == 0) {
        const nstf_llama_config *c = &m->cfg;
        nstf_backend_plan bp = {c->n_layers, c->dim, c->n_heads, c->n_kv_heads, c->head_dim, c->ffn_dim, c->n_vocab,
                                sh->seq_len, sh->seq_len, 1, c->rope_base, c->rope_mode, NULL, 0,
                                /* the trained tables are the fp32 masters */
                                NSTF_TYPE_F32, NSTF_TYPE_F32,
                                /* a contiguous cache of the backend's type */
                                0, 0, false};
        uint64_t ws = 0;
        st = be->vt->plan(be, &bp, &ws);
        if (st == NSTF_OK) st = be->vt->prepare(be, &bp);
    }
    uint64_t off[5], pbytes = 0, abytes = 0;
    if (st == NSTF_OK) st = params_plan(t, be, off, &pbytes);
    if (st == NSTF_OK) st = be->vt->alloc(be, pbytes, &t->pblock);
    if (st == NSTF_OK) {
        char *b = t->pblock;
        t->w = (float *)(b + off[0]);
        t->g = (float *)(b + off[1]);
        t->mom1 = (float *)(b + off[2]);
        t->mom2 = (float *)(b + off[3]);
        t->wc = off[4] ? b + off[4] : NULL;
        st = be->vt->zero(be, t->pblock, pbytes); /* moments, gradients and the slots' padding start at 0 */
    }
    if (st == NSTF_OK) st = acts_plan(t, be, NULL, &abytes, NULL);
    if (st == NSTF_OK) st = be->vt->alloc(be, abytes, &t->ablock);
    if (st == NSTF_OK) st = acts_plan(t, be, t->ablock, &abytes, NULL);
    if (st == NSTF_OK) st = be->vt->zero(be, t->ablock, abytes);
    if (st == NSTF_OK) st = params_init(t, seed);
    if (st == NSTF_OK) st = nstf_train_segments(t, 1, 0);
    if (st == NSTF_OK) {
        views(t);
        if (sh->lora_rank > 0) st = frozen_output(t);
    }
    if (st == NSTF_OK) { /* positions: token i of a sequence at i */
        int32_t *pos = nstf_alloc((size_t)t->n * sizeof(int32_t), "positions");
        if (!pos) st = NSTF_ERR_OOM;
        for (int64_t i = 0; pos && i < t->n; i++) pos[i] = (int32_t)(i % sh->seq_len);
        if (st == NSTF_OK) st = be->vt->upload(be, t->d_pos, pos, (uint64_t)t->n * 4);
        nstf_free(pos);
    }
    if (st == NSTF_OK) st = be->vt->sync(be);
    if (st != NSTF_OK) {
        nstf_train_free(t);
        return st;
    }
    *out = t;
    return NSTF_OK;
}

void nstf_train_free(nstf_train *t) {
    if (!t) return;
    nstf_backend *be = t->be;
    if (be) {
        (void)be->vt->sync(be);
        if (t->pblock) be->vt->free(be, t->pblock);
        if (t->ablock) be->vt->free(be, t->ablock);
        if (t->ce_copy) be->vt->free(be, t->ce_copy);
    }
    nstf_llama_run_free(t->frozen);
    nstf_train_segments_free(t);
    ptab_free(t);
    nstf_free(t->layers);
    nstf_free(t->acts);
    nstf_free(t->h_ids);
    nstf_free(t->h_tgt);
    nstf_free(t);
}

/* ---- the flat arrays to and from the host ---------------------------------------------------- */

void nstf_train_shard(const nstf_train *t, int64_t *lo, int64_t *hi) {
    *lo = 0;
    *hi = t->n_flat;
    if (t->sh.shards <= 1) return;
    const int64_t a = t->shard_len * t->dp_rank, b = a + t->shard_len;
    *lo = a < t->n_flat ? a : t->n_flat;
    *hi = b < t->n_flat ? b : t->n_flat;
}

/* Flat array `which` from element off: the weights are whole on every
 * rank; with ZeRO-1 the moments hold this rank's slot only. */
static nstf_status flat_at(nstf_train *t, int which, int64_t off, int64_t n, float **p) {
    int64_t lo = 0, hi = t->n_flat;
    if (which != 0) nstf_train_shard(t, &lo, &hi);
    if (which < 0 || which > 2 || off < lo || n < 0 || n > hi - off)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "parameters [%lld, %lld) of %lld%s", (long long)off,
                              (long long)(off + n), (long long)t->n_flat,
                              which != 0 && t->sh.shards > 1 ? " (outside this rank's optimizer slot)" : "");
    *p = (which == 0 ? t->w : which == 1 ? t->mom1 : t->mom2) + (off - lo);
    return NSTF_OK;
}

nstf_status nstf_train_get(nstf_train *t, int which, int64_t off, int64_t n, float *host) {
    float *p = NULL;
    NSTF_TRY(flat_at(t, which, off, n, &p));
    return t->be->vt->download(t->be, host, p, (uint64_t)n * 4);
}

nstf_status nstf_train_put(nstf_train *t, int which, int64_t off, int64_t n, const float *host) {
    float *p = NULL;
    NSTF_TRY(flat_at(t, which, off, n, &p));
    return t->be->vt->upload(t->be, p, host, (uint64_t)n * 4);
}

nstf_status nstf_train_sync_copy(nstf_train *t) {
    if (!t->wc) return NSTF_OK;
    const int64_t chunk = (int64_t)1 << 22;
    float *h = nstf_alloc((size_t)chunk * 4, "weights");
    uint16_t *h16 = nstf_alloc((size_t)chunk * 2, "compute copy");
    nstf_status st = h && h16 ? NSTF_OK : NSTF_ERR_OOM;
    for (int64_t o = 0; st == NSTF_OK && o < t->n_flat; o += chunk) {
        const int64_t k = t->n_flat - o < chunk ? t->n_flat - o : chunk;
        st = nstf_train_get(t, 0, o, k, h);
        for (int64_t i = 0; st == NSTF_OK && i < k; i++) h16[i] = nstf_f32_to_bf16(h[i]);
        if (st == NSTF_OK) st = t->be->vt->upload(t->be, (uint16_t *)t->wc + o, h16, (uint64_t)k * 2);
    }
    nstf_free(h);
    nstf_free(h16);
    return st;
}

double nstf_train_flops_per_token(const nstf_train *t) {
    const nstf_llama_config *c = &t->c;
    double p = 0;
    for (int k = 0; k < LORA_N; k++) {
        int64_t rows, cols;
        layer_mat_shape(c, k, &rows, &cols);
        p += (double)rows * cols;
    }
    p = p * c->n_layers + (double)c->n_vocab * c->dim; /* the logits */
    /* forward 2 per weight, backward 4 (dX and dW); LoRA skips the frozen
     * dW but still runs dX: 4 per weight */
    const double per_w = t->sh.lora_rank > 0 ? 4.0 : 6.0;
    const double att = 6.0 * c->n_layers * (double)t->sh.seq_len * c->n_heads * c->head_dim; /* causal QK^T, PV */
    return per_w * p + att;
}
