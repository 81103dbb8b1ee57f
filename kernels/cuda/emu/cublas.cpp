// cuBLAS of the CUDA emulator: handles, cublasGemmEx and cublasGemmGroupedBatchedEx with cuBLAS's documented argument
// rules and supported type combinations, and the GEMM core that cuBLASLt shares (gemm_run): column-major, fp32
// arithmetic on the project's CPU GEMM (df_cpu_sgemm; bf16 operands widened exactly, D rounded to nearest even).
#include <cuda_bf16.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "kernels/cpu/gemm.h" // a C header without its own extern "C"
}
#include "kernels/cuda/emu/internal.h"

using namespace df_emu;

struct cublasContext {
  cudaStream_t stream;
  cublasPointerMode_t mode;
};

namespace df_emu {

namespace {

size_t type_size(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : t == CUDA_R_64F ? 8 : 4; }

float load(const void *p, cudaDataType_t t, int64_t i) {
  if (t == CUDA_R_16BF) return df_emu_bf16_float(((const uint16_t *)p)[i]);
  return ((const float *)p)[i];
}

void store(void *p, cudaDataType_t t, int64_t i, float v) {
  if (t == CUDA_R_16BF)
    ((uint16_t *)p)[i] = df_emu_bf16_bits(v);
  else
    ((float *)p)[i] = v;
}

// The stored column-major matrix (rows × cols, ld) as fp32 with the same ld (bf16 widened exactly).
const float *as_f32(const void *p, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, std::vector<float> &buf) {
  if (t == CUDA_R_32F) return (const float *)p;
  const int64_t n = cols > 0 ? (cols - 1) * ld + rows : 0;
  buf.resize((size_t)(n > 0 ? n : 1));
  for (int64_t i = 0; i < n; i++) buf[i] = load(p, t, i);
  return buf.data();
}

} // namespace

void gemm_run(const gemm_problem &p) {
  const int64_t m = p.m, n = p.n, k = p.k;
  if (m <= 0 || n <= 0) return;
  std::vector<float> t((size_t)(m * n), 0.0f), wa, wb;
  if (k > 0) {
    // Column-major T (m × n, ld m) is row-major Tᵀ = op(B)ᵀ·op(A)ᵀ: M' = n, N' = m, and a stored column-major
    // matrix is its own transpose in row-major terms.
    const float *A = as_f32(p.A, p.at, p.ta ? k : m, p.ta ? m : k, p.lda, wa);
    const float *B = as_f32(p.B, p.bt, p.tb ? n : k, p.tb ? k : n, p.ldb, wb);
    df_cpu_sgemm(omp_get_max_threads(), p.tb, p.ta, n, m, k, 1.0f, B, p.ldb, A, p.lda, 0.0f, t.data(), m);
  }
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      float v = p.alpha * t[(size_t)(j * m + i)];
      if (p.beta != 0.0f) v += p.beta * load(p.C, p.ct, i + j * p.ldc); // beta = 0: C is not read
      if (p.bias) v += load(p.bias, p.bias_t, i);
      store(p.D, p.dt, i + j * p.ldd, v);
    }
  count_stat(&df_emu_stats::gemms, 1);
}

// A matrix operand: device memory holding all of its (rows × cols, ld) elements.
void check_matrix(const char *call, const char *what, const void *p, cudaDataType_t t, int64_t rows, int64_t cols,
                  int64_t ld) {
  if (rows <= 0 || cols <= 0) return;
  const allocation *a = NULL;
  const ptr_kind k = classify(p, &a);
  if (k != PTR_DEVICE)
    fatal("cuBLAS reads and writes device memory only", "%s: matrix %s at %p is not device memory", call, what, p);
  const size_t bytes = (size_t)((cols - 1) * ld + rows) * type_size(t);
  if ((uintptr_t)p + bytes > a->base + a->size) {
    char d[600];
    describe_allocation(a, d, sizeof d);
    fatal("check the shapes and leading dimensions",
          "%s: matrix %s (%lld × %lld, ld %lld) at %p ends %zu bytes past the "
          "end of the %s",
          call, what, (long long)rows, (long long)cols, (long long)ld, p,
          (size_t)((uintptr_t)p + bytes - a->base - a->size), d);
  }
}

} // namespace df_emu

extern "C" const char *cublasGetStatusString(cublasStatus_t s) {
  switch (s) {
  case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
  case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
  case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
  case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
  case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
  default: return "CUBLAS_STATUS_INTERNAL_ERROR";
  }
}

