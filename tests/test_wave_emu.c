/* test_wave_emu.c — the kernels' wave-level algorithms run over emulated
 * 32- and 64-lane waves on the CPU, against scalar references, so that a
 * bug that only shows with wave64 (CDNA) or wave32 (RDNA, NVIDIA) is caught
 * without AMD hardware.
 *
 * The emulator holds one value per lane in an array and implements the
 * shuffles (shfl_xor: lane l reads lane l ^ m; shfl_down: lane l reads
 * l + d, or keeps its own value past the end) as the hardware does for a
 * full wave. The algorithms come from src/ops/gpu/wave_algo.h, the header
 * the kernels use (loop macros, argmax comparison, softmax base, split
 * merge), and the matrix-unit fragment layouts of all three targets from
 * src/ops/gpu/mma_layout.h, the index math mma.h inlines; only the
 * block-level glue is mirrored here from the files named at each test, with
 * the lines it copies.
 *
 * The layouts are checked against their documented meaning: every C element
 * held exactly once, row slots and row butterflies consistent; the A and B
 * loads cover the tile (NVIDIA: ldmatrix.x4 rows feed the documented
 * registers x0..x3); the B fragment is the same whether B is stored n-major
 * (load_b) or k-major (load_b_kn); and on NVIDIA the C tile reused as an A
 * fragment in registers (nstf_mma_c_to_a) is what load_a gives for the
 * same tile.
 *
 * Metrics: integer/exact results (max, argmax, coverage, layouts) must match
 * exactly; fp32 sums and softmax outputs: NMSE <= 1e-7 against fp64. A
 * negative control shows that the emulator does catch a reduction written
 * for 32 lanes running in a 64-lane wave. */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/gpu/mma_layout.h"
#include "ops/gpu/wave_algo.h"
#include "test_util.h"

#define MAXW 64
#define MAX_THREADS 1024

/* ---- the emulated wave ------------------------------------------------------ */

static void shfl_xor(const float *v, float *out, int w, int m) {
    for (int l = 0; l < w; l++) out[l] = v[l ^ m];
}
static void shfl_xor_i(const int32_t *v, int32_t *out, int w, int m) {
    for (int l = 0; l < w; l++) out[l] = v[l ^ m];
}
static void shfl_down(const float *v, float *out, int w, int d) {
    for (int l = 0; l < w; l++) out[l] = l + d < w ? v[l + d] : v[l];
}

/* gpu.h wave_reduce_sum / wave_reduce_max: NSTF_WAVE_XOR_LOOP + shfl_xor */
static void wave_reduce_sum(float *v, int w) {
    float t[MAXW];
    NSTF_WAVE_XOR_LOOP(o, w) {
        shfl_xor(v, t, w, o);
        for (int l = 0; l < w; l++) v[l] += t[l];
    }
}
static void wave_reduce_max(float *v, int w) {
    float t[MAXW];
    NSTF_WAVE_XOR_LOOP(o, w) {
        shfl_xor(v, t, w, o);
        for (int l = 0; l < w; l++) v[l] = fmaxf(v[l], t[l]);
    }
}

/* The same reduction written as if every wave had 32 lanes (the bug the
 * wave-width rule prevents): for the negative control. */
static void wave_reduce_sum_hardcoded32(float *v, int w) {
    float t[MAXW];
    for (int o = 16; o > 0; o >>= 1) {
        shfl_xor(v, t, w, o);
        for (int l = 0; l < w; l++) v[l] += t[l];
    }
}

/* A shfl_down tree (lane 0 ends with the sum), the other common form. */
static float wave_reduce_sum_down(float *v, int w) {
    float t[MAXW];
    for (int d = w / 2; d > 0; d >>= 1) {
        shfl_down(v, t, w, d);
        for (int l = 0; l < w; l++) v[l] += t[l];
    }
    return v[0];
}

