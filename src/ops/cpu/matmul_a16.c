/* matmul_a16.c — the default CPU matmul: quantized weights meet activations
 * carried to about 16 bits as two 8-bit blocks, on the fast kernel of
 * matmul.c.
 *
 * The fast kernel quantizes each block of 32 activations to int8 (x ~ d q,
 * d = amax / 127), which loses up to d / 2 per value: enough to flip the
 * greedy token where two candidates are within a few tenths of a logit
 * (docs/PERFORMANCE.md, "CPU accuracy"). Here every row x is followed by
 * its rounding residual r = x - d q, and the kernel runs once over the 2n
 * rows [x0, r0, x1, r1, ...]: the kernel quantizes x exactly as the residual
 * was computed (nstf_cpu_act_residual uses its quantizer) and r to its own
 * 8-bit blocks (scale d / 254 or finer), so y_t = W x_t + W r_t carries the
 * activations to within about amax / 2^15 per block. Interleaving puts x_t
 * and r_t in the same register tile, so each weight block is unpacked once
 * for both (prefill and decode alike); the cost over the 8-bit kernel is
 * the second integer dot product per block, measured in docs/PERFORMANCE.md.
 *
 * Scratch: the stacked rows [2 chunk, n_in] and their outputs [2 chunk,
 * n_out] live in an arena of their own (a16_rows / a16_bytes), sized once by
 * nstf_cpu_reserve_a16; rows go through in chunks that fit it. The fast
 * kernel's own arena is reserved for 2 chunk rows. Float weight types and
 * calls beyond the reservation run nstf_cpu_matmul (fp32 activations for
 * float weights; its fallback otherwise).
 *
 * The 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) and
 * the super-block types (Q2_K..Q6_K, IQ4_XS) take another road to the same
 * precision: their activations go to int16 blocks of 32 (d = amax / 32767)
 * in the same arena, and one 16-bit integer dot product per block replaces
 * the two 8-bit ones (matmul_i16.c). The super-block types use the two
 * levels below 4 rows (decode). */
#include <string.h>

#include "core/mem.h"
#include "ops/cpu/matmul_i16.h"
#include "ops/ops.h"

/* floats of the arena: rows [2 c, n_in] then outputs [2 c, n_out] */
static bool a16_floats(int64_t chunk, int64_t n_in, int64_t n_out, uint64_t *out) {
    uint64_t rows, outs, tot;
    if (chunk < 1 || n_in < 0 || n_out < 0) return false;
    if (!nstf_mul_ok(2 * (uint64_t)chunk, (uint64_t)n_in, &rows) || !nstf_mul_ok(2 * (uint64_t)chunk, (uint64_t)n_out, &outs))
        return false;
    if (!nstf_add_ok(rows, outs, &tot)) return false;
    *out = tot;
    return true;
}

