/* gen_model.h — random Llama GGUF files at named shapes (cmd_gen_model.c),
 * for benchmarks and for `nstf train --shape`. */
#ifndef NSTF_TOOLS_GEN_MODEL_H
#define NSTF_TOOLS_GEN_MODEL_H

#include <stdint.h>

#include "core/dtype.h"
#include "nstf.h"

/* Write the model of shape `shape_name` (tiny, smollm2-135m, llama32-1b,
 * llama3-8b) with matrices N(0, 0.02) in `type`, norms exactly 1 (a
 * from-scratch initialization) and a byte-level tokenizer. */
nstf_status gen_model_file(const char *shape_name, nstf_type type, const char *path, uint64_t seed);

#endif
