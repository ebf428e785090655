/* bench_attn_cpu.c — the CPU attention alone, one thread, at SmolLM2-135M
 * shapes (9 query heads, 3 kv heads, head_dim 64, random q, k, v): a causal
 * prefill of N tokens (default 512) and a one-token decode over 8192 cached
 * positions; best of 40 rounds each, so a busy machine's slow rounds drop
 * out. Run two builds alternately to compare them.
 * Build (from the repository root, no CMake needed):
 *   cc -O2 -march=native -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc -Iinclude \
 *      bench/cpu_ops/bench_attn_cpu.c src/core/[a-z]*.c src/ops/ops.c src/ops/sparse.c src/ops/conv.c \
 *      src/ops/cpu/[a-z]*.c -lpthread -lm -o bench_attn_cpu
 * Run: ./bench_attn_cpu [N] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "ops/ops.h"
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    const int nh = 9, nkv = 3, hd = 64; const int64_t ctx = 8192, pre = argc > 1 ? atoi(argv[1]) : 512;
    float *q = malloc(pre * nh * hd * 4), *k = malloc(ctx * nkv * hd * 4), *v = malloc(ctx * nkv * hd * 4), *o = malloc(pre * nh * hd * 4);
    srand(1);
    for (int64_t i = 0; i < ctx * nkv * hd; i++) { k[i] = rand() / (float)RAND_MAX - 0.5f; v[i] = rand() / (float)RAND_MAX - 0.5f; }
    for (int64_t i = 0; i < pre * nh * hd; i++) q[i] = rand() / (float)RAND_MAX - 0.5f;
    nstf_pool *pool = NULL; nstf_pool_create(1, &pool); nstf_cpu cpu = {.pool = pool};
    double bp = 1e9, bd = 1e9;
    for (int r = 0; r < 40; r++) {
        double t0 = now_s(); nstf_cpu_attention(&cpu, q, k, v, o, pre, 0, nh, nkv, hd, 0.125f); double t1 = now_s();
        for (int i = 0; i < 5; i++) nstf_cpu_attention(&cpu, q, k, v, o, 1, ctx - 1, nh, nkv, hd, 0.125f);
        double t2 = now_s();
        if (t1 - t0 < bp) bp = t1 - t0;
        if ((t2 - t1) / 5 < bd) bd = (t2 - t1) / 5;
    }
    double macs = 2.0 * nh * hd * pre * (pre + 1) / 2;
    printf("prefill %lld: %.2f ms (%.1f GMAC/s)  decode 8192: %.3f ms  o[5]=%g\n", (long long)pre, bp * 1e3, macs / bp * 1e-9, bd * 1e3, o[5]);
    return 0;
}
