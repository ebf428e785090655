/* decode_l4.cu — level 4: the whole decode step of one token as one
 * persistent kernel.
 *
 * The host records the step once as a program (nstf_l4_ins, l4_api.h;
 * backend/gpu_l4.c): the embedding row, then per layer the QKV GEMV (norm
 * prologue, RoPE epilogue that also writes k and v into the cache row of
 * the position), the attention, the out-projection GEMV (the attention's
 * merge as its prologue, residual added), the gate|up GEMV (norm
 * prologue, SwiGLU epilogue), the down GEMV (residual added), and the
 * logits GEMV (norm prologue, greedy token fused). One cooperative launch
 * of one block per SM runs the program; after every instruction but the
 * last the blocks meet at a grid barrier: a counter in global memory that
 * each block adds one to with release semantics and polls (relaxed loads,
 * then one acquire load), so no kernel boundary, launch or graph node sits
 * between two ops. While a block works on an instruction it reads the next
 * one (a word per thread) and starts the next GEMV's first weight bytes
 * towards L2 (sm_90 bulk prefetch); before the barrier it copies that
 * GEMV's constant data into shared memory (cp.async: its weight rows up to
 * the stage's size, the norm weights, the RoPE tables), so the barrier's
 * wait overlaps the next op's first loads.
 *
 * Work: a GEMV's rows (pairs of rows for the RoPE and SwiGLU epilogues)
 * are cut into one contiguous range per block; the waves of a block take
 * 4 rows at a time, each lane 16-byte loads of the 4 rows (from the stage
 * or global memory) against the input in shared memory (fp32 of the
 * bf16-rounded input: the norm prologue is computed by every block that
 * has rows). The attention is split-KV: one wave per (kv head, split of
 * the context), all query heads of the kv head's group at once (K and V
 * read once), a lane per key, an online softmax over tiles of one key per
 * lane; each split stores its partial (m, l, acc), and the out-projection
 * merges them in its prologue (l4_merge), so the merge needs neither a
 * barrier nor atomics. The greedy token: each block reduces its rows' best
 * (value, index), the last block to finish (a counter) the blocks' bests
 * (nstf_argmax_better: first index on ties, NaN never wins).
 *
 * Against L3 (the fused GEMV kernels): the same bf16 roundings between
 * ops, but not the same order of the fp32 sums (lanes split the rows
 * differently), so logits differ at rounding level; test_levels_gpu states
 * the tolerance (greedy tokens equal up to near-ties, KL bound).
 *
 * A barrier not complete within the timeout sets a status word {1,
 * instruction, blocks arrived, grid} and every block leaves; the host
 * turns that into an error. The counters reset themselves at the end of a
 * good step (the last block to leave zeroes the barrier counter). With a
 * trace buffer, block 0 and every block's end of work stamp the device's
 * global timer (nstf bench --levels prints the timeline). */
#include "gpu.h"
#include "fused_math.h"
#include "mma.h"
#include "l4_api.h"

#include <limits.h>

#define L4_THREADS 512
#define L4_WAVES (L4_THREADS / NSTF_WAVE)
#define L4_GMAX 4       /* query heads per kv head (more: the step runs at L3) */
#define L4_SPLITS NSTF_L4_SPLITS /* most splits of the context per kv head */
#define L4_PREFETCH (64u << 10) /* bytes of the next GEMV's rows a block starts towards L2 */

/* control words: [0] barrier arrivals, [1] blocks left, [2] argmax blocks done */
#define L4_SYNC_WORDS 3

typedef unsigned int u32;

struct l4_ctl {
    const int32_t *dio;
    u32 *sync;
    float *part; /* attention partials */
    float *am;   /* [grid][2] blocks' best (value, index bits) */
    int32_t *status;
    int q_stride;           /* floats of shared memory per wave for the attention's q */
    int a_floats, b_floats; /* the shared memory's regions A and B (l4_smem) */
    int stage_bytes;        /* its region C */
    unsigned long long *trace; /* NULL, or [1 + 2 n_ins]: start, then per instruction the
                                  last block's end of work and block 0's exit from the barrier */
    int stall_block, stall_ins;
    unsigned long long timeout_ns;
};


template <bool F16> static __device__ __forceinline__ float l4_w_lo(u32 w) {
    if (F16) return nstf_half_bits_to_float((unsigned short)(w & 0xffffu));
    return nstf_bf16lo_to_float(w);
}
template <bool F16> static __device__ __forceinline__ float l4_w_hi(u32 w) {
    if (F16) return nstf_half_bits_to_float((unsigned short)(w >> 16));
    return nstf_bf16hi_to_float(w);
}

/* ---- the grid barrier ----------------------------------------------------- */

/* Every block calls it with the same k (0, 1, ...); returns false when the
 * step failed (a stall somewhere): the caller leaves. */
