/* hf_ref.h — what the tests against HF transformers share: reading the
 * reference logits that scripts/ref/make_hf_tiny.py and make_arch_ref.py
 * write ("NSTFHF01" files), comparing a model's logits with them (NMSE per
 * prompt, top-1 at every position, mean KL), hex fields of the reference
 * text files, and a tokenizer built from an HF tokenizer folder. */
#ifndef NSTF_TEST_HF_REF_H
#define NSTF_TEST_HF_REF_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io/hf_model.h"
#include "io/tokenizer.h"
#include "model/session.h"
#include "test_util.h"

#define HF_REF_MAX_PROMPTS 8

typedef struct {
    int n_prompts, n_vocab;
    int n_tok[HF_REF_MAX_PROMPTS];
    int32_t *ids[HF_REF_MAX_PROMPTS];
    float *logits[HF_REF_MAX_PROMPTS];
} ref_logits;

/* path: an "NSTFHF01" file: int32 n_prompts, n_vocab; per prompt int32
 * n_tok, int32 ids[n_tok], float32 logits[n_tok][n_vocab]. */
static inline bool read_logits(const char *path, ref_logits *r) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char magic[8];
    bool ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, "NSTFHF01", 8) && fread(&r->n_prompts, 4, 1, f) == 1 &&
              fread(&r->n_vocab, 4, 1, f) == 1 && r->n_prompts > 0 && r->n_prompts <= HF_REF_MAX_PROMPTS &&
              r->n_vocab > 0;
    for (int i = 0; ok && i < r->n_prompts; i++) {
        ok = fread(&r->n_tok[i], 4, 1, f) == 1 && r->n_tok[i] > 0 && r->n_tok[i] < 4096;
        if (!ok) break;
        size_t n = (size_t)r->n_tok[i], nl = n * (size_t)r->n_vocab;
        r->ids[i] = malloc(n * 4);
        r->logits[i] = malloc(nl * 4);
        ok = fread(r->ids[i], 4, n, f) == n && fread(r->logits[i], 4, nl, f) == nl;
    }
    fclose(f);
    return ok;
}

static inline void free_logits(ref_logits *r) {
    for (int i = 0; i < HF_REF_MAX_PROMPTS; i++) {
        free(r->ids[i]);
        free(r->logits[i]);
    }
    memset(r, 0, sizeof *r);
}

static inline int argmax_row(const float *x, int n) {
    int b = 0;
    for (int j = 1; j < n; j++)
        if (x[j] > x[b]) b = j;
    return b;
}

