// cuDNN's scaled-dot-product attention as the GPU oracle of the block attention: the composite SDPA graph that
// cudnn-frontend builds (MATMUL q·kᵀ → MUL scale → ADD bias → softmax as MAX / SUB / EXP / ADD-reduction / DIV,
// with the statistics max + log Σ → MATMUL p·v), built here by hand through the backend C API, with the DFlash
// block mask as an additive bf16 bias. libcudnn is loaded with dlopen on first use, so nothing else in draftforge
// links against it and a machine without cuDNN only loses this oracle. Forward only; one plan cached per shape.
#include <cudnn_graph.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attn_tiles.h"
#include "kernels/cuda/cu_common.cuh"

namespace {

// ---- the DFlash mask as a bias, and GQA → MHA --------------------------------------------------------------

__global__ void dflash_bias_kernel(int64_t B, int64_t N, int64_t bs, int64_t S, int64_t W, const int32_t *anchors,
                                   const uint8_t *keep, bf16 *bias) {
  const int64_t Q = N * bs, KV = S + Q, n_all = B * Q * KV;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n_all; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = i % KV, qi = i / KV % Q, b = i / KV / Q, n = qi / bs, o = qi % bs;
    bool vis = false;
    if (keep[b * N + n]) {
      const int64_t a = anchors[b * N + n];
      if (j < S)
        vis = df_attn_visible(a, W, bs, o, false, j);
      else
        vis = (j - S) / bs == n && df_attn_visible(a, W, bs, o, true, (j - S) % bs);
    }
    bias[i] = __float2bfloat16_rn(vis ? 0.0f : -30000.0f);
  }
}

__global__ void repeat_kv_kernel(const bf16 *src, bf16 *dst, int64_t BL, int64_t nKV, int64_t nH, int64_t hd) {
  const int64_t n = BL * nH * hd, G = nH / nKV;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const int64_t d = i % hd, h = i / hd % nH, bl = i / hd / nH;
    dst[i] = src[(bl * nKV + h / G) * hd + d];
  }
}

unsigned grid_for(int64_t n) {
  unsigned b = df_cu_blocks(n, 256);
  return b > 65535u * 8u ? 65535u * 8u : b;
}

// ---- libcudnn through dlopen ----------------------------------------------------------------------------------

struct cudnn_api {
  void *lib;
  cudnnStatus_t (*create)(cudnnHandle_t *);
  cudnnStatus_t (*destroy)(cudnnHandle_t);
  cudnnStatus_t (*set_stream)(cudnnHandle_t, cudaStream_t);
  const char *(*error_string)(cudnnStatus_t);
  cudnnStatus_t (*create_desc)(cudnnBackendDescriptorType_t, cudnnBackendDescriptor_t *);
  cudnnStatus_t (*destroy_desc)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*set_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t,
                            const void *);
  cudnnStatus_t (*get_attr)(cudnnBackendDescriptor_t, cudnnBackendAttributeName_t, cudnnBackendAttributeType_t, int64_t,
                            int64_t *, void *);
  cudnnStatus_t (*finalize)(cudnnBackendDescriptor_t);
  cudnnStatus_t (*execute)(cudnnHandle_t, cudnnBackendDescriptor_t, cudnnBackendDescriptor_t);
};

df_status load_api(cudnn_api *a, df_error *err) {
  memset(a, 0, sizeof *a);
  a->lib = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
  if (!a->lib) a->lib = dlopen("libcudnn.so", RTLD_NOW | RTLD_LOCAL);
  if (!a->lib)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "libcudnn.so.9", "install cuDNN 9 or put it on LD_LIBRARY_PATH",
                   "cannot load cuDNN: %s", dlerror());
#define DF_SYM(field, name)                                                                                            \
  do {                                                                                                                 \
    *(void **)&a->field = dlsym(a->lib, name);                                                                         \
    if (!a->field) {                                                                                                   \
      dlclose(a->lib);                                                                                                 \
      a->lib = NULL;                                                                                                   \
      return DF_FAIL(err, DF_ERR_UNSUPPORTED, name, "use cuDNN 9", "libcudnn lacks %s", name);                         \
    }                                                                                                                  \
  } while (0)
  DF_SYM(create, "cudnnCreate");
  DF_SYM(destroy, "cudnnDestroy");
  DF_SYM(set_stream, "cudnnSetStream");
  DF_SYM(error_string, "cudnnGetErrorString");
  DF_SYM(create_desc, "cudnnBackendCreateDescriptor");
  DF_SYM(destroy_desc, "cudnnBackendDestroyDescriptor");
  DF_SYM(set_attr, "cudnnBackendSetAttribute");
  DF_SYM(get_attr, "cudnnBackendGetAttribute");
  DF_SYM(finalize, "cudnnBackendFinalize");
  DF_SYM(execute, "cudnnBackendExecute");
