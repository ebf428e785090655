/* bench_sparse_attn.c — sparse decode attention (ATTN_SPARSE) against
 * dense on a real model: passkey retrieval and the perplexity of a long
 * text, both through one-token decode steps (prefill is dense in either
 * mode, so only what decode attends to differs). A benchmark, not a test:
 * minutes at long contexts on a CPU.
 *
 *   bench_sparse_attn -m MODEL [-c CTX] [--trials N] [--topk K] [--window W]
 *                     [--block B] [-t THREADS] [--text FILE]... [--ppl-tokens N]
 *
 * Every layer is sparse. "Dense" is the same session with top-k covering
 * every block (1024 blocks of B >= 4 positions: any context up to 4096 B),
 * which the op computes as the dense attention, bit for bit on the CPU
 * (test_attn_sparse), so the prompt's prefill is shared by both modes.
 *
 * Passkey: a 5-digit key (seeded per trial) in filler text at depth
 * (trial + 0.5) / trials of a prompt of about CTX - 64 tokens; the prompt
 * without its final question is prefilled; the question ("What is the pass
 * key? The pass key is") is fed one token per decode step, then 8 greedy
 * tokens; a trial passes when they contain the key.
 * Perplexity: the --text files' tokens (concatenated); the first CTX -
 * N tokens prefilled, the next N each a decode step whose logits score
 * the token after it; per mode the perplexity over those N, and how often
 * the two modes' top-1 tokens agree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nstf.h"
#include "nstf_tools.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int die(const char *what) {
    fprintf(stderr, "bench_sparse_attn: %s: %s\n", what, nstf_last_error());
    return 1;
}

static int32_t *tok(nstf_session *s, const char *text, bool bos, int64_t *n) {
    int64_t need = 0;
    (void)nstf_session_tokenize(s, text, strlen(text), bos ? 1 : 0, false, NULL, 0, &need);
    int32_t *ids = malloc((size_t)(need + 1) * sizeof *ids);
    if (!ids || nstf_session_tokenize(s, text, strlen(text), bos ? 1 : 0, false, ids, need, n) != NSTF_OK) {
        free(ids);
        return NULL;
    }
    return ids;
}

/* question fed one token per step from pos, then n_gen greedy tokens; their text into out */
static int answer(nstf_session *s, const int32_t *q, int64_t nq, int pos, int n_gen, char *out, size_t cap) {
    int32_t am = 0, gen[16];
    for (int64_t i = 0; i < nq; i++)
        if (nstf_session_forward(s, q + i, 1, pos + (int)i, false, NULL, &am) != NSTF_OK) return -1;
    for (int i = 0; i < n_gen; i++) {
        gen[i] = am;
        if (i + 1 < n_gen && nstf_session_forward(s, &gen[i], 1, pos + (int)nq + i, false, NULL, &am) != NSTF_OK)
            return -1;
    }
    size_t len = 0;
    if (nstf_session_detokenize(s, gen, n_gen, out, cap - 1, &len) != NSTF_OK) return -1;
    out[len] = 0;
    for (size_t i = 0; i < len; i++)
        if (out[i] == '\n') out[i] = ' ';
    return 0;
}

static int passkey(nstf_session *s, int ctx, int trials, int topk, int window) {
    static const char *header = "There is important information hidden inside a lot of irrelevant text. Find it and "
                                "memorize it. I will quiz you about it.\n";
    static const char *filler = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back "
                                "again. ";
    static const char *question = "\nWhat is the pass key? The pass key is";
    int64_t n_f = 0, n_q = 0;
    int32_t *fi = tok(s, filler, false, &n_f), *qi = tok(s, question, false, &n_q);
    if (!fi || !qi) return die("tokenize");
    const int reps = (int)((ctx - 64 - 40) / n_f);
    size_t cap = (size_t)reps * strlen(filler) + 1024;
    char *text = malloc(cap), got_s[256], got_d[256];
    int ok_s = 0, ok_d = 0;
    double t_pre = 0, t_s = 0, t_d = 0;
    printf("| trial | depth | key | prompt tokens | sparse answer | dense answer |\n|---|---|---|---|---|---|\n");
    for (int tr = 0; tr < trials; tr++) {
        uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(tr + 1);
        x ^= x >> 31;
        const int key = 10000 + (int)(x % 90000);
        const int at = (int)((tr + 0.5) / trials * reps);
        size_t len = (size_t)snprintf(text, cap, "%s", header);
        for (int r = 0; r < reps; r++) {
            if (r == at)
                len += (size_t)snprintf(text + len, cap - len, "The pass key is %d. Remember it. %d is the pass key. ",
                                        key, key);
            len += (size_t)snprintf(text + len, cap - len, "%s", filler);
        }
        int64_t n_p = 0;
        int32_t *pi = tok(s, text, true, &n_p);
        if (!pi || n_p + n_q + 8 > ctx) return die("prompt");
        double t0 = now_s();
        if (nstf_session_sparse_tune(s, topk, window) != NSTF_OK ||
            nstf_session_prefill(s, pi, (int)n_p, 0) != NSTF_OK)
            return die("prefill");
        double t1 = now_s();
        if (answer(s, qi, n_q, (int)n_p, 8, got_s, sizeof got_s)) return die("sparse answer");
        double t2 = now_s();
        if (nstf_session_sparse_tune(s, 1024, window) != NSTF_OK || answer(s, qi, n_q, (int)n_p, 8, got_d, sizeof got_d))
            return die("dense answer");
        double t3 = now_s();
        t_pre += t1 - t0, t_s += t2 - t1, t_d += t3 - t2;
        char ks[16];
        snprintf(ks, sizeof ks, "%d", key);
        const bool hs = strstr(got_s, ks) != NULL, hd = strstr(got_d, ks) != NULL;
        ok_s += hs, ok_d += hd;
        printf("| %d | %.2f | %d | %lld | %s`%s` | %s`%s` |\n", tr, (tr + 0.5) / trials, key, (long long)n_p,
               hs ? "ok " : "", got_s, hd ? "ok " : "", got_d);
        fflush(stdout);
        free(pi);
    }
    printf("\npasskey: sparse %d/%d, dense %d/%d; prefill %.1f s, sparse answers %.1f s, dense answers %.1f s "
           "(all trials)\n\n",
           ok_s, trials, ok_d, trials, t_pre, t_s, t_d);
    free(text), free(fi), free(qi);
    return 0;
}