/* KL(softmax(p) || softmax(q)) in nats */
static inline double kl_row(const float *p, const float *q, int n) {
    double mp = p[0], mq = q[0], sp = 0, sq = 0, kl = 0;
    for (int i = 1; i < n; i++) mp = p[i] > mp ? p[i] : mp, mq = q[i] > mq ? q[i] : mq;
    for (int i = 0; i < n; i++) sp += exp(p[i] - mp), sq += exp(q[i] - mq);
    for (int i = 0; i < n; i++) {
        double lp = p[i] - mp - log(sp), lq = q[i] - mq - log(sq);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

/* What one model gave against the reference. */
typedef struct {
    double worst_nmse, mean_kl;
    int agree, total;
    bool ran;
} logit_score;

/* How to open and run the model for check_logits. */
typedef struct {
    const char *device; /* "cpu" / "gpu" */
    bool precise;
    int n_batch;        /* 0: the default */
    int rope_mode;      /* the RoPE mode the model must run in (nstf_rope_mode), or -1 */
    void (*tamper)(nstf_session *s); /* called after the open (NULL: none) */
} logit_run;

/* The logits of every prompt from `model` against the reference. */
static inline logit_score score_logits(const ref_logits *r, const char *model, const char *label, const logit_run *how) {
    logit_score sc = {0, 0, 0, 0, false};
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = 512;
    p.device = how->device;
    p.precise = how->precise;
    if (how->n_batch) p.n_batch = how->n_batch;
    nstf_session *s;
    if (nstf_session_open(model, &p, &s) != NSTF_OK) {
        CHECK(0, "%s: open: %s", label, nstf_last_error());
        return sc;
    }
    if (how->rope_mode >= 0)
        CHECK((int)s->model->cfg.rope_mode == how->rope_mode, "%s: RoPE mode %d, want %d", label,
              (int)s->model->cfg.rope_mode, how->rope_mode);
    if (how->tamper) how->tamper(s);
    for (int i = 0; i < r->n_prompts; i++) {
        const int n = r->n_tok[i], v = r->n_vocab;
        float *out = malloc((size_t)n * v * 4);
        nstf_status st = nstf_session_eval_all(s, r->ids[i], n, out);
        CHECK(st == NSTF_OK, "%s: eval: %s", label, nstf_last_error());
        CHECK(count_nonfinite(out, (int64_t)n * v) == 0, "%s: non-finite logits", label);
        double e = nmse_f(out, r->logits[i], (int64_t)n * v);
        if (e > sc.worst_nmse || e != e) sc.worst_nmse = e;
        for (int t = 0; t < n; t++) {
            sc.agree += argmax_row(out + (size_t)t * v, v) == argmax_row(r->logits[i] + (size_t)t * v, v);
            sc.mean_kl += kl_row(r->logits[i] + (size_t)t * v, out + (size_t)t * v, v);
        }
        sc.total += n;
        free(out);
    }
    sc.mean_kl /= sc.total ? sc.total : 1;
    sc.ran = true;
    nstf_session_close(s);
    return sc;
}

/* score_logits, printed and checked: the worst prompt's NMSE <= max_nmse
 * and top-1 everywhere (max_kl 0: a CPU run), or the mean KL <= max_kl
 * (a GPU run; NMSE and top-1 reported). */
static inline logit_score check_logits(const ref_logits *r, const char *model, const char *label, const logit_run *how,
                                double max_nmse, double max_kl) {
    logit_score sc = score_logits(r, model, label, how);
    if (!sc.ran) return sc;
    printf("logits %-30s %-3s %-7s: NMSE worst prompt %.3g, mean KL %.3g nats, top-1 %d/%d", label, how->device,
           how->precise ? "precise" : "fast", sc.worst_nmse, sc.mean_kl, sc.agree, sc.total);
    if (max_kl > 0) printf(" (bound: KL %.0e)\n", max_kl);
    else printf(" (bounds: NMSE %.0e, top-1 all)\n", max_nmse);
    if (max_kl > 0) {
        CHECK(sc.mean_kl <= max_kl, "%s: mean KL %.3g > %.0e", label, sc.mean_kl, max_kl);
    } else {
        CHECK(sc.worst_nmse <= max_nmse, "%s: logit NMSE %.3g > %.0e", label, sc.worst_nmse, max_nmse);
        CHECK(sc.agree == sc.total, "%s: top-1 %d of %d", label, sc.agree, sc.total);
    }
    return sc;
}

/* Hex text of a reference line into out ("-" is empty); the length. */
static inline size_t unhex(const char *h, char *out) {
    size_t n = 0;
    if (!strcmp(h, "-")) {
        out[0] = 0;
        return 0;
    }
    for (; h[0] && h[1]; h += 2) {
        unsigned v;
        sscanf(h, "%2x", &v);
        out[n++] = (char)v;
    }
    out[n] = 0;
    return n;
}

/* Every "tok VARIANT HEX IDS..." and "chat VARIANT HEX" record of the
 * reference file `ref` against tokenizer t (and g's chat template, on
 * make_hf_tiny's CHAT); counts them into *n_tok, *n_chat. */
static inline void check_tok_records(const char *ref, const char *variant, const nstf_tokenizer *t, const nstf_gguf *g,
                                     const char *label, int *n_tok, int *n_chat) {
    static const nstf_chat_msg chat[] = {{"user", "What is 2 + 2?"}, {"assistant", "4"}, {"user", " Thanks! "}};
    FILE *f = fopen(ref, "r");
    CHECK(f != NULL, "no reference %s", ref);
    static char line[65536], text[32768], hex[32768];
    *n_tok = *n_chat = 0;
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char kind[8], var[24];
        int used = 0;
        if (sscanf(line, "%7s %23s %32767s%n", kind, var, hex, &used) != 3 || strcmp(var, variant) != 0) continue;
        size_t len = unhex(hex, text);
        if (!strcmp(kind, "tok")) {
            int32_t want[512];
            int nw = 0, k;
            for (const char *p = line + used; nw < 512 && sscanf(p, "%d%n", &want[nw], &k) == 1; p += k) nw++;
            int32_t *ids = NULL;
            int64_t n = 0;
            nstf_status st = nstf_tokenizer_encode(t, text, len, nstf_tokenizer_wants_bos(t), true, &ids, &n);
            CHECK(st == NSTF_OK && n == nw && (n == 0 || !memcmp(ids, want, (size_t)n * 4)),
                  "%s: \"%s\": %lld ids, %d expected (first %d / %d)", label, text, (long long)n, nw, n ? ids[0] : -1,
                  nw ? want[0] : -1);
            free(ids);
            (*n_tok)++;
        } else if (!strcmp(kind, "chat")) {
            char *out = NULL;
            nstf_status st = nstf_chat_render(g, chat, 3, true, &out);
            CHECK(st == NSTF_OK && !strcmp(out, text), "%s: chat renders\n%s\nexpected\n%s", label,
                  out ? out : nstf_last_error(), text);
            free(out);
            (*n_chat)++;
        }
    }
    if (f) fclose(f);
}

/* A tokenizer from an HF tokenizer folder (tokenizer.json and
 * tokenizer_config.json only); *g receives the key/value view it reads. */
static inline nstf_tokenizer *tokenizer_of_dir(const char *dir, nstf_gguf **g) {
    nstf_gguf_writer *w = NULL;
    void *img = NULL;
    uint64_t n = 0;
    nstf_tokenizer *t = NULL;
    *g = NULL;
    nstf_status s = nstf_gguf_writer_create(&w);
    if (s == NSTF_OK) s = nstf_hf_tokenizer_kvs(dir, NULL, 0, w);
    if (s == NSTF_OK) s = nstf_gguf_writer_write_memory(w, 0, &img, &n);
    if (s == NSTF_OK) s = nstf_gguf_open_view(img, n, dir, NULL, 0, NULL, NULL, g);
    if (s == NSTF_OK) s = nstf_tokenizer_from_gguf(*g, &t);
    CHECK(s == NSTF_OK, "%s: %s", dir, nstf_last_error());
    nstf_gguf_writer_free(w);
    return t;
}

#endif
