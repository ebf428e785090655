/* perplexity.c — perplexity of a session's model on a token stream, and
 * the KL divergence against a base model's saved log-probabilities, as
 * llama.cpp's llama-perplexity computes them (nstf_tools.h), so the two
 * tools give the same numbers on the same file and text:
 *
 *   - the tokens are cut into n_chunk = n_tokens / n_ctx windows of n_ctx
 *     tokens (the rest is dropped); a model that adds BOS gets it in place
 *     of each window's first token; the window runs from position 0 in
 *     forwards of n_batch tokens;
 *   - the second half is scored: the logits at positions first = n_ctx/2
 *     .. n_ctx-2 predict the tokens at first+1 .. n_ctx-1, each
 *     nll = log(sum_j e^(l_j - max)) + max - l_tok (max and the terms in
 *     float, the sum in double, llama.cpp's roundings);
 *   - PPL = exp(mean nll), +/- its standard error times PPL.
 * The log-probability file (llama.cpp's --kl-divergence-base format):
 *   char[8] "_logits_"; uint32 n_ctx; int32 n_vocab, n_chunk;
 *   int32 tokens[n_chunk * n_ctx] (as tokenized, before BOS replacement);
 *   per chunk, per scored position (n_ctx - 1 - first of them),
 *   nv = 2 ((n_vocab + 1) / 2) + 4 uint16: float scale, float min_log_prob,
 *   then each token's log-probability as min_log_prob + scale q (q 0 for
 *   values more than 16 below the maximum).
 * With a base file the tokens come from it, and per position: KL(base ||
 * model) over the base's tokens above -16, the probability difference of
 * the scored token, and whether both put their maximum on the same token. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/mem.h"
#include "model/session.h"

typedef struct {
    double sum_nll, sum_nll2, sum_nll_base, sum_nll_base2, sum_nll_nll_base;
    double sum_kld, sum_kld2, sum_p_diff, sum_p_diff2, sum_p_diff4;
    float max_p_diff;
    int64_t n_same_top, count;
} kl_sums;

/* llama.cpp's log_softmax: -log p(tok), and (q) the row quantized into
 * 16-bit log-probabilities for the base file. */
static double row_nll(const float *l, int n_vocab, int32_t tok, uint16_t *q) {
    float mx = l[0], mn = l[0];
    for (int i = 1; i < n_vocab; i++) {
        mx = l[i] > mx ? l[i] : mx;
        mn = l[i] < mn ? l[i] : mn;
    }
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += expf(l[i] - mx);
    if (!q) return -((double)(l[tok] - mx) - log(sum));
    mn = mn > mx - 16 ? mn : mx - 16;
    const float lse = (float)log(sum), min_log_prob = mn - mx - lse, scale = (mx - mn) / 65535.f;
    memcpy(q, &scale, 4);
    memcpy(q + 2, &min_log_prob, 4);
    uint16_t *v = q + 4;
    if (scale) {
        const float inv = 1 / scale;
        for (int i = 0; i < n_vocab; i++) {
            if (!(l[i] > mn)) {
                v[i] = 0;
                continue;
            }
            const float f = inv * (l[i] - mn) + 12582912.f; /* llama.cpp's nearest_int */
            int32_t bits;
            memcpy(&bits, &f, 4);
            v[i] = (uint16_t)((bits & 0x007fffff) - 0x00400000);
        }
    } else {
        memset(v, 0, (size_t)n_vocab * 2);
    }
    return mx + lse - l[tok];
}

/* One position against the base's quantized row (llama.cpp's kl
 * log_softmax): adds to k, returns the KL; *p_diff the probability change
 * of the scored token. */
