/* test_mix.c — the selection step of adaptive precision (src/opt/mix.h)
 * on synthetic sensitivity tables with a known optimum:
 *  - exhaustive search over every combination of small random tables
 *    (7 items x 4 candidates, sizes in bytes so the DP's unit is 1 byte):
 *    at each of many size budgets the chosen total cost equals the
 *    optimum (to 1e-12), and at each accuracy budget the chosen size
 *    equals the least size of any combination within it;
 *  - a table where greedy marginal gain is not optimal: the DP's answer is
 *    the hand-computed optimum;
 *  - model-scale tables (210 items, 11 candidates, sizes up to 4 MB, so
 *    sizes are rounded to units): the chosen bytes never exceed the budget
 *    (every budget of a sweep, and a budget equal to each answer's exact
 *    total), the
 *    cost never rises as the budget grows, and the accuracy budget set to
 *    a size-budget answer's cost gives no more bytes than that answer
 *    (+0.1% for the rounding to units);
 *  - bad input: budget below the smallest total, accuracy budget below the
 *    least cost, negative or NaN cost, an item without candidates. */
#include "opt/mix.h"

#include "test_util.h"

#define NI 7
#define NC 4

static void brute(const nstf_mix_item *it, int n, uint64_t max_bytes, double max_cost, double *best_cost,
                  uint64_t *best_bytes) {
    *best_cost = INFINITY;
    *best_bytes = UINT64_MAX;
    int idx[NI] = {0};
    for (;;) {
        uint64_t by = 0;
        double co = 0;
        for (int i = 0; i < n; i++) by += it[i].cand[idx[i]].bytes, co += it[i].cand[idx[i]].cost;
        if (max_bytes ? by <= max_bytes && co < *best_cost : co <= max_cost && by < *best_bytes)
            *best_cost = co, *best_bytes = by;
        int k = 0;
        while (k < n && ++idx[k] == it[k].n_cand) idx[k++] = 0;
        if (k == n) break;
    }
}

static void test_exhaustive(void) {
    test_rng r = {77};
    int n_cases = 0, bad_size = 0, bad_acc = 0;
    for (int t = 0; t < 15; t++) {
        nstf_mix_cand c[NI][NC];
        nstf_mix_item it[NI];
        for (int i = 0; i < NI; i++) {
            for (int k = 0; k < NC; k++) {
                c[i][k].bytes = 100 + rng_next(&r) % 900;
                c[i][k].cost = (double)(rng_next(&r) % 100000) / 1e4; /* not monotone in size */
            }
            it[i] = (nstf_mix_item){c[i], NC};
        }
        for (uint64_t B = 900; B <= 7000; B += 137) {
            double bc;
            uint64_t bb;
            brute(it, NI, B, 0, &bc, &bb);
            int choice[NI];
            nstf_mix_result res;
            nstf_mix_budget bu = {B, 0};
            nstf_status st = nstf_mix_select(it, NI, &bu, choice, &res);
            n_cases++;
            if (bc == INFINITY) {
                bad_size += st == NSTF_OK;
                continue;
            }
            if (st != NSTF_OK || res.bytes > B || fabs(res.cost - bc) > 1e-12) bad_size++;
        }
        for (double X = 0.5; X < 40; X *= 1.3) {
            double bc;
            uint64_t bb;
            brute(it, NI, 0, X, &bc, &bb);
            int choice[NI];
            nstf_mix_result res;
            nstf_mix_budget bu = {0, X};
            nstf_status st = nstf_mix_select(it, NI, &bu, choice, &res);
            n_cases++;
            if (bb == UINT64_MAX) {
                bad_acc += st == NSTF_OK;
                continue;
            }
            if (st != NSTF_OK || res.cost > X || res.bytes != bb) bad_acc++;
        }
    }
    CHECK(bad_size == 0, "%d size-budget cases differ from the exhaustive optimum", bad_size);
    CHECK(bad_acc == 0, "%d accuracy-budget cases differ from the exhaustive optimum", bad_acc);
    printf("exhaustive: %d cases\n", n_cases);
}

/* Greedy by cost decrease per byte upgrades item 0 first (0.9 per byte)
 * and then cannot afford item 1's upgrade; the optimum upgrades item 1
 * only. Items at their small candidate: 100 + 100 bytes, cost 10 + 50. */
static void test_known_optimum(void) {
    const nstf_mix_cand a[2] = {{100, 10.0}, {110, 1.0}}, b[2] = {{100, 50.0}, {190, 0.0}};
    const nstf_mix_item it[2] = {{a, 2}, {b, 2}};
    int choice[2];
    nstf_mix_result res;
    nstf_mix_budget bu = {290, 0};
    CHECK(nstf_mix_select(it, 2, &bu, choice, &res) == NSTF_OK, "select: %s", nstf_last_error());
    CHECK(choice[0] == 0 && choice[1] == 1 && res.bytes == 290 && res.cost == 10.0,
          "optimum: item 1 upgraded (got %d %d, %llu bytes, cost %g)", choice[0], choice[1],
          (unsigned long long)res.bytes, res.cost);
    bu.max_bytes = 300;
    CHECK(nstf_mix_select(it, 2, &bu, choice, &res) == NSTF_OK && choice[0] == 1 && choice[1] == 1 && res.cost == 1.0,
          "300 bytes: both upgraded");
    nstf_mix_budget acc = {0, 10.5}; /* least bytes with cost <= 10.5: 100 + 190 (cost 10) */
    CHECK(nstf_mix_select(it, 2, &acc, choice, &res) == NSTF_OK && res.bytes == 290 && res.cost == 10.0,
          "accuracy budget 10.5: 290 bytes (got %llu, cost %g)", (unsigned long long)res.bytes, res.cost);
}

