/* llama_cpp_logits.c — llama.cpp's CPU logits on an end-to-end reference
 * text, summarised against the fp32 reference, for the default-path
 * accuracy comparison (tests/test_accuracy.c, docs/PERFORMANCE.md).
 *
 * Reads the token ids of a tests/data/smollm2_logits_ref*.bin, runs them
 * teacher-forced through llama.cpp (its default CPU context: flash attention
 * auto, f16 KV cache, the given thread count), and writes one text line per
 * position and per stored reference row:
 *   pos T ARGMAX LOGIT_AT_REF_TOP1 LOGIT_AT_OWN_ARGMAX LSE
 *   row T KL                      KL(ref || llama.cpp) of a stored row, nats
 * and, for each greedy case of GREEDY_REF.txt (tests/data/smollm2_greedy_ref.txt
 * with the prose text's file, an empty file with the others), the 64
 * greedy tokens llama.cpp generates after its prompt ids:
 *   greedy NAME ID ID ...
 * Built against a llama.cpp tree by scripts/ref/llama_cpp_accuracy.sh.
 *
 * usage: llama_cpp_logits MODEL REF.bin GREEDY_REF.txt THREADS > OUT.txt */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static double lse(const float *a, int n) {
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; i++) if (a[i] > m) m = a[i];
    for (int i = 0; i < n; i++) s += exp((double)a[i] - m);
    return m + log(s);
}

static int argmax(const float *a, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (a[i] > a[b]) b = i;
    return b;
}

static struct llama_context *new_ctx(struct llama_model *m, int n_threads) {
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = 512;
    cp.n_ubatch = 512;
    cp.n_threads = n_threads;
    cp.n_threads_batch = n_threads;
    return llama_init_from_model(m, cp);
}

/* Decode n tokens at pos0.., logits of every one (all) or of the last. */
static int decode(struct llama_context *ctx, const int32_t *ids, int n, int pos0, int all) {
    struct llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        b.token[i] = ids[i];
        b.pos[i] = pos0 + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all || i == n - 1;
    }
    b.n_tokens = n;
    int rc = llama_decode(ctx, b);
    llama_batch_free(b);
    return rc;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: llama_cpp_logits MODEL REF.bin GREEDY_REF.txt THREADS > OUT.txt\n");
        return 2;
    }
    const int n_threads = atoi(argv[4]);
    FILE *f = fopen(argv[2], "rb");
    char magic[8];
    int32_t n_tok, n_vocab, n_full;
    if (!f || fread(magic, 1, 8, f) != 8 || memcmp(magic, "NSTFREF1", 8) || fread(&n_tok, 4, 1, f) != 1 ||
        fread(&n_vocab, 4, 1, f) != 1 || fread(&n_full, 4, 1, f) != 1) {
        fprintf(stderr, "llama_cpp_logits: cannot read %s\n", argv[2]);
        return 1;
    }
    int32_t *ids = malloc(4 * (size_t)n_tok), *ref_arg = malloc(4 * (size_t)n_tok), *full_pos = malloc(4 * (size_t)n_full);
    float *skip = malloc(4 * (size_t)n_tok), *ref_rows = malloc(4 * (size_t)n_full * (size_t)n_vocab);
    int ok = fread(ids, 4, (size_t)n_tok, f) == (size_t)n_tok && fread(ref_arg, 4, (size_t)n_tok, f) == (size_t)n_tok &&
             fread(skip, 4, (size_t)n_tok, f) == (size_t)n_tok && fread(skip, 4, (size_t)n_tok, f) == (size_t)n_tok &&
             fread(full_pos, 4, (size_t)n_full, f) == (size_t)n_full &&
             fread(ref_rows, 4, (size_t)n_full * n_vocab, f) == (size_t)n_full * n_vocab;
    fclose(f);
    if (!ok) {
        fprintf(stderr, "llama_cpp_logits: %s is truncated\n", argv[2]);
        return 1;
    }

    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) return 1;
    if (llama_vocab_n_tokens(llama_model_get_vocab(model)) != n_vocab) {
        fprintf(stderr, "llama_cpp_logits: vocabulary size differs from the reference's\n");
        return 1;
    }
    struct llama_context *ctx = new_ctx(model, n_threads);
    if (!ctx || decode(ctx, ids, n_tok, 0, 1) != 0) {
        fprintf(stderr, "llama_cpp_logits: decode failed\n");
        return 1;
    }
    const char *base = strrchr(argv[2], '/');
    printf("# llama.cpp CPU logits on tests/data/%s's text, %d threads\n", base ? base + 1 : argv[2], n_threads);
    int k = 0;
    for (int t = 0; t < n_tok; t++) {
        const float *row = llama_get_logits_ith(ctx, t);
        const int a = argmax(row, n_vocab);
        printf("pos %d %d %.9g %.9g %.9g\n", t, a, row[ref_arg[t]], row[a], lse(row, n_vocab));
        if (k < n_full && full_pos[k] == t) {
            const float *p = ref_rows + (size_t)k * n_vocab;
            const double lp = lse(p, n_vocab), lq = lse(row, n_vocab);
            double kl = 0;
            for (int j = 0; j < n_vocab; j++) kl += exp(p[j] - lp) * ((p[j] - lp) - (row[j] - lq));
            printf("row %d %.9g\n", t, kl);
            k++;
        }
    }
    llama_free(ctx);

    /* greedy continuations of the reference's prompts */
    FILE *g = fopen(argv[3], "r");
    char line[65536], name[64] = "";
    while (g && fgets(line, sizeof line, g)) {
        if (!strncmp(line, "case ", 5)) sscanf(line + 5, "%63s", name);
        if (strncmp(line, "prompt ", 7)) continue;
        int32_t prompt[4096];
        int n = 0;
        for (char *p = strtok(line + 7, " \n"); p && n < 4096; p = strtok(NULL, " \n")) prompt[n++] = atoi(p);
        ctx = new_ctx(model, n_threads);
        if (!ctx || decode(ctx, prompt, n, 0, 0) != 0) return 1;
        printf("greedy %s", name);
        for (int i = 0; i < 64; i++) {
            int32_t tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
            printf(" %d", tok);
            if (decode(ctx, &tok, 1, n + i, 0) != 0) return 1;
        }
        printf("\n");
        llama_free(ctx);
    }
    if (g) fclose(g);
    llama_model_free(model);
    llama_backend_free();
    free(ids), free(ref_arg), free(full_pos), free(skip), free(ref_rows);
    return 0;
}
