/* test_imatrix.c — `nstf imatrix` and `nstf quantize --imatrix` end to end
 * on a tiny random model from `nstf gen-model` (2 layers, F16) and a
 * generated text, through the CLI:
 *  - the file is llama.cpp's GGUF imatrix layout: general.type "imatrix",
 *    imatrix.chunk_count 3 and chunk_size 32 (96 tokens), NAME.in_sum2
 *    [n_in, 1] and NAME.counts [1, 1] for the 14 layer matrices and the
 *    output (token_embd.weight: the model ties it), every count 96;
 *  - layer 0's attention input is computed here from the file alone: the
 *    sum over the tokens of (rmsnorm(embedding) * attn_norm)^2 per column
 *    equals blk.0.attn_q's in_sum2 to a relative 1e-5 (fp32 rmsnorm against
 *    double here); attn_k and attn_v hold the same sums, ffn_gate and
 *    ffn_up equal sums too;
 *  - nstf quantize Q4_K_M with --imatrix: the layer matrices change against
 *    the file without it (the Q8_0 tensors do not: ggml's Q8_0 takes no
 *    weights), and the loaded weights are in_sum2 / count;
 *  - bad input: an imatrix entry of another width, a file that is not an
 *    imatrix, no output: one-line errors. */
#include <math.h>
#include <unistd.h>

#include "cli_run.h"
#include "core/mem.h"
#include "io/gguf.h"
#include "nstf_tools.h"
#include "opt/imatrix.h"
#include "opt_test.h"

static const float *tensor_f32(const nstf_gguf *g, const char *name, int64_t *n) {
    const nstf_gguf_tensor *t = nstf_gguf_find_tensor(g, name);
    *n = t ? (int64_t)t->n_elems : 0;
    return t && t->type == NSTF_TYPE_F32 ? t->data : NULL;
}

/* The token ids of text under model (as nstf imatrix tokenizes it). */
static int32_t *tokens(const char *model, const char *text, int64_t *n) {
    nstf_session_params sp = nstf_session_default_params();
    sp.device = "cpu";
    nstf_session *s;
    int32_t *ids = NULL;
    *n = 0;
    if (nstf_session_open(model, &sp, &s) != NSTF_OK) return NULL;
    if (nstf_session_tokenize_alloc(s, text, strlen(text), false, &ids, n) != NSTF_OK) ids = NULL;
    nstf_session_close(s);
    return ids;
}

/* Layer 0's attention input sums, from the model file: embeddings rows,
 * rmsnorm (eps from the file), times attn_norm, squared, summed. */
static void check_layer0(const char *model, const nstf_gguf *im, const int32_t *ids, int n_tok) {
    nstf_gguf *g;
    CHECK(nstf_gguf_open(model, &g) == NSTF_OK, "open %s", model);
    if (!g) return;
    const nstf_gguf_tensor *te = nstf_gguf_find_tensor(g, "token_embd.weight");
    int64_t n_norm = 0, n_sum = 0;
    const float *norm = tensor_f32(g, "blk.0.attn_norm.weight", &n_norm),
                *sum = tensor_f32(im, "blk.0.attn_q.weight.in_sum2", &n_sum);
    const float eps = nstf_gguf_get_f32_or(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    CHECK(te && norm && sum && n_sum == te->ne[0] && n_norm == te->ne[0], "layer 0 tensors");
    if (!te || !norm || !sum || n_sum != te->ne[0]) {
        nstf_gguf_close(g);
        return;
    }
    const int64_t d = te->ne[0];
    uint64_t rb = 0;
    nstf_type_row_bytes(te->type, d, &rb);
    float *row = malloc((size_t)d * 4);
    double *want = calloc((size_t)d, sizeof *want);
    for (int t = 0; t < n_tok; t++) {
        nstf_dequantize_row(te->type, (const uint8_t *)te->data + (uint64_t)ids[t] * rb, row, d);
        double ss = 0;
        for (int64_t j = 0; j < d; j++) ss += (double)row[j] * row[j];
        const double r = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++) {
            const double y = row[j] * r * norm[j];
            want[j] += y * y;
        }
    }
    double worst = 0;
    for (int64_t j = 0; j < d; j++) {
        const double e = fabs(sum[j] - want[j]) / (want[j] > 1e-30 ? want[j] : 1e-30);
        worst = e > worst ? e : worst;
    }
    CHECK(worst <= 1e-5, "blk.0.attn_q.in_sum2 against the embeddings: worst relative error %.3g (<= 1e-5)", worst);
    printf("layer 0 input sums: worst relative error %.3g over %lld columns\n", worst, (long long)d);
    free(row);
    free(want);
    nstf_gguf_close(g);
}

