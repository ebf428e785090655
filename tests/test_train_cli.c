/* test_train_cli.c — `nstf train` and `nstf tokenize` as a user runs them,
 * on the CPU, on a tiny random model (`nstf gen-model --shape tiny`, its
 * byte-level tokenizer) and small texts made here. Checks:
 *  - overfitting one sequence drives the loss below 0.1 (the JSONL log's
 *    last loss);
 *  - N steps equal N/2 steps + --resume + N/2 steps bit for bit: the two
 *    runs' final checkpoints (weights, both moments, step, data position)
 *    and exported models are byte-identical (the CPU backend is
 *    deterministic);
 *  - a run killed (SIGKILL) while it writes a checkpoint leaves the
 *    previous checkpoint byte-identical and resumable; so does a full disk
 *    (a file-size limit: the write fails with EFBIG), with a one-line error;
 *  - token shards from `nstf tokenize` train like the text they came from;
 *    LoRA trains (the loss falls), exports a merged model that `nstf run`
 *    generates from, and its adapters as a llama.cpp adapter GGUF;
 *  - without a terminal, a plain line (step, loss, tokens/s, ETA) at the
 *    first step, every --print-every steps (10 by default) and the last,
 *    also in a resumed run, and no progress bar's carriage returns or
 *    escape sequences;
 *  - data parallel on two CPU ranks (--dp 2 --batch 1, one thread each)
 *    against one rank with the same sequences per step (--batch 2): every
 *    one of 50 steps' losses within 1e-5 relative (the gradients are summed
 *    in another order: rank by rank, not token by token); and a --dp 2 run
 *    stopped at step 25 resumes with --dp 1 to the same last loss (1e-5);
 *    a stalled rank (NSTF_DP_STALL_AT=5, --dp-timeout 500) fails the run
 *    within 10 s, naming rank 1 (these --dp runs take --zero's CPU
 *    default, ZeRO-1);
 *  - ZeRO-1 (--zero 1) against the replicated update (--zero 0), 6
 *    sequences a step, --clip 0.5 (below every logged norm: the clipping
 *    acts each step, so the norm from the ranks' partial sums decides the
 *    update): at --dp 2 and at --dp 3 (123200 parameters, not a multiple
 *    of 3: slots of 41088, the last rank's share 41024, and slot
 *    boundaries inside tensors), 50 steps each: every step's loss and
 *    gradient norm equal as logged and the final checkpoints (weights and
 *    both moments, gathered from the ranks' slots) byte-identical;
 *    --dp 3's last loss within 1e-5 of --dp 2's (other sums over ranks).
 *    Checkpoints cross rank counts and modes: a --dp 2 --zero 1 run
 *    stopped at step 25 resumes with --dp 2 --zero 0 to the uninterrupted
 *    --zero 0 run's checkpoint byte for byte, and with --dp 1 and with
 *    --dp 3 --zero 1 to its last loss within 1e-5; the other way, --dp 2
 *    --zero 0 resumes with --zero 1 byte for byte, --dp 3 --zero 1 and
 *    --dp 1 resume with --dp 2 --zero 1 within 1e-5. --zero 1 with --dp 1
 *    changes nothing (checkpoints byte-identical); --plan at --dp 2 shows
 *    one rank's optimizer slot, half the replicated optimizer;
 *  - from scratch with --shape; the memory plan (--plan) and a run that
 *    does not fit refused with the numbers;
 *  - bad input, each one clear line and a non-zero exit: an empty or too
 *    short data file, shards of another vocabulary, a NaN learning rate, a
 *    NaN/Inf loss mid-run (the step and the tensor named, the last
 *    checkpoint kept), a --resume folder of another model or shape (or
 *    data order: another --seed), an unknown recompute mode, a GPU asked
 *    of a CPU build. */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/resource.h>
#include <time.h>

#include "io/gguf.h"
#include "io/tokshard.h"
#include "test_util.h"

#include "cli_run.h"

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* The steps of the "step N/M ..." lines of stderr (g_err), as "1 3 6 7";
 * false when a step line lacks its loss, tokens/s or ETA, or stderr holds a
 * terminal's carriage return or escape sequence. */
