/* gemv.cu — decode GEMV with fused dequantization: y[t, o] = sum_i
 * W[o, i] x[t, i] for 1..8 tokens, W as stored (F32/F16/BF16/Q8_0/Q4_0/
 * Q4_1), x bf16, fp32 accumulation, y F32 or BF16. The decode hot path:
 * its speed is the weight bytes over the memory bandwidth.
 *
 * Shape of the kernel:
 *  - A block of 256 threads owns GEMV_ROWS = 8 consecutive output rows
 *    (wave-agnostic: one row per wave on wave32, two on wave64), so the
 *    host never needs the wave width.
 *  - x is staged in shared memory as bf16, [NT][chunk]; the chunk is the
 *    whole of n_in when NT * n_in * 2 fits GEMV_SMEM_BYTES (every Llama
 *    shape at NT = 1), else x is walked in chunks. Staging once per block
 *    makes the L2 traffic for x 1/8 of the per-row re-reads.
 *  - A lane processes "units" of 8 weights: one 16-byte load for F16/BF16
 *    (two for F32), a quarter block for Q8_0 (fp16 scale + 8 bytes), four
 *    bytes of a Q4 block (8 nibbles: elements 4j..4j+3 and 16+4j..16+4j+3).
 *    Quantized blocks are only 2-byte aligned in a row (34/18/20-byte
 *    blocks), so they are read with 16-bit loads; a wave still reads whole
 *    contiguous runs of a row, so every loaded sector is used.
 *  - Each weight is loaded and decoded once and used for all NT tokens.
 *    GEMV_UNROLL units per lane are loaded before any is used, to keep
 *    enough bytes in flight per SM to cover the memory latency.
 *  - Quantized integers become floats with the 2^23 trick: the float with
 *    bits 0x4B000000 | n is 8388608 + n, so one OR and one FADD replace a
 *    (quarter-rate) integer-to-float conversion.
 *  - F32/F16/BF16 rows that are not 16-byte aligned (n_in % 8 != 0 or an
 *    unaligned pointer) take a scalar path, one element per unit. */
#include "gpu.h"

#include <stdio.h>

#define GEMV_THREADS 256
#define GEMV_ROWS 8
#define GEMV_SMEM_BYTES 32768 /* x staging: 7 blocks of 256 threads per SM on H100 */
#define GEMV_UNROLL 4
#define GEMV_MAX_NT 8

enum { GW_F32, GW_F16, GW_BF16, GW_Q8_0, GW_Q4_0, GW_Q4_1, GW_F32_S, GW_F16_S, GW_BF16_S };

/* Elements of W per unit (8, or 1 on the scalar paths). */
template <int WT> struct gemv_traits {
    static constexpr int elems = (WT >= GW_F32_S) ? 1 : 8;
};

static __device__ __forceinline__ uint32_t ld_u16(const uint8_t *p) {
    return *(const uint16_t *)p;
}
static __device__ __forceinline__ uint32_t ld_u32_a2(const uint8_t *p) {
    return ld_u16(p) | (ld_u16(p + 2) << 16); /* 2-byte aligned 32-bit read */
}

/* Raw bytes of one unit, loaded before decoding. */
struct gemv_raw {
    uint4 a, b;
};

