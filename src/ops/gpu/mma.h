/* mma.h — the tile abstraction over the matrix units: one wave computes
 * C[16x16] (fp32) += A[16x16] (bf16) * B[16x16] (bf16), with fragments loaded
 * from shared memory. Owns the choice of matrix instruction per target (the
 * only place that knows it) and documents each target's register layouts
 * (nstf_mma_f16: fp16 operands, same layouts):
 *
 *   NVIDIA (NSTF_MMA_NV): two `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`
 *     per 16x16x16 step; lane = 4*g + t (g = lane/4, t = lane%4).
 *     A (x[0..3], bf16 pairs): x0 = A[g][2t,2t+1], x1 = A[g+8][2t..], x2 = A[g][2t+8..],
 *       x3 = A[g+8][2t+8..]  (loaded with ldmatrix.x4).
 *     B stored n-major (B[n][k]): x0 = B[n=g][k=2t..], x1 = B[g][2t+8..] (n 0..7),
 *       x2, x3 the same for n 8..15  (ldmatrix.x4; ldmatrix.x4.trans for k-major B).
 *     C (x[0..7]): element i, j = i/4, e = i%4: row g + 8*(e/2), col 8j + 2t + e%2.
 *     A C tile converts to an A fragment in registers (the FA2 trick).
 *   CDNA gfx90a/gfx942 (NSTF_MMA_MFMA, wave64): `__builtin_amdgcn_mfma_f32_16x16x16bf16_1k`.
 *     A: lane l holds A[l%16][4*(l/16) + 0..3]; B: lane l holds B[n=l%16][k=4*(l/16)+0..3];
 *     C: lane l element e is C[4*(l/16) + e][l%16].
 *   RDNA3 gfx11 (NSTF_MMA_WMMA, wave32): `__builtin_amdgcn_wmma_f32_16x16x16_bf16_w32`.
 *     A: lane l holds the whole row A[l%16][0..15] (lanes 16..31 repeat 0..15);
 *     B: lane l holds B[n=l%16][0..15]; C: lane l element e is C[2e + l/16][l%16].
 *   On AMD a C tile reaches the A operand through a wave-private 16x16 scratch
 *   in shared memory (nstf_mma_c_to_a), since the layouts are transposed.
 *
 * Shared-memory operands are raw bf16 bits (unsigned short). Row strides `ld`
 * are in elements and must keep every 8-element row segment 16-byte aligned
 * (ld % 8 == 0, base 16-byte aligned): ldmatrix and the 8/32-byte AMD loads
 * rely on it. Everything here is wave-level: all lanes of the wave must call.
 * The index math of these layouts (which tile elements a lane holds, where
 * its loads start) lives in mma_layout.h, for all three targets, so the CPU
 * test (tests/test_wave_emu.c) checks the functions the kernels inline. */
#ifndef NSTF_MMA_H
#define NSTF_MMA_H

#include "gpu.h"
#include "mma_layout.h"

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__)
#if defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__)
#define NSTF_MMA_WMMA 1
#elif defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__)
#define NSTF_MMA_MFMA 1
#elif defined(__HIP_DEVICE_COMPILE__)
#error "mma.h: no matrix instruction path for this AMD target (need gfx90a/gfx94x or gfx11)"
#else
#define NSTF_MMA_MFMA 1 /* host pass: layouts are never used on the host */
#endif
#else
#define NSTF_MMA_NV 1
#endif

/* The target's layout functions of mma_layout.h: NSTF_MMA_L(c_row) is
 * nstf_mma_nv_c_row, nstf_mma_mfma_c_row or nstf_mma_wmma_c_row. */
#if defined(NSTF_MMA_NV)
#define NSTF_MMA_L(f) nstf_mma_nv_##f
#elif defined(NSTF_MMA_MFMA)
#define NSTF_MMA_L(f) nstf_mma_mfma_##f
#else
#define NSTF_MMA_L(f) nstf_mma_wmma_##f
#endif

#define NSTF_DEV static __device__ __forceinline__

/* ---- bf16 bits <-> float (round to nearest even; NaN kept quiet) ---- */
NSTF_DEV float nstf_mma_bf2f(unsigned short b) { return __uint_as_float((unsigned)b << 16); }
NSTF_DEV unsigned short nstf_mma_f2bf(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}
/* two floats -> packed bf16x2, lo in the low half */
NSTF_DEV unsigned nstf_mma_pack2(float lo, float hi) {
#if defined(NSTF_MMA_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (unsigned)nstf_mma_f2bf(lo) | ((unsigned)nstf_mma_f2bf(hi) << 16);
#endif
}

