/* gpu_measure.h — the GPU side of `nstf bench --levels` and `nstf profile
 * --device gpu` (gpu_measure.c). Both return a process exit status. */
#ifndef NSTF_TOOLS_GPU_MEASURE_H
#define NSTF_TOOLS_GPU_MEASURE_H

#include <stdbool.h>

#include "model/session.h"

/* The level comparison matrix for one model (markdown on stdout). */
int nstf_gpu_levels_matrix(const char *model, int reps);

/* Per-kernel profile of a GPU session: n_prompt tokens prefilled, then n_gen
 * decode steps, at the session's level. */
int nstf_gpu_profile(nstf_session *s, int n_prompt, int n_gen, const char *trace_path, const char *svg_path,
                     const char *cache, bool remeasure);

#endif