static double row_kl(const float *l, int n_vocab, const uint16_t *base, int32_t tok, kl_sums *k, float *p_diff) {
    float mx = l[0];
    int imax = 0;
    for (int i = 1; i < n_vocab; i++)
        if (l[i] > mx) mx = l[i], imax = i;
    double sum_exp = 0;
    for (int i = 0; i < n_vocab; i++) sum_exp += expf(l[i] - mx);
    const float lse = (float)log(sum_exp);
    float scale, min_log_prob;
    memcpy(&scale, base, 4);
    memcpy(&min_log_prob, base + 2, 4);
    const uint16_t *b = base + 4;
    const float nll = mx + lse - l[tok], nll_base = -(scale * b[tok] + min_log_prob);
    k->sum_nll += nll;
    k->sum_nll2 += nll * nll;
    k->sum_nll_base += nll_base;
    k->sum_nll_base2 += nll_base * nll_base;
    k->sum_nll_nll_base += nll * nll_base;
    mx += lse;
    double kl = 0;
    int imax_base = -1;
    float pmax = 0;
    for (int i = 0; i < n_vocab; i++) {
        const float lb = scale * b[i] + min_log_prob;
        if (i == 0 || lb > pmax) pmax = lb, imax_base = i;
        if (lb > -16.f) kl += expf(lb) * (lb - l[i] + mx);
    }
    k->sum_kld += kl;
    k->sum_kld2 += kl * kl;
    k->count++;
    k->n_same_top += imax == imax_base;
    const float d = expf(-nll) - expf(-nll_base);
    const double d2 = (double)d * d;
    k->sum_p_diff += d;
    k->sum_p_diff2 += d2;
    k->sum_p_diff4 += d2 * d2;
    k->max_p_diff = fabsf(d) > k->max_p_diff ? fabsf(d) : k->max_p_diff;
    *p_diff = d;
    return kl;
}

/* mean and standard error of the mean from sums, as llama.cpp */
static void mean_unc(double sum, double sum2, int64_t n, double *mean, double *unc) {
    *mean = n > 0 ? sum / (double)n : 0;
    double var = n > 0 ? sum2 / (double)n - *mean * *mean : 0;
    *unc = var > 0 && n > 10 ? sqrt(var / (double)(n - 1)) : 0;
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static double percentile(const float *v, int64_t n, double f) {
    if (f <= 0) return v[0];
    if (f >= 1) return v[n - 1];
    double p = f * (double)(n - 1);
    int64_t i = (int64_t)p;
    p -= (double)i;
    return (1 - p) * v[i] + p * v[i + 1 < n ? i + 1 : n - 1];
}

typedef struct {
    FILE *f;
    const char *path;
} io_file;

static nstf_status io_check(io_file *io, size_t got, size_t want, const char *what) {
    if (got == want) return NSTF_OK;
    return nstf_set_error(NSTF_ERR_IO, "%s: %s %s", io->path, ferror(io->f) ? "cannot" : "truncated while trying to",
                          what);
}

/* The base file's header and tokens; *tokens malloc'd. */
static nstf_status read_base(io_file *in, int n_vocab, int *n_ctx, int *n_chunk, int32_t **tokens) {
    char magic[8];
    uint32_t ctx;
    int32_t nv, nc;
    NSTF_TRY(io_check(in, fread(magic, 1, 8, in->f), 8, "read the header"));
    if (memcmp(magic, "_logits_", 8) != 0)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: not a file of log-probabilities (no _logits_ magic)", in->path);
    NSTF_TRY(io_check(in, fread(&ctx, 4, 1, in->f), 1, "read the context size"));
    NSTF_TRY(io_check(in, fread(&nv, 4, 1, in->f), 1, "read the vocabulary size"));
    NSTF_TRY(io_check(in, fread(&nc, 4, 1, in->f), 1, "read the chunk count"));
    if (nv != n_vocab)
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: base vocabulary of %d tokens, the model has %d", in->path, nv,
                              n_vocab);
    if (ctx < 2 || ctx > (1u << 20) || nc < 1 || (uint64_t)nc * ctx > (1ull << 31))
        return nstf_set_error(NSTF_ERR_FORMAT, "%s: context %u, %d chunks", in->path, ctx, nc);
    *n_ctx = (int)ctx;
    *n_chunk = nc;
    const size_t n = (size_t)ctx * (size_t)nc;
    *tokens = nstf_alloc(n * sizeof(int32_t), "base tokens");
    if (!*tokens) return NSTF_ERR_OOM;
    NSTF_TRY(io_check(in, fread(*tokens, 4, n, in->f), n, "read the tokens"));
    for (size_t i = 0; i < n; i++)
        if ((*tokens)[i] < 0 || (*tokens)[i] >= n_vocab)
            return nstf_set_error(NSTF_ERR_FORMAT, "%s: token %zu is %d, outside the vocabulary", in->path, i,
                                  (*tokens)[i]);
    return NSTF_OK;
}

