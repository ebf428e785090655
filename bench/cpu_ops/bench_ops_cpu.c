/* bench_ops_cpu.c — wall-clock timing of the fast CPU ops (all but matmul)
 * beside their scalar references, at SmolLM2-135M shapes (dim 576, 9 heads,
 * 3 kv heads, head_dim 64, ffn 1536, vocab 49152), for several pool sizes.
 * Build (from the repository root, no CMake needed):
 *   cc -O2 -march=native -std=c11 -D_POSIX_C_SOURCE=200809L -Isrc -Iinclude \
 *      bench/cpu_ops/bench_ops_cpu.c src/core/[a-z]*.c src/ops/ops.c src/ops/sparse.c src/ops/conv.c \
 *      src/ops/cpu/[a-z]*.c -lpthread -lm -o bench_ops_cpu
 * Run: ./bench_ops_cpu [max_threads] */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "ops/ops.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* dst = best of 5 runs of `reps` calls of stmt, in ms per call */
#define TIME_MS(dst, reps, stmt)                                   \
    do {                                                           \
        double best_ = 1e30;                                       \
        for (int k_ = 0; k_ < 5; k_++) {                           \
            double t0_ = now_s();                                  \
            for (int r_ = 0; r_ < (reps); r_++) { stmt; }          \
            double dt_ = (now_s() - t0_) / (reps);                 \
            best_ = dt_ < best_ ? dt_ : best_;                     \
        }                                                          \
        (dst) = best_ * 1e3;                                       \
    } while (0)

int main(int argc, char **argv) {
    int max_threads = argc > 1 ? atoi(argv[1]) : nstf_cpu_count();
    const int nh = 9, nkv = 3, hd = 64, dim = 576, ffn = 1536, vocab = 49152;
    const int64_t ctx = 8192, pre = 512;
    float *q = malloc(pre * nh * hd * 4), *k = malloc(ctx * nkv * hd * 4);
    float *v = malloc(ctx * nkv * hd * 4), *o = malloc(pre * nh * hd * 4);
    float *x = malloc(pre * ffn * 4), *y = malloc(pre * ffn * 4), *z = malloc(pre * ffn * 4);
    float *logits = malloc((int64_t)vocab * 4);
    int32_t pos[512], am;
    for (int64_t i = 0; i < ctx * nkv * hd; i++) { k[i] = (float)(i % 7) * 0.1f; v[i] = (float)(i % 5) * 0.1f; }
    for (int64_t i = 0; i < pre * nh * hd; i++) q[i] = (float)(i % 3) * 0.1f;
    for (int64_t i = 0; i < pre * ffn; i++) { x[i] = (float)(i % 11) * 0.1f - 0.5f; y[i] = 0.3f; }
    for (int i = 0; i < vocab; i++) logits[i] = (float)((i * 7919) % 1000);
    for (int i = 0; i < 512; i++) pos[i] = i;

    printf("op (SmolLM2-135M shapes)              ref ms");
    for (int nt = 1; nt <= max_threads; nt *= 2) printf("   %2d thr", nt);
    printf("\n");
    struct { const char *name; double ref; double fast[8]; } rows[8];
    int n_rows = 0, n_cfg = 0;
    for (int nt = 1; nt <= max_threads; nt *= 2, n_cfg++) {
        nstf_pool *pool = NULL;
        if (nstf_pool_create(nt, &pool) != NSTF_OK) return 1;
        nstf_cpu cpu = {pool, NULL, 0};
        int r = 0;
        rows[r].name = "attention decode, ctx 8192";
        TIME_MS(rows[r++].fast[n_cfg], 20, nstf_cpu_attention(&cpu, q, k, v, o, 1, ctx - 1, nh, nkv, hd, 0.125f));
        rows[r].name = "attention prefill, 512 tokens";
        TIME_MS(rows[r++].fast[n_cfg], 2, nstf_cpu_attention(&cpu, q, k, v, o, pre, 0, nh, nkv, hd, 0.125f));
        rows[r].name = "rope norm, 512 x 9 x 64";
        TIME_MS(rows[r++].fast[n_cfg], 20, nstf_cpu_rope(&cpu, q, pos, pre, nh, hd, 100000.0f, NSTF_ROPE_NORM));
        rows[r].name = "rmsnorm, 512 x 576";
        TIME_MS(rows[r++].fast[n_cfg], 50, nstf_cpu_rmsnorm(&cpu, x, y, z, pre, dim, 1e-5f));
        rows[r].name = "swiglu, 512 x 1536";
        TIME_MS(rows[r++].fast[n_cfg], 50, nstf_cpu_swiglu(&cpu, x, y, z, pre * ffn));
        rows[r].name = "add, 512 x 576";
        TIME_MS(rows[r++].fast[n_cfg], 50, nstf_cpu_add(&cpu, x, y, z, pre * dim));
        rows[r].name = "argmax, 49152";
        TIME_MS(rows[r++].fast[n_cfg], 200, nstf_cpu_argmax(&cpu, logits, &am, 1, vocab));
        n_rows = r;
        nstf_pool_free(pool);
    }
    TIME_MS(rows[0].ref, 1, nstf_ref_attention(q, k, v, o, 1, ctx - 1, nh, nkv, hd, 0.125f));
    TIME_MS(rows[1].ref, 1, nstf_ref_attention(q, k, v, o, pre, 0, nh, nkv, hd, 0.125f));
    TIME_MS(rows[2].ref, 2, nstf_ref_rope(q, pos, pre, nh, hd, 100000.0f, NSTF_ROPE_NORM));
    TIME_MS(rows[3].ref, 5, nstf_ref_rmsnorm(x, y, z, pre, dim, 1e-5f));
    TIME_MS(rows[4].ref, 5, nstf_ref_swiglu(x, y, z, pre * ffn));
    TIME_MS(rows[5].ref, 5, nstf_ref_add(x, y, z, pre * dim));
    TIME_MS(rows[6].ref, 20, nstf_ref_argmax(logits, &am, 1, vocab));
    for (int r = 0; r < n_rows; r++) {
        printf("%-36s %9.3f", rows[r].name, rows[r].ref);
        for (int c = 0; c < n_cfg; c++) printf(" %8.3f", rows[r].fast[c]);
        printf("\n");
    }
    free(q); free(k); free(v); free(o); free(x); free(y); free(z); free(logits);
    return 0;
}
