// GEMMs through cuBLASLt: row-major calls mapped onto column-major cuBLASLt (Dᵀ = op(B)ᵀ·op(A)ᵀ), fp32 compute
// (CUBLAS_COMPUTE_32F: bf16 operands accumulate in fp32; fp32 operands stay true fp32, no TF32), the BIAS
// epilogue, C ≠ D for fused residual adds, β = 1 accumulation into fp32 weight gradients, strided batches.
// Descriptors and the heuristic's algorithm are cached per shape, dtype and pointer alignment (cuBLASLt assumes
// 256-byte alignment unless told, so the actual alignment is part of the key). One workspace serves every call:
// all GEMMs of a context run on one stream, so they never overlap. The grouped expert GEMMs use
// cublasGemmGroupedBatchedEx with host-side sizes (one cublasGemmEx per expert where C's type differs from A's).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cu_common.cuh"

namespace {

struct gemm_key {
  int32_t ta, tb, ab_dt, cd_dt, bias_dt, has_bias, c_is_d;
  int32_t align_a, align_b, align_c, align_d;
  int64_t M, N, K, lda, ldb, ldc, ldd, batch, sa, sb, sc, sd;
};

struct gemm_entry {
  gemm_key key;
  cublasLtMatmulDesc_t op;
  cublasLtMatrixLayout_t la, lb, lc, ld; // cuBLASLt's A (= our B), B (= our A), C, D
  cublasLtMatmulAlgo_t algo;
};

cudaDataType_t cuda_type(df_dtype dt) { return dt == DF_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

int32_t alignment_of(const void *p) {
  uintptr_t a = (uintptr_t)p;
  int32_t al = 256;
  while (al > 1 && (a % (uintptr_t)al) != 0) al >>= 1;
  return al;
}

df_status lt_fail(df_error *err, cublasStatus_t st, const char *what, const gemm_key *k) {
  return DF_FAIL(err, DF_ERR_INVALID, what, "check the GEMM shapes, strides and 16-byte alignment",
                 "%s failed (cuBLAS status %d) for M=%lld N=%lld K=%lld lda=%lld ldb=%lld ldd=%lld", what, (int)st,
                 (long long)k->M, (long long)k->N, (long long)k->K, (long long)k->lda, (long long)k->ldb,
                 (long long)k->ldd);
}

} // namespace

struct df_cu_gemm_ctx {
  cublasLtHandle_t lt;
  cublasHandle_t blas;
  void *workspace;
  size_t workspace_bytes;
  gemm_entry *entries;
  int n, cap;
};

extern "C" df_status df_cu_gemm_ctx_create(void *lt, void *blas, void *workspace, size_t workspace_bytes,
                                           df_cu_gemm_ctx **out, df_error *err) {
  *out = NULL;
  df_cu_gemm_ctx *g = (df_cu_gemm_ctx *)calloc(1, sizeof *g);
  if (!g) return DF_FAIL(err, DF_ERR_NOMEM, "gemm", NULL, "cannot allocate the GEMM context");
  g->lt = (cublasLtHandle_t)lt;
  g->blas = (cublasHandle_t)blas;
  g->workspace = workspace;
  g->workspace_bytes = workspace_bytes;
  *out = g;
  return DF_OK;
}

static void entry_destroy(gemm_entry *e) {
  if (e->op) cublasLtMatmulDescDestroy(e->op);
  if (e->la) cublasLtMatrixLayoutDestroy(e->la);
  if (e->lb) cublasLtMatrixLayoutDestroy(e->lb);
  if (e->lc) cublasLtMatrixLayoutDestroy(e->lc);
  if (e->ld) cublasLtMatrixLayoutDestroy(e->ld);
}

extern "C" void df_cu_gemm_ctx_destroy(df_cu_gemm_ctx *g) {
  if (!g) return;
  for (int i = 0; i < g->n; i++) entry_destroy(&g->entries[i]);
  free(g->entries);
  free(g);
}

extern "C" int df_cu_gemm_cache_size(const df_cu_gemm_ctx *g) { return g ? g->n : 0; }

static gemm_key key_of(const df_cu_gemm_args *a) {
  gemm_key k;
  memset(&k, 0, sizeof k); // padding included: keys are compared with memcmp
  k.ta = a->trans_a, k.tb = a->trans_b, k.ab_dt = a->ab_dt, k.cd_dt = a->cd_dt;
  k.has_bias = a->bias != NULL, k.bias_dt = a->bias ? a->bias_dt : 0, k.c_is_d = a->C == NULL || a->C == a->D;
  k.align_a = alignment_of(a->A), k.align_b = alignment_of(a->B), k.align_d = alignment_of(a->D);
  k.align_c = k.c_is_d ? k.align_d : alignment_of(a->C);
  k.M = a->M, k.N = a->N, k.K = a->K, k.lda = a->lda, k.ldb = a->ldb, k.ldd = a->ldd;
  k.ldc = k.c_is_d ? a->ldd : a->ldc;
  k.batch = a->batch > 1 ? a->batch : 1;
  if (k.batch > 1) k.sa = a->stride_a, k.sb = a->stride_b, k.sd = a->stride_d, k.sc = k.c_is_d ? k.sd : a->stride_c;
  return k;
}

static cublasStatus_t make_layout(cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld,
                                  int64_t batch, int64_t stride) {
  cublasStatus_t st = cublasLtMatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
  if (st != CUBLAS_STATUS_SUCCESS || batch <= 1) return st;
  int32_t b = (int32_t)batch;
  st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &b, sizeof b);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
  return st;
}

