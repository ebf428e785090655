/* backend_ops_grad.h — the gradient mode of test_backend_ops.c: one case per
 * training row of the op table (the backward of every op, the fused
 * cross-entropy, AdamW, the gradient norm), run through the backend table
 * against the project's references (nstf_ref_*: fp64 accumulation, each
 * output rounded once to fp32, themselves checked against fp64 finite
 * differences by test_backward_cpu) on exactly the values the backend sees.
 * Included by test_backend_ops.c after its helpers (up, down, judge, ...).
 *
 * Tolerances (the rules of test_backend_ops.c):
 *  - fp32 outputs NMSE <= 1e-7 (CPU and GPU: the GPU's fp32 outputs come
 *    from bf16 operands that are exact in the reference's inputs);
 *  - bf16 outputs (the GPU's activation gradients): at most 2x the NMSE of
 *    a naive same-precision computation, plus 1e-9. For elementwise ops
 *    (RoPE, SwiGLU) the naive result is the reference rounded to bf16 once;
 *    for attention it is the product chain with the bf16 operands a
 *    straightforward bf16 kernel has (P and dS rounded to bf16 before their
 *    products), accumulated exactly and rounded once; for the cross-entropy
 *    the logit gradient rounded to bf16 before the two gradient products;
 *  - gradients that are added into start from random values and are judged
 *    on what was added (got - start against ref - start);
 *  - the loss within a relative 1e-6 (CPU) or 1e-5 (GPU: fp32 logits of a
 *    GEMM), the gradient norm's sums within a relative 1e-12 (double);
 *  - AdamW's bf16 compute copy equal to the rounding of the new weights,
 *    bit for bit, and elements outside the tensor table untouched;
 *  - a NaN gradient fails with the tensor and the element named. */

static float *fvec(test_rng *r, int64_t n, float scale) {
    float *x = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = scale * rng_normal(r);
    return x;
}

static double *dvec(const float *x, int64_t n) {
    double *d = malloc((size_t)(n > 0 ? n : 1) * 8);
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static float bfr(double x) { return nstf_bf16_to_f32(nstf_f32_to_bf16((float)x)); }

/* What was added into an accumulated output: got - start and ref - start. */
static void judge_added(const char *what, const float *got, const float *ref, const float *start, int64_t n,
                        const float *naive) {
    float *g = malloc((size_t)n * 4), *nv = naive ? malloc((size_t)n * 4) : NULL;
    double *rd = malloc((size_t)n * 8);
    for (int64_t i = 0; i < n; i++) {
        g[i] = (float)((double)got[i] - start[i]);
        rd[i] = (double)ref[i] - start[i];
        if (nv) nv[i] = naive[i];
    }
    judge_naive(what, g, rd, nv, n, 1e-7);
    free(g), free(nv), free(rd);
}

/* An op that adds into out (n floats, starting at start): run twice from
 * the same start, the first result judged against ref (got receives it),
 * the second the same bits (the sums' order is fixed). */
static void run_added_twice(nstf_op_args *a, dbuf out, const float *start, float *got, const float *ref, int64_t n,
                            const char *what) {
    float *got2 = malloc((size_t)n * 4);
    for (int rep = 0; rep < 2; rep++) {
        if (rep) CHECK(g_be->vt->upload(g_be, out.d, start, (uint64_t)n * 4) == NSTF_OK, "%s: upload", what);
        run_op(a, 1, 0);
        down(out, rep ? got2 : got, what);
    }
    judge_added(what, got, ref, start, n, NULL);
    CHECK(memcmp(got, got2, (size_t)n * 4) == 0, "%s: %s: two runs differ", g_name, what);
    free(got2);
}

/* n tokens with ids from `distinct` values (times 2: odd rows untouched) of
 * a table of `rows`; run twice from the same start: the same bits */
static void get_rows_bwd_case(test_rng *r, int64_t rows, int64_t dim, int64_t n, int distinct) {
    int32_t *ids = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) ids[i] = (int32_t)(rng_next(r) % (uint64_t)distinct) * 2;
    float *dout = fvec(r, n * dim, 1.0f), *tab = fvec(r, rows * dim, 1.0f), *ref = malloc((size_t)(rows * dim) * 4);
    float *got = malloc((size_t)(rows * dim) * 4);
    memcpy(ref, tab, (size_t)(rows * dim) * 4);
    nstf_ref_get_rows_bwd(ids, dout, ref, n, dim);
    dbuf di = up(ids, (size_t)n * 4), dd = up(dout, (size_t)(n * dim) * 4), dt = up(tab, (size_t)(rows * dim) * 4);
    nstf_op_args a = {.op = NSTF_OP_GET_ROWS_BWD, .label = "get_rows_bwd"};
    a.get_rows_bwd.ids = di.d;
    a.get_rows_bwd.dout = (nstf_view){dd.d, NSTF_TYPE_F32, dim};
    a.get_rows_bwd.dtable = dt.d;
    a.get_rows_bwd.n = n;
    a.get_rows_bwd.dim = dim;
    char what[80];
    snprintf(what, sizeof what, "get_rows_bwd (%lld tokens of %d ids, width %lld)", (long long)n, distinct,
             (long long)dim);
    run_added_twice(&a, dt, tab, got, ref, rows * dim, what);
    drop(di), drop(dd), drop(dt);
    free(ids), free(dout), free(tab), free(ref), free(got);
}

