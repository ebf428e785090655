/* test_batch.c — batches of several sequences through the one forward (the
 * interface the server and training need): a model placed with 3 sequence
 * slots prefills three different prompts into their slots in one batch,
 * then decodes one token of each sequence per forward; every row of logits
 * must be bitwise the logits of the same sequence run alone in a
 * one-sequence run (each sequence's attention reads only its own slot, and
 * a matmul's row does not depend on the rows beside it; the CPU backend
 * attends per run of one sequence). Also: a sequence slot out of range is
 * an error.
 *
 * Then the server's continuous batch: a run with a paged KV cache (blocks
 * of 16 positions handed out from a shuffled pool) where one forward mixes
 * prefill chunks of some sequences with the decode of others and asks for
 * the logits of selected rows only (the last row of a chunk that ends a
 * prompt, every decode row): each row bitwise the sequence alone again,
 * and the greedy token of the last row equal to the argmax of its logits;
 * a step that asks for every row's greedy token (argmax_rows) with only
 * the first row's logits on the host: the tokens the argmax of each row,
 * the first row bitwise, nothing written past it.
 * A paged run without a block table, a block outside the pool and a row
 * outside the batch are errors.
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
#define N_SEQ 3
#define N_STEPS 4

static const int k_len[N_SEQ] = {5, 9, 3};

#define BLK 16
#define CTX 64
#define BPS (CTX / BLK)

/* One forward of the paged run; the rows' logits into lg. */
static int paged_step(nstf_llama_run *r, const int32_t *tbl, const int32_t *bt, const int32_t *bp, const int32_t *bs,
                      int n, const int32_t *rows, int n_rows, float *lg, int32_t *am) {
    const nstf_batch b = {.tokens = bt, .pos = bp, .seq = bs, .n = n, .argmax = am != NULL, .rows = rows,
                          .n_rows = n_rows, .blocks = tbl};
    nstf_status st = nstf_llama_forward(r, &b, lg, am);
    CHECK(st == NSTF_OK, "paged forward: %s", nstf_last_error());
    return st == NSTF_OK;
}

/* The rows of `lg` against the sequences alone: row i is sequence seqs[i]
 * at alone-index idx[i] (prompt position, or 16 + decode step). */
static int64_t paged_diff(const float *lg, const float *alone, const int *seqs, const int *idx, int n, int nv) {
    int64_t d = 0;
    for (int i = 0; i < n; i++)
        d += memcmp(lg + (size_t)i * nv, alone + ((size_t)seqs[i] * (16 + N_STEPS) + idx[i]) * nv,
                    sizeof(float) * nv) != 0;
    return d;
}

