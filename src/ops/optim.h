/* optim.h — the optimizer step of training: AdamW over one flat fp32
 * parameter array (fp32 master weights, fp32 moments), the global gradient
 * norm with NaN/Inf detection that names the tensor, clipping, and the
 * cosine learning-rate schedule with linear warm-up.
 *
 * The parameters, their gradients and the two moments are four flat fp32
 * arrays with one layout, described by a table of nstf_param_tensor (name,
 * offset, size, whether weight decay applies): the step is one fused pass
 * over all four, and a failing check can say which tensor failed.
 *
 * Gradient accumulation is the caller's sum: every backward op adds into
 * the parameter gradients (backward.h), so micro-batches accumulate by
 * running one after the other; the caller zeroes the gradients after each
 * step. The mean over the step's tokens comes from the cross-entropy's
 * n_norm, and grad_scale below carries any further factor (the clipping
 * coefficient), applied inside the fused step instead of in an extra pass. */
#ifndef NSTF_OPS_OPTIM_H
#define NSTF_OPS_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "ops/ops.h"

typedef struct nstf_param_tensor {
    const char *name; /* e.g. "blk.3.attn_q.weight" (GGUF names) */
    int64_t offset;   /* first element in the flat arrays */
    int64_t n;        /* elements */
    bool decay;       /* weight decay applies (matrices: yes; norms: no) */
} nstf_param_tensor;

/* Scalars in double, like torch's Python floats: the per-step factors
 * (1 - lr wd, lr / (1 - beta1^step), ...) are formed in double and rounded
 * to fp32 once, where they meet the fp32 arrays. */
typedef struct nstf_adamw_params {
    double lr;           /* this step's learning rate (nstf_lr_cosine) */
    double beta1, beta2; /* e.g. 0.9, 0.95 */
    double eps;          /* e.g. 1e-8 */
    double weight_decay; /* decoupled: w -= lr * weight_decay * w where decay */
} nstf_adamw_params;

/* One AdamW step (torch.optim.AdamW, decoupled weight decay, bias
 * correction) for element i, with g = grad_scale * grad[i]:
 *   w *= 1 - lr * wd                     (tensors with decay only)
 *   m  = beta1 m + (1 - beta1) g
 *   v  = beta2 v + (1 - beta2) g^2
 *   w -= lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
 * step counts from 1 (the first update). Reference: plain loop over one
 * range, in double, rounded once to fp32 per stored value.
 * torch: torch.optim.AdamW([w], lr, (beta1, beta2), eps, weight_decay).step() */
void nstf_ref_adamw(const nstf_adamw_params *p, int64_t step, float grad_scale, bool decay,
                    float *w /* [n] */, const float *grad /* [n] */, float *m /* [n] */,
                    float *v /* [n] */, int64_t n);

/* Reference of the per-tensor sums of squares: sq[i] = sum of grad^2 over
 * tensor i in double, in order; returns sqrt(sum sq). */
double nstf_ref_grad_norm(const nstf_param_tensor *tensors /* [n_tensors] */, int n_tensors,
                          const float *grad, double *sq /* [n_tensors] */);

/* The fused step over every tensor of the table (flat arrays of
 * n_total = last offset + n elements), threaded; fp32 arithmetic in torch's
 * order of operations. Elements not covered by the table are untouched. */
void nstf_cpu_adamw(nstf_cpu *cpu, const nstf_adamw_params *p, int64_t step, float grad_scale,
                    const nstf_param_tensor *tensors /* [n_tensors] */, int n_tensors,
                    float *w, const float *grad, float *m, float *v);

/* Sum of squares of each tensor's gradient (double, each tensor summed in
 * order by one thread, so the result is the same for any pool size) and
 * the global norm sqrt(sum sq). A NaN or Inf gradient fails with
 * NSTF_ERR_RANGE and a message naming the first such tensor and element
 * ("gradient of blk.3.ffn_up.weight is not finite: element 1234 is nan");
 * *norm is then NaN. sq may be NULL when the per-tensor sums are not wanted
 * (then tensors are summed on one thread). torch:
 * torch.nn.utils.clip_grad_norm_(..., error_if_nonfinite=True)'s norm. */
nstf_status nstf_cpu_grad_norm(nstf_cpu *cpu, const nstf_param_tensor *tensors, int n_tensors,
                               const float *grad, double *sq /* [n_tensors] or NULL */,
                               double *norm);

/* The factor clipping by global norm multiplies the gradients by (pass it
 * as nstf_cpu_adamw's grad_scale): min(1, max_norm / (norm + 1e-6)), as
 * torch.nn.utils.clip_grad_norm_. max_norm <= 0 turns clipping off (1). */
float nstf_clip_scale(double norm, double max_norm);

/* Cosine schedule with linear warm-up, step counted from 0:
 *   step < warmup:           lr_max * (step + 1) / warmup
 *   warmup <= step < total:  lr_min + (lr_max - lr_min) * (1 + cos(pi * r)) / 2,
 *                            r = (step - warmup) / (total - warmup)
 *   step >= total:           lr_min */
typedef struct nstf_lr_schedule {
    double lr_max, lr_min;
    int64_t warmup, total;
} nstf_lr_schedule;
double nstf_lr_cosine(const nstf_lr_schedule *s, int64_t step);

#endif