template <int WT>
static __device__ __forceinline__ gemv_raw gemv_load(const uint8_t *__restrict__ row, int u) {
    gemv_raw r;
    if (WT == GW_BF16 || WT == GW_F16) {
        r.a = *(const uint4 *)(row + (size_t)u * 16);
    } else if (WT == GW_F32) {
        r.a = *(const uint4 *)(row + (size_t)u * 32);
        r.b = *(const uint4 *)(row + (size_t)u * 32 + 16);
    } else if (WT == GW_Q8_0) { /* quarter j of block b: scale + qs[8j..8j+7] */
        const uint8_t *blk = row + (size_t)(u >> 2) * NSTF_Q8_0_BYTES;
        const uint8_t *qs = blk + 2 + (u & 3) * 8;
        r.a.x = ld_u16(blk);
        r.a.y = ld_u32_a2(qs);
        r.a.z = ld_u32_a2(qs + 4);
    } else if (WT == GW_Q4_0) { /* bytes qs[4j..4j+3] of block b */
        const uint8_t *blk = row + (size_t)(u >> 2) * NSTF_Q4_0_BYTES;
        r.a.x = ld_u16(blk);
        r.a.y = ld_u32_a2(blk + 2 + (u & 3) * 4);
    } else if (WT == GW_Q4_1) {
        const uint8_t *blk = row + (size_t)(u >> 2) * NSTF_Q4_1_BYTES;
        r.a.x = ld_u16(blk);
        r.a.z = ld_u16(blk + 2);
        r.a.y = ld_u32_a2(blk + 4 + (u & 3) * 4);
    } else if (WT == GW_F32_S) {
        r.a.x = *(const uint32_t *)(row + (size_t)u * 4);
    } else { /* GW_F16_S, GW_BF16_S */
        r.a.x = ld_u16(row + (size_t)u * 2);
    }
    return r;
}

/* x offset (elements) of the k-th weight of unit u, within the chunk. */
template <int WT> static __device__ __forceinline__ int gemv_xoff(int u) {
    if (WT == GW_Q4_0 || WT == GW_Q4_1) return (u >> 2) * 32 + (u & 3) * 4;
    return u * gemv_traits<WT>::elems;
}

/* Accumulates unit u into acc[0..NT). xs is the staged chunk [NT][chunk]. */
template <int WT, int NT>
static __device__ __forceinline__ void gemv_unit(const gemv_raw &r, int u,
                                                 const uint16_t *__restrict__ xs, int chunk,
                                                 float (&acc)[NT]) {
    const int xo = gemv_xoff<WT>(u);
    if (gemv_traits<WT>::elems == 1) {
        float wv;
        if (WT == GW_F32_S) wv = __uint_as_float(r.a.x);
        else if (WT == GW_F16_S) wv = nstf_half_bits_to_float((unsigned short)r.a.x);
        else wv = __uint_as_float(r.a.x << 16);
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = fmaf(wv, __uint_as_float((uint32_t)xs[t * chunk + xo] << 16), acc[t]);
        return;
    }
    float wv[8];
    float scale = 1.0f;
    if (WT == GW_BF16) {
        const uint32_t p[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[2 * k] = nstf_bf16lo_to_float(p[k]);
            wv[2 * k + 1] = nstf_bf16hi_to_float(p[k]);
        }
    } else if (WT == GW_F16) {
        const uint32_t p[4] = {r.a.x, r.a.y, r.a.z, r.a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[2 * k] = nstf_half_bits_to_float((unsigned short)(p[k] & 0xffffu));
            wv[2 * k + 1] = nstf_half_bits_to_float((unsigned short)(p[k] >> 16));
        }
    } else if (WT == GW_F32) {
        wv[0] = __uint_as_float(r.a.x); wv[1] = __uint_as_float(r.a.y);
        wv[2] = __uint_as_float(r.a.z); wv[3] = __uint_as_float(r.a.w);
        wv[4] = __uint_as_float(r.b.x); wv[5] = __uint_as_float(r.b.y);
        wv[6] = __uint_as_float(r.b.z); wv[7] = __uint_as_float(r.b.w);
    } else if (WT == GW_Q8_0) {
        /* int8 -> float: flip the sign bit to get n + 128 in [0, 255]. */
        const uint32_t lo = r.a.y ^ 0x80808080u, hi = r.a.z ^ 0x80808080u;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[k] = __uint_as_float(0x4B000000u | ((lo >> (8 * k)) & 0xffu)) - 8388736.0f;
            wv[4 + k] = __uint_as_float(0x4B000000u | ((hi >> (8 * k)) & 0xffu)) - 8388736.0f;
        }
        scale = nstf_half_bits_to_float((unsigned short)r.a.x);
    } else { /* Q4_0 / Q4_1: low nibbles are elements 4j+k, high ones 16+4j+k */
        const uint32_t q = r.a.y;
        const float off = (WT == GW_Q4_0) ? 8388616.0f : 8388608.0f; /* 2^23 (+8 for Q4_0) */
#pragma unroll
        for (int k = 0; k < 4; k++) {
            wv[k] = __uint_as_float(0x4B000000u | ((q >> (8 * k)) & 0xfu)) - off;
            wv[4 + k] = __uint_as_float(0x4B000000u | ((q >> (8 * k + 4)) & 0xfu)) - off;
        }
        scale = nstf_half_bits_to_float((unsigned short)r.a.x);
        if (WT == GW_Q4_1) { /* w = d * n + m: dequantize once, share across tokens */
            const float m = nstf_half_bits_to_float((unsigned short)r.a.z);
#pragma unroll
            for (int k = 0; k < 8; k++) wv[k] = fmaf(scale, wv[k], m);
            scale = 1.0f;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const uint16_t *xt = xs + t * chunk + xo;
        uint32_t xw[4];
        if (WT == GW_Q4_0 || WT == GW_Q4_1) { /* x[4j..4j+3] and x[16+4j..16+4j+3] */
            const uint2 a = *(const uint2 *)xt, b = *(const uint2 *)(xt + 16);
            xw[0] = a.x; xw[1] = a.y; xw[2] = b.x; xw[3] = b.y;
        } else {
            const uint4 a = *(const uint4 *)xt;
            xw[0] = a.x; xw[1] = a.y; xw[2] = a.z; xw[3] = a.w;
        }
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s = fmaf(wv[2 * k], nstf_bf16lo_to_float(xw[k]), s);
            s = fmaf(wv[2 * k + 1], nstf_bf16hi_to_float(xw[k]), s);
        }
        acc[t] = (WT == GW_Q8_0 || WT == GW_Q4_0) ? fmaf(scale, s, acc[t]) : acc[t] + s;
    }
}