/* 2^x: the hardware instruction on every target (inputs here are <= 0). */
NSTF_DEV float nstf_exp2(float x) {
#if defined(NSTF_MMA_NV)
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
#else
    return nstf_fast_exp2f(x); /* v_exp_f32 */
#endif
}

NSTF_DEV float nstf_shfl_xor(float v, int mask) { return NSTF_SHFL_XOR(v, mask); }

NSTF_DEV int nstf_lane(void) { return (int)(threadIdx.x % NSTF_WAVE); }

/* ---- fragment types ---- */
#if defined(NSTF_MMA_NV)
struct nstf_mma_a { unsigned x[4]; };
struct nstf_mma_b { unsigned x[4]; };
struct nstf_mma_c { float x[8]; };
#define NSTF_MMA_C_N NSTF_MMA_NV_C_N             /* fp32 elements of a C tile per lane: 8 */
#define NSTF_MMA_C_ROWS NSTF_MMA_NV_C_ROWS       /* distinct rows among them: 2 */
#define NSTF_MMA_ROW_LANES NSTF_MMA_NV_ROW_LANES /* lanes sharing one row: 4 (xor 1, 2) */
#elif defined(NSTF_MMA_MFMA)
typedef short nstf_v4s __attribute__((ext_vector_type(4)));
typedef _Float16 nstf_v4h __attribute__((ext_vector_type(4)));
typedef float nstf_v4f __attribute__((ext_vector_type(4)));
struct nstf_mma_a { nstf_v4s x; };
struct nstf_mma_b { nstf_v4s x; };
struct nstf_mma_c { nstf_v4f x; };
#define NSTF_MMA_C_N NSTF_MMA_MFMA_C_N
#define NSTF_MMA_C_ROWS NSTF_MMA_MFMA_C_ROWS
#define NSTF_MMA_ROW_LANES NSTF_MMA_MFMA_ROW_LANES
#else
typedef short nstf_v16s __attribute__((ext_vector_type(16)));
typedef _Float16 nstf_v16h __attribute__((ext_vector_type(16)));
typedef float nstf_v8f __attribute__((ext_vector_type(8)));
struct nstf_mma_a { nstf_v16s x; };
struct nstf_mma_b { nstf_v16s x; };
struct nstf_mma_c { nstf_v8f x; };
#define NSTF_MMA_C_N NSTF_MMA_WMMA_C_N
#define NSTF_MMA_C_ROWS NSTF_MMA_WMMA_C_ROWS
#define NSTF_MMA_ROW_LANES NSTF_MMA_WMMA_ROW_LANES
#endif

/* ---- C element coordinates (inside the 16x16 tile) for this lane ---- */
NSTF_DEV int nstf_mma_c_row(int i) { return NSTF_MMA_L(c_row)(nstf_lane(), i); }
NSTF_DEV int nstf_mma_c_col(int i) { return NSTF_MMA_L(c_col)(nstf_lane(), i); }
/* which of this lane's NSTF_MMA_C_ROWS rows element i lies in */
NSTF_DEV int nstf_mma_c_slot(int i) { return NSTF_MMA_L(c_slot)(i); }
/* the tile row of this lane's row slot r */
NSTF_DEV int nstf_mma_slot_row(int r) { return NSTF_MMA_L(slot_row)(nstf_lane(), r); }
/* reductions over the lanes that share a row (combine with the in-lane slot) */
NSTF_DEV float nstf_mma_row_max(float v) {
    NSTF_ROW_XOR_LOOP(m, NSTF_MMA_ROW_LANES) v = fmaxf(v, nstf_shfl_xor(v, m));
    return v;
}
NSTF_DEV float nstf_mma_row_sum(float v) {
    NSTF_ROW_XOR_LOOP(m, NSTF_MMA_ROW_LANES) v += nstf_shfl_xor(v, m);
    return v;
}

#if defined(NSTF_MMA_NV)
NSTF_DEV unsigned nstf_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
#endif

/* ---- loads from shared memory ---- */
/* A tile: A[m][k] at p, row stride ld */
NSTF_DEV void nstf_mma_load_a(nstf_mma_a &a, const unsigned short *p, int ld) {
    int l = nstf_lane();
    const unsigned short *q = p + NSTF_MMA_L(a_row)(l) * ld + NSTF_MMA_L(a_col)(l);
#if defined(NSTF_MMA_NV)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a.x[0]), "=r"(a.x[1]), "=r"(a.x[2]), "=r"(a.x[3])
                 : "r"(nstf_smem_addr(q)));
