/* test_mpi.c — nstf launched by mpirun, one process per rank
 * (dist/proc.h, libnstf_mpi), on CPU ranks, against the same ranks driven
 * by one process, on tiny random models (`nstf gen-model --shape tiny`).
 * Training (`nstf train`, one data-parallel rank per process, against
 * --dp N on the threads of one process):
 *  1. mpirun -np 2 against --dp 2, with --zero 0 and --zero 1 (20 steps,
 *     --clip 0.5 so clipping happens): every step's loss and gradient norm
 *     as logged, the final checkpoint and the exported GGUF, all byte for
 *     byte (the launch sums in rank order, as the threads do); only rank 0
 *     writes the log and the model;
 *  2. mpirun -np 3 --zero 1 against --dp 3 (123200 parameters: slots of
 *     41088, the last rank's share 41024): the checkpoint byte for byte
 *     (the moments gathered from three processes' slots);
 *  3. checkpoints cross the launch modes: a launch stopped at step 10
 *     resumed by --dp 2 (one process) to step 20, and the other way, both
 *     byte-identical to the uninterrupted --dp 2 run's checkpoint;
 *  4. from scratch (--shape tiny): rank 0 writes the initial model, the
 *     others wait for it; the checkpoint equals --dp 2's;
 *  5. refusals: --dp 3 in a launch of 2 (exit 1, the message says why);
 *  6. failures end the launch, never hang: a rank stalled before its 5th
 *     collective (NSTF_DP_STALL_AT=5, --dp-timeout 500) makes rank 0 exit
 *     within 10 s naming rank 1 as stalled; a rank killed (SIGKILL) mid-run
 *     ends the launch with mpirun naming the rank and the signal.
 * Tensor-parallel inference (`nstf run`, `nstf bench`, one rank per
 * process, against --tp N in one process):
 *  7. mpirun -np 2 nstf run against --tp 2, sampled (--temp 0.8, -s 7) on
 *     a Q8_0 model and greedy on an F32 one: the same text, byte for byte
 *     (the logits shares gathered between the processes are the threads'
 *     bits); with the clock's seed (-s -1) every process still samples
 *     the same tokens (rank 0's seed), so the run completes and reports
 *     once;
 *  8. bench under a launch prints its table once (rank 0); perplexity
 *     under a launch prints what --tp 2 prints, byte for byte;
 *  9. stdin, which reaches rank 0 only: a prompt on stdin under a launch
 *     gives --tp 2 -p's text; a conversation of four turns on stdin (a
 *     continued line, /system, /save, /load, an unknown command) gives
 *     --tp 2's answers and saved file byte for byte, each note once;
 * 10. refusals: --tp 3 in a launch of 2 (run and serve); a rank stalled before
 *     its 3rd collective (NSTF_TP_STALL_AT=3, --tp-timeout 500) ends the
 *     launch within 10 s naming rank 1.
 * Skips (77) where mpirun or libnstf_mpi.so (a build without MPI) is
 * missing. */
#define _GNU_SOURCE
#include <math.h>
#include <stdbool.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "cli_run.h"

#define NP_MAX 3

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static int count_file_lines(const char *path) {
    long n;
    char *s = (char *)cli_file(path, &n);
    const int k = s ? count_lines(s) : 0;
    free(s);
    return k;
}

static char g_mpirun[512];

static bool find_mpirun(void) {
    const char *path = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(buf, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        snprintf(g_mpirun, sizeof g_mpirun, "%s/mpirun", d);
        if (access(g_mpirun, X_OK) == 0) return true;
    }
    return false;
}

/* The processes whose parent is pid, into out[cap] (ascending pids). */
static int children_of(pid_t pid, pid_t *out, int cap) {
    int k = 0;
    FILE *p = popen("ps -e -o pid= -o ppid=", "r");
    long a, b;
    while (p && k < cap && fscanf(p, "%ld %ld", &a, &b) == 2)
        if (b == (long)pid) out[k++] = (pid_t)a;
    if (p) pclose(p);
    for (int i = 1; i < k; i++) /* (ps lists in pid order already; kept sure) */
        for (int j = i; j > 0 && out[j] < out[j - 1]; j--) {
            const pid_t t = out[j];
            out[j] = out[j - 1], out[j - 1] = t;
        }
    return k;
}

