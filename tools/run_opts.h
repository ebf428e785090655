/* run_opts.h — the options `nstf run` and `nstf chat` share (parsed in
 * cmd_run.c), and the interactive loop of chat.c. */
#ifndef NSTF_TOOLS_RUN_OPTS_H
#define NSTF_TOOLS_RUN_OPTS_H

#include <stdbool.h>

#include "nstf.h"

#define RUN_MAX_STOP 16

typedef struct run_opts {
    const char *model, *prompt, *prompt_file, *system;
    nstf_session_params sp;
    nstf_sampler_params smp;
    nstf_gen_params gp;
    const char *stop[RUN_MAX_STOP];
    bool chat;           /* run: the prompt is one chat turn */
    bool interactive;    /* run -i / -cnv, or nstf chat */
    bool special;        /* special tokens in a raw prompt */
    bool verbose_prompt; /* the prompt's tokens to stderr */
    bool display_prompt; /* the prompt echoed before the output */
    bool seed_set;
    int n_gpu_layers;    /* -ngl; -2: not given */
    const char *cache_k, *cache_v;
} run_opts;

/* The conversation loop of `nstf chat` (and run -i): turns from a terminal
 * (line editing, history, /commands, Ctrl-C) or one per line from a pipe.
 * Returns the exit status. */
int chat_loop(nstf_session *s, const run_opts *o);

/* "nstf CMD: prompt N tokens in ... (tokens/s); generation ..." on stderr. */
void run_print_speed(const nstf_gen_stats *gs);

#endif
