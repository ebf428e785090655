/* test_chat.c — `nstf chat` as people use it: in a terminal (a
 * pseudo-terminal driven from here with forkpty) and from a pipe; Ctrl-C
 * in `nstf run`; the progress bar of gen-model on a terminal.
 *
 * Terminal (the real model, greedy): the prompt comes, a question is
 * answered ("Paris"), the up arrow brings the line back (libedit history),
 * /save writes the conversation, /system and /clear answer, unknown
 * commands are refused. With a model that never stops (a tiny random
 * model, --ignore-eos): Ctrl-C during an answer prints "(stopped)" and
 * gives the prompt back, Ctrl-C at the prompt quits (status 130, as any
 * interrupted run), and so does a second Ctrl-C after a stop. `nstf run` interrupted by Ctrl-C
 * prints its speed line and exits 130.
 * Random answers (the tiny model's byte tokens): later turns and a
 * /save + /load round trip still work.
 * Pipe: one turn per line until end of input, each answer on its own
 * line, nothing else on stdout; the second turn evaluates only its new
 * tokens (fewer prompt tokens than the first turn's system message and
 * question). The real-model parts exit 77 (skip) when the model has not
 * been fetched; the tiny-model parts still run first. Timeouts are
 * generous (a shared CI machine) and only bound a hang. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "test_util.h"

#include "cli_run.h"

#define MODEL NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
#define TIMEOUT 120.0

typedef struct {
    pid_t pid;
    int fd;
    char buf[1 << 18];
    size_t len, mark; /* expect() searches from mark */
    int status;       /* after pty_wait */
} pty_proc;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static bool pty_spawn(pty_proc *p, const char *const *args) {
    char *argv[48];
    int n = 0;
    argv[n++] = (char *)NSTF_BIN;
    for (; args[n - 1] && n < 47; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    p->len = p->mark = 0;
    p->pid = forkpty(&p->fd, NULL, NULL, &ws);
    if (p->pid < 0) return false;
    if (p->pid == 0) {
        setenv("TERM", "xterm", 1);
        execv(NSTF_BIN, argv);
        _exit(127);
    }
    return true;
}

/* Read what is there within `wait` seconds; false at end of output. */
static bool pty_read(pty_proc *p, double wait) {
    struct pollfd pf = {p->fd, POLLIN, 0};
    if (poll(&pf, 1, (int)(wait * 1000)) <= 0) return true;
    if (p->len + 1 >= sizeof p->buf) p->len = p->mark = 0; /* keep going: old output is not needed */
    ssize_t k = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
    if (k <= 0) return false;
    p->len += (size_t)k;
    p->buf[p->len] = 0;
    return true;
}

/* Wait for `want` in the output after the mark; the mark moves past it. */
static bool expect(pty_proc *p, const char *want, double timeout) {
    const double t0 = now_s();
    for (;;) {
        char *hit = memmem(p->buf + p->mark, p->len - p->mark, want, strlen(want));
        if (hit) {
            p->mark = (size_t)(hit - p->buf) + strlen(want);
            return true;
        }
        if (now_s() - t0 > timeout || !pty_read(p, 0.2)) {
            fprintf(stderr, "expected '%s'; got after the mark:\n%s\n", want, p->buf + p->mark);
            return false;
        }
    }
}

/* Wait until at least n more bytes arrived after the mark. */
static bool expect_bytes(pty_proc *p, size_t n, double timeout) {
    const double t0 = now_s();
    while (p->len < p->mark + n)
        if (now_s() - t0 > timeout || !pty_read(p, 0.2)) return false;
    p->mark = p->len;
    return true;
}

static void send_keys(pty_proc *p, const char *s) {
    ssize_t w = write(p->fd, s, strlen(s));
    (void)w;
}

/* The exit status (-signal if killed), reading output until it is gone. */
static int pty_wait(pty_proc *p, double timeout) {
    const double t0 = now_s();
    int st = 0;
    for (;;) {
        pid_t r = waitpid(p->pid, &st, WNOHANG);
        if (r == p->pid) break;
        if (now_s() - t0 > timeout) {
            fprintf(stderr, "pid %d still running after %.0f s; its output after the mark:\n%s\n", (int)p->pid, timeout,
                    p->buf + p->mark);
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &st, 0);
            break;
        }
        pty_read(p, 0.1);
    }
    close(p->fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

/* Ctrl-C with a model that never stops answering. */
static void interrupts(const char *tiny) {
    static pty_proc p;
    const char *chat[] = {"chat", "-m", tiny, "-n", "-1", "--ignore-eos", "--context-shift", "-c", "64", "-t", "2", NULL};
    CHECK(pty_spawn(&p, chat), "forkpty: %s", strerror(errno));
    CHECK(expect(&p, "/help for commands", TIMEOUT) && expect(&p, "> ", TIMEOUT), "no prompt");
    send_keys(&p, "tell me\r");
    CHECK(expect(&p, "tell me\r\n", TIMEOUT) && expect_bytes(&p, 64, TIMEOUT), "no answer streamed");
    send_keys(&p, "\x03");
    CHECK(expect(&p, "(stopped)", TIMEOUT) && expect(&p, "> ", TIMEOUT), "Ctrl-C did not stop the answer");
    send_keys(&p, "\x03"); /* at the prompt: quit */
    int rc = pty_wait(&p, TIMEOUT);
    CHECK(rc == 130, "Ctrl-C at the prompt: exit %d, want 130", rc);
    printf("chat: Ctrl-C stops an answer and returns to the prompt; at the prompt it quits\n");

    CHECK(pty_spawn(&p, chat), "forkpty: %s", strerror(errno));
    CHECK(expect(&p, "> ", TIMEOUT), "no prompt");
    send_keys(&p, "again\r");
    CHECK(expect(&p, "again\r\n", TIMEOUT) && expect_bytes(&p, 64, TIMEOUT), "no answer streamed");
    /* a second press after a stop quits at once (from the signal handler,
     * with the terminal restored by libedit); two presses closer than the
     * process is scheduled are one signal, so the test waits for the stop */
    send_keys(&p, "\x03");
    CHECK(expect(&p, "(stopped)", TIMEOUT), "Ctrl-C did not stop the answer");
    send_keys(&p, "\x03");
    rc = pty_wait(&p, TIMEOUT);
    CHECK(rc == 130, "a second Ctrl-C: exit %d, want 130", rc);

    /* nstf run: Ctrl-C prints the speed line of what was done */
    const char *run_args[] = {"run", "-m", tiny, "-p", "hello", "-n", "-1", "--ignore-eos", "--context-shift", "-c", "64",
                              NULL};
    CHECK(pty_spawn(&p, run_args), "forkpty: %s", strerror(errno));
    CHECK(expect_bytes(&p, 64, TIMEOUT), "run printed nothing");
    send_keys(&p, "\x03");
    CHECK(expect(&p, "tokens/s)", TIMEOUT), "no speed line after Ctrl-C");
    rc = pty_wait(&p, TIMEOUT);
    CHECK(rc == 130, "run stopped by Ctrl-C: exit %d, want 130", rc);
    printf("run: Ctrl-C prints the speed line and exits 130\n");
}

/* A random model's answers are random tokens: byte tokens that never form
 * a character, pieces cut inside one. The conversation keeps them as text
 * it can take back (U+FFFD for such bytes): every later turn encodes, and
 * /save writes a file /load reads. */
static void byte_answers(const char *tiny) {
    char in[300], saved[300];
    snprintf(in, sizeof in, "%s/turns_tiny.txt", g_dir);
    snprintf(saved, sizeof saved, "%s/conv_tiny.json", g_dir);
    FILE *f = fopen(in, "wb");
    if (f) {
        fprintf(f, "hello there\nwhat next\n/save %s\n/load %s\nand then\n", saved, saved);
        fclose(f);
    }
    g_stdin = in;
    int rc = run((const char *const[]){"chat", "-m", tiny, "-n", "16", "--temp", "1", "-s", "3", "--ignore-eos", "-t",
                                       "2", NULL});
    g_stdin = NULL;
    long n = 0;
    unsigned char *json = cli_file(saved, &n);
    const bool replaced = json && strstr((const char *)json, "\xEF\xBF\xBD");
    CHECK(rc == 0 && count_lines(g_out) == 3 && strstr(g_err, "(4 messages loaded from"),
          "random answers: exit %d, %d answers: %s", rc, count_lines(g_out), g_err);
    CHECK(replaced, "the saved conversation holds no U+FFFD: the random answers formed text (seed changed?)");
    printf("chat with a random model: 3 turns of random tokens, /save and /load: exit %d%s\n", rc,
           replaced ? " (U+FFFD in the saved answers)" : "");
    free(json);
    unlink(in);
    unlink(saved);
}

/* gen-model draws a progress bar with rate and ETA on a terminal. */
static void progress(void) {
    static pty_proc p;
    char out[300];
    snprintf(out, sizeof out, "%s/bar.gguf", g_dir);
    const char *args[] = {"gen-model", "--shape", "smollm2-135m", "--type", "q8_0", "-o", out, NULL};
    CHECK(pty_spawn(&p, args), "forkpty: %s", strerror(errno));
    CHECK(expect(&p, "drawing weights [", TIMEOUT) && expect(&p, "ETA", TIMEOUT) && expect(&p, "writing", TIMEOUT),
          "no progress bar on a terminal");
    int rc = pty_wait(&p, TIMEOUT);
    CHECK(rc == 0, "gen-model on a terminal: exit %d", rc);
    unlink(out);
}

/* The real model in a terminal: an answer, history, commands. */
static void terminal(void) {
    static pty_proc p;
    char saved[300];
    snprintf(saved, sizeof saved, "%s/conv.json", g_dir);
    const char *args[] = {"chat", "-m", MODEL, "--temp", "0", "-n", "24", "-c", "512", "-t", "2", NULL};
    CHECK(pty_spawn(&p, args), "forkpty: %s", strerror(errno));
    CHECK(expect(&p, "> ", TIMEOUT), "no prompt");
    send_keys(&p, "What is the capital of France?\r");
    CHECK(expect(&p, "Paris", TIMEOUT) && expect(&p, "\r\n> ", TIMEOUT), "no answer with Paris");
    send_keys(&p, "\x1b[A"); /* up: the last line comes back for editing */
    CHECK(expect(&p, "What is the capital of France?", TIMEOUT), "the up arrow did not recall the line");
    send_keys(&p, "\x15"); /* Ctrl-U: erase it */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "/save %s\r", saved);
    send_keys(&p, cmd);
    CHECK(expect(&p, "(2 messages saved to", TIMEOUT), "/save did not answer");
    send_keys(&p, "/frob\r");
    CHECK(expect(&p, "nstf chat: unknown command '/frob'", TIMEOUT), "unknown command not refused");
    send_keys(&p, "/system You answer in one word.\r");
    CHECK(expect(&p, "(new system message; conversation cleared)", TIMEOUT), "/system did not answer");
    send_keys(&p, "/clear\r");
    CHECK(expect(&p, "(conversation cleared)", TIMEOUT), "/clear did not answer");
    send_keys(&p, "/exit\r");
    int rc = pty_wait(&p, TIMEOUT);
    CHECK(rc == 0, "/exit: exit %d", rc);
    FILE *f = fopen(saved, "rb");
    char buf[4096] = {0};
    size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    CHECK(k > 0 && strstr(buf, "\"What is the capital of France?\"") && strstr(buf, "Paris"),
          "the saved conversation lacks the turn: %s", buf);
    unlink(saved);
    printf("chat in a terminal: answer, history, /save, /system, /clear, /exit\n");
}

/* The real model from a pipe: one turn per line, answers only on stdout,
 * the history kept in the cache. */
static void pipe_turns(void) {
    char in[300];
    snprintf(in, sizeof in, "%s/turns.txt", g_dir);
    FILE *f = fopen(in, "wb");
    if (f) {
        fputs("What is the capital of France?\nAnd of Germany?\n", f);
        fclose(f);
    }
    g_stdin = in;
    int rc = run((const char *const[]){"chat", "-m", MODEL, "--temp", "0", "-n", "24", "-c", "512", "-t", "2", "-v", NULL});
    g_stdin = NULL;
    unlink(in);
    CHECK(rc == 0, "chat from a pipe: exit %d: %s", rc, g_err);
    CHECK(count_lines(g_out) == 2, "want two answer lines, got:\n%s", g_out);
    char *second = strchr(g_out, '\n');
    CHECK(strstr(g_out, "Paris") && second && strstr(second, "Berlin"), "answers:\n%s", g_out);
    /* prompt token counts of the two turns, from the -v speed lines */
    long n1 = -1, n2 = -1;
    const char *p = strstr(g_err, "nstf chat: prompt ");
    if (p) n1 = strtol(p + 18, NULL, 10);
    if (p && (p = strstr(p + 1, "nstf chat: prompt "))) n2 = strtol(p + 18, NULL, 10);
    CHECK(n1 > 0 && n2 > 0 && n2 < n1 / 2, "the second turn evaluated %ld tokens (the first %ld): not only its new ones",
          n2, n1);
    printf("chat from a pipe: '%.*s' ... ; turn 1 evaluated %ld tokens, turn 2 %ld\n",
           (int)(second ? second - g_out : 0), g_out, n1, n2);
    /* item 1 of the CLI: right by default */
    rc = run((const char *const[]){"run", "-m", MODEL, "--chat", "-p", "What is the capital of France?", "-n", "16",
                                   "--temp", "0", "-t", "2", NULL});
    CHECK(rc == 0 && !strncmp(g_out, "The capital of France is Paris.", 31), "run --chat: '%s'", g_out);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_chat_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char tiny[300];
    snprintf(tiny, sizeof tiny, "%s/tiny.gguf", g_dir);
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    interrupts(tiny);
    byte_answers(tiny);
    progress();
    unlink(tiny);
    const bool have_model = access(MODEL, R_OK) == 0;
    if (have_model) {
        terminal();
        pipe_turns();
    }
    char p[300];
    snprintf(p, sizeof p, "%s/stdout", g_dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/stderr", g_dir);
    unlink(p);
    rmdir(g_dir);
    if (!have_model && !g_fails) {
        printf("test_chat: %s not fetched (make model); the terminal and pipe turns were skipped\n", MODEL);
        return TEST_SKIP;
    }
    return test_finish("test_chat");
}