nstf_status nstf_cpu_reserve_a16(nstf_cpu *cpu, int64_t n_tok, int64_t n_in, int64_t n_out) {
    if (!cpu || n_tok < 1 || n_in < 1 || n_out < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_cpu_reserve_a16: bad shape");
    uint64_t n, bytes;
    if (!a16_floats(n_tok, n_in, n_out, &n) || !nstf_mul_ok(n, sizeof(float), &bytes) || bytes > SIZE_MAX)
        return nstf_set_error(NSTF_ERR_RANGE, "nstf_cpu_reserve_a16: %lld x (%lld + %lld) overflows", (long long)n_tok,
                              (long long)n_in, (long long)n_out);
    /* at least the 16-bit blocks of n_tok rows (their alignment outweighs
     * two fp32 rows where rows are short) */
    uint64_t i16b;
    if (nstf_i16_bytes(n_tok, n_in, &i16b) && i16b > bytes) bytes = i16b;
    NSTF_TRY(nstf_cpu_reserve(cpu, 2 * n_tok, n_in));
    if (bytes <= cpu->a16_bytes) return NSTF_OK;
    void *p = nstf_alloc((size_t)bytes, "CPU 16-bit activation rows");
    if (!p) return NSTF_ERR_OOM;
    nstf_free(cpu->a16_rows);
    cpu->a16_rows = p;
    cpu->a16_bytes = (size_t)bytes;
    return NSTF_OK;
}

void nstf_cpu_release_a16(nstf_cpu *cpu) {
    if (!cpu) return;
    nstf_free(cpu->a16_rows);
    cpu->a16_rows = NULL;
    cpu->a16_bytes = 0;
}

typedef struct {
    nstf_type wtype;
    const float *x;
    float *rows, *ys, *y;
    int64_t t0, n, n_in, n_out;
} a16_ctx;

/* rows[2i] = x[t0 + i], rows[2i + 1] = its residual */
static void stack_fn(void *p, int ith, int nth) {
    const a16_ctx *c = p;
    int64_t lo, hi;
    nstf_split_range(c->n, 1, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *x = c->x + (c->t0 + i) * c->n_in;
        float *hi_row = c->rows + 2 * i * c->n_in;
        memcpy(hi_row, x, (size_t)c->n_in * sizeof(float));
        nstf_cpu_act_residual(c->wtype, x, hi_row + c->n_in, c->n_in);
    }
}

/* y[t0 + i] = ys[2i] + ys[2i + 1] */
static void sum_fn(void *p, int ith, int nth) {
    const a16_ctx *c = p;
    int64_t lo, hi;
    nstf_split_range(c->n, 1, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        const float *a = c->ys + 2 * i * c->n_out, *b = a + c->n_out;
        float *y = c->y + (c->t0 + i) * c->n_out;
        for (int64_t o = 0; o < c->n_out; o++) y[o] = a[o] + b[o];
    }
}

void nstf_cpu_matmul_a16(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y, int64_t n_tok,
                         int64_t n_in, int64_t n_out) {
    if (n_tok <= 0 || n_out <= 0) return;
    /* the chunk of rows the arena holds for this shape */
    int64_t chunk = 0;
    if (cpu && cpu->a16_rows && n_in > 0 && nstf_cpu_act_residual(wtype, NULL, NULL, n_in)) {
        const uint64_t per = 2 * ((uint64_t)n_in + (uint64_t)n_out), cap = cpu->a16_bytes / sizeof(float);
        chunk = (int64_t)(cap / per);
        if (chunk > n_tok) chunk = n_tok;
    }
    if (chunk < 1) {
        nstf_cpu_matmul(cpu, wtype, w, x, y, n_tok, n_in, n_out);
        return;
    }
    uint64_t per_tok;
    if (nstf_i16_serves(wtype, n_tok) && nstf_i16_bytes(1, n_in, &per_tok)) {
        /* rows of 16-bit blocks (NSTF_I16_BLOCK_BYTES per 32 values, plus
         * alignment): the arena reserved for at least one token holds one
         * or more */
        int64_t n16 = (int64_t)(cpu->a16_bytes / ((uint64_t)n_in / 32 * NSTF_I16_BLOCK_BYTES));
        if (n16 > n_tok) n16 = n_tok;
        uint64_t need;
        while (n16 > 0 && (!nstf_i16_bytes(n16, n_in, &need) || need > cpu->a16_bytes)) n16--;
        for (int64_t t0 = 0; n16 > 0 && t0 < n_tok; t0 += n16) {
            const int64_t n = n_tok - t0 < n16 ? n_tok - t0 : n16;
            nstf_i16_matmul(cpu->pool, wtype, w, x + t0 * n_in, y + t0 * n_out, n, n_in, n_out, cpu->a16_rows);
        }
        if (n16 > 0) return;
    }
    a16_ctx c = {.wtype = wtype, .x = x, .y = y, .n_in = n_in, .n_out = n_out};
    c.rows = cpu->a16_rows;
    for (c.t0 = 0; c.t0 < n_tok; c.t0 += chunk) {
        c.n = n_tok - c.t0 < chunk ? n_tok - c.t0 : chunk;
        c.ys = c.rows + 2 * c.n * n_in;
        if (c.n < 4) stack_fn(&c, 0, 1);
        else nstf_pool_run(cpu->pool, stack_fn, &c);
        nstf_cpu_matmul(cpu, wtype, w, c.rows, c.ys, 2 * c.n, n_in, n_out);
        if (c.n * n_out < 4096) sum_fn(&c, 0, 1);
        else nstf_pool_run(cpu->pool, sum_fn, &c);
    }
}
