/* test_comm_gpu.c — the communicator's all-reduce on 2+ GPUs of this
 * machine (tensor parallel): the one-shot peer all-reduce (up to its cap,
 * where every pair of GPUs has peer access) and NCCL beyond it.
 *
 * Sizes 1, 7, 4096 (a 16 KB residual), 65536 (the peer path's cap),
 * 65537 and 300000 (NCCL), each for several calls in a row with new data
 * (the peer path alternates two receive slots; 40 calls of the 16 KB size
 * go through both many times). Every rank's buffer holds its own values
 * (seeded, rank-dependent, mixed signs and magnitudes). Checks: every
 * rank's result has the same bits; on the peer path it is exactly the fp32
 * sum in rank order (r0 + r1 + ...), on NCCL's (its own order) within
 * the bound of any fp32 summation order of R terms: |got - exact| <=
 * (R - 1) 2^-24 sum_r |v_r| (the fp64 sum as exact). Then the residual form (nstf_comm_allreduce_add, a
 * decode step's 4096 floats, 10 calls): dst += the sum in the kernel on
 * the peer path, exactly dst + (the rank-order sum), buf unchanged; the
 * caller's add otherwise. A stalled rank (nstf_comm_fault: the last
 * rank never enters its first all-reduce) on a communicator with a 500 ms
 * timeout: the job fails within 5 s naming it (the watchdog, or the
 * others' kernels, which wait on the device for its data and give up at
 * the same timeout), no hang.
 * ZeRO-1's collectives (nstf_comm_reduce_scatter, nstf_comm_allgather:
 * NCCL's in place, one slot per rank): arrays of 1, 7, 4099 and 300001
 * elements in padded slots (nstf_comm_shard_len, 64-aligned; 7 also
 * unaligned, a short last slot), seeded values, zero padding. Reduce-scatter:
 * each rank's slot is the fp32 sum, bit for bit the rank-order sum and the
 * all-reduce of the same buffers on two GPUs (a two-term sum does not
 * depend on the order), within the summation-order bound above on more;
 * the rest of the buffer is not looked at (undefined). All-gather of fp32
 * and of 2-byte elements (bf16 patterns, a NaN and an Inf pattern): every
 * rank's buffer equals every slot's owner's bytes; the host all-gather
 * between the rank threads too. These run before the stalled ranks (whose
 * aborts end their communicators); a rank stalled before its first
 * reduce-scatter (500 ms timeout) fails the job within 5 s naming it, as
 * one stalled before its first all-reduce does.
 * Exit 77 (skipped) with fewer than 2 GPUs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/clock.h"
#include "dist/comm.h"
#include "test_util.h"

#define MAX_R 4

typedef struct job {
    nstf_comm *c;
    nstf_backend *be[MAX_R];
    float *dbuf[MAX_R];
    float *in[MAX_R], *out[MAX_R];
    int64_t n;
    /* the residual form */
    bool add, added[MAX_R];
    float *ddst[MAX_R], *dst_in[MAX_R], *dst_out[MAX_R];
} job;

static nstf_status rank_job(void *ctx, int r) {
    job *j = ctx;
    nstf_backend *be = j->be[r];
    const uint64_t bytes = (uint64_t)j->n * sizeof(float);
    NSTF_TRY(be->vt->upload(be, j->dbuf[r], j->in[r], bytes));
    if (j->add) {
        NSTF_TRY(be->vt->upload(be, j->ddst[r], j->dst_in[r], bytes));
        NSTF_TRY(nstf_comm_allreduce_add(j->c, r, j->dbuf[r], j->ddst[r], j->n, &j->added[r]));
        NSTF_TRY(be->vt->download(be, j->dst_out[r], j->ddst[r], bytes));
    } else {
        NSTF_TRY(nstf_comm_allreduce(j->c, r, j->dbuf[r], j->n));
    }
    NSTF_TRY(be->vt->download(be, j->out[r], j->dbuf[r], bytes));
    return be->vt->sync(be);
}

/* ---- ZeRO-1's collectives ------------------------------------------------------------------- */

