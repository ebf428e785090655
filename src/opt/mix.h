/* mix.h — choosing one candidate per item under a budget: the selection
 * step of adaptive precision (adaptive.h). Each item (a layer matrix) has
 * candidates (tensor types), each with a size in bytes and a cost (its
 * measured sensitivity: the KL divergence the model shows with only that
 * matrix changed). The total cost of a choice is the sum of the items'
 * costs (additivity: a first-order model of the joint effect; the
 * accuracy-budget driver corrects it by measuring, see adaptive.h).
 *
 * Two budgets, one algorithm:
 *   - size budget:     minimize sum cost subject to sum bytes <= max_bytes;
 *   - accuracy budget: minimize sum bytes subject to sum cost <= max_cost.
 * Both are the multiple-choice knapsack problem, solved exactly by dynamic
 * programming over the size: best[u] = the least total cost of the items
 * so far within u size units, one pass per item over its candidates
 * (O(items x candidates x units), a choice table of items x units bytes
 * for the backtrack). Sizes are counted in units of `unit` bytes, rounded
 * up per candidate and the budget rounded down, so the chosen total never
 * exceeds max_bytes; unit is the smallest that keeps the table at most
 * NSTF_MIX_MAX_UNITS entries (1 byte on small problems: then the answer is
 * the exact optimum). After the DP, a repair pass spends what the
 * rounding left over: while some single item can move to a candidate of
 * lower cost within the exact remaining bytes, the best such move is made.
 *
 * Why not greedy marginal gain (start every item at its smallest
 * candidate, repeatedly upgrade the item with the best cost decrease per
 * byte): it is optimal only at the breakpoints of the items' convex hulls
 * and discards candidates inside them; measured costs are noisy and not
 * convex in size (a larger type can measure worse), and at the budget the
 * greedy leaves bytes unspent. The DP has neither problem and takes well
 * under a second at model scale (210 matrices x 12 types x 65536 units). */
#ifndef NSTF_OPT_MIX_H
#define NSTF_OPT_MIX_H

#include <stdint.h>

#include "core/status.h"

#define NSTF_MIX_MAX_UNITS 65536

typedef struct nstf_mix_cand {
    uint64_t bytes; /* size of the item in this candidate */
    double cost;    /* >= 0 (negative measured costs: pass max(0, x)) */
} nstf_mix_cand;

typedef struct nstf_mix_item {
    const nstf_mix_cand *cand; /* [n_cand], n_cand >= 1 */
    int n_cand;
} nstf_mix_item;

typedef struct nstf_mix_budget {
    uint64_t max_bytes; /* > 0: size budget */
    double max_cost;    /* used when max_bytes == 0: accuracy budget */
} nstf_mix_budget;

typedef struct nstf_mix_result {
    uint64_t bytes; /* of the chosen candidates */
    double cost;
} nstf_mix_result;

/* choice[i] <- the chosen candidate of item i. Errors: no item, an item
 * without candidates, a negative or non-finite cost, a size budget below
 * the smallest possible total, or an accuracy budget below the least
 * possible cost (each says by how much). */
nstf_status nstf_mix_select(const nstf_mix_item *items, int n_items, const nstf_mix_budget *b, int *choice,
                            nstf_mix_result *out);

#endif
