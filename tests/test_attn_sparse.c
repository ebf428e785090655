/* test_attn_sparse.c — properties of the CPU sparse decode attention
 * (ATTN_SPARSE, ops.h) that the op-comparison case does not cover:
 *  - with topk covering every block the output is the dense attention's,
 *    bit for bit (2 threads: the split-KV path; and deterministic mode);
 *  - a planted needle (one key along a query head, 4x its norm) lies in a
 *    selected block at every trial (20 seeds, random positions, topk 2),
 *    and its block takes the largest attention mass;
 *  - the block statistics after writes, a rewind that rewrites positions
 *    mid-block (stale rows past the last written position must not count),
 *    and decode steps: exactly the min / max of the rows 0..last of each
 *    block; a block's mass starts at 0 when its first row is written, and
 *    a step with every block selected moves the total mass to
 *    d * total + (1 - d) (the probabilities sum to 1), within 1e-6. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/ops.h"
#include "test_util.h"

enum { NH = 6, NKV = 2, HD = 64, CTX = 1536, B = 16, NB = CTX / B };
#define KVD (NKV * HD)
#define QD (NH * HD)

static float g_k[CTX * KVD], g_v[CTX * KVD], g_q[CTX * QD], g_out[QD], g_dense[QD];
static float g_min[NB * KVD], g_max[NB * KVD], g_mass[NB * NKV];
static int32_t g_sel[CTX * NKV * 256];
static float *g_work;

static void fill(test_rng *r, float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal(r);
}

/* positions [p0, p0 + n) through the op (rows already in g_k, g_v) */
static void step(nstf_cpu *cpu, int64_t p0, int64_t n, int topk, int window, float *out) {
    nstf_cpu_attn_sparse(cpu, g_q + p0 * QD, g_k, g_v, out, g_min, g_max, g_mass, 0.75f, g_sel, g_work, n, p0, NH, NKV,
                         HD, 0.125f, B, topk, window);
}

static void test_dense_bitwise(nstf_cpu *cpu, test_rng *r, const char *what) {
    fill(r, g_k, CTX * KVD), fill(r, g_v, CTX * KVD), fill(r, g_q, CTX * QD);
    static float pre[64 * QD];
    const int64_t positions[3] = {700, 767, 40};
    for (int i = 0; i < 3; i++) {
        const int64_t p = positions[i];
        memset(g_mass, 0, sizeof g_mass);
        for (int64_t p0 = 0; p0 < p; p0 += 64) step(cpu, p0, p - p0 < 64 ? p - p0 : 64, NB, 32, pre);
        step(cpu, p, 1, NB, 32, g_out);
        nstf_cpu_attention_sw(cpu, g_q + p * QD, g_k, g_v, g_dense, 1, p, NH, NKV, HD, 0.125f, 0);
        CHECK(memcmp(g_out, g_dense, sizeof g_out) == 0, "%s: step at %lld with every block selected is not the dense "
              "attention bitwise", what, (long long)p);
        float tot = 0;
        for (int64_t b = 0; b < NB * NKV; b++) tot += g_mass[b];
        CHECK(fabsf(tot - 0.25f * NKV) < 1e-6f, "%s: total mass %.8f after one step from 0, expected %.8f", what, tot,
              0.25f * NKV);
    }
}

static void test_needle(nstf_cpu *cpu) {
    const int64_t ms = nstf_sparse_max_sel(2, B, 32);
    int missed = 0, not_heaviest = 0;
    for (int trial = 0; trial < 20; trial++) {
        test_rng r = {1000u + (uint64_t)trial * 7919u};
        const int64_t p = 200 + (int64_t)(rng_next(&r) % 400); /* the decode position */
        fill(&r, g_k, (p + 1) * KVD), fill(&r, g_v, (p + 1) * KVD), fill(&r, g_q, (p + 1) * QD);
        const int64_t jn = B + (int64_t)(rng_next(&r) % (uint64_t)(p - 32 - 2 * B)); /* past block 0, before the window */
        const int h = (int)(rng_next(&r) % NH), g = h / (NH / NKV);
        for (int c = 0; c < HD; c++) g_k[jn * KVD + g * HD + c] = 4.0f * g_q[p * QD + h * HD + c];
        memset(g_mass, 0, sizeof g_mass);
        static float pre[64 * QD];
        for (int64_t p0 = 0; p0 < p; p0 += 64) step(cpu, p0, p - p0 < 64 ? p - p0 : 64, 2, 32, pre);
        step(cpu, p, 1, 2, 32, g_out);
        bool found = false;
        for (int64_t i = 0; i < ms; i++) found |= g_sel[g * ms + i] == (int32_t)(jn / B);
        missed += !found;
        int64_t heaviest = 0;
        for (int64_t b = 1; b <= p / B; b++)
            if (g_mass[b * NKV + g] > g_mass[heaviest * NKV + g]) heaviest = b;
        not_heaviest += heaviest != jn / B;
    }
    CHECK(missed == 0, "needle: its block not selected in %d of 20 trials", missed);
    CHECK(not_heaviest == 0, "needle: its block not the heaviest in %d of 20 trials", not_heaviest);
}