#elif defined(NSTF_MMA_MFMA)
    a.x = *(const nstf_v4s *)q;
#else
    a.x = *(const nstf_v16s *)q;
#endif
}
/* B tile stored n-major: B[n][k] at p (a weight row, a key row) */
NSTF_DEV void nstf_mma_load_b(nstf_mma_b &b, const unsigned short *p, int ld) {
    int l = nstf_lane();
    const unsigned short *s = p + NSTF_MMA_L(b_row)(l) * ld + NSTF_MMA_L(b_col)(l);
#if defined(NSTF_MMA_NV)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b.x[0]), "=r"(b.x[1]), "=r"(b.x[2]), "=r"(b.x[3])
                 : "r"(nstf_smem_addr(s)));
#elif defined(NSTF_MMA_MFMA)
    b.x = *(const nstf_v4s *)s;
#else
    b.x = *(const nstf_v16s *)s;
#endif
}
/* B tile stored k-major: B[k][n] at p (a value row: V[key][dim]) */
NSTF_DEV void nstf_mma_load_b_kn(nstf_mma_b &b, const unsigned short *p, int ld) {
    int l = nstf_lane();
    const unsigned short *s = p + NSTF_MMA_L(bkn_row)(l) * ld + NSTF_MMA_L(bkn_col)(l);
#if defined(NSTF_MMA_NV)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b.x[0]), "=r"(b.x[1]), "=r"(b.x[2]), "=r"(b.x[3])
                 : "r"(nstf_smem_addr(s)));
#elif defined(NSTF_MMA_MFMA)
    for (int j = 0; j < 4; j++) b.x[j] = (short)s[j * ld];
#else
    for (int j = 0; j < 16; j++) b.x[j] = (short)s[j * ld];
#endif
}

/* A tile stored k-major: A^T[k][m] at p (an operand read transposed, as
 * dY in dW = dY^T X). The same fragment as nstf_mma_load_a. NVIDIA:
 * ldmatrix.trans of the four 8x8 pieces (k rows 0-7 / 8-15 x m 0-7 / 8-15);
 * AMD: A and B fragments share one lane layout, so this is load_b_kn's. */
NSTF_DEV void nstf_mma_load_a_km(nstf_mma_a &a, const unsigned short *p, int ld) {
    int l = nstf_lane();
#if defined(NSTF_MMA_NV)
    int q = l >> 3;
    const unsigned short *s = p + ((l & 7) + 8 * (q >> 1)) * ld + 8 * (q & 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a.x[0]), "=r"(a.x[1]), "=r"(a.x[2]), "=r"(a.x[3])
                 : "r"(nstf_smem_addr(s)));
#else
    (void)l;
    nstf_mma_b b;
    nstf_mma_load_b_kn(b, p, ld);
    a.x = b.x;
#endif
}

NSTF_DEV void nstf_mma_zero(nstf_mma_c &c) {
#if defined(NSTF_MMA_NV)
    for (int i = 0; i < 8; i++) c.x[i] = 0.0f;
#else
    for (int i = 0; i < NSTF_MMA_C_N; i++) c.x[i] = 0.0f;
#endif
}

/* c += a * b */
NSTF_DEV void nstf_mma(nstf_mma_c &c, const nstf_mma_a &a, const nstf_mma_b &b) {
#if defined(NSTF_MMA_NV)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c.x[4]), "+f"(c.x[5]), "+f"(c.x[6]), "+f"(c.x[7])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[2]), "r"(b.x[3]));
#elif defined(NSTF_MMA_MFMA)
    c.x = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a.x, b.x, c.x, 0, 0, 0);
#else
    c.x = __builtin_amdgcn_wmma_f32_16x16x16_bf16_w32(a.x, b.x, c.x);
#endif
}

/* c += a * b with fp16 operands: the fragments hold raw 16-bit elements in
 * the same layouts as bf16 on every target, only the instruction differs
 * (mma.sync .f16, v_mfma_f32_16x16x16f16, v_wmma_f32_16x16x16_f16). */
NSTF_DEV void nstf_mma_f16(nstf_mma_c &c, const nstf_mma_a &a, const nstf_mma_b &b) {
#if defined(NSTF_MMA_NV)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c.x[0]), "+f"(c.x[1]), "+f"(c.x[2]), "+f"(c.x[3])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[0]), "r"(b.x[1]));
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c.x[4]), "+f"(c.x[5]), "+f"(c.x[6]), "+f"(c.x[7])
                 : "r"(a.x[0]), "r"(a.x[1]), "r"(a.x[2]), "r"(a.x[3]), "r"(b.x[2]), "r"(b.x[3]));