static __device__ __forceinline__ bool l4_barrier(const l4_ctl &c, u32 k, int ins) {
    __shared__ int ok;
    __syncthreads();
    if (threadIdx.x == 0) {
        ok = 1;
        nstf_red_add_release_gpu(&c.sync[0], 1u); /* this block's writes (ordered by the __syncthreads) before it */
        const u32 target = (k + 1) * gridDim.x;
        const unsigned long long t0 = NSTF_TIMER_NS();
        for (u32 spin = 0;; spin++) {
            const u32 n = *(volatile u32 *)&c.sync[0]; /* polled without ordering, */
            if (n >= target) {
                (void)nstf_ld_acquire_gpu(&c.sync[0]); /* then the other blocks' writes after it */
                break;
            }
            if ((spin & 255u) == 255u) {
                if (*(volatile int32_t *)&c.status[0] != 0) {
                    ok = 0;
                    break;
                }
                if (NSTF_TIMER_NS() - t0 > c.timeout_ns) {
                    if (atomicCAS(&c.status[0], 0, 1) == 0) {
                        c.status[1] = ins;
                        c.status[2] = (int32_t)(n - k * gridDim.x);
                        c.status[3] = (int32_t)gridDim.x;
                        NSTF_FENCE_GPU();
                    }
                    ok = 0;
                    break;
                }
            }
        }
    }
    __syncthreads();
    return ok != 0;
}

/* ---- GEMV ----------------------------------------------------------------- */

/* Units of a GEMV: rows, or row pairs for the RoPE and SwiGLU epilogues. */
static __device__ __forceinline__ bool l4_pair(const nstf_l4_ins &in) {
    return in.epi == NSTF_GEMV_ROPE || in.epi == NSTF_GEMV_SWIGLU;
}

static __device__ __forceinline__ void l4_unit_range(const nstf_l4_ins &in, int blk, int *u0, int *u1) {
    const int U = l4_pair(in) ? in.n_out / 2 : in.n_out;
    const int per = (U + (int)gridDim.x - 1) / (int)gridDim.x;
    const int a = blk * per, b = a + per < U ? a + per : U;
    *u0 = a < U ? a : U;
    *u1 = b;
}

/* The two rows of pair p (fz_row's mapping, gemv_fused.h). */
static __device__ __forceinline__ void l4_pair_rows(const nstf_l4_ins &in, int p, int *r0, int *r1) {
    if (in.epi == NSTF_GEMV_SWIGLU) {
        *r0 = p;
        *r1 = in.n_out / 2 + p;
        return;
    }
    if (2 * p >= in.rope_rows) {
        *r0 = 2 * p;
        *r1 = 2 * p + 1;
        return;
    }
    const int half = in.head_dim / 2, h = p / half, i = p % half;
    *r0 = h * in.head_dim + (in.neox ? i : 2 * i);
    *r1 = *r0 + (in.neox ? half : 1);
}

/* Starts the block's rows of a GEMV towards L2 (at most L4_PREFETCH bytes). */
static __device__ __forceinline__ void l4_prefetch(const nstf_l4_ins &in) {
    if (threadIdx.x != 0 || in.op != NSTF_L4_GEMV) return;
    int u0, u1;
    l4_unit_range(in, blockIdx.x, &u0, &u1);
    if (u0 >= u1) return;
    const size_t rb = (size_t)in.n_in * 2;
    size_t lo[2], hi[2];
    int n = 1;
    if (in.epi == NSTF_GEMV_SWIGLU) { /* gate rows and up rows */
        lo[0] = (size_t)u0 * rb;
        hi[0] = (size_t)u1 * rb;
        lo[1] = ((size_t)in.n_out / 2 + u0) * rb;
        hi[1] = ((size_t)in.n_out / 2 + u1) * rb;
        n = 2;
    } else if (in.epi == NSTF_GEMV_ROPE) { /* pairs stay within their heads' rows */
        lo[0] = (size_t)(2 * u0 / in.head_dim * in.head_dim) * rb;
        hi[0] = (size_t)((2 * u1 + in.head_dim - 1) / in.head_dim * in.head_dim) * rb;
        if (hi[0] > (size_t)in.n_out * rb) hi[0] = (size_t)in.n_out * rb;
    } else {
        lo[0] = (size_t)u0 * rb;
        hi[0] = (size_t)u1 * rb;
    }
    size_t budget = L4_PREFETCH;
    for (int i = 0; i < n && budget > 0; i++) {
        const uintptr_t a = ((uintptr_t)in.w + lo[i] + 15) & ~(uintptr_t)15;
        uintptr_t b = ((uintptr_t)in.w + hi[i]) & ~(uintptr_t)15;
        if (b > a + budget) b = a + budget;
        if (b > a) {
            NSTF_L2_PREFETCH((const void *)a, b - a);
            budget -= b - a;
        }
    }
}

/* Shared memory of the kernel: A (the GEMV input as fp32, or the
 * attention's q per wave), B (the next GEMV's norm weights), C (its first
 * weight rows), all staged from constant data while the block waits at the
 * barrier before that GEMV. */
struct l4_smem {
    float *xs, *nws;
    uint8_t *wst;
    int stage_bytes;
    float *rf; /* RoPE frequencies [head_dim], then the factors [head_dim / 2] */
};

/* Whether a QKV GEMV's RoPE tables are staged (16-byte aligned, head_dim a multiple of 8, <= 128). */
static __device__ __forceinline__ bool l4_staged_rope(const nstf_l4_ins &in) {
    return in.epi == NSTF_GEMV_ROPE && in.head_dim % 8 == 0 && in.head_dim <= 128 &&
           ((uintptr_t)in.freqs & 15) == 0 && ((uintptr_t)in.factors & 15) == 0;
}

/* How many of the block's rows (in unit order, both rows of a pair) the
 * stage holds, and whether the norm weights are staged. */
