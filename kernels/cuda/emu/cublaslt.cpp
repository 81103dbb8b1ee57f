// cuBLASLt of the CUDA emulator: matmul descriptors, matrix layouts, preferences, the heuristic and cublasLtMatmul,
// with cuBLASLt's documented semantics (column-major layouts, TRANSA / TRANSB, leading dimensions, strided batches,
// alpha / beta in host or device pointer mode, beta = 0 never reading C, D != C layouts, the BIAS epilogue with bias
// elements of D's type) and its argument checks, answering the documented status and saying why. The heuristic's
// algorithm records what it was chosen for (the minimum pointer alignments, its workspace), and cublasLtMatmul holds
// the call to those promises. The product runs on the CPU GEMM (gemm_run, cublas.cpp).
#include <cublasLt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/emu/internal.h"

using namespace df_emu;

struct cublasLtContext {
  int live;
};

struct cublasLtMatmulDescOpaque_t {
  cublasComputeType_t compute;
  cudaDataType_t scale;
  int32_t pointer_mode, transa, transb;
  uint32_t epilogue;
  const void *bias;
  int64_t bias_batch_stride;
  int32_t bias_type; // -1: D's type
};

struct cublasLtMatrixLayoutOpaque_t {
  cudaDataType_t type;
  int32_t order, batch;
  uint64_t rows, cols;
  int64_t ld, stride;
};

struct cublasLtMatmulPreferenceOpaque_t {
  uint64_t max_ws;
  uint32_t align[4]; // A, B, C, D
};

namespace {

const uint64_t kAlgoMagic = 0x0df0e11a0a160000ull;
const size_t kAlgoWorkspace = 4 << 20; // what the emulated algorithms ask for, when the preference allows it

cublasStatus_t fail(cublasStatus_t st, const char *call, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
cublasStatus_t fail(cublasStatus_t st, const char *call, const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  warn("%s: %s: %s", call, cublasGetStatusString(st), msg);
  return st;
}

// Attribute buffers must have the attribute's own size.
template <typename T> cublasStatus_t set(T *dst, const void *buf, size_t size, const char *call, const char *attr) {
  if (!buf || size != sizeof(T))
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "%s takes %zu bytes, got %zu", attr, sizeof(T), size);
  memcpy(dst, buf, sizeof(T));
  return CUBLAS_STATUS_SUCCESS;
}

size_t tsize(cudaDataType_t t) { return t == CUDA_R_16BF || t == CUDA_R_16F ? 2 : 4; }

struct shape {
  int64_t m, n, k;
};

// The problem's consistency: op(A) m × k, op(B) k × n, C and D m × n, leading dimensions, batches and types.
cublasStatus_t check_problem(const char *call, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t A,
                             cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C, cublasLtMatrixLayout_t D, shape *out) {
  if (!d || !A || !B || !C || !D) return fail(CUBLAS_STATUS_INVALID_VALUE, call, "a descriptor is NULL");
  const cublasLtMatrixLayout_t all[4] = {A, B, C, D};
  const char *names = "ABCD";
  for (int i = 0; i < 4; i++) {
    if (all[i]->order != CUBLASLT_ORDER_COL)
      return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "matrix %c is not column-major (the emulator's only order)",
                  names[i]);
    if (all[i]->ld < (int64_t)all[i]->rows)
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "matrix %c: ld %lld < rows %llu", names[i], (long long)all[i]->ld,
                  (unsigned long long)all[i]->rows);
  }
  const bool ta = d->transa != CUBLAS_OP_N, tb = d->transb != CUBLAS_OP_N;
  const int64_t m = ta ? A->cols : A->rows, k = ta ? A->rows : A->cols;
  const int64_t kb = tb ? B->cols : B->rows, n = tb ? B->rows : B->cols;
  if (k != kb)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call,
                "op(A) is %lld x %lld but op(B) is %lld x %lld (transa %d, transb %d)", (long long)m, (long long)k,
                (long long)kb, (long long)n, d->transa, d->transb);
  if ((int64_t)C->rows != m || (int64_t)C->cols != n || (int64_t)D->rows != m || (int64_t)D->cols != n)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "C is %llu x %llu and D %llu x %llu, op(A)·op(B) is %lld x %lld",
                (unsigned long long)C->rows, (unsigned long long)C->cols, (unsigned long long)D->rows,
                (unsigned long long)D->cols, (long long)m, (long long)n);
  if (A->batch != D->batch || B->batch != D->batch || C->batch != D->batch)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "batch counts A %d, B %d, C %d, D %d differ", A->batch, B->batch,
                C->batch, D->batch);
  if (d->compute != CUBLAS_COMPUTE_32F && d->compute != CUBLAS_COMPUTE_32F_PEDANTIC)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "compute type %d (the emulator serves CUBLAS_COMPUTE_32F)",
                (int)d->compute);
  if (d->scale != CUDA_R_32F)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "scale type %d with 32F compute", d->scale);
  const bool types_ok = A->type == B->type && C->type == D->type &&
                        ((A->type == CUDA_R_16BF && (D->type == CUDA_R_16BF || D->type == CUDA_R_32F)) ||
                         (A->type == CUDA_R_32F && D->type == CUDA_R_32F));
  if (!types_ok)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                "types A %d, B %d, C %d, D %d are not a cuBLASLt combination for "
                "CUBLAS_COMPUTE_32F (A = B in 16BF or 32F, C = D in 16BF or 32F, 32F operands with 32F output)",
                A->type, B->type, C->type, D->type);
  if (d->epilogue != CUBLASLT_EPILOGUE_DEFAULT && d->epilogue != CUBLASLT_EPILOGUE_BIAS)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "epilogue %u (the emulator serves DEFAULT and BIAS)", d->epilogue);
  if (d->epilogue == CUBLASLT_EPILOGUE_BIAS && d->bias_type != -1 && d->bias_type != (int32_t)D->type)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "bias data type %d with D of type %d: bias elements have D's type",
                d->bias_type, D->type);
  *out = shape{m, n, k};
  return CUBLAS_STATUS_SUCCESS;
}

