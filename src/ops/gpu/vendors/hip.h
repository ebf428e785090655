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

#if defined(__HIP_DEVICE_COMPILE__)
#define NSTF_DEVICE_PASS 1
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

/* v_exp_f32 computes 2^x; v_sin/v_cos take revolutions (the backend
 * inserts the 1/2pi scale). Callers range-reduce to [-pi, pi]. */
#define nstf_fast_exp2f(x) __builtin_exp2f(x)
#define nstf_fast_sinf(x) __builtin_sinf(x)
#define nstf_fast_cosf(x) __builtin_cosf(x)
#define nstf_fast_rsqrtf(x) (1.0f / __builtin_sqrtf(x))

static __device__ __forceinline__ float nstf_half_bits_to_float(unsigned short h) {
    return (float)__builtin_bit_cast(_Float16, h);
}

#endif