static void case_get_rows_bwd(test_rng *r) {
    get_rows_bwd_case(r, 23, 96, 40, 9);
    get_rows_bwd_case(r, 301, 1100, 700, 150); /* rows wider than one pass; tokens over several chunks */
    get_rows_bwd_case(r, 9, 64, 3000, 3);      /* long runs of the same id */
}

static void case_rmsnorm_bwd(test_rng *r) {
    const int64_t n = 5, dim = 200;
    for (int frozen = 0; frozen < 2; frozen++) {
        float *x = fvec(r, n * dim, 3.0f), *w = fvec(r, dim, 0.5f), *dy = fvec(r, n * dim, 1.0f);
        float *dx0 = fvec(r, n * dim, 0.1f), *dw0 = fvec(r, dim, 0.1f);
        float *rdx = malloc((size_t)(n * dim) * 4), *rdw = malloc((size_t)dim * 4);
        float *gdx = malloc((size_t)(n * dim) * 4), *gdw = malloc((size_t)dim * 4), *gact = malloc((size_t)(n * dim) * 4);
        for (int64_t i = 0; i < dim; i++) w[i] += 1.0f;
        memcpy(rdx, dx0, (size_t)(n * dim) * 4), memcpy(rdw, dw0, (size_t)dim * 4);
        nstf_ref_rmsnorm_bwd(x, w, dy, rdx, frozen ? NULL : rdw, n, dim, 1e-5f);
        dbuf dxx = up(x, (size_t)(n * dim) * 4), dww = up(w, (size_t)dim * 4), ddy = up(dy, (size_t)(n * dim) * 4);
        dbuf ddx = up(dx0, (size_t)(n * dim) * 4), ddw = up(dw0, (size_t)dim * 4), dact = up(NULL, act_bytes(n * dim));
        nstf_op_args a = {.op = NSTF_OP_RMSNORM_BWD, .label = "rmsnorm_bwd"};
        a.rmsnorm_bwd.x = dxx.d;
        a.rmsnorm_bwd.w = dww.d;
        a.rmsnorm_bwd.dy = ddy.d;
        a.rmsnorm_bwd.dx = ddx.d;
        a.rmsnorm_bwd.dw = frozen ? NULL : ddw.d;
        a.rmsnorm_bwd.dx_act = (nstf_view){dact.d, g_be->act_type, dim};
        a.rmsnorm_bwd.n = n;
        a.rmsnorm_bwd.dim = dim;
        a.rmsnorm_bwd.eps = 1e-5f;
        run_op(&a, 1, 0);
        void *ha = malloc(act_bytes(n * dim));
        down(ddx, gdx, "rmsnorm_bwd dx"), down(ddw, gdw, "rmsnorm_bwd dw"), down(dact, ha, "rmsnorm_bwd dx_act");
        act_read(ha, gact, n * dim);
        judge_added("rmsnorm_bwd dx", gdx, rdx, dx0, n * dim, NULL);
        if (frozen) CHECK(memcmp(gdw, dw0, (size_t)dim * 4) == 0, "%s: rmsnorm_bwd: a frozen dw was written", g_name);
        else judge_added("rmsnorm_bwd dw", gdw, rdw, dw0, dim, NULL);
        double *rd = dvec(rdx, n * dim);
        judge("rmsnorm_bwd dx_act", gact, rd, n * dim, act_bf16(), 1e-7);
        drop(dxx), drop(dww), drop(ddy), drop(ddx), drop(ddw), drop(dact);
        free(x), free(w), free(dy), free(dx0), free(dw0), free(rdx), free(rdw), free(gdx), free(gdw), free(gact);
        free(ha), free(rd);
    }
}

static void case_rope_bwd(test_rng *r) { rope_case(r, true); }

/* q, k, v, out, lse of a causal forward (n tokens at pos0 over pos0 + n
 * keys), dout, and the backward through the backend. */
/* S sequences of n queries each (S > 1: one op over the batch, pos0 0),
 * laid out one after another in every view */