extern "C" cublasStatus_t cublasCreate(cublasHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  if (device_count() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasContext{NULL, CUBLAS_POINTER_MODE_HOST};
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  cudaDeviceSynchronize(); // cuBLAS waits for its work before the handle goes
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard<std::recursive_mutex> g(lock());
  stream_of(stream, "cublasSetStream");
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t *stream) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

namespace {

bool op_ok(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C; }

cublasStatus_t invalid(const char *call, const char *fmt, long long a, long long b) {
  char msg[300];
  snprintf(msg, sizeof msg, fmt, a, b);
  warn("%s: CUBLAS_STATUS_INVALID_VALUE: %s", call, msg);
  return CUBLAS_STATUS_INVALID_VALUE;
}

// cuBLAS's documented rules for one GEMM's sizes (column-major).
cublasStatus_t check_sizes(const char *call, cublasOperation_t ta, cublasOperation_t tb, long long m, long long n,
                           long long k, long long lda, long long ldb, long long ldc) {
  if (!op_ok(ta) || !op_ok(tb)) return invalid(call, "transa %lld / transb %lld is not CUBLAS_OP_N, _T or _C", ta, tb);
  if (m < 0 || n < 0) return invalid(call, "m %lld or n %lld is negative", m, n);
  if (k < 0) return invalid(call, "k %lld is negative (%lld)", k, 0);
  const long long amin = ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1);
  const long long bmin = tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1);
  if (lda < amin) return invalid(call, "lda %lld < %lld", lda, amin);
  if (ldb < bmin) return invalid(call, "ldb %lld < %lld", ldb, bmin);
  if (ldc < (m > 1 ? m : 1)) return invalid(call, "ldc %lld < max(1, m = %lld)", ldc, m);
  return CUBLAS_STATUS_SUCCESS;
}

const char *type_name(cudaDataType_t t) {
  switch (t) {
  case CUDA_R_32F: return "CUDA_R_32F";
  case CUDA_R_16BF: return "CUDA_R_16BF";
  case CUDA_R_16F: return "CUDA_R_16F";
  case CUDA_R_64F: return "CUDA_R_64F";
  default: return "another type";
  }
}

// The 16-bit pointer rule of cublasGemmGroupedBatchedEx ("ideally 16-byte aligned; otherwise ...").
bool grouped_aligned(const void *p, long long k, size_t es) {
  const uintptr_t a = (uintptr_t)p;
  if ((k * (long long)es) % 16 == 0) return a % 16 == 0;
  if ((k * (long long)es) % 4 == 0) return a % 4 == 0;
  return a % es == 0;
}

} // namespace