static __device__ __forceinline__ int l4_staged_rows(const nstf_l4_ins &in, int u0, int u1, int stage_bytes) {
    const int rpu = l4_pair(in) ? 2 : 1, n = (u1 - u0) * rpu, fit = stage_bytes / (in.n_in * 2);
    return n < fit ? n : fit;
}
static __device__ __forceinline__ bool l4_staged_nw(const nstf_l4_ins &in) {
    return in.nx && ((uintptr_t)in.nw & 15) == 0;
}
static __device__ __forceinline__ int l4_slot_row(const nstf_l4_ins &in, int u0, int slot) {
    if (!l4_pair(in)) return u0 + slot;
    int r0, r1;
    l4_pair_rows(in, u0 + slot / 2, &r0, &r1);
    return slot % 2 ? r1 : r0;
}

/* Starts the copies of a GEMV's constant data into the stage (cp.async on
 * NVIDIA; plain copies elsewhere); the kernel waits for them after the
 * barrier. */
static __device__ __forceinline__ void l4_stage(const nstf_l4_ins &in, const l4_smem &sm) {
    if (in.op != NSTF_L4_GEMV) return;
    const int tid = threadIdx.x, n_in = in.n_in;
    if (l4_staged_nw(in))
        for (int j = tid * 4; j < n_in; j += L4_THREADS * 4) nstf_cp16(sm.nws + j, in.nw + j, true);
    if (l4_staged_rope(in)) {
        const int hd = in.head_dim;
        if (tid * 4 < hd) nstf_cp16(sm.rf + tid * 4, in.freqs + tid * 4, true);
        if (in.factors && tid * 4 < hd / 2) nstf_cp16(sm.rf + hd + tid * 4, in.factors + tid * 4, true);
    }
    int u0, u1;
    l4_unit_range(in, blockIdx.x, &u0, &u1);
    if (u0 < u1) {
        const int n_st = l4_staged_rows(in, u0, u1, sm.stage_bytes), chunks = n_in / 8;
        const size_t rb = (size_t)n_in * 2;
        for (int k = tid; k < n_st * chunks; k += L4_THREADS) {
            const int slot = k / chunks, ch = k % chunks;
            const int row = l4_slot_row(in, u0, slot);
            nstf_cp16(sm.wst + slot * rb + (size_t)ch * 16, (const uint8_t *)in.w + (size_t)row * rb + (size_t)ch * 16,
                      true);
        }
    }
    nstf_cp_commit();
}

/* Dot products of 4 rows (p[r]: the row's data in the stage or in global
 * memory; v[r] false: none) with the input xs; every lane gets the sums. */
template <bool F16>
static __device__ __forceinline__ void l4_dot4(const uint4 *const (&p)[4], const bool (&v)[4], int n_in,
                                               const float *xs, float (&acc)[4], int lane) {
    const int nch = n_in / 8;
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] = 0.0f;
#pragma unroll 2
    for (int c = lane; c < nch; c += NSTF_WAVE) {
        uint4 w[4];
#pragma unroll
        for (int r = 0; r < 4; r++) w[r] = v[r] ? p[r][c] : make_uint4(0, 0, 0, 0);
        const float4 xa = ((const float4 *)xs)[2 * c], xb = ((const float4 *)xs)[2 * c + 1];
#pragma unroll
        for (int r = 0; r < 4; r++) {
            float a = acc[r];
            a = fmaf(l4_w_lo<F16>(w[r].x), xa.x, a);
            a = fmaf(l4_w_hi<F16>(w[r].x), xa.y, a);
            a = fmaf(l4_w_lo<F16>(w[r].y), xa.z, a);
            a = fmaf(l4_w_hi<F16>(w[r].y), xa.w, a);
            a = fmaf(l4_w_lo<F16>(w[r].z), xb.x, a);
            a = fmaf(l4_w_hi<F16>(w[r].z), xb.y, a);
            a = fmaf(l4_w_lo<F16>(w[r].w), xb.z, a);
            a = fmaf(l4_w_hi<F16>(w[r].w), xb.w, a);
            acc[r] = a;
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) acc[r] = wave_reduce_sum(acc[r]);
}

/* The RoPE epilogue of pair (r0, r1) with dot products a, b (lane 0). */
static __device__ __forceinline__ void l4_rope_store(const nstf_l4_ins &in, int r0, int r1, float a, float b,
                                                     int32_t pos, const float *freqs, const float *factors) {
    nstf_bf16 *y = (nstf_bf16 *)in.y;
    a = bf16_round(a); /* the unfused RoPE reads bf16 */
    b = bf16_round(b);
    if (r0 < in.rope_rows) {
        const int half = in.head_dim / 2, i = in.neox ? r0 % in.head_dim : (r0 % in.head_dim) / 2;
        float hi = freqs[i], lo = freqs[half + i], c, s;
        if (factors) nstf_rope_scale(factors[i], &hi, &lo);
        nstf_rope_cs(pos, hi, lo, &c, &s);
        nstf_rope_rot(a, b, c, s, &a, &b);
    }
    const nstf_bf16 ya = nstf_float_to_bf16(a), yb = nstf_float_to_bf16(b);
    y[r0] = ya;
    y[r1] = yb;
    if (!in.kc || r0 < in.q_rows) return;
    const size_t row = (size_t)pos * in.kv_dim;
    if (r0 < in.rope_rows) {
        ((nstf_bf16 *)in.kc)[row + r0 - in.q_rows] = ya;
        ((nstf_bf16 *)in.kc)[row + r1 - in.q_rows] = yb;
    } else {
        ((nstf_bf16 *)in.vc)[row + r0 - in.rope_rows] = ya;
        ((nstf_bf16 *)in.vc)[row + r1 - in.rope_rows] = yb;
    }
}