static void attention_bwd_case(test_rng *r, int64_t n, int64_t pos0, int64_t S, int hd) {
    const int nh = 6, nkv = 2;
    const int64_t qd = nh * hd, kvd = nkv * hd, nk = pos0 + n, N = S * n, NK = S * nk;
    const float scale = 0.125f;
    float *q = malloc((size_t)(N * qd) * 4), *k = malloc((size_t)(NK * kvd) * 4), *v = malloc((size_t)(NK * kvd) * 4);
    float *dout = malloc((size_t)(N * qd) * 4), *out = malloc((size_t)(N * qd) * 4), *lse = malloc((size_t)(N * nh) * 4);
    void *hq = act_make(r, q, N * qd, 1.0f), *hk = act_make(r, k, NK * kvd, 1.0f), *hv = act_make(r, v, NK * kvd, 1.0f);
    void *hdo = act_make(r, dout, N * qd, 1.0f);
    for (int64_t b = 0; b < S; b++)
        nstf_ref_attention_lse(q + b * n * qd, k + b * nk * kvd, v + b * nk * kvd, out + b * n * qd, lse + b * n * nh, n,
                               pos0, nh, nkv, hd, scale);
    uint16_t *ho16 = malloc((size_t)(N * qd) * 2);
    for (int64_t i = 0; i < N * qd; i++) out[i] = act_round(out[i]), ho16[i] = nstf_f32_to_bf16(out[i]);
    float *rdq = malloc((size_t)(N * qd) * 4), *rdk = malloc((size_t)(NK * kvd) * 4), *rdv = malloc((size_t)(NK * kvd) * 4);
    for (int64_t b = 0; b < S; b++)
        nstf_ref_attention_bwd(q + b * n * qd, k + b * nk * kvd, v + b * nk * kvd, out + b * n * qd, dout + b * n * qd,
                               lse + b * n * nh, rdq + b * n * qd, rdk + b * nk * kvd, rdv + b * nk * kvd, n, pos0, nh,
                               nkv, hd, scale);
    /* the naive bf16 chain: P and dS rounded to bf16 before their products */
    double *nq = calloc((size_t)(N * qd), 8), *nk_ = calloc((size_t)(NK * kvd), 8), *nv = calloc((size_t)(NK * kvd), 8);
    for (int64_t b = 0; b < S; b++)
        for (int64_t t = 0; t < n; t++)
            for (int h = 0; h < nh; h++) {
                const int g = h / (nh / nkv);
                const int64_t tq = b * n + t, k0 = b * nk;
                const float *qh = q + tq * qd + h * hd, *gh = dout + tq * qd + h * hd, *oh = out + tq * qd + h * hd;
                double dd = 0;
                for (int i = 0; i < hd; i++) dd += (double)gh[i] * oh[i];
                for (int64_t j = 0; j <= pos0 + t; j++) {
                    const float *kj = k + (k0 + j) * kvd + g * hd, *vj = v + (k0 + j) * kvd + g * hd;
                    double s = 0, dp = 0;
                    for (int i = 0; i < hd; i++) s += (double)qh[i] * kj[i], dp += (double)gh[i] * vj[i];
                    const double p = exp(scale * s - lse[tq * nh + h]);
                    const double pb = bfr(p), dsb = bfr(p * (dp - dd));
                    for (int i = 0; i < hd; i++) {
                        nq[tq * qd + h * hd + i] += scale * dsb * kj[i];
                        nk_[(k0 + j) * kvd + g * hd + i] += scale * dsb * qh[i];
                        nv[(k0 + j) * kvd + g * hd + i] += pb * gh[i];
                    }
                }
            }
    dbuf dq_ = up(hq, act_bytes(N * qd)), dk_ = up(hk, act_bytes(NK * kvd)), dv_ = up(hv, act_bytes(NK * kvd));
    dbuf ddo = up(hdo, act_bytes(N * qd)), dl = up(lse, (size_t)(N * nh) * 4);
    dbuf dout_ = act_bf16() ? up(ho16, act_bytes(N * qd)) : up(out, act_bytes(N * qd));
    dbuf gq = up(NULL, act_bytes(N * qd)), gk = up(NULL, act_bytes(NK * kvd)), gv = up(NULL, act_bytes(NK * kvd));
    nstf_op_args a = {.op = NSTF_OP_ATTENTION_BWD, .label = "attention_bwd"};
    a.attention_bwd.q = (nstf_view){dq_.d, g_be->act_type, qd};
    a.attention_bwd.k = (nstf_view){dk_.d, g_be->act_type, kvd};
    a.attention_bwd.v = (nstf_view){dv_.d, g_be->act_type, kvd};
    a.attention_bwd.out = (nstf_view){dout_.d, g_be->act_type, qd};
    a.attention_bwd.dout = (nstf_view){ddo.d, g_be->act_type, qd};
    a.attention_bwd.lse = dl.d;
    a.attention_bwd.dq = (nstf_view){gq.d, g_be->act_type, qd};
    a.attention_bwd.dk = (nstf_view){gk.d, g_be->act_type, kvd};
    a.attention_bwd.dv = (nstf_view){gv.d, g_be->act_type, kvd};
    a.attention_bwd.n = n;
    a.attention_bwd.n_seq = S;
    a.attention_bwd.pos0 = pos0;
    a.attention_bwd.n_heads = nh;
    a.attention_bwd.n_kv_heads = nkv;
    a.attention_bwd.head_dim = hd;
    a.attention_bwd.scale = scale;
    run_op(&a, 1, 0);
    const dbuf outs[3] = {gq, gk, gv};
    const float *refs[3] = {rdq, rdk, rdv};
    double *naive[3] = {nq, nk_, nv};
    const int64_t len[3] = {N * qd, NK * kvd, NK * kvd};
    const char *names[3] = {"dq", "dk", "dv"};
    for (int o = 0; o < 3; o++) {
        void *h = malloc(act_bytes(len[o]));
        float *got = malloc((size_t)len[o] * 4), *nb = malloc((size_t)len[o] * 4);
        down(outs[o], h, "attention_bwd out");
        act_read(h, got, len[o]);
        for (int64_t i = 0; i < len[o]; i++) nb[i] = bfr(naive[o][i]);
        double *rd = dvec(refs[o], len[o]);
        char what[112];
        snprintf(what, sizeof what, "attention_bwd %s, %lld x %lld tokens at %lld, hd %d", names[o], (long long)S,
                 (long long)n, (long long)pos0, hd);
        judge_naive(what, got, rd, act_bf16() ? nb : NULL, len[o], 1e-7);
        free(h), free(got), free(nb), free(rd);
    }
    drop(dq_), drop(dk_), drop(dv_), drop(ddo), drop(dl), drop(dout_), drop(gq), drop(gk), drop(gv);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(hq), free(hk), free(hv), free(hdo), free(ho16);
    free(rdq), free(rdk), free(rdv), free(nq), free(nk_), free(nv);
}

