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

// Where a tensor's bytes live. DF_DEV_FAKE is the test device of kernels/fake/ (host memory the host must
// not touch, reached only through the backend table, every transfer counted).
typedef enum { DF_DEV_CPU, DF_DEV_CUDA, DF_DEV_FAKE } df_device;

const char *df_device_name(df_device dev); // "cpu", "cuda", "fake"

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

// Contiguous views by dtype: df_f32 / df_i32 / df_u8 on the CPU (host data, tests), and the *_on forms on any
// device (a pointer from df_buffer_alloc of a context on that device), e.g. df_f32_on(dev, p, R, H).
#define DF_SHAPE(...)               ((const int64_t[]){__VA_ARGS__})
#define DF_NARGS_(...)              (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))
#define df_view_on(dt, dev, p, ...) df_view((void *)(p), (dt), (dev), DF_NARGS_(__VA_ARGS__), DF_SHAPE(__VA_ARGS__))
#define df_f32_on(dev, p, ...)      df_view_on(DF_F32, (dev), (p), __VA_ARGS__)
#define df_bf16_on(dev, p, ...)     df_view_on(DF_BF16, (dev), (p), __VA_ARGS__)
#define df_f64_on(dev, p, ...)      df_view_on(DF_F64, (dev), (p), __VA_ARGS__)
#define df_i32_on(dev, p, ...)      df_view_on(DF_I32, (dev), (p), __VA_ARGS__)
#define df_u8_on(dev, p, ...)       df_view_on(DF_U8, (dev), (p), __VA_ARGS__)
#define df_f32(p, ...)              df_f32_on(DF_DEV_CPU, (p), __VA_ARGS__)
#define df_i32(p, ...)              df_i32_on(DF_DEV_CPU, (p), __VA_ARGS__)
#define df_u8(p, ...)               df_u8_on(DF_DEV_CPU, (p), __VA_ARGS__)

#ifdef __cplusplus
}
#endif

#endif