#undef DF_SYM
  return DF_OK;
}

// The deprecated-but-required handle attributes, by value (naming them warns under cuDNN 9.19).
const cudnnBackendAttributeName_t kAttrGraphHandle = (cudnnBackendAttributeName_t)800;
const cudnnBackendAttributeName_t kAttrPlanHandle = (cudnnBackendAttributeName_t)400;

enum { UID_Q = 1, UID_K, UID_V, UID_BIAS, UID_SCALE, UID_O, UID_STATS };

struct sdpa_plan {
  int64_t B, H, Sq, Skv, D;
  cudnnBackendDescriptor_t plan;
  int64_t workspace;
};

// Every descriptor a plan build creates, destroyed together (the plan itself is kept).
struct desc_list {
  cudnnBackendDescriptor_t d[96];
  int n;
};

} // namespace

struct df_cu_sdpa {
  cudnn_api api;
  cudnnHandle_t handle;
  sdpa_plan plans[8];
  int nplans;
  void *workspace;
  size_t workspace_bytes;
};

namespace {

struct builder {
  df_cu_sdpa *p;
  desc_list *keep;
  cudnnStatus_t st;
  const char *what;
};

cudnnBackendDescriptor_t make(builder &b, cudnnBackendDescriptorType_t type) {
  cudnnBackendDescriptor_t d = NULL;
  if (b.st != CUDNN_STATUS_SUCCESS) return NULL;
  b.st = b.p->api.create_desc(type, &d);
  if (b.st != CUDNN_STATUS_SUCCESS) {
    b.what = "cudnnBackendCreateDescriptor";
    return NULL;
  }
  if (b.keep->n < 96) b.keep->d[b.keep->n++] = d;
  return d;
}

void set(builder &b, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t attr, cudnnBackendAttributeType_t type,
         int64_t n, const void *v, const char *what) {
  if (b.st != CUDNN_STATUS_SUCCESS) return;
  b.st = b.p->api.set_attr(d, attr, type, n, v);
  if (b.st != CUDNN_STATUS_SUCCESS) b.what = what;
}

void fin(builder &b, cudnnBackendDescriptor_t d, const char *what) {
  if (b.st != CUDNN_STATUS_SUCCESS) return;
  b.st = b.p->api.finalize(d);
  if (b.st != CUDNN_STATUS_SUCCESS) b.what = what;
}

cudnnBackendDescriptor_t tensor(builder &b, int64_t uid, cudnnDataType_t dt, const int64_t *dims,
                                const int64_t *strides, bool is_virtual, bool by_value) {
  cudnnBackendDescriptor_t t = make(b, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
  const int64_t align = 16;
  set(b, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt, "tensor data type");
  set(b, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims, "tensor dims");
  set(b, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides, "tensor strides");
  set(b, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid, "tensor uid");
  set(b, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align, "tensor alignment");
  set(b, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual, "tensor virtual");
  if (by_value) set(b, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value, "tensor by value");
  fin(b, t, "tensor finalize");
  return t;
}

cudnnBackendDescriptor_t pointwise(builder &b, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t bb, cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t pw = make(b, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  set(b, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode, "pointwise mode");
  set(b, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec, "pointwise precision");
  fin(b, pw, "pointwise finalize");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "pointwise op");
  set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "pointwise x");
  if (bb) set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bb, "pointwise b");
  set(b, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "pointwise y");
  fin(b, op, "pointwise op finalize");
  return op;
}

cudnnBackendDescriptor_t reduction(builder &b, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x,
                                   cudnnBackendDescriptor_t y) {
  cudnnBackendDescriptor_t rd = make(b, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  set(b, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode, "reduction mode");
  set(b, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "reduction precision");
  fin(b, rd, "reduction finalize");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
  set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd, "reduction op");
  set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "reduction x");
  set(b, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "reduction y");
  fin(b, op, "reduction op finalize");
  return op;
}

