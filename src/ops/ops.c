/* ops.c — names, descriptions and entry names generated from the op table. */
#include "ops/ops.h"

typedef struct op_row {
    const char *name, *desc, *ref, *cpu, *gpu;
} op_row;

static const op_row k_rows[NSTF_OP_N] = {
#define NSTF_X(U, l, ref, cpu, gpu, d) {#l, d, #ref, #cpu, #gpu},
    NSTF_OPS(NSTF_X)
#undef NSTF_X
};

#define ROW(op, field) ((unsigned)(op) < NSTF_OP_N ? k_rows[op].field : "?")

const char *nstf_op_name(nstf_op op) { return ROW(op, name); }
const char *nstf_op_desc(nstf_op op) { return ROW(op, desc); }
const char *nstf_op_ref_name(nstf_op op) { return ROW(op, ref); }
const char *nstf_op_cpu_name(nstf_op op) { return ROW(op, cpu); }
const char *nstf_op_gpu_name(nstf_op op) { return ROW(op, gpu); }