template <int WT, int NT, bool Y_BF16>
__global__ void __launch_bounds__(GEMV_THREADS)
gemv_kernel(const uint8_t *__restrict__ w, size_t row_bytes, const uint16_t *__restrict__ x,
            void *__restrict__ y, int n_in, int n_out, int chunk, int x_vec) {
    extern __shared__ uint4 gemv_smem[]; /* uint4: 16-byte aligned */
    uint16_t *xs = (uint16_t *)gemv_smem;
    constexpr int N_WAVES = GEMV_THREADS / NSTF_WAVE;
    constexpr int RPW = GEMV_ROWS / N_WAVES; /* rows per wave */
    static_assert(RPW >= 1 && RPW * N_WAVES == GEMV_ROWS, "GEMV_ROWS must be a multiple of the waves per block");
    constexpr int EL = gemv_traits<WT>::elems;
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int row0 = blockIdx.x * GEMV_ROWS + wave * RPW;

    float acc[RPW][NT];
#pragma unroll
    for (int r = 0; r < RPW; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;

    for (int c0 = 0; c0 < n_in; c0 += chunk) {
        const int len = min(chunk, n_in - c0);
        __syncthreads(); /* the previous chunk is consumed */
        if (x_vec) {     /* 16-byte copies: n_in % 8 == 0 and x aligned, so len % 8 == 0 */
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x * 8; i < len; i += GEMV_THREADS * 8)
                    *(uint4 *)(xs + t * chunk + i) = *(const uint4 *)(x + (size_t)t * n_in + c0 + i);
        } else {
            for (int t = 0; t < NT; t++)
                for (int i = threadIdx.x; i < len; i += GEMV_THREADS)
                    xs[t * chunk + i] = x[(size_t)t * n_in + c0 + i];
        }
        __syncthreads();
        const int n_units = len / EL;
        /* units before this chunk: c0 / EL (chunk is a multiple of 32) */
        const int ubase = c0 / EL;
#pragma unroll
        for (int r = 0; r < RPW; r++) {
            const int row = row0 + r;
            if (row >= n_out) break;
            const uint8_t *wr = w + (size_t)row * row_bytes;
            for (int u0 = lane; u0 < n_units; u0 += NSTF_WAVE * GEMV_UNROLL) {
                gemv_raw raw[GEMV_UNROLL];
#pragma unroll
                for (int k = 0; k < GEMV_UNROLL; k++) {
                    const int u = u0 + k * NSTF_WAVE;
                    if (u < n_units) raw[k] = gemv_load<WT>(wr, ubase + u);
                }
#pragma unroll
                for (int k = 0; k < GEMV_UNROLL; k++) {
                    const int u = u0 + k * NSTF_WAVE;
                    if (u < n_units) gemv_unit<WT, NT>(raw[k], u, xs, chunk, acc[r]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RPW; r++) {
        const int row = row0 + r;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float v = wave_reduce_sum(acc[r][t]);
            if (lane == t && row < n_out) {
                if (Y_BF16) ((nstf_bf16 *)y)[(size_t)t * n_out + row] = nstf_float_to_bf16(v);
                else ((float *)y)[(size_t)t * n_out + row] = v;
            }
        }
    }
}

/* ---- launcher ------------------------------------------------------------ */

struct gemv_plan {
    int wt;        /* GW_* */
    int chunk;     /* x elements staged per pass */
    int n_chunks;
    int x_vec;
    size_t smem;
};

static int gemv_wt(nstf_type t, bool vec) {
    switch (t) {
    case NSTF_TYPE_F32: return vec ? GW_F32 : GW_F32_S;
    case NSTF_TYPE_F16: return vec ? GW_F16 : GW_F16_S;
    case NSTF_TYPE_BF16: return vec ? GW_BF16 : GW_BF16_S;
    case NSTF_TYPE_Q8_0: return GW_Q8_0;
    case NSTF_TYPE_Q4_0: return GW_Q4_0;
    case NSTF_TYPE_Q4_1: return GW_Q4_1;
    }
    return -1;
}

static gemv_plan gemv_make_plan(nstf_type wtype, const void *w, const uint16_t *x, int nt,
                                int64_t n_in) {
    gemv_plan p;
    const bool x_al = ((uintptr_t)x % 16) == 0 && n_in % 8 == 0;
    const bool w_al = ((uintptr_t)w % 16) == 0 && n_in % 8 == 0;
    p.wt = gemv_wt(wtype, w_al && x_al);
    p.x_vec = x_al;
    /* chunk: a multiple of 32 elements (a quantized block; 16 bytes of bf16
     * x), as large as the staging budget allows for nt token rows. */
    int64_t cap = (GEMV_SMEM_BYTES / (2 * nt)) / 32 * 32;
    int64_t need = (n_in + 31) / 32 * 32;
    p.chunk = (int)(need < cap ? need : cap);
    p.n_chunks = (int)((n_in + p.chunk - 1) / p.chunk);
    p.smem = (size_t)nt * (size_t)p.chunk * 2;
    return p;
}

static const char *gemv_wt_name(int wt) {
    static const char *names[] = {"f32/vec", "f16/vec", "bf16/vec", "q8_0", "q4_0", "q4_1",
                                  "f32/scalar", "f16/scalar", "bf16/scalar"};
    return wt >= 0 && wt <= GW_BF16_S ? names[wt] : "?";
}

extern "C" const char *nstf_gpu_gemv_config(nstf_type wtype, const void *w, const uint16_t *x,
                                            int64_t n_tok, int64_t n_in) {
    static char buf[128];
    int nt = (int)(n_tok < GEMV_MAX_NT ? n_tok : GEMV_MAX_NT);
    if (nt < 1) nt = 1;
    gemv_plan p = gemv_make_plan(wtype, w, x, nt, n_in);
    snprintf(buf, sizeof buf, "%s nt=%d chunk=%dx%d x=%s", gemv_wt_name(p.wt), nt, p.chunk,
             p.n_chunks, p.x_vec ? "vec" : "scalar");
    return buf;
}

typedef void (*gemv_fn)(const uint8_t *, size_t, const uint16_t *, void *, int, int, int, int);

template <int WT, bool YB> static gemv_fn gemv_pick_nt(int nt) {
    switch (nt) {
    case 1: return gemv_kernel<WT, 1, YB>;
    case 2: return gemv_kernel<WT, 2, YB>;
    case 3: return gemv_kernel<WT, 3, YB>;
    case 4: return gemv_kernel<WT, 4, YB>;
    case 5: return gemv_kernel<WT, 5, YB>;
    case 6: return gemv_kernel<WT, 6, YB>;
    case 7: return gemv_kernel<WT, 7, YB>;
    default: return gemv_kernel<WT, 8, YB>;
    }
}

template <bool YB> static gemv_fn gemv_pick(int wt, int nt) {
    switch (wt) {
    case GW_F32: return gemv_pick_nt<GW_F32, YB>(nt);
    case GW_F16: return gemv_pick_nt<GW_F16, YB>(nt);
    case GW_BF16: return gemv_pick_nt<GW_BF16, YB>(nt);
    case GW_Q8_0: return gemv_pick_nt<GW_Q8_0, YB>(nt);
    case GW_Q4_0: return gemv_pick_nt<GW_Q4_0, YB>(nt);
    case GW_Q4_1: return gemv_pick_nt<GW_Q4_1, YB>(nt);
    case GW_F32_S: return gemv_pick_nt<GW_F32_S, YB>(nt);
    case GW_F16_S: return gemv_pick_nt<GW_F16_S, YB>(nt);
    default: return gemv_pick_nt<GW_BF16_S, YB>(nt);
    }
}

extern "C" nstf_status nstf_gpu_gemv(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                                     nstf_type y_type, int64_t n_tok, int64_t n_in,
                                     int64_t n_out, void *stream) {
    if (!w || !x || !y || n_tok < 0 || n_in <= 0 || n_out < 0)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv: bad arguments (n_tok %lld, n_in %lld, n_out %lld)",
                              (long long)n_tok, (long long)n_in, (long long)n_out);
    if (gemv_wt(wtype, true) < 0)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_gemv: weight type %s",
                              nstf_type_name(wtype));
    if (y_type != NSTF_TYPE_F32 && y_type != NSTF_TYPE_BF16)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_gemv: output type %s (F32 or BF16)",
                              nstf_type_name(y_type));
    uint64_t row_bytes = 0;
    if (!nstf_type_row_bytes(wtype, n_in, &row_bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv: n_in %lld is not a whole number of %s blocks",
                              (long long)n_in, nstf_type_name(wtype));
    if (n_in > INT32_MAX / 2 || n_out > INT32_MAX - GEMV_ROWS)
        return nstf_set_error(NSTF_ERR_RANGE, "nstf_gpu_gemv: n_in %lld / n_out %lld too large",
                              (long long)n_in, (long long)n_out);
    if (n_tok == 0 || n_out == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const size_t ysz = y_type == NSTF_TYPE_BF16 ? 2 : 4;
    const unsigned grid = (unsigned)((n_out + GEMV_ROWS - 1) / GEMV_ROWS);
    for (int64_t t0 = 0; t0 < n_tok; t0 += GEMV_MAX_NT) {
        const int nt = (int)(n_tok - t0 < GEMV_MAX_NT ? n_tok - t0 : GEMV_MAX_NT);
        const uint16_t *xt = x + t0 * n_in;
        gemv_plan p = gemv_make_plan(wtype, w, xt, nt, n_in);
        gemv_fn fn = y_type == NSTF_TYPE_BF16 ? gemv_pick<true>(p.wt, nt) : gemv_pick<false>(p.wt, nt);
        fn<<<grid, GEMV_THREADS, p.smem, s>>>((const uint8_t *)w, (size_t)row_bytes, xt,
                                             (char *)y + (size_t)(t0 * n_out) * ysz, (int)n_in,
                                             (int)n_out, p.chunk, p.x_vec);
        GPU_LAUNCH_CHECK(s);
    }
    return NSTF_OK;
}
