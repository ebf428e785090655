/* vendors/hip.h — HIP names behind the vendor-neutral gpu* runtime names
 * and the few device intrinsics whose spelling differs between vendors.
 * Included only by gpu.h. A flat map: no logic lives here.
 * Device code must build with -nogpulib (no ocml/ockl device library), so
 * math goes through clang builtins that the AMDGPU backend lowers to
 * hardware instructions (v_exp_f32, v_sin_f32, v_rsq_f32). */
#ifndef NSTF_GPU_VENDORS_HIP_H
#define NSTF_GPU_VENDORS_HIP_H

#include <hip/hip_runtime.h>

#define NSTF_GPU_VENDOR "HIP"

/* Collectives: RCCL, NCCL's API under NCCL's names (loaded at first use, ccl.cu). */
#if defined(NSTF_HAVE_NCCL)
#include <rccl/rccl.h>
#define NSTF_CCL_NAME "RCCL"
#define NSTF_CCL_LIBRARY "librccl.so.1"
#endif

#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuPeekAtLastError hipPeekAtLastError
#define gpuGetDevice hipGetDevice
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuDeviceProp_t hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuMemGetInfo hipMemGetInfo
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemset hipMemset
#define gpuMemsetAsync hipMemsetAsync
#define gpuStream_t hipStream_t
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuEvent_t hipEvent_t
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuFuncSetAttribute hipFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuGraphInstantiateWithFlags hipGraphInstantiateWithFlags
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphExecDestroy hipGraphExecDestroy
#define gpuGraphDestroy hipGraphDestroy
#define gpuDeviceCanAccessPeer hipDeviceCanAccessPeer
#define gpuDeviceEnablePeerAccess hipDeviceEnablePeerAccess
#define gpuErrorPeerAccessAlreadyEnabled hipErrorPeerAccessAlreadyEnabled
#define gpuMemcpyPeerAsync hipMemcpyPeerAsync
#define gpuDeviceGetP2PAttribute hipDeviceGetP2PAttribute
#define gpuDevP2PAttrPerformanceRank hipDevP2PAttrPerformanceRank
#define gpuDevP2PAttrNativeAtomicSupported hipDevP2PAttrNativeAtomicSupported
#define gpuStreamQuery hipStreamQuery
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuLaunchCooperativeKernel hipLaunchCooperativeKernel
#define gpuOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define gpuErrorNotReady hipErrorNotReady

#if defined(__HIP_DEVICE_COMPILE__)
#define NSTF_DEVICE_PASS 1
/* ROCm 5.2's threadIdx/blockIdx/blockDim/gridDim call the ockl device
 * library (__ockl_get_local_id, ...), which a -nogpulib build does not
 * have. These read the same values from hardware registers and the
 * dispatch packet (hsa_kernel_dispatch_packet_t: workgroup_size_x/y/z are
 * uint16 at bytes 4/6/8, grid_size_x/y/z uint32 at bytes 12/16/20). */
static __device__ __forceinline__ unsigned nstf_amd_wg_size(int d) {
    return ((const unsigned short *)__builtin_amdgcn_dispatch_ptr())[2 + d];
}
static __device__ __forceinline__ unsigned nstf_amd_n_groups(int d) {
    const unsigned g = ((const unsigned *)__builtin_amdgcn_dispatch_ptr())[3 + d];
    const unsigned w = nstf_amd_wg_size(d);
    return (g + w - 1) / w;
}
struct nstf_amd_thread_idx {
    __declspec(property(get = get_x)) unsigned x;
    __declspec(property(get = get_y)) unsigned y;
    __declspec(property(get = get_z)) unsigned z;
    __device__ unsigned get_x() const { return __builtin_amdgcn_workitem_id_x(); }
    __device__ unsigned get_y() const { return __builtin_amdgcn_workitem_id_y(); }
    __device__ unsigned get_z() const { return __builtin_amdgcn_workitem_id_z(); }
};
struct nstf_amd_block_idx {
    __declspec(property(get = get_x)) unsigned x;
    __declspec(property(get = get_y)) unsigned y;
    __declspec(property(get = get_z)) unsigned z;
    __device__ unsigned get_x() const { return __builtin_amdgcn_workgroup_id_x(); }
    __device__ unsigned get_y() const { return __builtin_amdgcn_workgroup_id_y(); }
    __device__ unsigned get_z() const { return __builtin_amdgcn_workgroup_id_z(); }
};
struct nstf_amd_block_dim {
    __declspec(property(get = get_x)) unsigned x;
    __declspec(property(get = get_y)) unsigned y;
    __declspec(property(get = get_z)) unsigned z;
    __device__ unsigned get_x() const { return nstf_amd_wg_size(0); }
    __device__ unsigned get_y() const { return nstf_amd_wg_size(1); }
    __device__ unsigned get_z() const { return nstf_amd_wg_size(2); }
};
struct nstf_amd_grid_dim {
    __declspec(property(get = get_x)) unsigned x;
    __declspec(property(get = get_y)) unsigned y;
    __declspec(property(get = get_z)) unsigned z;
    __device__ unsigned get_x() const { return nstf_amd_n_groups(0); }
    __device__ unsigned get_y() const { return nstf_amd_n_groups(1); }
    __device__ unsigned get_z() const { return nstf_amd_n_groups(2); }
};
#define threadIdx (nstf_amd_thread_idx{})
#define blockIdx (nstf_amd_block_idx{})
#define blockDim (nstf_amd_block_dim{})
#define gridDim (nstf_amd_grid_dim{})
/* ROCm 5.2's __syncthreads calls __atomic_work_item_fence (device library):
 * the same workgroup release/acquire fences around s_barrier, as builtins. */
