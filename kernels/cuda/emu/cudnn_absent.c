// cuDNN in the CUDA emulator: absent. The SDPA oracle (kernels/cuda/cudnn_sdpa.cu) is not compiled in an EMU build;
// these stand-ins answer DF_ERR_UNSUPPORTED naming libcudnn, so its callers (the cuDNN comparisons of
// tests/cuda/test_attention_gpu.c) skip the way they skip on a GPU machine without cuDNN.
#include "kernels/cuda/launch.h"

static df_status no_cudnn(df_error *err) {
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "libcudnn.so.9", "run the cuDNN comparison on a GPU machine",
                 "cuDNN is not available in the CUDA emulator (DF_CUDA=EMU)");
}

df_status df_cu_dflash_bias(df_cu_stream s, const df_cu_attn_args *a, void *bias_bf16, df_error *err) {
  (void)s, (void)a, (void)bias_bf16;
  return no_cudnn(err);
}

df_status df_cu_repeat_kv(df_cu_stream s, const void *src, void *dst, int64_t B, int64_t L, int64_t nKV, int64_t nH,
                          int64_t hd, df_error *err) {
  (void)s, (void)src, (void)dst, (void)B, (void)L, (void)nKV, (void)nH, (void)hd;
  return no_cudnn(err);
}

df_status df_cu_sdpa_create(df_cu_sdpa **out, df_error *err) {
  *out = NULL;
  return no_cudnn(err);
}

void df_cu_sdpa_destroy(df_cu_sdpa *p) { (void)p; }

df_status df_cu_sdpa_fwd(df_cu_sdpa *p, df_cu_stream s, int64_t B, int64_t H, int64_t Sq, int64_t Skv, int64_t hd,
                         float scale, const void *q, const void *k, const void *v, const void *bias, void *out,
                         float *stats, df_error *err) {
  (void)p, (void)s, (void)B, (void)H, (void)Sq, (void)Skv, (void)hd, (void)scale, (void)q, (void)k, (void)v;
  (void)bias, (void)out, (void)stats;
  return no_cudnn(err);
}
