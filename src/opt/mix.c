/* mix.c — one candidate per item under a size or accuracy budget: exact
 * multiple-choice knapsack by dynamic programming over size units, then a
 * repair pass over the exact byte counts (mix.h says why). */
#include "opt/mix.h"

#include <math.h>
#include <string.h>

#include "core/mem.h"

static uint64_t units_of(uint64_t bytes, uint64_t unit) { return bytes / unit + (bytes % unit != 0); }

static void totals(const nstf_mix_item *items, int n, const int *choice, nstf_mix_result *out) {
    out->bytes = 0;
    out->cost = 0;
    for (int i = 0; i < n; i++) {
        out->bytes += items[i].cand[choice[i]].bytes;
        out->cost += items[i].cand[choice[i]].cost;
    }
}

/* Single-item moves on exact bytes: size budget, the move that lowers the
 * cost most within the bytes left; accuracy budget, the move that saves
 * the most bytes within the cost left. Until none helps. */
static void repair(const nstf_mix_item *items, int n, const nstf_mix_budget *b, int *choice) {
    nstf_mix_result t;
    totals(items, n, choice, &t);
    for (;;) {
        int bi = -1, bc = -1;
        double best_gain = 0;
        for (int i = 0; i < n; i++) {
            const nstf_mix_cand *cur = &items[i].cand[choice[i]];
            for (int c = 0; c < items[i].n_cand; c++) {
                const nstf_mix_cand *x = &items[i].cand[c];
                double gain;
                if (b->max_bytes) {
                    if (x->cost >= cur->cost || t.bytes - cur->bytes + x->bytes > b->max_bytes) continue;
                    gain = cur->cost - x->cost;
                } else {
                    if (x->bytes >= cur->bytes || t.cost - cur->cost + x->cost > b->max_cost) continue;
                    gain = (double)(cur->bytes - x->bytes);
                }
                if (gain > best_gain) best_gain = gain, bi = i, bc = c;
            }
        }
        if (bi < 0) return;
        choice[bi] = bc;
        totals(items, n, choice, &t);
    }
}

nstf_status nstf_mix_select(const nstf_mix_item *items, int n_items, const nstf_mix_budget *b, int *choice,
                            nstf_mix_result *out) {
    if (!items || n_items < 1 || !b || !choice)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: no items");
    if (n_items > NSTF_MIX_MAX_UNITS / 4)
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: %d items (at most %d)", n_items,
                              NSTF_MIX_MAX_UNITS / 4);
    uint64_t sum_max = 0, sum_min = 0;
    double least_cost = 0;
    for (int i = 0; i < n_items; i++) {
        if (items[i].n_cand < 1 || items[i].n_cand > 255 || !items[i].cand)
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: item %d has %d candidates (1..255)", i,
                                  items[i].n_cand);
        uint64_t mx = 0, mn = UINT64_MAX;
        double lc = INFINITY;
        for (int c = 0; c < items[i].n_cand; c++) {
            const nstf_mix_cand *x = &items[i].cand[c];
            if (!(x->cost >= 0) || !isfinite(x->cost))
                return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: item %d candidate %d has cost %g", i, c,
                                      x->cost);
            if (x->bytes > mx) mx = x->bytes;
            if (x->bytes < mn) mn = x->bytes;
            if (x->cost < lc) lc = x->cost;
        }
        if (!nstf_add_ok(sum_max, mx, &sum_max))
            return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: sizes overflow");
        sum_min += mn;
        least_cost += lc;
    }
    if (b->max_bytes && b->max_bytes < sum_min)
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "a size budget of %llu bytes is below the smallest choice (%llu bytes: every "
                              "matrix at its smallest candidate); raise it by %llu bytes or add smaller types",
                              (unsigned long long)b->max_bytes, (unsigned long long)sum_min,
                              (unsigned long long)(sum_min - b->max_bytes));
    if (!b->max_bytes && !(b->max_cost >= least_cost))
        return nstf_set_error(NSTF_ERR_INVALID_ARG,
                              "an accuracy budget of %g is below the least possible cost %g (every matrix at "
                              "its most accurate candidate)",
                              b->max_cost, least_cost);
    /* units: sum over items of ceil(max / unit) <= sum_max / unit + n <= MAX_UNITS */
    const uint64_t room = (uint64_t)(NSTF_MIX_MAX_UNITS - n_items);
    const uint64_t unit = sum_max / room + 1;
    uint64_t U = 0;
    for (int i = 0; i < n_items; i++) {
        uint64_t mx = 0;
        for (int c = 0; c < items[i].n_cand; c++)
            if (units_of(items[i].cand[c].bytes, unit) > mx) mx = units_of(items[i].cand[c].bytes, unit);
        U += mx;
    }
    if (b->max_bytes && b->max_bytes / unit < U) U = b->max_bytes / unit;
    const size_t W = (size_t)U + 1;
    uint64_t tab_bytes;
    if (!nstf_mul_ok((uint64_t)W, (uint64_t)n_items, &tab_bytes))
        return nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: table size overflows");
    double *best = nstf_alloc(W * sizeof(double), "mix table"), *next = nstf_alloc(W * sizeof(double), "mix table");
    uint8_t *tab = nstf_alloc((size_t)tab_bytes, "mix choices");
    if (!best || !next || !tab) {
        nstf_free(best), nstf_free(next), nstf_free(tab);
        return NSTF_ERR_OOM;
    }
    for (size_t u = 0; u < W; u++) best[u] = 0;
    for (int i = 0; i < n_items; i++) {
        uint8_t *ti = tab + (size_t)i * W;
        for (size_t u = 0; u < W; u++) {
            double v = INFINITY;
            uint8_t arg = 0;
            for (int c = 0; c < items[i].n_cand; c++) {
                const uint64_t w = units_of(items[i].cand[c].bytes, unit);
                if (w > u || best[u - w] == INFINITY) continue;
                const double x = best[u - w] + items[i].cand[c].cost;
                if (x < v) v = x, arg = (uint8_t)c;
            }
            next[u] = v;
            ti[u] = arg;
        }
        double *tmp = best;
        best = next;
        next = tmp;
    }
    /* where to backtrack from: the budget, or the fewest units within the cost */
    size_t u0 = W;
    if (b->max_bytes) {
        if (best[W - 1] < INFINITY) u0 = W - 1;
    } else {
        for (size_t u = 0; u < W; u++)
            if (best[u] <= b->max_cost) {
                u0 = u;
                break;
            }
    }
    nstf_status st = NSTF_OK;
    if (u0 == W) { /* only the rounding to units can get here: fall back on the smallest / best choice */
        for (int i = 0; i < n_items; i++) {
            int k = 0;
            for (int c = 1; c < items[i].n_cand; c++) {
                const nstf_mix_cand *x = &items[i].cand[c], *y = &items[i].cand[k];
                if (b->max_bytes ? x->bytes < y->bytes : x->cost < y->cost) k = c;
            }
            choice[i] = k;
        }
    } else {
        size_t u = u0;
        for (int i = n_items - 1; i >= 0; i--) {
            const int c = tab[(size_t)i * W + u];
            choice[i] = c;
            u -= (size_t)units_of(items[i].cand[c].bytes, unit);
        }
    }
    nstf_free(best), nstf_free(next), nstf_free(tab);
    repair(items, n_items, b, choice);
    totals(items, n_items, choice, out);
    if (b->max_bytes && out->bytes > b->max_bytes)
        st = nstf_set_error(NSTF_ERR_INVALID_ARG, "nstf_mix_select: no choice within %llu bytes",
                            (unsigned long long)b->max_bytes);
    return st;
}