static __device__ __forceinline__ void nstf_amd_syncthreads(void) {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
#define __syncthreads() nstf_amd_syncthreads()
#endif

/* CDNA (gfx9) runs 64-lane waves, RDNA (gfx10+) 32-lane waves by default.
 * The compiler says which for the target being compiled. The host pass
 * has no target: 64 there is a placeholder that host code never uses. */
#if defined(__AMDGCN_WAVEFRONT_SIZE)
#define NSTF_WAVE_WIDTH __AMDGCN_WAVEFRONT_SIZE
#else
#define NSTF_WAVE_WIDTH 64
#endif
/* ROCm's shuffles take no member mask (the whole wave participates). */
#define NSTF_SHFL_XOR(v, m) __shfl_xor((v), (m), NSTF_WAVE)
#define NSTF_SHFL(v, src) __shfl((v), (src), NSTF_WAVE)
/* Bit l set where lane l's predicate holds (lanes past the wave width: 0). */
#define NSTF_BALLOT(p) ((unsigned long long)__ballot((p)))
/* The lanes of a wave meet (shared memory written by one lane, read by another). */
#define NSTF_WAVE_SYNC() __builtin_amdgcn_wave_barrier()
/* Nanoseconds of the device's constant 100 MHz counter (for timeouts in
 * device code): clang's steady counter (s_memrealtime on gfx9,
 * s_sendmsg_rtn REALTIME on gfx11), or s_memrealtime itself where the
 * compiler is older. */
#if __has_builtin(__builtin_readsteadycounter)
#define NSTF_TIMER_NS() ((unsigned long long)__builtin_readsteadycounter() * 10ull)
#else
#define NSTF_TIMER_NS() ((unsigned long long)__builtin_amdgcn_s_memrealtime() * 10ull)
#endif
/* Memory fences at device (agent) and at system scope (grid barriers, the
 * peer all-reduce): the builtin, not __threadfence(), which calls a
 * device-library function. */
#define NSTF_FENCE_GPU() __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent")
#define NSTF_FENCE_SYSTEM() __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "")
/* Grid barriers (decode_l4.cu): add with release and load with acquire
 * semantics at agent (device) scope. */
static __device__ __forceinline__ void nstf_red_add_release_gpu(unsigned *p, unsigned v) {
    (void)__hip_atomic_fetch_add(p, v, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
static __device__ __forceinline__ unsigned nstf_ld_acquire_gpu(const unsigned *p) {
    return __hip_atomic_load((unsigned *)p, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}

/* v_exp_f32 computes 2^x; v_sin/v_cos take revolutions (the backend
 * inserts the 1/2pi scale). Callers range-reduce to [-pi, pi]. */
#define nstf_fast_exp2f(x) __builtin_exp2f(x)
#define nstf_fast_sinf(x) __builtin_sinf(x)
#define nstf_fast_cosf(x) __builtin_cosf(x)
#define nstf_fast_rsqrtf(x) (1.0f / __builtin_sqrtf(x))
#define nstf_fast_log2f(x) __builtin_log2f(x) /* v_log_f32 */
#define nstf_sqrtf(x) __builtin_sqrtf(x)

static __device__ __forceinline__ float nstf_half_bits_to_float(unsigned short h) {
    return (float)__builtin_bit_cast(_Float16, h);
}
/* fp32 -> fp16 bits, round to nearest even */
static __device__ __forceinline__ unsigned short nstf_float_to_half_bits(float f) {
    return __builtin_bit_cast(unsigned short, (_Float16)f);
}

#endif