uint32_t alignment_of(const void *p) {
  uint32_t a = 256;
  while (a > 1 && (uintptr_t)p % a) a >>= 1;
  return a;
}

// Device memory covering a whole (batched) matrix.
void check_operand(const char *what, const void *p, cublasLtMatrixLayout_t l) {
  if (l->rows == 0 || l->cols == 0) return;
  const int64_t batch = l->batch > 1 ? l->batch : 1;
  const allocation *a = NULL;
  if (classify(p, &a) != PTR_DEVICE)
    fatal("cuBLASLt reads and writes device memory only", "cublasLtMatmul: %s at %p is not device memory", what, p);
  const size_t last = (size_t)((batch - 1) * l->stride + (int64_t)(l->cols - 1) * l->ld + (int64_t)l->rows);
  const size_t bytes = last * tsize(l->type);
  if ((uintptr_t)p + bytes > a->base + a->size) {
    char desc[600];
    describe_allocation(a, desc, sizeof desc);
    fatal(
        "check the layouts (rows, cols, ld, batch count and stride)",
        "cublasLtMatmul: %s (%llu x %llu, ld %lld, batch %d, stride %lld) at %p ends %zu bytes past the end of the %s",
        what, (unsigned long long)l->rows, (unsigned long long)l->cols, (long long)l->ld, l->batch,
        (long long)l->stride, p, (size_t)((uintptr_t)p + bytes - a->base - a->size), desc);
  }
}

} // namespace

extern "C" cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  if (!handle) return CUBLAS_STATUS_INVALID_VALUE;
  if (device_count() == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
  *handle = new cublasLtContext{1};
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType,
                                                   cudaDataType_t scaleType) {
  if (!desc) return CUBLAS_STATUS_INVALID_VALUE;
  *desc = new cublasLtMatmulDescOpaque_t{computeType, scaleType,   CUBLASLT_POINTER_MODE_HOST,
                                         CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT,
                                         NULL,        0,           -1};
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  delete desc;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                                         const void *buf, size_t size) {
  const char *call = "cublasLtMatmulDescSetAttribute";
  if (!d) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_DESC_POINTER_MODE: return set(&d->pointer_mode, buf, size, call, "POINTER_MODE");
  case CUBLASLT_MATMUL_DESC_TRANSA: return set(&d->transa, buf, size, call, "TRANSA");
  case CUBLASLT_MATMUL_DESC_TRANSB: return set(&d->transb, buf, size, call, "TRANSB");
  case CUBLASLT_MATMUL_DESC_EPILOGUE: return set(&d->epilogue, buf, size, call, "EPILOGUE");
  case CUBLASLT_MATMUL_DESC_BIAS_POINTER: return set(&d->bias, buf, size, call, "BIAS_POINTER");
  case CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE: return set(&d->bias_batch_stride, buf, size, call, "BIAS_BATCH_STRIDE");
  case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: return set(&d->bias_type, buf, size, call, "BIAS_DATA_TYPE");
  default: return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
  }
}