static bool same_f32(const nstf_gguf *g, const char *a, const char *b) {
    int64_t na = 0, nb = 0;
    const float *x = tensor_f32(g, a, &na), *y = tensor_f32(g, b, &nb);
    return x && y && na == nb && !memcmp(x, y, (size_t)na * 4);
}

/* Whether tensor name's bytes differ between two files. */
static bool differs(const char *f1, const char *f2, const char *name) {
    nstf_gguf *a = NULL, *b = NULL;
    bool d = false;
    if (nstf_gguf_open(f1, &a) == NSTF_OK && nstf_gguf_open(f2, &b) == NSTF_OK) {
        const nstf_gguf_tensor *x = nstf_gguf_find_tensor(a, name), *y = nstf_gguf_find_tensor(b, name);
        d = x && y && (x->n_bytes != y->n_bytes || memcmp(x->data, y->data, (size_t)x->n_bytes));
    }
    nstf_gguf_close(a);
    nstf_gguf_close(b);
    return d;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_imatrix_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char model[300], textf[300], im[300], imw[300], q0[300], q1[300], cmd[400];
    snprintf(model, sizeof model, "%s/tiny.gguf", g_dir);
    snprintf(textf, sizeof textf, "%s/text.txt", g_dir);
    snprintf(im, sizeof im, "%s/im.gguf", g_dir);
    snprintf(imw, sizeof imw, "%s/imw.gguf", g_dir);
    snprintf(q0, sizeof q0, "%s/q0.gguf", g_dir);
    snprintf(q1, sizeof q1, "%s/q1.gguf", g_dir);
    static char text[8192];
    static const char *const words[] = {"which", "columns", "matter", "most", "to", "the", "model", "is",
                                        "what", "the", "activations", "say", "about", "each", "weight", "row"};
    opt_test_inputs(text, sizeof text, 11, words, 16, textf, model, "5");
    int rc = run((const char *const[]){"imatrix", "-m", model, "-f", textf, "-o", im, "-c", "32", "--chunks", "3",
                                        "-t", "2", NULL});
    CHECK(rc == 0, "imatrix: exit %d: %s", rc, g_err);
    nstf_gguf *g = NULL;
    CHECK(nstf_gguf_open(im, &g) == NSTF_OK, "open the imatrix: %s", nstf_last_error());
    if (g) {
        nstf_gguf_str gt = {0};
        CHECK(nstf_gguf_get_str(g, "general.type", &gt) == NSTF_OK && gt.len == 7 && !memcmp(gt.ptr, "imatrix", 7),
              "general.type imatrix");
        CHECK(nstf_gguf_get_u32_or(g, "imatrix.chunk_count", 0) == 3 && nstf_gguf_get_u32_or(g, "imatrix.chunk_size", 0) == 32,
              "chunk count 3, size 32");
        CHECK(g->n_tensors == 30, "15 matrices, 2 tensors each: %llu tensors", (unsigned long long)g->n_tensors);
        int n_counts = 0;
        for (uint64_t i = 0; i < g->n_tensors; i++) {
            const nstf_gguf_tensor *t = &g->tensors[i];
            if (t->name.len > 7 && !memcmp(t->name.ptr + t->name.len - 7, ".counts", 7)) {
                n_counts++;
                CHECK(t->type == NSTF_TYPE_F32 && t->n_elems == 1 && ((const float *)t->data)[0] == 96.0f,
                      "%.*s = 96 tokens", (int)t->name.len, t->name.ptr);
            } else {
                CHECK(t->type == NSTF_TYPE_F32 && t->n_dims == 2 && t->ne[1] == 1, "%.*s: F32 [n_in, 1]",
                      (int)t->name.len, t->name.ptr);
            }
        }
        CHECK(n_counts == 15, "15 counts (%d)", n_counts);
        CHECK(nstf_gguf_find_tensor(g, "token_embd.weight.in_sum2") != NULL, "the tied output's entry");
        CHECK(same_f32(g, "blk.1.attn_q.weight.in_sum2", "blk.1.attn_k.weight.in_sum2") &&
                  same_f32(g, "blk.1.attn_q.weight.in_sum2", "blk.1.attn_v.weight.in_sum2") &&
                  same_f32(g, "blk.0.ffn_gate.weight.in_sum2", "blk.0.ffn_up.weight.in_sum2"),
              "the matrices of one input share its sums");
        int64_t n = 0;
        int32_t *ids = tokens(model, text, &n);
        CHECK(ids && n >= 96, "tokens: %lld", (long long)n);
        if (ids && n >= 96) check_layer0(model, g, ids, 96);
        free(ids);
        nstf_gguf_close(g);
    }
    nstf_imatrix *loaded = NULL;
    CHECK(nstf_imatrix_load(im, &loaded) == NSTF_OK, "load: %s", nstf_last_error());
    if (loaded) {
        nstf_status st;
        const float *w = nstf_imatrix_weights(loaded, "blk.1.ffn_down.weight", loaded->e[13].n_in, &st);
        CHECK(w && st == NSTF_OK && fabsf(w[3] - (float)(loaded->e[13].sum2[3] / 96.0)) <= 1e-6f * w[3],
              "weights = in_sum2 / count");
        (void)nstf_imatrix_weights(loaded, "blk.1.ffn_down.weight", 7, &st);
        CHECK(st != NSTF_OK, "a length mismatch is an error");
        nstf_imatrix_free(loaded);
    }

    /* quantize with and without */
    rc = run((const char *const[]){"quantize", model, q0, "Q4_K_M", "-t", "2", NULL});
    CHECK(rc == 0, "quantize: %s", g_err);
    rc = run((const char *const[]){"quantize", model, q1, "Q4_K_M", "--imatrix", im, "-t", "2", NULL});
    CHECK(rc == 0, "quantize --imatrix: %s", g_err);
    CHECK(differs(q0, q1, "blk.0.attn_q.weight") && differs(q0, q1, "blk.0.ffn_down.weight"),
          "the importance weights change the layer matrices");
    CHECK(!differs(q0, q1, "token_embd.weight") && !differs(q0, q1, "blk.1.ffn_down.weight"),
          "Q8_0 (the embeddings, layer 1 ffn_down by the Q4_K_M rule and its fallback) takes no weights");

    /* bad input: an entry of another width */
    {
        double sums[7] = {1, 2, 3, 4, 5, 6, 7};
        nstf_imatrix_entry e = {.n_in = 7, .sum2 = sums, .count = 1};
        snprintf(e.name, sizeof e.name, "blk.0.attn_q.weight");
        nstf_imatrix bad = {.e = &e, .n = 1, .chunk_count = 1, .chunk_size = 1};
        CHECK(nstf_imatrix_write(&bad, imw) == NSTF_OK, "write: %s", nstf_last_error());
    }
    expect_error("imatrix of another shape", "columns",
                 (const char *const[]){"quantize", model, q1, "Q4_0", "--imatrix", imw, NULL});
    expect_error("not an imatrix", "not an importance matrix",
                 (const char *const[]){"quantize", model, q1, "Q4_0", "--imatrix", model, NULL});
    expect_error("no output", "-o FILE", (const char *const[]){"imatrix", "-m", model, "-f", textf, NULL});
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (getenv("KEEP") == NULL && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_imatrix");
}