typedef struct zjob {
    nstf_comm *c;
    nstf_backend *be[MAX_R];
    int64_t shard;
    float *d_rs[MAX_R], *d_ar[MAX_R], *d_ag[MAX_R]; /* [R shard] on rank r's GPU */
    uint16_t *d_ag16[MAX_R];
    float *in[MAX_R], *rs[MAX_R], *ar[MAX_R], *ag_in[MAX_R], *ag[MAX_R]; /* host */
    uint16_t *ag16_in[MAX_R], *ag16[MAX_R];
    double mine[MAX_R][2], all[MAX_R][2 * MAX_R];
} zjob;

static nstf_status zrank(void *ctx, int r) {
    zjob *j = ctx;
    nstf_backend *be = j->be[r];
    const int n = nstf_comm_size(j->c);
    const uint64_t len = (uint64_t)(j->shard * n);
    NSTF_TRY(be->vt->upload(be, j->d_rs[r], j->in[r], len * 4));
    NSTF_TRY(be->vt->upload(be, j->d_ar[r], j->in[r], len * 4));
    NSTF_TRY(be->vt->upload(be, j->d_ag[r], j->ag_in[r], len * 4));
    NSTF_TRY(be->vt->upload(be, j->d_ag16[r], j->ag16_in[r], len * 2));
    NSTF_TRY(nstf_comm_reduce_scatter(j->c, r, j->d_rs[r], j->shard));
    NSTF_TRY(nstf_comm_allreduce(j->c, r, j->d_ar[r], (int64_t)len));
    NSTF_TRY(nstf_comm_allgather(j->c, r, j->d_ag[r], j->shard, 4));
    NSTF_TRY(nstf_comm_allgather(j->c, r, j->d_ag16[r], j->shard, 2));
    NSTF_TRY(be->vt->download(be, j->rs[r], j->d_rs[r], len * 4));
    NSTF_TRY(be->vt->download(be, j->ar[r], j->d_ar[r], len * 4));
    NSTF_TRY(be->vt->download(be, j->ag[r], j->d_ag[r], len * 4));
    NSTF_TRY(be->vt->download(be, j->ag16[r], j->d_ag16[r], len * 2));
    NSTF_TRY(nstf_comm_host_allgather(j->c, r, j->mine[r], j->all[r], sizeof j->mine[r]));
    return be->vt->sync(be);
}

