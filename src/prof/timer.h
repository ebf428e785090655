/* timer.h — clocks for measurement. A backend provides an nstf_timer whose
 * start/stop bracket work it has queued: on the CPU that is a monotonic
 * clock read on the calling thread; a GPU backend records events on its
 * stream and stop() waits for the end event, so bench code never needs to
 * know which device ran the work. */
#ifndef NSTF_PROF_TIMER_H
#define NSTF_PROF_TIMER_H

#include <stdint.h>

#include "core/clock.h"
#include "core/status.h"

typedef struct nstf_timer nstf_timer;
struct nstf_timer {
    const char *name; /* "monotonic clock", "cuda events", ... */
    void *ctx;        /* backend state (a stream, a pair of events) */
    /* Mark the start of the timed region. */
    nstf_status (*start)(nstf_timer *t);
    /* Mark the end, wait until the device has finished the region, and
     * give its duration in nanoseconds. */
    nstf_status (*stop)(nstf_timer *t, uint64_t *elapsed_ns);
    uint64_t t0; /* CPU timer: start time */
};

/* The CPU backend's timer: a monotonic clock. */
nstf_timer nstf_timer_cpu(void);

static inline nstf_status nstf_timer_start(nstf_timer *t) { return t->start(t); }
static inline nstf_status nstf_timer_stop(nstf_timer *t, uint64_t *ns) { return t->stop(t, ns); }

#endif
