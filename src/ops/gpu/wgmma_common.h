/* wgmma_common.h — what the sm_90a (Hopper) kernels share: mbarriers, TMA
 * loads (`cp.async.bulk.tensor`), warpgroup-MMA shared-memory descriptors in
 * the 128-byte swizzle (K-major and MN-major operands), and on the host the
 * tensor maps (cuTensorMapEncodeTiled, reached through
 * cudaGetDriverEntryPointByVersion so nothing links libcuda) and the check
 * that a kernel's loaded image holds its sm_90a body. NVIDIA only: included
 * by gemm_wgmma.h and flash_attn_wgmma.h in CUDA builds; the device half
 * exists only in sm_90a device code (NSTF_WGMMA_DEVICE). */
#ifndef NSTF_WGMMA_COMMON_H
#define NSTF_WGMMA_COMMON_H

#include <cuda.h> /* CUtensorMap and the cuTensorMapEncodeTiled types only; no libcuda link */

/* The GEMM-shaped blocks (gemm_wgmma.h, conv_wgmma.h): 128 rows x BN
 * columns x 64 k a slice, a producer warpgroup and 2 consumer warpgroups,
 * stages per tile width as deep as ~192 KiB of shared memory allows. */
#define WG_BM 128
#define WG_BK 64
#define WG_THREADS 384 /* producer warpgroup + 2 consumer warpgroups */
template <int BN> struct wg_cfg {
    static constexpr int STAGES = BN == 256 ? 4 : BN == 192 ? 5 : BN == 128 ? 6 : 8;
    static constexpr int A_BYTES = WG_BM * WG_BK * 2, B_BYTES = BN * WG_BK * 2;
    static constexpr int STAGE_BYTES = A_BYTES + B_BYTES;
    /* dynamic shared memory: the ring + 1024 to align it to the 128-byte
     * swizzle's 1024-byte period (the mbarriers are static, see the kernels) */
    static constexpr int SMEM = STAGES * STAGE_BYTES + 1024;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define NSTF_WGMMA_DEVICE 1
#include "wgmma_ops.h"
#endif

#if defined(NSTF_WGMMA_DEVICE)
static __device__ __forceinline__ uint32_t wg_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void wg_bar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
static __device__ __forceinline__ void wg_bar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
static __device__ __forceinline__ void wg_bar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
static __device__ __forceinline__ void wg_bar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
/* box (k0 .. k0+63, r0 .. r0+rows-1) of a 2-D tensor map into shared memory */
static __device__ __forceinline__ void wg_tma_load(uint32_t dst, const CUtensorMap *map, int k0, int r0,
                                                   uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
                 ::"r"(dst), "l"((uint64_t)map), "r"(k0), "r"(r0), "r"(bar)
                 : "memory");
}
/* NCH 64-column chunks (col0, col0 + 64, ...) of rows r0.. of a tensor map
 * into shared memory, chunk c at dst + c * chunk_bytes (one 128-byte
 * swizzle row per tile row): the layout of a head-dimension-wide tile. */
template <int NCH>
static __device__ __forceinline__ void wg_tma_load_chunks(uint32_t dst, uint32_t chunk_bytes, const CUtensorMap *map,
                                                          int col0, int r0, uint32_t bar) {
#pragma unroll
    for (int c = 0; c < NCH; c++) wg_tma_load(dst + c * chunk_bytes, map, col0 + c * 64, r0, bar);
}
/* wgmma shared-memory descriptor, K-major operand in the 128-byte swizzle:
 * bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4
 * (unused for swizzled K-major; 1 by convention), 32-45 stride byte offset
 * >> 4 (1024 B between 8-row groups), 62-63 layout (1 = 128-byte swizzle). */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}
/* The descriptor of the operand `bytes` further on in shared memory: the
 * start address field (bits 0-13, the address >> 4) advanced, nothing else
 * (every shared address here is below 256 KiB, so the field cannot carry).
 * One add to a descriptor made once, where wg_desc of each address costs
 * a mask, a shift and an or per wgmma. */
static __device__ __forceinline__ uint64_t wg_desc_add(uint64_t d, uint32_t bytes) {
    return (d & 0xffffffff00000000ull) | (uint32_t)((uint32_t)d + (bytes >> 4));
}
/* The same for an "MN-major" operand (B transposed: its N elements
 * contiguous), 128-byte swizzle: rows of the tile are K (128 B apart, 8-row
 * groups 1024 B apart: the stride offset), and each 64-element run of N is
 * one swizzle atom, the next run lbo bytes on (the leading offset). */