typedef struct {
    nstf_session *s;
    const nstf_ppl_params *p;
    nstf_ppl_result *r;
    io_file in, out;
    const int32_t *tokens;
    int n_ctx, n_chunk, first, n_vocab, nv;
    float *logits;    /* [n_ctx - first, n_vocab] the scored half */
    float *batch;     /* [n_batch, n_vocab] */
    int32_t *window;  /* [n_ctx] */
    uint16_t *q;      /* [n_ctx - 1 - first, nv] quantized rows (save / base) */
    float *kld;       /* [n_chunk * (n_ctx - 1 - first)] with a base */
    kl_sums k;
    double nll, nll2;
} ppl_run;

/* One window: forwards of n_batch tokens, the scored half kept. */
static nstf_status eval_window(ppl_run *c, int chunk) {
    const int n_ctx = c->n_ctx, nb = c->p->n_batch;
    memcpy(c->window, c->tokens + (size_t)chunk * n_ctx, (size_t)n_ctx * sizeof(int32_t));
    if (nstf_tokenizer_wants_bos(c->s->tok) && nstf_tokenizer_bos(c->s->tok) >= 0)
        c->window[0] = nstf_tokenizer_bos(c->s->tok);
    for (int b0 = 0; b0 < n_ctx; b0 += nb) {
        const int n = n_ctx - b0 < nb ? n_ctx - b0 : nb;
        if (b0 + n <= c->first) { /* nothing of this batch is scored: the last row's logits only */
            NSTF_TRY(nstf_session_forward(c->s, c->window + b0, n, b0, false, NULL, NULL));
            continue;
        }
        NSTF_TRY(nstf_session_forward(c->s, c->window + b0, n, b0, true, c->batch, NULL));
        for (int t = 0; t < n; t++)
            if (b0 + t >= c->first)
                memcpy(c->logits + (size_t)(b0 + t - c->first) * c->n_vocab, c->batch + (size_t)t * c->n_vocab,
                       (size_t)c->n_vocab * sizeof(float));
    }
    return NSTF_OK;
}

static nstf_status score_window(ppl_run *c, int chunk) {
    const int n_score = c->n_ctx - 1 - c->first;
    const int32_t *next = c->tokens + (size_t)chunk * c->n_ctx + c->first + 1; /* the scored tokens */
    if (c->in.f) {
        NSTF_TRY(io_check(&c->in, fread(c->q, 2, (size_t)n_score * c->nv, c->in.f), (size_t)n_score * c->nv,
                          "read the base log-probabilities"));
        for (int i = 0; i < n_score; i++) {
            float p_diff;
            c->kld[(size_t)chunk * n_score + i] =
                (float)row_kl(c->logits + (size_t)i * c->n_vocab, c->n_vocab, c->q + (size_t)i * c->nv, next[i], &c->k,
                              &p_diff);
        }
        return NSTF_OK;
    }
    for (int i = 0; i < n_score; i++) {
        const double v = row_nll(c->logits + (size_t)i * c->n_vocab, c->n_vocab, next[i],
                                 c->out.f ? c->q + (size_t)i * c->nv : NULL);
        c->nll += v;
        c->nll2 += v * v;
    }
    if (c->out.f)
        NSTF_TRY(io_check(&c->out, fwrite(c->q, 2, (size_t)n_score * c->nv, c->out.f), (size_t)n_score * c->nv,
                          "write the log-probabilities"));
    return NSTF_OK;
}

/* The running PPL after `count` positions (the number printed per chunk). */
static double running_ppl(const ppl_run *c) {
    return c->in.f ? exp(c->k.sum_nll / (double)c->k.count) : exp(c->nll / (double)c->r->count);
}

