/* gpu.h — the one vendor switch of the GPU backend, and what every kernel
 * file shares: the wave width NSTF_WAVE, the project's bf16 type, the
 * device views of the quantized block layouts, wave reductions, and the
 * GPU_CHECK / GPU_LAUNCH_CHECK error macros.
 *
 * Only this file includes vendors/cuda.h or vendors/hip.h. Kernel files
 * include gpu.h and use the gpu* runtime names and NSTF_* macros, so the
 * same .cu source builds with nvcc and with hipcc/clang (-x hip). */
#ifndef NSTF_GPU_GPU_H
#define NSTF_GPU_GPU_H

#if defined(__HIP_PLATFORM_AMD__) || defined(__HIPCC__) || defined(__HIP__)
#include "vendors/hip.h"
#define NSTF_GPU_HIP 1
#else
#include "vendors/cuda.h"
#define NSTF_GPU_CUDA 1
#endif

#include <stdint.h>

#include "gpu_api.h"
#include "wave_algo.h"

/* Lanes per wave: 32 on NVIDIA and RDNA, 64 on CDNA. Every reduction and
 * every lane-count computation in a kernel uses this constant; host code
 * never does (its launch shapes are in threads, wave-agnostic). */
#define NSTF_WAVE NSTF_WAVE_WIDTH

/* ---- bf16: the project's own 16-bit type ------------------------------- *
 * A struct (not a bare uint16_t) so it cannot take part in integer
 * arithmetic by accident; conversions are explicit, round-to-nearest-even,
 * NaN stays NaN (the same rounding as nstf_f32_to_bf16 in core/dtype.h). */
typedef struct nstf_bf16 {
    uint16_t bits;
} nstf_bf16;

__device__ __host__ inline float nstf_bf16_to_float(nstf_bf16 b) {
    uint32_t u = (uint32_t)b.bits << 16;
#if defined(NSTF_DEVICE_PASS)
    return __uint_as_float(u);
#else
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
#endif
}

__device__ __host__ inline nstf_bf16 nstf_float_to_bf16(float f) {
    uint32_t u;
#if defined(NSTF_DEVICE_PASS)
    u = __float_as_uint(f);
#else
    __builtin_memcpy(&u, &f, 4);
#endif
    nstf_bf16 b;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        b.bits = (uint16_t)((u >> 16) | 0x40); /* quiet the NaN */
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
        b.bits = (uint16_t)(u >> 16);
    }
    return b;
}

/* The two bf16 of a 32-bit word (element 0 in the low half). Shifting and
 * masking is all a bf16 -> f32 conversion needs. */