/* Block-wide best (value, index); the result in thread 0. */
static __device__ __forceinline__ void l4_best_reduce(float &bv, int32_t &bi, float *red) {
    NSTF_WAVE_XOR_LOOP(o, NSTF_WAVE) {
        const float v = NSTF_SHFL_XOR(bv, o);
        const int32_t i = NSTF_SHFL_XOR(bi, o);
        if (nstf_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    __syncthreads();
    if (lane == 0) {
        red[2 * wave] = bv;
        red[2 * wave + 1] = __int_as_float(bi);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int w = 1; w < L4_WAVES; w++) {
            const float v = red[2 * w];
            const int32_t i = __float_as_int(red[2 * w + 1]);
            if (nstf_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
        }
}

static __device__ __forceinline__ void l4_merge(const nstf_l4_ins &in, const l4_ctl &c, float *xs, float *ws);

template <bool F16>
static __device__ __forceinline__ void l4_gemv(const nstf_l4_ins &in, const l4_ctl &c, const l4_smem &sm, float *red) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE, n_in = in.n_in;
    int u0, u1;
    l4_unit_range(in, blockIdx.x, &u0, &u1);
    const bool pair = l4_pair(in);
    float *xs = sm.xs;
    float bv = -__builtin_huge_valf();
    int32_t bi = INT_MAX;
    if (u0 < u1) {
        if (in.nx) { /* x = bf16(nx / rms(nx) * nw): nx staged raw, then normalized in place */
            const float *nw = l4_staged_nw(in) ? sm.nws : in.nw;
            float ss = 0.0f;
#pragma unroll 4
            for (int i = threadIdx.x; i < n_in; i += L4_THREADS) {
                const float v = in.nx[i];
                xs[i] = v;
                ss = fmaf(v, v, ss);
            }
            ss = block_reduce_sum(ss, red);
            const float rn = nstf_fast_rsqrtf(ss / (float)n_in + in.eps);
            for (int i = threadIdx.x; i < n_in; i += L4_THREADS) xs[i] = bf16_round(xs[i] * rn * nw[i]);
        } else if (in.n_heads > 0) { /* the out-projection: the attention's splits merged */
            l4_merge(in, c, xs, sm.nws);
        } else {
#pragma unroll 4
            for (int i = threadIdx.x; i < n_in; i += L4_THREADS)
                xs[i] = nstf_bf16_to_float(((const nstf_bf16 *)in.x)[i]);
        }
        __syncthreads();
        const int32_t pos = in.epi == NSTF_GEMV_ROPE ? c.dio[1] : 0;
        const bool rs = l4_staged_rope(in);
        const float *freqs = rs ? sm.rf : in.freqs, *factors = in.factors ? (rs ? sm.rf + in.head_dim : in.factors) : NULL;
        const int upi = pair ? 2 : 4; /* units per wave iteration */
        const int n_st = l4_staged_rows(in, u0, u1, sm.stage_bytes);
        const size_t rb = (size_t)n_in * 2;
        for (int u = u0 + wave * upi; u < u1; u += L4_WAVES * upi) {
            int row[4], slot[4];
            if (pair) {
                l4_pair_rows(in, u, &row[0], &row[1]);
                if (u + 1 < u1) l4_pair_rows(in, u + 1, &row[2], &row[3]);
                else row[2] = row[3] = -1;
#pragma unroll
                for (int r = 0; r < 4; r++) slot[r] = 2 * (u - u0) + r;
            } else {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    row[r] = u + r < u1 ? u + r : -1;
                    slot[r] = u - u0 + r;
                }
            }
            const uint4 *p[4];
            bool v[4];
            float old[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int r = 0; r < 4; r++) {
                v[r] = row[r] >= 0;
                p[r] = slot[r] < n_st ? (const uint4 *)(sm.wst + (size_t)slot[r] * rb)
                                      : (const uint4 *)((const uint8_t *)in.w + (size_t)(v[r] ? row[r] : 0) * rb);
                /* the residual's rows, loaded while the dot products run */
                if (in.epi == NSTF_GEMV_ACCUM && lane == 0 && v[r]) old[r] = ((const float *)in.y)[row[r]];
            }
            float acc[4];
            l4_dot4<F16>(p, v, n_in, xs, acc, lane);
            if (lane != 0) continue;
            if (in.epi == NSTF_GEMV_SWIGLU) {
                nstf_bf16 *y = (nstf_bf16 *)in.y;
                y[row[0]] = nstf_float_to_bf16(nstf_swiglu1(bf16_round(acc[0]), bf16_round(acc[1])));
                if (row[2] >= 0) y[row[2]] = nstf_float_to_bf16(nstf_swiglu1(bf16_round(acc[2]), bf16_round(acc[3])));
            } else if (in.epi == NSTF_GEMV_ROPE) {
                l4_rope_store(in, row[0], row[1], acc[0], acc[1], pos, freqs, factors);
                if (row[2] >= 0) l4_rope_store(in, row[2], row[3], acc[2], acc[3], pos, freqs, factors);
            } else {
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    if (!v[r]) continue;
                    if (in.epi == NSTF_GEMV_ACCUM) ((float *)in.y)[row[r]] = old[r] + acc[r];
                    else if (in.y_bf16) ((nstf_bf16 *)in.y)[row[r]] = nstf_float_to_bf16(acc[r]);
                    else ((float *)in.y)[row[r]] = acc[r];
                    if (nstf_argmax_better(acc[r], row[r], bv, bi)) {
                        bv = acc[r];
                        bi = row[r];
                    }
                }
            }
        }
    }
    if (!in.argmax) return;
    /* the greedy token: every block's best, then the last block's reduction */
    __shared__ int last;
    l4_best_reduce(bv, bi, red);
    if (threadIdx.x == 0) {
        c.am[2 * blockIdx.x] = bv;
        c.am[2 * blockIdx.x + 1] = __int_as_float(bi);
        NSTF_FENCE_GPU();
        last = atomicAdd(&c.sync[2], 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    NSTF_FENCE_GPU();
    bv = -__builtin_huge_valf();
    bi = INT_MAX;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += L4_THREADS) {
        const float v = *(volatile float *)&c.am[2 * b];
        const int32_t i = __float_as_int(*(volatile float *)&c.am[2 * b + 1]);
        if (nstf_argmax_better(v, i, bv, bi)) { bv = v; bi = i; }
    }
    l4_best_reduce(bv, bi, red);
    if (threadIdx.x == 0) {
        in.argmax[0] = bi == INT_MAX ? 0 : bi;
        c.sync[2] = 0;
    }
}

/* ---- embedding ------------------------------------------------------------ */

static __device__ __forceinline__ void l4_embed(const nstf_l4_ins &in, const l4_ctl &c) {
    const int32_t tok = c.dio[0];
    const bool bad = tok < 0 || tok >= in.n_out;
    float *y = (float *)in.y;
    for (int i = blockIdx.x * L4_THREADS + threadIdx.x; i < in.n_in; i += gridDim.x * L4_THREADS) {
        const size_t o = (size_t)(bad ? 0 : tok) * in.n_in + i;
        float v;
        if (in.wtype == NSTF_TYPE_BF16) v = nstf_bf16_to_float(((const nstf_bf16 *)in.w)[o]);
        else if (in.wtype == NSTF_TYPE_F16) v = nstf_half_bits_to_float(((const unsigned short *)in.w)[o]);
        else v = ((const float *)in.w)[o];
        y[i] = bad ? __builtin_nanf("") : v;
    }
}

/* ---- attention -------------------------------------------------------------- */

/* One wave: kv head hkv, keys [k0, k1); the G query heads of the group.
 * Writes the partials (m, l, acc) of split s, or with one split the output. */
template <int HD>
static __device__ __forceinline__ void l4_attn_split(const nstf_l4_ins &in, const l4_ctl &c, int hkv, int s, int n_split, int64_t k0,
                                     int64_t k1, float *qs, int lane) {
    constexpr int DPL = HD / NSTF_WAVE > 0 ? HD / NSTF_WAVE : 1; /* dims per lane */
    constexpr int DL = HD / DPL;                                 /* lanes holding dims */
    const int G = in.n_heads / in.n_kv_heads, kvd = in.kv_dim;
    const float sl2 = in.scale * 1.4426950408889634f;
    NSTF_WAVE_SYNC(); /* the previous item's reads of qs are done */
    { /* q's loads all in flight before the first store */
        constexpr int QPL = L4_GMAX * HD / NSTF_WAVE;
        const nstf_bf16 *qg = (const nstf_bf16 *)in.q + (size_t)hkv * G * HD;
        float qv[QPL];
#pragma unroll
        for (int k = 0; k < QPL; k++) {
            const int i = k * NSTF_WAVE + lane;
            qv[k] = i < G * HD ? nstf_bf16_to_float(qg[i]) : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < QPL; k++)
            if (k * NSTF_WAVE + lane < G * HD) qs[k * NSTF_WAVE + lane] = qv[k] * sl2;
    }
    NSTF_WAVE_SYNC();
    float m[L4_GMAX], l[L4_GMAX], acc[L4_GMAX][DPL];
#pragma unroll
    for (int g = 0; g < L4_GMAX; g++) {
        m[g] = -__builtin_huge_valf();
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) acc[g][d] = 0.0f;
    }
    const nstf_bf16 *kc = (const nstf_bf16 *)in.kc + (size_t)hkv * HD;
    const nstf_bf16 *vc = (const nstf_bf16 *)in.vc + (size_t)hkv * HD;
    for (int64_t t0 = k0; t0 < k1; t0 += NSTF_WAVE) {
        const int64_t j = t0 + lane;
        const bool valid = j < k1;
        float sc[L4_GMAX];
#pragma unroll
        for (int g = 0; g < L4_GMAX; g++) sc[g] = 0.0f;
        if (valid) {
            const uint4 *kr = (const uint4 *)(kc + (size_t)j * kvd);
#pragma unroll 8
            for (int ch = 0; ch < HD / 8; ch++) {
                const uint4 kv = kr[ch];
                const float kf[8] = {nstf_bf16lo_to_float(kv.x), nstf_bf16hi_to_float(kv.x), nstf_bf16lo_to_float(kv.y),
                                     nstf_bf16hi_to_float(kv.y), nstf_bf16lo_to_float(kv.z), nstf_bf16hi_to_float(kv.z),
                                     nstf_bf16lo_to_float(kv.w), nstf_bf16hi_to_float(kv.w)};
#pragma unroll
                for (int g = 0; g < L4_GMAX; g++) {
                    if (g >= G) continue;
                    float a = sc[g];
#pragma unroll
                    for (int e = 0; e < 8; e++) a = fmaf(qs[g * HD + ch * 8 + e], kf[e], a);
                    sc[g] = a;
                }
            }
        }
        float p[L4_GMAX];
#pragma unroll
        for (int g = 0; g < L4_GMAX; g++) {
            if (g >= G) continue;
            const float sv = valid ? sc[g] : -__builtin_huge_valf();
            const float mn = fmaxf(m[g], wave_reduce_max(sv));
            const float corr = nstf_fast_exp2f(m[g] - mn); /* m = -inf at first: 0 */
            p[g] = valid ? nstf_fast_exp2f(sv - mn) : 0.0f;
            l[g] = l[g] * corr + wave_reduce_sum(p[g]);
            m[g] = mn;
#pragma unroll
            for (int d = 0; d < DPL; d++) acc[g][d] *= corr;
        }
        const int nj = k1 - t0 < NSTF_WAVE ? (int)(k1 - t0) : NSTF_WAVE;
        /* V rows VE at a time, their loads issued together (one latency per VE keys, not per key) */
        constexpr int VE = DPL >= 4 ? 4 : 8;
        for (int j0 = 0; j0 < nj; j0 += VE) {
            float vv[VE][DPL];
#pragma unroll
            for (int e = 0; e < VE; e++) {
                const nstf_bf16 *vr = vc + (size_t)(t0 + j0 + e) * kvd + lane * DPL;
#pragma unroll
                for (int d = 0; d < DPL; d++) vv[e][d] = j0 + e < nj && lane < DL ? nstf_bf16_to_float(vr[d]) : 0.0f;
            }
#pragma unroll
            for (int e = 0; e < VE; e++)
#pragma unroll
                for (int g = 0; g < L4_GMAX; g++) {
                    if (g >= G) continue;
                    const float pj = NSTF_SHFL(p[g], (j0 + e) % NSTF_WAVE);
#pragma unroll
                    for (int d = 0; d < DPL; d++) acc[g][d] = fmaf(pj, vv[e][d], acc[g][d]);
                }
        }
    }
    /* partials [n_kv][n_split][G][HD + 2]: the out-projection merges them (l4_merge) */
    float *part = c.part + (((size_t)hkv * n_split + s) * G) * (HD + 2);
#pragma unroll
    for (int g = 0; g < L4_GMAX; g++) {
        if (g >= G) continue;
        float *pg = part + (size_t)g * (HD + 2);
        if (lane == 0) {
            pg[0] = m[g];
            pg[1] = l[g];
        }
        if (lane < DL)
#pragma unroll
            for (int d = 0; d < DPL; d++) pg[2 + lane * DPL + d] = acc[g][d];
    }
}