static void test_sharded(nstf_backend **be, int R, test_rng *rng) {
    static const struct { int64_t n, align; } sizes[] = {{1, 64}, {7, 64}, {7, 1}, {4099, 64}, {300001, 64}};
    zjob j;
    memset(&j, 0, sizeof j);
    for (int r = 0; r < R; r++) j.be[r] = be[r];
    CHECK(nstf_comm_create(be, R, 10000, &j.c) == NSTF_OK, "%s", nstf_last_error());
    if (!j.c) return;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t n = sizes[si].n;
        CHECK(nstf_comm_shard_len(n, R, sizes[si].align, &j.shard) == NSTF_OK, "%s", nstf_last_error());
        const int64_t len = j.shard * R;
        for (int r = 0; r < R; r++) {
            j.in[r] = calloc((size_t)len, 4), j.rs[r] = malloc((size_t)len * 4), j.ar[r] = malloc((size_t)len * 4);
            j.ag_in[r] = malloc((size_t)len * 4), j.ag[r] = malloc((size_t)len * 4);
            j.ag16_in[r] = malloc((size_t)len * 2), j.ag16[r] = malloc((size_t)len * 2);
            CHECK(be[r]->vt->alloc(be[r], (uint64_t)len * 4, (void **)&j.d_rs[r]) == NSTF_OK &&
                      be[r]->vt->alloc(be[r], (uint64_t)len * 4, (void **)&j.d_ar[r]) == NSTF_OK &&
                      be[r]->vt->alloc(be[r], (uint64_t)len * 4, (void **)&j.d_ag[r]) == NSTF_OK &&
                      be[r]->vt->alloc(be[r], (uint64_t)len * 2, (void **)&j.d_ag16[r]) == NSTF_OK,
                  "%s", nstf_last_error());
            for (int64_t i = 0; i < n; i++) { /* the padding [n, len) stays 0 */
                const double u = (double)(rng_next(rng) % 2000001) / 1e6 - 1.0;
                j.in[r][i] = (float)(u * pow(10.0, (double)(int)(rng_next(rng) % 5) - 2.0));
            }
            for (int64_t i = 0; i < len; i++) { /* the own slot is what is gathered; the rest poisoned */
                j.ag_in[r][i] = i / j.shard == r ? rng_uniform(rng) : -7.0f;
                j.ag16_in[r][i] = i / j.shard == r ? (uint16_t)(rng_next(rng) >> 48) : 0xdeadu;
            }
            if (j.shard >= 2) j.ag16_in[r][r * j.shard] = 0x7fc1u, j.ag16_in[r][r * j.shard + 1] = 0xff80u;
            j.mine[r][0] = r + 0.5, j.mine[r][1] = -r - 0.25;
        }
        const nstf_status st = nstf_comm_run(j.c, zrank, &j);
        CHECK(st == NSTF_OK, "sharded collectives, %lld elements: %s", (long long)n, nstf_last_error());
        int64_t wrong = 0, vs_ar = 0, ag_wrong = 0, host_wrong = 0;
        double worst = 0;
        for (int r = 0; st == NSTF_OK && r < R; r++) {
            for (int64_t i = r * j.shard; i < (r + 1) * j.shard; i++) {
                float s = 0.0f;
                double sd = 0.0, sa = 0.0;
                for (int q = 0; q < R; q++) s += j.in[q][i], sd += j.in[q][i], sa += fabs(j.in[q][i]);
                if (R == 2) {
                    wrong += memcmp(&j.rs[r][i], &s, sizeof s) != 0;
                    vs_ar += memcmp(&j.rs[r][i], &j.ar[r][i], sizeof s) != 0;
                } else {
                    const double e = fabs((double)j.rs[r][i] - sd), bound = (R - 1) * 0x1p-24 * sa * 1.0001;
                    if (bound > 0 && e / bound > worst) worst = e / bound;
                    wrong += !(e <= bound);
                }
            }
            for (int64_t i = 0; i < len; i++) {
                const int o = (int)(i / j.shard);
                ag_wrong += memcmp(&j.ag[r][i], &j.ag_in[o][i], 4) != 0;
                ag_wrong += memcmp(&j.ag16[r][i], &j.ag16_in[o][i], 2) != 0;
            }
            for (int q = 0; q < R; q++) host_wrong += memcmp(&j.all[r][2 * q], j.mine[q], sizeof j.mine[q]) != 0;
        }
        printf("  sharded: %6lld elements in slots of %6lld: reduce-scatter %lld wrong%s, %lld differ from the "
               "all-reduce; all-gather %lld wrong; host all-gather %lld wrong\n",
               (long long)n, (long long)j.shard, (long long)wrong, R == 2 ? " (bitwise)" : " (summation-order bound)",
               (long long)vs_ar, (long long)ag_wrong, (long long)host_wrong);
        CHECK(wrong == 0 && vs_ar == 0 && ag_wrong == 0 && host_wrong == 0, "sharded collectives, %lld elements",
              (long long)n);
        for (int r = 0; r < R; r++) {
            be[r]->vt->free(be[r], j.d_rs[r]), be[r]->vt->free(be[r], j.d_ar[r]);
            be[r]->vt->free(be[r], j.d_ag[r]), be[r]->vt->free(be[r], j.d_ag16[r]);
            free(j.in[r]), free(j.rs[r]), free(j.ar[r]), free(j.ag_in[r]), free(j.ag[r]), free(j.ag16_in[r]),
                free(j.ag16[r]);
        }
    }
    nstf_comm_free(j.c);
}

/* A reduce-scatter of R slots of 1024 floats, waited for (as rank_job
 * waits for its all-reduce), for the stalled-rank case. */
static nstf_status stall_rs(void *ctx, int r) {
    job *j = ctx;
    nstf_backend *be = j->be[r];
    NSTF_TRY(nstf_comm_reduce_scatter(j->c, r, j->dbuf[r], 1024));
    NSTF_TRY(be->vt->download(be, j->out[r], j->dbuf[r], 1024 * sizeof(float)));
    return be->vt->sync(be);
}