/* gpu.h block_reduce_sum: per-wave butterfly, lane 0 writes red[wave], then
 * v = lane < n_waves ? red[lane] : 0 and a second butterfly. */
static void block_reduce_sum(float *v, int n_threads, int w) {
    float red[MAX_THREADS / 32];
    const int n_waves = (n_threads + w - 1) / w;
    for (int wv = 0; wv < n_waves; wv++) wave_reduce_sum(v + wv * w, w);
    for (int wv = 0; wv < n_waves; wv++) red[wv] = v[wv * w];
    for (int wv = 0; wv < n_waves; wv++) {
        for (int l = 0; l < w; l++) v[wv * w + l] = l < n_waves ? red[l] : 0.0f;
        wave_reduce_sum(v + wv * w, w);
    }
}

static double sum_f64(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i];
    return s;
}

static void test_wave_reduce(int w, test_rng *rng) {
    for (int rep = 0; rep < 50; rep++) {
        float x[MAXW] = {0}, v[MAXW], m[MAXW];
        float mx = -INFINITY;
        for (int l = 0; l < w; l++) {
            x[l] = rng_normal(rng) * (rep % 5 ? 1.0f : 1e4f);
            mx = fmaxf(mx, x[l]);
        }
        double ref = sum_f64(x, w);
        memcpy(v, x, sizeof v);
        memcpy(m, x, sizeof m);
        wave_reduce_sum(v, w);
        wave_reduce_max(m, w);
        bool all_sum = true, all_max = true;
        for (int l = 0; l < w; l++) {
            double got = v[l];
            all_sum &= nmse(&v[l], &ref, 1) <= 1e-7 || fabs(got - ref) <= 1e-5 * fabs(ref) + 1e-6;
            all_max &= m[l] == mx;
        }
        CHECK(all_sum, "wave%d sum: lane values differ from %.9g", w, ref);
        CHECK(all_max, "wave%d max: not every lane has %g", w, mx);
        memcpy(v, x, sizeof v);
        float s0 = wave_reduce_sum_down(v, w);
        CHECK(nmse(&s0, &ref, 1) <= 1e-7, "wave%d shfl_down sum %.9g vs %.9g", w, s0, ref);
    }
    /* negative control: a 32-lane butterfly in a 64-lane wave leaves two
     * half sums; the emulator must see that */
    float x[MAXW];
    for (int l = 0; l < w; l++) x[l] = 1.0f;
    wave_reduce_sum_hardcoded32(x, w);
    if (w == 64) CHECK(x[0] == 32.0f && x[0] != (float)w, "negative control: hard-coded 32 gave %g", x[0]);
    else CHECK(x[0] == (float)w, "wave32 with a 32-lane butterfly: %g", x[0]);
}

static void test_block_reduce(int w, test_rng *rng) {
    static float v[MAX_THREADS], x[MAX_THREADS];
    for (int nt = w; nt <= MAX_THREADS; nt += w) {
        for (int i = 0; i < nt; i++) x[i] = v[i] = rng_uniform(rng);
        double ref = sum_f64(x, nt);
        CHECK(nt / w <= MAX_THREADS / 32 && nt / w <= w, "block %d: %d waves do not fit red[] / one wave", nt,
              nt / w);
        block_reduce_sum(v, nt, w);
        bool all = true;
        for (int i = 0; i < nt; i++) all &= nmse(&v[i], &ref, 1) <= 1e-7;
        CHECK(all, "wave%d block_reduce_sum(%d threads): thread values differ from %.9g", w, nt, ref);
    }
}

/* ---- argmax (argmax.cu am_block_reduce, lines 24-45) ------------------------- */

static void am_wave(float *bv, int32_t *bi, int w) {
    float tv[MAXW];
    int32_t ti[MAXW];
    NSTF_WAVE_XOR_LOOP(o, w) {
        shfl_xor(bv, tv, w, o);
        shfl_xor_i(bi, ti, w, o);
        for (int l = 0; l < w; l++)
            if (nstf_argmax_better(tv[l], ti[l], bv[l], bi[l])) {
                bv[l] = tv[l];
                bi[l] = ti[l];
            }
    }
}