static int stats_errors(int64_t last) {
    int bad = 0;
    for (int64_t b = 0; b * B <= last; b++)
        for (int c = 0; c < KVD; c++) {
            float lo = INFINITY, hi = -INFINITY;
            for (int64_t j = b * B; j < (b + 1) * B && j <= last; j++) {
                lo = fminf(lo, g_k[j * KVD + c]);
                hi = fmaxf(hi, g_k[j * KVD + c]);
            }
            bad += g_min[b * KVD + c] != lo || g_max[b * KVD + c] != hi;
        }
    return bad;
}

static void test_stats(nstf_cpu *cpu, test_rng *r) {
    static float pre[64 * QD];
    fill(r, g_k, CTX * KVD), fill(r, g_v, CTX * KVD), fill(r, g_q, CTX * QD);
    for (int64_t i = 0; i < NB * NKV; i++) g_mass[i] = 0.5f;
    step(cpu, 0, 37, 3, 20, pre); /* blocks 0..2, the last partial */
    CHECK(stats_errors(36) == 0, "stats after a prefill of 37: %d values wrong", stats_errors(36));
    int nonzero = 0;
    for (int64_t i = 0; i < 3 * NKV; i++) nonzero += g_mass[i] != 0.0f;
    CHECK(nonzero == 0 && g_mass[3 * NKV] == 0.5f, "mass of newly written blocks not reset (or an unwritten one reset)");
    for (int64_t p = 37; p < 300; p++) step(cpu, p, 1, 3, 20, g_out);
    CHECK(stats_errors(299) == 0, "stats after decode to 299: %d values wrong", stats_errors(299));
    /* rewind to 250 (mid-block 15) with other keys: rows 250..299 are stale,
     * and only 250..260 are written again */
    for (int64_t i = 250 * KVD; i < 300 * KVD; i++) g_k[i] = 0.1f * g_k[i];
    for (int64_t i = 261 * KVD; i < 300 * KVD; i++) g_k[i] = 100.0f; /* stale rows: must not count */
    step(cpu, 250, 8, 3, 20, pre);
    for (int64_t p = 258; p <= 260; p++) step(cpu, p, 1, 3, 20, g_out);
    CHECK(stats_errors(260) == 0, "stats after a rewind to 250 and rewrites to 260: %d values wrong",
          stats_errors(260));
    /* the blocks of the step (0..261 / B) decay and gain its probabilities */
    float before = 0, after = 0;
    for (int64_t i = 0; i <= 261 / B * NKV + NKV - 1; i++) before += g_mass[i];
    step(cpu, 261, 1, NB, 20, g_out);
    for (int64_t i = 0; i <= 261 / B * NKV + NKV - 1; i++) after += g_mass[i];
    const float want = 0.75f * before + 0.25f * NKV;
    CHECK(fabsf(after - want) < 1e-5f * fmaxf(1.0f, want), "mass total %.7f after a full step, expected %.7f", after,
          want);
}

int main(void) {
    g_work = malloc((size_t)nstf_sparse_work_floats(1, NH, NKV, HD, CTX, NB, B, 32) * 4);
    nstf_pool *pool = NULL;
    CHECK(nstf_pool_create(2, &pool) == NSTF_OK, "%s", nstf_last_error());
    nstf_cpu cpu = {.pool = pool};
    test_rng r = {0x5eed};
    test_dense_bitwise(&cpu, &r, "2 threads");
    nstf_cpu det = {.pool = pool, .deterministic = true};
    test_dense_bitwise(&det, &r, "deterministic");
    test_needle(&cpu);
    test_stats(&cpu, &r);
    nstf_cpu_release(&cpu);
    nstf_cpu_release(&det);
    nstf_pool_free(pool);
    free(g_work);
    return test_finish("test_attn_sparse");
}