/* The last rank never enters its first collective (fn's), on a
 * communicator with a 500 ms timeout: the job fails within 5 s naming it
 * (the watchdog, or the others' kernels giving up at the same timeout). */
static void check_stall(job *j, int R, nstf_comm_job fn, const char *what) {
    j->c = NULL;
    CHECK(nstf_comm_create(j->be, R, 500, &j->c) == NSTF_OK, "%s", nstf_last_error());
    if (!j->c) return;
    nstf_comm_fault(j->c, R - 1, 0);
    const double t0 = nstf_time_ms();
    const nstf_status st = nstf_comm_run(j->c, fn, j);
    const double ms = nstf_time_ms() - t0;
    const char *msg = st != NSTF_OK ? nstf_last_error() : "";
    char want[32];
    snprintf(want, sizeof want, "rank %d", R - 1);
    printf("  rank %d stalled before its first %s: %s after %.0f ms: %s\n", R - 1, what,
           st != NSTF_OK ? "failed" : "DID NOT FAIL", ms, msg);
    CHECK(st != NSTF_OK && ms < 5000 && strstr(msg, want) && (strstr(msg, "stalled") || strstr(msg, "did not arrive")),
          "a rank stalled before its %s must fail the job within the timeout, naming it", what);
    nstf_comm_free(j->c);
}

