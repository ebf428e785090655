/* stats.c — mean, sample standard deviation, median, min and max. */
#include "prof/stats.h"

#include <math.h>
#include <string.h>

/* k-th smallest (0-based) of x[0..n) without modifying x: counting rank of
 * every candidate, O(n^2); used only when n is too large for the buffer. */
static double kth_by_rank(const double *x, int64_t n, int64_t k) {
    for (int64_t i = 0; i < n; i++) {
        int64_t less = 0, equal = 0;
        for (int64_t j = 0; j < n; j++) {
            less += x[j] < x[i];
            equal += x[j] == x[i];
        }
        if (less <= k && k < less + equal) return x[i];
    }
    return x[0];
}

static double kth(const double *x, int64_t n, int64_t k) {
    double buf[256];
    if (n > 256) return kth_by_rank(x, n, k);
    memcpy(buf, x, (size_t)n * sizeof *buf);
    for (int64_t i = 1; i < n; i++) { /* insertion sort: n is a repetition count */
        double v = buf[i];
        int64_t j = i - 1;
        while (j >= 0 && buf[j] > v) {
            buf[j + 1] = buf[j];
            j--;
        }
        buf[j + 1] = v;
    }
    return buf[k];
}

nstf_stats nstf_stats_compute(const double *x, int64_t n) {
    nstf_stats s = {0};
    if (n <= 0) return s;
    s.n = n;
    s.min = s.max = x[0];
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        sum += x[i];
        if (x[i] < s.min) s.min = x[i];
        if (x[i] > s.max) s.max = x[i];
    }
    s.mean = sum / (double)n;
    if (n > 1) {
        double ss = 0; /* two-pass: no cancellation for large means */
        for (int64_t i = 0; i < n; i++) ss += (x[i] - s.mean) * (x[i] - s.mean);
        s.stddev = sqrt(ss / (double)(n - 1));
    }
    s.median = n % 2 ? kth(x, n, n / 2) : 0.5 * (kth(x, n, n / 2 - 1) + kth(x, n, n / 2));
    return s;
}
