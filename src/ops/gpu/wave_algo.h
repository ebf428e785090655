/* wave_algo.h — the wave-level algorithm pieces that the kernels and the
 * CPU wave emulator (tests/test_wave_emu.c) share, so a wave64-only bug in
 * them shows up on a machine without AMD hardware. Plain C that also
 * compiles as CUDA/HIP device code; included by gpu.h (kernels) and by the
 * test (C11, where the emulator supplies the shuffles over an array of lanes).
 *
 *  - NSTF_WAVE_XOR_LOOP: the butterfly of a full-wave reduction (offsets W/2 ..
 *    1); after it every lane holds the reduction of all W lanes.
 *  - NSTF_ROW_XOR_LOOP: the butterfly over the lanes that share a row of an
 *    mma C tile (offsets 1 .. ROW_LANES/2: such lanes differ in their low bits).
 *  - nstf_argmax_better: the order-independent (value, index) comparison of
 *    argmax (first index on ties, NaN never wins).
 *  - nstf_softmax_base: the subtraction base of the online softmax (a row
 *    with all keys masked so far has max -inf and uses base 0, so no inf-inf).
 *  - NSTF_SOFTMAX_MERGE_SUMS / _ROW: flash decoding's merge of S split
 *    partials (m_s, l_s, acc_s) of one output element, into a partial of
 *    their union or into the output. */
#ifndef NSTF_GPU_WAVE_ALGO_H
#define NSTF_GPU_WAVE_ALGO_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__HIP__)
#define NSTF_WA_FN static __host__ __device__ __forceinline__
#else
#include <math.h> /* fmaxf; device code has it from the runtime headers */
#define NSTF_WA_FN static inline
#endif

#define NSTF_WAVE_XOR_LOOP(o, W) for (int o = (W) / 2; o > 0; o >>= 1)
#define NSTF_ROW_XOR_LOOP(m, ROW_LANES) for (int m = 1; m < (ROW_LANES); m <<= 1)

/* (v, i) beats (bv, bi): larger value, or equal value and smaller index.
 * A NaN v compares false, so it never wins. */
NSTF_WA_FN bool nstf_argmax_better(float v, int32_t i, float bv, int32_t bi) {
    return v > bv || (v == bv && i < bi);
}

NSTF_WA_FN float nstf_softmax_base(float m) { return m == -__builtin_huge_valf() ? 0.0f : m; }

/* The sums of flash decoding's merge of n_split partials (m_s, l_s, acc_s)
 * of one output element (log2 domain): mx = M = max_s m_s, num = sum_s
 * 2^(m_s - base(M)) acc_s, den = sum_s 2^(m_s - base(M)) l_s, in split
 * order. (mx, den, num) is itself a partial (m, l, acc) of the union of the
 * splits, so partials can be merged in two levels. ml: n_split pairs (m, l)
 * ml_stride floats apart; acc: n_split values acc_stride floats apart. EXP2
 * is the caller's 2^x (the hardware instruction on a GPU, exp2f on the
 * host), so this is a macro. */
#define NSTF_SOFTMAX_MERGE_SUMS(mx, num, den, ml, ml_stride, acc, acc_stride, n_split, EXP2)        \
    do {                                                                                            \
        (mx) = -__builtin_huge_valf();                                                              \
        for (int ms_s_ = 0; ms_s_ < (n_split); ms_s_++)                                             \
            (mx) = fmaxf((mx), (ml)[(int64_t)ms_s_ * (ml_stride)]);                                 \
        const float ms_base_ = nstf_softmax_base(mx);                                               \
        (num) = 0.0f;                                                                               \
        (den) = 0.0f;                                                                               \
        for (int ms_s_ = 0; ms_s_ < (n_split); ms_s_++) {                                           \
            const float ms_w_ = EXP2((ml)[(int64_t)ms_s_ * (ml_stride)] - ms_base_);                \
            (den) = fmaf(ms_w_, (ml)[(int64_t)ms_s_ * (ml_stride) + 1], (den));                     \
            (num) = fmaf(ms_w_, (acc)[(int64_t)ms_s_ * (acc_stride)], (num));                       \
        }                                                                                           \
    } while (0)

/* out = num / den of NSTF_SOFTMAX_MERGE_SUMS: the merged output element. */
#define NSTF_SOFTMAX_MERGE_ROW(out, ml, ml_stride, acc, acc_stride, n_split, EXP2)                  \
    do {                                                                                            \
        float mr_mx_, mr_num_, mr_den_;                                                             \
        NSTF_SOFTMAX_MERGE_SUMS(mr_mx_, mr_num_, mr_den_, ml, ml_stride, acc, acc_stride, n_split, EXP2); \
        (void)mr_mx_;                                                                               \
        (out) = mr_num_ / mr_den_;                                                                  \
    } while (0)

#endif
