/* cli_util.h — what every nstf command shares: one error prefix
 * ("nstf COMMAND: ..."), strict parsing of numbers, --flag=value, unknown
 * options with a "did you mean" hint, a progress bar for terminals, and
 * Ctrl-C. Each parser prints one clear line on failure and returns false;
 * a command then exits with 2 (bad argument). */
#ifndef NSTF_TOOLS_CLI_UTIL_H
#define NSTF_TOOLS_CLI_UTIL_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/dtype.h"

/* The running command ("run", "bench", ...), set by the dispatcher; errors
 * say "nstf <cmd>: ...". */
extern const char *cli_cmd;
/* One line on stderr: "nstf <cmd>: <message>". */
void cli_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The same, from the library's last error. */
void cli_lib_err(void);

bool cli_parse_int(const char *flag, const char *s, long min, long max, int *out);
bool cli_parse_u64(const char *flag, const char *s, uint64_t *out);
bool cli_parse_float(const char *flag, const char *s, double min, double max, float *out);
/* A comma-separated list of tensor type names into out [cap]; with
 * need_quantizer, only types nstf can write. False (and a message naming
 * flag) on an unknown name, too many, or none. */
bool cli_parse_types(const char *flag, const char *list, nstf_type *out, int *n, int cap, bool need_quantizer);
/* A percentage "P" or "P%" in [min, max] percent, as a fraction (1% -> 0.01). */
bool cli_parse_percent(const char *flag, const char *s, double min, double max, double *fraction);
bool cli_parse_double(const char *flag, const char *s, double min, double max, double *out);
/* --act-bits: 8, 16 or 32 (CPU activations of quantized matmuls). */
bool cli_parse_act_bits(const char *flag, const char *s, int *out);
/* --sparse-attn K[,W]: top-k blocks (1..1024) and, when given, the window
 * (1..2^24 positions; *window unchanged otherwise). */
bool cli_parse_sparse(const char *flag, const char *s, int *topk, int *window);
/* The value after a flag, or an error if it is missing. */
const char *cli_value(int argc, char **argv, int *i);
/* A text file read whole (free it); NULL with a message on stderr naming what. */
char *cli_read_file(const char *path, const char *what);

/* A command's help text, written by its usage function. */
typedef void (*cli_usage_fn)(FILE *f);
/* Split every "--flag=value" whose flag the command's help names into
 * "--flag" "value" (argv is replaced by a copy that lives until exit;
 * once per process). */
void cli_expand_args(int *argc, char ***argv, cli_usage_fn usage);
/* "unknown option 'X'", with the closest flag of the help when one is
 * close ("did you mean --ctx-size?"). Returns 2, the exit code. */
int cli_unknown_option(const char *arg, cli_usage_fn usage);

/* Threads: the physical cores, and a warning on stderr when n is more
 * than the processors this process may run on. */
int cli_default_threads(void);
void cli_check_threads(int n);
/* -t N: parsed (1..1024) into *n and checked as above; false after an error line. */
bool cli_parse_threads(const char *flag, const char *v, int *n);

/* A progress bar on stderr with rate and ETA, drawn only when stderr is a
 * terminal (at most 10 times a second, and always at done == total).
 * cli_progress_cb has the shape of a library progress callback: (user,
 * done, total). */
typedef struct cli_progress {
    const char *label; /* "writing" */
    const char *unit;  /* "MiB" */
    double scale;      /* units per count: 1.0 / (1 << 20) for bytes as MiB */
    double t0, last;
    bool tty, drawn;
} cli_progress;
void cli_progress_init(cli_progress *p, const char *label, const char *unit, double scale);
void cli_progress_cb(void *user, uint64_t done, uint64_t total);
/* The same bar with `note` (may be NULL) before the ETA, e.g. "step 40/100
 * loss 2.3124 8211 tok/s"; a NULL unit leaves out the rate. */
void cli_progress_show(cli_progress *p, uint64_t done, uint64_t total, const char *note);
/* Ends the bar's line (when one was drawn). */
void cli_progress_end(cli_progress *p);

/* A job in named stages (the opt library's callback: user, stage, done,
 * total, what): on a terminal the bar above, labelled with the stage and
 * restarted when it changes; otherwise a line "stage: done/total (elapsed,
 * ETA) what" at every step, or at every tenth of the stage named `tenths`
 * (the long one; NULL: none). */
typedef struct cli_stages {
    cli_progress bar;
    char stage[48];
    const char *tenths;
} cli_stages;
void cli_stages_init(cli_stages *s, const char *tenths);
void cli_stages_cb(void *user, const char *stage, int done, int total, const char *what);
void cli_stages_end(cli_stages *s);

/* Ctrl-C: the handler counts presses in cli_sigint (the library's stop
 * flag); with quit_on_second, a second press ends the process at once
 * (exit status 130). */
extern volatile sig_atomic_t cli_sigint;
void cli_sigint_install(bool quit_on_second);

/* A tensor-parallel command (run, bench) started by mpirun as one of
 * several processes, one rank each: join the launch; *n_tp (0 or 1:
 * unset) becomes the launch's size, another count is an error; *seed
 * (may be NULL) becomes rank 0's, so that every process samples the same
 * tokens. Ranks other than 0 write nothing to stdout. Returns -1 to go
 * on, else the exit status. Not launched: -1 at once. */
int cli_launch_tp(int *n_tp, uint64_t *seed);
/* Under a launch: rank 0's *text (NULL: none, as at the end of its input)
 * becomes every rank's, a malloc'd copy (what another rank held is
 * freed). stdin reaches rank 0 only, so what it reads there (a prompt, a
 * chat's lines) goes to the others this way; they wait up to timeout_ms
 * (CLI_LAUNCH_WAIT_MS: a person's pace). 0, or 1 with the error printed. */
#define CLI_LAUNCH_WAIT_MS (7 * 24 * 3600 * 1000)
int cli_launch_share(char **text, int timeout_ms);
/* Any command: join the launch when mpirun started this process as one of
 * several. Returns -1 to go on, else the exit status (the error printed). */
int cli_launch_join(void);
/* The end of a launched command: a failed rank ends the launch (the
 * others would wait for it); else the launch is left. Returns rc. */
int cli_launch_end(int rc);

#endif