/* argmax_pass1 over one segment x[0..n) with `nt` threads (strided loop),
 * then the block reduction; returns thread 0's index. */
static int32_t am_block(const float *x, int n, int nt, int w) {
    static float bv[MAX_THREADS];
    static int32_t bi[MAX_THREADS];
    float red_v[32];
    int32_t red_i[32];
    for (int t = 0; t < nt; t++) {
        bv[t] = -INFINITY;
        bi[t] = INT32_MAX;
        for (int j = t; j < n; j += nt)
            if (nstf_argmax_better(x[j], j, bv[t], bi[t])) {
                bv[t] = x[j];
                bi[t] = j;
            }
    }
    const int n_waves = nt / w;
    for (int wv = 0; wv < n_waves; wv++) {
        am_wave(bv + wv * w, bi + wv * w, w);
        red_v[wv] = bv[wv * w];
        red_i[wv] = bi[wv * w];
    }
    for (int wv = 0; wv < n_waves; wv++) {
        for (int l = 0; l < w; l++) {
            bv[wv * w + l] = l < n_waves ? red_v[l] : -INFINITY;
            bi[wv * w + l] = l < n_waves ? red_i[l] : INT32_MAX;
        }
        am_wave(bv + wv * w, bi + wv * w, w);
    }
    for (int t = 1; t < nt; t++)
        if (bi[t] != bi[0]) return -2; /* every thread must agree */
    return bi[0] == INT32_MAX ? 0 : bi[0]; /* argmax_pass2: an all-NaN row gives 0 */
}

static void test_argmax(int w, test_rng *rng) {
    static float x[9000];
    const int sizes[] = {1, 7, 255, 256, 1000, 8192, 8999};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        int n = sizes[si];
        for (int rep = 0; rep < 4; rep++) {
            for (int j = 0; j < n; j++) x[j] = (float)(int)(rng_uniform(rng) * 20.0f); /* many ties */
            if (rep == 1)
                for (int j = 0; j < n; j += 3) x[j] = NAN;
            if (rep == 2) x[n - 1] = 1e30f;
            int32_t ref = -1;
            for (int j = 0; j < n; j++)
                if (!isnan(x[j]) && (ref < 0 || x[j] > x[ref])) ref = j;
            if (ref < 0) ref = 0;
            int32_t got = am_block(x, n, 256, w);
            CHECK(got == ref, "wave%d argmax n=%d rep %d: %d, want %d", w, n, rep, got, ref);
        }
    }
}

/* ---- matrix-unit fragment layouts (mma_layout.h) ----------------------------- */