static bool step_lines(char *buf, size_t cap) {
    size_t k = 0;
    buf[0] = 0;
    bool ok = !strchr(g_err, '\r') && !strchr(g_err, '\x1b');
    for (const char *p = g_err; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        long long step, last;
        if (sscanf(p, "step %lld/%lld", &step, &last) != 2) continue;
        const char *end = strchr(p, '\n');
        const size_t n = end ? (size_t)(end - p) : strlen(p);
        char line[256];
        snprintf(line, sizeof line, "%.*s", (int)(n < 255 ? n : 255), p);
        ok = ok && strstr(line, " loss ") && strstr(line, " tok/s") && strstr(line, " eta ");
        k += (size_t)snprintf(buf + k, k < cap ? cap - k : 0, "%s%lld", k ? " " : "", step);
    }
    return ok;
}

/* The "loss" of the last JSON line of a log (NAN if none). */
static double last_loss(const char *log) {
    long n;
    char *s = (char *)cli_file(log, &n);
    double v = NAN;
    if (!s) return v;
    for (char *p = s; (p = strstr(p, "\"loss\": ")); p++) v = strtod(p + 8, NULL);
    free(s);
    return v;
}

/* Every step's loss of a JSONL log into out[cap]; the count. */
static int losses(const char *log, double *out, int cap) {
    long n;
    char *s = (char *)cli_file(log, &n);
    int k = 0;
    if (!s) return 0;
    for (char *p = s; k < cap && (p = strstr(p, "\"loss\": ")); p++) out[k++] = strtod(p + 8, NULL);
    free(s);
    return k;
}

/* --dp dp --batch batch with --zero 0 and with --zero 1, 50 steps, --clip
 * 0.5: every step's loss and norm equal as logged, the clipping active in
 * every step, the final checkpoints byte-identical (kzDP0, kzDP1). With
 * ref >= 0, the last loss within 1e-5 of ref. Returns the last loss. */
static double zero_pair(const char *tiny, const char *text, const char *dp, const char *batch, double ref) {
    static char t[2][8192];
    char ck[2][340], log[2][300], name[32];
    int n[2], clipped[2];
    for (int z = 0; z < 2; z++) {
        snprintf(name, sizeof name, "kz%s%d", dp, z);
        path_in(ck[z], sizeof ck[z], name);
        snprintf(name, sizeof name, "z%s%d.jsonl", dp, z);
        path_in(log[z], sizeof log[z], name);
        const int rc = run((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "-q", "--data", text,
                                                 "--seq", "32", "--steps", "50", "--lr", "3e-3", "--clip", "0.5",
                                                 "--batch", batch, "--dp", dp, "--zero", z ? "1" : "0", "--log",
                                                 log[z], "--ckpt-dir", ck[z], NULL});
        CHECK(rc == 0, "--dp %s --zero %d: exit %d: %s", dp, z, rc, g_err);
        n[z] = cli_loss_norms(log[z], 0.5, t[z], sizeof t[z], &clipped[z]);
        strcat(ck[z], "/checkpoint.nstf");
    }
    const bool same = cli_same_file(ck[0], ck[1]), logs = !strcmp(t[0], t[1]);
    const double last = last_loss(log[1]), d = ref >= 0 ? fabs(last - ref) / fmax(1.0, fabs(ref)) : 0;
    printf("  --dp %s --zero 1 vs --zero 0, %d steps (norm above --clip 0.5 in %d): losses and norms %s, final "
           "checkpoints %s", dp, n[1], clipped[1], logs ? "equal" : "DIFFER", same ? "byte-identical" : "DIFFER");
    if (ref >= 0) printf("; last loss %.6f vs %.6f (%.2e relative, <= 1e-5)", last, ref, d);
    printf("\n");
    CHECK(n[0] == 50 && n[1] == 50 && logs && same && clipped[0] == 50 && clipped[1] == 50 && d <= 1e-5,
          "ZeRO-1 at --dp %s: %d / %d steps, %d clipped, logs %s, checkpoints %s, last loss %.6f", dp, n[0], n[1],
          clipped[1], logs ? "equal" : "differ", same ? "equal" : "differ", last);
    return last;
}

