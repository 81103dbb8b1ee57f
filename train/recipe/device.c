// training.device / --device → a context (train/recipe/device.h).
#include "train/recipe/device.h"

#include <string.h>

#include "kernels/backend.h"

static const char *const NAMES[] = {"auto", "cpu", "cuda"};

const char *df_device_choice_name(df_device_choice c) { return (unsigned)c < 3 ? NAMES[c] : "?"; }

df_status df_device_choice_parse(const char *s, df_device_choice *out, df_error *err) {
  for (int i = 0; i < 3; i++)
    if (s && !strcmp(s, NAMES[i])) return *out = (df_device_choice)i, DF_OK;
  return DF_FAIL(err, DF_ERR_INVALID, "--device", "use --device auto, cpu or cuda", "unknown device '%s'", s ? s : "");
}

// Every draft kind runs through the backend table today (DFlash, DSpark heads, MoE FFN), so none is kept on the
// CPU for its own sake; the hook stays for a component that cannot follow a CUDA context.
const char *df_device_cpu_only_reason(const df_draft_config *cfg) {
  (void)cfg;
  return NULL;
}

bool df_device_picks_cuda(df_device_choice c) {
  return c == DF_DEVICE_CUDA ||
         (c == DF_DEVICE_AUTO && df_cuda_available() && df_backend_complete(df_cuda_backend(), &(const char *){NULL}));
}

df_status df_device_open(df_device_choice c, const char *cpu_only, int threads, FILE *log, df_ctx **out,
                         df_error *err) {
  return df_device_open_on(c, 0, cpu_only, threads, log, out, err);
}

df_status df_device_open_on(df_device_choice c, int cuda_device, const char *cpu_only, int threads, FILE *log,
                            df_ctx **out, df_error *err) {
  df_ctx_options o = {.device = DF_DEV_CPU, .num_threads = threads, .cuda_device = cuda_device};
  if (c == DF_DEVICE_CUDA) o.device = DF_DEV_CUDA;
  if (c == DF_DEVICE_AUTO && cpu_only && df_cuda_available()) {
    if (log) fprintf(log, "device auto: cpu (%s; --device cuda forces the GPU)\n", cpu_only);
  } else if (c == DF_DEVICE_AUTO && df_cuda_available()) {
    const char *missing = NULL;
    if (df_backend_complete(df_cuda_backend(), &missing))
      o.device = DF_DEV_CUDA;
    else if (log)
      fprintf(log, "device auto: cpu (the cuda backend has no %s kernel yet; --device cuda forces it)\n", missing);
  }
  return df_ctx_create(&o, out, err);
}
