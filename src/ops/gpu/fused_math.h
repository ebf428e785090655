/* fused_math.h — the element math that a standalone kernel and a fused
 * epilogue must do identically (so that fusing an op changes no bit):
 * the bf16 rounding between ops, SwiGLU's silu(g) * u and RoPE's rotation
 * angle. Included by swiglu.cu, rope.cu, attn_naive.cu, gemv_fused.h and
 * decode_l4.cu after gpu.h. */
#ifndef NSTF_GPU_FUSED_MATH_H
#define NSTF_GPU_FUSED_MATH_H

/* v rounded to bf16, as an op that stores bf16 leaves it for the next. */
static __device__ __forceinline__ float bf16_round(float v) { return nstf_bf16_to_float(nstf_float_to_bf16(v)); }

/* silu(g) * u = g / (1 + exp(-g)) * u, with exp(-g) = 2^(-g log2 e); for
 * g < -88 the power is +inf and g / inf = -0. */
static __device__ __forceinline__ float nstf_swiglu1(float g, float u) {
    return g / (1.0f + nstf_fast_exp2f(-1.4426950408889634f * g)) * u;
}

/* cos and sin of pos * freq, freq = hi + lo (a double split in two floats,
 * see rope.cu): the product with the integer position is split exactly
 * (fmaf), range-reduced to [-pi, pi] with a two-part 2pi (Cody-Waite), and
 * only then given to the fast hardware sin/cos. pos < 2^24. */
static __device__ __forceinline__ void nstf_rope_cs(int32_t pos, float hi, float lo, float *c, float *s) {
    const float fp = (float)pos; /* exact */
    const float a = fp * hi;
    const float a_err = fmaf(fp, hi, -a) + fp * lo; /* a + a_err = pos * freq */
    const float n2pi = rintf(a * 0.15915494309189535f);
    float r = fmaf(-n2pi, 6.28318548202514648f, a); /* float(2pi), exact product */
    r += a_err;
    r = fmaf(-n2pi, -1.7484556e-07f, r); /* 2pi - float(2pi) */
    *c = nstf_fast_cosf(r);
    *s = nstf_fast_sinf(r);
}

/* freq = hi + lo divided by a RoPE frequency factor f (Llama 3.x
 * rope_freqs), keeping the pair's ~double accuracy: q = hi / f rounded,
 * the remainder hi - q f is exact (fmaf), and (remainder + lo) / f is the
 * new low part. */
static __device__ __forceinline__ void nstf_rope_scale(float f, float *hi, float *lo) {
    const float q = *hi / f;
    const float rem = fmaf(-q, f, *hi);
    *lo = (rem + *lo) / f;
    *hi = q;
}

/* (y0, y1) = (x0 c - x1 s, x0 s + x1 c) with the roundings spelled out, so
 * that no compiler contracts it differently in two kernels. */
static __device__ __forceinline__ void nstf_rope_rot(float x0, float x1, float c, float s, float *y0, float *y1) {
    *y0 = fmaf(x0, c, -(x1 * s));
    *y1 = fmaf(x0, s, x1 * c);
}

#endif