// Builds the descriptors of one shape and asks the heuristic for its best algorithm.
static df_status entry_build(df_cu_gemm_ctx *g, const gemm_key *k, gemm_entry *e, df_error *err) {
  memset(e, 0, sizeof *e);
  e->key = *k;
  cublasStatus_t st = cublasLtMatmulDescCreate(&e->op, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(err, st, "cublasLtMatmulDescCreate", k);
  // Column-major view: our B is cuBLASLt's A, our A its B.
  cublasOperation_t opa = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N, opb = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  st = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  if (st == CUBLAS_STATUS_SUCCESS && k->has_bias) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    cudaDataType_t bt = cuda_type((df_dtype)k->bias_dt);
    st = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (st == CUBLAS_STATUS_SUCCESS)
      st = cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
  }
  if (st != CUBLAS_STATUS_SUCCESS) {
    entry_destroy(e);
    return lt_fail(err, st, "cublasLtMatmulDescSetAttribute", k);
  }
  cudaDataType_t ab = cuda_type((df_dtype)k->ab_dt), cd = cuda_type((df_dtype)k->cd_dt);
  // Stored shapes: B is [K, N] (or [N, K] transposed), A is [M, K] (or [K, M]); a row-major [r, c] matrix is a
  // column-major c × r one with the same leading dimension.
  st = make_layout(&e->la, ab, k->tb ? k->K : k->N, k->tb ? k->N : k->K, k->ldb, k->batch, k->sb);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = make_layout(&e->lb, ab, k->ta ? k->M : k->K, k->ta ? k->K : k->M, k->lda, k->batch, k->sa);
  if (st == CUBLAS_STATUS_SUCCESS) st = make_layout(&e->lc, cd, k->N, k->M, k->ldc, k->batch, k->sc);
  if (st == CUBLAS_STATUS_SUCCESS) st = make_layout(&e->ld, cd, k->N, k->M, k->ldd, k->batch, k->sd);
  if (st != CUBLAS_STATUS_SUCCESS) {
    entry_destroy(e);
    return lt_fail(err, st, "cublasLtMatrixLayoutCreate", k);
  }
  cublasLtMatmulPreference_t pref = NULL;
  st = cublasLtMatmulPreferenceCreate(&pref);
  uint64_t ws = g->workspace_bytes;
  uint32_t al[4] = {(uint32_t)k->align_b, (uint32_t)k->align_a, (uint32_t)k->align_c, (uint32_t)k->align_d};
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  for (int i = 0; i < 4 && st == CUBLAS_STATUS_SUCCESS; i++)
    st = cublasLtMatmulPreferenceSetAttribute(pref, which[i], &al[i], sizeof al[i]);
  cublasLtMatmulHeuristicResult_t res;
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(g->lt, e->op, e->la, e->lb, e->lc, e->ld, pref, 1, &res, &found);
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    entry_destroy(e);
    return lt_fail(err, st == CUBLAS_STATUS_SUCCESS ? CUBLAS_STATUS_NOT_SUPPORTED : st,
                   "cublasLtMatmulAlgoGetHeuristic", k);
  }
  e->algo = res.algo;
  return DF_OK;
}