static void kl_summary(ppl_run *c) {
    nstf_ppl_result *r = c->r;
    const kl_sums *k = &c->k;
    double lp, lpu, lb, lbu;
    mean_unc(k->sum_nll, k->sum_nll2, k->count, &lp, &lpu);
    mean_unc(k->sum_nll_base, k->sum_nll_base2, k->count, &lb, &lbu);
    r->ppl = exp(lp);
    r->ppl_unc = r->ppl * lpu;
    r->ppl_base = exp(lb);
    r->ppl_base_unc = r->ppl_base * lbu;
    double cov = 0;
    if (k->count >= 10) {
        cov = k->sum_nll_nll_base / (double)k->count - (k->sum_nll / (double)k->count) * (k->sum_nll_base / (double)k->count);
        cov /= (double)(k->count - 1);
    }
    r->ln_ratio = lp - lb;
    r->ln_ratio_unc = sqrt(fmax(0, lpu * lpu + lbu * lbu - 2 * cov));
    mean_unc(k->sum_kld, k->sum_kld2, k->count, &r->kld, &r->kld_unc);
    mean_unc(k->sum_p_diff, k->sum_p_diff2, k->count, &r->p_diff, &r->p_diff_unc);
    double ms, msu;
    mean_unc(k->sum_p_diff2, k->sum_p_diff4, k->count, &ms, &msu);
    r->p_diff_rms = sqrt(ms);
    r->p_diff_rms_unc = r->p_diff_rms > 0 ? 0.5 / r->p_diff_rms * msu : 0;
    r->p_diff_max = k->max_p_diff;
    r->same_top = k->count ? (double)k->n_same_top / (double)k->count : 0;
    r->same_top_unc = k->count > 1 ? sqrt(r->same_top * (1 - r->same_top) / (double)(k->count - 1)) : 0;
    const int64_t n = k->count;
    qsort(c->kld, (size_t)n, sizeof(float), cmp_float);
    static const double fr[NSTF_PPL_N_PCT] = {1.0, 0.999, 0.99, 0.95, 0.90, 0.5, 0.10, 0.05, 0.01, 0.001, 0.0};
    for (int i = 0; i < NSTF_PPL_N_PCT; i++) r->kld_pct[i] = n ? percentile(c->kld, n, fr[i]) : 0;
    if (n) /* llama.cpp's median: the middle pair's mean for an even count */
        r->kld_pct[5] = n % 2 ? c->kld[n / 2] : 0.5f * (c->kld[n / 2] + c->kld[n / 2 - 1]);
}

