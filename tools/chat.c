/* chat.c — the conversation loop of `nstf chat` and `nstf run -i`.
 *
 * On a terminal: libedit reads each line (editing, history with the
 * arrows), the answer streams to stdout, Ctrl-C during an answer stops it
 * and returns to the prompt, Ctrl-C at the prompt or a second one during
 * an answer quits (status 130), Ctrl-D quits (0). Not a terminal (a pipe, a file): one user
 * turn per line until end of input, each answer printed on its own line;
 * nothing else goes to stdout. Lines starting with '/' are commands; a
 * line ending in a backslash continues on the next.
 *
 * Under mpirun (one tensor-parallel rank per process) stdin reaches rank
 * 0 only: rank 0 reads each turn and shares it (cli_launch_share), and
 * every rank runs it, so the ranks' caches and sampled tokens stay the
 * same; only rank 0 prints, and /save writes on rank 0 alone (/load reads
 * the file on every rank). A Ctrl-C does not stop an answer there: mpirun
 * ends the launch. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli_util.h"
#include "dist/proc.h"
#include "nstf.h"
#include "run_opts.h"

typedef struct {
    bool tty;
    bool quit;
    bool launched, lead; /* under mpirun; rank 0 (or not launched) */
} chat_state;

static bool on_piece(void *user, int32_t token, const char *piece, size_t len) {
    (void)user, (void)token;
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    return true;
}

/* command replies go to stderr: stdout keeps only the answers (rank 0's
 * alone under mpirun) */
static void note(const chat_state *c, const char *msg) {
    if (c->lead) fprintf(stderr, "%s\n", msg);
}

/* One line of input without its newline (malloc'd), NULL at the end of
 * input or on Ctrl-C at the prompt (*interrupted then). */
static char *read_line(chat_state *c, const char *prompt, bool *interrupted) {
    *interrupted = false;
    if (c->tty) {
        errno = 0;
        char *l = readline(prompt);
        if (!l && (cli_sigint || errno == EINTR)) *interrupted = true;
        return l;
    }
    char *l = NULL;
    size_t cap = 0;
    ssize_t n = getline(&l, &cap, stdin);
    if (n < 0) {
        free(l);
        return NULL;
    }
    if (n && l[n - 1] == '\n') l[--n] = 0;
    if (n && l[n - 1] == '\r') l[--n] = 0;
    return l;
}

/* A turn: a line, and the next ones while it ends in a backslash. */
static char *read_turn(chat_state *c, bool *interrupted) {
    char *all = read_line(c, "> ", interrupted);
    while (all && *all && all[strlen(all) - 1] == '\\') {
        all[strlen(all) - 1] = '\n';
        char *more = read_line(c, ". ", interrupted);
        if (!more) break;
        char *j = malloc(strlen(all) + strlen(more) + 1);
        if (!j) {
            free(more);
            break;
        }
        strcpy(j, all);
        strcat(j, more);
        free(all);
        free(more);
        all = j;
    }
    if (all && c->tty && *all) add_history(all);
    return all;
}

static void help(void) {
    fprintf(stderr,
            "  /clear         forget the conversation (the system message stays)\n"
            "  /save FILE     write the conversation as JSON\n"
            "  /load FILE     continue a saved conversation\n"
            "  /system TEXT   a new system message (empty: the template's default); clears\n"
            "  /help          this text\n"
            "  /exit, /quit   leave (or Ctrl-D)\n"
            "  Ctrl-C stops an answer; at the prompt it quits. A line ending in \\ continues.\n");
}

/* The argument of a command ("/save FILE" -> "FILE"), NULL if none. */
static const char *arg_of(const char *line, size_t cmd_len) {
    const char *a = line + cmd_len;
    while (*a == ' ' || *a == '\t') a++;
    return *a ? a : NULL;
}

static bool cmd_is(const char *line, const char *cmd) {
    size_t n = strlen(cmd);
    return !strncmp(line, cmd, n) && (line[n] == 0 || line[n] == ' ' || line[n] == '\t');
}