cudnnBackendDescriptor_t matmul(builder &b, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t bm,
                                cudnnBackendDescriptor_t c) {
  cudnnBackendDescriptor_t mm = make(b, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
  cudnnDataType_t prec = CUDNN_DATA_FLOAT;
  set(b, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &prec, "matmul precision");
  fin(b, mm, "matmul finalize");
  cudnnBackendDescriptor_t op = make(b, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
  set(b, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm, "matmul op");
  set(b, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a, "matmul a");
  set(b, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &bm, "matmul b");
  set(b, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c, "matmul c");
  fin(b, op, "matmul op finalize");
  return op;
}

// The forward graph of one shape, its heuristic engine configs tried in order until one plan finalizes.
df_status build_plan(df_cu_sdpa *p, sdpa_plan *out, df_error *err) {
  desc_list keep = {};
  builder b = {p, &keep, CUDNN_STATUS_SUCCESS, NULL};
  const int64_t B = out->B, H = out->H, Sq = out->Sq, Skv = out->Skv, D = out->D;
  const int64_t qd[4] = {B, H, Sq, D}, qs[4] = {Sq * H * D, D, H * D, 1};
  const int64_t kd[4] = {B, H, D, Skv}, ks[4] = {Skv * H * D, D, 1, H * D}; // kᵀ as a strided view of k
  const int64_t vd[4] = {B, H, Skv, D}, vs[4] = {Skv * H * D, D, H * D, 1};
  const int64_t bd[4] = {B, 1, Sq, Skv}, bst[4] = {Sq * Skv, Sq * Skv, Skv, 1};
  const int64_t one[4] = {1, 1, 1, 1};
  const int64_t sd[4] = {B, H, Sq, Skv}, ss[4] = {H * Sq * Skv, Sq * Skv, Skv, 1};
  const int64_t rd[4] = {B, H, Sq, 1}, rs[4] = {H * Sq, Sq, 1, 1};
  const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
  cudnnBackendDescriptor_t tq = tensor(b, UID_Q, BF, qd, qs, false, false);
  cudnnBackendDescriptor_t tk = tensor(b, UID_K, BF, kd, ks, false, false);
  cudnnBackendDescriptor_t tv = tensor(b, UID_V, BF, vd, vs, false, false);
  cudnnBackendDescriptor_t tb = tensor(b, UID_BIAS, BF, bd, bst, false, false);
  cudnnBackendDescriptor_t tsc = tensor(b, UID_SCALE, F, one, one, false, true);
  cudnnBackendDescriptor_t to = tensor(b, UID_O, BF, qd, qs, false, false);
  cudnnBackendDescriptor_t tst = tensor(b, UID_STATS, F, rd, rs, false, false);
  cudnnBackendDescriptor_t s0 = tensor(b, 101, F, sd, ss, true, false), s1 = tensor(b, 102, F, sd, ss, true, false);
  cudnnBackendDescriptor_t s2 = tensor(b, 103, F, sd, ss, true, false), mx = tensor(b, 104, F, rd, rs, true, false);
  cudnnBackendDescriptor_t s3 = tensor(b, 105, F, sd, ss, true, false), s4 = tensor(b, 106, F, sd, ss, true, false);
  cudnnBackendDescriptor_t sm = tensor(b, 107, F, rd, rs, true, false), lg = tensor(b, 108, F, rd, rs, true, false);
  cudnnBackendDescriptor_t pr = tensor(b, 109, BF, sd, ss, true, false);
  cudnnBackendDescriptor_t ops[11];
  ops[0] = matmul(b, tq, tk, s0);
  ops[1] = pointwise(b, CUDNN_POINTWISE_MUL, s0, tsc, s1);
  ops[2] = pointwise(b, CUDNN_POINTWISE_ADD, s1, tb, s2);
  ops[3] = reduction(b, CUDNN_REDUCE_TENSOR_MAX, s2, mx);
  ops[4] = pointwise(b, CUDNN_POINTWISE_SUB, s2, mx, s3);
  ops[5] = pointwise(b, CUDNN_POINTWISE_EXP, s3, NULL, s4);
  ops[6] = reduction(b, CUDNN_REDUCE_TENSOR_ADD, s4, sm);
  ops[7] = pointwise(b, CUDNN_POINTWISE_LOG, sm, NULL, lg);
  ops[8] = pointwise(b, CUDNN_POINTWISE_ADD, mx, lg, tst);
  ops[9] = pointwise(b, CUDNN_POINTWISE_DIV, s4, sm, pr);
  ops[10] = matmul(b, pr, tv, to);
  cudnnBackendDescriptor_t graph = make(b, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  set(b, graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 11, ops, "graph ops");
  set(b, graph, kAttrGraphHandle, CUDNN_TYPE_HANDLE, 1, &p->handle, "graph handle");
  fin(b, graph, "graph finalize (is this cuDNN too old for fused SDPA?)");
  cudnnBackendDescriptor_t heur = make(b, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
  cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
  set(b, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph, "heuristic graph");
  set(b, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode, "heuristic mode");
  fin(b, heur, "heuristic finalize");
  int64_t count = 0;
  if (b.st == CUDNN_STATUS_SUCCESS) {
    b.st = p->api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL);
    if (b.st != CUDNN_STATUS_SUCCESS) b.what = "heuristic result count";
  }
  if (count > 8) count = 8;
  cudnnBackendDescriptor_t cfgs[8] = {};
  for (int64_t i = 0; i < count; i++) cfgs[i] = make(b, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
  int64_t got = 0;
  if (b.st == CUDNN_STATUS_SUCCESS && count > 0) {
    b.st = p->api.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs);
    if (b.st != CUDNN_STATUS_SUCCESS) b.what = "heuristic results";
  }
  out->plan = NULL;
  cudnnStatus_t last = CUDNN_STATUS_NOT_SUPPORTED;
  for (int64_t i = 0; b.st == CUDNN_STATUS_SUCCESS && i < got && !out->plan; i++) {
    cudnnBackendDescriptor_t plan = NULL;
    if (p->api.create_desc(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan) != CUDNN_STATUS_SUCCESS) continue;
    cudnnStatus_t s = p->api.set_attr(plan, kAttrPlanHandle, CUDNN_TYPE_HANDLE, 1, &p->handle);
    if (s == CUDNN_STATUS_SUCCESS)
      s = p->api.set_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
    if (s == CUDNN_STATUS_SUCCESS) s = p->api.finalize(plan);
    int64_t ws = 0, n = 0;
    if (s == CUDNN_STATUS_SUCCESS)
      s = p->api.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
    if (s == CUDNN_STATUS_SUCCESS) {
      out->plan = plan, out->workspace = ws;
    } else {
      last = s;
      p->api.destroy_desc(plan);
    }
  }
  const cudnnStatus_t st = b.st;
  const char *what = b.what;
  for (int i = keep.n - 1; i >= 0; i--) p->api.destroy_desc(keep.d[i]);
  if (st != CUDNN_STATUS_SUCCESS)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "cudnn_sdpa",
                   "the oracle needs cuDNN >= 9 with fused attention on this GPU", "cuDNN SDPA graph: %s failed: %s",
                   what ? what : "?", p->api.error_string(st));
  if (!out->plan)
    return DF_FAIL(err, DF_ERR_UNSUPPORTED, "cudnn_sdpa", "no cuDNN engine supports this SDPA shape",
                   "none of %lld engine configs built a plan (last: %s)", (long long)got, p->api.error_string(last));
  return DF_OK;
}

} // namespace

extern "C" df_status df_cu_dflash_bias(df_cu_stream s, const df_cu_attn_args *a, void *bias_bf16, df_error *err) {
  const int64_t n = a->B * a->N * a->bs * (a->S + a->N * a->bs);
  if (n <= 0) return DF_OK;
  dflash_bias_kernel<<<grid_for(n), 256, 0, s>>>(a->B, a->N, a->bs, a->S, a->window, a->anchors, a->keep,
                                                 (bf16 *)bias_bf16);
  DF_CU_CHECK_LAUNCH(err, "dflash_bias");
  return DF_OK;
}

extern "C" df_status df_cu_repeat_kv(df_cu_stream s, const void *src, void *dst, int64_t B, int64_t L, int64_t nKV,
                                     int64_t nH, int64_t hd, df_error *err) {
  const int64_t n = B * L * nH * hd;
  if (n <= 0) return DF_OK;
  repeat_kv_kernel<<<grid_for(n), 256, 0, s>>>((const bf16 *)src, (bf16 *)dst, B * L, nKV, nH, hd);
  DF_CU_CHECK_LAUNCH(err, "repeat_kv");
  return DF_OK;
}

extern "C" df_status df_cu_sdpa_create(df_cu_sdpa **out, df_error *err) {
  *out = NULL;
  df_cu_sdpa *p = (df_cu_sdpa *)calloc(1, sizeof *p);
  if (!p) return DF_FAIL(err, DF_ERR_NOMEM, "cudnn_sdpa", NULL, "cannot allocate the SDPA oracle");
  df_status st = load_api(&p->api, err);
  if (st != DF_OK) {
    free(p);
    return st;
  }
  cudnnStatus_t cs = p->api.create(&p->handle);
  if (cs != CUDNN_STATUS_SUCCESS) {
    df_status r = DF_FAIL(err, DF_ERR_UNSUPPORTED, "cudnnCreate", "check the GPU and the cuDNN install",
                          "cudnnCreate failed: %s", p->api.error_string(cs));
    dlclose(p->api.lib);
    free(p);
    return r;
  }
  *out = p;
  return DF_OK;
}

extern "C" void df_cu_sdpa_destroy(df_cu_sdpa *p) {
  if (!p) return;
  for (int i = 0; i < p->nplans; i++) p->api.destroy_desc(p->plans[i].plan);
  if (p->workspace) cudaFree(p->workspace);
  p->api.destroy(p->handle);
  dlclose(p->api.lib);
  free(p);
}

extern "C" df_status df_cu_sdpa_fwd(df_cu_sdpa *p, df_cu_stream s, int64_t B, int64_t H, int64_t Sq, int64_t Skv,
                                    int64_t hd, float scale, const void *q, const void *k, const void *v,
                                    const void *bias, void *out, float *stats, df_error *err) {
  sdpa_plan *pl = NULL;
  for (int i = 0; i < p->nplans; i++)
    if (p->plans[i].B == B && p->plans[i].H == H && p->plans[i].Sq == Sq && p->plans[i].Skv == Skv &&
        p->plans[i].D == hd)
      pl = &p->plans[i];
  if (!pl) {
    if (p->nplans == 8) {
      p->api.destroy_desc(p->plans[0].plan);
      memmove(p->plans, p->plans + 1, sizeof(sdpa_plan) * 7);
      p->nplans = 7;
    }
    pl = &p->plans[p->nplans];
    *pl = (sdpa_plan){.B = B, .H = H, .Sq = Sq, .Skv = Skv, .D = hd, .plan = NULL, .workspace = 0};
    DF_TRY(build_plan(p, pl, err));
    p->nplans++;
  }
  if ((size_t)pl->workspace > p->workspace_bytes) { // the oracle is not a hot path: a synchronous regrow is fine
    if (p->workspace) cudaFree(p->workspace);
    p->workspace = NULL, p->workspace_bytes = 0;
    DF_CU_TRY(err, cudaMalloc(&p->workspace, (size_t)pl->workspace), "cudnn_sdpa workspace");
    p->workspace_bytes = (size_t)pl->workspace;
  }
  desc_list keep = {};
  builder b = {p, &keep, CUDNN_STATUS_SUCCESS, NULL};
  int64_t uids[7] = {UID_Q, UID_K, UID_V, UID_BIAS, UID_SCALE, UID_O, UID_STATS};
  void *ptrs[7] = {(void *)q, (void *)k, (void *)v, (void *)bias, &scale, out, stats};
  cudnnBackendDescriptor_t vp = make(b, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  set(b, vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, 7, uids, "variant pack uids");
  set(b, vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, 7, ptrs, "variant pack pointers");
  set(b, vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &p->workspace, "variant pack workspace");
  fin(b, vp, "variant pack finalize");
  if (b.st == CUDNN_STATUS_SUCCESS) {
    b.st = p->api.set_stream(p->handle, (cudaStream_t)s);
    if (b.st == CUDNN_STATUS_SUCCESS) b.st = p->api.execute(p->handle, pl->plan, vp);
    if (b.st != CUDNN_STATUS_SUCCESS) b.what = "cudnnBackendExecute";
  }
  const cudnnStatus_t st = b.st;
  for (int i = keep.n - 1; i >= 0; i--) p->api.destroy_desc(keep.d[i]);
  if (st != CUDNN_STATUS_SUCCESS)
    return DF_FAIL(err, DF_ERR_INVALID, "cudnn_sdpa", NULL, "%s failed: %s", b.what ? b.what : "?",
                   p->api.error_string(st));
  return DF_OK;
}