typedef enum { LAYOUT_NV, LAYOUT_MFMA, LAYOUT_WMMA } layout_id;
typedef struct layout {
    const char *name;
    layout_id id;
    int wave, c_n, c_rows, row_lanes;
    int (*c_row)(int l, int i), (*c_col)(int l, int i), (*c_slot)(int i), (*slot_row)(int l, int r);
    int (*a_row)(int l), (*a_col)(int l), (*b_row)(int l), (*b_col)(int l), (*bkn_row)(int l), (*bkn_col)(int l);
} layout;
#define LAYOUT(name, id, T, t)                                                                              \
    {name, id, NSTF_MMA_##T##_WAVE, NSTF_MMA_##T##_C_N, NSTF_MMA_##T##_C_ROWS, NSTF_MMA_##T##_ROW_LANES,       \
     nstf_mma_##t##_c_row, nstf_mma_##t##_c_col, nstf_mma_##t##_c_slot, nstf_mma_##t##_slot_row,             \
     nstf_mma_##t##_a_row, nstf_mma_##t##_a_col, nstf_mma_##t##_b_row, nstf_mma_##t##_b_col,                 \
     nstf_mma_##t##_bkn_row, nstf_mma_##t##_bkn_col}
static const layout k_layouts[] = {
    LAYOUT("nvidia mma.sync", LAYOUT_NV, NV, nv),
    LAYOUT("cdna mfma 16x16x16", LAYOUT_MFMA, MFMA, mfma),
    LAYOUT("rdna3 wmma 16x16x16", LAYOUT_WMMA, WMMA, wmma),
};

static int c_row(const layout *L, int l, int i) { return L->c_row(l, i); }
static int c_col(const layout *L, int l, int i) { return L->c_col(l, i); }
static int c_slot(const layout *L, int i) { return L->c_slot(i); }
static int slot_row(const layout *L, int l, int r) { return L->slot_row(l, r); }

/* The fragment element e of lane l of an operand, as (row, col) of its
 * logical matrix: A (m, k), B (n, k); which = 0: A from load_a, 1: B from
 * load_b (B[n][k] stored), 2: B from load_b_kn (B[k][n] stored). NVIDIA:
 * e = 2m + h is half h of register x[m], filled by ldmatrix(.trans) from
 * 8x8 matrix m, whose row j the lane 8m + j addresses: without .trans lane
 * l receives row l/4, columns 2(l%4) + h; with .trans, rows 2(l%4) + h of
 * column l/4. AMD: the lane's own elements, along the stored row (A, B
 * n-major) or down the stored column (B k-major). */
static void frag_elem(const layout *L, int which, int l, int e, int *row, int *col) {
    int (*fr)(int) = which == 0 ? L->a_row : which == 1 ? L->b_row : L->bkn_row;
    int (*fc)(int) = which == 0 ? L->a_col : which == 1 ? L->b_col : L->bkn_col;
    int sr, sc; /* stored row, column */
    if (L->id == LAYOUT_NV) {
        const int m = e >> 1, h = e & 1;
        if (which == 2) { /* .trans: stored rows 2(l%4) + h, column l/4 */
            sr = fr(8 * m + 2 * (l & 3) + h);
            sc = fc(8 * m + 2 * (l & 3) + h) + (l >> 2);
        } else {
            sr = fr(8 * m + (l >> 2));
            sc = fc(8 * m + (l >> 2)) + 2 * (l & 3) + h;
        }
    } else if (which == 2) {
        sr = fr(l) + e;
        sc = fc(l);
    } else {
        sr = fr(l);
        sc = fc(l) + e;
    }
    if (which == 2) { /* stored k-major: (k, n) -> logical (n, k) */
        *row = sc;
        *col = sr;
    } else {
        *row = sr;
        *col = sc;
    }
}

/* Elements of an A/B fragment per lane: NVIDIA 4 registers x 2, MFMA 4, WMMA 16. */
static int frag_n(const layout *L) { return L->id == LAYOUT_NV ? 8 : L->id == LAYOUT_MFMA ? 4 : 16; }

static void test_fragments(const layout *L) {
    /* A and B loads cover the 16x16 tile: each element once per group of
     * lanes that holds a whole tile (WMMA: lanes 16..31 repeat 0..15) */
    const int copies = L->id == LAYOUT_WMMA ? 2 : 1;
    for (int which = 0; which < 3; which++) {
        int seen[16][16] = {{0}};
        bool in_tile = true;
        for (int l = 0; l < L->wave; l++)
            for (int e = 0; e < frag_n(L); e++) {
                int r, c;
                frag_elem(L, which, l, e, &r, &c);
                if (r < 0 || r > 15 || c < 0 || c > 15) in_tile = false;
                else seen[r][c]++;
            }
        bool once = in_tile;
        for (int r = 0; r < 16; r++)
            for (int c = 0; c < 16; c++) once &= seen[r][c] == copies;
        CHECK(once, "%s: the %s load does not cover the tile exactly %d time(s)", L->name,
              which == 0 ? "A" : which == 1 ? "B (n-major)" : "B (k-major)", copies);
    }
    /* the B fragment is the same from either storage */
    bool same_b = true;
    for (int l = 0; l < L->wave; l++)
        for (int e = 0; e < frag_n(L); e++) {
            int r1, c1, r2, c2;
            frag_elem(L, 1, l, e, &r1, &c1);
            frag_elem(L, 2, l, e, &r2, &c2);
            same_b &= r1 == r2 && c1 == c2;
        }
    CHECK(same_b, "%s: load_b and load_b_kn give different B fragments", L->name);
    if (L->id == LAYOUT_NV) {
        /* ldmatrix.x4 matrix m: A x0 rows 0-7 / cols 0-7, x1 rows 8-15, x2
         * cols 8-15, x3 both; B n-major x0 n 0-7 / k 0-7, x1 k 8-15, x2 n
         * 8-15, x3 both (mma.h's register table) */
        bool regs = true;
        for (int l = 0; l < 32; l++) {
            const int m = l >> 3, j = l & 7;
            regs &= L->a_row(l) == j + 8 * (m & 1) && L->a_col(l) == 8 * (m >> 1);
            regs &= L->b_row(l) == j + 8 * (m >> 1) && L->b_col(l) == 8 * (m & 1);
        }
        CHECK(regs, "%s: ldmatrix row addresses do not feed registers x0..x3 as documented", L->name);
        /* nstf_mma_c_to_a: x[m] = pack(c.x[2m], c.x[2m+1]), i.e. A fragment
         * element e is C element e: the same (row, col) as load_a's */
        bool c_to_a = true;
        for (int l = 0; l < 32; l++)
            for (int e = 0; e < 8; e++) {
                int r, c;
                frag_elem(L, 0, l, e, &r, &c);
                c_to_a &= r == c_row(L, l, e) && c == c_col(L, l, e);
            }
        CHECK(c_to_a, "%s: a C tile reused as an A fragment (c_to_a) is not what load_a gives", L->name);
    }
}

/* per (lane, slot) values, reduced over the lanes of a row (mma.h
 * nstf_mma_row_max / nstf_mma_row_sum: NSTF_ROW_XOR_LOOP) */
static void row_reduce(const layout *L, float v[][8], bool is_max) {
    float col[MAXW], t[MAXW];
    for (int r = 0; r < L->c_rows; r++) {
        for (int l = 0; l < L->wave; l++) col[l] = v[l][r];
        NSTF_ROW_XOR_LOOP(m, L->row_lanes) {
            shfl_xor(col, t, L->wave, m);
            for (int l = 0; l < L->wave; l++) col[l] = is_max ? fmaxf(col[l], t[l]) : col[l] + t[l];
        }
        for (int l = 0; l < L->wave; l++) v[l][r] = col[l];
    }
}

static void test_layout(const layout *L, test_rng *rng) {
    /* every C element held exactly once; slots agree with rows; a lane's
     * row slots are distinct rows */
    int seen[16][16] = {{0}};
    bool slot_ok = true, lanes_ok = true;
    for (int l = 0; l < L->wave; l++) {
        for (int i = 0; i < L->c_n; i++) {
            int r = c_row(L, l, i), c = c_col(L, l, i);
            if (r < 0 || r > 15 || c < 0 || c > 15) {
                lanes_ok = false;
                continue;
            }
            seen[r][c]++;
            slot_ok &= c_row(L, l, i) == slot_row(L, l, c_slot(L, i));
        }
    }
    bool once = lanes_ok;
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) once &= seen[r][c] == 1;
    CHECK(once, "%s: C elements not covered exactly once by %d lanes x %d", L->name, L->wave, L->c_n);
    CHECK(slot_ok, "%s: c_row(i) != slot_row(c_slot(i))", L->name);

    /* row max and row sum through the row butterfly */
    float tile[16][16];
    for (int r = 0; r < 16; r++)
        for (int c = 0; c < 16; c++) tile[r][c] = rng_normal(rng);
    float vmax[MAXW][8], vsum[MAXW][8];
    for (int l = 0; l < L->wave; l++)
        for (int r = 0; r < 8; r++) {
            vmax[l][r] = -INFINITY;
            vsum[l][r] = 0.0f;
        }
    for (int l = 0; l < L->wave; l++)
        for (int i = 0; i < L->c_n; i++) {
            float x = tile[c_row(L, l, i)][c_col(L, l, i)];
            int s = c_slot(L, i);
            vmax[l][s] = fmaxf(vmax[l][s], x);
            vsum[l][s] += x;
        }
    row_reduce(L, vmax, true);
    row_reduce(L, vsum, false);
    bool max_ok = true, sum_ok = true;
    for (int l = 0; l < L->wave; l++)
        for (int r = 0; r < L->c_rows; r++) {
            int row = slot_row(L, l, r);
            float mx = -INFINITY;
            for (int c = 0; c < 16; c++) mx = fmaxf(mx, tile[row][c]);
            double ref = sum_f64(tile[row], 16);
            max_ok &= vmax[l][r] == mx;
            sum_ok &= nmse(&vsum[l][r], &ref, 1) <= 1e-7;
        }
    CHECK(max_ok, "%s: row max through the row butterfly is wrong", L->name);
    CHECK(sum_ok, "%s: row sum through the row butterfly is wrong", L->name);
}