/* The split plan of the attention at position pos (the same in the
 * attention and in the merge): keys [lo, pos], n_split splits of chunk
 * keys, at least one key per lane, enough of them to give every wave one. */
static __device__ __forceinline__ int l4_splits(const nstf_l4_ins &in, int64_t pos, int64_t *lo, int64_t *chunk) {
    *lo = in.window > 0 && pos + 1 > in.window ? pos + 1 - in.window : 0;
    const int64_t len = pos + 1 - *lo;
    const int n_kv = in.n_kv_heads, tw = (int)gridDim.x * L4_WAVES;
    int64_t want = (tw + n_kv - 1) / n_kv;
    if (want > L4_SPLITS) want = L4_SPLITS;
    int64_t ch = (len + want - 1) / want;
    ch = (ch + NSTF_WAVE - 1) / NSTF_WAVE * NSTF_WAVE;
    *chunk = ch;
    return (int)((len + ch - 1) / ch);
}

/* The out-projection's input: every head's attention output merged from
 * the splits' partials (M = max m_s, w_s = 2^(m_s - M) / sum_s 2^(m_s -
 * M) l_s, out = sum_s w_s acc_s), rounded to bf16 as the attention op
 * stores it, into xs. A wave per head computes the weights (into ws),
 * then every thread a column. Each block with rows reads the n_heads x
 * n_split x (head_dim + 2) floats of partials from L2. */