int main(void) {
    const int n_gpu = nstf_backend_gpu_count();
    if (n_gpu < 2) {
        printf("test_comm_gpu: %d GPU(s); skipped\n", n_gpu);
        return 77;
    }
    const int R = n_gpu < MAX_R ? n_gpu : MAX_R;
    job j = {0};
    for (int r = 0; r < R; r++) CHECK(nstf_backend_gpu_create(r, &j.be[r]) == NSTF_OK, "%s", nstf_last_error());
    CHECK(nstf_comm_create(j.be, R, 10000, &j.c) == NSTF_OK, "%s", nstf_last_error());
    if (!j.c) return test_finish("test_comm_gpu");
    const bool peer = strstr(nstf_comm_transport(j.c), "peer") != NULL;
    printf("%d GPUs, transport: %s\n", R, nstf_comm_transport(j.c));
    static const int64_t sizes[] = {1, 7, 4096, 65536, 65537, 300000};
    const int64_t max_n = 300000;
    for (int r = 0; r < R; r++) {
        j.in[r] = malloc(sizeof(float) * max_n);
        j.out[r] = malloc(sizeof(float) * max_n);
        CHECK(j.in[r] && j.out[r], "out of memory");
        CHECK(j.be[r]->vt->alloc(j.be[r], sizeof(float) * max_n, (void **)&j.dbuf[r]) == NSTF_OK, "%s",
              nstf_last_error());
    }
    test_rng rng = {0x5eedu};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        j.n = sizes[si];
        const bool p2p = peer && j.n <= 65536;
        const int calls = j.n == 4096 ? 40 : 3;
        int64_t wrong = 0, differ = 0;
        double worst = 0;
        for (int k = 0; k < calls; k++) {
            for (int r = 0; r < R; r++)
                for (int64_t i = 0; i < j.n; i++) {
                    const double u = (double)(rng_next(&rng) % 2000001) / 1e6 - 1.0; /* [-1, 1] */
                    j.in[r][i] = (float)(u * pow(10.0, (double)(int)(rng_next(&rng) % 5) - 2.0));
                }
            const nstf_status st = nstf_comm_run(j.c, rank_job, &j);
            CHECK(st == NSTF_OK, "all-reduce of %lld: %s", (long long)j.n, nstf_last_error());
            if (st != NSTF_OK) break;
            for (int64_t i = 0; i < j.n; i++) {
                float s = 0.0f;
                double sd = 0.0, sa = 0.0;
                for (int r = 0; r < R; r++) s += j.in[r][i], sd += j.in[r][i], sa += fabs(j.in[r][i]);
                const float got = j.out[0][i];
                for (int r = 1; r < R; r++) differ += memcmp(&j.out[r][i], &got, sizeof got) != 0;
                if (p2p) {
                    wrong += memcmp(&got, &s, sizeof s) != 0;
                } else {
                    const double e = fabs((double)got - sd), bound = (R - 1) * 0x1p-24 * sa * 1.0001;
                    if (bound > 0 && e / bound > worst) worst = e / bound;
                    wrong += !(e <= bound);
                }
            }
        }
        char tail[64] = "";
        if (!p2p) snprintf(tail, sizeof tail, " (worst error %.2f of the bound)", worst);
        printf("  %6lld floats x %2d calls (%s): %lld wrong, %lld differ between ranks%s\n", (long long)j.n, calls,
               p2p ? "peer one-shot, exact rank-order sum" : "NCCL, the summation-order bound", (long long)wrong,
               (long long)differ, tail);
        CHECK(wrong == 0 && differ == 0, "all-reduce of %lld floats", (long long)j.n);
    }
    /* the residual form */
    j.n = 4096;
    j.add = true;
    int64_t wrong = 0, differ = 0, touched = 0;
    int added = 0;
    for (int r = 0; r < R; r++) {
        j.dst_in[r] = malloc(sizeof(float) * j.n);
        j.dst_out[r] = malloc(sizeof(float) * j.n);
        CHECK(j.dst_in[r] && j.dst_out[r], "out of memory");
        CHECK(j.be[r]->vt->alloc(j.be[r], sizeof(float) * j.n, (void **)&j.ddst[r]) == NSTF_OK, "%s",
              nstf_last_error());
    }
    for (int k = 0; k < 10; k++) {
        for (int64_t i = 0; i < j.n; i++) {
            const float x = (float)((double)(rng_next(&rng) % 2000001) / 1e6 - 1.0);
            for (int r = 0; r < R; r++) {
                j.in[r][i] = (float)((double)(rng_next(&rng) % 2000001) / 1e6 - 1.0);
                j.dst_in[r][i] = x; /* the residual: the same on every rank */
            }
        }
        CHECK(nstf_comm_run(j.c, rank_job, &j) == NSTF_OK, "all-reduce-add: %s", nstf_last_error());
        for (int r = 0; r < R; r++) added += j.added[r];
        for (int64_t i = 0; i < j.n; i++) {
            float s = 0.0f;
            for (int r = 0; r < R; r++) s += j.in[r][i];
            for (int r = 0; r < R; r++) {
                const float want = j.added[r] ? j.dst_in[r][i] + s : j.dst_in[r][i];
                wrong += memcmp(&j.dst_out[r][i], &want, sizeof want) != 0;
                if (j.added[r]) touched += memcmp(&j.out[r][i], &j.in[r][i], sizeof(float)) != 0;
                else wrong += memcmp(&j.out[r][i], &s, sizeof s) != 0;
                differ += memcmp(&j.dst_out[r][i], &j.dst_out[0][i], sizeof(float)) != 0;
            }
        }
    }
    printf("  residual form, 4096 floats x 10 calls: added in the kernel %d of %d times (%s), %lld wrong, "
           "%lld differ between ranks, buf changed %lld\n",
           added, 10 * R, peer ? "peer path: all" : "NCCL: none", (long long)wrong, (long long)differ,
           (long long)touched);
    CHECK(wrong == 0 && differ == 0 && touched == 0 && added == (peer ? 10 * R : 0), "all-reduce-add");
    for (int r = 0; r < R; r++) {
        j.be[r]->vt->free(j.be[r], j.ddst[r]);
        free(j.dst_in[r]);
        free(j.dst_out[r]);
    }
    nstf_comm_free(j.c);
    /* ZeRO-1's collectives; then (last: they abort communicators) a rank
     * stalled before its first all-reduce, and one before its first
     * reduce-scatter */
    test_sharded(j.be, R, &rng);
    j.add = false;
    j.n = 4096;
    check_stall(&j, R, rank_job, "all-reduce");
    check_stall(&j, R, stall_rs, "reduce-scatter"); /* dbuf holds 300000 >= R x 1024 floats */
    for (int r = 0; r < R; r++) {
        j.be[r]->vt->free(j.be[r], j.dbuf[r]);
        nstf_backend_free(j.be[r]);
        free(j.in[r]);
        free(j.out[r]);
    }
    return test_finish("test_comm_gpu");
}
