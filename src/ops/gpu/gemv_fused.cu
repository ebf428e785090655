/* gemv_fused.cu — nstf_gpu_gemv_fused: one-token GEMVs with the RMSNorm
 * before them as a prologue and RoPE, SwiGLU or the residual add as an
 * epilogue (the level-3 decode; docs/ARCHITECTURE.md says why), and
 * nstf_gpu_gemv_fusable. The kernels are instances of gemv.cu's float
 * kernel (BF16, F16), gemvq.cu's quantized one (Q5_0, Q5_1) and
 * gemvk_i8.cu's integer one (Q4_K, Q5_K, Q6_K, IQ4_XS, Q8_0, Q4_0, Q4_1);
 * their fused code is gemv_fused.h.
 *
 * What the fused decode covers: Llama (norm + QKV + RoPE, O + residual,
 * norm + gate|up + SwiGLU, down + residual, norm + output), and Qwen's QKV
 * extras. The QKV bias (Qwen2) is a runtime part of the RoPE epilogue, for
 * every weight type above: each row of a pair gets its matrix's bias with
 * the unfused BIAS op's rounding before the rotation. The per-head q/k
 * RMSNorm (Qwen3) needs the sum of squares of a whole head (64..256 rows)
 * before any of its pairs rotates, and a block computes GEMVQ_ROWS / 2 = 8
 * pairs: blocks of whole heads would cut the grid 8-16x (Qwen3-0.6B's QKV
 * is 4096 rows: 32 blocks of 128 on 132 SMs), or the blocks of a head would
 * have to meet through global memory. So the GEMV (+ bias) stores q | k | v
 * unrotated (rope_rows 0 in the kernel: every pair stored plainly) and one
 * small kernel (nstf_gpu_head_norm_rope, one wave per head) normalizes and
 * rotates q's and k's heads: two kernels where the unfused path runs the
 * RMSNorm, the GEMV, HEAD_NORM and RoPE. */
#include "gemv_common.h"
#include "core/switches.h"
#include "mma.h" /* nstf_mma_device: the SM count */

/* The fused instance of plan p for FZ fz at `rows` rows per block (the
 * float kernel and gemvk_i8's; the other quantized ones have GEMVQ_ROWS),
 * or NULL: none. */
static gemv_fn gemv_fused_fn(const gemv_plan &p, int fz, int rows) {
    if (p.wt == GW_BF16 || p.wt == GW_F16) return nstf_gemv_float_fused_pick(p.wt, fz, rows);
    if (p.i8) return nstf_gemvk8_fused_pick(p.wt, fz, rows);
    return nullptr; /* Q2_K, Q3_K (gemvk.cu), 2-byte aligned Q4_1: no fused instances */
}

extern "C" int nstf_gpu_gemv_fusable(nstf_type wtype, const void *w, int64_t n_in, int norm) {
    if (!w || n_in <= 0 || n_in > INT32_MAX / 2 || gemv_wt(wtype, true) < 0) return 0;
    uint64_t rb = 0;
    if (!nstf_type_row_bytes(wtype, n_in, &rb)) return 0;
    const gemv_plan p = gemv_make_plan(wtype, w, NULL, 1, n_in); /* x is staged, never read in place */
    if (p.wt < 0 || !gemv_fused_fn(p, 1, GEMV_ROWS)) return 0;
    return !norm || p.n_chunks == 1;
}

/* Rows per block of the fused bf16 / f16 kernel (docs/PERFORMANCE.md has
 * the H100 measurements):
 *  - where blocks of GEMV_ROWS would take more than one round of the
 *    blocks the GPU holds at once but not two, the second round leaves
 *    most SMs idle: blocks of 16 rows fit in one (the 8B shape's Q|K|V,
 *    6144 rows: 768 blocks of 8 against 4 x 132 resident);
 *  - else more rows share one staging of x (and one norm) where n_out is
 *    large, while the block's rows stay within 64 KiB of weights (the 1B
 *    shape's 2048-wide gate|up and logits in blocks of 16, the 8B shape's
 *    4096-wide ones in blocks of 8).
 * The switch NSTF_GEMV_ROWS=8|16|32 overrides it (measurement). */
