/* test_split.c — a model split into stages over backends (the mechanism of
 * partial GPU offload, -ngl): the embedding and the first k layers on one
 * backend, the remaining layers and the output head on another, the
 * residual stream handed over through the host. Here both stages are CPU
 * backends, so the split must give bitwise the logits of the whole model on
 * one backend: teacher-forced prefill (every row) and 8 decode steps, for
 * k = 1, half and L-1, with 8-bit, 16-bit (the default) and fp32
 * activations. Also: stage
 * bounds that make no sense are refused. On a GPU machine test_e2e_gpu
 * compares a GPU/CPU split with the CPU and the GPU.
 * Uses the real SmolLM2 model (exit 77 when it has not been fetched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "model_test.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_PROMPT 11
#define N_DEC 8

/* Logits of a prefill (every row) then N_DEC decode steps on run r. */
static nstf_status logits_of(nstf_llama_run *r, const int32_t *ids, int nv, float *out) {
    NSTF_TRY(nstf_llama_forward_seq(r, ids, N_PROMPT, 0, true, out, NULL));
    for (int i = 0; i < N_DEC; i++)
        NSTF_TRY(nstf_llama_forward_seq(r, ids + N_PROMPT + i, 1, N_PROMPT + i, false,
                                        out + (size_t)(N_PROMPT + i) * nv, NULL));
    return NSTF_OK;
}

int main(void) {
    nstf_gguf *g;
    nstf_llama *m;
    const int lrc = test_model_load(MODEL, "test_split", &g, &m);
    if (lrc) return lrc == 77 ? 77 : test_finish("test_split");
    const int nv = m->cfg.n_vocab, L = m->cfg.n_layers;
    int32_t ids[N_PROMPT + N_DEC];
    test_rng r = {0x5b117u};
    for (int i = 0; i < N_PROMPT + N_DEC; i++) ids[i] = (int32_t)(rng_next(&r) % (uint64_t)nv);
    const size_t n = (size_t)(N_PROMPT + N_DEC) * nv;
    float *whole = malloc(n * sizeof(float)), *split = malloc(n * sizeof(float));
    static const int k_bits[3] = {8, 16, 32};
    for (int bi = 0; bi < 3; bi++) {
        const nstf_cpu_params cp = {2, false, false, k_bits[bi]};
        nstf_backend *a = NULL, *b = NULL;
        CHECK(nstf_backend_cpu_create(&cp, &a) == NSTF_OK && nstf_backend_cpu_create(&cp, &b) == NSTF_OK, "%s",
              nstf_last_error());
        nstf_llama_run *one = NULL;
        CHECK(nstf_llama_run_create(m, a, 32, 16, 1, &one) == NSTF_OK, "%s", nstf_last_error());
        if (!one) break;
        CHECK(logits_of(one, ids, nv, whole) == NSTF_OK, "%s", nstf_last_error());
        nstf_llama_run_free(one);
        const int ks[3] = {1, L / 2, L - 1};
        for (int i = 0; i < 3; i++) {
            nstf_llama_run *s1 = NULL, *s2 = NULL;
            CHECK(nstf_llama_run_create_stage(m, a, 32, 16, 1, 0, ks[i], true, false, &s1) == NSTF_OK, "%s",
                  nstf_last_error());
            CHECK(nstf_llama_run_create_stage(m, b, 32, 16, 1, ks[i], L, false, true, &s2) == NSTF_OK, "%s",
                  nstf_last_error());
            if (!s1 || !s2) break;
            s1->next = s2;
            memset(split, 0xff, n * sizeof(float));
            CHECK(logits_of(s1, ids, nv, split) == NSTF_OK, "%s", nstf_last_error());
            int64_t diff = 0;
            for (size_t j = 0; j < n; j++) diff += memcmp(&split[j], &whole[j], sizeof(float)) != 0;
            printf("%d-bit activations: layers 0-%d | %d-%d: %lld of %zu logits differ from the whole model (0 allowed)\n",
                   k_bits[bi], ks[i] - 1, ks[i], L - 1, (long long)diff, n);
            CHECK(diff == 0, "split at %d differs from the whole model", ks[i]);
            nstf_llama_run_free(s1);
            nstf_llama_run_free(s2);
        }
        nstf_llama_run *bad = NULL;
        CHECK(nstf_llama_run_create_stage(m, a, 32, 16, 1, 5, 3, true, false, &bad) == NSTF_ERR_INVALID_ARG && !bad,
              "a stage of layers 5..2 was accepted");
        CHECK(nstf_llama_run_create_stage(m, a, 32, 16, 1, 0, L + 1, true, true, &bad) == NSTF_ERR_INVALID_ARG && !bad,
              "a stage past the last layer was accepted");
        nstf_backend_free(a);
        nstf_backend_free(b);
    }
    free(whole);
    free(split);
    nstf_llama_free(m);
    return test_finish("test_split");
}
