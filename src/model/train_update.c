/* train_update.c — the update that ends a training step (train.h), after
 * the backward has left this rank's gradients in g:
 *
 *   one rank        norm = grad_norm(g); adamw(every tensor)
 *   replicated      all-reduce(g); norm; adamw(every tensor) on every rank
 *   ZeRO-1          reduce-scatter(g): rank r's slot of g holds the summed
 *                   gradient of its slot; norm from every rank's partial
 *                   sums; adamw(rank r's part) on its slot of the weights
 *                   with its slot-sized moments; all-gather(w) (and the
 *                   GPU's bf16 compute copy, which AdamW writes)
 *
 * Slots (nstf_comm_shard_len): rank r owns [r S, (r + 1) S) of the flat
 * layout, S = ceil(n_flat / N) rounded up to 64 elements; w, g and the
 * copy are padded to N S elements (the padding is zero, in no tensor, and
 * never read by an op), so the last rank's real share is the shorter one.
 * The weights stay whole on every rank: the forward reads them (on the
 * CPU the fp32 master is the forward's copy; on a GPU the embedding and
 * the norms are read in fp32 from it), so ZeRO-1 shards the moments
 * (8 bytes per parameter to 8 / N) and the work of AdamW and the norm.
 *
 * The reduce-scatter sums in the all-reduce's order (host: rank order;
 * NCCL: the same bits for two ranks), and AdamW is elementwise, so every
 * updated weight equals the replicated update's bit for bit as long as
 * the clipping factor does, which the norm below guarantees.
 *
 * The norm over N > 1 ranks. The parameter table is cut at the slot
 * boundaries of N into segments (the same cut with and without ZeRO-1);
 * the GRAD_NORM row gives each segment's sum of squares (double, a fixed
 * order within the segment); a tensor's sum is its segments' sums added
 * in rank order starting from 0.0, and the norm is sqrt of the tensors'
 * sums added in table order. Under ZeRO-1 each rank sums its own segments
 * and the ranks exchange them (nstf_comm_host_allgather), so every rank
 * adds the same doubles in the same order: the replicated run (--zero 0)
 * and the ZeRO-1 run get the same norm bit for bit. Against one rank's
 * norm (one sequential sum per tensor) only the at most N - 1 tensors cut
 * by a slot boundary differ: their two partial sums are rounded apart,
 * about 1e-16 of that tensor's sum, far below the fp32 clip factor's
 * resolution (the gradients summed over ranks already differ more). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/mem.h"
#include "model/train.h"

/* ---- the segments ------------------------------------------------------------------------------ */

void nstf_train_segments_free(nstf_train *t) {
    nstf_free(t->segs);
    nstf_free(t->mine);
    nstf_free(t->seg_tensor);
    nstf_free(t->seg_names);
    nstf_free(t->seg_sq);
    nstf_free(t->sq_all);
    t->segs = t->mine = NULL;
    t->seg_tensor = NULL;
    t->seg_names = NULL;
    t->seg_sq = t->sq_all = NULL;
    t->n_segs = t->n_mine = t->seg_most = 0;
}

#define SEG_NAME 112 /* "blk.12.ffn_gate.weight[123456789:987654321]" */

/* The table cut at multiples of slot (segments in flat order, so rank r's
 * are consecutive); with seg NULL only counts. Returns the count. A cut
 * tensor's segments are named as slices, "blk.0.ffn_gate.weight[4224:
 * 12288]", so a non-finite gradient's message names the tensor and the
 * slice its element index counts from. */
static int cut(const nstf_train *t, int64_t slot, nstf_param_tensor *seg, int *tensor, char *names) {
    int k = 0;
    for (int i = 0; i < t->n_ptab; i++) {
        const nstf_param_tensor *p = &t->ptab[i];
        for (int64_t a = p->offset, b; a < p->offset + p->n; a = b, k++) {
            b = (a / slot + 1) * slot;
            if (b > p->offset + p->n) b = p->offset + p->n;
            if (!seg) continue;
            char *nm = names + (size_t)k * SEG_NAME;
            if (a == p->offset && b == p->offset + p->n) snprintf(nm, SEG_NAME, "%s", p->name);
            else snprintf(nm, SEG_NAME, "%s[%lld:%lld]", p->name, (long long)(a - p->offset), (long long)(b - p->offset));
            seg[k] = (nstf_param_tensor){nm, a, b - a, p->decay};
            tensor[k] = i;
        }
    }
    return k;
}