static int gemv_fused_rows(const gemv_plan &p, int fz, int64_t n_in, int64_t n_out) {
    const int sw = nstf_switch_int(NSTF_SW_GEMV_ROWS); /* NSTF_SWITCH_AUTO, 8, 16 or 32 */
    if (sw != NSTF_SWITCH_AUTO) return sw;
    const int64_t blocks = (n_out + GEMV_ROWS - 1) / GEMV_ROWS;
    int n_sm = 0, wave = 0, per_sm = 0;
    const gemv_fn fn = gemv_fused_fn(p, fz, GEMV_ROWS);
    if (fn && nstf_mma_device(&n_sm, &wave) == NSTF_OK &&
        gpuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, GEMV_THREADS, p.smem) == gpuSuccess && per_sm > 0 &&
        blocks > (int64_t)per_sm * n_sm && blocks <= 2 * (int64_t)per_sm * n_sm)
        return 16;
    return n_out >= 16384 && 16 * 2 * n_in <= 65536 ? 16 : GEMV_ROWS;
}

extern "C" nstf_status nstf_gpu_gemv_fused(nstf_type wtype, const void *w, const uint16_t *x, void *y,
                                           int64_t n_in, int64_t n_out, const nstf_gemv_fusion *fu,
                                           void *stream) {
    if (!fu || !y || n_out <= 0 || n_out > INT32_MAX - GEMVQ_ROWS_BIG || (!fu->norm_x && !x) ||
        (fu->norm_x && !fu->norm_w) || !(fu->norm_eps >= 0.0f))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: bad arguments (n_in %lld, n_out %lld)",
                              (long long)n_in, (long long)n_out);
    const int norm = fu->norm_x != NULL;
    if (!nstf_gpu_gemv_fusable(wtype, w, n_in, norm))
        return nstf_set_error(NSTF_ERR_UNSUPPORTED,
                              "nstf_gpu_gemv_fused: %s weights of %lld columns%s (see nstf_gpu_gemv_fusable)",
                              nstf_type_name(wtype), (long long)n_in, norm ? " with the norm prologue" : "");
    const nstf_gemv_epi epi = fu->epi;
    if (epi == NSTF_GEMV_ROPE || epi == NSTF_GEMV_SWIGLU) {
        if (n_out % 2) return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: odd n_out %lld", (long long)n_out);
    } else if (epi != NSTF_GEMV_STORE && epi != NSTF_GEMV_ACCUM) {
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_gpu_gemv_fused: epilogue %d", (int)epi);
    }
    if (epi == NSTF_GEMV_ROPE &&
        (!fu->pos || !fu->rope_freqs || fu->head_dim <= 0 || fu->head_dim % 2 || fu->head_dim > 256 ||
         fu->rope_rows < 0 || fu->rope_rows % fu->head_dim || fu->rope_rows > n_out ||
         (fu->rope_mode != NSTF_ROPE_NORM && fu->rope_mode != NSTF_ROPE_NEOX) ||
         (fu->head_dim / 2) % (GEMVQ_ROWS / 2) != 0))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv_fused: RoPE of %d rows, head_dim %d, mode %d (rows a multiple of "
                              "head_dim, head_dim/2 a multiple of %d)",
                              fu->rope_rows, fu->head_dim, (int)fu->rope_mode, GEMVQ_ROWS / 2);
    const bool extras = fu->bias_q || fu->bias_k || fu->bias_v || fu->q_norm;
    if (extras && (epi != NSTF_GEMV_ROPE || fu->q_rows <= 0 || fu->q_rows % fu->head_dim ||
                   fu->q_rows > fu->rope_rows || (fu->q_norm && fu->rope_rows > fu->q_rows && !fu->k_norm) ||
                   !(fu->qk_eps >= 0.0f)))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "nstf_gpu_gemv_fused: a QKV bias or q/k norm wants the RoPE epilogue and q_rows %d a "
                              "multiple of head_dim %d within rope_rows %d (and k_norm with k rows)",
                              fu->q_rows, fu->head_dim, fu->rope_rows);
    if (nstf_gemv_fz_bytes() != (int)sizeof(gemv_fz) || nstf_gemvq_fz_bytes() != (int)sizeof(gemv_fz) ||
        nstf_gemvk_fz_bytes() != (int)sizeof(gemv_fz) || nstf_gemvk8_fz_bytes() != (int)sizeof(gemv_fz))
        return nstf_set_error(NSTF_ERR_INTERNAL,
                              "nstf_gpu_gemv_fused: the GEMV kernels were compiled with another gemv_fz (%d, %d, %d, "
                              "%d bytes; here %d): a stale build, rebuild gemv.cu, gemvq.cu, gemvk.cu and gemvk_i8.cu",
                              nstf_gemv_fz_bytes(), nstf_gemvq_fz_bytes(), nstf_gemvk_fz_bytes(), nstf_gemvk8_fz_bytes(),
                              (int)sizeof(gemv_fz));
    uint64_t row_bytes = 0;
    (void)nstf_type_row_bytes(wtype, n_in, &row_bytes);
    const gemv_plan p = gemv_make_plan(wtype, w, norm ? NULL : x, 1, n_in);
    gemv_fz f = {};
    f.nx = fu->norm_x;
    f.nw = fu->norm_w;
    f.eps = fu->norm_eps;
    f.rope_rows = fu->q_norm ? 0 : fu->rope_rows; /* with the q/k norm the rotation comes after it */
    f.hd = fu->head_dim;
    f.neox = fu->rope_mode == NSTF_ROPE_NEOX;
    f.pos = fu->pos;
    f.freqs = fu->rope_freqs;
    f.factors = fu->rope_factors;
    if (extras) {
        f.bq = fu->bias_q;
        f.bk = fu->bias_k;
        f.bv = fu->bias_v;
        f.q_end = fu->q_rows;
        f.k_end = fu->rope_rows;
    }
    f.no_pre = !nstf_switch_int(NSTF_SW_GEMV_PRE);
    nstf_gemv_prefetch_plan(&f, row_bytes * (uint64_t)n_out);
    /* gemvk_i8's rows as unfused (RoPE's pairs stay in blocks of at most
     * GEMVQ_ROWS: the head_dim check above) */
    const int fz = (int)epi * 2 + norm; /* gemv_fz's FZ */
    const int rows = p.i8      ? nstf_gemvk8_rows(p.wt, n_in, n_out, epi == NSTF_GEMV_ROPE)
                     : p.quant ? GEMVQ_ROWS
                               : gemv_fused_rows(p, fz, n_in, n_out);
    if (fz == 0) /* plain STORE: the unfused GEMV */
        return nstf_gpu_gemv(wtype, w, x, y, NSTF_TYPE_F32, 1, n_in, n_out, stream);
    const gemv_fn fn = gemv_fused_fn(p, fz, rows);
    const unsigned grid = (unsigned)((n_out + rows - 1) / rows);
    gpuStream_t s = (gpuStream_t)stream;
    GPU_CHECK(nstf_gpu_launch(fn, dim3(grid), dim3(GEMV_THREADS), p.smem, s, nstf_gpu_pdl(), (const uint8_t *)w,
                              (size_t)row_bytes, x, y, (int)n_in, (int)n_out, p.chunk, p.x_vec, f));
    GPU_LAUNCH_CHECK(s);
    if (!fu->q_norm) return NSTF_OK;
    uint16_t *q = (uint16_t *)y;
    return nstf_gpu_head_norm_rope(q, q + fu->q_rows, fu->q_norm, fu->k_norm, fu->q_rows / fu->head_dim,
                                   (fu->rope_rows - fu->q_rows) / fu->head_dim, fu->head_dim, fu->qk_eps, fu->pos,
                                   fu->rope_freqs, fu->rope_factors, fu->rope_mode, stream);
}

