/* vendors/cuda.h — CUDA names behind the vendor-neutral gpu* runtime names
 * and the few device intrinsics whose spelling differs between vendors.
 * Included only by gpu.h. A flat map: no logic lives here. */
#ifndef NSTF_GPU_VENDORS_CUDA_H
#define NSTF_GPU_VENDORS_CUDA_H

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define NSTF_GPU_VENDOR "CUDA"

/* Collectives: NCCL (loaded at first use, ccl.cu). */
#if defined(NSTF_HAVE_NCCL)
#include <nccl.h>
#define NSTF_CCL_NAME "NCCL"
#define NSTF_CCL_LIBRARY "libnccl.so.2"
#endif

#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuPeekAtLastError cudaPeekAtLastError
#define gpuGetDevice cudaGetDevice
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuDeviceProp_t cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuMemGetInfo cudaMemGetInfo
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemset cudaMemset
#define gpuMemsetAsync cudaMemsetAsync
#define gpuStream_t cudaStream_t
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuEvent_t cudaEvent_t
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuGraphInstantiateWithFlags cudaGraphInstantiateWithFlags
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define gpuGraphDestroy cudaGraphDestroy
#define gpuDeviceCanAccessPeer cudaDeviceCanAccessPeer
#define gpuDeviceEnablePeerAccess cudaDeviceEnablePeerAccess
#define gpuErrorPeerAccessAlreadyEnabled cudaErrorPeerAccessAlreadyEnabled
#define gpuMemcpyPeerAsync cudaMemcpyPeerAsync
#define gpuDeviceGetP2PAttribute cudaDeviceGetP2PAttribute
#define gpuDevP2PAttrPerformanceRank cudaDevP2PAttrPerformanceRank
#define gpuDevP2PAttrNativeAtomicSupported cudaDevP2PAttrNativeAtomicSupported
#define gpuStreamQuery cudaStreamQuery
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuLaunchCooperativeKernel cudaLaunchCooperativeKernel
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor cudaOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuErrorNotReady cudaErrorNotReady

/* Device pass? (host code must not depend on the wave width). */
#if defined(__CUDA_ARCH__)
#define NSTF_DEVICE_PASS 1
#endif

/* NVIDIA warps are 32 lanes on every architecture. */
#define NSTF_WAVE_WIDTH 32
/* Shuffles over the whole warp; the member mask is the full 32-lane mask
 * because every NSTF reduction is executed by all lanes of the warp. */
#define NSTF_SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), NSTF_WAVE)
#define NSTF_SHFL(v, src) __shfl_sync(0xffffffffu, (v), (src), NSTF_WAVE)
/* Bit l set where lane l's predicate holds (lanes past the wave width: 0). */
#define NSTF_BALLOT(p) ((unsigned long long)__ballot_sync(0xffffffffu, (p)))
/* The lanes of a wave meet (shared memory written by one lane, read by another). */
#define NSTF_WAVE_SYNC() __syncwarp()
/* Nanoseconds of the device's global timer (for timeouts in device code). */
#define NSTF_TIMER_NS() nstf_globaltimer_ns()
static __device__ __forceinline__ unsigned long long nstf_globaltimer_ns(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Memory fences at device and at system scope (grid barriers, the peer
 * all-reduce). */
#define NSTF_FENCE_GPU() __threadfence()
#define NSTF_FENCE_SYSTEM() __threadfence_system()
/* Grid barriers (decode_l4.cu): add with release and load with acquire
 * semantics at device scope (cumulative over the block's writes that a
 * preceding __syncthreads ordered), cheaper than a full fence. */
static __device__ __forceinline__ void nstf_red_add_release_gpu(unsigned *p, unsigned v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
static __device__ __forceinline__ unsigned nstf_ld_acquire_gpu(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

/* Fast transcendental intrinsics (arguments range-reduced by the caller). */
#define nstf_fast_exp2f(x) exp2f(x) /* ex2.approx.ftz: 2 ulp */
#define nstf_fast_sinf(x) __sinf(x)  /* accurate to ~2^-21 abs on [-pi, pi] */
#define nstf_fast_cosf(x) __cosf(x)
#define nstf_fast_rsqrtf(x) rsqrtf(x)
#define nstf_fast_log2f(x) __log2f(x) /* lg2.approx: 2^-22 relative */
#define nstf_sqrtf(x) sqrtf(x)       /* correctly rounded */

static __device__ __forceinline__ float nstf_half_bits_to_float(unsigned short h) {
    return __half2float(__ushort_as_half(h));
}
/* fp32 -> fp16 bits, round to nearest even */
static __device__ __forceinline__ unsigned short nstf_float_to_half_bits(float f) {
    return __half_as_ushort(__float2half_rn(f));
}

#endif
