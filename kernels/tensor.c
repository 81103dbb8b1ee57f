#include "kernels/tensor.h"

#include <stdio.h>
#include <string.h>

size_t df_dtype_size(df_dtype dt) {
  switch (dt) {
  case DF_F32: return 4;
  case DF_F64: return 8;
  case DF_BF16: return 2;
  case DF_F16: return 2;
  case DF_I64: return 8;
  case DF_I32: return 4;
  case DF_U8: return 1;
  case DF_BOOL: return 1;
  }
  return 0;
}

const char *df_dtype_name(df_dtype dt) {
  switch (dt) {
  case DF_F32: return "f32";
  case DF_F64: return "f64";
  case DF_BF16: return "bf16";
  case DF_F16: return "f16";
  case DF_I64: return "i64";
  case DF_I32: return "i32";
  case DF_U8: return "u8";
  case DF_BOOL: return "bool";
  }
  return "?";
}

const char *df_device_name(df_device dev) {
  switch (dev) {
  case DF_DEV_CPU: return "cpu";
  case DF_DEV_CUDA: return "cuda";
  case DF_DEV_FAKE: return "fake";
  }
  return "?";
}

df_tensor df_view(void *data, df_dtype dt, df_device dev, int ndim, const int64_t *shape) {
  df_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dt;
  t.device = dev;
  t.ndim = ndim < 0 ? 0 : (ndim > DF_MAX_DIMS ? DF_MAX_DIMS : ndim);
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; i--) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

int64_t df_numel(const df_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
  return n;
}

bool df_is_contiguous(const df_tensor *t) {
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->stride[i] != s) return false;
    s *= t->shape[i];
  }
  return true;
}

const char *df_tensor_desc(const df_tensor *t, char *buf, size_t n) {
  size_t off = (size_t)snprintf(buf, n, "%s[", df_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, i ? ",%lld" : "%lld", (long long)t->shape[i]);
  if (off < n) snprintf(buf + off, n - off, "]");
  return buf;
}