static __device__ __forceinline__ uint64_t wg_desc_mn(uint32_t addr, uint32_t lbo) {
    return (uint64_t)((addr & 0x3ffff) >> 4) | ((uint64_t)((lbo >> 4) & 0x3fff) << 16) |
           ((uint64_t)(1024 >> 4) << 32) | ((uint64_t)1 << 62);
}
/* F16: fp16 operands, else bf16 */
template <int BN, bool F16>
static __device__ __forceinline__ void wg_mma(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (BN == 256)
        (F16 ? nstf_wgmma_f16_m64n256 : nstf_wgmma_m64n256)(d, da, db, acc);
    else if constexpr (BN == 192)
        (F16 ? nstf_wgmma_f16_m64n192 : nstf_wgmma_m64n192)(d, da, db, acc);
    else if constexpr (BN == 128)
        (F16 ? nstf_wgmma_f16_m64n128 : nstf_wgmma_m64n128)(d, da, db, acc);
    else
        (F16 ? nstf_wgmma_f16_m64n64 : nstf_wgmma_m64n64)(d, da, db, acc);
}
/* Both operands MN-major (the weight gradient's dY and X as stored), bf16 */
template <int BN>
static __device__ __forceinline__ void wg_mma_tt(float *d, uint64_t da, uint64_t db, int acc) {
    if constexpr (BN == 256)
        nstf_wgmma_tt_m64n256(d, da, db, acc);
    else if constexpr (BN == 192)
        nstf_wgmma_tt_m64n192(d, da, db, acc);
    else
        nstf_wgmma_tt_m64n128(d, da, db, acc);
}
/* acc[HD / 2] += P B over ROWS keys: P from registers (p[ROWS / 4]: the
 * bf16 pairs of an m64nROWS accumulator, 4 per k16 slice), B a [ROWS][HD]
 * tile of 64-column chunks ROWS * 128 B apart, read transposed (its head
 * dimension contiguous): 16-row steps are 2048 B, two 8-row groups. Issued,
 * not committed. Flash attention's P V, and the backward's dQ, dK, dV. */
template <int HD, int ROWS>
static __device__ __forceinline__ void wg_rs_tb(float *acc, const uint32_t *p, uint32_t b) {
    const uint64_t d0 = wg_desc_mn(b, ROWS * 128);
#pragma unroll
    for (int j = 0; j < ROWS / 16; j++) {
        if constexpr (HD == 64)
            nstf_wgmma_rs_tb_m64n64(acc, &p[4 * j], wg_desc_add(d0, j * 2048), 1);
        else
            nstf_wgmma_rs_tb_m64n128(acc, &p[4 * j], wg_desc_add(d0, j * 2048), 1);
    }
}
/* The barriers of a producer / consumer ring (flash attention forward and
 * backward), by thread 0, then a block barrier: one for the operands loaded
 * once (bar_own, TMA's expect_tx arrive), and per stage s of S: "full"
 * barriers for the two tiles of the stage (bar_fx + 8 s: TMA's arrive;
 * bar_fy + 8 s: fy_count arrives) and an "empty" one (bar_e + 8 s:
 * e_count consumer arrives). The barriers are made visible to the async
 * (TMA) proxy. */