#elif defined(NSTF_MMA_MFMA)
    c.x = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(nstf_v4h, a.x), __builtin_bit_cast(nstf_v4h, b.x),
                                                c.x, 0, 0, 0);
#else
    c.x = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(__builtin_bit_cast(nstf_v16h, a.x),
                                                     __builtin_bit_cast(nstf_v16h, b.x), c.x);
#endif
}

/* A C tile (rows m, cols = the next product's k) as an A fragment, rounded to
 * bf16. `scratch` is a wave-private 16x16 bf16 area in shared memory with row
 * stride 16 + 8 (used on AMD only; NVIDIA repacks registers). */
#define NSTF_MMA_SCRATCH_LD 24
NSTF_DEV void nstf_mma_c_to_a(nstf_mma_a &a, const nstf_mma_c &c, unsigned short *scratch) {
#if defined(NSTF_MMA_NV)
    (void)scratch;
    a.x[0] = nstf_mma_pack2(c.x[0], c.x[1]);
    a.x[1] = nstf_mma_pack2(c.x[2], c.x[3]);
    a.x[2] = nstf_mma_pack2(c.x[4], c.x[5]);
    a.x[3] = nstf_mma_pack2(c.x[6], c.x[7]);
#else
    for (int i = 0; i < NSTF_MMA_C_N; i++)
        scratch[nstf_mma_c_row(i) * NSTF_MMA_SCRATCH_LD + nstf_mma_c_col(i)] = nstf_mma_f2bf(c.x[i]);
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    nstf_mma_load_a(a, scratch, NSTF_MMA_SCRATCH_LD);
    __builtin_amdgcn_wave_barrier();
#endif
}

/* ---- global -> shared copies of 16 bytes ---- */
/* Copies 16 bytes from gsrc to sdst when `valid`, else writes zeros. On
 * sm_80+ this is cp.async (completion via nstf_cp_commit / nstf_cp_wait);
 * elsewhere a plain load and store. */
NSTF_DEV void nstf_cp16(void *sdst, const void *gsrc, bool valid) {
#if defined(NSTF_MMA_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(nstf_smem_addr(sdst)), "l"(gsrc),
                 "r"(valid ? 16 : 0));
#else
    uint4 v = make_uint4(0, 0, 0, 0);
    if (valid) v = *(const uint4 *)gsrc;
    *(uint4 *)sdst = v;
#endif
}
/* Copies N (4 or 8) bytes, both addresses N-aligned: cp.async (L1-
 * allocating) on sm_80+, else a plain load and store. */
template <int N> NSTF_DEV void nstf_cp_small(void *sdst, const void *gsrc) {
    static_assert(N == 4 || N == 8, "cp.async copies 4, 8 or 16 bytes");
#if defined(NSTF_MMA_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(nstf_smem_addr(sdst)), "l"(gsrc), "n"(N));
#else
    if (N == 8) *(uint2 *)sdst = *(const uint2 *)gsrc;
    else *(uint32_t *)sdst = *(const uint32_t *)gsrc;
#endif
}
NSTF_DEV void nstf_cp_commit(void) {
#if defined(NSTF_MMA_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}
template <int N> NSTF_DEV void nstf_cp_wait(void) {
#if defined(NSTF_MMA_NV) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

/* ---- host: the current device's SM count and wave width, read once ---- */
static inline nstf_status nstf_mma_device(int *n_sm, int *wave) {
    static int cached_sm = 0, cached_wave = 0;
    if (!cached_sm) {
        int dev = 0;
        nstf_gpu_info info;
        if (gpuGetDevice(&dev) != gpuSuccess) return nstf_set_error(NSTF_ERR_GPU, "no current GPU device");
        nstf_status st = nstf_gpu_check_device(dev);
        if (st == NSTF_OK) st = nstf_gpu_query(dev, &info);
        if (st != NSTF_OK) return st;
        if (info.wave_size != 32 && info.wave_size != 64)
            return nstf_set_error(NSTF_ERR_UNSUPPORTED, "wave size %d", info.wave_size);
        cached_sm = info.n_sm > 0 ? info.n_sm : 1;
        cached_wave = info.wave_size;
    }
    *n_sm = cached_sm;
    *wave = cached_wave;
    return NSTF_OK;
}

#endif /* NSTF_MMA_H */
