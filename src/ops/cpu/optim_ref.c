/* optim_ref.c — the scalar references of the optimizer rows of the op
 * table (optim.h): AdamW in double, rounded once per stored value, and the
 * per-tensor sums of squares of the gradient behind the global norm. */
#include <math.h>

#include "ops/optim.h"

/* torch: torch.optim.AdamW([w], lr, (beta1, beta2), eps, weight_decay).step(),
 * the per-step factors formed in double as torch does with Python floats */
void nstf_ref_adamw(const nstf_adamw_params *p, int64_t step, float grad_scale, bool decay,
                    float *w /* [n] */, const float *grad /* [n] */, float *m /* [n] */,
                    float *v /* [n] */, int64_t n) {
    const double decay_mul = 1.0 - p->lr * p->weight_decay;
    const double step_size = p->lr / (1.0 - pow(p->beta1, (double)step));
    const double bc2_sqrt = sqrt(1.0 - pow(p->beta2, (double)step));
    for (int64_t i = 0; i < n; i++) {
        double g = (double)grad[i] * grad_scale;
        double wi = decay ? w[i] * decay_mul : w[i];
        double mi = m[i] + (1.0 - p->beta1) * (g - m[i]);
        double vi = p->beta2 * v[i] + (1.0 - p->beta2) * g * g;
        w[i] = (float)(wi - step_size * mi / (sqrt(vi) / bc2_sqrt + p->eps));
        m[i] = (float)mi;
        v[i] = (float)vi;
    }
}

/* sq[i] = sum of grad^2 over tensor i (double, in order); returns the
 * global norm sqrt(sum sq). torch: clip_grad_norm_'s total norm. */
double nstf_ref_grad_norm(const nstf_param_tensor *tensors /* [n_tensors] */, int n_tensors,
                          const float *grad, double *sq /* [n_tensors] */) {
    double total = 0;
    for (int i = 0; i < n_tensors; i++) {
        double s = 0;
        for (int64_t k = 0; k < tensors[i].n; k++) {
            const double g = grad[tensors[i].offset + k];
            s += g * g;
        }
        sq[i] = s;
        total += s;
    }
    return sqrt(total);
}
