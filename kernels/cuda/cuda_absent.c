// The CUDA backend's lifetime hooks in a build without nvcc: no CUDA context can be created, so the
// dispatcher never reaches a df_cuda_* op (see DF_DISPATCH in kernels/check.h).
#include "kernels/cuda/cuda_ops.h"

df_status df_cuda_ctx_init(int device, void **backend, df_error *err) {
  (void)device;
  *backend = NULL;
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "device", "rebuild with the CUDA toolkit (nvcc on PATH) or use the CPU",
                 "this build of draftforge has no CUDA backend");
}

void df_cuda_ctx_free(void *backend) { (void)backend; }

int df_cuda_device_count(void) { return 0; }

df_status df_cuda_alloc(void *backend, size_t bytes, void **out, df_error *err) {
  (void)backend, (void)bytes;
  *out = NULL;
  return df_cuda_ctx_init(0, &backend, err);
}

void df_cuda_free(void *backend, void *p) { (void)backend, (void)p; }

df_status df_cuda_memcpy(void *backend, void *dst, const void *src, size_t bytes, int kind, df_error *err) {
  (void)dst, (void)src, (void)bytes, (void)kind;
  return df_cuda_ctx_init(0, &backend, err);
}

df_status df_cuda_sync(void *backend, df_error *err) { return df_cuda_ctx_init(0, &backend, err); }