static df_status lookup(df_cu_gemm_ctx *g, const gemm_key *k, gemm_entry **out, df_error *err) {
  for (int i = 0; i < g->n; i++)
    if (!memcmp(&g->entries[i].key, k, sizeof *k)) {
      *out = &g->entries[i];
      return DF_OK;
    }
  if (g->n == g->cap) {
    int cap = g->cap ? 2 * g->cap : 32;
    gemm_entry *grown = (gemm_entry *)realloc(g->entries, sizeof(gemm_entry) * (size_t)cap);
    if (!grown) return DF_FAIL(err, DF_ERR_NOMEM, "gemm", NULL, "cannot grow the GEMM descriptor cache");
    g->entries = grown, g->cap = cap;
  }
  DF_TRY(entry_build(g, k, &g->entries[g->n], err));
  *out = &g->entries[g->n++];
  return DF_OK;
}

extern "C" df_status df_cu_gemm(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_gemm_args *a, df_error *err) {
  if ((a->ab_dt != DF_F32 && a->ab_dt != DF_BF16) || (a->cd_dt != DF_F32 && a->cd_dt != DF_BF16))
    return df_cu_bad_dtype(err, "gemm", a->ab_dt != DF_F32 && a->ab_dt != DF_BF16 ? a->ab_dt : a->cd_dt);
  if (a->M <= 0 || a->N <= 0) return DF_OK; // an empty output
  const gemm_key k = key_of(a);
  if (a->K <= 0) { // no product: D = beta·C (+ bias would need a kernel; callers never ask for it)
    if (a->bias) return DF_FAIL(err, DF_ERR_INVALID, "gemm", NULL, "a bias epilogue with K = 0 is not supported");
    if (a->beta == 1.0f && k.c_is_d) return DF_OK;
    if (a->beta == 0.0f && k.c_is_d && a->ldd == a->N && k.batch == 1)
      return df_cu_fill(s, a->D, a->cd_dt, a->M * a->N, 0.0f, err);
    return DF_FAIL(err, DF_ERR_INVALID, "gemm", NULL, "K = 0 is supported with beta 0 or 1 and C = D only");
  }
  gemm_entry *e = NULL;
  DF_TRY(lookup(g, &k, &e, err));
  if (a->bias) {
    cublasStatus_t st =
        cublasLtMatmulDescSetAttribute(e->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &a->bias, sizeof a->bias);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(err, st, "cublasLtMatmulDescSetAttribute(bias)", &k);
  }
  const void *C = k.c_is_d ? a->D : a->C;
  cublasStatus_t st = cublasLtMatmul(g->lt, e->op, &a->alpha, a->B, e->la, a->A, e->lb, &a->beta, C, e->lc, a->D, e->ld,
                                     &e->algo, g->workspace, g->workspace_bytes, (cudaStream_t)s);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_fail(err, st, "cublasLtMatmul", &k);
  return DF_OK;
}

// ---- grouped expert GEMMs ------------------------------------------------------------------------------------

namespace {

constexpr int kMaxGroups = 1024;

// The host-built pointer arrays, passed by value (kernel parameters up to 32 KiB on sm_70+), so writing them into
// device memory is ordered on the stream and needs no pinned staging buffer.
struct ptr_table {
  const void *p[3 * 512];
};

__global__ void store_ptrs(ptr_table t, int n, const void **dst) {
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = t.p[i];
}

} // namespace

extern "C" size_t df_cu_grouped_workspace(int E) { return sizeof(void *) * 3 * (size_t)(E > 0 ? E : 1); }

