#include "tests/cuda/cu_test.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define CU_CHECK(call)                                                                                                 \
  do {                                                                                                                 \
    cudaError_t e_ = (call);                                                                                           \
    cr_assert_eq(e_, cudaSuccess, "%s: %s", #call, cudaGetErrorString(e_));                                            \
  } while (0)

// The suite's count of what ran and what was skipped, each skip with its reason (a CUDA test skips only for a
// missing cuDNN or a shape marked GPU-only, and on machines without a device). Tests left out by --filter are
// "skipped" without a message for Criterion: they are not counted.
ReportHook(POST_ALL)(struct criterion_global_stats *stats) {
  size_t ran = 0, skipped = 0;
  for (struct criterion_suite_stats *s = stats->suites; s; s = s->next)
    for (struct criterion_test_stats *t = s->tests; t; t = t->next) {
      if (t->test_status == CR_STATUS_SKIPPED) {
        if (!t->message || !*t->message) continue;
        skipped++;
        printf("[SKIP] %s::%s: %s\n", t->test->category, t->test->name, t->message ? t->message : "");
      } else {
        ran++;
      }
    }
  printf("tests/cuda: %zu ran, %zu skipped\n", ran, skipped);
  fflush(stdout);
}

bool cu_gpu_visible(void) {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

enum { GEMM_WS = 32 << 20 };

cu_env cu_env_open(void) {
  cu_env e = {0};
  CU_CHECK(cudaSetDevice(0));
  cudaStream_t s;
  CU_CHECK(cudaStreamCreate(&s));
  e.s = (df_cu_stream)s;
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  cr_assert_eq(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS, "cublasLtCreate");
  cr_assert_eq(cublasCreate(&blas), CUBLAS_STATUS_SUCCESS, "cublasCreate");
  cr_assert_eq(cublasSetStream(blas, s), CUBLAS_STATUS_SUCCESS, "cublasSetStream");
  e.lt = lt, e.blas = blas;
  CU_CHECK(cudaMalloc(&e.gemm_ws, GEMM_WS));
  df_error err = {0};
  DF_ASSERT_OK(df_cu_gemm_ctx_create(e.lt, e.blas, e.gemm_ws, GEMM_WS, &e.g, &err), &err);
  return e;
}

// In the CUDA emulator: device memory still allocated once a test's stream or contexts are gone is reported (a test
// frees what it allocates).
static void report_live(const char *what) {
#ifdef DF_CUDA_EMU
  const size_t live = df_emu_live_device_bytes();
  if (live == 0) return;
  cr_log_warn("%s: %zu bytes of device memory in %d allocations still allocated", what, live,
              df_emu_live_device_allocations());
  df_emu_print_live(stderr);
#else
  (void)what;
#endif
}

void cu_env_close(cu_env *e) {
  cudaStreamSynchronize((cudaStream_t)e->s);
  df_cu_gemm_ctx_destroy(e->g);
  cudaFree(e->gemm_ws);
  cublasDestroy((cublasHandle_t)e->blas);
  cublasLtDestroy((cublasLtHandle_t)e->lt);
  cudaStreamDestroy((cudaStream_t)e->s);
  report_live("cu_env_close");
}

void *cu_alloc(size_t bytes) {
  void *d = NULL;
  CU_CHECK(cudaMalloc(&d, bytes ? bytes : 1));
  CU_CHECK(cudaMemset(d, 0xFF, bytes ? bytes : 1));
  return d;
}

void cu_free(void *d) {
  if (d) cudaFree(d);
}

uint16_t cu_bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); // NaN stays a quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

float cu_bf16_value(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

void cu_round_bf16(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = cu_bf16_value(cu_bf16_bits(x[i]));
}

void *cu_upload_bytes(const void *h, size_t bytes) {
  void *d = cu_alloc(bytes);
  CU_CHECK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
  return d;
}

void *cu_upload(const float *h, int64_t n, df_dtype dt) {
  if (dt == DF_F32) return cu_upload_bytes(h, sizeof(float) * (size_t)n);
  cr_assert_eq(dt, DF_BF16, "cu_upload: f32 or bf16 only");
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) b[i] = cu_bf16_bits(h[i]);
  void *d = cu_upload_bytes(b, sizeof(uint16_t) * (size_t)n);
  free(b);
  return d;
}

void cu_sync(cu_env *e) { CU_CHECK(cudaStreamSynchronize((cudaStream_t)e->s)); }

void cu_download_bytes(cu_env *e, void *h, const void *d, size_t bytes) {
  cu_sync(e);
  CU_CHECK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

float *cu_download(cu_env *e, const void *d, int64_t n, df_dtype dt) {
  float *h = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
  if (dt == DF_F32) {
    cu_download_bytes(e, h, d, sizeof(float) * (size_t)n);
    return h;
  }
  cr_assert_eq(dt, DF_BF16, "cu_download: f32 or bf16 only");
  uint16_t *b = malloc(sizeof(uint16_t) * (size_t)(n > 0 ? n : 1));
  cu_download_bytes(e, b, d, sizeof(uint16_t) * (size_t)n);
  for (int64_t i = 0; i < n; i++) h[i] = cu_bf16_value(b[i]);
  free(b);
  return h;
}

double cu_rel_l2(const float *got, const float *want, int64_t n) {
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < n; i++) {
    if (isnan(got[i])) return INFINITY;
    double d = (double)got[i] - (double)want[i];
    num += d * d, den += (double)want[i] * want[i];
  }
  return den > 0 ? sqrt(num / den) : sqrt(num);
}

cu_pair cu_pair_open(void) {
  cu_pair p = {df_test_cpu_ctx(1), NULL};
  df_error err = {0};
  df_ctx_options o = {.device = DF_DEV_CUDA, .cuda_device = 0};
  DF_ASSERT_OK(df_ctx_create(&o, &p.gpu, &err), &err);
  return p;
}

void cu_pair_close(cu_pair *p) {
  df_ctx_destroy(p->gpu), df_ctx_destroy(p->cpu);
  report_live("cu_pair_close");
}

df_tensor cu_pair_dev(cu_pair *p, const df_tensor *h) {
  df_error err = {0};
  const size_t bytes = (size_t)df_numel(h) * df_dtype_size(h->dtype);
  void *d = NULL;
  DF_ASSERT_OK(df_buffer_alloc(p->gpu, bytes, &d, &err), &err);
  DF_ASSERT_OK(df_copy(p->gpu, d, DF_DEV_CUDA, h->data, DF_DEV_CPU, bytes, &err), &err);
  df_tensor t = *h;
  t.data = d, t.device = DF_DEV_CUDA;
  return t;
}

// ---- the program -------------------------------------------------------------------------------------------------

const char *cu_env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v && *v ? v : fallback;
}

void cu_tmpdir(char *buf, size_t n, const char *tag) {
  snprintf(buf, n, "/tmp/df_gpu_%s_XXXXXX", tag);
  cr_assert_not_null(mkdtemp(buf), "mkdtemp");
}

void cu_rmtree(const char *dir) {
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0, "cleanup of %s", dir);
}

int cu_run_cli(const char *args, const char *log) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "'%s' %s >'%s' 2>&1", CU_BIN_PATH, args, log);
  int rc = system(cmd);
  rc = WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
  if (rc != 0) {
    char tail[2048] = "";
    FILE *f = fopen(log, "r");
    if (f) {
      size_t n = fread(tail, 1, sizeof tail - 1, f);
      tail[n] = 0;
      fclose(f);
    }
    cr_log_error("draftforge %s exited %d:\n%s", args, rc, tail);
  }
  cr_assert_neq(rc, 2, "draftforge rejected the device option: the CUDA backend is not wired into the op table yet");
  return rc;
}
