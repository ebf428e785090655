/* backend_ops_sparse.h — the sparse decode attention's case of
 * test_backend_ops.c (ATTN_SPARSE), included after its helpers.
 *
 * One sequence: prefill chunks (at most 64 tokens, the batch of run_all's
 * plan) fill the cache through the op (dense attention, statistics kept),
 * then two one-token steps attend sparsely. Checked against
 * nstf_ref_attn_sparse (fp64) on exactly the values the backend holds:
 *  - the last prefill chunk's output: dense causal attention, as the
 *    attention case (fp32 NMSE <= 1e-7; bf16 outputs within 2x the error of
 *    the reference rounded to bf16 once);
 *  - each step's selected blocks: equal to the reference's, every one (the
 *    shapes leave the bounds well apart, so fp32 and fp64 rank alike);
 *  - each step's output: as above;
 *  - the block minima and maxima of every block written: exact (min and max
 *    of the stored keys);
 *  - the attention mass after each step (fp32): NMSE <= 1e-7 against the
 *    reference's update from the same starting values.
 * Shapes: topk below, at and above the blocks available (the last equals
 * dense attention), a step that opens a new block, window 0 (the current
 * block only), blocks of 16 and 32; over a thousand candidate blocks (4200
 * positions in blocks of 4), with random keys and with every key the same
 * (all bounds tie: the lowest blocks are chosen). */

/* The op's arguments for n tokens at p0 over the cache [ctx, nkv, hd]
 * (statistics, mass, selection and work left to the caller). */
static nstf_op_args sparse_args(dbuf dq, dbuf dk, dbuf dv, dbuf dck, dbuf dcv, dbuf dout, int64_t n, int64_t p0,
                                int nh, int nkv, int hd, int64_t ctx, float scale, int topk, int block, int window) {
    nstf_op_args a = {.op = NSTF_OP_ATTN_SPARSE, .label = "attn_sparse"};
    a.attn_sparse.q = (nstf_view){dq.d, g_be->act_type, (int64_t)nh * hd};
    a.attn_sparse.k = (nstf_view){dk.d, g_be->act_type, (int64_t)nkv * hd};
    a.attn_sparse.v = (nstf_view){dv.d, g_be->act_type, (int64_t)nkv * hd};
    a.attn_sparse.k_cache = dck.d, a.attn_sparse.v_cache = dcv.d;
    a.attn_sparse.out = (nstf_view){dout.d, g_be->act_type, (int64_t)nh * hd};
    a.attn_sparse.pos = g_io.pos;
    a.attn_sparse.n = n, a.attn_sparse.n_ctx = ctx, a.attn_sparse.pos0 = p0;
    a.attn_sparse.n_heads = nh, a.attn_sparse.n_kv_heads = nkv, a.attn_sparse.head_dim = hd;
    a.attn_sparse.scale = scale;
    a.attn_sparse.block = block, a.attn_sparse.topk = topk, a.attn_sparse.window = window;
    return a;
}

