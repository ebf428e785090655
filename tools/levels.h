/* levels.h — `nstf bench --levels`: the execution-level comparison matrix
 * of one model on its backend (levels.c). Returns a process exit status. */
#ifndef NSTF_TOOLS_LEVELS_H
#define NSTF_TOOLS_LEVELS_H

int nstf_levels_matrix(const char *model, int reps);

#endif
