/* test_batch.c — batches of several sequences through the one forward (the
 * interface the server and training need): a model placed with 3 sequence
 * slots prefills three different prompts into their slots in one batch,
 * then decodes one token of each sequence per forward; every row of logits
 * must be bitwise the logits of the same sequence run alone in a
 * one-sequence run (each sequence's attention reads only its own slot, and
 * a matmul's row does not depend on the rows beside it; the CPU backend
 * attends per run of one sequence). Also: a sequence slot out of range is
 * an error.
 * Uses the real SmolLM2 model (exit 77 when it has not been fetched). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "io/gguf.h"
#include "model/llama.h"
#include "test_util.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define N_SEQ 3
#define N_STEPS 4

static const int k_len[N_SEQ] = {5, 9, 3};

int main(void) {
    FILE *mf = fopen(MODEL, "rb");
    if (!mf) {
        printf("test_batch: model not fetched (make model); skipped\n");
        return 77;
    }
    fclose(mf);
    nstf_gguf *g;
    nstf_llama *m;
    if (nstf_gguf_open(MODEL, &g) != NSTF_OK || nstf_llama_load(g, &m) != NSTF_OK) {
        CHECK(0, "%s", nstf_last_error());
        return test_finish("test_batch");
    }
    const int nv = m->cfg.n_vocab;
    for (int precise = 0; precise < 2; precise++) {
        nstf_backend *be;
        const nstf_cpu_params cp = {2, precise != 0, false, 0};
        CHECK(nstf_backend_cpu_create(&cp, &be) == NSTF_OK, "%s", nstf_last_error());
        nstf_llama_run *multi = NULL, *single = NULL;
        CHECK(nstf_llama_run_create(m, be, 64, 32, N_SEQ, &multi) == NSTF_OK, "%s", nstf_last_error());
        CHECK(nstf_llama_run_create(m, be, 64, 32, 1, &single) == NSTF_OK, "%s", nstf_last_error());
        if (!multi || !single) break;
        int32_t prompt[N_SEQ][16], tok[N_SEQ][N_STEPS];
        test_rng r = {0xb47c4u + (uint64_t)precise};
        for (int s = 0; s < N_SEQ; s++) {
            for (int i = 0; i < k_len[s]; i++) prompt[s][i] = (int32_t)(rng_next(&r) % (uint64_t)nv);
            for (int i = 0; i < N_STEPS; i++) tok[s][i] = (int32_t)(rng_next(&r) % (uint64_t)nv);
        }
        /* alone: each sequence's prompt logits (all rows) and its decode steps */
        float *alone = malloc(sizeof(float) * (size_t)N_SEQ * (16 + N_STEPS) * nv);
        for (int s = 0; s < N_SEQ; s++) {
            float *o = alone + (size_t)s * (16 + N_STEPS) * nv;
            CHECK(nstf_llama_forward_seq(single, prompt[s], k_len[s], 0, true, o, NULL) == NSTF_OK, "%s",
                  nstf_last_error());
            for (int i = 0; i < N_STEPS; i++)
                CHECK(nstf_llama_forward_seq(single, &tok[s][i], 1, k_len[s] + i, false, o + (size_t)(16 + i) * nv,
                                             NULL) == NSTF_OK,
                      "%s", nstf_last_error());
        }
        /* together: the three prompts in one batch, then one token of each per forward */
        int32_t bt[32], bp[32], bs[32];
        int n = 0;
        for (int s = 0; s < N_SEQ; s++)
            for (int i = 0; i < k_len[s]; i++) bt[n] = prompt[s][i], bp[n] = i, bs[n] = s, n++;
        float *lg = malloc(sizeof(float) * (size_t)n * nv);
        nstf_batch b = {bt, bp, bs, n, true, false};
        CHECK(nstf_llama_forward(multi, &b, lg, NULL) == NSTF_OK, "%s", nstf_last_error());
        int64_t diff = 0;
        for (int s = 0, row = 0; s < N_SEQ; s++)
            for (int i = 0; i < k_len[s]; i++, row++)
                diff += memcmp(lg + (size_t)row * nv, alone + ((size_t)s * (16 + N_STEPS) + i) * nv, sizeof(float) * nv) != 0;
        printf("%s: prefill of %d prompts in one batch (%d tokens): %lld of %d rows differ from the prompts alone\n",
               precise ? "precise" : "default", N_SEQ, n, (long long)diff, n);
        CHECK(diff == 0, "batched prefill differs from the sequences alone");
        diff = 0;
        for (int i = 0; i < N_STEPS; i++) {
            for (int s = 0; s < N_SEQ; s++) bt[s] = tok[s][i], bp[s] = k_len[s] + i, bs[s] = s;
            nstf_batch d = {bt, bp, bs, N_SEQ, true, false};
            CHECK(nstf_llama_forward(multi, &d, lg, NULL) == NSTF_OK, "%s", nstf_last_error());
            for (int s = 0; s < N_SEQ; s++)
                diff += memcmp(lg + (size_t)s * nv, alone + ((size_t)s * (16 + N_STEPS) + 16 + i) * nv,
                               sizeof(float) * nv) != 0;
        }
        printf("%s: batched decode, %d sequences x %d steps: %lld of %d rows differ\n", precise ? "precise" : "default",
               N_SEQ, N_STEPS, (long long)diff, N_SEQ * N_STEPS);
        CHECK(diff == 0, "batched decode differs from the sequences alone");
        /* a slot that does not exist */
        bs[0] = N_SEQ;
        nstf_batch bad = {bt, bp, bs, 1, false, false};
        CHECK(nstf_llama_forward(multi, &bad, NULL, NULL) == NSTF_ERR_RANGE, "slot %d accepted", N_SEQ);
        free(lg);
        free(alone);
        nstf_llama_run_free(multi);
        nstf_llama_run_free(single);
        nstf_backend_free(be);
    }
    nstf_llama_free(m);
    return test_finish("test_batch");
}