static void case_attention_bwd(test_rng *r) {
    attention_bwd_case(r, 37, 0, 1, 64);
    attention_bwd_case(r, 70, 0, 1, 64);  /* more than one 64-row tile */
    attention_bwd_case(r, 19, 40, 1, 64); /* keys before the batch (a cached prefix) */
    attention_bwd_case(r, 45, 0, 3, 64);  /* a batch of three sequences in one op */
    /* several 128-row tiles (the sm_90a kernels' blocks), head dim 128, a
     * prefix, a batch whose sequences end inside a tile */
    attention_bwd_case(r, 300, 0, 1, 128);
    attention_bwd_case(r, 150, 77, 1, 128);
    attention_bwd_case(r, 200, 0, 2, 64);
}

static void case_swiglu_bwd(test_rng *r) {
    const int64_t f = 333, n = 4;
    for (int rows = 0; rows < 2; rows++) {
        if (rows && g_be->host_memory) continue; /* the CPU backend's groups are planes */
        /* rows: gate | up in one row of 2f per token (and dgate | dup likewise); else planes */
        float *hv = malloc((size_t)(n * 2 * f) * 4), *dyv = malloc((size_t)(n * f) * 4);
        void *hh = act_make(r, hv, n * 2 * f, 2.0f), *hdy = act_make(r, dyv, n * f, 1.0f);
        dbuf dh = up(hh, act_bytes(n * 2 * f)), ddy = up(hdy, act_bytes(n * f)), dg = up(NULL, act_bytes(n * 2 * f));
        const int64_t es = act_bf16() ? 2 : 4, st = rows ? 2 * f : f, off = rows ? f : n * f;
        nstf_op_args a = {.op = NSTF_OP_SWIGLU_BWD, .label = "swiglu_bwd"};
        a.swiglu_bwd.gate = (nstf_view){dh.d, g_be->act_type, st};
        a.swiglu_bwd.up = (nstf_view){(char *)dh.d + off * es, g_be->act_type, st};
        a.swiglu_bwd.dy = (nstf_view){ddy.d, g_be->act_type, f};
        a.swiglu_bwd.dgate = (nstf_view){dg.d, g_be->act_type, st};
        a.swiglu_bwd.dup = (nstf_view){(char *)dg.d + off * es, g_be->act_type, st};
        a.swiglu_bwd.n = n;
        a.swiglu_bwd.n_ff = f;
        run_op(&a, 1, 0);
        void *hg = malloc(act_bytes(n * 2 * f));
        float *got = malloc((size_t)(n * 2 * f) * 4);
        double *ref = malloc((size_t)(n * 2 * f) * 8);
        down(dg, hg, "swiglu_bwd out");
        act_read(hg, got, n * 2 * f);
        for (int64_t t = 0; t < n; t++)
            for (int64_t c = 0; c < f; c++) {
                const int64_t ig = t * st + c, iu = off + t * st + c;
                const double g = hv[ig], u = hv[iu], d = dyv[t * f + c], sg = 1.0 / (1.0 + exp(-g));
                ref[ig] = d * u * sg * (1.0 + g * (1.0 - sg));
                ref[iu] = d * g * sg;
            }
        judge(rows ? "swiglu_bwd rows" : "swiglu_bwd planes", got, ref, n * 2 * f, act_bf16(), 1e-7);
        drop(dh), drop(ddy), drop(dg);
        free(hv), free(dyv), free(hh), free(hdy), free(hg), free(got), free(ref);
    }
}

/* dx (+)= dy W for W of type t, dx of type xt, n tokens (64: the shape a
 * Hopper GPU runs on its wgmma GEMM after transposing W; 37 as well) */