nstf_status nstf_perplexity(nstf_session *s, const int32_t *tokens, int64_t n_tokens, const nstf_ppl_params *p,
                            nstf_ppl_result *r) {
    if (!s || !p || !r || (!p->kl_base && (!tokens || n_tokens < 0)) || p->n_batch < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_perplexity: bad arguments");
    memset(r, 0, sizeof *r);
    ppl_run c = {.s = s, .p = p, .r = r, .tokens = tokens, .n_ctx = p->n_ctx, .n_vocab = s->model->cfg.n_vocab};
    c.nv = 2 * ((c.n_vocab + 1) / 2) + 4;
    int32_t *base_tokens = NULL;
    nstf_status st = NSTF_OK;
    if (p->kl_base) {
        c.in = (io_file){fopen(p->kl_base, "rb"), p->kl_base};
        if (!c.in.f) return nstf_set_error(NSTF_ERR_IO, "%s: cannot open the base log-probabilities", p->kl_base);
        st = read_base(&c.in, c.n_vocab, &c.n_ctx, &c.n_chunk, &base_tokens);
        if (st == NSTF_OK && p->n_ctx && p->n_ctx != c.n_ctx)
            st = nstf_set_error(NSTF_ERR_INVALID_ARG, "%s was computed with a context of %d, not %d: give -c %d",
                                p->kl_base, c.n_ctx, p->n_ctx, c.n_ctx);
        c.tokens = base_tokens;
        if (st == NSTF_OK && p->n_chunks >= 0 && p->n_chunks < c.n_chunk) c.n_chunk = p->n_chunks;
    } else {
        if (c.n_ctx < 2 || c.n_ctx % 2)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "perplexity: context %d must be even and at least 2", c.n_ctx);
        if (n_tokens < 2 * (int64_t)c.n_ctx)
            return nstf_set_error(NSTF_ERR_INVALID_ARG,
                                  "perplexity: the text is %lld tokens; a context of %d needs at least %d (two windows)",
                                  (long long)n_tokens, c.n_ctx, 2 * c.n_ctx);
        c.n_chunk = (int)(n_tokens / c.n_ctx);
        if (p->n_chunks >= 0 && p->n_chunks < c.n_chunk) c.n_chunk = p->n_chunks;
    }
    if (st == NSTF_OK && (c.n_ctx > s->n_ctx || p->n_batch > s->n_batch))
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "perplexity: context %d / batch %d exceed the session's %d / %d",
                            c.n_ctx, p->n_batch, s->n_ctx, s->n_batch);
    c.first = c.n_ctx / 2;
    const int n_score = c.n_ctx - 1 - c.first;
    if (st == NSTF_OK && p->save_logits && !p->kl_base) {
        c.out = (io_file){fopen(p->save_logits, "wb"), p->save_logits};
        if (!c.out.f) st = nstf_set_error(NSTF_ERR_IO, "%s: cannot create the log-probability file", p->save_logits);
        const uint32_t ctx = (uint32_t)c.n_ctx;
        const int32_t hdr[2] = {c.n_vocab, c.n_chunk};
        if (st == NSTF_OK) st = io_check(&c.out, fwrite("_logits_", 1, 8, c.out.f), 8, "write the header");
        if (st == NSTF_OK) st = io_check(&c.out, fwrite(&ctx, 4, 1, c.out.f), 1, "write the header");
        if (st == NSTF_OK) st = io_check(&c.out, fwrite(hdr, 4, 2, c.out.f), 2, "write the header");
        if (st == NSTF_OK)
            st = io_check(&c.out, fwrite(c.tokens, 4, (size_t)c.n_chunk * c.n_ctx, c.out.f), (size_t)c.n_chunk * c.n_ctx,
                          "write the tokens");
    }
    if (st == NSTF_OK) {
        c.logits = nstf_alloc((size_t)(c.n_ctx - c.first) * (size_t)c.n_vocab * sizeof(float), "perplexity logits");
        c.batch = nstf_alloc((size_t)p->n_batch * (size_t)c.n_vocab * sizeof(float), "perplexity batch");
        c.window = nstf_alloc((size_t)c.n_ctx * sizeof(int32_t), "perplexity window");
        c.q = nstf_alloc((size_t)(n_score > 0 ? n_score : 1) * (size_t)c.nv * 2, "log-probabilities");
        if (c.in.f) c.kld = nstf_alloc((size_t)c.n_chunk * (size_t)(n_score > 0 ? n_score : 1) * sizeof(float), "KL values");
        if (!c.logits || !c.batch || !c.window || !c.q || (c.in.f && !c.kld)) st = NSTF_ERR_OOM;
    }
    r->n_chunk = c.n_chunk;
    r->n_ctx = c.n_ctx;
    const double t0 = nstf_time_ms();
    for (int i = 0; st == NSTF_OK && i < c.n_chunk; i++) {
        st = eval_window(&c, i);
        if (st == NSTF_OK) st = score_window(&c, i);
        r->count += n_score;
        if (st == NSTF_OK && p->progress)
            p->progress(p->user, i + 1, c.n_chunk, running_ppl(&c), (nstf_time_ms() - t0) / 1000.0);
    }
    if (st == NSTF_OK && c.in.f) {
        kl_summary(&c);
    } else if (st == NSTF_OK) {
        double mean, unc;
        mean_unc(c.nll, c.nll2, r->count, &mean, &unc);
        r->ppl = exp(mean);
        r->ppl_unc = r->ppl * unc;
    }
    r->seconds = (nstf_time_ms() - t0) / 1000.0;
    if (c.out.f && fclose(c.out.f) != 0 && st == NSTF_OK)
        st = nstf_set_error(NSTF_ERR_IO, "%s: cannot finish writing", p->save_logits);
    if (c.in.f) fclose(c.in.f);
    nstf_free(c.logits);
    nstf_free(c.batch);
    nstf_free(c.window);
    nstf_free(c.q);
    nstf_free(c.kld);
    nstf_free(base_tokens);
    return st;
}
