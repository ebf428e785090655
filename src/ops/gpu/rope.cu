/* rope.cu — rotary position embedding, in place, on q and k (bf16), and its
 * backward (the rotation by -theta, on the gradients of q and k); NORM
 * rotates (x[2i], x[2i+1]), NEOX (x[i], x[i + d/2]).
 *
 * The angle depends on the token and the pair, not on the head, so a thread
 * owns V consecutive pairs of one token: it forms their V cos/sin once and
 * applies them to that token's every head, q's then k's, ROPE_HEADS heads
 * loaded before any is rotated (loads in flight). Blocks are
 * (half / V threads, tokens); index math inside a token is 32-bit, the
 * token offset 64-bit. Accesses are as wide as the pointers and strides
 * allow: NORM reads a thread's 2V elements of a head in one load (16 bytes
 * at V = 4), NEOX its V elements of each half (8 bytes at V = 4); the last
 * fallback (V = 1, 2-byte accesses) takes any even head_dim and any
 * alignment.
 *
 * theta_i = pos * base^(-2i/head_dim) is formed to about double accuracy
 * without double math on the device: the host computes each inverse
 * frequency in double and passes it as a float pair hi + lo (a kernel
 * argument, <= 1 KiB); the product with the integer position is split
 * exactly (fmaf), range-reduced to [-pi, pi] with a two-part 2pi
 * (Cody-Waite), and only then given to the fast hardware sin/cos. At
 * position 10^5 a plain fp32 angle would be off by ~4e-3 rad. Frequency
 * factors (Llama 3.x) divide the pair on the device (nstf_rope_scale), as
 * the fused GEMV's epilogue does: the same functions on the same values, so
 * both round alike. */
#include "gpu.h"
#include "fused_math.h"

#include <limits.h>
#include <math.h>

#define ROPE_THREADS 256
#define ROPE_MAX_PAIRS 128 /* head_dim <= 256 */
/* Heads a thread loads before it rotates them (loads in flight); 2 within
 * CDNA's 64 registers a lane at full occupancy. */
#define ROPE_HEADS (NSTF_WAVE == 64 ? 2 : 4)

/* Full occupancy on AMD (8 waves a SIMD on CDNA, 16 on RDNA3; the gates of
 * docs/amd_gates.tsv): without the bound the compiler hoists loads into
 * more registers than that leaves. HIP's second launch bound is waves per
 * SIMD; CUDA's (blocks per SM) is not wanted. */
#if defined(NSTF_GPU_HIP)
#define ROPE_BOUNDS __launch_bounds__(ROPE_THREADS, NSTF_WAVE == 64 ? 8 : 16)
#else
#define ROPE_BOUNDS __launch_bounds__(ROPE_THREADS)
#endif

struct rope_freqs {
    float hi[ROPE_MAX_PAIRS], lo[ROPE_MAX_PAIRS];
};

/* The kernel's variants: the mode, V pairs per thread, and whether NORM's
 * pair is read as one 32-bit word (VEC) or as two bf16 (the fallback). */
enum rope_variant {
    ROPE_NORM_V4,      /* 16-byte accesses */
    ROPE_NORM_V2,      /* 8-byte */
    ROPE_NORM_V1,      /* 4-byte */
    ROPE_NORM_V1_B16,  /* 2-byte: any alignment */
    ROPE_NEOX_V4,      /* 2 x 8-byte */
    ROPE_NEOX_V2,      /* 2 x 4-byte */
    ROPE_NEOX_V1,      /* 2 x 2-byte: any alignment */
};

/* One head's V pairs as words: pair j in P[j], x0 in the low half, x1 in
 * the high one. NORM: the words are the memory layout (p at x[2 i0]);
 * NEOX: p at x[i0], the partners half elements on (a[m] holds elements
 * 2m, 2m + 1 of the first run, b[m] of the second). */