static __device__ __forceinline__ void wg_ring_init(uint32_t bar_own, uint32_t bar_fx, uint32_t bar_fy,
                                                    uint32_t bar_e, int S, int fy_count, int e_count) {
    if (threadIdx.x == 0) {
        wg_bar_init(bar_own, 1);
        for (int s = 0; s < S; s++) {
            wg_bar_init(bar_fx + 8 * s, 1);
            wg_bar_init(bar_fy + 8 * s, fy_count);
            wg_bar_init(bar_e + 8 * s, e_count);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
}
/* Named barriers 1 and 2 over the two consumer warpgroups of a flash
 * attention block (256 threads): the ping-pong turns (sync waits for the
 * other warpgroup's arrive). */
/* The warpgroup of the calling thread (threadIdx.x / 128), read through a
 * shuffle: the compiler then knows it is uniform over the warp, so what
 * derives from it (tile bounds, ring stages, the wgmma descriptors) lives
 * in uniform registers instead of being moved there before every wgmma. */
static __device__ __forceinline__ int wg_index(void) {
    return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0);
}
static __device__ __forceinline__ void wg_named_sync(int id) {
    asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory");
}
static __device__ __forceinline__ void wg_named_arrive(int id) {
    asm volatile("bar.arrive %0, 256;" ::"r"(id) : "memory");
}
/* keeps the compiler from moving accumulator reads across wgmma waits */
template <int NR> static __device__ __forceinline__ void wg_fence_regs(float *d) {
#pragma unroll
    for (int i = 0; i < NR; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* The consumer side of a ring of S stages whose slices a warpgroup
 * multiplies in order into acc (gemm_wgmma.h, conv_wgmma.h): before a
 * slice's MMAs, wg_slice_begin waits for its stage to fill; after them,
 * wg_slice_end commits, lets one slice's MMAs stay in flight, hands the
 * previous stage back (one arrive per warpgroup) and steps the ring;
 * after a tile's last slice, wg_slices_drain waits for every MMA and
 * hands the last stage back. */
static __device__ __forceinline__ void wg_slice_begin(uint32_t bar_full, int stage, uint32_t phase) {
    wg_bar_wait(bar_full + 8 * stage, phase);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
}
template <int NR, int S>
static __device__ __forceinline__ void wg_slice_end(float *acc, uint32_t bar_empty, int tid, int &prev, int &stage,
                                                    uint32_t &phase) {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    /* the previous slice's MMAs have retired: hand its stage back */
    asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
    wg_fence_regs<NR>(acc);
    if (prev >= 0 && tid == 0) wg_bar_arrive(bar_empty + 8 * prev);
    prev = stage;
    if (++stage == S) {
        stage = 0;
        phase ^= 1;
    }
}
template <int NR>
static __device__ __forceinline__ void wg_slices_drain(float *acc, uint32_t bar_empty, int tid, int prev) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_fence_regs<NR>(acc);
    if (tid == 0) wg_bar_arrive(bar_empty + 8 * prev);
}
#endif /* NSTF_WGMMA_DEVICE */

/* ---------------------------------------------------------------- host ---- */

typedef CUresult (*wg_encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                 const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled from the driver the runtime already loaded. */
static inline wg_encode_fn wg_encoder(void) {
    static wg_encode_fn fn = NULL;
    static int tried = 0;
    if (!tried) {
        tried = 1;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
                cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (wg_encode_fn)p;
        else
            (void)cudaGetLastError(); /* do not leave the failure as the sticky "last error" */
    }
    return fn;
}

/* [rows, cols] bf16 (or fp16: f16) with rows ld elements apart as a 2-D
 * tensor map with a 64 x box_rows box, 128-byte swizzle, zero fill out of
 * bounds. TMA rules: base 16-byte aligned, ld * 2 a multiple of 16. who
 * names the caller in the error. */
static inline nstf_status wg_make_map(CUtensorMap *map, const void *base, int64_t rows, int64_t cols, int64_t ld,
                                      int box_rows, bool f16, const char *who) {
    const cuuint64_t dims[2] = {(cuuint64_t)cols, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ld * 2};
    const cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = wg_encoder()(map, f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                              (void *)base, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return nstf_set_error(NSTF_ERR_GPU, "%s: cuTensorMapEncodeTiled failed (%d) for [%lld, %lld] (ld %lld)", who,
                              (int)r, (long long)rows, (long long)cols, (long long)ld);
    return NSTF_OK;
}

/* Whether kernel kfn's loaded image holds its sm_90a body on this device: a
 * 9.x device, the driver's tensor-map encoder, and an image whose static
 * shared size is at least body_static (only the sm_90a body declares its
 * static shared mbarriers; an sm_80 image, or sm_90 without the "a"
 * features, or one JIT-compiled from PTX, has an empty body). */
static inline int wg_kernel_usable(const void *kfn, size_t body_static) {
    int dev = 0, major = 0;
    cudaFuncAttributes fa;
    if (cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major == 9 &&
        cudaFuncGetAttributes(&fa, kfn) == cudaSuccess && fa.binaryVersion >= 90 &&
        fa.sharedSizeBytes >= body_static && wg_encoder() != NULL)
        return 1;
    (void)cudaGetLastError(); /* a failed query must not linger as the "last error" */
    return 0;
}

#endif /* NSTF_WGMMA_COMMON_H */
