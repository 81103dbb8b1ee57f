// Helpers of the GPU suite (tests/cuda/): the skip rule, one stream with cuBLAS / cuBLASLt handles and a GEMM
// context, device buffers that start poisoned with NaN bytes (an element a kernel forgot to write fails every
// comparison), uploads and downloads with host-side bf16 rounding (round to nearest even, the kernels' rule), so
// the CPU oracle runs on exactly the values the GPU sees.
#ifndef DF_TESTS_CUDA_CU_TEST_H
#define DF_TESTS_CUDA_CU_TEST_H

#include <criterion/criterion.h>
#include <stdint.h>

#include "kernels/context.h"
#include "kernels/cuda/launch.h"
#include "tests/common/fixture.h"

// Skips the current test with a message when no CUDA device is visible.
#define CU_REQUIRE_GPU()                                                                                               \
  do {                                                                                                                 \
    if (!cu_gpu_visible()) cr_skip_test("no CUDA device visible: GPU test skipped (runs in scripts/gpu-check.sh)");    \
  } while (0)

bool cu_gpu_visible(void);

// A shape labelled GPU-only: skipped in the CUDA emulator (DF_CUDA=EMU), where it would take minutes, with the reason.
#ifdef DF_CUDA_EMU
#define CU_GPU_ONLY_SHAPE(why) cr_skip_test("GPU-only shape (too slow in the CUDA emulator): %s", why)
#else
#define CU_GPU_ONLY_SHAPE(why) ((void)0)
#endif

typedef struct {
  df_cu_stream s;
  void *lt, *blas; // cublasLtHandle_t, cublasHandle_t
  void *gemm_ws;
  df_cu_gemm_ctx *g;
} cu_env;

// A stream, handles and a 32 MiB GEMM workspace on device 0 (fails the test on error).
cu_env cu_env_open(void);
void cu_env_close(cu_env *e);

// Device memory filled with 0xFF bytes (NaN in f32 and bf16).
void *cu_alloc(size_t bytes);
void cu_free(void *d);
// Copies n fp32 values to the device as dtype dt (f32 or bf16, rounded to nearest even).
void *cu_upload(const float *h, int64_t n, df_dtype dt);
void *cu_upload_bytes(const void *h, size_t bytes);
// Waits for the stream, then copies n values of dtype dt back as fp32 (malloc'd; free with free()).
float *cu_download(cu_env *e, const void *d, int64_t n, df_dtype dt);
void cu_download_bytes(cu_env *e, void *h, const void *d, size_t bytes);
void cu_sync(cu_env *e);

// bf16 round-to-nearest-even on the host, and the values the GPU sees after such a round trip.
uint16_t cu_bf16_bits(float x);
float cu_bf16_value(uint16_t bits);
void cu_round_bf16(float *x, int64_t n);

// Relative L2 error ‖got − want‖ / ‖want‖ (NaN anywhere in got: +inf).
double cu_rel_l2(const float *got, const float *want, int64_t n);

// A CPU context (1 thread) and a CUDA context on device 0, for comparing an op through the backend table on both.
typedef struct {
  df_ctx *cpu, *gpu;
} cu_pair;
cu_pair cu_pair_open(void);
void cu_pair_close(cu_pair *p);
// A device copy of a host tensor (same dtype and shape), allocated on p->gpu.
df_tensor cu_pair_dev(cu_pair *p, const df_tensor *h);

// ---- the program (whole-program tests) --------------------------------------------------------------------------

// The program, sources and fixtures: the environment's DF_DRAFTFORGE_BIN / DF_SOURCE_DIR / DF_FIXTURE_DIR first (a
// prebuilt suite run from another checkout, scripts/gpu-check.sh --packed), else the build's paths.
const char *cu_env_or(const char *name, const char *fallback);
#define CU_BIN_PATH     cu_env_or("DF_DRAFTFORGE_BIN", DF_DRAFTFORGE_BIN)
#define CU_SOURCE_PATH  cu_env_or("DF_SOURCE_DIR", DF_SOURCE_DIR)
#define CU_FIXTURE_PATH cu_env_or("DF_FIXTURE_DIR", DF_FIXTURE_DIR)

// A fresh /tmp/df_gpu_<tag>_XXXXXX directory into buf; removing a tree (the test fails if it cannot).
void cu_tmpdir(char *buf, size_t n, const char *tag);
void cu_rmtree(const char *dir);
// Runs `draftforge ARGS` with its output in log; returns the exit code (its output is logged when it fails). A usage
// error (exit 2) fails the test: the CUDA backend would not be wired into the op table.
int cu_run_cli(const char *args, const char *log);

#endif