static double first_loss(const char *log) {
    long n;
    char *s = (char *)cli_file(log, &n);
    double v = NAN;
    if (!s) return v;
    char *p = strstr(s, "\"loss\": ");
    if (p) v = strtod(p + 8, NULL);
    free(s);
    return v;
}

/* Run nstf with args in a child whose environment adds env (may be NULL)
 * and whose file size is limited to fsize bytes (0: none; SIGXFSZ ignored,
 * so a write past it fails with EFBIG); when kill_on names a file, the
 * child is killed with SIGKILL as soon as that file exists. Returns the
 * exit status, -SIGKILL when killed, -1 on other deaths; stderr in g_err. */
static int run_child(const char *const *args, const char *env, rlim_t fsize, const char *kill_on) {
    char err_path[300];
    snprintf(err_path, sizeof err_path, "%s/stderr", g_dir);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) dup2(fd, 2);
        int nul = open("/dev/null", O_WRONLY);
        if (nul >= 0) dup2(nul, 1);
        if (env) putenv((char *)env);
        if (fsize) {
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {fsize, fsize};
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        char *argv[64];
        int n = 0;
        argv[n++] = (char *)NSTF_BIN;
        for (; args[n - 1] && n < 63; n++) argv[n] = (char *)args[n - 1];
        argv[n] = NULL;
        execv(NSTF_BIN, argv);
        _exit(127);
    }
    int status = 0;
    bool killed = false;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) break;
        if (kill_on && !killed && access(kill_on, F_OK) == 0) {
            kill(pid, SIGKILL);
            killed = true;
        }
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    long n;
    char *e = (char *)cli_file(err_path, &n);
    snprintf(g_err, sizeof g_err, "%s", e ? e : "");
    free(e);
    if (WIFSIGNALED(status)) return WTERMSIG(status) == SIGKILL ? -SIGKILL : -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_train_XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    char tiny[300], tiny2[300], text[300], one[300], empty[300], shortt[300], log[300], shards[300], badshard[300];
    path_in(tiny, sizeof tiny, "tiny.gguf");
    path_in(tiny2, sizeof tiny2, "tiny2.gguf");
    path_in(text, sizeof text, "text.txt");
    path_in(one, sizeof one, "one.txt");
    path_in(empty, sizeof empty, "empty.txt");
    path_in(shortt, sizeof shortt, "short.txt");
    path_in(log, sizeof log, "log.jsonl");
    path_in(shards, sizeof shards, "shards");
    path_in(badshard, sizeof badshard, "bad.tok");
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f32", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "f32", "--seed", "2", "-o", tiny2, NULL});
    CHECK(rc == 0, "gen-model: %s", g_err);
    cli_write_words(text);
    write_text(one, "the wise owls watch the old oak tree......"); /* 42 bytes + EOS: one window of 32 */
    write_text(empty, "");
    write_text(shortt, "too short");
