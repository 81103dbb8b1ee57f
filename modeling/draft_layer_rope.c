// RoPE frequency tables for the draft's attention, as transformers' modeling_rope_utils builds them
// (transformers 5 semantics): every tensor step in float32 in the same order, Python-scalar steps in double.
#include <math.h>

#include "modeling/draft_layer.h"

// Rounds to fp32 here: keeps the compiler from fusing a*b+c into one FMA, which torch's separate
// elementwise kernels never do.
static float rn(float x) {
  volatile float r = x;
  return r;
}

// HF's pos_freqs = base ** (arange(0, dim, 2).float() / dim), float32 (the same power df_rope_default_inv_freq takes).
static float pos_freq(double theta, int64_t dim, int64_t i) {
  const float e = (float)(2 * i) / (float)dim;
  return (float)pow((double)(float)theta, (double)e);
}

static void rope_linear(const df_rope_config *rc, float *f) {
  const float factor = (float)rc->factor;
  for (int64_t i = 0; i < rc->head_dim / 2; i++) f[i] = f[i] / factor;
}

// Llama 3.1: long wavelengths divided by factor, short ones kept, a smooth blend between.
static void rope_llama3(const df_rope_config *rc, float *f) {
  const double old_len = (double)rc->original_max_position_embeddings;
  const float factor = (float)rc->factor, lff = (float)rc->low_freq_factor;
  const float low_wavelen = (float)(old_len / rc->low_freq_factor);
  const float high_wavelen = (float)(old_len / rc->high_freq_factor);
  const float span = (float)(rc->high_freq_factor - rc->low_freq_factor);
  for (int64_t i = 0; i < rc->head_dim / 2; i++) {
    const float inv = f[i];
    const float wavelen = (float)(2.0 * M_PI) / inv;
    const float llama = wavelen > low_wavelen ? inv / factor : inv;
    const float smooth = rn((float)old_len / wavelen - lff) / span;
    const float smoothed = rn(rn(rn(1.0f - smooth) * llama) / factor) + rn(smooth * llama);
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    f[i] = medium ? smoothed : llama;
  }
}

static double yarn_get_mscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * log(scale) + 1.0;
}

static double yarn_correction_dim(double rotations, double dim, double base, double max_pos) {
  return (dim * log(max_pos / (rotations * 2.0 * M_PI))) / (2.0 * log(base));
}

// YaRN: per-frequency blend of interpolated (÷ factor) and original frequencies by a linear ramp over the
// correction range; cos/sin scaled by the attention factor.
static void rope_yarn(const df_rope_config *rc, float *f, float *mscale) {
  const int64_t dim = rc->head_dim;
  const double factor = rc->factor, base = rc->theta;
  const double orig = (double)(rc->original_max_position_embeddings > 0 ? rc->original_max_position_embeddings
                                                                        : rc->max_position_embeddings);
  double att = rc->attention_factor;
  if (!rc->has_attention_factor)
    att = rc->mscale != 0.0 && rc->mscale_all_dim != 0.0
              ? yarn_get_mscale(factor, rc->mscale) / yarn_get_mscale(factor, rc->mscale_all_dim)
              : yarn_get_mscale(factor, 1.0);
  *mscale = (float)att;
  const double beta_fast = rc->beta_fast != 0.0 ? rc->beta_fast : 32.0;
  const double beta_slow = rc->beta_slow != 0.0 ? rc->beta_slow : 1.0;
  double low = yarn_correction_dim(beta_fast, (double)dim, base, orig);
  double high = yarn_correction_dim(beta_slow, (double)dim, base, orig);
  if (rc->truncate) low = floor(low), high = ceil(high);
  low = low > 0.0 ? low : 0.0;
  high = high < (double)(dim - 1) ? high : (double)(dim - 1);
  if (low == high) high += 0.001; // HF's guard against a zero-width ramp
  const float lo = (float)low, width = (float)(high - low), ff = (float)factor;
  for (int64_t i = 0; i < dim / 2; i++) {
    const float p = pos_freq(base, dim, i);
    const float extrap = 1.0f / p, interp = 1.0f / rn(ff * p);
    float ramp = rn((float)i - lo) / width;
    ramp = ramp < 0.0f ? 0.0f : (ramp > 1.0f ? 1.0f : ramp);
    const float ef = 1.0f - ramp; // extrapolation weight
    f[i] = rn(interp * rn(1.0f - ef)) + rn(extrap * ef);
  }
}

df_status dflash_rope_table(const df_rope_config *rc, float *inv_freq, float *mscale, df_error *err) {
  if (rc->head_dim <= 0 || rc->head_dim % 2 != 0)
    return DF_FAIL(err, DF_ERR_INVALID, "head_dim", "RoPE rotates two halves of each head",
                   "head_dim %lld must be even and > 0", (long long)rc->head_dim);
  df_rope_default_inv_freq(rc->theta, (int)rc->head_dim, inv_freq);
  *mscale = 1.0f;
  switch (rc->type) {
  case DF_ROPE_DEFAULT: return DF_OK;
  case DF_ROPE_LINEAR: rope_linear(rc, inv_freq); return DF_OK;
  case DF_ROPE_LLAMA3: rope_llama3(rc, inv_freq); return DF_OK;
  case DF_ROPE_YARN: rope_yarn(rc, inv_freq, mscale); return DF_OK;
  }
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "rope_scaling.rope_type", "use default, linear, yarn or llama3",
                 "rope type %s has no frequency table", df_rope_type_name(rc->type));
}
