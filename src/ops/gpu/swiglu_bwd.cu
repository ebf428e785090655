/* swiglu_bwd.cu — the backward of y = silu(gate) * up, elementwise:
 *   dgate = dy up s (1 + gate (1 - s)),  dup = dy gate s,  s = sigmoid(gate)
 * bf16 in and out, fp32 math. Rows of n_ff elements with their own token
 * strides, so gate | up in one row per token (one GEMM over the adjacent
 * matrices) and separate planes both work.
 *
 * Blocks of (n_ff / VEC threads, tokens): a thread takes VEC elements of a
 * token per step (looping when a row has more chunks than the block is
 * wide), VEC = 8 (16-byte accesses) when n_ff, the five pointers and their
 * strides allow, down to 1 (2-byte accesses: any shape and alignment).
 * Index math inside a row is 32-bit, token offsets 64-bit. One kernel for
 * every width (a uniform switch), so one name carries the machine-code
 * gates (docs/amd_gates.tsv). */
#include "gpu.h"

#include <limits.h>

#define SWB_THREADS 256

/* dgate, dup of one element (g, u, d the gate, up and dy values). */
static __device__ __forceinline__ void swb_one(float g, float u, float d, float *dg, float *du) {
    const float sg = 1.0f / (1.0f + nstf_fast_exp2f(-1.4426950408889634f * g));
    *dg = d * u * sg * (1.0f + g * (1.0f - sg));
    *du = d * g * sg;
}

static __device__ __forceinline__ uint32_t swb_pack(float lo, float hi) {
    return (uint32_t)nstf_float_to_bf16(lo).bits | (uint32_t)nstf_float_to_bf16(hi).bits << 16;
}

template <int VEC>
static __device__ __forceinline__ void swb_rows(const nstf_bf16 *__restrict__ gate, int64_t gs,
                                                const nstf_bf16 *__restrict__ up, int64_t us,
                                                const nstf_bf16 *__restrict__ dy, int64_t ds, nstf_bf16 *dgate,
                                                int64_t dgs, nstf_bf16 *dup, int64_t dus, int64_t n, int n_ff) {
    constexpr int NW = (VEC + 1) / 2;
    const int n_ch = n_ff / VEC;
    const int64_t step = (int64_t)gridDim.x * blockDim.y;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.y + threadIdx.y; t < n; t += step) {
        const nstf_bf16 *gt = gate + t * gs, *ut = up + t * us, *dt = dy + t * ds;
        nstf_bf16 *dgt = dgate + t * dgs, *dut = dup + t * dus;
        for (int c = threadIdx.x * VEC; c < n_ch * VEC; c += blockDim.x * VEC) {
            uint32_t g[NW], u[NW], d[NW], og[NW], ou[NW];
            nstf_bf16_ldv<VEC>(gt + c, g);
            nstf_bf16_ldv<VEC>(ut + c, u);
            nstf_bf16_ldv<VEC>(dt + c, d);
            /* outputs may alias inputs of the same element: all read above */
#pragma unroll
            for (int j = 0; j < NW; j++) {
                float g0, u0, g1, u1;
                swb_one(nstf_bf16lo_to_float(g[j]), nstf_bf16lo_to_float(u[j]), nstf_bf16lo_to_float(d[j]), &g0, &u0);
                swb_one(nstf_bf16hi_to_float(g[j]), nstf_bf16hi_to_float(u[j]), nstf_bf16hi_to_float(d[j]), &g1, &u1);
                og[j] = swb_pack(g0, g1);
                ou[j] = swb_pack(u0, u1);
            }
            nstf_bf16_stv<VEC>(dgt + c, og);
            nstf_bf16_stv<VEC>(dut + c, ou);
        }
    }
}

__global__ void __launch_bounds__(SWB_THREADS)
    swiglu_bwd_kernel(const nstf_bf16 *__restrict__ gate, int64_t gs, const nstf_bf16 *__restrict__ up, int64_t us,
                      const nstf_bf16 *__restrict__ dy, int64_t ds, nstf_bf16 *dgate, int64_t dgs, nstf_bf16 *dup,
                      int64_t dus, int64_t n, int n_ff, int vec) {
    switch (vec) {
    case 8: swb_rows<8>(gate, gs, up, us, dy, ds, dgate, dgs, dup, dus, n, n_ff); break;
    case 4: swb_rows<4>(gate, gs, up, us, dy, ds, dgate, dgs, dup, dus, n, n_ff); break;
    case 2: swb_rows<2>(gate, gs, up, us, dy, ds, dgate, dgs, dup, dus, n, n_ff); break;
    default: swb_rows<1>(gate, gs, up, us, dy, ds, dgate, dgs, dup, dus, n, n_ff); break;
    }
}

extern "C" nstf_status nstf_gpu_swiglu_bwd(const uint16_t *gate, int64_t gate_stride, const uint16_t *up,
                                           int64_t up_stride, const uint16_t *dy, int64_t dy_stride,
                                           uint16_t *dgate, int64_t dgate_stride, uint16_t *dup,
                                           int64_t dup_stride, int64_t n, int64_t n_ff, void *stream) {
    if (!gate || !up || !dy || !dgate || !dup || n < 0 || n_ff <= 0 || n_ff > INT_MAX / 2 || gate_stride < n_ff ||
        up_stride < n_ff || dy_stride < n_ff || dgate_stride < n_ff || dup_stride < n_ff)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_swiglu_bwd: bad arguments (n %lld, n_ff %lld)",
                              (long long)n, (long long)n_ff);
    if (n == 0) return NSTF_OK;
    gpuStream_t s = (gpuStream_t)stream;
    /* every row start: pointers and strides (in bytes) together */
    const uint64_t a = (uint64_t)((uintptr_t)gate | (uintptr_t)up | (uintptr_t)dy | (uintptr_t)dgate |
                                  (uintptr_t)dup) |
                       (uint64_t)((gate_stride | up_stride | dy_stride | dgate_stride | dup_stride) * 2);
    const nstf_rows_launch l = nstf_bf16_rows_launch(a, n_ff, n, SWB_THREADS);
    swiglu_bwd_kernel<<<l.grid, l.block, 0, s>>>(
        (const nstf_bf16 *)gate, gate_stride, (const nstf_bf16 *)up, up_stride, (const nstf_bf16 *)dy, dy_stride,
        (nstf_bf16 *)dgate, dgate_stride, (nstf_bf16 *)dup, dup_stride, n, (int)n_ff, l.vec);
    GPU_LAUNCH_CHECK(s);
    return NSTF_OK;
}