static void matmul_bwd_x_case(test_rng *r, nstf_type t, nstf_type xt, bool acc, int64_t n) {
    const int64_t n_in = 128, n_out = 72;
    size_t wb;
    float *deq = malloc((size_t)(n_in * n_out) * 4), *dyv = malloc((size_t)(n * n_out) * 4);
    void *w = matrix_make(r, t, n_in, n_out, deq, &wb), *hdy = act_make(r, dyv, n * n_out, 1.0f);
    float *dx0 = fvec(r, n * n_in, 0.1f), *ref = malloc((size_t)(n * n_in) * 4);
    const bool xb = xt == NSTF_TYPE_BF16;
    for (int64_t i = 0; xb && i < n * n_in; i++) dx0[i] = bfr(dx0[i]);
    if (act_bf16())
        for (int64_t i = 0; i < n_in * n_out; i++) deq[i] = bfr(deq[i]); /* the GEMM's bf16 operand */
    memcpy(ref, dx0, (size_t)(n * n_in) * 4);
    nstf_ref_matmul_bwd_x(deq, dyv, ref, n, n_in, n_out, acc);
    uint16_t *dx16 = malloc((size_t)(n * n_in) * 2);
    for (int64_t i = 0; i < n * n_in; i++) dx16[i] = nstf_f32_to_bf16(dx0[i]);
    dbuf dw = up(w, wb), ddy = up(hdy, act_bytes(n * n_out));
    dbuf ddx = xb ? up(dx16, (size_t)(n * n_in) * 2) : up(dx0, (size_t)(n * n_in) * 4);
    nstf_matrix m = {dw.d, t, n_in, n_out, NULL};
    relayout(&m);
    nstf_op_args a = {.op = NSTF_OP_MATMUL_BWD_X, .label = "matmul_bwd_x"};
    a.matmul_bwd_x.w = &m;
    a.matmul_bwd_x.dy = (nstf_view){ddy.d, g_be->act_type, n_out};
    a.matmul_bwd_x.dx = (nstf_view){ddx.d, xt, n_in};
    a.matmul_bwd_x.n = n;
    a.matmul_bwd_x.acc = acc;
    run_op(&a, 1, 0);
    float *got = malloc((size_t)(n * n_in) * 4);
    if (xb) {
        down(ddx, dx16, "matmul_bwd_x dx");
        for (int64_t i = 0; i < n * n_in; i++) got[i] = nstf_bf16_to_f32(dx16[i]);
    } else {
        down(ddx, got, "matmul_bwd_x dx");
    }
    char what[96];
    snprintf(what, sizeof what, "matmul_bwd_x %s -> %s%s", nstf_type_name(t), nstf_type_name(xt), acc ? " (acc)" : "");
    float *nb = malloc((size_t)(n * n_in) * 4);
    for (int64_t i = 0; i < n * n_in; i++) nb[i] = bfr(ref[i]); /* a bf16 output rounds once */
    double *rd = dvec(ref, n * n_in);
    judge_naive(what, got, rd, xb ? nb : NULL, n * n_in, 1e-7);
    drop(dw), drop(ddy), drop(ddx);
    free(deq), free(dyv), free(w), free(hdy), free(dx0), free(ref), free(dx16), free(got), free(nb), free(rd);
}

static void case_matmul_bwd_x(test_rng *r) {
    const nstf_type wt = act_bf16() ? NSTF_TYPE_BF16 : NSTF_TYPE_F32;
    for (int acc = 0; acc < 2; acc++) {
        matmul_bwd_x_case(r, wt, NSTF_TYPE_F32, acc, 37);
        matmul_bwd_x_case(r, NSTF_TYPE_Q4_1, NSTF_TYPE_F32, acc, 37); /* a frozen quantized base */
        if (act_bf16()) matmul_bwd_x_case(r, wt, NSTF_TYPE_BF16, acc, 37);
        matmul_bwd_x_case(r, wt, NSTF_TYPE_F32, acc, 64);
        if (act_bf16()) matmul_bwd_x_case(r, wt, NSTF_TYPE_BF16, acc, 64);
    }
}

/* dW += dy^T x over n tokens, x and dy rows xs and ds elements apart (on
 * Hopper the wgmma weight gradient reading them as stored, its k range
 * split across the SMs when the output has few tiles: the long cases; else
 * the direct kernel). Run twice from the same start: the sums are made in a
 * fixed order, so the two results are the same bits. */
static void matmul_bwd_w_case(test_rng *r, int64_t n, int64_t n_in, int64_t n_out, int64_t xs, int64_t ds) {
    float *xv = malloc((size_t)(n * xs) * 4), *dyv = malloc((size_t)(n * ds) * 4);
    void *hx = act_make(r, xv, n * xs, 1.0f), *hdy = act_make(r, dyv, n * ds, 1.0f);
    float *dw0 = fvec(r, n_out * n_in, 1.0f), *ref = malloc((size_t)(n_out * n_in) * 4), *got = malloc((size_t)(n_out * n_in) * 4);
    float *xc = malloc((size_t)(n * n_in) * 4), *dyc = malloc((size_t)(n * n_out) * 4);
    for (int64_t t = 0; t < n; t++) {
        memcpy(xc + t * n_in, xv + t * xs, (size_t)n_in * 4);
        memcpy(dyc + t * n_out, dyv + t * ds, (size_t)n_out * 4);
    }
    memcpy(ref, dw0, (size_t)(n_out * n_in) * 4);
    nstf_ref_matmul_bwd_w(xc, dyc, ref, n, n_in, n_out);
    dbuf dx = up(hx, act_bytes(n * xs)), ddy = up(hdy, act_bytes(n * ds)), ddw = up(dw0, (size_t)(n_out * n_in) * 4);
    nstf_op_args a = {.op = NSTF_OP_MATMUL_BWD_W, .label = "matmul_bwd_w"};
    a.matmul_bwd_w.x = (nstf_view){dx.d, g_be->act_type, xs};
    a.matmul_bwd_w.dy = (nstf_view){ddy.d, g_be->act_type, ds};
    a.matmul_bwd_w.dw = ddw.d;
    a.matmul_bwd_w.n = n;
    a.matmul_bwd_w.n_in = n_in;
    a.matmul_bwd_w.n_out = n_out;
    char what[96];
    snprintf(what, sizeof what, "matmul_bwd_w (%lld tokens, %lld x %lld)", (long long)n, (long long)n_out,
             (long long)n_in);
    run_added_twice(&a, ddw, dw0, got, ref, n_out * n_in, what);
    drop(dx), drop(ddy), drop(ddw);
    free(xv), free(dyv), free(hx), free(hdy), free(dw0), free(ref), free(got), free(xc), free(dyc);
}

