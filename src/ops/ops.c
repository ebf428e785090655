/* ops.c — names and descriptions generated from the op table. */
#include "ops/ops.h"

static const char *const k_names[NSTF_OP_N] = {
#define NSTF_X(U, l, d) #l,
    NSTF_OPS(NSTF_X)
#undef NSTF_X
};
static const char *const k_descs[NSTF_OP_N] = {
#define NSTF_X(U, l, d) d,
    NSTF_OPS(NSTF_X)
#undef NSTF_X
};

const char *nstf_op_name(nstf_op op) { return (unsigned)op < NSTF_OP_N ? k_names[op] : "?"; }
const char *nstf_op_desc(nstf_op op) { return (unsigned)op < NSTF_OP_N ? k_descs[op] : "?"; }
