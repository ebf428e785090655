/* test_session_api.c — the public entry points for bindings (nstf.h:
 * nstf_session_info, _tokenize, _detokenize, _eval) on the real model.
 *
 *   1. info: the facts agree with the tools interface (n_vocab, n_ctx,
 *      layers) and the model's BOS/EOS.
 *   2. tokenize: the ids equal the tokenizer's own encoding; a buffer one id
 *      short fails with NSTF_ERR_RANGE and the needed count; add_bos -1/0/1;
 *      invalid UTF-8 fails naming the offset; a NULL buffer with cap 0 asks
 *      for the count.
 *   3. detokenize: round trip of the text; a short buffer fails with the
 *      length; an id out of range fails.
 *   4. eval: all-logits rows equal nstf_session_eval_all bitwise (same
 *      forward), the last-only call equals the last row bitwise, and a
 *      token out of range or n = 0 fails without running.
 * Exits 77 when models/SmolLM2-135M-Instruct.Q4_1.gguf has not been fetched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nstf.h"
#include "nstf_tools.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"

int main(void) {
    if (access(MODEL, R_OK) != 0) {
        printf("test_session_api: skipped (no %s)\n", MODEL);
        return 77;
    }
    nstf_session_params p = nstf_session_default_params();
    p.n_ctx = 64;
    p.n_threads = 2;
    p.device = "cpu";
    nstf_session *s = NULL;
    if (nstf_session_open(MODEL, &p, &s) != NSTF_OK) {
        fprintf(stderr, "open: %s\n", nstf_last_error());
        return 1;
    }

    /* 1. info */
    nstf_model_info mi;
    CHECK(nstf_session_info(s, &mi) == NSTF_OK, "%s", nstf_last_error());
    CHECK(mi.n_vocab == nstf_session_n_vocab(s) && mi.n_vocab == 49152, "n_vocab %d", mi.n_vocab);
    CHECK(mi.n_ctx == 64 && mi.n_layers == nstf_session_n_layers(s), "n_ctx %d layers %d", mi.n_ctx, mi.n_layers);
    CHECK(mi.dim == 576 && mi.n_heads == 9 && mi.n_kv_heads == 3 && mi.head_dim == 64 && mi.ffn_dim == 1536,
          "shape %d %d %d %d %d", mi.dim, mi.n_heads, mi.n_kv_heads, mi.head_dim, mi.ffn_dim);
    CHECK(mi.backend && strcmp(mi.backend, "CPU") == 0 && mi.device && *mi.device, "backend %s", mi.backend);
    CHECK(mi.eos >= 0 && mi.eos < mi.n_vocab, "eos %d", mi.eos);
    CHECK(nstf_session_info(s, NULL) == NSTF_ERR_INVALID_ARG, "NULL output accepted");
    /* the default batch on the CPU (512) held to the 64 positions */
    CHECK(mi.n_batch == 64, "n_batch %d at a context of 64", mi.n_batch);
    {
        nstf_session_params q = p;
        q.n_ctx = 1024;
        nstf_session *s2 = NULL;
        nstf_model_info m2;
        CHECK(nstf_session_open(MODEL, &q, &s2) == NSTF_OK && nstf_session_info(s2, &m2) == NSTF_OK &&
                  m2.n_batch == 512,
              "default batch on the CPU: %d (%s)", s2 ? m2.n_batch : -1, nstf_last_error());
        nstf_session_close(s2);
        q.n_batch = 100;
        s2 = NULL;
        CHECK(nstf_session_open(MODEL, &q, &s2) == NSTF_OK && nstf_session_info(s2, &m2) == NSTF_OK &&
                  m2.n_batch == 100,
              "batch 100 given: %d", s2 ? m2.n_batch : -1);
        nstf_session_close(s2);
        q.n_batch = -1;
        s2 = NULL;
        CHECK(nstf_session_open(MODEL, &q, &s2) == NSTF_ERR_INVALID_ARG && !s2, "batch -1 accepted");
    }

    /* 2. tokenize */
    const char *text = "The capital of France is Paris.";
    int64_t n = -1;
    CHECK(nstf_session_tokenize(s, text, strlen(text), 0, false, NULL, 0, &n) == NSTF_ERR_RANGE && n > 0,
          "count query: n %lld", (long long)n);
    int32_t ids[64], ids2[64];
    int64_t n2 = 0;
    CHECK(nstf_session_tokenize(s, text, strlen(text), 0, false, ids, n - 1, &n2) == NSTF_ERR_RANGE && n2 == n,
          "short buffer: %lld", (long long)n2);
    CHECK(strstr(nstf_last_error(), "buffer holds") != NULL, "message: %s", nstf_last_error());
    CHECK(nstf_session_tokenize(s, text, strlen(text), 0, false, ids, 64, &n2) == NSTF_OK && n2 == n, "%s",
          nstf_last_error());
    int64_t nb = 0;
    CHECK(nstf_session_tokenize(s, text, strlen(text), 1, false, ids2, 64, &nb) == NSTF_OK, "%s", nstf_last_error());
    if (mi.bos >= 0) {
        CHECK(nb == n + 1 && ids2[0] == mi.bos && memcmp(ids2 + 1, ids, (size_t)n * 4) == 0, "add_bos 1: %lld ids",
              (long long)nb);
    }
    CHECK(nstf_session_tokenize(s, text, strlen(text), -1, false, ids2, 64, &nb) == NSTF_OK &&
              nb == n + (mi.add_bos && mi.bos >= 0),
          "add_bos -1: %lld", (long long)nb);
    const char *special = "<|im_start|>user";
    CHECK(nstf_session_tokenize(s, special, strlen(special), 0, true, ids2, 64, &nb) == NSTF_OK && nb == 2,
          "special parsed: %lld ids", (long long)nb);
    int64_t nplain = 0;
    CHECK(nstf_session_tokenize(s, special, strlen(special), 0, false, ids2, 64, &nplain) == NSTF_OK && nplain > 2,
          "special not parsed: %lld ids", (long long)nplain);
    const char bad[] = {'a', 'b', (char)0xff, 'c', 0};
    CHECK(nstf_session_tokenize(s, bad, 4, 0, false, ids2, 64, &nb) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "2") != NULL,
          "invalid UTF-8: %s", nstf_last_error());
    CHECK(nstf_session_tokenize(s, text, strlen(text), 2, false, ids2, 64, &nb) == NSTF_ERR_INVALID_ARG, "add_bos 2");

    /* 3. detokenize */
    char buf[256];
    size_t len = 0;
    CHECK(nstf_session_detokenize(s, ids, n, buf, sizeof buf, &len) == NSTF_OK && len == strlen(text) &&
              memcmp(buf, text, len) == 0,
          "round trip: '%.*s'", (int)len, buf);
    CHECK(nstf_session_detokenize(s, ids, n, buf, 4, &len) == NSTF_ERR_RANGE && len == strlen(text), "short: %zu",
          len);
    int32_t oor[2] = {ids[0], mi.n_vocab};
    CHECK(nstf_session_detokenize(s, oor, 2, buf, sizeof buf, &len) == NSTF_ERR_RANGE, "id out of range accepted");

    /* 4. eval */
    const int64_t V = mi.n_vocab;
    float *all = malloc((size_t)(n * V) * sizeof(float)), *ref = malloc((size_t)(n * V) * sizeof(float));
    float *last = malloc((size_t)V * sizeof(float));
    CHECK(nstf_session_eval(s, ids, n, true, all) == NSTF_OK, "%s", nstf_last_error());
    CHECK(nstf_session_eval_all(s, ids, (int)n, ref) == NSTF_OK, "%s", nstf_last_error());
    CHECK(memcmp(all, ref, (size_t)(n * V) * sizeof(float)) == 0, "all logits differ from eval_all");
    CHECK(nstf_session_eval(s, ids, n, false, last) == NSTF_OK, "%s", nstf_last_error());
    CHECK(memcmp(last, all + (n - 1) * V, (size_t)V * sizeof(float)) == 0, "last logits differ");
    CHECK(nstf_session_eval(s, oor, 2, false, last) == NSTF_ERR_RANGE, "token out of range accepted");
    CHECK(nstf_session_eval(s, ids, 0, false, last) == NSTF_ERR_RANGE, "n = 0 accepted");
    int32_t many[65] = {0};
    CHECK(nstf_session_eval(s, many, 65, false, last) == NSTF_ERR_RANGE, "n > n_ctx accepted");
    free(all);
    free(ref);
    free(last);
    nstf_session_close(s);
    return test_finish("test_session_api");
}
