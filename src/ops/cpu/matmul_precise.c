/* matmul_precise.c — the precise CPU matmul: quantized weights meet fp32
 * activations (no activation quantization). Slower than nstf_cpu_matmul but
 * comparable with an fp32 reference to rounding: used by `--precise` and by
 * the end-to-end test that must reproduce an fp32 implementation's greedy
 * tokens exactly.
 *
 * Each thread takes a range of weight rows; a row is dequantized in chunks of
 * CHUNK values into a stack buffer (AVX2: 8 values per instruction group),
 * then every token's fp32 activations are dotted with that chunk, so each
 * weight byte is read and unpacked once per call whatever n_tok is. */
#include <string.h>

#include "ops/ops.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define PRECISE_AVX2 1
#else
#define PRECISE_AVX2 0
#endif

#define CHUNK 1024 /* values per dequantized piece: 4 KiB of stack */

typedef struct {
    nstf_type wtype;
    const uint8_t *w;
    const float *x;
    float *y;
    int64_t n_tok, n_in, n_out;
    uint64_t row_bytes;
} precise_ctx;

/* Dequantize `n` values (a multiple of 32 for quantized types) starting at
 * element `i0` of a row. */
static void dequant_piece(nstf_type t, const uint8_t *row, int64_t i0, int64_t n, float *dst) {
#if PRECISE_AVX2
    if (t == NSTF_TYPE_Q4_0 || t == NSTF_TYPE_Q4_1 || t == NSTF_TYPE_Q8_0) {
        const int64_t bb = nstf_type_block_bytes(t);
        const uint8_t *b = row + (i0 / NSTF_QK) * bb;
        const __m128i m4 = _mm_set1_epi8(0x0f);
        for (int64_t k = 0; k < n; k += NSTF_QK, b += bb, dst += NSTF_QK) {
            /* byte offsets, not block structs: rows may be unaligned */
            if (t == NSTF_TYPE_Q8_0) {
                __m256 d = _mm256_set1_ps(nstf_fp16_to_f32(nstf_load_u16(b)));
                for (int j = 0; j < 4; j++) {
                    __m128i v = _mm_loadl_epi64((const __m128i *)(b + 2 + 8 * j));
                    _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v))));
                }
                continue;
            }
            const uint8_t *qs;
            __m256 d, m;
            if (t == NSTF_TYPE_Q4_1) {
                d = _mm256_set1_ps(nstf_fp16_to_f32(nstf_load_u16(b)));
                m = _mm256_set1_ps(nstf_fp16_to_f32(nstf_load_u16(b + 2)));
                qs = b + 4;
            } else {
                d = _mm256_set1_ps(nstf_fp16_to_f32(nstf_load_u16(b)));
                m = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f)); /* d * (q - 8) = d * q - 8d */
                qs = b + 2;
            }
            __m128i raw = _mm_loadu_si128((const __m128i *)qs);
            __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
            __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
            for (int j = 0; j < 4; j++) {
                __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[j]));
                _mm256_storeu_ps(dst + 8 * j, _mm256_fmadd_ps(d, f, m));
            }
        }
        return;
    }
#endif
    uint64_t off;
    nstf_type_row_bytes(t, i0, &off);
    nstf_dequantize_row(t, row + off, dst, n);
}

static float dot(const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    float s = 0.0f;
#if PRECISE_AVX2
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    }
    __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_movehdup_ps(h));
    s = _mm_cvtss_f32(h);
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static void precise_worker(void *p, int ith, int nth) {
    const precise_ctx *c = p;
    int64_t lo, hi;
    nstf_split_range(c->n_out, 1, ith, nth, &lo, &hi);
    float buf[CHUNK];
    for (int64_t o = lo; o < hi; o++) {
        const uint8_t *row = c->w + (uint64_t)o * c->row_bytes;
        for (int64_t t = 0; t < c->n_tok; t++) c->y[t * c->n_out + o] = 0.0f;
        for (int64_t i0 = 0; i0 < c->n_in; i0 += CHUNK) {
            int64_t n = c->n_in - i0 < CHUNK ? c->n_in - i0 : CHUNK;
            dequant_piece(c->wtype, row, i0, n, buf);
            for (int64_t t = 0; t < c->n_tok; t++)
                c->y[t * c->n_out + o] += dot(buf, c->x + t * c->n_in + i0, n);
        }
    }
}

void nstf_cpu_matmul_precise(nstf_cpu *cpu, nstf_type wtype, const void *w, const float *x, float *y,
                             int64_t n_tok, int64_t n_in, int64_t n_out) {
    precise_ctx c = {.wtype = wtype, .w = w, .x = x, .y = y, .n_tok = n_tok, .n_in = n_in, .n_out = n_out};
    if (n_tok <= 0 || n_out <= 0) return;
    if (!nstf_type_row_bytes(wtype, n_in, &c.row_bytes)) {
        for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = __builtin_nanf("");
        return;
    }
    nstf_pool_run(cpu ? cpu->pool : NULL, precise_worker, &c);
}