static void case_matmul_bwd_w(test_rng *r) {
    matmul_bwd_w_case(r, 37, 128, 72, 128, 72);
    matmul_bwd_w_case(r, 64, 128, 72, 128, 72);
    matmul_bwd_w_case(r, 2000, 200, 136, 200, 136);  /* k split; tiles past both edges */
    if (strcmp(g_be->vt->name, "CPU") != 0) /* the CPU backend takes dense rows only */
        matmul_bwd_w_case(r, 1029, 576, 192, 584, 960); /* strided rows (a group's views); k split */
    matmul_bwd_w_case(r, 300, 1536, 576, 1536, 576); /* many tiles, one split */
}

/* n tokens (the sixth ignored) over a vocabulary of n_vocab. rows: tokens
 * per chunk of the GPU's cross-entropy (NSTF_CE_ROWS; NULL: as the process
 * has it, one chunk here by default), gemm: the NSTF_GEMM switch (NULL: as
 * the process has it, by default wgmma on Hopper where the shape allows;
 * "mma": the portable GEMM throughout); both restored after the case. The
 * CPU backend ignores them. */
static void ce_case(test_rng *r, int64_t n, int64_t n_vocab, bool frozen, const char *rows, const char *gemm) {
    const int64_t dim = 64;
    char old_rows[24], old_gemm[24];
    nstf_switch_value_text(NSTF_SW_CE_ROWS, old_rows, sizeof old_rows);
    nstf_switch_value_text(NSTF_SW_GEMM, old_gemm, sizeof old_gemm);
    CHECK((!rows || nstf_switch_set(NSTF_SW_CE_ROWS, rows) == NSTF_OK) &&
              (!gemm || nstf_switch_set(NSTF_SW_GEMM, gemm) == NSTF_OK),
          "switches: %s", nstf_last_error());
    if (!rows) rows = old_rows;
    if (!gemm) gemm = old_gemm;
    float *h = malloc((size_t)(n * dim) * 4), *w = malloc((size_t)(n_vocab * dim) * 4);
    void *hh = act_make(r, h, n * dim, 1.0f), *hw = act_make(r, w, n_vocab * dim, 0.3f);
    int32_t *tg = malloc((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) tg[i] = (int32_t)(rng_next(r) % (uint64_t)n_vocab);
    tg[5] = -1; /* ignored */
    const double n_norm = n + 9; /* the step's count, more than this call's */
    float *dw0 = fvec(r, n_vocab * dim, 0.01f), *rdw = malloc((size_t)(n_vocab * dim) * 4);
    float *rdh = malloc((size_t)(n * dim) * 4), *rlse = malloc((size_t)n * 4);
    memcpy(rdw, dw0, (size_t)(n_vocab * dim) * 4);
    const double rloss = nstf_ref_cross_entropy(h, w, tg, -1, n_norm, rlse, rdh, rdw, n, dim, n_vocab);
    /* naive bf16: the logit gradient rounded to bf16 before its products */
    double *ndh = calloc((size_t)(n * dim), 8), *ndw = calloc((size_t)(n_vocab * dim), 8);
    double *z = malloc((size_t)n_vocab * 8);
    for (int64_t t = 0; t < n; t++) {
        if (tg[t] < 0) continue;
        double m = -INFINITY, s = 0;
        for (int64_t v = 0; v < n_vocab; v++) {
            z[v] = 0;
            for (int64_t i = 0; i < dim; i++) z[v] += (double)h[t * dim + i] * w[v * dim + i];
            m = fmax(m, z[v]);
        }
        for (int64_t v = 0; v < n_vocab; v++) s += exp(z[v] - m);
        for (int64_t v = 0; v < n_vocab; v++) {
            const double g = bfr((exp(z[v] - m) / s - (v == tg[t])) / n_norm);
            for (int64_t i = 0; i < dim; i++) {
                ndh[t * dim + i] += g * w[v * dim + i];
                ndw[v * dim + i] += g * h[t * dim + i];
            }
        }
    }
    /* CPU: the fp32 matrix; GPU: bf16 (its values are bf16 numbers already) */
    const nstf_type wt = act_bf16() ? NSTF_TYPE_BF16 : NSTF_TYPE_F32;
    dbuf dh = up(hh, act_bytes(n * dim)), dw = up(hw, act_bytes(n_vocab * dim));
    dbuf dt = up(tg, (size_t)n * sizeof(int32_t)), dgw = up(dw0, (size_t)(n_vocab * dim) * 4), dgh = up(NULL, (size_t)(n * dim) * 4);
    dbuf dl = up(NULL, (size_t)n * 4), dloss = up(NULL, 8);
    nstf_matrix m = {dw.d, wt, dim, n_vocab, NULL};
    nstf_op_args a = {.op = NSTF_OP_CROSS_ENTROPY, .label = "cross_entropy"};
    a.cross_entropy.h = (nstf_view){dh.d, g_be->act_type, dim};
    a.cross_entropy.w = &m;
    a.cross_entropy.targets = dt.d;
    a.cross_entropy.ignore_index = -1;
    a.cross_entropy.n_norm = n_norm;
    a.cross_entropy.lse = dl.d;
    a.cross_entropy.dh = dgh.d;
    a.cross_entropy.dw = frozen ? NULL : dgw.d;
    a.cross_entropy.loss = dloss.d;
    a.cross_entropy.n = n;
    run_op(&a, 1, 0);
    float *gdh = malloc((size_t)(n * dim) * 4), *gdw = malloc((size_t)(n_vocab * dim) * 4), *glse = malloc((size_t)n * 4);
    double gloss = 0;
    down(dgh, gdh, "ce dh"), down(dgw, gdw, "ce dw"), down(dl, glse, "ce lse"), down(dloss, &gloss, "ce loss");
    const double ltol = act_bf16() ? 1e-5 : 1e-6;
    CHECK(fabs(gloss - rloss) <= ltol * fabs(rloss), "%s: cross_entropy loss %.9g, reference %.9g (relative %.1e)",
          g_name, gloss, rloss, ltol);
    char what[160];
    float *nb = malloc((size_t)(n_vocab * dim) * 4);
    for (int64_t i = 0; i < n * dim; i++) nb[i] = (float)ndh[i];
    double *rd = dvec(rdh, n * dim);
    snprintf(what, sizeof what, "cross_entropy dh (%lld tokens, vocabulary %lld, chunks %s, gemm %s)", (long long)n,
             (long long)n_vocab, rows, gemm);
    judge_naive(what, gdh, rd, act_bf16() ? nb : NULL, n * dim, 1e-7);
    free(rd);
    rd = dvec(rlse, n);
    judge("cross_entropy lse", glse, rd, n, false, 1e-7);
    if (frozen) {
        CHECK(memcmp(gdw, dw0, (size_t)(n_vocab * dim) * 4) == 0, "%s: cross_entropy wrote a frozen dW", g_name);
    } else {
        for (int64_t i = 0; i < n_vocab * dim; i++) nb[i] = (float)(ndw[i] + dw0[i]);
        snprintf(what, sizeof what, "cross_entropy dW (%lld tokens, vocabulary %lld, chunks %s, gemm %s)",
                 (long long)n, (long long)n_vocab, rows, gemm);
        judge_added(what, gdw, rdw, dw0, n_vocab * dim, act_bf16() ? nb : NULL);
    }
    drop(dh), drop(dw), drop(dt), drop(dgw), drop(dgh), drop(dl), drop(dloss);
    free(h), free(w), free(hh), free(hw), free(dw0), free(rdw), free(rdh), free(rlse), free(ndh), free(ndw), free(z);
    free(gdh), free(gdw), free(glse), free(nb), free(rd), free(tg);
    CHECK(nstf_switch_set(NSTF_SW_CE_ROWS, old_rows) == NSTF_OK && nstf_switch_set(NSTF_SW_GEMM, old_gemm) == NSTF_OK,
          "switches back to %s, %s: %s", old_rows, old_gemm, nstf_last_error());
}

static void case_cross_entropy(test_rng *r) {
    ce_case(r, 21, 200, false, NULL, NULL);
    ce_case(r, 21, 1096, false, NULL, NULL); /* more than one of the CPU's vocabulary chunks */
    ce_case(r, 21, 200, true, NULL, NULL);
    /* GPU chunks of tokens: 8 + 8 + 5 (a last chunk of 5 rows takes the
     * portable dW GEMM: its K is not a multiple of 8) and 64 + 64 + 22; the
     * same with the portable GEMM throughout */
    ce_case(r, 21, 1096, false, "8", NULL);
    ce_case(r, 150, 520, false, "64", NULL);
    ce_case(r, 150, 520, true, "64", NULL);
    ce_case(r, 21, 1096, false, "8", "mma");
    ce_case(r, 150, 520, false, "64", "mma");
}

/* Three tensors, two with weight decay, a gap of untouched elements
 * between the second and the third. */
static const nstf_param_tensor k_ptab[3] = {{"blk.0.attn_q.weight", 0, 300, true},
                                             {"blk.0.ffn_up.weight", 300, 517, true},
                                             {"blk.0.attn_norm.weight", 900, 64, false}};
#define PTAB_N 964

static void case_adamw(test_rng *r) {
    const nstf_adamw_params p = {3e-3, 0.9, 0.95, 1e-8, 0.1};
    float *w = fvec(r, PTAB_N, 1.0f), *g = fvec(r, PTAB_N, 0.1f), *m = fvec(r, PTAB_N, 0.01f), *v = fvec(r, PTAB_N, 0.01f);
    for (int i = 0; i < PTAB_N; i++) v[i] = v[i] * v[i];
    float *rw = malloc(PTAB_N * 4), *rm = malloc(PTAB_N * 4), *rv = malloc(PTAB_N * 4);
    memcpy(rw, w, PTAB_N * 4), memcpy(rm, m, PTAB_N * 4), memcpy(rv, v, PTAB_N * 4);
    for (int i = 0; i < 3; i++) {
        const nstf_param_tensor *t = &k_ptab[i];
        nstf_ref_adamw(&p, 3, 0.7f, t->decay, rw + t->offset, g + t->offset, rm + t->offset, rv + t->offset, t->n);
    }
    dbuf dw = up(w, PTAB_N * 4), dg = up(g, PTAB_N * 4), dm = up(m, PTAB_N * 4), dv = up(v, PTAB_N * 4);
    dbuf dc = up(NULL, PTAB_N * 2);
    nstf_op_args a = {.op = NSTF_OP_ADAMW, .label = "adamw"};
    a.adamw.p = &p;
    a.adamw.tensors = k_ptab;
    a.adamw.n_tensors = 3;
    a.adamw.step = 3;
    a.adamw.grad_scale = 0.7f;
    a.adamw.w = dw.d, a.adamw.m = dm.d, a.adamw.v = dv.d, a.adamw.grad = dg.d;
    if (act_bf16()) a.adamw.w_copy = (nstf_view){dc.d, NSTF_TYPE_BF16, PTAB_N};
    run_op(&a, 1, 0);
    float *gw = malloc(PTAB_N * 4), *gm = malloc(PTAB_N * 4), *gv = malloc(PTAB_N * 4);
    uint16_t *gc = malloc(PTAB_N * 2);
    down(dw, gw, "adamw w"), down(dm, gm, "adamw m"), down(dv, gv, "adamw v"), down(dc, gc, "adamw copy");
    double *d;
    judge("adamw w", gw, d = dvec(rw, PTAB_N), PTAB_N, false, 1e-7), free(d);
    judge("adamw m", gm, d = dvec(rm, PTAB_N), PTAB_N, false, 1e-7), free(d);
    judge("adamw v", gv, d = dvec(rv, PTAB_N), PTAB_N, false, 1e-7), free(d);
    int gap = 0, copy = 0;
    for (int i = 817; i < 900; i++) gap += memcmp(&gw[i], &w[i], 4) != 0 || memcmp(&gm[i], &m[i], 4) != 0;
    for (int i = 0; act_bf16() && i < PTAB_N; i++)
        if (i < 817 || i >= 900) copy += gc[i] != nstf_f32_to_bf16(gw[i]);
    CHECK(gap == 0, "%s: adamw wrote %d elements outside the tensor table", g_name, gap);
    CHECK(copy == 0, "%s: adamw's bf16 copy differs from the rounded weights at %d elements", g_name, copy);
    drop(dw), drop(dg), drop(dm), drop(dv), drop(dc);
    free(w), free(g), free(m), free(v), free(rw), free(rm), free(rv), free(gw), free(gm), free(gv), free(gc);
}

static void case_grad_norm(test_rng *r) {
    float *g = fvec(r, PTAB_N, 1.0f);
    double rsq[3], sq[3] = {-1, -1, -1}, norm = -1;
    const double rnorm = nstf_ref_grad_norm(k_ptab, 3, g, rsq);
    dbuf dg = up(g, PTAB_N * 4);
    nstf_op_args a = {.op = NSTF_OP_GRAD_NORM, .label = "grad_norm"};
    a.grad_norm.tensors = k_ptab;
    a.grad_norm.n_tensors = 3;
    a.grad_norm.grad = dg.d;
    a.grad_norm.sq = sq;
    a.grad_norm.norm = &norm;
    run_op(&a, 1, 0);
    for (int i = 0; i < 3; i++)
        CHECK(fabs(sq[i] - rsq[i]) <= 1e-12 * rsq[i], "%s: grad_norm of tensor %d: %.17g, reference %.17g", g_name, i,
              sq[i], rsq[i]);
    CHECK(fabs(norm - rnorm) <= 1e-12 * rnorm, "%s: grad_norm %.17g, reference %.17g", g_name, norm, rnorm);
    drop(dg);
    /* a NaN in the second tensor: the error names it and the element */
    g[300 + 17] = NAN;
    dg = up(g, PTAB_N * 4);
    a.grad_norm.grad = dg.d;
    nstf_status st = open_batch(1, 0) ? nstf_backend_op(g_be, &a) : NSTF_ERR_INTERNAL;
    const char *msg = nstf_last_error();
    CHECK(st == NSTF_ERR_RANGE && strstr(msg, "blk.0.ffn_up.weight") && strstr(msg, "element 17") && isnan(norm),
          "%s: grad_norm of a NaN gradient: status %d, '%s'", g_name, (int)st, msg);
    nstf_batch b = {.tokens = g_tok, .pos = g_pos, .n = 1};
    nstf_fwd_out o = {0};
    bool retry = false;
    (void)g_be->vt->end(g_be, &b, NSTF_OK, &o, &retry);
    drop(dg);
    free(g);
}