extern "C" cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType_t type, uint64_t rows,
                                                     uint64_t cols, int64_t ld) {
  if (!layout) return CUBLAS_STATUS_INVALID_VALUE;
  *layout = new cublasLtMatrixLayoutOpaque_t{type, CUBLASLT_ORDER_COL, 1, rows, cols, ld, 0};
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  delete layout;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l,
                                                           cublasLtMatrixLayoutAttribute_t attr, const void *buf,
                                                           size_t size) {
  const char *call = "cublasLtMatrixLayoutSetAttribute";
  if (!l) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATRIX_LAYOUT_ORDER: return set(&l->order, buf, size, call, "ORDER");
  case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: {
    cublasStatus_t st = set(&l->batch, buf, size, call, "BATCH_COUNT");
    if (st == CUBLAS_STATUS_SUCCESS && l->batch < 1)
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "BATCH_COUNT %d < 1", l->batch);
    return st;
  }
  case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: {
    cublasStatus_t st = set(&l->stride, buf, size, call, "STRIDED_BATCH_OFFSET");
    if (st == CUBLAS_STATUS_SUCCESS && l->stride < 0)
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "STRIDED_BATCH_OFFSET %lld < 0", (long long)l->stride);
    return st;
  }
  default: return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
  }
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref) {
  if (!pref) return CUBLAS_STATUS_INVALID_VALUE;
  *pref = new cublasLtMatmulPreferenceOpaque_t{0, {256, 256, 256, 256}}; // cuBLASLt's defaults
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                               cublasLtMatmulPreferenceAttributes_t attr,
                                                               const void *buf, size_t size) {
  const char *call = "cublasLtMatmulPreferenceSetAttribute";
  if (!p) return CUBLAS_STATUS_INVALID_VALUE;
  switch (attr) {
  case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: return set(&p->max_ws, buf, size, call, "MAX_WORKSPACE_BYTES");
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: return set(&p->align[0], buf, size, call, "MIN_ALIGNMENT_A_BYTES");
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: return set(&p->align[1], buf, size, call, "MIN_ALIGNMENT_B_BYTES");
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: return set(&p->align[2], buf, size, call, "MIN_ALIGNMENT_C_BYTES");
  case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: return set(&p->align[3], buf, size, call, "MIN_ALIGNMENT_D_BYTES");
  default: return fail(CUBLAS_STATUS_NOT_SUPPORTED, call, "attribute %d is not emulated", (int)attr);
  }
}

extern "C" cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                                         cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                                         cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                                         cublasLtMatmulPreference_t pref, int requested,
                                                         cublasLtMatmulHeuristicResult_t results[], int *returned) {
  const char *call = "cublasLtMatmulAlgoGetHeuristic";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!pref || requested < 1 || !results || !returned)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "preference %p, requested %d, results %p, returned %p", (void *)pref,
                requested, (void *)results, (void *)returned);
  *returned = 0;
  shape s;
  cublasStatus_t st = check_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  for (int i = 0; i < 4; i++)
    if (pref->align[i] == 0 || (pref->align[i] & (pref->align[i] - 1)))
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "minimum alignment %u is not a power of 2", pref->align[i]);
  cublasLtMatmulHeuristicResult_t r;
  memset(&r, 0, sizeof r);
  r.algo.data[0] = kAlgoMagic;
  r.algo.data[1] = pref->max_ws < kAlgoWorkspace ? pref->max_ws : kAlgoWorkspace;
  for (int i = 0; i < 4; i++) r.algo.data[2 + i] = pref->align[i];
  r.workspaceSize = (size_t)r.algo.data[1];
  r.state = CUBLAS_STATUS_SUCCESS, r.wavesCount = 1.0f;
  results[0] = r;
  *returned = 1;
  return CUBLAS_STATUS_SUCCESS;
}

