/* test_comm.c — the communicator's sharded collectives on CPU ranks
 * (ZeRO-1's reduce-scatter and all-gather, dist/comm.h; the all-reduce and
 * the watchdog's basics are in test_tp.c). Checks:
 *  1. nstf_comm_shard_len: ceil(n / ranks) rounded up to the alignment
 *     (123200 parameters over 3 ranks: slots of 41088, the last rank's
 *     real share 41024), n = 0, a last rank with no real share (100
 *     elements, 3 ranks, 64-aligned slots of 64), and the refusals (a
 *     negative n, no ranks, a padded size past int64);
 *  2. for 1, 2 and 3 ranks and sizes that the ranks do not divide
 *     (1000003 elements, 5 elements in slots of 2, 100 in slots of 64),
 *     the padded buffers (every rank's values seeded, mixed signs and
 *     magnitudes, the padding zero):
 *     - reduce-scatter: each rank's slot equals, bit for bit, the fp32 sum
 *       in rank order (r0 + r1 + ...) and the all-reduce of the same
 *       buffers (the two must agree for ZeRO-1 to give the replicated
 *       run's bits);
 *     - all-gather in place of fp32 and of 2-byte elements (bf16 bit
 *       patterns, NaN patterns included: copied, never computed): every
 *       rank's buffer equals every slot's owner's, bit for bit;
 *     - the host all-gather (doubles): every rank receives every rank's
 *       values in rank order;
 *  3. failures are errors, never hangs: a rank stalled before its
 *     reduce-scatter is named within the 200 ms timeout (5 s allowed); a
 *     rank that fails before its all-gather makes the others leave theirs
 *     with its error; bad arguments (a negative slot, a 3-byte element)
 *     are refused with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/clock.h"
#include "dist/comm.h"
#include "test_util.h"

#define R_MAX 3

typedef struct job {
    nstf_comm *c;
    int64_t shard;
    float *rs[R_MAX], *ar[R_MAX]; /* [R shard]: the reduce-scatter's and the all-reduce's copies */
    float *ag[R_MAX];             /* [R shard] fp32 all-gather */
    uint16_t *ag16[R_MAX];        /* [R shard] 2-byte all-gather */
    double mine[R_MAX][4], all[R_MAX][R_MAX * 4];
    int fail_rank; /* fails before its all-gather (-1: none) */
} job;

static nstf_status rank_job(void *ctx, int r) {
    job *j = ctx;
    nstf_comm *c = j->c;
    const int n = nstf_comm_size(c);
    NSTF_TRY(nstf_comm_reduce_scatter(c, r, j->rs[r], j->shard));
    NSTF_TRY(nstf_comm_allreduce(c, r, j->ar[r], j->shard * n));
    if (r == j->fail_rank) return nstf_set_error(NSTF_ERR_IO, "planted failure");
    NSTF_TRY(nstf_comm_allgather(c, r, j->ag[r], j->shard, 4));
    NSTF_TRY(nstf_comm_allgather(c, r, j->ag16[r], j->shard, 2));
    return nstf_comm_host_allgather(c, r, j->mine[r], j->all[r], sizeof j->mine[r]);
}

static nstf_status bad_args_job(void *ctx, int r) {
    job *j = ctx;
    if (nstf_comm_reduce_scatter(j->c, r, j->rs[r], -1) == NSTF_OK) return nstf_set_error(NSTF_ERR_INTERNAL, "slot -1 taken");
    if (!strstr(nstf_last_error(), "reduce-scatter")) return nstf_set_error(NSTF_ERR_INTERNAL, "no message");
    if (nstf_comm_allgather(j->c, r, j->ag[r], 1, 3) == NSTF_OK) return nstf_set_error(NSTF_ERR_INTERNAL, "3-byte elements taken");
    return NSTF_OK;
}