static void test_model_scale(void) {
    enum { N = 210, K = 11 };
    static nstf_mix_cand c[N][K];
    nstf_mix_item it[N];
    test_rng r = {2026};
    uint64_t sum_min = 0, sum_max = 0;
    for (int i = 0; i < N; i++) {
        const uint64_t n_w = 331776 + (uint64_t)(rng_next(&r) % 8) * 442368; /* 576x576 .. 576x1536 x 7 */
        const double sens = 1e-4 * (1.0 + 50.0 * (double)(rng_next(&r) % 1000) / 1000.0);
        uint64_t mn = UINT64_MAX, mx = 0;
        for (int k = 0; k < K; k++) {
            const double bpw = 2.625 + 1.3 * k; /* 2.6 .. 15.6 bits per weight */
            c[i][k].bytes = (uint64_t)(bpw * (double)n_w / 8) + (uint64_t)k; /* not multiples of any unit */
            c[i][k].cost = sens * pow(2.0, -1.3 * k) * (0.8 + 0.4 * rng_uniform(&r) * rng_uniform(&r));
            mn = c[i][k].bytes < mn ? c[i][k].bytes : mn;
            mx = c[i][k].bytes > mx ? c[i][k].bytes : mx;
        }
        sum_min += mn;
        sum_max += mx;
        it[i] = (nstf_mix_item){c[i], K};
    }
    int choice[N], over = 0, rises = 0, exact_ok = 0;
    double prev = INFINITY;
    for (int s = 0; s <= 6; s++) {
        const uint64_t B = sum_min + (sum_max - sum_min) / 6 * (uint64_t)s;
        nstf_mix_result res;
        nstf_mix_budget bu = {B, 0};
        CHECK(nstf_mix_select(it, N, &bu, choice, &res) == NSTF_OK, "budget %llu: %s", (unsigned long long)B,
              nstf_last_error());
        over += res.bytes > B;
        rises += res.cost > prev * (1 + 1e-9);
        prev = res.cost;
        /* the chosen totals are what the choices say */
        uint64_t by = 0;
        for (int i = 0; i < N; i++) by += c[i][choice[i]].bytes;
        CHECK(by == res.bytes, "reported bytes %llu = sum of the choices %llu", (unsigned long long)res.bytes,
              (unsigned long long)by);
        /* a budget equal to this exact total is respected too (the DP's
         * rounding may then find a different, costlier answer: the rounding
         * loses at most one unit per item, see mix.h) */
        nstf_mix_result again;
        nstf_mix_budget eq = {res.bytes, 0};
        exact_ok += nstf_mix_select(it, N, &eq, choice, &again) == NSTF_OK && again.bytes <= res.bytes;
    }
    CHECK(over == 0, "%d budgets exceeded", over);
    CHECK(rises == 0, "the cost rose %d times as the budget grew", rises);
    CHECK(exact_ok == 7, "%d of 7 budgets equal to an exact total were respected", exact_ok);
    /* the accuracy budget: within it, and no larger than the size-budget
     * answer whose cost it is given */
    nstf_mix_result rs, ra;
    nstf_mix_budget bs = {(sum_min + sum_max) / 3, 0};
    CHECK(nstf_mix_select(it, N, &bs, choice, &rs) == NSTF_OK, "size budget");
    nstf_mix_budget ba = {0, rs.cost};
    CHECK(nstf_mix_select(it, N, &ba, choice, &ra) == NSTF_OK && ra.cost <= rs.cost && ra.bytes <= rs.bytes * 1.001,
          "accuracy budget %g: cost %g, %llu bytes (size-budget answer: %llu)", rs.cost, ra.cost,
          (unsigned long long)ra.bytes, (unsigned long long)rs.bytes);
}

static void test_errors(void) {
    const nstf_mix_cand a[2] = {{100, 1.0}, {200, 0.5}};
    nstf_mix_item it[1] = {{a, 2}};
    int choice[1];
    nstf_mix_result res;
    nstf_mix_budget small = {99, 0};
    CHECK(nstf_mix_select(it, 1, &small, choice, &res) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "below the smallest"),
          "budget below the smallest: %s", nstf_last_error());
    nstf_mix_budget acc = {0, 0.25};
    CHECK(nstf_mix_select(it, 1, &acc, choice, &res) == NSTF_ERR_INVALID_ARG &&
              strstr(nstf_last_error(), "least possible cost"),
          "accuracy budget below the least cost: %s", nstf_last_error());
    const nstf_mix_cand nanc[1] = {{100, NAN}}, negc[1] = {{100, -1}};
    nstf_mix_budget ok = {1000, 0};
    it[0] = (nstf_mix_item){nanc, 1};
    CHECK(nstf_mix_select(it, 1, &ok, choice, &res) == NSTF_ERR_INVALID_ARG, "NaN cost refused");
    it[0] = (nstf_mix_item){negc, 1};
    CHECK(nstf_mix_select(it, 1, &ok, choice, &res) == NSTF_ERR_INVALID_ARG, "negative cost refused");
    it[0] = (nstf_mix_item){a, 0};
    CHECK(nstf_mix_select(it, 1, &ok, choice, &res) == NSTF_ERR_INVALID_ARG, "no candidates refused");
    CHECK(nstf_mix_select(it, 0, &ok, choice, &res) == NSTF_ERR_INVALID_ARG, "no items refused");
}

int main(void) {
    test_exhaustive();
    test_known_optimum();
    test_model_scale();
    test_errors();
    return test_finish("test_mix");
}