static void paged_mixed(const nstf_llama *m, nstf_backend *be, int32_t prompt[N_SEQ][16], int32_t tok[N_SEQ][N_STEPS],
                        const float *alone, const char *mode) {
    const int nv = m->cfg.n_vocab, pool = N_SEQ * BPS + 5;
    nstf_llama_run *r = NULL;
    CHECK(nstf_llama_run_create_paged(m, be, CTX, 32, N_SEQ, BLK, pool, &r) == NSTF_OK, "%s", nstf_last_error());
    if (!r) return;
    int32_t tbl[N_SEQ * BPS], perm[N_SEQ * BPS + 5];
    test_rng rg = {0x9a9e5u};
    for (int i = 0; i < pool; i++) perm[i] = i;
    for (int i = pool - 1; i > 0; i--) {
        int j = (int)(rng_next(&rg) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    memcpy(tbl, perm, sizeof tbl);
    float *lg = malloc(sizeof(float) * (size_t)N_SEQ * nv);
    int32_t bt[32], bp[32], bs[32], rows[N_SEQ], am = -1;
    int seqs[N_SEQ], idx[N_SEQ], n = 0, nr = 0;
    int64_t diff = 0, rows_seen = 0;
#define PUT(s, p, t) (bt[n] = (t), bp[n] = (p), bs[n] = (s), n++)
#define ROW(s, i) (rows[nr] = n - 1, seqs[nr] = (s), idx[nr] = (i), nr++)
    /* step 1: sequence 0's whole prompt, the first 4 tokens of sequence 1's */
    for (int i = 0; i < k_len[0]; i++) PUT(0, i, prompt[0][i]);
    ROW(0, k_len[0] - 1);
    for (int i = 0; i < 4; i++) PUT(1, i, prompt[1][i]);
    if (paged_step(r, tbl, bt, bp, bs, n, rows, nr, lg, &am)) diff += paged_diff(lg, alone, seqs, idx, nr, nv);
    rows_seen += nr;
    /* step 2: sequence 0 decodes, sequence 1's prompt ends, sequence 2's whole prompt */
    n = nr = 0;
    PUT(0, k_len[0], tok[0][0]);
    ROW(0, 16);
    for (int i = 4; i < k_len[1]; i++) PUT(1, i, prompt[1][i]);
    ROW(1, k_len[1] - 1);
    for (int i = 0; i < k_len[2]; i++) PUT(2, i, prompt[2][i]);
    ROW(2, k_len[2] - 1);
    if (paged_step(r, tbl, bt, bp, bs, n, rows, nr, lg, &am)) {
        diff += paged_diff(lg, alone, seqs, idx, nr, nv);
        int best = 0;
        for (int j = 1; j < nv; j++) best = lg[(size_t)(nr - 1) * nv + j] > lg[(size_t)(nr - 1) * nv + best] ? j : best;
        CHECK(am == best, "%s: the greedy token of the last row is %d, its logits' argmax %d", mode, am, best);
    }
    rows_seen += nr;
    /* steps 3..: every sequence decodes (sequence 0 one step ahead) */
    for (int step = 1; step < N_STEPS; step++) {
        n = nr = 0;
        for (int s = 0; s < N_SEQ; s++) {
            const int i = s == 0 ? step : step - 1;
            PUT(s, k_len[s] + i, tok[s][i]);
            ROW(s, 16 + i);
        }
        if (step < N_STEPS - 1) {
            if (paged_step(r, tbl, bt, bp, bs, n, rows, nr, lg, NULL)) diff += paged_diff(lg, alone, seqs, idx, nr, nv);
            rows_seen += nr;
            continue;
        }
        /* the last step as the server runs it: every row's greedy token from
         * the backend, the logits of the first row only on the host */
        int32_t ams[N_SEQ] = {-1, -1, -1};
        for (size_t j = 0; j < (size_t)nv; j++) lg[(size_t)nv + j] = -1.0f; /* must stay untouched */
        const nstf_batch b = {.tokens = bt, .pos = bp, .seq = bs, .n = n, .rows = rows, .n_rows = nr, .blocks = tbl,
                              .argmax_rows = true, .host_rows = 1};
        nstf_status st = nstf_llama_forward(r, &b, lg, ams);
        CHECK(st == NSTF_OK, "paged forward with every row's greedy token: %s", nstf_last_error());
        if (st != NSTF_OK) continue;
        diff += paged_diff(lg, alone, seqs, idx, 1, nv);
        rows_seen += 1;
        int am_bad = 0;
        for (int i = 0; i < nr; i++) {
            const float *a = alone + ((size_t)seqs[i] * (16 + N_STEPS) + idx[i]) * nv;
            int best = 0;
            for (int j = 1; j < nv; j++) best = a[j] > a[best] ? j : best;
            am_bad += ams[i] != best;
        }
        CHECK(am_bad == 0, "%s: %d of %d rows' greedy tokens are not their logits' argmax", mode, am_bad, nr);
        CHECK(lg[nv] == -1.0f && lg[2 * (size_t)nv - 1] == -1.0f, "%s: logits of a row past host_rows were copied",
              mode);
        nstf_batch bb = b;
        bb.host_rows = nr + 1;
        CHECK(nstf_llama_forward(r, &bb, lg, ams) == NSTF_ERR_INVALID_ARG, "host_rows past n_rows accepted");
        bb = b;
        bb.rows = NULL;
        CHECK(nstf_llama_forward(r, &bb, lg, ams) == NSTF_ERR_INVALID_ARG, "argmax_rows without rows accepted");
    }
#undef PUT
#undef ROW
    printf("%s: paged KV cache, prefill chunks and decode mixed in one batch: %lld of %lld rows differ\n", mode,
           (long long)diff, (long long)rows_seen);
    CHECK(diff == 0, "the continuous batch differs from the sequences alone");
    /* refusals */
    bt[0] = tok[0][0], bp[0] = 40, bs[0] = 0, rows[0] = 0;
    nstf_batch b = {.tokens = bt, .pos = bp, .seq = bs, .n = 1, .rows = rows, .n_rows = 1};
    CHECK(nstf_llama_forward(r, &b, NULL, NULL) == NSTF_ERR_INVALID_ARG, "paged run without a block table accepted");
    int32_t bad[N_SEQ * BPS];
    memcpy(bad, tbl, sizeof bad);
    bad[40 / BLK] = pool;
    b.blocks = bad;
    CHECK(nstf_llama_forward(r, &b, NULL, NULL) == NSTF_ERR_RANGE, "block %d outside the pool accepted", pool);
    b.blocks = tbl;
    rows[0] = 1;
    CHECK(nstf_llama_forward(r, &b, NULL, NULL) == NSTF_ERR_RANGE, "logits row 1 of a 1-token batch accepted");
    free(lg);
    nstf_llama_run_free(r);
}

int main(void) {
    nstf_gguf *g;
    nstf_llama *m;
    const int lrc = test_model_load(MODEL, "test_batch", &g, &m);
    if (lrc) return lrc == 77 ? 77 : test_finish("test_batch");
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
        nstf_batch b = {.tokens = bt, .pos = bp, .seq = bs, .n = n, .all_logits = true};
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
            nstf_batch d = {.tokens = bt, .pos = bp, .seq = bs, .n = N_SEQ, .all_logits = true};
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
        nstf_batch bad = {.tokens = bt, .pos = bp, .seq = bs, .n = 1};
        CHECK(nstf_llama_forward(multi, &bad, NULL, NULL) == NSTF_ERR_RANGE, "slot %d accepted", N_SEQ);
        paged_mixed(m, be, prompt, tok, alone, precise ? "precise" : "default");
        free(lg);
        free(alone);
        nstf_llama_run_free(multi);
        nstf_llama_run_free(single);
        nstf_backend_free(be);
    }
    nstf_llama_free(m);
    return test_finish("test_batch");
}
