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
#include "nstf_tools.h"
#include "test_util.h"

#include "cli_run.h"

static void path_in(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", g_dir, name); }

/* The count N of "generation N tokens" in the speed line, or -1. */
static long generated(void) {
    const char *p = strstr(g_err, "; generation ");
    return p ? strtol(p + 13, NULL, 10) : -1;
}

/* Every bad argument of every command: exit 2 and one line "nstf CMD: ..."
 * (with a hint for a near miss); nstf help CMD is that command's help. */
static void consistency(const char *tiny) {
    static const struct { const char *cmd, *bad, *hint; } k_bad[] = {
        {"run", "--ctx", "did you mean --ctx-size?"},
        {"chat", "--top_k", "did you mean --top-k?"},
        {"bench", "--repetition", "did you mean --repetitions?"},
        {"profile", "--n-promt", "did you mean --n-prompt?"},
        {"gen-model", "--shap", "did you mean --shape?"},
        {"inspect", "--al", "did you mean --all?"},
        {"devices", "--list", NULL},
        {"isa", "--jsn", "did you mean --json?"},
        {"convert", "--outtyp", "did you mean --outtype?"},
        {"quantize", "--allow-requant", "did you mean --allow-requantize?"},
    };
    for (size_t i = 0; i < sizeof k_bad / sizeof k_bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "nstf %s: unknown option '%s'", k_bad[i].cmd, k_bad[i].bad);
        int rc = run((const char *const[]){k_bad[i].cmd, k_bad[i].bad, "x", NULL});
        CHECK(rc == 2, "%s %s: exit %d, want 2", k_bad[i].cmd, k_bad[i].bad, rc);
        CHECK(count_lines(g_err) == 1 && strstr(g_err, want), "%s: want one line '%s': %s", k_bad[i].cmd, want, g_err);
        CHECK(!k_bad[i].hint || strstr(g_err, k_bad[i].hint), "%s: no hint '%s': %s", k_bad[i].cmd,
              k_bad[i].hint ? k_bad[i].hint : "", g_err);
    }
    /* bad values are exit 2 too, with the command's prefix */
    const char *const *bad_values[] = {
        (const char *const[]){"bench", "-m", tiny, "-r", "0", NULL},
        (const char *const[]){"profile", "-m", tiny, "-t", "abc", NULL},
        (const char *const[]){"gen-model", "--shape", "huge", "-o", "x.gguf", NULL},
        (const char *const[]){"chat", "-m", tiny, "-n", "x", NULL},
        (const char *const[]){"run", "-m", tiny, "-p", "x", "--top-p=7", NULL},
        (const char *const[]){"quantize", "a.gguf", "b.gguf", "Q4_0", "--threads=0", NULL},
        (const char *const[]){"convert", "folder", "--type=q4_0", "-o", "x.gguf", NULL},
    };
    for (size_t i = 0; i < sizeof bad_values / sizeof bad_values[0]; i++) {
        int rc = run(bad_values[i]);
        char want[32];
        snprintf(want, sizeof want, "nstf %s: ", bad_values[i][0]);
        CHECK(rc == 2 && count_lines(g_err) == 1 && !strncmp(g_err, want, strlen(want)),
              "%s with a bad value: exit %d (want 2), stderr %s", bad_values[i][0], rc, g_err);
    }
    static const char *const k_help[][2] = {{"run", "usage: nstf run"}, {"chat", "usage: nstf chat"},
                                            {"bench", "usage: nstf bench"}, {"gen-model", "usage: nstf gen-model"},
                                            {"inspect", "usage: nstf inspect"}, {"isa", "usage: nstf isa"},
                                            {"convert", "usage: nstf convert"}, {"quantize", "usage: nstf quantize"},
                                            {"devices", "usage: nstf devices"}};
    for (size_t i = 0; i < sizeof k_help / sizeof k_help[0]; i++) {
        int rc = run((const char *const[]){"help", k_help[i][0], NULL});
        CHECK(rc == 0 && !strncmp(g_out, k_help[i][1], strlen(k_help[i][1])), "nstf help %s: exit %d: %.60s", k_help[i][0],
              rc, g_out);
    }
    expect_error("help of an unknown command", "unknown command 'frob'", (const char *const[]){"help", "frob", NULL});
    CHECK(run((const char *const[]){"help", "frob", NULL}) == 2, "nstf help frob: exit 2");
    /* no progress bar when stderr is not a terminal (test_chat checks the terminal) */
    char out[300];
    path_in(out, sizeof out, "again.gguf");
    int rc = run((const char *const[]){"gen-model", "--shape", "tiny", "--type", "q8_0", "-o", out, NULL});
    CHECK(rc == 0 && g_err[0] == 0, "gen-model into a file: exit %d, stderr '%s'", rc, g_err);
    unlink(out);
}

