/* matmul_stub.c — TEMPORARY STUB, delete when the real src/ops/cpu/matmul.c
 * (branch `matmul`) is merged. It gives nstf_cpu_matmul, nstf_cpu_reserve
 * and nstf_cpu_release trivial bodies so that the library links: the
 * matmul calls the scalar reference and no scratch is ever reserved. */
#include "core/mem.h"
#include "ops/ops.h"

nstf_status nstf_cpu_reserve(nstf_cpu *cpu, int64_t n_tok, int64_t n_in) {
    (void)cpu; (void)n_tok; (void)n_in;
    return NSTF_OK;
}

void nstf_cpu_release(nstf_cpu *cpu) {
    nstf_free(cpu->scratch);
    cpu->scratch = NULL;
    cpu->scratch_bytes = 0;
}

void nstf_cpu_matmul(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y,
                     int64_t n_tok, int64_t n_in, int64_t n_out) {
    (void)cpu;
    nstf_ref_matmul(wtype, w, x, y, n_tok, n_in, n_out);
}