#define TRAIN(...) ((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "-q", __VA_ARGS__, NULL})

    /* overfitting one sequence */
    rc = run(TRAIN("--data", one, "--batch", "1", "--seq", "32", "--steps", "150", "--lr", "1e-2", "--warmup", "0",
                   "--min-lr", "1e-2", "--wd", "0", "--log", log));
    double l0 = first_loss(log), l1 = last_loss(log);
    CHECK(rc == 0 && l1 < 0.1, "overfitting one sequence: exit %d, loss %.4f -> %.4f (want < 0.1): %s", rc, l0, l1, g_err);
    printf("  overfit one sequence: loss %.4f -> %.4f in 150 steps\n", l0, l1);

    /* N steps == N/2 + resume + N/2, bitwise */
    char ca[300], cb[300], fa[340], fb[340], oa[300], ob[300];
    path_in(ca, sizeof ca, "ckA");
    path_in(cb, sizeof cb, "ckB");
    path_in(oa, sizeof oa, "outA.gguf");
    path_in(ob, sizeof ob, "outB.gguf");
    snprintf(fa, sizeof fa, "%s/checkpoint.nstf", ca);
    snprintf(fb, sizeof fb, "%s/checkpoint.nstf", cb);
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "8", "--lr", "3e-3", "--ckpt-dir", ca,
                   "--out", oa));
    CHECK(rc == 0, "8 steps: exit %d: %s", rc, g_err);
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "8", "--lr", "3e-3", "--ckpt-dir", cb,
                   "--stop-at", "4"));
    CHECK(rc == 0, "4 of 8 steps: exit %d: %s", rc, g_err);
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "8", "--lr", "3e-3", "--resume", cb,
                   "--out", ob));
    CHECK(rc == 0, "resume, 4 more: exit %d: %s", rc, g_err);
    CHECK(cli_same_file(fa, fb), "8 steps and 4 + resume + 4 left different checkpoints");
    CHECK(cli_same_file(oa, ob), "8 steps and 4 + resume + 4 exported different models");
    printf("  8 steps == 4 + resume + 4: checkpoints and exports byte-identical\n");

    /* data parallel: --dp 2 --batch 1 against --dp 1 --batch 2 (the same sequences each step) */
    {
        char g1[300], g2[300], g3[300], ck[300];
        path_in(g1, sizeof g1, "dp1.jsonl");
        path_in(g2, sizeof g2, "dp2.jsonl");
        path_in(g3, sizeof g3, "dp2to1.jsonl");
        path_in(ck, sizeof ck, "ckDP");
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "50", "--lr", "3e-3", "--log", g1));
        CHECK(rc == 0, "--dp 1: exit %d: %s", rc, g_err);
        rc = run(TRAIN("--data", text, "--batch", "1", "--dp", "2", "--seq", "32", "--steps", "50", "--lr", "3e-3",
                       "--log", g2));
        CHECK(rc == 0, "--dp 2: exit %d: %s", rc, g_err);
        double a[64], b[64], worst = 0;
        const int na = losses(g1, a, 64), nb = losses(g2, b, 64);
        for (int i = 0; i < na && i < nb; i++) worst = fmax(worst, fabs(a[i] - b[i]) / fmax(1.0, fabs(a[i])));
        printf("  --dp 2 --batch 1 vs --dp 1 --batch 2, %d steps: largest loss difference %.2e relative (<= 1e-5); "
               "loss %.4f -> %.4f\n", na, worst, na ? a[0] : NAN, na ? a[na - 1] : NAN);
        CHECK(na == 50 && nb == 50 && worst <= 1e-5, "data-parallel losses differ: %d / %d steps, %.3e", na, nb, worst);
        rc = run(TRAIN("--data", text, "--batch", "1", "--dp", "2", "--seq", "32", "--steps", "50", "--lr", "3e-3",
                       "--ckpt-dir", ck, "--stop-at", "25"));
        CHECK(rc == 0, "--dp 2 to step 25: exit %d: %s", rc, g_err);
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "50", "--lr", "3e-3", "--resume", ck,
                       "--log", g3));
        const double lr3 = last_loss(g3), d3 = fabs(lr3 - a[49]) / fmax(1.0, fabs(a[49]));
        printf("  --dp 2 stopped at 25, resumed with --dp 1: last loss %.6f vs %.6f (%.2e relative, <= 1e-5)\n", lr3,
               a[49], d3);
        CHECK(rc == 0 && d3 <= 1e-5, "resume --dp 2 -> --dp 1: exit %d, last loss %.6f vs %.6f: %s", rc, lr3, a[49],
              g_err);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = run_child(TRAIN("--data", text, "--batch", "1", "--dp", "2", "--seq", "32", "--steps", "50", "--dp-timeout",
                             "500"),
                       "NSTF_DP_STALL_AT=5", 0, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        const double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        printf("  --dp 2 with rank 1 stalled before its 5th collective: exit %d after %.1f s: %s", rc, dt, g_err);
        CHECK(rc != 0 && dt < 10 && strstr(g_err, "rank 1") && strstr(g_err, "stalled"),
              "a stalled data-parallel rank: exit %d after %.1f s: %s", rc, dt, g_err);
    }

    /* ZeRO-1 against the replicated update, checkpoints across rank counts and modes */
    {
#define ZTRAIN(...) TRAIN("--data", text, "--seq", "32", "--steps", "50", "--lr", "3e-3", "--clip", "0.5", __VA_ARGS__)
        /* --dp 3: 123200 parameters, slots of 41088, the last rank's share 41024 */
        const double last2 = zero_pair(tiny, text, "2", "3", -1);
        (void)zero_pair(tiny, text, "3", "2", last2);
        char f1[340], f2[340];
        /* resume across rank counts and modes: from --dp 2 --zero 1 at step 25 ... */
        static const struct {
            const char *from_dp, *from_batch, *from_zero, *to_dp, *to_batch, *to_zero;
            const char *same_as; /* the uninterrupted run's checkpoint it must equal, or NULL: last loss within 1e-5 */
        } rs[] = {
            {"2", "3", "1", "2", "3", "0", "kz20"}, {"2", "3", "1", "1", "6", "0", NULL},
            {"2", "3", "1", "3", "2", "1", NULL},   {"2", "3", "0", "2", "3", "1", "kz21"},
            {"3", "2", "1", "2", "3", "1", NULL},   {"1", "6", "0", "2", "3", "1", NULL},
        };
        for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
            char kr[300], lr[300], ref[340];
            snprintf(kr, sizeof kr, "%s/kzr%zu", g_dir, i);
            path_in(lr, sizeof lr, "zr.jsonl");
            unlink(lr);
            rc = run(ZTRAIN("--batch", rs[i].from_batch, "--dp", rs[i].from_dp, "--zero", rs[i].from_zero,
                            "--ckpt-dir", kr, "--stop-at", "25"));
            CHECK(rc == 0, "to step 25: exit %d: %s", rc, g_err);
            rc = run(ZTRAIN("--batch", rs[i].to_batch, "--dp", rs[i].to_dp, "--zero", rs[i].to_zero, "--resume", kr,
                            "--ckpt-dir", kr, "--log", lr));
            const double lz = last_loss(lr), d = fabs(lz - last2) / fmax(1.0, fabs(last2));
            snprintf(f1, sizeof f1, "%s/checkpoint.nstf", kr);
            if (rs[i].same_as) snprintf(ref, sizeof ref, "%s/%s/checkpoint.nstf", g_dir, rs[i].same_as);
            const bool same = rs[i].same_as && cli_same_file(f1, ref);
            printf("  --dp %s --zero %s stopped at 25, resumed with --dp %s --zero %s: ", rs[i].from_dp,
                   rs[i].from_zero, rs[i].to_dp, rs[i].to_zero);
            if (rs[i].same_as) printf("final checkpoint %s the uninterrupted run's\n", same ? "byte-identical to" : "DIFFERS from");
            else printf("last loss %.6f vs %.6f (%.2e relative, <= 1e-5)\n", lz, last2, d);
            CHECK(rc == 0 && (rs[i].same_as ? same : d <= 1e-5), "resume --dp %s --zero %s -> --dp %s --zero %s: exit %d, "
                  "last loss %.6f vs %.6f: %s", rs[i].from_dp, rs[i].from_zero, rs[i].to_dp, rs[i].to_zero, rc, lz,
                  last2, g_err);
        }
        /* --zero 1 with one rank: the one-rank step */
        char kd0[300], kd1[300];
        path_in(kd0, sizeof kd0, "kzd0"), path_in(kd1, sizeof kd1, "kzd1");
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--ckpt-dir", kd0));
        CHECK(rc == 0, "--dp 1: exit %d: %s", rc, g_err);
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--zero", "1", "--ckpt-dir", kd1));
        snprintf(f1, sizeof f1, "%s/checkpoint.nstf", kd0);
        snprintf(f2, sizeof f2, "%s/checkpoint.nstf", kd1);
        CHECK(rc == 0 && cli_same_file(f1, f2), "--zero 1 --dp 1: exit %d, checkpoints %s: %s", rc,
              cli_same_file(f1, f2) ? "equal" : "differ", g_err);
        /* the plan: one rank's optimizer slot */
        double o0 = -1, o1 = -1;
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--dp", "2", "--zero", "0", "--plan"));
        const char *ol = strstr(g_out, "\n  optimizer");
        if (ol) sscanf(ol, " optimizer %lf", &o0);
        rc |= run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--dp", "2", "--zero", "1", "--plan"));
        ol = strstr(g_out, "\n  optimizer");
        if (ol) sscanf(ol, " optimizer %lf", &o1);
        printf("  --plan --dp 2: optimizer %.1f MiB per rank with --zero 1, %.1f with --zero 0\n", o1, o0);
        CHECK(rc == 0 && o0 > 0 && o1 > 0 && fabs(o1 - o0 / 2) <= 0.1 && strstr(g_out, "ZeRO-1") && strstr(g_out, "1/2"),
              "--plan --dp 2 --zero 1: optimizer %.1f MiB against %.1f: %s", o1, o0, g_out);
