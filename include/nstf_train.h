/* nstf_train.h — training a Llama-family model: from a GGUF base (full
 * fine-tune, or LoRA adapters on a frozen, possibly quantized base) or from
 * random weights at a known shape, on the CPU or a GPU, with its data,
 * checkpoints and export.
 *
 * A trainer owns the model, the backend, the data loaders and the state of
 * the run (step, optimizer moments, data position). Each call to
 * nstf_trainer_step runs one optimizer step (grad_accum micro-batches of
 * batch sequences of seq tokens); checkpoints are written whole or not at
 * all and restore a run exactly (the CPU is deterministic: N steps equal
 * N/2 steps, a checkpoint, a resume and N/2 steps, bit for bit).
 *
 * Errors follow nstf.h: a status and one line from nstf_last_error(). */
#ifndef NSTF_TRAIN_H
#define NSTF_TRAIN_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "nstf.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct nstf_train_params {
    const char *model;        /* base GGUF or HF folder (a --shape run passes the file it generated) */
    const char *data;         /* token shard, folder of *.tok shards, or a text file */
    const char *eval_data;    /* optional, the same kinds */
    int batch;                /* sequences per micro-batch (default 4) */
    int seq;                  /* tokens per sequence (default 256) */
    int grad_accum;           /* micro-batches per optimizer step (default 1) */
    int64_t steps;            /* the schedule's length (default 100) */
    double lr, min_lr;        /* peak and final learning rate (defaults 3e-4, lr / 10) */
    int64_t warmup;           /* linear warm-up steps (default steps / 20) */
    double weight_decay;      /* default 0.1 (matrices only) */
    double beta1, beta2, eps; /* default 0.9, 0.95, 1e-8 */
    double clip;              /* global-norm clipping (default 1; <= 0 off) */
    int lora_rank;            /* 0: full fine-tune */
    const char *lora_targets; /* comma list of q,k,v,o,gate,up,down (default all) */
    const char *device;       /* "cpu", "gpu" or "auto" (default) */
    int n_threads;            /* CPU threads (0: every core) */
    const char *recompute;    /* "none" (default), "attn" or "full" */
    uint64_t seed;            /* data order and LoRA initialization (default 1) */
    int eval_batches;         /* micro-batches an evaluation reads (default 8) */
    int dp;                   /* data-parallel ranks (default 1): GPUs 0..dp-1, or dp CPU backends sharing
                                 the threads; each takes its batch x grad_accum sequences of a step, the
                                 gradients are summed over the ranks before the (replicated) update.
                                 In a process that mpirun launched as one of N (nstf_proc_join done),
                                 the run has N ranks, one per process (GPU: the process's place on
                                 its machine); dp must then be 1 or N */
    int dp_timeout_ms;        /* a rank that makes no progress this long fails the run, naming it
                                 (0: the communicator's default, 30 s) */
    int zero;                 /* ZeRO-1 with dp > 1: 1 cuts the AdamW moments into one slot per rank (the
                                 gradients reduce-scattered, each rank updates its slot, the weights
                                 all-gathered: the same bits as 0), 0 replicates the update; -1 (default):
                                 1 on CPU ranks, 0 on GPUs. With dp 1 either is the one-rank step */
} nstf_train_params;

nstf_train_params nstf_train_default_params(void);

/* The memory plan of a run, in bytes, and whether it fits the device. */
typedef struct nstf_train_plan {
    uint64_t weights, copy, grads, optimizer, frozen, activations, act_grads, workspace, io;
    uint64_t total, available;
    int64_t n_params, n_frozen;
    bool fits, host;
    char device[320];
    /* the activations of each recompute mode, for comparison */
    uint64_t act_none, act_attn, act_full;
    /* data parallel: the ranks, and the optimizer state's slots (ZeRO-1: the
     * ranks; 1: whole on every rank); the figures above are one rank's */
    int dp, shards;
} nstf_train_plan;

/* The plan without allocating (opens the model and the device). */
nstf_status nstf_train_plan_get(const nstf_train_params *p, nstf_train_plan *out);
void nstf_train_plan_print(const nstf_train_plan *plan, const nstf_train_params *p, FILE *f);

typedef struct nstf_trainer nstf_trainer;

/* Open the model, the device and the data, check the plan against the free
 * memory (a run that does not fit fails with the numbers), initialize. */
nstf_status nstf_trainer_open(const nstf_train_params *p, nstf_trainer **out);
void nstf_trainer_close(nstf_trainer *t);

typedef struct nstf_train_stats {
    int64_t step;        /* the step just run, from 1 */
    double loss;         /* its mean loss */
    double lr;           /* its learning rate */
    double grad_norm;    /* the gradient norm before clipping */
    double step_ms;      /* wall time */
    double tokens_per_s;
    double mfu;          /* model FLOPs utilization on a GPU with a known peak; < 0: not known */
    int64_t tokens;      /* tokens trained on so far */
} nstf_train_stats;

/* One optimizer step. A NaN/Inf loss or gradient fails without updating,
 * naming the step and the first tensor whose gradient is not finite. */
nstf_status nstf_trainer_step(nstf_trainer *t, nstf_train_stats *st);
/* Steps done so far (restored by a resume). */
int64_t nstf_trainer_steps_done(const nstf_trainer *t);
/* Mean loss over the evaluation data's first eval_batches micro-batches. */
nstf_status nstf_trainer_eval(nstf_trainer *t, double *loss);

/* Write the run's state (weights, optimizer moments, step, data position)
 * to dir/checkpoint.nstf atomically: the previous checkpoint survives a
 * failed write (a full disk, a kill). */
nstf_status nstf_trainer_save(nstf_trainer *t, const char *dir);
/* Restore a checkpoint of the same model and training shape. */
nstf_status nstf_trainer_resume(nstf_trainer *t, const char *dir);

/* The trained model as a GGUF that nstf run and llama.cpp load: the base's
 * metadata and tensors with the trained ones (LoRA: merged into their
 * matrices) in `type` ("f32", "f16", "bf16", "q8_0", ...; norms stay f32;
 * NULL: bf16). */
nstf_status nstf_trainer_export(nstf_trainer *t, const char *path, const char *type);
/* LoRA: the adapters alone, as a llama.cpp LoRA adapter GGUF. */
nstf_status nstf_trainer_export_lora(nstf_trainer *t, const char *path);

/* One line describing the run: device, parameters, tokens per step. */
const char *nstf_trainer_describe(const nstf_trainer *t);

#ifdef __cplusplus
}
#endif
#endif