// Writes the 3·n pointer arrays (A, B, C of every group) into workspace, 512 groups per launch.
static df_status upload_ptrs(df_cu_stream s, const void *const *h, int groups, void *workspace, df_error *err) {
  const void **dst = (const void **)workspace;
  for (int which = 0; which < 3; which++)
    for (int g0 = 0; g0 < groups; g0 += 3 * 512) {
      int n = groups - g0 < 3 * 512 ? groups - g0 : 3 * 512;
      ptr_table t;
      memcpy(t.p, h + (size_t)which * groups + g0, sizeof(void *) * (size_t)n);
      store_ptrs<<<1, 256, 0, (cudaStream_t)s>>>(t, n, dst + (size_t)which * groups + g0);
      DF_CU_CHECK_LAUNCH(err, "gemm_grouped.store_ptrs");
    }
  return DF_OK;
}

typedef struct {
  cublasOperation_t ta[kMaxGroups], tb[kMaxGroups];
  int m[kMaxGroups], n[kMaxGroups], k[kMaxGroups], lda[kMaxGroups], ldb[kMaxGroups], ldc[kMaxGroups];
  int size[kMaxGroups];
  float alpha[kMaxGroups], beta[kMaxGroups];
  const void *ptrs[3 * kMaxGroups];
} grouped_host;

// cublasGemmGroupedBatchedEx takes A, B and C of one type only (bf16, fp16 or fp32: cuBLAS's table of supported
// types); bf16 operands into fp32 C (fp32 weight gradients and outputs) run as one cublasGemmEx per group instead, on
// the same stream, from the host pointers (no upload).
static df_status run_per_group(df_cu_gemm_ctx *g, df_cu_stream s, const grouped_host *h, int groups, df_dtype ab_dt,
                               df_dtype c_dt, df_error *err) {
  cublasStatus_t st = cublasSetStream(g->blas, (cudaStream_t)s);
  for (int i = 0; i < groups && st == CUBLAS_STATUS_SUCCESS; i++)
    st = cublasGemmEx(g->blas, h->ta[i], h->tb[i], h->m[i], h->n[i], h->k[i], &h->alpha[i], h->ptrs[i],
                      cuda_type(ab_dt), h->lda[i], h->ptrs[kMaxGroups + i], cuda_type(ab_dt), h->ldb[i], &h->beta[i],
                      (void *)h->ptrs[2 * kMaxGroups + i], cuda_type(c_dt), h->ldc[i], CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    return DF_FAIL(err, DF_ERR_INVALID, "cublasGemmEx", "check the expert shapes and dtypes",
                   "grouped GEMM (one cublasGemmEx per expert) over %d experts failed (cuBLAS status %d)", groups,
                   (int)st);
  return DF_OK;
}

static df_status run_grouped(df_cu_gemm_ctx *g, df_cu_stream s, grouped_host *h, int groups, df_dtype ab_dt,
                             df_dtype c_dt, void *workspace, df_error *err) {
  if (groups == 0) return DF_OK;
  if (ab_dt != c_dt) return run_per_group(g, s, h, groups, ab_dt, c_dt, err);
  // Pack the pointers of the used groups contiguously: A[0..groups), B, C.
  const void *packed[3 * kMaxGroups];
  for (int w = 0; w < 3; w++)
    for (int i = 0; i < groups; i++) packed[(size_t)w * groups + i] = h->ptrs[(size_t)w * kMaxGroups + i];
  DF_TRY(upload_ptrs(s, packed, groups, workspace, err));
  const void *const *dA = (const void *const *)workspace;
  const void *const *dB = dA + groups;
  void *const *dC = (void *const *)(dA + 2 * groups);
  cublasStatus_t st = cublasSetStream(g->blas, (cudaStream_t)s);
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasGemmGroupedBatchedEx(g->blas, h->ta, h->tb, h->m, h->n, h->k, h->alpha, dA, cuda_type(ab_dt), h->lda, dB,
                                    cuda_type(ab_dt), h->ldb, h->beta, dC, cuda_type(c_dt), h->ldc, groups, h->size,
                                    CUBLAS_COMPUTE_32F);
  if (st != CUBLAS_STATUS_SUCCESS)
    return DF_FAIL(err, DF_ERR_INVALID, "cublasGemmGroupedBatchedEx", "check the expert shapes and dtypes",
                   "grouped GEMM over %d experts failed (cuBLAS status %d)", groups, (int)st);
  return DF_OK;
}

static size_t dt_bytes(df_dtype dt) { return dt == DF_BF16 ? 2 : 4; }

extern "C" df_status df_cu_gemm_grouped(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_grouped_args *a, void *workspace,
                                        df_error *err) {
  if (a->E > kMaxGroups)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "gemm_grouped", "use at most 1024 experts per layer", "E = %d", a->E);
  grouped_host *h = (grouped_host *)malloc(sizeof *h);
  if (!h) return DF_FAIL(err, DF_ERR_NOMEM, "gemm_grouped", NULL, "cannot allocate the grouped GEMM tables");
  const size_t ab = dt_bytes(a->ab_dt), db = dt_bytes(a->d_dt);
  int groups = 0;
  for (int e = 0; e < a->E; e++) {
    int rows = a->h_rows[e];
    if (rows <= 0) continue;
    // Column-major: D_eᵀ (N × rows) = op(W_e) · X_eᵀ.
    h->ta[groups] = a->trans_w ? CUBLAS_OP_T : CUBLAS_OP_N;
    h->tb[groups] = CUBLAS_OP_N;
    h->m[groups] = (int)a->N, h->n[groups] = rows, h->k[groups] = (int)a->K;
    h->lda[groups] = (int)(a->trans_w ? a->K : a->N), h->ldb[groups] = (int)a->ldx, h->ldc[groups] = (int)a->ldd;
    h->size[groups] = 1, h->alpha[groups] = 1.0f, h->beta[groups] = a->beta;
    h->ptrs[groups] = (const char *)a->W + (size_t)e * (size_t)a->stride_w * ab;
    h->ptrs[kMaxGroups + groups] = (const char *)a->X + (size_t)a->h_offsets[e] * (size_t)a->ldx * ab;
    h->ptrs[2 * kMaxGroups + groups] = (const char *)a->D + (size_t)a->h_offsets[e] * (size_t)a->ldd * db;
    groups++;
  }
  df_status st = run_grouped(g, s, h, groups, a->ab_dt, a->d_dt, workspace, err);
  free(h);
  return st;
}

