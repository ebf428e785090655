/* matmul_i16.h — the 16-bit activation matmul of the 32-element block
 * types and the super-block types (matmul_i16.c), the path
 * nstf_cpu_matmul_a16 takes for them.
 * Internal to src/ops/cpu. */
#ifndef NSTF_OPS_CPU_MATMUL_I16_H
#define NSTF_OPS_CPU_MATMUL_I16_H

#include <stdbool.h>
#include <stdint.h>

#include "core/dtype.h"
#include "core/threadpool.h"
#include "ops/cpu/cpu_isa.h"

/* True for the types computed here. */
bool nstf_i16_type(nstf_type t);
/* True where nstf_cpu_matmul_a16 takes this path for n_tok rows (the
 * super-block types from 4 rows on). */
bool nstf_i16_serves(nstf_type t, int64_t n_tok);
/* The arena per block of 32 inputs and token, before alignment: the 32
 * int16 codes, then NSTF_I16_FLOATS fp32 values (d, s, sl, sh). */
#define NSTF_I16_FLOATS 4
#define NSTF_I16_BLOCK_BYTES (32 * 2 + NSTF_I16_FLOATS * 4)
/* Arena bytes for n_tok rows of n_in (a multiple of 32); false on
 * overflow or a bad shape. */
bool nstf_i16_bytes(int64_t n_tok, int64_t n_in, uint64_t *out);
/* One row x[nb * 32] to its 16-bit blocks: q[nb * 32], d[nb] = amax / 32767,
 * s[nb] = d * sum(q), sl[nb] and sh[nb] the same over each block's
 * elements 0..15 and 16..31. */
void nstf_i16_quantize_row(const float *x, int16_t *q, float *d, float *s, float *sl, float *sh, int64_t nb);
/* y[t, o] = W[o] . x[t] with x in 16-bit blocks built in `arena`
 * (nstf_i16_bytes(n_tok, n_in) bytes); wtype one of nstf_i16_type. */
void nstf_i16_matmul(nstf_pool *pool, nstf_type wtype, const void *w, const float *x, float *y, int64_t n_tok,
                     int64_t n_in, int64_t n_out, void *arena);

#endif
