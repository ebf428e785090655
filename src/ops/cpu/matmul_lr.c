/* matmul_lr.c — the CPU path of the MATMUL_LR op: a matrix stored as
 * low-rank factors, y = (x A^T) B^T, as two matmuls of the fast path
 * through the intermediate tmp [n_tok, rank]. Each is threaded and
 * vectorized as nstf_cpu_matmul is; the intermediate stays fp32. */
#include "ops/ops.h"

void nstf_cpu_matmul_lr(nstf_cpu *cpu, nstf_type ta, const void *a, nstf_type tb, const void *b, const float *x,
                        float *tmp, float *y, int64_t n_tok, int64_t n_in, int64_t rank, int64_t n_out) {
    if (cpu && cpu->precise) {
        nstf_cpu_matmul_precise(cpu, ta, a, x, tmp, n_tok, n_in, rank);
        nstf_cpu_matmul_precise(cpu, tb, b, tmp, y, n_tok, rank, n_out);
        return;
    }
    if (cpu && cpu->a16) { /* the default 16-bit activations, as the dense matmul */
        nstf_cpu_matmul_a16(cpu, ta, a, x, tmp, n_tok, n_in, rank);
        nstf_cpu_matmul_a16(cpu, tb, b, tmp, y, n_tok, rank, n_out);
        return;
    }
    nstf_cpu_matmul(cpu, ta, a, x, tmp, n_tok, n_in, rank);
    nstf_cpu_matmul(cpu, tb, b, tmp, y, n_tok, rank, n_out);
}