__device__ __forceinline__ float nstf_bf16lo_to_float(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float nstf_bf16hi_to_float(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* VEC (1, 2, 4 or 8) bf16 at p as (VEC + 1) / 2 words, element 0 in the
 * low half of word 0 (VEC 1: the low half, the high half 0), one aligned
 * access; and the store of as many. */
template <int VEC>
__device__ __forceinline__ void nstf_bf16_ldv(const nstf_bf16 *p, uint32_t (&w)[(VEC + 1) / 2]) {
    if constexpr (VEC == 8) {
        const uint4 u = *(const uint4 *)p;
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (VEC == 4) {
        const uint2 u = *(const uint2 *)p;
        w[0] = u.x, w[1] = u.y;
    } else if constexpr (VEC == 2) {
        w[0] = *(const uint32_t *)p;
    } else {
        w[0] = p[0].bits;
    }
}

template <int VEC>
__device__ __forceinline__ void nstf_bf16_stv(nstf_bf16 *p, const uint32_t (&w)[(VEC + 1) / 2]) {
    if constexpr (VEC == 8)
        *(uint4 *)p = make_uint4(w[0], w[1], w[2], w[3]);
    else if constexpr (VEC == 4)
        *(uint2 *)p = make_uint2(w[0], w[1]);
    else if constexpr (VEC == 2)
        *(uint32_t *)p = w[0];
    else
        p[0].bits = (uint16_t)w[0];
}

/* ---- quantized blocks as the kernels read them ------------------------- *
 * Byte layouts are GGUF's (see core/dtype.h): 32 elements per block,
 * fp16 scale first. Blocks are 34/18/20 bytes, so only 2-byte alignment
 * holds inside a row; kernels read them with 16-bit loads. */
#define NSTF_GPU_QK 32
#define NSTF_Q8_0_BYTES 34
#define NSTF_Q4_0_BYTES 18
#define NSTF_Q4_1_BYTES 20

/* ---- wave reductions ---------------------------------------------------- *
 * Butterfly (xor) shuffles: every lane ends with the result. All NSTF_WAVE
 * lanes of the wave must call them. The loops are wave_algo.h's, which
 * tests/test_wave_emu.c runs over emulated 32- and 64-lane waves. */
__device__ __forceinline__ float wave_reduce_sum(float v) {
#pragma unroll
    NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) v += NSTF_SHFL_XOR(v, o);
    return v;
}
__device__ __forceinline__ float wave_reduce_max(float v) {
#pragma unroll
    NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) v = fmaxf(v, NSTF_SHFL_XOR(v, o));
    return v;
}

/* Sum over a whole block of `n_threads` threads (a multiple of NSTF_WAVE,
 * at most 1024): `red` is shared scratch of at least 1024 / 32 floats.
 * Every thread of the block must call it; every thread gets the sum. */
__device__ __forceinline__ float block_reduce_sum(float v, float *red) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int n_waves = (blockDim.x + NSTF_WAVE - 1) / NSTF_WAVE;
    v = wave_reduce_sum(v);
    __syncthreads(); /* `red` may still be read by a previous call */
    if (lane == 0) red[wave] = v;
    __syncthreads();
    v = lane < n_waves ? red[lane] : 0.0f;
    return wave_reduce_sum(v);
}

/* ---- programmatic dependent launch ------------------------------------ *
 * On sm_90 a kernel launched with the programmatic-serialization attribute
 * (nstf_gpu_launch with pdl on) may start while the kernel before it in the
 * stream is still running. It must execute NSTF_PDL_WAIT() before it reads
 * anything the previous kernels wrote or writes anything they read; work on
 * constant data (weight prefetch) may come before. NSTF_PDL_TRIGGER() lets
 * the next kernel be scheduled once every block of this one has passed it.
 * Kernels call both unconditionally: without the attribute (HIP, sm_80, or
 * pdl off) the wait returns at once and the trigger does nothing. */
#if defined(NSTF_GPU_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define NSTF_PDL_WAIT() asm volatile("griddepcontrol.wait;" ::: "memory")
#define NSTF_PDL_TRIGGER() asm volatile("griddepcontrol.launch_dependents;" ::: "memory")
/* Starts reading [p, p + bytes) into L2 without waiting; p 16-byte aligned,
 * bytes a multiple of 16. */
#define NSTF_L2_PREFETCH(p, bytes) \
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"((unsigned)(bytes)) : "memory")
#else
#define NSTF_PDL_WAIT() ((void)0)
#define NSTF_PDL_TRIGGER() ((void)0)
#define NSTF_L2_PREFETCH(p, bytes) ((void)(p), (void)(bytes))
#endif

/* Whether launches through nstf_gpu_launch on this host thread carry the
 * programmatic-serialization attribute (gpu_common.cu; see
 * nstf_gpu_set_pdl in gpu_api.h). */
extern "C" int nstf_gpu_pdl(void);

/* The current device's SM (CU) count, -1 when there is no current device;
 * cached per host thread (the current device is per host thread). */
extern "C" int nstf_gpu_n_sm(void);

/* kern<<<grid, block, smem, stream>>>(args...), with programmatic
 * serialization when pdl is non-zero and the vendor has it (CUDA). */
template <typename... P, typename... A>
static inline gpuError_t nstf_gpu_launch(void (*kern)(P...), dim3 grid, dim3 block, size_t smem,
                                         gpuStream_t stream, int pdl, A... args) {
#if defined(NSTF_GPU_CUDA)
    if (pdl) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        return cudaLaunchKernelEx(&cfg, kern, ((P)args)...);
    }