template <int NEOX, int V, bool VEC>
static __device__ __forceinline__ void rope_ld(const nstf_bf16 *p, int half, uint32_t (&P)[V]) {
    if constexpr (!NEOX && !VEC) {
        P[0] = (uint32_t)p[0].bits | (uint32_t)p[1].bits << 16;
    } else if constexpr (!NEOX && V == 4) {
        const uint4 u = *(const uint4 *)p;
        P[0] = u.x, P[1] = u.y, P[2] = u.z, P[3] = u.w;
    } else if constexpr (!NEOX && V == 2) {
        const uint2 u = *(const uint2 *)p;
        P[0] = u.x, P[1] = u.y;
    } else if constexpr (!NEOX) {
        P[0] = *(const uint32_t *)p;
    } else if constexpr (V == 1) {
        P[0] = (uint32_t)p[0].bits | (uint32_t)p[half].bits << 16;
    } else {
        uint32_t a[V / 2], b[V / 2];
        if constexpr (V == 4) {
            const uint2 ua = *(const uint2 *)p, ub = *(const uint2 *)(p + half);
            a[0] = ua.x, a[1] = ua.y, b[0] = ub.x, b[1] = ub.y;
        } else {
            a[0] = *(const uint32_t *)p, b[0] = *(const uint32_t *)(p + half);
        }
#pragma unroll
        for (int m = 0; m < V / 2; m++) {
            P[2 * m] = (a[m] & 0xffffu) | b[m] << 16;
            P[2 * m + 1] = a[m] >> 16 | (b[m] & 0xffff0000u);
        }
    }
}

template <int NEOX, int V, bool VEC>
static __device__ __forceinline__ void rope_st(nstf_bf16 *p, int half, const uint32_t (&P)[V]) {
    if constexpr (!NEOX && !VEC) {
        p[0].bits = (uint16_t)P[0];
        p[1].bits = (uint16_t)(P[0] >> 16);
    } else if constexpr (!NEOX && V == 4) {
        *(uint4 *)p = make_uint4(P[0], P[1], P[2], P[3]);
    } else if constexpr (!NEOX && V == 2) {
        *(uint2 *)p = make_uint2(P[0], P[1]);
    } else if constexpr (!NEOX) {
        *(uint32_t *)p = P[0];
    } else if constexpr (V == 1) {
        p[0].bits = (uint16_t)P[0];
        p[half].bits = (uint16_t)(P[0] >> 16);
    } else {
        uint32_t a[V / 2], b[V / 2];
#pragma unroll
        for (int m = 0; m < V / 2; m++) {
            a[m] = (P[2 * m] & 0xffffu) | P[2 * m + 1] << 16;
            b[m] = P[2 * m] >> 16 | (P[2 * m + 1] & 0xffff0000u);
        }
        if constexpr (V == 4) {
            *(uint2 *)p = make_uint2(a[0], a[1]);
            *(uint2 *)(p + half) = make_uint2(b[0], b[1]);
        } else {
            *(uint32_t *)p = a[0];
            *(uint32_t *)(p + half) = b[0];
        }
    }
}

/* Token t's head h (q's heads first), at the thread's first element. */
static __device__ __forceinline__ nstf_bf16 *rope_head(nstf_bf16 *qt, nstf_bf16 *kt, int h, int n_heads,
                                                       int head_dim) {
    return h < n_heads ? qt + h * head_dim : kt + (h - n_heads) * head_dim;
}

/* threadIdx.x: the pair group (pairs i0 .. i0 + V - 1), threadIdx.y: the
 * token within the block; tokens grid-stride. */
