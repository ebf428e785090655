/* stats.h — summary statistics of repeated measurements. */
#ifndef NSTF_PROF_STATS_H
#define NSTF_PROF_STATS_H

#include <stdint.h>

typedef struct nstf_stats {
    int64_t n;
    double mean;
    double stddev; /* sample standard deviation (Bessel's n - 1, as llama-bench); 0 when n < 2 */
    double median; /* mean of the two middle values when n is even */
    double min, max;
} nstf_stats;

/* Statistics of x[0..n). n == 0 gives all zeros. Allocates nothing (the
 * median uses a copy in a small stack buffer, or a selection over the input
 * order for n > 256: x itself is never modified). */
nstf_stats nstf_stats_compute(const double *x, int64_t n);

#endif
