/* test_cli.c — the nstf CLI as a user runs it: bad input gives exactly one
 * clear line on stderr and a non-zero exit, good input works. Runs the
 * built binary with posix_spawn (no shell quoting), on files it makes:
 * a tiny random model from `nstf gen-model`, truncated and foreign files. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/gguf.h"
#include "test_util.h"

#include "cli_run.h"

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nstf_test_cli_XXXXXX");
    if (!mkdtemp(g_dir)) { perror("mkdtemp"); return 1; }
    char tiny[300], trunc[300], arch[300], text[300];
    path_in(tiny, sizeof tiny, "tiny.gguf");
    path_in(trunc, sizeof trunc, "trunc.gguf");
    path_in(arch, sizeof arch, "gpt2arch.gguf");
    path_in(text, sizeof text, "text.txt");

    /* a tiny random model through the CLI itself */
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", tiny, NULL});
    CHECK(rc == 0, "gen-model failed: %s", g_err);

    /* truncated copy, a text file, and a model of another architecture */
    FILE *f = fopen(tiny, "rb"), *g = fopen(trunc, "wb");
    char buf[4096];
    size_t k = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (g) { fwrite(buf, 1, k / 2, g); fclose(g); }
    if (f) fclose(f);
    g = fopen(text, "wb");
    if (g) { fputs("this is not a model\n", g); fclose(g); }
    nstf_gguf_writer *w;
    if (nstf_gguf_writer_create(&w) == NSTF_OK) {
        nstf_gguf_writer_set_str(w, "general.architecture", "gpt2");
        float v[32] = {0};
        int64_t ne[1] = {32};
        nstf_gguf_writer_add_tensor(w, "token_embd.weight", NSTF_TYPE_F32, 1, ne, v);
        CHECK(nstf_gguf_writer_write(w, arch, 0) == NSTF_OK, "write %s", nstf_last_error());
        nstf_gguf_writer_free(w);
    }

    /* good input works */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "8", "--temp", "0", "-t", "2", NULL});
    CHECK(rc == 0, "run on the tiny model: exit %d: %s", rc, g_err);
    CHECK(strstr(g_err, "tokens/s") != NULL, "speed line missing: %s", g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "--chat", "-p", "hi", "-n", "4", "--seed", "3", "--stream", NULL});
    CHECK(rc == 0, "chat run: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"inspect", tiny, NULL});
    CHECK(rc == 0 && strstr(g_out, "blk.1.ffn_down.weight"), "inspect: exit %d", rc);
    const char *helps[][3] = {{"--help", NULL}, {"run", "--help"}, {"inspect", "--help"}, {"gen-model", "--help"}};
    for (size_t i = 0; i < 4; i++) {
        rc = run((const char *const[]){helps[i][0], helps[i][1], NULL});
        CHECK(rc == 0 && strstr(g_out, "usage"), "%s %s: exit %d", helps[i][0], helps[i][1] ? helps[i][1] : "", rc);
    }

    /* bad files */
    /* nstf quantize: the tiny Q8_0 model is already quantized */
    {
        char q[300];
        path_in(q, sizeof q, "tiny_q4km.gguf");
        expect_error("requantize refused", "--allow-requantize",
                     (const char *const[]){"quantize", tiny, q, "Q4_K_M", NULL});
        expect_error("unknown quantize type", "unknown type 'Q9_K'",
                     (const char *const[]){"quantize", tiny, q, "Q9_K", NULL});
        rc = run((const char *const[]){"quantize", tiny, q, "Q4_K_M", "--allow-requantize", "-t", "2", NULL});
        CHECK(rc == 0, "quantize --allow-requantize failed: %s", g_err);
        rc = run((const char *const[]){"run", "-m", q, "-p", "hi", "-n", "4", NULL});
        CHECK(rc == 0, "the quantized model does not run: %s", g_err);
    }
    expect_error("missing file", "No such file", (const char *const[]){"run", "-m", "/nonexistent/model.gguf", "-p", "x", NULL});
    expect_error("directory", "directory", (const char *const[]){"run", "-m", g_dir, "-p", "x", NULL});
    expect_error("not a GGUF", "magic", (const char *const[]){"run", "-m", text, "-p", "x", NULL});
    expect_error("truncated", trunc, (const char *const[]){"run", "-m", trunc, "-p", "x", NULL});
    expect_error("unsupported tensor type", "IQ2_XXS",
                 (const char *const[]){"run", "-m", NSTF_SOURCE_DIR "/tests/data/hostile/unknown_tensor_type_iq2_xxs.gguf", "-p", "x", NULL});
    expect_error("other architecture", "architecture 'gpt2' is not supported",
                 (const char *const[]){"run", "-m", arch, "-p", "x", NULL});
    expect_error("inspect missing", "No such file", (const char *const[]){"inspect", "/nonexistent.gguf", NULL});

    /* bad arguments */
    expect_error("-n 0", "-n 0 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "0", NULL});
    expect_error("-n -5", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "-5", NULL});
    expect_error("-n abc", "expects an integer", (const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "abc", NULL});
    expect_error("-c 0", "-c 0 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-c", "0", NULL});
    expect_error("-c -1", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-c", "-1", NULL});
    expect_error("-t 0", "-t 0 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-t", "0", NULL});
    expect_error("-t -2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-t", "-2", NULL});
    expect_error("--top-p 2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "--top-p", "2", NULL});
    expect_error("--temp nan", "expects a number", (const char *const[]){"run", "-m", tiny, "-p", "x", "--temp", "nan", NULL});
    expect_error("no value", "needs a value", (const char *const[]){"run", "-m", tiny, "-p", NULL});
    expect_error("unknown flag", "unknown option", (const char *const[]){"run", "--frobnicate", NULL});
    expect_error("no model", "no model", (const char *const[]){"run", "-p", "x", NULL});
    expect_error("no prompt", "no prompt", (const char *const[]){"run", "-m", tiny, NULL});
    expect_error("unknown command", "unknown command", (const char *const[]){"frobnicate", NULL});
    expect_error("bad device", "unknown device", (const char *const[]){"run", "-m", tiny, "-p", "x", "--device", "tpu", NULL});

    /* bad prompts */
    char long_prompt[4096];
    memset(long_prompt, 'a', sizeof long_prompt - 1);
    for (size_t i = 0; i < sizeof long_prompt - 1; i += 2) long_prompt[i] = ' ';
    long_prompt[sizeof long_prompt - 1] = 0;
    expect_error("prompt longer than the context", "the context holds 64", (const char *const[]){"run", "-m", tiny, "-p", long_prompt, "-c", "64", NULL});
    expect_error("invalid UTF-8", "UTF-8", (const char *const[]){"run", "-m", tiny, "-p", "ok \xff\xfe bad", NULL});

    /* clean up */
    const char *files[] = {"tiny.gguf", "trunc.gguf", "gpt2arch.gguf", "text.txt", "stdout", "stderr"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[300];
        path_in(p, sizeof p, files[i]);
        unlink(p);
    }
    rmdir(g_dir);
    return test_finish("test_cli");
}