#else
    (void)pdl;
#endif
    kern<<<grid, block, smem, stream>>>(((P)args)...);
    return gpuGetLastError();
}

/* ---- errors -------------------------------------------------------------- */

/* Records "GPU call `stmt` failed at file:line on device d: <error>" as the
 * NSTF last-error message and returns NSTF_ERR_GPU (gpu_common.cu). */
extern "C" nstf_status nstf_gpu_fail(const char *stmt, const char *file, int line, int err,
                                     const char *err_str);

/* Wrap every runtime call in a function that returns nstf_status. */
/* Work done once per device for a kernel: gpuFuncSetAttribute sets an
 * attribute of the function on the current device only, so a process
 * driving several GPUs (tensor parallel) sets it on each. Bit d of *mask:
 * device d has it (devices past 63 redo it every call). */
static inline bool nstf_gpu_device_done(const unsigned long long *mask) {
    int d = 0;
    if (gpuGetDevice(&d) != gpuSuccess || d > 63) return false;
    return (__atomic_load_n(mask, __ATOMIC_ACQUIRE) >> d) & 1ull;
}
static inline void nstf_gpu_device_mark(unsigned long long *mask) {
    int d = 0;
    if (gpuGetDevice(&d) == gpuSuccess && d <= 63) __atomic_fetch_or(mask, 1ull << d, __ATOMIC_RELEASE);
}

#define GPU_CHECK(call)                                                             \
    do {                                                                            \
        gpuError_t gpu_check_e_ = (call);                                           \
        if (gpu_check_e_ != gpuSuccess)                                             \
            return nstf_gpu_fail(#call, __FILE__, __LINE__, (int)gpu_check_e_,      \
                                 gpuGetErrorString(gpu_check_e_));                  \
    } while (0)

/* After every kernel launch. Release builds check the launch itself (a bad
 * configuration); debug builds also wait for the kernel, so a fault is
 * reported at the launch that caused it. */
#if defined(NDEBUG) && !defined(NSTF_GPU_DEBUG)
#define GPU_LAUNCH_CHECK(stream) GPU_CHECK(gpuGetLastError())
#else
#define GPU_LAUNCH_CHECK(stream)                     \
    do {                                             \
        GPU_CHECK(gpuGetLastError());                \
        GPU_CHECK(gpuStreamSynchronize(stream));     \
    } while (0)
#endif

/* Grid-stride loops use a grid clamped to this many blocks. */
#define NSTF_GPU_MAX_GRID 65535

/* The launch of a kernel over n_rows rows of row_len bf16 elements taken
 * in runs of vec (8, 4, 2 or 1: the widest that row_len and align, the OR
 * of every row start's byte address, allow): a block as wide as a row's
 * runs (split evenly when more than `threads`), as many rows as fit in
 * `threads`; the grid clamped to NSTF_GPU_MAX_GRID (a grid-stride loop
 * over the rows takes the rest). */
typedef struct {
    int vec;
    dim3 grid, block;
} nstf_rows_launch;

static inline nstf_rows_launch nstf_bf16_rows_launch(uint64_t align, int64_t row_len, int64_t n_rows, int threads) {
    nstf_rows_launch l;
    l.vec = 8;
    while (l.vec > 1 && (row_len % l.vec || align % (uint64_t)(2 * l.vec))) l.vec /= 2;
    const int64_t n_ch = row_len / l.vec, iters = (n_ch + threads - 1) / threads;
    const int tx = (int)((n_ch + iters - 1) / iters), ty = threads / tx;
    const int64_t blocks = (n_rows + ty - 1) / ty;
    l.grid = dim3((unsigned)(blocks < NSTF_GPU_MAX_GRID ? blocks : NSTF_GPU_MAX_GRID));
    l.block = dim3((unsigned)tx, (unsigned)ty);
    return l;
}

#endif