extern "C" cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha,
                                         const void *A, cublasLtMatrixLayout_t Adesc, const void *B,
                                         cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                                         cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                                         const cublasLtMatmulAlgo_t *algo, void *workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  const char *call = "cublasLtMatmul";
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  std::lock_guard<std::recursive_mutex> g(lock());
  shape s;
  cublasStatus_t st = check_problem(call, desc, Adesc, Bdesc, Cdesc, Ddesc, &s);
  if (st != CUBLAS_STATUS_SUCCESS) return st;
  if (!alpha || !beta) return fail(CUBLAS_STATUS_INVALID_VALUE, call, "alpha or beta is NULL");
  if (C == D && (Cdesc->ld != Ddesc->ld || Cdesc->type != Ddesc->type || Cdesc->stride != Ddesc->stride))
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "in-place C = D needs identical C and D layouts (ld %lld vs %lld)",
                (long long)Cdesc->ld, (long long)Ddesc->ld);
  const bool dev_mode = desc->pointer_mode == CUBLASLT_POINTER_MODE_DEVICE;
  if (desc->epilogue == CUBLASLT_EPILOGUE_BIAS && !desc->bias)
    return fail(CUBLAS_STATUS_INVALID_VALUE, call, "the BIAS epilogue without a BIAS_POINTER");
  if (algo) {
    if (algo->data[0] != kAlgoMagic)
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "algo did not come from cublasLtMatmulAlgoGetHeuristic");
    const void *ptrs[4] = {A, B, C, D};
    const char *names = "ABCD";
    for (int i = 0; i < 4; i++)
      if (ptrs[i] && alignment_of(ptrs[i]) < algo->data[2 + i])
        return fail(CUBLAS_STATUS_NOT_SUPPORTED, call,
                    "matrix %c at %p is %u-byte aligned, but the algorithm was "
                    "chosen for %llu-byte alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_%c_BYTES)",
                    names[i], ptrs[i], alignment_of(ptrs[i]), (unsigned long long)algo->data[2 + i], names[i]);
    if (workspace_bytes < algo->data[1])
      return fail(CUBLAS_STATUS_INVALID_VALUE, call, "workspace of %zu bytes, the algorithm needs %llu",
                  workspace_bytes, (unsigned long long)algo->data[1]);
  }
  if (workspace_bytes > 0) {
    const allocation *a = NULL;
    if (classify(workspace, &a) != PTR_DEVICE || (uintptr_t)workspace + workspace_bytes > a->base + a->size)
      fatal("the workspace is device memory of at least workspaceSizeInBytes",
            "cublasLtMatmul: workspace %p is not %zu bytes of device memory", workspace, workspace_bytes);
  }
  const float beta_host = dev_mode ? 1.0f : *(const float *)beta;
  check_operand("A", A, Adesc), check_operand("B", B, Bdesc), check_operand("D", D, Ddesc);
  if (dev_mode || beta_host != 0.0f) check_operand("C", C, Cdesc);
  if (desc->bias) {
    cublasLtMatrixLayoutOpaque_t bl = {Ddesc->type, CUBLASLT_ORDER_COL, 1, (uint64_t)s.m, 1, s.m, 0};
    check_operand("the bias", desc->bias, &bl);
  }
  gemm_problem p = {};
  p.ta = desc->transa != CUBLAS_OP_N, p.tb = desc->transb != CUBLAS_OP_N, p.m = s.m, p.n = s.n, p.k = s.k;
  p.alpha = dev_mode ? 0.0f : *(const float *)alpha, p.beta = beta_host;
  p.A = A, p.B = B, p.C = C, p.D = D, p.at = Adesc->type, p.bt = Bdesc->type, p.ct = Cdesc->type, p.dt = Ddesc->type;
  p.lda = Adesc->ld, p.ldb = Bdesc->ld, p.ldc = Cdesc->ld, p.ldd = Ddesc->ld;
  p.bias = desc->epilogue == CUBLASLT_EPILOGUE_BIAS ? desc->bias : NULL, p.bias_t = Ddesc->type;
  const int batch = Ddesc->batch;
  const int64_t sa = Adesc->stride * tsize(p.at), sb = Bdesc->stride * tsize(p.bt), sc = Cdesc->stride * tsize(p.ct),
                sd = Ddesc->stride * tsize(p.dt), sbias = desc->bias_batch_stride * tsize(p.dt);
  const float *dalpha = (const float *)alpha, *dbeta = (const float *)beta;
  enqueue(stream, call, [=] {
    gemm_problem q = p;
    if (dev_mode) q.alpha = *dalpha, q.beta = *dbeta; // device pointer mode: read when the product runs
    for (int b = 0; b < batch; b++) {
      gemm_run(q);
      q.A = (const char *)q.A + sa, q.B = (const char *)q.B + sb, q.C = (const char *)q.C + sc;
      q.D = (char *)q.D + sd;
      if (q.bias) q.bias = (const char *)q.bias + sbias;
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}