/* ---- the online softmax of flash_common.h flash_tile (lines 43-110) ---------
 * One 16-row tile against keys [k0, k1) in tiles of BKV, scores s[row][key]
 * (already scaled to the log2 domain), one value per key v[key]: each row's
 * state (m, per-lane partial l, o) is kept per (lane, slot) exactly as the
 * kernel does; o accumulates sum_j p_j v_j (the PV product, reduced over the
 * row's lanes here instead of by the matrix unit). Keys > qpos[row] are
 * masked (causal). Writes the partial (m, l, o) of each row. */
#define BKV 32
#define NKEY 300
static void flash_rows(const layout *L, float s[16][NKEY], const float *v, const int *qpos, int k0, int k1,
                       float *m_out, float *l_out, float *o_out) {
    float m[MAXW][8], l[MAXW][8], o[MAXW][8];
    for (int ln = 0; ln < L->wave; ln++)
        for (int r = 0; r < 8; r++) {
            m[ln][r] = -INFINITY;
            l[ln][r] = 0.0f;
            o[ln][r] = 0.0f;
        }
    for (int kv0 = k0; kv0 < k1; kv0 += BKV) {
        /* scores of this tile in C layout: 16 x BKV = BKV/16 C tiles */
        static float x[MAXW][BKV / 16][8];
        float mnew[MAXW][8], pv[MAXW][8];
        for (int ln = 0; ln < L->wave; ln++) {
            for (int r = 0; r < L->c_rows; r++) mnew[ln][r] = m[ln][r];
            for (int j = 0; j < BKV / 16; j++)
                for (int e = 0; e < L->c_n; e++) {
                    int row = c_row(L, ln, e), key = kv0 + j * 16 + c_col(L, ln, e);
                    float xv = key < k1 && key <= qpos[row] ? s[row][key] : -INFINITY;
                    x[ln][j][e] = xv;
                    mnew[ln][c_slot(L, e)] = fmaxf(mnew[ln][c_slot(L, e)], xv);
                }
        }
        row_reduce(L, mnew, true);
        for (int ln = 0; ln < L->wave; ln++)
            for (int r = 0; r < L->c_rows; r++) {
                float base = nstf_softmax_base(mnew[ln][r]);
                float alpha = exp2f(m[ln][r] - base);
                m[ln][r] = mnew[ln][r];
                l[ln][r] *= alpha;
                o[ln][r] *= alpha;
                pv[ln][r] = 0.0f;
                mnew[ln][r] = base;
            }
        for (int ln = 0; ln < L->wave; ln++)
            for (int j = 0; j < BKV / 16; j++)
                for (int e = 0; e < L->c_n; e++) {
                    int r = c_slot(L, e), key = kv0 + j * 16 + c_col(L, ln, e);
                    float p = exp2f(x[ln][j][e] - mnew[ln][r]);
                    l[ln][r] += p;
                    pv[ln][r] += key < k1 ? p * v[key] : 0.0f;
                }
        row_reduce(L, pv, false); /* the PV product's reduction over k */
        for (int ln = 0; ln < L->wave; ln++)
            for (int r = 0; r < L->c_rows; r++) o[ln][r] += pv[ln][r];
    }
    row_reduce(L, l, false); /* flash_finish_l */
    /* every lane that holds a row must agree; report from the first one */
    for (int row = 0; row < 16; row++) {
        m_out[row] = NAN;
        for (int ln = 0; ln < L->wave && isnan(m_out[row]); ln++)
            for (int r = 0; r < L->c_rows; r++)
                if (slot_row(L, ln, r) == row) {
                    m_out[row] = m[ln][r];
                    l_out[row] = l[ln][r];
                    o_out[row] = o[ln][r];
                    break;
                }
    }
}