/* mpirun -np np nstf args..., env (may be NULL) added to the launch's
 * environment; stdout in g_out, stderr (mpirun's and every rank's) in
 * g_err. With kill_after
 * > 0: once the log file `watch` holds that many lines, the launch's
 * highest-pid rank process is killed with SIGKILL (*killed its pid). The
 * exit status; *secs the time it took. */
static int mpi_run(int np, const char *env, const char *const *args, const char *watch, int kill_after,
                   pid_t *killed, double *secs) {
    char err_path[300], out_path[300], nps[8];
    snprintf(err_path, sizeof err_path, "%s/stderr", g_dir);
    snprintf(out_path, sizeof out_path, "%s/stdout", g_dir);
    snprintf(nps, sizeof nps, "%d", np);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (out >= 0) dup2(out, 1);
        int in = open(g_stdin ? g_stdin : "/dev/null", O_RDONLY); /* rank 0's stdin (mpirun forwards it) */
        if (in >= 0) dup2(in, 0);
        if (env) putenv((char *)env);
        /* the ranks' leak reports would be Open MPI's (sanitizer builds) */
        putenv((char *)"ASAN_OPTIONS=detect_leaks=0");
        char *argv[80];
        int n = 0;
        argv[n++] = g_mpirun;
        argv[n++] = (char *)"--oversubscribe";
        argv[n++] = (char *)"--allow-run-as-root";
        argv[n++] = (char *)"--bind-to"; /* (Open MPI binds each of 2 ranks to one core by default) */
        argv[n++] = (char *)"none";
        argv[n++] = (char *)"-np";
        argv[n++] = nps;
        argv[n++] = (char *)NSTF_BIN;
        for (int i = 0; args[i] && n < 79; i++) argv[n++] = (char *)args[i];
        argv[n] = NULL;
        execv(g_mpirun, argv);
        _exit(127);
    }
    int status = 0;
    bool done_kill = kill_after <= 0;
    for (;;) {
        if (waitpid(pid, &status, WNOHANG) == pid) break;
        if (!done_kill && count_file_lines(watch) >= kill_after) {
            pid_t kids[16];
            const int nk = children_of(pid, kids, 16);
            if (nk == np) {
                *killed = kids[nk - 1];
                kill(kids[nk - 1], SIGKILL);
                done_kill = true;
            }
        }
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    long n;
    char *e = (char *)cli_file(err_path, &n);
    snprintf(g_err, sizeof g_err, "%s", e ? e : "");
    free(e);
    e = (char *)cli_file(out_path, &n);
    snprintf(g_out, sizeof g_out, "%s", e ? e : "");
    free(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void) {
    char lib[300];
    snprintf(lib, sizeof lib, "%s/libnstf_mpi.so", NSTF_BUILD_DIR);
    if (!find_mpirun() || access(lib, R_OK) != 0) {
        printf("test_mpi: %s; skipped\n",
               access(lib, R_OK) != 0 ? "this build has no libnstf_mpi.so (no MPI)" : "no mpirun on PATH");
        return 77;
    }
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_mpi_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char tiny[300], text[300];
    path_in(tiny, sizeof tiny, "tiny.gguf");
    path_in(text, sizeof text, "text.txt");
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f32", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    cli_write_words(text);
    double secs = 0;
    pid_t killed = 0;
#define ARGS(...)                                                                                                     \
    ((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "-q", "--data", text, "--batch", "1",   \
                           "--seq", "32", "--lr", "3e-3", "--clip", "0.5", __VA_ARGS__, NULL})

    /* 1. mpirun -np 2 == --dp 2, both update modes */
    for (int z = 0; z < 2; z++) {
        const char *zs = z ? "1" : "0";
        char lt[300], lm[300], ct[300], cm[300], ot[300], om[300], ft[340], fm[340];
        char bt[4096], bm[4096];
        int clip_t = 0, clip_m = 0;
        snprintf(lt, sizeof lt, "%s/t%d.jsonl", g_dir, z);
        snprintf(lm, sizeof lm, "%s/m%d.jsonl", g_dir, z);
        snprintf(ct, sizeof ct, "%s/ckt%d", g_dir, z);
        snprintf(cm, sizeof cm, "%s/ckm%d", g_dir, z);
        snprintf(ot, sizeof ot, "%s/t%d.gguf", g_dir, z);
        snprintf(om, sizeof om, "%s/m%d.gguf", g_dir, z);
        snprintf(ft, sizeof ft, "%s/checkpoint.nstf", ct);
        snprintf(fm, sizeof fm, "%s/checkpoint.nstf", cm);
        rc = run(ARGS("--dp", "2", "--zero", zs, "--steps", "20", "--log", lt, "--ckpt-dir", ct, "--out", ot));
        CHECK(rc == 0, "--dp 2 --zero %s: exit %d: %s", zs, rc, g_err);
        rc = mpi_run(2, NULL, ARGS("--zero", zs, "--steps", "20", "--log", lm, "--ckpt-dir", cm, "--out", om), NULL, 0,
                     &killed, &secs);
        CHECK(rc == 0, "mpirun -np 2 --zero %s: exit %d: %s", zs, rc, g_err);
        const int nt = cli_loss_norms(lt, 0.5, bt, sizeof bt, &clip_t), nm = cli_loss_norms(lm, 0.5, bm, sizeof bm, &clip_m);
        const bool logs = nt == 20 && nm == 20 && !strcmp(bt, bm);
        const bool ck = cli_same_file(ft, fm), gg = cli_same_file(ot, om);
        printf("  mpirun -np 2 vs --dp 2, --zero %s, 20 steps (%.1f s, %d clipped): losses and norms %s, checkpoints "
               "%s, GGUFs %s\n", zs, secs, clip_m, logs ? "equal" : "DIFFER", ck ? "byte-identical" : "DIFFER",
               gg ? "byte-identical" : "DIFFER");
        CHECK(logs && ck && gg, "--zero %s: %d / %d logged steps, logs %s, checkpoints %s, GGUFs %s", zs, nt, nm,
              logs ? "equal" : "differ", ck ? "equal" : "differ", gg ? "equal" : "differ");
    }

    /* 2. three processes, uneven slots */
    {
        char ct[300], cm[300], ft[340], fm[340];
        path_in(ct, sizeof ct, "ck3t");
        path_in(cm, sizeof cm, "ck3m");
        snprintf(ft, sizeof ft, "%s/checkpoint.nstf", ct);
        snprintf(fm, sizeof fm, "%s/checkpoint.nstf", cm);
        rc = run(ARGS("--dp", "3", "--zero", "1", "--steps", "8", "--ckpt-dir", ct));
        CHECK(rc == 0, "--dp 3: exit %d: %s", rc, g_err);
        rc = mpi_run(3, NULL, ARGS("--zero", "1", "--steps", "8", "--ckpt-dir", cm), NULL, 0, &killed, &secs);
        CHECK(rc == 0, "mpirun -np 3: exit %d: %s", rc, g_err);
        const bool ck = cli_same_file(ft, fm);
        printf("  mpirun -np 3 vs --dp 3, --zero 1, 8 steps (%.1f s): checkpoints %s\n", secs,
               ck ? "byte-identical" : "DIFFER");
        CHECK(ck, "three processes' checkpoint differs from --dp 3's");
    }

    /* 3. resume across the launch modes */
    {
        char ref[340], a[300], b[300], fa[340], fb[340];
        snprintf(ref, sizeof ref, "%s/ckt1/checkpoint.nstf", g_dir); /* --dp 2 --zero 1, 20 steps */
        path_in(a, sizeof a, "ckA");
        path_in(b, sizeof b, "ckB");
        snprintf(fa, sizeof fa, "%s/checkpoint.nstf", a);
        snprintf(fb, sizeof fb, "%s/checkpoint.nstf", b);
        rc = mpi_run(2, NULL, ARGS("--zero", "1", "--steps", "20", "--stop-at", "10", "--ckpt-dir", a), NULL, 0,
                     &killed, &secs);
        CHECK(rc == 0, "mpirun to step 10: exit %d: %s", rc, g_err);
        rc = run(ARGS("--dp", "2", "--zero", "1", "--steps", "20", "--resume", a));
        CHECK(rc == 0, "--dp 2 resuming the launch's checkpoint: exit %d: %s", rc, g_err);
        rc = run(ARGS("--dp", "2", "--zero", "1", "--steps", "20", "--stop-at", "10", "--ckpt-dir", b));
        CHECK(rc == 0, "--dp 2 to step 10: exit %d: %s", rc, g_err);
        rc = mpi_run(2, NULL, ARGS("--zero", "1", "--steps", "20", "--resume", b), NULL, 0, &killed, &secs);
        CHECK(rc == 0, "mpirun resuming --dp 2's checkpoint: exit %d: %s", rc, g_err);
        const bool sa = cli_same_file(fa, ref), sb = cli_same_file(fb, ref);
        printf("  10 steps + resume + 10: launch -> one process %s, one process -> launch %s (against 20 steps of "
               "--dp 2)\n", sa ? "byte-identical" : "DIFFERS", sb ? "byte-identical" : "DIFFERS");
        CHECK(sa && sb, "resumed checkpoints: launch -> process %s, process -> launch %s", sa ? "equal" : "differ",
              sb ? "equal" : "differ");
    }

    /* 4. from scratch: rank 0 writes the initial model */
    {
        char a[300], b[300], fa[340], fb[340];
        path_in(a, sizeof a, "shT");
        path_in(b, sizeof b, "shM");
        snprintf(fa, sizeof fa, "%s/checkpoint.nstf", a);
        snprintf(fb, sizeof fb, "%s/checkpoint.nstf", b);
        const char *const targs[] = {"train", "--shape", "tiny", "--device", "cpu", "-t", "2", "-q", "--data", text,
                                     "--batch", "1", "--seq", "32", "--steps", "3", "--dp", "2", "--ckpt-dir", a, NULL};
        rc = run(targs);
        CHECK(rc == 0, "--shape tiny --dp 2: exit %d: %s", rc, g_err);
        const char *const margs[] = {"train", "--shape", "tiny", "--device", "cpu", "-t", "2", "-q", "--data", text,
                                     "--batch", "1", "--seq", "32", "--steps", "3", "--ckpt-dir", b, NULL};
        rc = mpi_run(2, NULL, margs, NULL, 0, &killed, &secs);
        CHECK(rc == 0, "mpirun --shape tiny: exit %d: %s", rc, g_err);
        const bool same = cli_same_file(fa, fb);
        printf("  --shape tiny under mpirun -np 2 vs --dp 2: checkpoints %s\n", same ? "byte-identical" : "DIFFER");
        CHECK(same, "from scratch under mpirun: the checkpoint differs");
    }

    /* 5. refusals */
    rc = mpi_run(2, NULL, ARGS("--dp", "3", "--steps", "2"), NULL, 0, &killed, &secs);
    CHECK(rc != 0 && strstr(g_err, "--dp 3: mpirun launched 2 processes"), "--dp 3 in a launch of 2: exit %d: %s", rc,
          g_err);

    /* 6. a stalled rank, a killed rank */
    rc = mpi_run(2, "NSTF_DP_STALL_AT=5", ARGS("--steps", "50", "--dp-timeout", "500"), NULL, 0, &killed, &secs);
    {
        const char *line = strstr(g_err, "nstf: ");
        printf("  rank 1 stalled before its 5th collective: exit %d after %.1f s: %.*s\n", rc, secs,
               line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    }
    CHECK(rc != 0 && secs < 10 && strstr(g_err, "rank 1 stalled"), "a stalled rank: exit %d after %.1f s: %s", rc,
          secs, g_err);
    {
        char log[300];
        path_in(log, sizeof log, "kill.jsonl");
        killed = 0;
        rc = mpi_run(2, NULL, ARGS("--steps", "100000", "--log", log), log, 5, &killed, &secs);
        /* (the highest pid is rank 1 unless the pids wrapped: mpirun names whichever died) */
        const char *who = strstr(g_err, "process rank ");
        /* mpirun's report, or rank 0's own when its collective noticed first */
        const bool named = (who && strstr(g_err, "signal 9")) || strstr(g_err, "rank 1 stalled");
        printf("  a rank (pid %ld, the launch's last) killed after %d logged steps: the launch exited %d after %.1f s%s%.*s\n",
               (long)killed, count_file_lines(log), rc, secs, named ? ", mpirun: " : "", named ? 14 : 0,
               named ? who : "");
        CHECK(killed > 0 && rc != 0 && named && count_file_lines(log) < 100000,
              "a killed rank: pid %ld, exit %d after %.1f s: %s", (long)killed, rc, secs, g_err);
    }

    /* 7. tensor-parallel generation */
    {
        char q8[300];
        path_in(q8, sizeof q8, "tq8.gguf");
        rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", q8, NULL});
        CHECK(rc == 0, "gen-model q8_0: %s", g_err);
        static const char *const modes[2][4] = {{"--temp", "0.8", "-s", "7"}, {"--temp", "0", "-s", "1"}};
        for (int k = 0; k < 2; k++) {
            const char *model = k ? tiny : q8;
            const char *const one[] = {"run", "-m", model, "--device", "cpu", "-t", "2", "--tp", "2", "-p",
                                       "the quick brown", "-n", "40", modes[k][0], modes[k][1], modes[k][2],
                                       modes[k][3], NULL};
            rc = run(one);
            CHECK(rc == 0, "run --tp 2: exit %d: %s", rc, g_err);
            static char want[sizeof g_out];
            snprintf(want, sizeof want, "%s", g_out);
            const char *const launched[] = {"run", "-m", model, "--device", "cpu", "-t", "2", "-p", "the quick brown",
                                            "-n", "40", modes[k][0], modes[k][1], modes[k][2], modes[k][3], NULL};
            rc = mpi_run(2, NULL, launched, NULL, 0, &killed, &secs);
            const bool same = rc == 0 && !strcmp(want, g_out) && strlen(want) > 0;
            printf("  mpirun -np 2 nstf run vs --tp 2, %s %s model, 40 tokens (%.1f s): text %s (%zu bytes)\n",
                   k ? "greedy," : "--temp 0.8 -s 7,", k ? "F32" : "Q8_0", secs, same ? "byte-identical" : "DIFFERS",
                   strlen(want));
            CHECK(same, "run under mpirun: exit %d, %zu vs %zu bytes: %s", rc, strlen(g_out), strlen(want), g_err);
        }
        const char *const clock_seed[] = {"run", "-m", q8, "--device", "cpu", "-t", "2", "-p", "the quick brown", "-n",
                                          "40", "--temp", "0.8", NULL};
        rc = mpi_run(2, NULL, clock_seed, NULL, 0, &killed, &secs);
        /* (the clock's seed may sample an end-of-generation token early: any length) */
        const char *gen = strstr(g_err, "nstf run: prompt ");
        CHECK(rc == 0 && gen && strstr(gen, " tokens/s)\n") && !strstr(gen + 1, "nstf run: prompt "),
              "run under mpirun with the clock's seed: exit %d: %s", rc, g_err);
        /* 8. bench: one table */
        const char *const bench[] = {"bench", "-m", q8, "--device", "cpu", "-t", "2", "-p", "16", "-n", "8", "-r", "2",
                                     NULL};
        rc = mpi_run(2, NULL, bench, NULL, 0, &killed, &secs);
        int rows = 0;
        for (const char *p = g_out; (p = strstr(p, "tg8")); p++) rows++;
        printf("  nstf bench under mpirun -np 2: exit %d, %d tg8 row(s) (%.1f s)\n", rc, rows, secs);
        CHECK(rc == 0 && rows == 1, "bench under mpirun: exit %d, %d tg8 rows: %s", rc, rows, g_err);
        /* perplexity: the same figures */
        const char *const ppl_one[] = {"perplexity", "-m", q8, "-f", text, "-c", "64", "--chunks", "4", "--device",
                                       "cpu", "-t", "1", "--tp", "2", NULL};
        rc = run(ppl_one);
        CHECK(rc == 0 && strstr(g_out, "Final estimate"), "perplexity --tp 2: exit %d: %s", rc, g_err);
        static char want_ppl[sizeof g_out];
        snprintf(want_ppl, sizeof want_ppl, "%s", g_out);
        const char *const ppl_mpi[] = {"perplexity", "-m", q8, "-f", text, "-c", "64", "--chunks", "4", "--device",
                                       "cpu", "-t", "1", NULL};
        rc = mpi_run(2, NULL, ppl_mpi, NULL, 0, &killed, &secs);
        const char *fin = strstr(g_out, "Final estimate");
        printf("  nstf perplexity under mpirun -np 2 vs --tp 2: exit %d, %s (%.*s)\n", rc,
               rc == 0 && !strcmp(g_out, want_ppl) ? "the same output" : "DIFFERENT output",
               fin ? (int)strcspn(fin, "\n") : 0, fin ? fin : "");
        CHECK(rc == 0 && !strcmp(g_out, want_ppl), "perplexity under mpirun: exit %d: %s / %s: %s", rc, g_out, want_ppl,
              g_err);
        /* 10. refusals, a stalled rank */
        const char *const tp3[] = {"run", "-m", q8, "--device", "cpu", "--tp", "3", "-p", "x", "-n", "2", NULL};
        rc = mpi_run(2, NULL, tp3, NULL, 0, &killed, &secs);
        CHECK(rc != 0 && strstr(g_err, "--tp 3: mpirun launched 2 processes"), "--tp 3 in a launch of 2: exit %d: %s",
              rc, g_err);
        /* stdin reaches rank 0 only: it reads and shares the prompt */
        char in_path[300];
        path_in(in_path, sizeof in_path, "prompt.txt");
        FILE *pf = fopen(in_path, "wb");
        CHECK(pf && fputs("the quick brown", pf) >= 0 && fclose(pf) == 0, "cannot write %s", in_path);
        const char *const by_arg[] = {"run", "-m", q8, "--device", "cpu", "-t", "2", "--tp", "2", "-p",
                                      "the quick brown", "-n", "30", "--temp", "0.8", "-s", "5", NULL};
        rc = run(by_arg);
        static char want_in[sizeof g_out];
        snprintf(want_in, sizeof want_in, "%s", g_out);
        const char *const by_stdin[] = {"run", "-m", q8, "--device", "cpu", "-t", "2", "-n", "30", "--temp", "0.8",
                                        "-s", "5", NULL};
        g_stdin = in_path;
        rc = mpi_run(2, NULL, by_stdin, NULL, 0, &killed, &secs);
        g_stdin = NULL;
        printf("  mpirun -np 2 nstf run, the prompt on stdin, vs --tp 2 -p: %s (%.1f s)\n",
               rc == 0 && !strcmp(g_out, want_in) && *want_in ? "byte-identical" : "DIFFERS", secs);
        CHECK(rc == 0 && !strcmp(g_out, want_in) && *want_in, "a prompt on stdin under mpirun: exit %d: %s", rc, g_err);
        /* a conversation: rank 0 reads each turn and shares it; every rank
         * runs it (commands included); rank 0 alone prints and saves. On
         * SmolLM2 (the random models' answers are random bytes, which a
         * conversation cannot take back as text) */
        const char *smol = NSTF_SOURCE_DIR "/models/SmolLM2-135M-Instruct.Q4_1.gguf";
        if (access(smol, R_OK) != 0) printf("  (%s not fetched: the conversation under mpirun skipped)\n", smol);
        char chat_path[300], saved_one[300], saved_mpi[300];
        path_in(chat_path, sizeof chat_path, "turns.txt");
        path_in(saved_one, sizeof saved_one, "conv_one.json");
        path_in(saved_mpi, sizeof saved_mpi, "conv_mpi.json");
        for (int k = 0; k < 2 && access(smol, R_OK) == 0; k++) {
            FILE *cf = fopen(chat_path, "wb");
            CHECK(cf && fprintf(cf, "hello there\n/system You are terse.\nwhat is two\\\nplus two\n/save %s\n"
                                    "and three\n/load %s\none more\n/nonsense\n",
                                k ? saved_mpi : saved_one, k ? saved_mpi : saved_one) > 0 && fclose(cf) == 0,
                  "cannot write %s", chat_path);
            const char *const one[] = {"chat", "-m", smol, "--device", "cpu", "-t", "1", "--tp", "2", "-n", "12",
                                       "--temp", "0.7", "-s", "3", NULL};
            const char *const launched[] = {"chat", "-m", smol, "--device", "cpu", "-t", "1", "-n", "12", "--temp",
                                            "0.7", "-s", "3", NULL};
            g_stdin = chat_path;
            rc = k ? mpi_run(2, NULL, launched, NULL, 0, &killed, &secs) : run(one);
            g_stdin = NULL;
            CHECK(rc == 0, "chat%s: exit %d: %s", k ? " under mpirun" : " --tp 2", rc, g_err);
            if (!k) {
                snprintf(want_in, sizeof want_in, "%s", g_out);
                continue;
            }
            const char *note = strstr(g_err, "(new system message");
            const bool once = note && !strstr(note + 1, "(new system message") && strstr(g_err, "unknown command") &&
                              !strstr(strstr(g_err, "unknown command") + 1, "unknown command");
            const bool same = !strcmp(g_out, want_in) && count_lines(g_out) == 4;
            printf("  mpirun -np 2 nstf chat, SmolLM2 (4 turns and 4 commands on stdin) vs --tp 2: answers %s, "
                   "saved conversation %s, notes %s (%.1f s)\n", same ? "byte-identical" : "DIFFER",
                   cli_same_file(saved_one, saved_mpi) ? "byte-identical" : "DIFFERS", once ? "once" : "NOT ONCE", secs);
            CHECK(same && cli_same_file(saved_one, saved_mpi) && once, "chat under mpirun: %s / %s: %s", g_out, want_in,
                  g_err);
        }
        /* (nstf serve under a launch: tests/serve/test_serve.py) */
        const char *const serve[] = {"serve", "-m", q8, "--device", "cpu", "--port", "0", "--tp", "3", NULL};
        rc = mpi_run(2, NULL, serve, NULL, 0, &killed, &secs);
        CHECK(rc != 0 && strstr(g_err, "--tp 3: mpirun launched 2 processes"), "serve --tp 3 in a launch of 2: exit %d: %s",
              rc, g_err);
        const char *const stall[] = {"run", "-m", q8, "--device", "cpu", "-t", "2", "-p", "the quick brown", "-n",
                                     "40", "--tp-timeout", "500", NULL};
        rc = mpi_run(2, "NSTF_TP_STALL_AT=3", stall, NULL, 0, &killed, &secs);
        {
            const char *line = strstr(g_err, "nstf run: ");
            printf("  tensor-parallel rank 1 stalled before its 3rd collective: exit %d after %.1f s: %.*s\n", rc, secs,
                   line ? (int)strcspn(line, "\n") : 0, line ? line : "");
        }
        CHECK(rc != 0 && secs < 10 && strstr(g_err, "rank 1 stalled"), "a stalled tensor-parallel rank: exit %d after "
              "%.1f s: %s", rc, secs, g_err);
    }

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (!g_fails && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_mpi");
}
