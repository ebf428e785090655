/* bench_batch.c — the cost of one batched decode step over a paged KV
 * cache (nstf_bench_decode_batch, bench.h): the step nstf serve runs for
 * sequences that all decode, timed on the wall clock from the call to the
 * forward's return (its last copy to the host waits for the device). */
#include <stdlib.h>
#include <string.h>

#include "core/clock.h"
#include "core/mem.h"
#include "model/session.h"
#include "prof/bench.h"

int nstf_bench_batch_blocks(int n_seq, int n_depth) {
    return n_seq * ((n_depth + 1 + nstf_bench_batch_block - 1) / nstf_bench_batch_block);
}

nstf_status nstf_bench_batch_open(const char *model, const nstf_session_params *p, int max_seq, int n_depth,
                                  nstf_session **out) {
    *out = NULL;
    if (max_seq < 1 || max_seq > 4096 || n_depth < 0 || n_depth > (1 << 22) ||
        (int64_t)nstf_bench_batch_blocks(max_seq, n_depth) * nstf_bench_batch_block > (1 << 30))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "a batched decode of %d sequences at depth %d", max_seq, n_depth);
    const int blocks = nstf_bench_batch_blocks(max_seq, n_depth);
    nstf_session_params sp = *p;
    sp.n_batch = max_seq;
    sp.n_ctx = blocks * nstf_bench_batch_block;
    const nstf_session_shape shape = {max_seq, nstf_bench_batch_block, blocks};
    return nstf_session_open_shaped(model, &sp, &shape, out);
}

nstf_status nstf_bench_decode_batch(nstf_session *s, const nstf_bench_batch_test *t, uint64_t *rng,
                                    uint64_t *samples_ns) {
    const nstf_llama_state *st = &s->run->s;
    const int B = t->n_seq, blk = nstf_bench_batch_block;
    if (B < 1 || t->n_depth < 0 || t->reps < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "a batched decode test needs sequences >= 1, depth >= 0, reps >= 1");
    if (st->kv_block != blk || B > st->n_seq || B > st->n_batch || t->n_depth >= st->n_ctx ||
        nstf_bench_batch_blocks(B, t->n_depth) > st->kv_blocks)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "a batched decode of %d sequences at depth %d needs a run shaped for them (blocks of %d: "
                              "%d of them, %d sequences, a batch of %d); it has %d of %d, %d sequences, a batch of %d",
                              B, t->n_depth, blk, nstf_bench_batch_blocks(B, t->n_depth), B, B, st->kv_blocks,
                              st->kv_block, st->n_seq, st->n_batch);
    const int bps = st->n_ctx / blk, per = (t->n_depth + 1 + blk - 1) / blk, nv = s->model->cfg.n_vocab;
    int32_t *tbl = nstf_alloc((size_t)st->n_seq * (size_t)bps * sizeof *tbl, "block table");
    int32_t *buf = nstf_alloc((size_t)B * 5 * sizeof *buf, "batch");
    float *logits = t->logits_host ? nstf_alloc((size_t)B * (size_t)nv * sizeof(float), "logits") : NULL;
    if (!tbl || !buf || (t->logits_host && !logits)) {
        nstf_free(tbl);
        nstf_free(buf);
        nstf_free(logits);
        return NSTF_ERR_OOM;
    }
    for (int q = 0; q < st->n_seq; q++) /* sequence q: blocks q * per .. (q + 1) * per - 1 */
        for (int i = 0; i < bps; i++) tbl[(int64_t)q * bps + i] = q < B && i < per ? q * per + i : -1;
    int32_t *tok = buf, *pos = buf + B, *seq = buf + 2 * B, *rows = buf + 3 * B, *am = buf + 4 * B;
    for (int i = 0; i < B; i++) {
        pos[i] = t->n_depth;
        seq[i] = i;
        rows[i] = i;
    }
    const nstf_batch b = {.tokens = tok, .pos = pos, .seq = seq, .n = B, .rows = rows, .n_rows = B, .blocks = tbl,
                          .argmax_rows = true, .host_rows = t->logits_host ? B : 0};
    nstf_status r = NSTF_OK;
    for (int k = t->warmup ? -1 : 0; r == NSTF_OK && k < t->reps; k++) {
        for (int i = 0; i < B; i++) tok[i] = nstf_bench_token(rng, nv);
        const double t0 = nstf_time_ms();
        r = nstf_llama_forward(s->run, &b, logits, am);
        const double ms = nstf_time_ms() - t0;
        if (k >= 0) samples_ns[k] = (uint64_t)(ms * 1e6);
    }
    nstf_free(tbl);
    nstf_free(buf);
    nstf_free(logits);
    return r;
}