template <int NEOX, int V, bool VEC>
static __device__ __forceinline__ void rope_tokens(nstf_bf16 *q, int64_t q_stride, nstf_bf16 *k, int64_t k_stride,
                                                   const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                                   int head_dim, const rope_freqs &f, const float *factors,
                                                   float sgn) {
    const int half = head_dim / 2, heads = n_heads + n_kv_heads;
    const int i0 = (int)threadIdx.x * V, off = NEOX ? i0 : 2 * i0;
    float hi[V], lo[V]; /* the pairs' inverse frequencies, divided by their factors */
#pragma unroll
    for (int j = 0; j < V; j++) {
        hi[j] = f.hi[i0 + j];
        lo[j] = f.lo[i0 + j];
        if (factors) nstf_rope_scale(factors[i0 + j], &hi[j], &lo[j]);
    }
    const int64_t step = (int64_t)gridDim.x * blockDim.y;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; t < n_tok; t += step) {
        nstf_bf16 *qt = q + t * q_stride + off;
        nstf_bf16 *kt = n_kv_heads > 0 ? k + t * k_stride + off : qt;
        uint32_t P[ROPE_HEADS][V];
#pragma unroll
        for (int u = 0; u < ROPE_HEADS; u++)
            if (u < heads) rope_ld<NEOX, V, VEC>(rope_head(qt, kt, u, n_heads, head_dim), half, P[u]);
        /* cos/sin once per (token, pair), while the first heads load */
        const int32_t p = pos[t];
        float c[V], s[V];
#pragma unroll
        for (int j = 0; j < V; j++) {
            nstf_rope_cs(p, hi[j], lo[j], &c[j], &s[j]);
            s[j] *= sgn; /* -1: the transpose (the backward); exact */
        }
        for (int h0 = 0;;) {
#pragma unroll
            for (int u = 0; u < ROPE_HEADS; u++) {
                if (h0 + u >= heads) break;
#pragma unroll
                for (int j = 0; j < V; j++) {
                    float y0, y1;
                    nstf_rope_rot(nstf_bf16lo_to_float(P[u][j]), nstf_bf16hi_to_float(P[u][j]), c[j], s[j], &y0,
                                  &y1);
                    P[u][j] = (uint32_t)nstf_float_to_bf16(y0).bits | (uint32_t)nstf_float_to_bf16(y1).bits << 16;
                }
                rope_st<NEOX, V, VEC>(rope_head(qt, kt, h0 + u, n_heads, head_dim), half, P[u]);
            }
            h0 += ROPE_HEADS;
            if (h0 >= heads) break;
#pragma unroll
            for (int u = 0; u < ROPE_HEADS; u++)
                if (h0 + u < heads) rope_ld<NEOX, V, VEC>(rope_head(qt, kt, h0 + u, n_heads, head_dim), half, P[u]);
        }
    }
}

/* One kernel for every variant (a uniform switch), so one name carries the
 * machine-code gates (docs/amd_gates.tsv). */
__global__ void ROPE_BOUNDS
rope_kernel(nstf_bf16 *__restrict__ q, int64_t q_stride, nstf_bf16 *__restrict__ k, int64_t k_stride,
            const int32_t *__restrict__ pos, int64_t n_tok, int n_heads, int n_kv_heads, int head_dim,
            const rope_freqs f, const float *__restrict__ factors, int variant, float sgn) {
#define ROPE_CASE(VAR, NEOX, V, VEC)                                                                               \
    case VAR:                                                                                                      \
        rope_tokens<NEOX, V, VEC>(q, q_stride, k, k_stride, pos, n_tok, n_heads, n_kv_heads, head_dim, f, factors, \
                                  sgn);                                                                            \
        break;
    switch (variant) {
        ROPE_CASE(ROPE_NORM_V4, 0, 4, true)
        ROPE_CASE(ROPE_NORM_V2, 0, 2, true)
        ROPE_CASE(ROPE_NORM_V1, 0, 1, true)
        ROPE_CASE(ROPE_NORM_V1_B16, 0, 1, false)
        ROPE_CASE(ROPE_NEOX_V4, 1, 4, true)
        ROPE_CASE(ROPE_NEOX_V2, 1, 2, true)
        ROPE_CASE(ROPE_NEOX_V1, 1, 1, true)
    default:
        break;
    }
#undef ROPE_CASE
}

extern "C" void nstf_gpu_rope_freqs(float base, int head_dim, float *hi_lo) {
    const int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        const double v = pow((double)base, -2.0 * i / head_dim);
        hi_lo[i] = (float)v;
        hi_lo[half + i] = (float)(v - (double)hi_lo[i]);
    }
}

extern "C" nstf_status nstf_gpu_rope(uint16_t *q, uint16_t *k, const int32_t *pos, int64_t n_tok,
                                     int n_heads, int n_kv_heads, int head_dim, float base,
                                     nstf_rope_mode mode, void *stream) {
    return nstf_gpu_rope_strided(q, (int64_t)n_heads * head_dim, k, (int64_t)n_kv_heads * head_dim, pos, n_tok,
                                 n_heads, n_kv_heads, head_dim, base, NULL, mode, stream);
}

/* The widest variant the head size, pointers and strides allow: V pairs
 * per thread must divide half, and every access must be aligned to its
 * width (the element offsets inside a token are multiples of it when V
 * divides half). */
