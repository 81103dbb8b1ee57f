// CPU embedding gather and its scatter-add backward. Ids are range-checked before anything is written.
// The backward splits the columns across threads and adds dout rows in token order, so repeated ids never
// race and the result is bitwise the same for any thread count.
#include <omp.h>
#include <string.h>

#include "kernels/check.h"

// Below this many elements a call stays on the calling thread.
#define EMB_PAR_MIN 32768
// Floats per 64-byte cache line: backward column ranges are whole lines, so threads do not share lines
// (when rows start on a line boundary, i.e. H is a multiple of 16).
#define EMB_LINE 16

static df_status check_ids(const int32_t *ids, int64_t n, int64_t vocab, df_error *err) {
  for (int64_t t = 0; t < n; t++)
    if (ids[t] < 0 || ids[t] >= vocab)
      return DF_FAIL(err, DF_ERR_INVALID, "ids", "ids must index rows of the embedding table",
                     "ids[%lld] = %d is outside [0, V = %lld)", (long long)t, ids[t], (long long)vocab);
  return DF_OK;
}

static void scatter_add_row(float *dst, const float *src, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; j++) dst[j] += src[j];
}

df_status df_cpu_embedding_forward(df_ctx *ctx, const df_tensor *table, const df_tensor *ids, df_tensor *out,
                                   df_error *err) {
  const int64_t vocab = table->shape[0], hid = table->shape[1], n = df_numel(ids);
  const float *tab = table->data; // [V, H]
  const int32_t *id = ids->data;  // [T]
  float *o = out->data;           // [T, H]
  DF_TRY(check_ids(id, n, vocab, err));
#pragma omp parallel for num_threads(ctx->num_threads) if (n * hid > EMB_PAR_MIN) schedule(static)
  for (int64_t t = 0; t < n; t++) memcpy(o + t * hid, tab + (int64_t)id[t] * hid, sizeof(float) * (size_t)hid);
  return DF_OK;
}

df_status df_cpu_embedding_backward(df_ctx *ctx, const df_tensor *dout, const df_tensor *ids, df_tensor *dtable,
                                    df_error *err) {
  const int64_t vocab = dtable->shape[0], hid = dtable->shape[1], n = df_numel(ids);
  const float *dy = dout->data;  // [T, H]
  const int32_t *id = ids->data; // [T]
  float *dt = dtable->data;      // [V, H]
  DF_TRY(check_ids(id, n, vocab, err));
  // Each thread owns one contiguous range of whole cache lines of columns and walks the tokens in order.
  const int64_t lines = (hid + EMB_LINE - 1) / EMB_LINE;
#pragma omp parallel num_threads(ctx->num_threads) if (n * hid > EMB_PAR_MIN)
  {
    const int64_t nt = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t j0 = lines * me / nt * EMB_LINE, j_end = lines * (me + 1) / nt * EMB_LINE;
    const int64_t j1 = j_end < hid ? j_end : hid;
    for (int64_t t = 0; t < n && j0 < j1; t++) scatter_add_row(dt + (int64_t)id[t] * hid, dy + t * hid, j0, j1);
  }
  return DF_OK;
}

// This file's slots of the CPU backend table (kernels/cpu/backend.c).
void df_cpu_register_embedding(df_backend *be) {
  be->embedding_forward = df_cpu_embedding_forward;
  be->embedding_backward = df_cpu_embedding_backward;
}