/* llama.cpp's flags where they mean something here. */
static void llama_cpp_habits(const char *tiny) {
    char file[300], notmpl[300];
    path_in(file, sizeof file, "prompt.txt");
    path_in(notmpl, sizeof notmpl, "notmpl.gguf");
    /* flags first: nstf -m M -p hi is nstf run */
    int rc = run((const char *const[]){"-m", tiny, "-p", "hi", "-n", "3", "--temp", "0", NULL});
    CHECK(rc == 0 && generated() == 3, "nstf -m M -p hi: exit %d: %s", rc, g_err);
    /* --flag=value and long forms */
    rc = run((const char *const[]){"run", "--model=" , NULL});
    CHECK(rc == 2 && strstr(g_err, "no model"), "--model= (empty): exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "--model", tiny, "--prompt=hello", "--n-predict=4", "--ctx-size=64",
                                   "--threads=1", "--temp=0", "--seed=-1", "--batch-size=8", NULL});
    CHECK(rc == 0 && generated() == 4, "--flag=value: exit %d: %s", rc, g_err);
    /* the output streams: the same greedy text as pieces arrive (n and a
     * longer n agree on the prefix) */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "12", "--temp", "0", "--ignore-eos", NULL});
    static char full[sizeof g_out];
    snprintf(full, sizeof full, "%s", g_out);
    CHECK(rc == 0 && generated() == 12, "-n 12: exit %d", rc);
    /* -r: stops once the output ends with the string */
    size_t half = strlen(full) / 2;
    char stop[8] = {0};
    if (half >= 2) memcpy(stop, full + half - 2, 2);
    if (stop[0] && stop[0] != '\n' && stop[1] != '\n') {
        rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "12", "--temp", "0", "--ignore-eos", "-r",
                                       stop, NULL});
        const size_t n = strlen(g_out) ? strlen(g_out) - 1 : 0; /* less the newline */
        CHECK(rc == 0 && n <= half && n >= 2 && !strncmp(g_out, full, n) && !memcmp(g_out + n - 2, stop, 2),
              "-r '%s': exit %d, output '%s' (full '%s')", stop, rc, g_out, full);
    }
    /* -n -1: until the context is full, then a clear message (exit 0);
     * --context-shift goes on past it */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "-1", "--ignore-eos", "-c", "24", NULL});
    CHECK(rc == 0 && strstr(g_err, "the context is full (24 tokens)") && generated() >= 18,
          "-n -1 -c 24: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "-2", "--ignore-eos", "-c", "24",
                                   "--context-shift", NULL});
    CHECK(rc == 0 && strstr(g_err, "the context is full"), "-n -2 stops at a full context: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "60", "--ignore-eos", "-c", "24",
                                   "--context-shift", "--keep", "2", NULL});
    CHECK(rc == 0 && generated() == 60 && !strstr(g_err, "context is full"), "--context-shift: exit %d: %s", rc, g_err);
    expect_error("--keep -2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "--keep", "-2", NULL});
    /* -f -, and a prompt piped on stdin */
    FILE *f = fopen(file, "wb");
    if (f) {
        fputs("hello", f);
        fclose(f);
    }
    g_stdin = file;
    rc = run((const char *const[]){"run", "-m", tiny, "-f", "-", "-n", "12", "--temp", "0", "--ignore-eos", NULL});
    CHECK(rc == 0 && !strcmp(g_out, full), "-f -: exit %d, '%s' vs '%s'", rc, g_out, full);
    rc = run((const char *const[]){"run", "-m", tiny, "-n", "12", "--temp", "0", "--ignore-eos", NULL});
    CHECK(rc == 0 && !strcmp(g_out, full), "prompt on stdin: exit %d, '%s' vs '%s'", rc, g_out, full);
    g_stdin = NULL;
    /* -ngl: 0 = CPU, all layers = the GPU, N between: the first N there
     * (without a GPU: a warning, the CPU); -fa accepted */
    const bool gpu = nstf_gpu_runtime() && nstf_gpu_count() > 0;
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-ngl", "0", "-fa", NULL});
    CHECK(rc == 0, "-ngl 0 -fa: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-ngl", "99", "-fa", "on", "--device", "auto",
                                   NULL});
    CHECK(rc == 0, "-ngl 99 -fa on: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "--n-gpu-layers=-1", "--flash-attn", NULL});
    CHECK(rc == 0, "--n-gpu-layers=-1: exit %d: %s", rc, g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-ngl", "1", "-v", NULL});
    /* the tiny model's heads (16) are not a GPU attention size: the run
     * falls back to the CPU with its reason; the split itself is checked on
     * SmolLM2 by scripts/device/cli_ngl.sh and test_e2e_gpu */
    if (gpu && strstr(g_err, "GPU not used"))
        CHECK(rc == 0 && strstr(g_err, "head sizes"), "-ngl 1 of 2 -v: exit %d: %s", rc, g_err);
    else if (gpu)
        CHECK(rc == 0 && strstr(g_err, "split: embedding and layers 0-0 on the GPU, layers 1-1 and the output on the CPU") &&
                  strstr(g_err, "memory: device=gpu") && strstr(g_err, "memory: device=cpu"),
              "-ngl 1 of 2 -v: exit %d: %s", rc, g_err);
    else
        CHECK(rc == 0 && strstr(g_err, "-ngl 1: no GPU in use") && strstr(g_err, "memory: device=cpu"),
              "-ngl 1 without a GPU: exit %d: %s", rc, g_err);
    expect_error("-ngl 1 --device cpu", "-ngl 1 puts layers on a GPU, but --device cpu",
                 (const char *const[]){"run", "-m", tiny, "-p", "x", "-ngl", "1", "--device", "cpu", NULL});
    expect_error("-ngl -2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-ngl", "-2", NULL});
    expect_error("-fa off", "always flash attention", (const char *const[]){"run", "-m", tiny, "-p", "x", "-fa", "off", NULL});
    /* KV cache types: the backend's own, else a clear refusal (exit 2) */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-ctk", "f32", "-ctv", "f32", "--device",
                                   "cpu", NULL});
    CHECK(rc == 0, "-ctk f32 on the CPU: exit %d: %s", rc, g_err);
    expect_error("-ctk f16 on the CPU", "the CPU backend keeps the KV cache in f32",
                 (const char *const[]){"run", "-m", tiny, "-p", "x", "-ctk", "f16", "--device", "cpu", NULL});
    expect_error("-ctv q8_0 alone", "same cache type",
                 (const char *const[]){"run", "-m", tiny, "-p", "x", "-ctv", "q8_0", "--device", "cpu", NULL});
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-ctk", "q8_0", "-ctv", "q8_0", "--device",
                                   "cpu", NULL});
    CHECK(rc == 0, "-ctk q8_0 -ctv q8_0 on the CPU: exit %d: %s", rc, g_err);
    expect_error("-ctk nonsense", "not a cache type", (const char *const[]){"run", "-m", tiny, "-p", "x", "-ctk", "f7", NULL});
    /* --special: "<|im_start|>" is one token, not 12 bytes; --verbose-prompt shows it */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "<|im_start|>", "-n", "1", "--special", "--verbose-prompt", NULL});
    CHECK(rc == 0 && strstr(g_err, "prompt: 1 tokens") && strstr(g_err, "'<|im_start|>'"), "--special: exit %d: %s", rc,
          g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "<|im_start|>", "-n", "1", "--verbose-prompt", NULL});
    CHECK(rc == 0 && strstr(g_err, "prompt: 12 tokens"), "without --special: exit %d: %s", rc, g_err);
    /* the prompt is echoed only on request */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "12", "--temp", "0", "--ignore-eos", NULL});
    CHECK(rc == 0 && !strcmp(g_out, full), "the prompt is not echoed: '%s'", g_out);
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "hello", "-n", "12", "--temp", "0", "--ignore-eos",
                                   "--display-prompt", NULL});
    CHECK(rc == 0 && !strncmp(g_out, "hello", 5) && !strcmp(g_out + 5, full), "--display-prompt: '%s'", g_out);
    /* the chat template: named with -v, chosen with --chat-template; a model
     * without one says which default it gets */
    rc = run((const char *const[]){"run", "-m", tiny, "--chat", "-p", "hi", "-n", "2", "-v", NULL});
    CHECK(rc == 0 && strstr(g_err, "chat template: chatml (the model's)"), "-v names the template: %s", g_err);
    rc = run((const char *const[]){"run", "-m", tiny, "--chat", "-p", "hi", "-n", "2", "-v", "--chat-template", "llama3",
                                   NULL});
    CHECK(rc == 0 && strstr(g_err, "chat template: llama3 (--chat-template)"), "--chat-template llama3: %s", g_err);
    expect_error("--chat-template nonsense", "use " NSTF_CHAT_TEMPLATE_NAMES,
                 (const char *const[]){"run", "-m", tiny, "--chat", "-p", "x", "--chat-template", "alpaca", NULL});
    FILE *in = fopen(tiny, "rb"), *outf = fopen(notmpl, "wb");
    static char buf[1 << 20];
    size_t k = in ? fread(buf, 1, sizeof buf, in) : 0;
    char *key = k ? memmem(buf, k, "tokenizer.chat_template", 23) : NULL;
    if (key) key[22] = 'X'; /* another key of the same length: no template */
    if (outf) {
        fwrite(buf, 1, k, outf);
        while (in && (k = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, k, outf);
        fclose(outf);
    }
    if (in) fclose(in);
    CHECK(key != NULL, "the tiny model has no chat template key");
    rc = run((const char *const[]){"run", "-m", notmpl, "--chat", "-p", "hi", "-n", "2", NULL});
    CHECK(rc == 0 && strstr(g_err, "the model has no chat template; using chatml"), "no template: exit %d: %s", rc, g_err);
    /* invalid UTF-8: the offset in what the user typed, no internal names */
    expect_error("invalid UTF-8 in a chat prompt", "the prompt is not valid UTF-8: byte 0xFF at offset 3",
                 (const char *const[]){"run", "-m", tiny, "--chat", "-p", "ok \xff bad", NULL});
    CHECK(!strstr(g_err, "nstf_"), "an internal name in the message: %s", g_err);
    /* threads: more than processors is a warning, and it still runs */
    rc = run((const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "2", "-t", "1024", NULL});
    CHECK(rc == 0 && strstr(g_err, "warning: 1024 threads on"), "-t 1024: exit %d: %s", rc, g_err);
    unlink(file);
    unlink(notmpl);
}

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
    expect_error("-n -3", "-n -3 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "-3", NULL});
    expect_error("-n abc", "expects an integer", (const char *const[]){"run", "-m", tiny, "-p", "x", "-n", "abc", NULL});
    expect_error("-c 0", "-c 0 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-c", "0", NULL});
    expect_error("-c -1", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-c", "-1", NULL});
    expect_error("-t 0", "-t 0 is out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-t", "0", NULL});
    expect_error("-t -2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "-t", "-2", NULL});
    expect_error("--top-p 2", "out of range", (const char *const[]){"run", "-m", tiny, "-p", "x", "--top-p", "2", NULL});
    expect_error("--temp nan", "expects a number", (const char *const[]){"run", "-m", tiny, "-p", "x", "--temp", "nan", NULL});
    expect_error("no value", "needs a value", (const char *const[]){"run", "-m", tiny, "-p", NULL});
    expect_error("unknown flag", "nstf run: unknown option", (const char *const[]){"run", "--frobnicate", NULL});
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

    llama_cpp_habits(tiny);
    consistency(tiny);

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