static int rope_pick(const uint16_t *q, int64_t q_stride, const uint16_t *k, int64_t k_stride, int n_kv_heads,
                     int half, bool neox, int *v_out) {
    static const int vs[3] = {4, 2, 1};
    for (int a = 0; a < 3; a++) {
        const int v = vs[a], bytes = neox ? 2 * v : 4 * v;
        if (half % v) continue;
        uint64_t m = (uint64_t)(uintptr_t)q | (uint64_t)(q_stride * 2);
        if (n_kv_heads > 0) m |= (uint64_t)(uintptr_t)k | (uint64_t)(k_stride * 2);
        if (m % (uint64_t)bytes) continue;
        *v_out = v;
        return neox ? ROPE_NEOX_V4 + a : ROPE_NORM_V4 + a;
    }
    *v_out = 1; /* NORM with 2-byte alignment only (NEOX at V = 1 always fits) */
    return ROPE_NORM_V1_B16;
}

/* sgn 1: rotate by theta (the forward); -1: by -theta (the backward). */
static nstf_status rope_launch(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride, const int32_t *pos,
                               int64_t n_tok, int n_heads, int n_kv_heads, int head_dim, float base,
                               const float *factors, nstf_rope_mode mode, float sgn, void *stream) {
    if (!q || !pos || n_tok < 0 || n_heads <= 0 || n_kv_heads < 0 || (n_kv_heads > 0 && !k) ||
        head_dim <= 0 || head_dim % 2 || head_dim > 2 * ROPE_MAX_PAIRS || !(base > 0.0f) ||
        ((int64_t)n_heads + n_kv_heads) * head_dim > INT_MAX)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_rope: bad arguments (n_tok %lld, heads %d/%d, head_dim %d, base %g)",
                              (long long)n_tok, n_heads, n_kv_heads, head_dim, (double)base);
    if (q_stride < (int64_t)n_heads * head_dim || (n_kv_heads > 0 && k_stride < (int64_t)n_kv_heads * head_dim))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_rope: token strides %lld/%lld below the rows",
                              (long long)q_stride, (long long)k_stride);
    if (mode != NSTF_ROPE_NORM && mode != NSTF_ROPE_NEOX)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "nstf_gpu_rope: mode %d", (int)mode);
    if (n_tok == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    const int half = head_dim / 2;
    int v = 1;
    const int variant = rope_pick(q, q_stride, k, k_stride, n_kv_heads, half, mode == NSTF_ROPE_NEOX, &v);
    const int tpt = half / v, tpb = ROPE_THREADS / tpt; /* threads per token (<= 128), tokens per block */
    const int64_t blocks = (n_tok + tpb - 1) / tpb;
    const unsigned grid = (unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID);
    rope_freqs f;
    float hl[2 * ROPE_MAX_PAIRS];
    nstf_gpu_rope_freqs(base, head_dim, hl);
    for (int i = 0; i < ROPE_MAX_PAIRS; i++) {
        f.hi[i] = i < half ? hl[i] : 0.0f;
        f.lo[i] = i < half ? hl[half + i] : 0.0f;
    }
    rope_kernel<<<grid, dim3((unsigned)tpt, (unsigned)tpb), 0, s>>>((nstf_bf16 *)q, q_stride, (nstf_bf16 *)k,
                                                                    k_stride, pos, n_tok, n_heads, n_kv_heads,
                                                                    head_dim, f, factors, variant, sgn);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}

extern "C" nstf_status nstf_gpu_rope_strided(uint16_t *q, int64_t q_stride, uint16_t *k, int64_t k_stride,
                                             const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                             int head_dim, float base, const float *factors, nstf_rope_mode mode,
                                             void *stream) {
    return rope_launch(q, q_stride, k, k_stride, pos, n_tok, n_heads, n_kv_heads, head_dim, base, factors, mode, 1.0f,
                       stream);
}

extern "C" nstf_status nstf_gpu_rope_bwd(uint16_t *dq, int64_t q_stride, uint16_t *dk, int64_t k_stride,
                                         const int32_t *pos, int64_t n_tok, int n_heads, int n_kv_heads,
                                         int head_dim, float base, nstf_rope_mode mode, void *stream) {
    return rope_launch(dq, q_stride, dk, k_stride, pos, n_tok, n_heads, n_kv_heads, head_dim, base, NULL, mode,
                       -1.0f, stream);
}