static void sparse_case_shape(test_rng *r, int64_t P, int topk, int block, int window, int nh, int nkv, int hd,
                              int64_t ctx, bool flat) {
    enum { CHUNK = 64, STEPS = 2 };
    const int NH = nh, NKV = nkv, HD = hd;
    const int64_t CTX = ctx;
    const bool big = P > 1000;
    const float scale = 0.125f;
    if (big && !g_be->host_memory && g_be->vt->get_opt(g_be, NSTF_OPT_LEVEL) < 2) {
        /* a GPU's materialized attention (levels 0, 1) holds the scores of
         * the planned context (320): a longer prefill is a clear refusal */
        const int64_t n = 64, p0 = 4000;
        dbuf dq = up(NULL, act_bytes(n * NH * HD)), dk = up(NULL, act_bytes(n * NKV * HD)),
             dv = up(NULL, act_bytes(n * NKV * HD)), dout = up(NULL, act_bytes(n * NH * HD));
        dbuf dck = up(NULL, act_bytes(CTX * NKV * HD)), dcv = up(NULL, act_bytes(CTX * NKV * HD));
        if (!open_batch((int)n, (int)p0)) return;
        const nstf_op_args a =
            sparse_args(dq, dk, dv, dck, dcv, dout, n, p0, NH, NKV, HD, CTX, scale, topk, block, window);
        const nstf_status st = nstf_backend_op(g_be, &a);
        CHECK(st == NSTF_ERR_INVALID_ARG && strstr(nstf_last_error(), "score matrix"),
              "%s: a %lld-key prefill below level 2: %s", g_name, (long long)(p0 + n),
              st == NSTF_OK ? "ran" : nstf_last_error());
        end_refused((int)n, st);
        drop(dq), drop(dk), drop(dv), drop(dout), drop(dck), drop(dcv);
        return;
    }
    const int64_t qd = NH * HD, kvd = NKV * HD, nrow = P + STEPS, nb = (CTX + block - 1) / block;
    const int64_t ms = nstf_sparse_max_sel(topk, block, window);
    const float decay = 0.75f;
    float *kall = malloc((size_t)(nrow * kvd) * 4), *vall = malloc((size_t)(nrow * kvd) * 4);
    float *qall = malloc((size_t)(nrow * qd) * 4);
    /* each block's keys scaled by its own factor: bounds that differ by far
     * more than fp32 rounding */
    void *hk = act_make(r, kall, nrow * kvd, 1.0f), *hv = act_make(r, vall, nrow * kvd, 1.0f);
    for (int64_t j = 0; j < nrow; j++) {
        const float f = 0.5f + 0.1f * (float)((j / block) * 7 % 11);
        for (int64_t i = 0; i < kvd; i++) kall[j * kvd + i] = flat ? kall[i] : act_round(f * kall[j * kvd + i]);
    }
    void *hq = act_make(r, qall, nrow * qd, 1.0f);
    dbuf dck = up(NULL, act_bytes(CTX * kvd)), dcv = up(NULL, act_bytes(CTX * kvd));
    dbuf dmin = up(NULL, (size_t)(nb * kvd) * 4), dmax = up(NULL, (size_t)(nb * kvd) * 4);
    float *mass0 = calloc((size_t)(nb * NKV), 4);
    dbuf dmass = up(mass0, (size_t)(nb * NKV) * 4);
    dbuf dsel = up(NULL, (size_t)(CHUNK * NKV * ms) * 4);
    dbuf dwork = up(NULL, (size_t)nstf_sparse_work_floats(1, NH, NKV, HD, CTX, topk, block, window) * 4);
    float *rmass = calloc((size_t)(nb * NKV), 4), *gmass = malloc((size_t)(nb * NKV) * 4);
    char what[128];
    for (int64_t p0 = 0; p0 < nrow;) {
        const int64_t n = p0 < P ? (P - p0 < CHUNK ? P - p0 : CHUNK) : 1;
        /* this chunk's q, k, v in the backend's type */
        void *cq = malloc(act_bytes(n * qd)), *ckk = malloc(act_bytes(n * kvd)), *cvv = malloc(act_bytes(n * kvd));
        for (int64_t i = 0; i < n * qd; i++) {
            if (act_bf16()) ((uint16_t *)cq)[i] = nstf_f32_to_bf16(qall[p0 * qd + i]);
            else ((float *)cq)[i] = qall[p0 * qd + i];
        }
        for (int64_t i = 0; i < n * kvd; i++) {
            if (act_bf16()) {
                ((uint16_t *)ckk)[i] = nstf_f32_to_bf16(kall[p0 * kvd + i]);
                ((uint16_t *)cvv)[i] = nstf_f32_to_bf16(vall[p0 * kvd + i]);
            } else {
                ((float *)ckk)[i] = kall[p0 * kvd + i];
                ((float *)cvv)[i] = vall[p0 * kvd + i];
            }
        }
        dbuf dq = up(cq, act_bytes(n * qd)), dk = up(ckk, act_bytes(n * kvd)), dv = up(cvv, act_bytes(n * kvd)),
             dout = up(NULL, act_bytes(n * qd));
        if (!open_batch((int)n, (int)p0)) return;
        nstf_op_args a = sparse_args(dq, dk, dv, dck, dcv, dout, n, p0, NH, NKV, HD, CTX, scale, topk, block, window);
        a.attn_sparse.kmin = dmin.d, a.attn_sparse.kmax = dmax.d, a.attn_sparse.mass = dmass.d;
        a.attn_sparse.mass_decay = decay;
        a.attn_sparse.sel = dsel.d, a.attn_sparse.work = dwork.d;
        close_batch((int)n, nstf_backend_op(g_be, &a));
        void *ho = malloc(act_bytes(n * qd));
        float *got = malloc((size_t)(n * qd) * 4), *rout = malloc((size_t)qd * 4);
        double *ref = malloc((size_t)(n * qd) * 8);
        down(dout, ho, "attn_sparse out");
        act_read(ho, got, n * qd);
        down(dck, NULL, "attn_sparse k cache"), down(dcv, NULL, "attn_sparse v cache"), down(dwork, NULL, "work");
        if (n > 1 && (!big || p0 + n == P)) { /* dense causal attention (of a big case: the last chunk only) */
            double *pr = malloc((size_t)(p0 + n) * 8);
            for (int64_t t = 0; t < n; t++)
                for (int h = 0; h < NH; h++) {
                    const int g = h / (NH / NKV);
                    const int64_t nk = p0 + t + 1;
                    double m = -1e300, s = 0;
                    for (int64_t j = 0; j < nk; j++) {
                        double d = 0;
                        for (int i = 0; i < HD; i++) d += (double)qall[(p0 + t) * qd + h * HD + i] * kall[j * kvd + g * HD + i];
                        pr[j] = d * scale;
                        m = fmax(m, pr[j]);
                    }
                    for (int64_t j = 0; j < nk; j++) s += pr[j] = exp(pr[j] - m);
                    for (int i = 0; i < HD; i++) {
                        double o = 0;
                        for (int64_t j = 0; j < nk; j++) o += pr[j] * vall[j * kvd + g * HD + i];
                        ref[t * qd + h * HD + i] = o / s;
                    }
                }
            free(pr);
            snprintf(what, sizeof what, "attn_sparse prefill %lld tokens at %lld", (long long)n, (long long)p0);
            judge(what, got, ref, n * qd, act_bf16(), 1e-7);
        } else if (n == 1) { /* the sparse step against the reference, selection first */
            int32_t *rsel = malloc((size_t)(NKV * ms) * 4), *gsel = malloc((size_t)(NKV * ms) * 4);
            nstf_ref_attn_sparse(qall + p0 * qd, kall, vall, rout, rsel, rmass, decay, p0 + 1, NH, NKV, HD, scale, block,
                                 topk, window);
            int32_t *all = malloc((size_t)(CHUNK * NKV * ms) * 4);
            down(dsel, all, "attn_sparse sel");
            memcpy(gsel, all, (size_t)(NKV * ms) * 4);
            free(all);
            int diff = 0;
            for (int64_t i = 0; i < NKV * ms; i++) diff += gsel[i] != rsel[i];
            CHECK(diff == 0, "%s: attn_sparse step at %lld (topk %d, block %d, window %d): %d selected blocks differ "
                  "from the reference", g_name, (long long)p0, topk, block, window, diff);
            for (int64_t i = 0; i < qd; i++) ref[i] = rout[i];
            snprintf(what, sizeof what, "attn_sparse step at %lld, topk %d, block %d, window %d", (long long)p0, topk,
                     block, window);
            judge(what, got, ref, qd, act_bf16(), 1e-7);
            down(dmass, gmass, "attn_sparse mass");
            double *rm = malloc((size_t)(nb * NKV) * 8);
            for (int64_t i = 0; i < nb * NKV; i++) rm[i] = rmass[i];
            snprintf(what, sizeof what, "attn_sparse mass after the step at %lld", (long long)p0);
            judge(what, gmass, rm, nb * NKV, false, 1e-7);
            free(rm), free(rsel), free(gsel);
        }
        /* the statistics of every block written so far, exact */
        {
            const int64_t end = p0 + n, nbw = (end + block - 1) / block;
            float *gmin = malloc((size_t)(nb * kvd) * 4), *gmax = malloc((size_t)(nb * kvd) * 4);
            down(dmin, gmin, "attn_sparse kmin"), down(dmax, gmax, "attn_sparse kmax");
            int bad = 0;
            for (int64_t b = 0; b < nbw; b++)
                for (int64_t c = 0; c < kvd; c++) {
                    float lo = INFINITY, hi = -INFINITY;
                    for (int64_t j = b * block; j < (b + 1) * block && j < end; j++) {
                        lo = fminf(lo, kall[j * kvd + c]);
                        hi = fmaxf(hi, kall[j * kvd + c]);
                    }
                    bad += gmin[b * kvd + c] != lo || gmax[b * kvd + c] != hi;
                }
            CHECK(bad == 0, "%s: attn_sparse after position %lld: %d block min/max values differ", g_name,
                  (long long)end - 1, bad);
            free(gmin), free(gmax);
        }
        drop(dq), drop(dk), drop(dv), drop(dout);
        free(cq), free(ckk), free(cvv), free(ho), free(got), free(rout), free(ref);
        p0 += n;
    }
    drop(dck), drop(dcv), drop(dmin), drop(dmax), drop(dmass), drop(dsel), drop(dwork);
    free(kall), free(vall), free(qall), free(hk), free(hv), free(hq), free(mass0), free(rmass), free(gmass);
}

static void sparse_case(test_rng *r, int64_t P, int topk, int block, int window) {
    sparse_case_shape(r, P, topk, block, window, 6, 2, 64, 320, false);
}

static void case_attn_sparse(test_rng *r) {
    sparse_case(r, 200, 3, 16, 32);  /* 13 blocks before the window, 3 chosen */
    sparse_case(r, 255, 4, 16, 20);  /* the second step opens block 16 */
    sparse_case(r, 150, 64, 16, 16); /* topk above the blocks: dense attention */
    sparse_case(r, 290, 2, 32, 0);   /* window 0: the current block only */
    sparse_case(r, 100, 0, 16, 40);  /* block 0 and the window */
    /* over a thousand candidate blocks (the GPU's selection reads them in
     * rounds of its workgroup); two query heads over one kv head keep the
     * prefill cheap */
    sparse_case_shape(r, 4200, 40, 4, 16, 2, 1, 64, 4224, false);
    /* every key the same, so every bound ties: the lowest blocks win */
    sparse_case_shape(r, 4200, 40, 4, 16, 2, 1, 64, 4224, true);
}
