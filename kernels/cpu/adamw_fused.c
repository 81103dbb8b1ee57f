// CPU fused optimizer step over the flat buffers: the masked global norm of the scaled gradient with the clip
// coefficient and the go/no-go flag written to device memory, and one AdamW pass reading them. Element for
// element the arithmetic is the trainer's former sequence (scale in place, clip in place, per-tensor AdamW),
// so a run's bits do not depend on which of the two drove it. Built with -fno-math-errno (CMakeLists.txt).
#include <math.h>

#include "kernels/check.h"

enum { FUSED_PAR_MIN = 1 << 15, NORM_BLOCK = 1 << 14, NORM_LANES = 16 };

// Σ (g·scale)² over the trainable elements of one block, in NORM_LANES interleaved double accumulators (element i
// feeds lane i mod NORM_LANES; blocks start at multiples of it). Masked elements add +0, which changes nothing.
static double block_sumsq(const float *g, const uint8_t *mask, int64_t n, float scale) {
  double acc[NORM_LANES] = {0};
  int64_t i = 0;
  for (; i + NORM_LANES <= n; i += NORM_LANES)
    for (int j = 0; j < NORM_LANES; j++) {
      const double x = (mask[i + j] & DF_PARAM_TRAIN) ? (double)(g[i + j] * scale) : 0.0;
      acc[j] += x * x;
    }
  for (int j = 0; i < n; i++, j++) {
    const double x = (mask[i] & DF_PARAM_TRAIN) ? (double)(g[i] * scale) : 0.0;
    acc[j] += x * x;
  }
  double s = 0.0;
  for (int j = 0; j < NORM_LANES; j++) s += acc[j];
  return s;
}

df_status df_cpu_grad_norm_clip(df_ctx *ctx, const df_grad_norm_desc *desc, const df_tensor *grad,
                                const df_tensor *mask, const df_tensor *guard, df_tensor *out, df_error *err) {
  const int64_t n = df_numel(grad), nb = (n + NORM_BLOCK - 1) / NORM_BLOCK;
  double *part;
  DF_TRY(df_ctx_workspace(ctx, 0, sizeof(double) * (size_t)(nb > 0 ? nb : 1), (void **)&part, err));
  if (df_ctx_measure_only(ctx)) return DF_OK; // measure path: the workspace is all it needs
  const float *g = grad->data;
  const uint8_t *mk = mask->data;
  const float scale = desc->grad_scale;
#pragma omp parallel for schedule(static) num_threads(ctx->num_threads) if (n > FUSED_PAR_MIN)
  for (int64_t k = 0; k < nb; k++) {
    const int64_t lo = k * NORM_BLOCK, len = n - lo < NORM_BLOCK ? n - lo : NORM_BLOCK;
    part[k] = block_sumsq(g + lo, mk + lo, len, scale);
  }
  double s = 0.0;
  for (int64_t k = 0; k < nb; k++) s += part[k];
  const double norm = sqrt(s), c = desc->max_norm / (norm + 1e-6);
  bool ok = isfinite(norm);
  for (int64_t i = 0; guard && i < df_numel(guard); i++) ok = ok && isfinite(((const double *)guard->data)[i]);
  double *o = out->data;
  o[DF_NORM_VALUE] = norm;
  o[DF_NORM_COEF] = c < 1.0 ? c : 1.0;
  o[DF_NORM_OK] = ok ? 1.0 : 0.0;
  return DF_OK;
}

// Per-step scalars rounded to fp32 where torch rounds them (kernels/cpu/optim.c has the same derivation).
typedef struct {
  float decay; // 1 − lr·wd (1 for elements without weight decay)
  float beta1, a1, beta2, a2;
  float bc2_sqrt;           // √(1 − β2^t)
  float eps, neg_step_size; // ε, −lr / (1 − β1^t)
} fused_coefs;

static fused_coefs coefs_of(const df_adamw_hparams *hp, float wd) {
  double t = (double)hp->step;
  double bc1 = 1.0 - pow((double)hp->beta1, t), bc2 = 1.0 - pow((double)hp->beta2, t);
  return (fused_coefs){.decay = (float)(1.0 - (double)hp->lr * (double)wd),
                       .beta1 = hp->beta1,
                       .a1 = (float)(1.0 - (double)hp->beta1),
                       .beta2 = hp->beta2,
                       .a2 = (float)(1.0 - (double)hp->beta2),
                       .bc2_sqrt = (float)sqrt(bc2),
                       .eps = hp->eps,
                       .neg_step_size = (float)(-(double)hp->lr / bc1)};
}

df_status df_cpu_adamw_fused(df_ctx *ctx, const df_adamw_fused_desc *desc, df_tensor *master, const df_tensor *grad,
                             df_tensor *m, df_tensor *v, const df_tensor *mask, const df_tensor *norm_stats,
                             df_tensor *params, df_error *err) {
  (void)err;
  const double *ns = norm_stats ? norm_stats->data : NULL;
  if (ns && ns[DF_NORM_OK] == 0.0) return DF_OK; // skipped on the device: nothing changes
  const double coef = ns ? ns[DF_NORM_COEF] : 1.0;
  const bool clip = coef < 1.0;
  const float cf = (float)coef, scale = desc->grad_scale;
  // Only 1 − lr·wd differs between decayed and plain elements (1 − lr·0 is exactly 1).
  const fused_coefs c = coefs_of(&desc->hp, desc->hp.weight_decay);
  const int64_t n = df_numel(master);
  float *restrict pd = master->data, *restrict md = m->data, *restrict vd = v->data;
  float *restrict out = params ? params->data : NULL;
  const float *restrict gd = grad->data;
  const uint8_t *restrict mk = mask->data;
  // torch's _single_tensor_adamw in its operation order: mul_/add_, mul_/addcmul_, sqrt/div/add_, addcdiv_. Every
  // element is computed and untrainable ones keep their old values (a select, so the loop vectorizes).
#pragma omp parallel for simd schedule(static) num_threads(ctx->num_threads) if (n > FUSED_PAR_MIN)
  for (int64_t i = 0; i < n; i++) {
    const bool train = mk[i] & DF_PARAM_TRAIN;
    const float decay = (mk[i] & DF_PARAM_DECAY) ? c.decay : 1.0f;
    float g = gd[i] * scale;
    g = clip ? g * cf : g;
    float mi = md[i] * c.beta1 + c.a1 * g;
    float vi = vd[i] * c.beta2 + c.a2 * g * g;
    float denom = sqrtf(vi) / c.bc2_sqrt + c.eps;
    float pi = pd[i] * decay + c.neg_step_size * mi / denom;
    md[i] = train ? mi : md[i];
    vd[i] = train ? vi : vd[i];
    pd[i] = train ? pi : pd[i];
    if (out && train) out[i] = pi;
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_adamw_fused(df_backend *be) {
  be->grad_norm_clip = df_cpu_grad_norm_clip;
  be->measures[DF_OP_GRAD_NORM_CLIP] = true;
  be->adamw_fused = df_cpu_adamw_fused;
}
