/* nstf.c — the nstf command line: `nstf run`, `nstf chat`, `nstf inspect`, ...
 * Every failure is one line on stderr, "nstf COMMAND: ...", and a non-zero
 * exit: 2 for a bad argument, 1 for anything else. `nstf -m MODEL ...`
 * runs `nstf run`, as llama.cpp's llama-cli takes its flags directly. */
#include <stdio.h>
#include <string.h>

#include "cli_util.h"
#include "nstf.h"

int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_gen_model(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_devices(int argc, char **argv);
int cmd_isa(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_conv(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_lowrank(int argc, char **argv);
int cmd_imatrix(int argc, char **argv);
int cmd_analyze(int argc, char **argv);
int cmd_optimize(int argc, char **argv);

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *what;
} k_cmds[] = {
    {"run", cmd_run, "generate text from a GGUF model or an HF model folder"},
    {"chat", cmd_chat, "talk with a model, turn after turn (history kept in the KV cache)"},
    {"serve", cmd_serve, "an OpenAI-compatible HTTP server with continuous batching"},
    {"inspect", cmd_inspect, "print a GGUF file's metadata and tensor table"},
    {"convert", cmd_convert, "write an HF model folder as a GGUF file"},
    {"quantize", cmd_quantize, "convert a GGUF's weights to another type or mix"},
    {"perplexity", cmd_perplexity, "perplexity and KL divergence on a text, as llama-perplexity"},
    {"imatrix", cmd_imatrix, "importance matrix over a text (llama.cpp's GGUF imatrix) for quantize --imatrix"},
    {"lowrank", cmd_lowrank, "factor a model's matrices into low-rank pairs (SVD, activation-aware)"},
    {"analyze", cmd_analyze, "per-matrix sensitivity: KL and perplexity under each candidate type / rank"},
    {"optimize", cmd_optimize, "plan per layer: types or low-rank under a perplexity budget; trade-off table"},
    {"gen-model", cmd_gen_model, "write a Llama GGUF with random weights at a real shape"},
    {"train", cmd_train, "train or fine-tune (full or LoRA) on the CPU or a GPU"},
    {"tokenize", cmd_tokenize, "text files to token shards for nstf train"},
    {"bench", cmd_bench, "llama-bench compatible throughput (pp512/tg128) and regression check;\n"
                         "              nstf bench conv: the conv2d kernel ladder against cuDNN"},
    {"profile", cmd_profile, "per-op time, FLOPs, bytes and roofline placement; Chrome trace"},
    {"devices", cmd_devices, "list the GPUs this build can run on (--verbose: and the environment switches)"},
    {"isa", cmd_isa, "GPU machine-code report and gates of the AMD/CUDA build"},
};
#define N_CMDS (sizeof k_cmds / sizeof k_cmds[0])

static void usage(FILE *f) {
    fprintf(f,
            "nstf %s — run Llama-family models on the CPU, CUDA and HIP GPUs\n"
            "\n"
            "usage: nstf <command> [options]     (nstf -m MODEL ... is nstf run -m MODEL ...)\n"
            "\n"
            "commands:\n",
            NSTF_VERSION_STRING);
    for (size_t i = 0; i < N_CMDS; i++) fprintf(f, "  %-11s %s\n", k_cmds[i].name, k_cmds[i].what);
    fprintf(f, "  help        this text; nstf help COMMAND: that command's options\n");
}

static int dispatch(const char *name, int argc, char **argv) {
    for (size_t i = 0; i < N_CMDS; i++)
        if (!strcmp(name, k_cmds[i].name)) {
            cli_cmd = k_cmds[i].name;
            return k_cmds[i].fn(argc, argv);
        }
    return -1;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (cmd[0] == '-' && strcmp(cmd, "-h") && strcmp(cmd, "--help") && strcmp(cmd, "--version")) {
        argv[0] = (char *)"run"; /* flags first: nstf run */
        return dispatch("run", argc, argv);
    }
    if (!strcmp(cmd, "bench") && argc > 2 && !strcmp(argv[2], "conv")) {
        cli_cmd = "bench conv";
        return cmd_bench_conv(argc - 2, argv + 2);
    }
    int rc = dispatch(cmd, argc - 1, argv + 1);
    if (rc >= 0) return rc;
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        if (argc > 2) {
            char *help[] = {argv[2], (char *)"--help", NULL};
            rc = dispatch(argv[2], 2, help);
            if (rc >= 0) return rc;
            fprintf(stderr, "nstf help: unknown command '%s' (try nstf help)\n", argv[2]);
            return 2;
        }
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("nstf %s\n", NSTF_VERSION_STRING);
        return 0;
    }
    fprintf(stderr, "nstf: unknown command '%s' (try nstf help)\n", cmd);
    return 2;
}