static void test_flash_softmax(const layout *L, test_rng *rng) {
    static float s[16][NKEY];
    float v[NKEY];
    int qpos[16];
    for (int r = 0; r < 16; r++) {
        qpos[r] = r < 2 ? 40 + r : NKEY - 16 + r; /* two rows see only the first keys */
        for (int k = 0; k < NKEY; k++) s[r][k] = rng_normal(rng) * 3.0f;
    }
    for (int k = 0; k < NKEY; k++) v[k] = rng_normal(rng);
    double ref[16];
    for (int r = 0; r < 16; r++) {
        double mx = -INFINITY, num = 0, den = 0;
        for (int k = 0; k <= qpos[r] && k < NKEY; k++) mx = fmax(mx, s[r][k]);
        for (int k = 0; k <= qpos[r] && k < NKEY; k++) {
            double p = exp2((double)s[r][k] - mx);
            num += p * v[k];
            den += p;
        }
        ref[r] = num / den;
    }
    /* one pass over all keys (prefill, flash_attn.cu) */
    float m1[16], l1[16], o1[16], out[16];
    flash_rows(L, s, v, qpos, 0, NKEY, m1, l1, o1);
    for (int r = 0; r < 16; r++) out[r] = o1[r] / l1[r];
    CHECK(nmse(out, ref, 16) <= 1e-7, "%s: one-pass online softmax NMSE %.3g", L->name, nmse(out, ref, 16));

    /* split-KV (flash_decode.cu): S splits of `chunk` keys (a multiple of the
     * tile), some of them fully masked for the short rows, merged with
     * NSTF_SOFTMAX_MERGE_ROW */
    const int splits[] = {1, 2, 3, 5, 10};
    for (size_t si = 0; si < sizeof splits / sizeof splits[0]; si++) {
        int n_split = splits[si];
        int chunk = ((NKEY + n_split - 1) / n_split + BKV - 1) / BKV * BKV;
        float ml[16][32], acc[16][16]; /* [row][2 * split + (0: m, 1: l)], [row][split] */
        for (int sp = 0; sp < n_split; sp++) {
            float mm[16], ll[16], oo[16];
            int k0 = sp * chunk, k1 = k0 + chunk < NKEY ? k0 + chunk : NKEY;
            if (k0 >= NKEY) k0 = k1 = NKEY;
            flash_rows(L, s, v, qpos, k0, k1, mm, ll, oo);
            for (int r = 0; r < 16; r++) {
                ml[r][2 * sp] = mm[r];
                ml[r][2 * sp + 1] = ll[r];
                acc[r][sp] = oo[r];
            }
        }
        for (int r = 0; r < 16; r++) NSTF_SOFTMAX_MERGE_ROW(out[r], ml[r], 2, acc[r], 1, n_split, exp2f);
        bool finite = true;
        for (int r = 0; r < 16; r++) finite &= isfinite(out[r]);
        CHECK(finite, "%s: split merge (%d splits) produced NaN/Inf", L->name, n_split);
        CHECK(nmse(out, ref, 16) <= 1e-7, "%s: split-KV merge over %d splits NMSE %.3g", L->name, n_split,
              nmse(out, ref, 16));
        /* two levels, as flash_decode.cu's blocks do: groups of up to 4
         * splits merged into one partial each (NSTF_SOFTMAX_MERGE_SUMS),
         * then the group partials merged into the output */
        float gml[16][16], gacc[16][8];
        const int n_grp = (n_split + 3) / 4;
        for (int r = 0; r < 16; r++)
            for (int g = 0; g < n_grp; g++) {
                const int n_in = n_split - 4 * g < 4 ? n_split - 4 * g : 4;
                float mx, num, den;
                NSTF_SOFTMAX_MERGE_SUMS(mx, num, den, ml[r] + 8 * g, 2, acc[r] + 4 * g, 1, n_in, exp2f);
                gml[r][2 * g] = mx;
                gml[r][2 * g + 1] = den;
                gacc[r][g] = num;
            }
        for (int r = 0; r < 16; r++) NSTF_SOFTMAX_MERGE_ROW(out[r], gml[r], 2, gacc[r], 1, n_grp, exp2f);
        finite = true;
        for (int r = 0; r < 16; r++) finite &= isfinite(out[r]);
        CHECK(finite && nmse(out, ref, 16) <= 1e-7, "%s: two-level split-KV merge over %d splits NMSE %.3g",
              L->name, n_split, nmse(out, ref, 16));
    }
}