extern "C" df_status df_cu_gemm_grouped_wgrad(df_cu_gemm_ctx *g, df_cu_stream s, const df_cu_grouped_wgrad_args *a,
                                              void *workspace, df_error *err) {
  if (a->E > kMaxGroups)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "gemm_grouped_wgrad", "use at most 1024 experts per layer", "E = %d", a->E);
  grouped_host *h = (grouped_host *)malloc(sizeof *h);
  if (!h) return DF_FAIL(err, DF_ERR_NOMEM, "gemm_grouped_wgrad", NULL, "cannot allocate the grouped GEMM tables");
  const size_t ab = dt_bytes(a->ab_dt);
  int groups = 0;
  for (int e = 0; e < a->E; e++) {
    int rows = a->h_rows[e];
    if (rows <= 0) continue; // an unused expert adds nothing to its (zeroed) gradient
    // Column-major: dW_eᵀ (K × N) += X_eᵀ (K × rows) · dY_e (rows × N).
    h->ta[groups] = CUBLAS_OP_N, h->tb[groups] = CUBLAS_OP_T;
    h->m[groups] = (int)a->K, h->n[groups] = (int)a->N, h->k[groups] = rows;
    h->lda[groups] = (int)a->ldx, h->ldb[groups] = (int)a->lddy, h->ldc[groups] = (int)a->K;
    h->size[groups] = 1, h->alpha[groups] = 1.0f, h->beta[groups] = 1.0f;
    h->ptrs[groups] = (const char *)a->X + (size_t)a->h_offsets[e] * (size_t)a->ldx * ab;
    h->ptrs[kMaxGroups + groups] = (const char *)a->dY + (size_t)a->h_offsets[e] * (size_t)a->lddy * ab;
    h->ptrs[2 * kMaxGroups + groups] = (const char *)a->dW + (size_t)e * (size_t)a->stride_dw * sizeof(float);
    groups++;
  }
  df_status st = run_grouped(g, s, h, groups, a->ab_dt, DF_F32, workspace, err);
  free(h);
  return st;
}
