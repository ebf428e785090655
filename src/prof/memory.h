/* memory.h — where a session's memory goes, per device, as one stable
 * machine-parseable line:
 *   memory: device=cpu total=N free=N weights=N kv_cache=N compute=N
 * (all in bytes; total/free are the device's, the rest this session's;
 * a session split over a GPU and the CPU has one line for each),
 * and the load progress of a model's weights. */
#ifndef NSTF_PROF_MEMORY_H
#define NSTF_PROF_MEMORY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nstf.h"

typedef struct nstf_mem_report {
    const char *device; /* "cpu", "cuda0", ... */
    uint64_t total;     /* device memory (host: MemTotal) */
    uint64_t free;      /* available now (host: MemAvailable) */
    uint64_t weights;   /* model tensors (mapped) + converted norms */
    uint64_t kv_cache;  /* K and V caches */
    uint64_t compute;   /* activations, logits and op scratch */
} nstf_mem_report;

/* The session's reports, one per device it runs on (two for a GPU/CPU
 * split, -ngl: the GPU's stage first); returns how many. */
#define NSTF_MEM_MAX_DEVICES 2
int nstf_mem_report_session(const nstf_session *s, nstf_mem_report out[NSTF_MEM_MAX_DEVICES]);
void nstf_mem_report_print(FILE *f, const nstf_mem_report *r);
/* One line per device of the session. */
void nstf_mem_report_print_session(FILE *f, const nstf_session *s);

/* Bring the model's mapped weights into memory by reading one byte of
 * every page, reporting progress on f: a bar with bytes, percent and speed
 * when f is a terminal, otherwise one plain line at the end (only when
 * `plain` is set, so scripted runs can keep stderr quiet). The mmap path
 * has nothing else to load, so this is the honest "loading" of the CPU
 * backend (it costs what the first forward would pay otherwise). */
void nstf_weights_touch(const nstf_session *s, FILE *f, bool plain);

#endif