nstf_status nstf_train_segments(nstf_train *t, int n, int rank) {
    nstf_train_segments_free(t);
    int64_t slot = 0;
    NSTF_TRY(nstf_comm_shard_len(t->n_flat, n, NSTF_TRAIN_SHARD_ALIGN, &slot));
    if (slot <= 0) return nstf_set_error(NSTF_ERR_INVALID_ARG, "training without parameters");
    const int k = cut(t, slot, NULL, NULL, NULL);
    t->segs = nstf_calloc((size_t)k, sizeof *t->segs, "norm segments");
    t->seg_tensor = nstf_calloc((size_t)k, sizeof *t->seg_tensor, "norm segments");
    t->seg_names = nstf_calloc((size_t)k, SEG_NAME, "norm segment names");
    t->seg_sq = nstf_calloc((size_t)k, sizeof *t->seg_sq, "norm segment sums");
    if (!t->segs || !t->seg_tensor || !t->seg_names || !t->seg_sq) {
        nstf_train_segments_free(t);
        return NSTF_ERR_OOM;
    }
    t->n_segs = cut(t, slot, t->segs, t->seg_tensor, t->seg_names);
    /* each rank's first segment; the most any rank has */
    for (int r = 0, j = 0; r <= n; r++) {
        while (j < k && t->segs[j].offset < slot * r) j++;
        t->seg_first[r] = r == n ? k : j;
        if (r > 0 && t->seg_first[r] - t->seg_first[r - 1] > t->seg_most)
            t->seg_most = t->seg_first[r] - t->seg_first[r - 1];
    }
    /* this rank's, from its slot's start */
    t->n_mine = t->seg_first[rank + 1] - t->seg_first[rank];
    t->mine = nstf_calloc((size_t)(t->n_mine ? t->n_mine : 1), sizeof *t->mine, "norm segments");
    t->sq_all = nstf_calloc((size_t)n * (size_t)(t->seg_most ? t->seg_most : 1), sizeof *t->sq_all, "norm sums");
    if (!t->mine || !t->sq_all) {
        nstf_train_segments_free(t);
        return NSTF_ERR_OOM;
    }
    for (int j = 0; j < t->n_mine; j++) {
        t->mine[j] = t->segs[t->seg_first[rank] + j];
        t->mine[j].offset -= slot * rank;
    }
    return NSTF_OK;
}

nstf_status nstf_train_set_dp(nstf_train *t, nstf_comm *c, int rank, int n) {
    if (n < 1 || rank < 0 || rank >= n || (t->sh.shards > 1 && t->sh.shards != n))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "rank %d of %d data-parallel ranks (optimizer state in %d shards)",
                              rank, n, t->sh.shards);
    t->dp_comm = n > 1 ? c : NULL;
    t->dp_rank = rank;
    t->dp_n = n;
    return nstf_train_segments(t, n, rank);
}

/* ---- the norm ---------------------------------------------------------------------------------- */

static nstf_op_args op(nstf_op o, const char *label) {
    nstf_op_args a = {.op = o, .label = label, .layer = -1, .block = NSTF_BLOCK_OTHER};
    return a;
}

/* The GRAD_NORM row over n segments of grad into sq (none: nothing). */
static nstf_status segment_sums(nstf_train *t, const nstf_param_tensor *segs, int n, const float *grad, double *sq) {
    if (n == 0) return NSTF_OK;
    double unused = 0;
    nstf_op_args gn = op(NSTF_OP_GRAD_NORM, "grad_norm");
    gn.grad_norm.tensors = segs;
    gn.grad_norm.n_tensors = n;
    gn.grad_norm.grad = grad;
    gn.grad_norm.sq = sq;
    gn.grad_norm.norm = &unused; /* the norm is folded below, per tensor */
    return nstf_backend_op(t->be, &gn);
}

/* The norm from every segment's sum: per tensor in rank order from 0.0,
 * the tensors in table order; *bad: the first segment whose sum is not
 * finite, or -1. */
static double fold(const nstf_train *t, int *bad) {
    double total = 0;
    *bad = -1;
    for (int k = 0; k < t->n_segs;) {
        double s = 0;
        const int i = t->seg_tensor[k];
        for (; k < t->n_segs && t->seg_tensor[k] == i; k++) {
            if (!isfinite(t->seg_sq[k]) && *bad < 0) *bad = k;
            s += t->seg_sq[k];
        }
        total += s;
    }
    return sqrt(total);
}

/* Every segment's sum of squares in seg_sq (ZeRO-1: this rank's, then the
 * exchange) and the norm; the GRAD_NORM row's status (a non-finite
 * gradient in this rank's segments) in *own. */
