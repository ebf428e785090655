/* test_sparse_plan.c — a model file's sparse-attention plan is executed,
 * on a tiny random model (`nstf gen-model --shape tiny`) rewritten with
 * the plan's keys (nstf.plan.attn_sparse, one u8 per layer; sparse_topk,
 * sparse_block, sparse_window u32):
 *  - the session makes exactly the planned layers sparse with the plan's
 *    parameters; --dense-attn's setting (sparse_attn -1) ignores the plan,
 *    and explicit parameters override the plan's;
 *  - with top-k covering every block, 40 decode steps past 100 prompt
 *    positions give the dense session's logits bit for bit (CPU);
 *  - with top-k 1 and a window of 4 they differ (the sparse path ran) and
 *    stay finite;
 *  - a plan with the wrong number of flags fails the open, naming the key. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "io/gguf.h"
#include "nstf_tools.h"

/* src with the plan's keys (flags: n of them) added, as dst */
static bool write_planned(const char *src, const char *dst, const uint8_t *flags, int n, uint32_t topk, uint32_t block,
                          uint32_t window) {
    nstf_gguf *g = NULL;
    nstf_gguf_writer *w = NULL;
    nstf_status st = nstf_gguf_open(src, &g);
    if (st == NSTF_OK) st = nstf_gguf_writer_create(&w);
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_kv; i++) st = nstf_gguf_writer_copy_kv(w, &g->kv[i]);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_arr(w, "nstf.plan.attn_sparse", NSTF_GGUF_UINT8, flags, (uint64_t)n);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_topk", topk);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_block", block);
    if (st == NSTF_OK) st = nstf_gguf_writer_set_u32(w, "nstf.plan.sparse_window", window);
    for (uint64_t i = 0; st == NSTF_OK && i < g->n_tensors; i++) {
        const nstf_gguf_tensor *t = &g->tensors[i];
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        st = nstf_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data);
    }
    if (st == NSTF_OK) st = nstf_gguf_writer_write(w, dst, 0);
    CHECK(st == NSTF_OK, "writing %s: %s", dst, nstf_last_error());
    nstf_gguf_writer_free(w);
    nstf_gguf_close(g);
    return st == NSTF_OK;
}

static nstf_session *open_s(const char *path, int sparse_attn, int topk, int window) {
    nstf_session_params p = nstf_session_default_params();
    p.device = "cpu";
    p.n_ctx = 256;
    p.n_threads = 2;
    p.sparse_attn = sparse_attn;
    p.sparse_topk = topk;
    p.sparse_window = window;
    nstf_session *s = NULL;
    CHECK(nstf_session_open(path, &p, &s) == NSTF_OK, "open %s: %s", path, nstf_last_error());
    return s;
}

/* 100 prompt positions, then 40 one-token steps; all their logits */
static float *decode(nstf_session *s, const int32_t *ids, int nv) {
    float *all = malloc((size_t)40 * nv * 4);
    CHECK(nstf_session_forward(s, ids, 100, 0, false, all, NULL) == NSTF_OK, "prefill: %s", nstf_last_error());
    for (int i = 0; i < 40; i++)
        CHECK(nstf_session_forward(s, ids + 100 + i, 1, 100 + i, false, all + (int64_t)i * nv, NULL) == NSTF_OK,
              "step %d: %s", i, nstf_last_error());
    return all;
}

int main(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/nstf_test_plan_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_dir)) return test_finish("test_sparse_plan");
    char tiny[300], planned[300], dense_plan[300], bad[300];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", g_dir);
    snprintf(planned, sizeof planned, "%s/planned.gguf", g_dir);
    snprintf(dense_plan, sizeof dense_plan, "%s/all.gguf", g_dir);
    snprintf(bad, sizeof bad, "%s/bad.gguf", g_dir);
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f32", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: exit %d: %s", rc, g_err);
    nstf_session *d = rc == 0 ? open_s(tiny, 0, 0, 0) : NULL;
    if (!d) return test_finish("test_sparse_plan");
    const int L = nstf_session_n_layers(d), nv = nstf_session_n_vocab(d);
    uint8_t flags[256] = {0};
    int n_planned = 0;
    for (int l = 0; l < L && l < 256; l++) n_planned += flags[l] = (uint8_t)(l % 2 == 0);
    CHECK(nstf_session_sparse(d, NULL, NULL, NULL) == 0, "a file without a plan runs dense");

    bool ok = write_planned(tiny, planned, flags, L, 1, 4, 4) && write_planned(tiny, dense_plan, flags, L, 1024, 4, 4) &&
              write_planned(tiny, bad, flags, L + 1, 1, 4, 4);
    int32_t ids[140];
    test_rng r = {77};
    for (int i = 0; i < 140; i++) ids[i] = (int32_t)(rng_next(&r) % (uint64_t)nv);
    float *ref = decode(d, ids, nv);
    nstf_session_close(d);

    nstf_session *s = ok ? open_s(planned, 0, 0, 0) : NULL;
    int topk = 0, block = 0, window = 0;
    CHECK(s && nstf_session_sparse(s, &topk, &block, &window) == n_planned && topk == 1 && block == 4 && window == 4,
          "the plan: %d sparse layers (want %d), top-k %d, block %d, window %d", s ? nstf_session_sparse(s, 0, 0, 0) : -1,
          n_planned, topk, block, window);
    if (s) {
        float *got = decode(s, ids, nv);
        int64_t diff = 0, nonfin = count_nonfinite(got, (int64_t)40 * nv);
        for (int64_t i = 0; i < (int64_t)40 * nv; i++) diff += got[i] != ref[i];
        CHECK(diff > 0 && nonfin == 0, "top-k 1: %lld logits differ from dense (want some), %lld non-finite",
              (long long)diff, (long long)nonfin);
        free(got);
        nstf_session_close(s);
    }
    s = ok ? open_s(dense_plan, 0, 0, 0) : NULL;
    if (s) {
        float *got = decode(s, ids, nv);
        CHECK(memcmp(got, ref, (size_t)40 * nv * 4) == 0, "top-k covering every block: logits not the dense ones");
        free(got);
        nstf_session_close(s);
    }
    s = ok ? open_s(planned, -1, 0, 0) : NULL;
    CHECK(s && nstf_session_sparse(s, NULL, NULL, NULL) == 0, "sparse_attn -1 ignores the plan");
    nstf_session_close(s);
    s = ok ? open_s(planned, 0, 3, 8) : NULL;
    CHECK(s && nstf_session_sparse(s, &topk, &block, &window) == n_planned && topk == 3 && window == 8 && block == 4,
          "parameters override the plan's: top-k %d, window %d, block %d", topk, window, block);
    nstf_session_close(s);

    nstf_session_params p = nstf_session_default_params();
    p.device = "cpu";
    p.n_ctx = 256;
    nstf_session *b = NULL;
    CHECK(nstf_session_open(bad, &p, &b) != NSTF_OK && strstr(nstf_last_error(), "nstf.plan.attn_sparse"),
          "a plan of %d flags for %d layers: %s", L + 1, L, b ? "opened" : nstf_last_error());
    nstf_session_close(b);
    free(ref);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "test_sparse_plan: could not remove %s\n", g_dir);
    return test_finish("test_sparse_plan");
}