/* ---- gemv's lane striding (gemv.cu, gemv_kernel's unit loop) -------------------
 * units u0 = lane, lane + W*UNROLL, ...; u = u0 + k*W for k < UNROLL:
 * every unit of a chunk must be visited exactly once by the wave. */
static void test_gemv_cover(int w) {
    const int unroll = 4;
    static int hit[5000];
    bool ok = true;
    for (int n_units = 1; n_units < 5000; n_units += 37) {
        memset(hit, 0, sizeof hit);
        for (int lane = 0; lane < w; lane++)
            for (int u0 = lane; u0 < n_units; u0 += w * unroll)
                for (int k = 0; k < unroll; k++) {
                    int u = u0 + k * w;
                    if (u < n_units) hit[u]++;
                }
        for (int u = 0; u < n_units; u++) ok &= hit[u] == 1;
    }
    CHECK(ok, "wave%d: gemv lane striding misses or repeats a unit", w);
    /* rows per wave: 8 rows over 256 / W waves must divide (static_assert in gemv.cu) */
    CHECK(8 % (256 / w) == 0, "wave%d: GEMV_ROWS 8 not a multiple of %d waves", w, 256 / w);
}

int main(void) {
    test_rng rng = {0x5eed0fa11u};
    const int waves[] = {32, 64};
    for (int i = 0; i < 2; i++) {
        test_wave_reduce(waves[i], &rng);
        test_block_reduce(waves[i], &rng);
        test_argmax(waves[i], &rng);
        test_gemv_cover(waves[i]);
    }
    for (size_t i = 0; i < sizeof k_layouts / sizeof k_layouts[0]; i++) {
        test_layout(&k_layouts[i], &rng);
        test_fragments(&k_layouts[i]);
        test_flash_softmax(&k_layouts[i], &rng);
    }
    return test_finish("test_wave_emu");
}