static void check_shard_len(void) {
    int64_t s = -1;
    CHECK(nstf_comm_shard_len(123200, 3, 64, &s) == NSTF_OK && s == 41088, "123200 over 3: %lld", (long long)s);
    printf("  123200 parameters over 3 ranks: slots of %lld, the last rank's share %lld\n", (long long)s,
           (long long)(123200 - 2 * s));
    CHECK(nstf_comm_shard_len(10, 3, 1, &s) == NSTF_OK && s == 4, "10 over 3: %lld", (long long)s);
    CHECK(nstf_comm_shard_len(0, 3, 64, &s) == NSTF_OK && s == 0, "0 over 3: %lld", (long long)s);
    CHECK(nstf_comm_shard_len(100, 3, 64, &s) == NSTF_OK && s == 64, "100 over 3 (64): %lld", (long long)s);
    CHECK(nstf_comm_shard_len(-1, 2, 64, &s) != NSTF_OK, "a negative count accepted");
    CHECK(nstf_comm_shard_len(10, 0, 64, &s) != NSTF_OK, "no ranks accepted");
    CHECK(nstf_comm_shard_len(INT64_MAX, 2, 64, &s) != NSTF_OK && strstr(nstf_last_error(), "overflow"),
          "a padded size past int64 accepted: %lld", (long long)s);
    CHECK(nstf_comm_shard_len(INT64_MAX - 10, 3, 64, &s) != NSTF_OK, "3 slots past int64 accepted (the rounding up)");
    CHECK(nstf_comm_shard_len(INT64_MAX / 3, 3, 64, &s) == NSTF_OK, "3 slots within int64 refused: %s",
          nstf_last_error());
}

/* One size on R ranks: the collectives against what they must give. */
static void check_size(nstf_backend **be, int R, int64_t n, int64_t align, test_rng *rng) {
    job j;
    memset(&j, 0, sizeof j);
    j.fail_rank = -1;
    CHECK(nstf_comm_shard_len(n, R, align, &j.shard) == NSTF_OK, "%s", nstf_last_error());
    const int64_t len = j.shard * R;
    for (int r = 0; r < R; r++) {
        j.rs[r] = calloc((size_t)(len ? len : 1), sizeof(float));
        j.ar[r] = calloc((size_t)(len ? len : 1), sizeof(float));
        j.ag[r] = calloc((size_t)(len ? len : 1), sizeof(float));
        j.ag16[r] = calloc((size_t)(len ? len : 1), sizeof(uint16_t));
        for (int64_t i = 0; i < n; i++) { /* the padding [n, len) stays 0 */
            const float u = rng_uniform(rng) * powf(10.0f, (float)(int)(rng_next(rng) % 7) - 3.0f);
            j.rs[r][i] = j.ar[r][i] = u;
        }
        for (int64_t i = 0; i < len; i++) { /* each rank's own slot is what it gathers from */
            j.ag[r][i] = i / j.shard == r ? rng_uniform(rng) : -1.0f;
            j.ag16[r][i] = i / j.shard == r ? (uint16_t)(rng_next(rng) >> 48) : 0xdeadu;
        }
        for (int k = 0; k < 4; k++) j.mine[r][k] = (double)(r * 4 + k) + 0.25;
    }
    for (int r = 0; r < R; r++) /* a NaN and an Inf bit pattern travel unchanged */
        if (j.shard >= 2) j.ag16[r][(int64_t)r * j.shard] = 0x7fc1u, j.ag16[r][(int64_t)r * j.shard + 1] = 0xff80u;
    float *in[R_MAX];
    for (int r = 0; r < R; r++) {
        in[r] = malloc((size_t)(len ? len : 1) * sizeof(float));
        memcpy(in[r], j.rs[r], (size_t)len * sizeof(float));
    }
    uint16_t *g16 = malloc((size_t)(len ? len : 1) * sizeof(uint16_t));
    float *g32 = malloc((size_t)(len ? len : 1) * sizeof(float));
    for (int64_t i = 0; i < len; i++) {
        const int o = (int)(i / j.shard);
        g16[i] = j.ag16[o][i];
        g32[i] = j.ag[o][i];
    }
    CHECK(nstf_comm_create(be, R, 200, &j.c) == NSTF_OK, "%s", nstf_last_error());
    const nstf_status st = j.c ? nstf_comm_run(j.c, rank_job, &j) : NSTF_ERR_INTERNAL;
    CHECK(st == NSTF_OK, "%d ranks, %lld elements: %s", R, (long long)n, nstf_last_error());
    int64_t rs_wrong = 0, vs_ar = 0, ag_wrong = 0, host_wrong = 0;
    for (int r = 0; st == NSTF_OK && r < R; r++) {
        for (int64_t i = j.shard * r; i < j.shard * (r + 1); i++) {
            float s = in[0][i];
            for (int q = 1; q < R; q++) s += in[q][i];
            rs_wrong += memcmp(&j.rs[r][i], &s, sizeof s) != 0;
            vs_ar += memcmp(&j.rs[r][i], &j.ar[r][i], sizeof s) != 0;
        }
        ag_wrong += memcmp(j.ag[r], g32, (size_t)len * sizeof(float)) != 0;
        ag_wrong += memcmp(j.ag16[r], g16, (size_t)len * sizeof(uint16_t)) != 0;
        for (int q = 0; q < R; q++) host_wrong += memcmp(&j.all[r][q * 4], j.mine[q], sizeof j.mine[q]) != 0;
    }
    printf("  %d ranks, %7lld elements in slots of %6lld (last rank's share %lld): reduce-scatter %lld wrong, "
           "%lld differ from the all-reduce; all-gather %lld buffers wrong; host all-gather %lld wrong\n",
           R, (long long)n, (long long)j.shard, (long long)(n - j.shard * (R - 1) > 0 ? n - j.shard * (R - 1) : 0),
           (long long)rs_wrong, (long long)vs_ar, (long long)ag_wrong, (long long)host_wrong);
    CHECK(rs_wrong == 0 && vs_ar == 0 && ag_wrong == 0 && host_wrong == 0, "%d ranks, %lld elements", R, (long long)n);
    if (j.c && R > 1) {
        CHECK(nstf_comm_run(j.c, bad_args_job, &j) == NSTF_OK, "bad arguments: %s", nstf_last_error());
    }
    nstf_comm_free(j.c);
    for (int r = 0; r < R; r++) free(j.rs[r]), free(j.ar[r]), free(j.ag[r]), free(j.ag16[r]), free(in[r]);
    free(g16);
    free(g32);
}

