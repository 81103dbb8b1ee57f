// The tensor view the op interface takes: a borrowed pointer plus dtype, device, shape and strides.
// Views never own memory; whoever allocated the buffer frees it.
#ifndef DF_KERNELS_TENSOR_H
#define DF_KERNELS_TENSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DF_F32, DF_F64, DF_BF16, DF_F16, DF_I64, DF_I32, DF_U8, DF_BOOL } df_dtype;

typedef enum { DF_DEV_CPU, DF_DEV_CUDA } df_device;

#define DF_MAX_DIMS 4

typedef struct {
  void *data;
  df_dtype dtype;
  df_device device;
  int ndim;
  int64_t shape[DF_MAX_DIMS];
  int64_t stride[DF_MAX_DIMS]; // in elements
} df_tensor;

size_t df_dtype_size(df_dtype dt);
const char *df_dtype_name(df_dtype dt);

// A contiguous (row-major) view.
df_tensor df_view(void *data, df_dtype dt, df_device dev, int ndim, const int64_t *shape);

int64_t df_numel(const df_tensor *t);
bool df_is_contiguous(const df_tensor *t);

// Writes "f32[2,3,4]" into buf.
const char *df_tensor_desc(const df_tensor *t, char *buf, size_t n);

// Contiguous fp32 / int32 / uint8 CPU views, for tests and CPU callers.
#define DF_SHAPE(...)  ((const int64_t[]){__VA_ARGS__})
#define DF_NARGS_(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define df_f32(p, ...) df_view((p), DF_F32, DF_DEV_CPU, DF_NARGS_(__VA_ARGS__), DF_SHAPE(__VA_ARGS__))
#define df_i32(p, ...) df_view((p), DF_I32, DF_DEV_CPU, DF_NARGS_(__VA_ARGS__), DF_SHAPE(__VA_ARGS__))
#define df_u8(p, ...)  df_view((p), DF_U8, DF_DEV_CPU, DF_NARGS_(__VA_ARGS__), DF_SHAPE(__VA_ARGS__))

#ifdef __cplusplus
}
#endif

#endif
