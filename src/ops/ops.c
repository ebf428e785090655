/* ops.c — names, descriptions and entry names generated from the op table. */
#include "ops/ops.h"

#include <math.h>
#include <string.h>

#include "core/dtype.h"
#include "core/mem.h"

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

bool nstf_kv_row_bytes(bool q8, int es, int64_t kv_dim, uint64_t *out) {
    if (kv_dim <= 0 || (!q8 && es <= 0) || (q8 && kv_dim % 32 != 0)) return false;
    if (!q8) return nstf_mul_ok((uint64_t)kv_dim, (uint64_t)es, out);
    const uint64_t b = (uint64_t)kv_dim + (uint64_t)kv_dim / 16;
    *out = (b + 15) & ~(uint64_t)15;
    return true;
}

void nstf_kv_q8_store(const float *x, int64_t kv_dim, uint8_t *row) {
    for (int64_t b = 0; b < kv_dim / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        /* the scale stays finite in fp16 (values past 127 x 65504 clip), a
         * NaN value becomes code 0 (as the GPU's float-to-int does) */
        const float d = fminf(amax / 127.0f, 65504.0f), id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(xb[i] * id);
            v = v != v ? 0.0f : v < -127.0f ? -127.0f : v > 127.0f ? 127.0f : v;
            row[32 * b + i] = (uint8_t)(int8_t)v;
        }
        const uint16_t h = nstf_f32_to_fp16(d);
        memcpy(row + kv_dim + 2 * b, &h, 2);
    }
}

void nstf_kv_q8_load(const uint8_t *row, int64_t kv_dim, float *x) {
    for (int64_t b = 0; b < kv_dim / 32; b++) {
        const float d = nstf_fp16_to_f32(nstf_load_u16(row + kv_dim + 2 * b));
        for (int i = 0; i < 32; i++) x[32 * b + i] = d * (float)(int8_t)row[32 * b + i];
    }
}