/* A stalled rank and a failing one, on 3 ranks. */
static void check_failures(nstf_backend **be) {
    job j;
    memset(&j, 0, sizeof j);
    j.shard = 64;
    for (int r = 0; r < R_MAX; r++) {
        j.rs[r] = calloc(64 * R_MAX, sizeof(float));
        j.ar[r] = calloc(64 * R_MAX, sizeof(float));
        j.ag[r] = calloc(64 * R_MAX, sizeof(float));
        j.ag16[r] = calloc(64 * R_MAX, sizeof(uint16_t));
    }
    /* rank 1 never enters its first collective, the reduce-scatter */
    j.fail_rank = -1;
    CHECK(nstf_comm_create(be, R_MAX, 200, &j.c) == NSTF_OK, "%s", nstf_last_error());
    if (j.c) {
        nstf_comm_fault(j.c, 1, 0);
        const double t0 = nstf_time_ms();
        const nstf_status st = nstf_comm_run(j.c, rank_job, &j);
        const double ms = nstf_time_ms() - t0;
        printf("  rank 1 stalled before its reduce-scatter: %.0f ms (timeout 200): %s\n", ms, nstf_last_error());
        CHECK(st != NSTF_OK && strstr(nstf_last_error(), "rank 1") && strstr(nstf_last_error(), "stalled") && ms < 5000,
              "a stalled rank: %.0f ms: %s", ms, nstf_last_error());
        nstf_comm_free(j.c);
    }
    /* rank 2 fails before its all-gather: ranks 0 and 1 leave theirs */
    j.fail_rank = 2;
    CHECK(nstf_comm_create(be, R_MAX, 10000, &j.c) == NSTF_OK, "%s", nstf_last_error());
    if (j.c) {
        const double t0 = nstf_time_ms();
        const nstf_status st = nstf_comm_run(j.c, rank_job, &j);
        const double ms = nstf_time_ms() - t0;
        printf("  rank 2 failing before its all-gather: %.0f ms: %s\n", ms, nstf_last_error());
        CHECK(st != NSTF_OK && strstr(nstf_last_error(), "rank 2") && strstr(nstf_last_error(), "planted failure") &&
                  ms < 5000,
              "a failing rank: %.0f ms: %s", ms, nstf_last_error());
        nstf_comm_free(j.c);
    }
    for (int r = 0; r < R_MAX; r++) free(j.rs[r]), free(j.ar[r]), free(j.ag[r]), free(j.ag16[r]);
}

int main(void) {
    nstf_backend *be[R_MAX] = {NULL, NULL, NULL};
    const nstf_cpu_params cp = {1, false, false, 0};
    for (int r = 0; r < R_MAX; r++) CHECK(nstf_backend_cpu_create(&cp, &be[r]) == NSTF_OK, "%s", nstf_last_error());
    check_shard_len();
    test_rng rng = {0xc0ffeeu};
    static const struct { int64_t n, align; } sizes[] = {{1000003, 64}, {5, 1}, {100, 64}};
    for (int R = 1; R <= R_MAX; R++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) check_size(be, R, sizes[k].n, sizes[k].align, &rng);
    check_failures(be);
    for (int r = 0; r < R_MAX; r++) nstf_backend_free(be[r]);
    return test_finish("test_comm");
}