static __device__ __forceinline__ void l4_merge(const nstf_l4_ins &in, const l4_ctl &c, float *xs, float *ws) {
    constexpr int SPL = (L4_SPLITS + NSTF_WAVE - 1) / NSTF_WAVE;
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int nh = in.n_heads, G = in.n_heads / in.n_kv_heads, hd = in.head_dim;
    int64_t lo, chunk;
    const int S = l4_splits(in, c.dio[1], &lo, &chunk);
    const size_t ss = (size_t)G * (hd + 2); /* floats from one split of a kv head to the next */
    for (int h = wave; h < nh; h += L4_WAVES) {
        const float *ph = c.part + (((size_t)(h / G) * S) * G + h % G) * (hd + 2);
        float ms[SPL], ls[SPL], mx = -__builtin_huge_valf();
#pragma unroll
        for (int k = 0; k < SPL; k++) {
            const int sp = k * NSTF_WAVE + lane;
            ms[k] = sp < S ? ph[sp * ss] : -__builtin_huge_valf();
            ls[k] = sp < S ? ph[sp * ss + 1] : 0.0f;
            mx = fmaxf(mx, ms[k]);
        }
        const float b = nstf_softmax_base(wave_reduce_max(mx));
        float den = 0.0f;
#pragma unroll
        for (int k = 0; k < SPL; k++) {
            ms[k] = nstf_fast_exp2f(ms[k] - b);
            den = fmaf(ms[k], ls[k], den);
        }
        den = wave_reduce_sum(den);
#pragma unroll
        for (int k = 0; k < SPL; k++) {
            const int sp = k * NSTF_WAVE + lane;
            if (sp < S) ws[h * L4_SPLITS + sp] = ms[k] / den;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < nh * hd; e += L4_THREADS) {
        const int h = e / hd, d = e % hd;
        const float *pa = c.part + (((size_t)(h / G) * S) * G + h % G) * (hd + 2) + 2 + d;
        float num = 0.0f;
        for (int s0 = 0; s0 < S; s0 += 8) {
            float av[8];
#pragma unroll
            for (int k = 0; k < 8; k++) av[k] = s0 + k < S ? pa[(size_t)(s0 + k) * ss] : 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (s0 + k < S) num = fmaf(ws[h * L4_SPLITS + s0 + k], av[k], num);
        }
        xs[e] = bf16_round(num);
    }
}

template <int HD> static __device__ __forceinline__ void l4_attn(const nstf_l4_ins &in, const l4_ctl &c, float *qsm) {
    const int lane = threadIdx.x % NSTF_WAVE, wave = threadIdx.x / NSTF_WAVE;
    const int64_t pos = c.dio[1];
    const int n_kv = in.n_kv_heads, tw = (int)gridDim.x * L4_WAVES;
    int64_t lo, chunk;
    const int n_split = l4_splits(in, pos, &lo, &chunk);
    float *qs = qsm + (size_t)wave * c.q_stride;
    for (int item = blockIdx.x * L4_WAVES + wave; item < n_kv * n_split; item += tw) {
        const int hkv = item / n_split, s = item % n_split;
        const int64_t k0 = lo + (int64_t)s * chunk, k1 = k0 + chunk < pos + 1 ? k0 + chunk : pos + 1;
        l4_attn_split<HD>(in, c, hkv, s, n_split, k0, k1, qs, lane);
    }
}

/* ---- the kernel --------------------------------------------------------------- */

__global__ void __launch_bounds__(L4_THREADS, 1) l4_kernel(const nstf_l4_ins *__restrict__ prog, int n_ins, l4_ctl c) {
    extern __shared__ __align__(16) float l4_dyn[];
    __shared__ float red[2 * L4_WAVES + 2];
    __shared__ __align__(16) float rf[128 + 64];
    const l4_smem sm = {l4_dyn, l4_dyn + c.a_floats, (uint8_t *)(l4_dyn + c.a_floats + c.b_floats),
                        c.stage_bytes, rf};
    /* the instructions, double-buffered (in registers one would take ~40
     * per thread): the next one is read, one word per thread, while this
     * one runs, and written to the other buffer before the barrier, where
     * its constant data start towards the stage, so neither the program
     * nor the weights' first bytes are loaded behind a barrier */
    __shared__ nstf_l4_ins ib[2];
    constexpr int NW = (int)(sizeof(nstf_l4_ins) / sizeof(u32));
    static_assert(NW <= L4_THREADS, "an instruction is a word per thread");
    u32 word = threadIdx.x < NW ? ((const u32 *)&prog[0])[threadIdx.x] : 0u;
    if (threadIdx.x < NW) ((u32 *)&ib[0])[threadIdx.x] = word;
    __syncthreads();
    l4_stage(ib[0], sm);
    if (c.trace && blockIdx.x == 0 && threadIdx.x == 0) c.trace[0] = NSTF_TIMER_NS();
    for (int i = 0; i < n_ins; i++) {
        nstf_cp_wait<0>();
        __syncthreads();
        const nstf_l4_ins &in = ib[i & 1];
        if (i + 1 < n_ins) {
            if (threadIdx.x < NW) word = ((const u32 *)&prog[i + 1])[threadIdx.x];
            l4_prefetch(prog[i + 1]);
        }
        switch (in.op) {
        case NSTF_L4_EMBED: l4_embed(in, c); break;
        case NSTF_L4_GEMV:
            if (in.wtype == NSTF_TYPE_F16) l4_gemv<true>(in, c, sm, red);
            else l4_gemv<false>(in, c, sm, red);
            break;
        case NSTF_L4_ATTN:
            if (in.head_dim == 64) l4_attn<64>(in, c, sm.xs);
            else l4_attn<128>(in, c, sm.xs);
            break;
        default: break;
        }
        __syncthreads(); /* this instruction's use of the shared memory is over */
        if (c.trace && threadIdx.x == 0) atomicMax(&c.trace[1 + 2 * i], NSTF_TIMER_NS());
        if (i + 1 == n_ins) break;
        if (threadIdx.x < NW) ((u32 *)&ib[(i + 1) & 1])[threadIdx.x] = word;
        __syncthreads();
        l4_stage(ib[(i + 1) & 1], sm);
        if ((int)blockIdx.x == c.stall_block && i == c.stall_ins) return; /* test hook: never arrives */
        if (!l4_barrier(c, (u32)i, i)) return;
        if (c.trace && blockIdx.x == 0 && threadIdx.x == 0) c.trace[2 + 2 * i] = NSTF_TIMER_NS();
    }
    /* the last block to leave resets the barrier for the next step */
    __syncthreads();
    if (threadIdx.x == 0) {
        NSTF_FENCE_GPU();
        if (atomicAdd(&c.sync[1], 1u) == gridDim.x - 1) {
            c.sync[0] = 0;
            c.sync[1] = 0;
            NSTF_FENCE_GPU();
        }
    }
}

/* ---- host ----------------------------------------------------------------------- */

static size_t l4_part_floats(int max_heads, int max_hd) {
    return (size_t)max_heads * L4_SPLITS * (size_t)(max_hd + 2);
}

extern "C" size_t nstf_gpu_l4_scratch_bytes(int grid, int max_heads, int max_head_dim) {
    const size_t sync = ((size_t)L4_SYNC_WORDS * sizeof(u32) + 255) / 256 * 256;
    const size_t am = ((size_t)grid * 2 * sizeof(float) + 255) / 256 * 256;
    return sync + am + l4_part_floats(max_heads, max_head_dim) * sizeof(float);
}

/* The regions of the dynamic shared memory (l4_smem): A and B from the
 * program's widest GEMV input and attention group, C (the weight stage)
 * what is left of the device's limit, up to L4_STAGE_MAX. */
#define L4_STAGE_MAX (128u << 10)
static void l4_layout(int max_n_in, int max_q, size_t cap, size_t *a, size_t *b, size_t *stage) {
    const size_t x = (size_t)max_n_in * sizeof(float), q = (size_t)L4_WAVES * max_q * sizeof(float);
    *a = ((x > q ? x : q) + 15) / 16 * 16;
    *b = ((size_t)max_n_in * sizeof(float) + 15) / 16 * 16;
    const size_t used = *a + *b + 4096; /* and the static shared memory, with room */
    size_t c = cap > used ? cap - used : 0;
    if (c > L4_STAGE_MAX) c = L4_STAGE_MAX;
    *stage = c / 16 * 16;
}

extern "C" nstf_status nstf_gpu_l4_shape(int max_n_in, int max_q, int *grid, size_t *smem) {
    int dev = 0, per_sm = 0;
    GPU_CHECK(gpuGetDevice(&dev));
    nstf_gpu_info info;
    NSTF_TRY(nstf_gpu_query(dev, &info));
    size_t a, b, st;
    l4_layout(max_n_in, max_q, info.smem_per_block, &a, &b, &st);
    *smem = a + b + st;
    if (*smem + 4096 > info.smem_per_block)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "L4 decode: %zu bytes of shared memory for a GEMV input of %d",
                              *smem, max_n_in);
    GPU_CHECK(gpuFuncSetAttribute((const void *)l4_kernel, gpuFuncAttributeMaxDynamicSharedMemorySize, (int)*smem));
    GPU_CHECK(gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, l4_kernel, L4_THREADS, *smem));
    if (per_sm < 1)
        return nstf_set_error(NSTF_ERR_UNSUPPORTED, "L4 decode: the persistent kernel does not fit an SM");
    *grid = info.n_sm;
    return NSTF_OK;
}