/* Runs a /command; false when it asks to quit. */
static bool command(const chat_state *c, nstf_conv *conv, const char *line) {
    const char *arg;
    if (cmd_is(line, "/exit") || cmd_is(line, "/quit")) return false;
    if (cmd_is(line, "/help")) {
        if (c->lead) help();
    } else if (cmd_is(line, "/clear")) {
        nstf_conv_clear(conv);
        note(c, "(conversation cleared)");
    } else if (cmd_is(line, "/system")) {
        arg = arg_of(line, 7);
        if (nstf_conv_set_system(conv, arg) != NSTF_OK) cli_lib_err();
        else note(c, arg ? "(new system message; conversation cleared)" : "(default system message; conversation cleared)");
    } else if (cmd_is(line, "/save") || cmd_is(line, "/load")) {
        const bool save = line[1] == 's';
        if (!(arg = arg_of(line, 5))) {
            cli_err("%s needs a file name", save ? "/save" : "/load");
        } else if (save && !c->lead) {
            /* the file is rank 0's to write */
        } else if ((save ? nstf_conv_save(conv, arg) : nstf_conv_load(conv, arg)) != NSTF_OK) {
            cli_lib_err();
        } else {
            char msg[600];
            snprintf(msg, sizeof msg, "(%d messages %s %s)", nstf_conv_n_messages(conv), save ? "saved to" : "loaded from",
                     arg);
            note(c, msg);
        }
    } else if (c->lead) {
        cli_err("unknown command '%s' (/help lists them)", line);
    }
    return true;
}

static int turn(chat_state *c, nstf_conv *conv, const run_opts *o, const char *text) {
    nstf_gen_params gp = o->gp;
    gp.interrupt = c->launched ? NULL : (const volatile int *)&cli_sigint;
    nstf_gen_stats gs;
    nstf_status st = nstf_conv_turn(conv, text, &gp, on_piece, NULL, &gs);
    fputc('\n', stdout);
    fflush(stdout);
    if (st != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    if (gs.stop == NSTF_STOP_INTERRUPTED && c->tty) fprintf(stderr, "(stopped)\n");
    if (gs.stop == NSTF_STOP_CONTEXT_FULL)
        cli_err("the context is full (%lld tokens): /clear, or start again with a larger -c or --context-shift",
                (long long)gs.n_past);
    if (o->sp.verbose) run_print_speed(&gs);
    return 0;
}

int chat_loop(nstf_session *s, const run_opts *o) {
    chat_state c = {.launched = nstf_proc_active()};
    c.lead = !c.launched || nstf_proc_rank() == 0;
    c.tty = c.lead && isatty(STDIN_FILENO) != 0;
    nstf_conv *conv = NULL;
    if (nstf_conv_open(s, o->system, &o->smp, &conv) != NSTF_OK) {
        cli_lib_err();
        return 1;
    }
    if (c.tty) {
        rl_readline_name = "nstf";
        fprintf(stderr, "nstf %s: /help for commands; Ctrl-C stops an answer, Ctrl-D quits\n", cli_cmd);
    }
    int rc = 0;
    if (o->prompt) {
        if (c.tty) printf("> %s\n", o->prompt);
        rc = turn(&c, conv, o, o->prompt);
    }
    while (!c.quit) {
        bool interrupted = false;
        char *line = c.lead ? read_turn(&c, &interrupted) : NULL;
        if (c.launched && cli_launch_share(&line, CLI_LAUNCH_WAIT_MS)) {
            free(line);
            rc = 1;
            break;
        }
        if (!line) {
            if (c.tty) fputc('\n', stdout);
            if (interrupted) rc = 130;
            break;
        }
        /* a Ctrl-C that stopped the last answer is forgotten once a new line
         * is in: until then, another one quits (from the handler) */
        cli_sigint = 0;
        if (line[0] == '/') {
            if (!command(&c, conv, line)) c.quit = true;
        } else if (*line) {
            rc = turn(&c, conv, o, line) ? 1 : rc;
        }
        free(line);
    }
    nstf_conv_close(conv);
    return rc;
}