#undef ZTRAIN
    }

    /* without a terminal: a plain line at the first step, every --print-every steps (10 by default) and the
     * last; no progress bar */
    {
        char steps[128];
        rc = run((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "--data", text, "--batch",
                                       "2", "--seq", "32", "--steps", "7", "--print-every", "3", NULL});
        bool ok = step_lines(steps, sizeof steps);
        CHECK(rc == 0 && ok && !strcmp(steps, "1 3 6 7") && strstr(g_err, "nstf train: "),
              "--print-every 3 of 7 steps: exit %d, step lines \"%s\" (want \"1 3 6 7\"): %s", rc, steps, g_err);
        char cp[300];
        path_in(cp, sizeof cp, "ckP");
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "8", "--ckpt-dir", cp, "--stop-at", "4"));
        CHECK(rc == 0, "4 of 8 steps: exit %d: %s", rc, g_err);
        rc = run((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "--data", text, "--batch",
                                       "2", "--seq", "32", "--steps", "8", "--resume", cp, NULL});
        ok = step_lines(steps, sizeof steps);
        CHECK(rc == 0 && ok && !strcmp(steps, "5 8"), "resumed at 4 of 8: step lines \"%s\" (want \"5 8\"): %s",
              steps, g_err);
        rc = run((const char *const[]){"train", "-m", tiny, "--device", "cpu", "-t", "2", "--data", text, "--batch",
                                       "2", "--seq", "32", "--steps", "21", "--lr", "3e-3", NULL});
        ok = step_lines(steps, sizeof steps);
        CHECK(rc == 0 && ok && !strcmp(steps, "1 10 20 21"), "21 steps: step lines \"%s\" (want \"1 10 20 21\"): %s",
              steps, g_err);
        printf("  without a terminal: step lines %s of 21 (every 10), no progress bar\n", steps);
        /* --profile: one table of the second step, whose op times add up to at most the step */
        rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "3", "--profile"));
        double ops_ms = -1, step_ms = -1;
        const char *pl = strstr(g_err, "profile of step 2: ");
        const bool parsed = pl && sscanf(pl, "profile of step 2: %lf ms in ops (the step took %lf ms)", &ops_ms,
                                         &step_ms) == 2;
        CHECK(rc == 0 && parsed && ops_ms > 0 && ops_ms <= step_ms * 1.01 && strstr(g_err, "matmul_bwd_w") &&
                  strstr(g_err, "adamw") && !strstr(g_err, "profile of step 3"),
              "--profile: exit %d, ops %.3f ms of a %.3f ms step: %s", rc, ops_ms, step_ms, g_err);
        printf("  --profile: %.2f ms in ops of a %.2f ms step\n", ops_ms, step_ms);
    }

    /* SIGKILL while a checkpoint is written: the previous one survives */
    char cc[300], fc[340], tmpc[340], saved[300];
    path_in(cc, sizeof cc, "ckC");
    snprintf(fc, sizeof fc, "%s/checkpoint.nstf", cc);
    snprintf(tmpc, sizeof tmpc, "%s/checkpoint.nstf.tmp", cc);
    path_in(saved, sizeof saved, "saved.nstf");
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--ckpt-dir", cc, "--stop-at", "1"));
    CHECK(rc == 0, "1 step: exit %d: %s", rc, g_err);
    {
        long n;
        unsigned char *b = cli_file(fc, &n);
        FILE *f = fopen(saved, "wb");
        if (f && b) fwrite(b, 1, (size_t)n, f);
        if (f) fclose(f);
        free(b);
    }
    rc = run_child(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--resume", cc),
                   "NSTF_CKPT_STALL_MS=30000", 0, tmpc);
    CHECK(rc == -SIGKILL, "the run with a stalled checkpoint write: status %d (want SIGKILL): %s", rc, g_err);
    CHECK(cli_same_file(fc, saved), "SIGKILL during a checkpoint write changed the previous checkpoint");
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "2", "--resume", cc));
    CHECK(rc == 0, "resume after the kill: exit %d: %s", rc, g_err);
    printf("  SIGKILL during a checkpoint write: the previous checkpoint intact and resumable\n");

    /* a full disk (a file-size limit) while checkpointing */
    unlink(fc);
    rename(saved, fc);
    {
        long n;
        free(cli_file(fc, &n));
        rc = run_child(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--resume", cc), NULL,
                       (rlim_t)(n / 2), NULL);
    }
    CHECK(rc == 1 && count_lines(g_err) == 1 && strstr(g_err, "not written") && strstr(g_err, "is kept"),
          "full disk: exit %d: %s", rc, g_err);
    CHECK(access(tmpc, F_OK) != 0, "full disk: the temporary file was left behind");
    printf("  full disk during a checkpoint write: %s", g_err);
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "2", "--resume", cc));
    CHECK(rc == 0, "resume after the full disk: exit %d: %s", rc, g_err);

    /* token shards */
    rc = run((const char *const[]){"tokenize", "-m", tiny, text, "-o", shards, NULL});
    CHECK(rc == 0, "tokenize: exit %d: %s", rc, g_err);
    rc = run(TRAIN("--data", shards, "--batch", "2", "--seq", "32", "--steps", "3", "--log", log));
    CHECK(rc == 0, "train on shards: exit %d: %s", rc, g_err);

    /* LoRA: the loss falls, the merged model generates, the adapters export */
    char merged[300], adapters[300];
    path_in(merged, sizeof merged, "merged.gguf");
    path_in(adapters, sizeof adapters, "adapters.gguf");
    unlink(log);
    rc = run(TRAIN("--data", text, "--batch", "4", "--seq", "32", "--steps", "30", "--lr", "1e-2", "--lora", "4",
                   "--log", log, "--out", merged, "--lora-out", adapters));
    l0 = first_loss(log), l1 = last_loss(log);
    /* a random tiny model's frozen embedding (N(0, 0.02)) bounds its logits, so
     * the adapters move the loss by tenths here (test_train_torch checks
     * their gradients against torch) */
    CHECK(rc == 0 && l1 < l0 - 0.2, "LoRA: exit %d, loss %.4f -> %.4f: %s", rc, l0, l1, g_err);
    printf("  LoRA rank 4: loss %.4f -> %.4f in 30 steps\n", l0, l1);
    rc = run((const char *const[]){"run", "-m", merged, "-p", "the wise", "-n", "8", "--temp", "0", "-t", "2", NULL});
    CHECK(rc == 0 && strstr(g_err, "tokens/s"), "run on the merged model: exit %d: %s", rc, g_err);
    nstf_gguf *ad = NULL;
    CHECK(nstf_gguf_open(adapters, &ad) == NSTF_OK, "adapters: %s", nstf_last_error());
    if (ad) {
        const nstf_gguf_tensor *a = nstf_gguf_find_tensor(ad, "blk.1.ffn_down.weight.lora_a"),
                               *b = nstf_gguf_find_tensor(ad, "blk.1.ffn_down.weight.lora_b");
        nstf_gguf_str ty = {0, NULL};
        CHECK(a && b && a->ne[0] == 192 && a->ne[1] == 4 && b->ne[0] == 4 && b->ne[1] == 64 &&
                  nstf_gguf_get_str(ad, "adapter.type", &ty) == NSTF_OK && nstf_gguf_str_eq(ty, "lora"),
              "adapter GGUF: tensors or metadata not as llama.cpp expects");
        nstf_gguf_close(ad);
    }

    /* from scratch */
    char cs[300];
    path_in(cs, sizeof cs, "ckS");
    rc = run((const char *const[]){"train", "--shape", "tiny", "--data", text, "--batch", "2", "--seq", "32", "--steps",
                                   "3", "--ckpt-dir", cs, "--device", "cpu", "-q", NULL});
    CHECK(rc == 0, "--shape tiny: exit %d: %s", rc, g_err);

    /* the memory plan */
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--plan"));
    CHECK(rc == 0 && strstr(g_out, "memory plan") && strstr(g_out, "activations") && strstr(g_out, "fits"),
          "--plan: exit %d: %s%s", rc, g_out, g_err);
    rc = run(TRAIN("--data", text, "--batch", "200000", "--seq", "2048", "--plan"));
    CHECK(rc == 1 && strstr(g_out, "DOES NOT FIT") && strstr(g_err, "does not fit"), "--plan too big: exit %d: %s",
          rc, g_err);
    expect_error("a run that does not fit", "training needs",
                 TRAIN("--data", text, "--batch", "200000", "--seq", "2048"));

    /* bad input */
    {
        int32_t toks[100];
        for (int i = 0; i < 100; i++) toks[i] = i;
        CHECK(nstf_tokshard_write(badshard, toks, 100, 500) == NSTF_OK, "%s", nstf_last_error());
    }
    char cd[300];
    path_in(cd, sizeof cd, "ckD");
    expect_error("empty data", "is empty", TRAIN("--data", empty));
    expect_error("too-short data", "needs at least 65", TRAIN("--data", shortt, "--seq", "64"));
    expect_error("shards of another vocabulary", "vocabulary has 500 tokens but the model's has 384",
                 TRAIN("--data", badshard));
    expect_error("NaN learning rate", "--lr expects a number", TRAIN("--data", text, "--lr", "nan"));
    expect_error("unknown recompute mode", "use none, attn or full", TRAIN("--data", text, "--recompute", "half"));
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "4", "--lr", "1e30", "--ckpt-dir", cd,
                   "--ckpt-every", "1"));
    CHECK(rc == 1 && count_lines(g_err) == 1 && strstr(g_err, "step 2") && strstr(g_err, "not finite") &&
              strstr(g_err, "weight") && strstr(g_err, "last checkpoint (step 1)"),
          "NaN loss mid-run: exit %d: %s", rc, g_err);
    expect_error("resume with another training shape", "another model or training shape",
                 TRAIN("--data", text, "--batch", "2", "--seq", "32", "--lora", "4", "--resume", ca));
    char cl[300];
    path_in(cl, sizeof cl, "ckL");
    rc = run(TRAIN("--data", text, "--batch", "2", "--seq", "32", "--steps", "1", "--lora", "4", "--ckpt-dir", cl));
    CHECK(rc == 0, "LoRA checkpoint: exit %d: %s", rc, g_err);
    expect_error("resume LoRA on another base", "another model",
                 ((const char *const[]){"train", "-m", tiny2, "--device", "cpu", "-q", "--data", text, "--batch", "2",
                                        "--seq", "32", "--lora", "4", "--resume", cl, NULL}));
    expect_error("resume with another seed", "give --seed 1",
                 TRAIN("--data", text, "--batch", "2", "--seq", "32", "--seed", "9", "--resume", ca));
    expect_error("resume from a missing folder", "--resume",
                 TRAIN("--data", text, "--batch", "2", "--seq", "32", "--resume", "/nonexistent/ck"));
#if !defined(NSTF_HAVE_CUDA) && !defined(NSTF_HAVE_HIP)
    expect_error("a GPU of a CPU build", "gpu", TRAIN("--data", text, "--device", "gpu"));
#endif
    expect_error("no model", "give one of -m", ((const char *const[]){"train", "--data", text, NULL}));

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return test_finish("test_train_cli");
}