extern "C" int nstf_gpu_l4_gemv_ok(nstf_type wtype, const void *w, int64_t n_in, int64_t n_out) {
    return (wtype == NSTF_TYPE_BF16 || wtype == NSTF_TYPE_F16) && w && ((uintptr_t)w & 15) == 0 && n_in > 0 &&
           n_in % 8 == 0 && n_out > 0 && n_out < INT_MAX / 2 && n_in < (1 << 16);
}

extern "C" int nstf_gpu_l4_attn_ok(int n_heads, int n_kv_heads, int head_dim) {
    return (head_dim == 64 || head_dim == 128) && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
           n_heads / n_kv_heads <= L4_GMAX;
}

extern "C" nstf_status nstf_gpu_l4_launch(const nstf_l4_ins *prog, int n_ins, const int32_t *dio, void *scratch,
                                          int grid, size_t smem, int max_heads, int max_head_dim, int max_n_in,
                                          int max_q, int32_t *status, int stall_block, int stall_ins, int timeout_ms,
                                          unsigned long long *trace, void *stream) {
    size_t a = 0, b = 0, st = 0;
    if (max_n_in > 0 && max_q > 0) l4_layout(max_n_in, max_q, SIZE_MAX, &a, &b, &st);
    if (!prog || n_ins < 1 || !dio || !scratch || !status || grid < 1 || max_heads < 1 || max_head_dim < 1 ||
        max_n_in < 1 || max_q < 1 || smem < a + b || timeout_ms < 1)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "L4 decode: bad launch arguments");
    l4_ctl c;
    c.a_floats = (int)(a / sizeof(float));
    c.b_floats = (int)(b / sizeof(float));
    c.stage_bytes = (int)(smem - a - b);
    c.trace = trace;
    const size_t sync = ((size_t)L4_SYNC_WORDS * sizeof(u32) + 255) / 256 * 256;
    const size_t am = ((size_t)grid * 2 * sizeof(float) + 255) / 256 * 256;
    c.dio = dio;
    c.sync = (u32 *)scratch;
    c.am = (float *)((char *)scratch + sync);
    c.part = (float *)((char *)scratch + sync + am);
    c.status = status;
    c.q_stride = max_q;
    c.stall_block = stall_block;
    c.stall_ins = stall_ins;
    c.timeout_ns = (unsigned long long)timeout_ms * 1000000ull;
    void *args[] = {(void *)&prog, (void *)&n_ins, (void *)&c};
    GPU_CHECK(gpuLaunchCooperativeKernel((const void *)l4_kernel, dim3(grid), dim3(L4_THREADS), args, smem,
                                         (gpuStream_t)stream));
    GPU_LAUNCH_CHECK((gpuStream_t)stream);
    return NSTF_OK;
}