extern "C" cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                                       int n, int k, const void *alpha, const void *A, cudaDataType_t Atype, int lda,
                                       const void *B, cudaDataType_t Btype, int ldb, const void *beta, void *C,
                                       cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                                       cublasGemmAlgo_t algo) {
  const char *call = "cublasGemmEx";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard<std::recursive_mutex> g(lock());
  cublasStatus_t st = check_sizes(call, transa, transb, m, n, k, lda, ldb, ldc);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return invalid(call, "alpha or beta is NULL (%lld%lld)", 0, 0);
  const bool types_ok = Atype == Btype &&
                        (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC) &&
                        ((Atype == CUDA_R_16BF && (Ctype == CUDA_R_16BF || Ctype == CUDA_R_32F)) ||
                         (Atype == CUDA_R_32F && Ctype == CUDA_R_32F));
  if (!types_ok || handle->mode != CUBLAS_POINTER_MODE_HOST) {
    warn("%s: CUBLAS_STATUS_NOT_SUPPORTED: A %s, B %s, C %s, compute %d (the emulator serves bf16 / fp32 operands "
         "with fp32 compute, host pointer mode)",
         call, type_name(Atype), type_name(Btype), type_name(Ctype), (int)computeType);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  check_matrix(call, "A", A, Atype, transa == CUBLAS_OP_N ? m : k, transa == CUBLAS_OP_N ? k : m, lda);
  check_matrix(call, "B", B, Btype, transb == CUBLAS_OP_N ? k : n, transb == CUBLAS_OP_N ? n : k, ldb);
  check_matrix(call, "C", C, Ctype, m, n, ldc);
  gemm_problem p = {};
  p.ta = transa != CUBLAS_OP_N, p.tb = transb != CUBLAS_OP_N, p.m = m, p.n = n, p.k = k;
  p.alpha = *(const float *)alpha, p.beta = *(const float *)beta;
  p.A = A, p.B = B, p.C = C, p.D = C, p.at = Atype, p.bt = Btype, p.ct = Ctype, p.dt = Ctype;
  p.lda = lda, p.ldb = ldb, p.ldc = ldc, p.ldd = ldc;
  enqueue(handle->stream, call, [p] { gemm_run(p); });
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
    const int m_array[], const int n_array[], const int k_array[], const void *alpha_array, const void *const Aarray[],
    cudaDataType_t Atype, const int lda_array[], const void *const Barray[], cudaDataType_t Btype,
    const int ldb_array[], const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  const char *call = "cublasGemmGroupedBatchedEx";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard<std::recursive_mutex> g(lock());
  if (!transa_array || !transb_array || !m_array || !n_array || !k_array || !alpha_array || !lda_array || !ldb_array ||
      !beta_array || !ldc_array || !group_size)
    return invalid(call, "a host array argument is NULL (%lld%lld)", 0, 0);
  if (group_count < 0) return invalid(call, "group_count %lld < 0 (%lld)", group_count, 0);
  // The documented combinations (cuBLAS: "cublasGemmGroupedBatchedEx supports the following ..."): with
  // CUBLAS_COMPUTE_32F, A/B and C of one type (16BF, 16F or 32F); 32F also with _PEDANTIC and _FAST_TF32.
  const bool c32 = computeType == CUBLAS_COMPUTE_32F;
  const bool types_ok = Atype == Btype && Atype == Ctype &&
                        ((c32 && (Atype == CUDA_R_16BF || Atype == CUDA_R_16F)) ||
                         (Atype == CUDA_R_32F && (c32 || computeType == CUBLAS_COMPUTE_32F_PEDANTIC ||
                                                  computeType == CUBLAS_COMPUTE_32F_FAST_TF32)));
  if (!types_ok || handle->mode != CUBLAS_POINTER_MODE_HOST) {
    warn("%s: CUBLAS_STATUS_NOT_SUPPORTED: Atype %s, Btype %s, Ctype %s with compute type %d is not a supported "
         "combination (A, B and C share one type: 16BF, 16F or 32F) or the pointer mode is device",
         call, type_name(Atype), type_name(Btype), type_name(Ctype), (int)computeType);
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  if (Atype == CUDA_R_16F) return CUBLAS_STATUS_NOT_SUPPORTED; // not served by the emulator
  int problems = 0;
  for (int gi = 0; gi < group_count; gi++) {
    if (group_size[gi] < 0) return invalid(call, "group_size[%lld] = %lld < 0", gi, group_size[gi]);
    if (k_array[gi] < 0) return invalid(call, "k_array[%lld] = %lld < 0", gi, k_array[gi]);
    cublasStatus_t st = check_sizes(call, transa_array[gi], transb_array[gi], m_array[gi], n_array[gi], k_array[gi],
                                    lda_array[gi], ldb_array[gi], ldc_array[gi]);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    problems += group_size[gi];
  }
  // The host arrays are read now; the device pointer arrays when the work runs (a kernel may still write them).
  std::vector<gemm_problem> groups((size_t)group_count);
  std::vector<int> sizes(group_size, group_size + group_count);
  for (int gi = 0; gi < group_count; gi++) {
    gemm_problem &p = groups[gi];
    p.ta = transa_array[gi] != CUBLAS_OP_N, p.tb = transb_array[gi] != CUBLAS_OP_N;
    p.m = m_array[gi], p.n = n_array[gi], p.k = k_array[gi];
    p.alpha = ((const float *)alpha_array)[gi], p.beta = ((const float *)beta_array)[gi];
    p.at = Atype, p.bt = Btype, p.ct = p.dt = Ctype;
    p.lda = lda_array[gi], p.ldb = ldb_array[gi], p.ldc = p.ldd = ldc_array[gi];
  }
  const size_t ptr_bytes = sizeof(void *) * (size_t)problems;
  if (problems > 0) {
    const allocation *a = NULL;
    for (const void *arr : {(const void *)Aarray, (const void *)Barray, (const void *)Carray})
      if (classify(arr, &a) != PTR_DEVICE || (uintptr_t)arr + ptr_bytes > a->base + a->size)
        fatal("Aarray, Barray and Carray are arrays of pointers in device memory",
              "%s: a pointer array at %p is not %zu bytes of device memory", call, arr, ptr_bytes);
  }
  enqueue(handle->stream, call, [groups, sizes, Aarray, Barray, Carray, call] {
    int idx = 0;
    for (size_t gi = 0; gi < groups.size(); gi++)
      for (int j = 0; j < sizes[gi]; j++, idx++) {
        gemm_problem p = groups[gi];
        p.A = Aarray[idx], p.B = Barray[idx], p.C = p.D = Carray[idx];
        const size_t es = type_size(p.at);
        if (es == 2 &&
            (!grouped_aligned(p.A, p.k, es) || !grouped_aligned(p.B, p.k, es) || !grouped_aligned(p.C, p.k, es)))
          fatal("16-bit operands need 16-byte aligned pointers (or 4-byte where k·2 is a multiple of 4)",
                "%s: problem %d of group %zu has misaligned pointers A %p, B %p, C %p (k %lld)", call, j, gi, p.A, p.B,
                p.C, (long long)p.k);
        check_matrix(call, "A", p.A, p.at, p.ta ? p.k : p.m, p.ta ? p.m : p.k, p.lda);
        check_matrix(call, "B", p.B, p.bt, p.tb ? p.n : p.k, p.tb ? p.k : p.n, p.ldb);
        check_matrix(call, "C", p.C, p.ct, p.m, p.n, p.ldc);
        gemm_run(p);
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}