static double nll(const float *lg, int nv, int32_t t, int32_t *top) {
    double m = -INFINITY, z = 0;
    int best = 0;
    for (int i = 0; i < nv; i++)
        if (lg[i] > m) m = lg[i], best = i;
    for (int i = 0; i < nv; i++) z += exp(lg[i] - m);
    *top = best;
    return log(z) + m - lg[t];
}

static int perplexity(nstf_session *s, const char *const *files, int n_files, int ctx, int n_eval, int topk, int window) {
    size_t cap = 1, len = 0;
    char *text = malloc(cap);
    for (int i = 0; i < n_files; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) {
            fprintf(stderr, "bench_sparse_attn: cannot open %s\n", files[i]);
            return 1;
        }
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        text = realloc(text, cap += (size_t)n);
        len += fread(text + len, 1, (size_t)n, f);
        fclose(f);
    }
    text[len] = 0;
    int64_t n_t = 0;
    int32_t *ids = tok(s, text, true, &n_t);
    if (!ids) return die("tokenize text");
    const int p0 = ctx - n_eval;
    if (n_t < ctx + 1 || p0 < 1) {
        fprintf(stderr, "bench_sparse_attn: the text has %lld tokens, %d needed\n", (long long)n_t, ctx + 1);
        return 1;
    }
    const int nv = nstf_session_n_vocab(s);
    float *lg = malloc((size_t)nv * 4);
    int32_t *top_s = malloc((size_t)n_eval * 4);
    double sum[2] = {0, 0}, secs[2] = {0, 0};
    int agree = 0;
    if (nstf_session_sparse_tune(s, topk, window) != NSTF_OK || nstf_session_prefill(s, ids, p0, 0) != NSTF_OK)
        return die("prefill");
    for (int mode = 0; mode < 2; mode++) {
        if (nstf_session_sparse_tune(s, mode ? 1024 : topk, window) != NSTF_OK) return die("tune");
        double t0 = now_s();
        for (int i = 0; i < n_eval; i++) {
            int32_t top = 0;
            if (nstf_session_forward(s, ids + p0 + i, 1, p0 + i, false, lg, NULL) != NSTF_OK) return die("step");
            sum[mode] += nll(lg, nv, ids[p0 + i + 1], &top);
            if (mode == 0) top_s[i] = top;
            else agree += top == top_s[i];
        }
        secs[mode] = now_s() - t0;
    }
    printf("perplexity over %d decode steps at positions %d..%d (text of %lld tokens): sparse %.4f, dense %.4f "
           "(%+.2f%%); top-1 agreement %.1f%%; %.1f s sparse, %.1f s dense\n",
           n_eval, p0, ctx - 1, (long long)n_t, exp(sum[0] / n_eval), exp(sum[1] / n_eval),
           100.0 * (exp(sum[0] / n_eval) / exp(sum[1] / n_eval) - 1.0), 100.0 * agree / n_eval, secs[0], secs[1]);
    free(lg), free(top_s), free(ids), free(text);
    return 0;
}

int main(int argc, char **argv) {
    const char *model = NULL, *files[16];
    int n_files = 0, ctx = 2048, trials = 20, topk = 16, window = 64, block = 16, threads = 0, n_eval = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "bench_sparse_attn: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-c")) ctx = atoi(v);
        else if (!strcmp(a, "--trials")) trials = atoi(v);
        else if (!strcmp(a, "--topk")) topk = atoi(v);
        else if (!strcmp(a, "--window")) window = atoi(v);
        else if (!strcmp(a, "--block")) block = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--ppl-tokens")) n_eval = atoi(v);
        else if (!strcmp(a, "--text") && n_files < 16) files[n_files++] = v;
        else {
            fprintf(stderr, "bench_sparse_attn: unknown option %s\n", a);
            return 2;
        }
    }
    if (!model) {
        fprintf(stderr, "usage: bench_sparse_attn -m MODEL [-c CTX] [--trials N] [--topk K] [--window W] [--block B] "
                        "[-t THREADS] [--text FILE]... [--ppl-tokens N]\n");
        return 2;
    }
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = ctx;
    p.n_threads = threads;
    p.sparse_attn = 1;
    p.sparse_topk = topk;
    p.sparse_window = window;
    p.sparse_block = block;
    nstf_session *s = NULL;
    if (nstf_session_open(model, &p, &s) != NSTF_OK) return die(model);
    printf("model %s, device %s, %d threads, context %d; sparse: every layer, top-k %d, blocks of %d, window %d\n\n",
           model, nstf_session_device(s), nstf_session_threads(s), ctx, topk, block, window);
    int rc = trials > 0 ? passkey(s, ctx, trials, topk, window) : 0;
    if (rc == 0 && n_files > 0) rc = perplexity(s, files, n_files, ctx, n_eval, topk, window);
    nstf_session_close(s);
    return rc;
}