static nstf_status norm_of(nstf_train *t, bool zero, double *norm, nstf_status *own, int *bad) {
    if (!zero) {
        *own = segment_sums(t, t->segs, t->n_segs, t->g, t->seg_sq);
    } else {
        const int64_t lo = t->shard_len * t->dp_rank;
        double *mine = t->sq_all + (size_t)t->dp_rank * (size_t)t->seg_most;
        *own = segment_sums(t, t->mine, t->n_mine, t->g + lo, mine);
        char why[512];
        snprintf(why, sizeof why, "%s", *own != NSTF_OK ? nstf_last_error() : "");
        /* every rank's sums to every rank, even after a failure here: the
         * others then know not to update */
        NSTF_TRY(nstf_comm_host_allgather(t->dp_comm, t->dp_rank, mine, t->sq_all,
                                          (size_t)t->seg_most * sizeof(double)));
        for (int r = 0; r < t->dp_n; r++)
            for (int j = t->seg_first[r]; j < t->seg_first[r + 1]; j++)
                t->seg_sq[j] = t->sq_all[(size_t)r * (size_t)t->seg_most + (size_t)(j - t->seg_first[r])];
        if (*own != NSTF_OK) nstf_set_error(*own, "%s", why);
    }
    *norm = fold(t, bad);
    if (*bad >= 0) *norm = NAN;
    return NSTF_OK;
}

/* ---- the update -------------------------------------------------------------------------------- */

/* The rank whose slot holds segment k. */
static int owner(const nstf_train *t, int k) {
    int r = 0;
    while (r + 1 < t->dp_n && t->seg_first[r + 1] <= k) r++;
    return r;
}

nstf_status nstf_train_update(nstf_train *t, int64_t step, const nstf_adamw_params *opt, double clip, double loss,
                              double *norm) {
    nstf_backend *be = t->be;
    const bool zero = t->dp_comm && t->sh.shards > 1;
    if (t->dp_comm && zero) /* each rank's slot of the gradients summed over the ranks */
        NSTF_TRY(nstf_comm_reduce_scatter(t->dp_comm, t->dp_rank, t->g, t->shard_len));
    else if (t->dp_comm) /* the gradients of every rank's sequences, summed in rank order */
        NSTF_TRY(nstf_comm_allreduce(t->dp_comm, t->dp_rank, t->g, t->n_flat));
    nstf_status own = NSTF_OK;
    int bad = -1;
    NSTF_TRY(norm_of(t, zero, norm, &own, &bad));
    if (own != NSTF_OK || !isfinite(loss) || bad >= 0) {
        char why[512];
        if (own != NSTF_OK) snprintf(why, sizeof why, "%s", nstf_last_error());
        else if (bad >= 0) /* another rank's slot: that rank names the element */
            snprintf(why, sizeof why, "the gradient of %s (rank %d's slot) is not finite", t->segs[bad].name,
                     owner(t, bad));
        else snprintf(why, sizeof why, "every gradient is finite");
        if (!isfinite(loss))
            return nstf_set_error(NSTF_ERR_RANGE, "step %lld: the loss is %s; %s", (long long)step + 1,
                                  isnan(loss) ? "nan" : "inf", why);
        if (own != NSTF_OK) return nstf_set_error(NSTF_ERR_RANGE, "step %lld: %s", (long long)step + 1, why);
        return NSTF_OK; /* a finite loss and slot here, a bad one elsewhere: its rank fails the step, none updates */
    }
    const int64_t lo = zero ? t->shard_len * t->dp_rank : 0;
    nstf_op_args aw = op(NSTF_OP_ADAMW, "adamw");
    aw.adamw.p = opt;
    aw.adamw.tensors = zero ? t->mine : t->ptab;
    aw.adamw.n_tensors = zero ? t->n_mine : t->n_ptab;
    aw.adamw.step = step + 1;
    aw.adamw.grad_scale = nstf_clip_scale(*norm, clip);
    aw.adamw.w = t->w + lo;
    aw.adamw.m = t->mom1;
    aw.adamw.v = t->mom2;
    aw.adamw.grad = t->g + lo;
    uint64_t es = 4;
    (void)nstf_type_row_bytes(be->act_type, 1, &es);
    if (t->wc)
        aw.adamw.w_copy = (nstf_view){(char *)t->wc + (uint64_t)lo * es, be->act_type, zero ? t->shard_len : t->n_flat};
    if (aw.adamw.n_tensors > 0) NSTF_TRY(nstf_backend_op(be, &aw));
    if (zero) { /* every rank's updated slot to every rank */
        NSTF_TRY(nstf_comm_allgather(t->dp_comm, t->dp_rank, t->w, t->shard_len, 4));
        if (t->wc) NSTF_TRY(nstf_comm_allgather(t->dp_comm, t->dp_rank, t->wc, t->shard_len, (int)es));
    }
    return be->vt->sync(be);
}
