// Embedding gather / scatter-add: PyTorch golden data with repeated ids, bad ids (named, nothing written),
// determinism with heavily repeated ids across thread counts, finite differences, argument errors.
//
// Tolerances: the gather is a copy (exact). dtable sums at most 4 fp32 rows per element in id order
// against a float64 reference: 5e-7 · max|dtable| (≤ 3 roundings of partial sums; measured < 6e-8).
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/fixture.h"

Test(embedding, golden_repeated_ids) {
  fx_file *f = fx_load("kernels/embedding_repeated.safetensors");
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  df_tensor table = fx_view(f, "table"), ids = fx_view(f, "ids"), dout = fx_view(f, "dout");
  const int64_t vocab = table.shape[0], hid = table.shape[1], n = df_numel(&ids);
  float *out = calloc((size_t)(n * hid), 4), *dtable = calloc((size_t)(vocab * hid), 4);
  df_tensor tout = df_f32(out, n, hid), tdt = df_f32(dtable, vocab, hid);
  DF_ASSERT_OK(df_embedding_forward(ctx, &table, &ids, &tout, &err), &err);
  df_expect_close_elementwise("out", out, fx_get(f, "out")->data, n * hid, 0.0, 0.0);
  DF_ASSERT_OK(df_embedding_backward(ctx, &dout, &ids, &tdt, &err), &err);
  const float *want = fx_get(f, "dtable")->data;
  df_expect_close("dtable", dtable, want, vocab * hid, 5e-7, 0.0);
  // Rows no id points at stay exactly 0.
  for (int64_t v = 0; v < vocab; v++) {
    bool used = false;
    for (int64_t t = 0; t < n; t++) used |= ((const int32_t *)ids.data)[t] == v;
    for (int64_t j = 0; !used && j < hid; j++)
      cr_expect_eq(dtable[v * hid + j], 0.0f, "row %lld was touched", (long long)v);
  }
  // dtable accumulates: a second call doubles it.
  DF_ASSERT_OK(df_embedding_backward(ctx, &dout, &ids, &tdt, &err), &err);
  for (int64_t i = 0; i < vocab * hid; i++) dtable[i] *= 0.5f;
  df_expect_close("dtable accumulated", dtable, want, vocab * hid, 5e-7, 0.0);
  free(out), free(dtable);
  df_ctx_destroy(ctx);
  fx_free(f);
}

// ids of any shape: [2, 3] ids give [2, 3, H] rows.
Test(embedding, ids_with_leading_dims) {
  float table[4 * 3], out[2 * 3 * 3];
  for (int i = 0; i < 12; i++) table[i] = (float)i;
  int32_t ids[6] = {3, 0, 1, 1, 2, 3};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tt = df_f32(table, 4, 3), ti = df_i32(ids, 2, 3), to = df_f32(out, 2, 3, 3);
  DF_ASSERT_OK(df_embedding_forward(ctx, &tt, &ti, &to, &err), &err);
  for (int t = 0; t < 6; t++)
    for (int j = 0; j < 3; j++) cr_expect_eq(out[t * 3 + j], table[ids[t] * 3 + j], "out[%d][%d]", t, j);
  df_ctx_destroy(ctx);
}

static void expect_untouched(const float *p, int64_t n, float sentinel, const char *what) {
  for (int64_t i = 0; i < n; i++)
    if (p[i] != sentinel) {
      cr_expect_fail("%s[%lld] was written by a failed call", what, (long long)i);
      return;
    }
}

Test(embedding, bad_id_is_named_and_nothing_is_written) {
  float table[5 * 4] = {0}, out[4 * 4], dtable[5 * 4];
  for (int i = 0; i < 16; i++) out[i] = 7.0f;
  for (int i = 0; i < 20; i++) dtable[i] = 7.0f;
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tt = df_f32(table, 5, 4), to = df_f32(out, 4, 4), tdt = df_f32(dtable, 5, 4);

  int32_t too_big[4] = {1, 2, 4, 5}; // V = 5
  df_tensor ti = df_i32(too_big, 4);
  cr_expect_eq(df_embedding_forward(ctx, &tt, &ti, &to, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "ids");
  cr_expect(strstr(err.msg, "ids[3] = 5") != NULL, "message names position and value: %s", err.msg);
  expect_untouched(out, 16, 7.0f, "out");
  cr_expect_eq(df_embedding_backward(ctx, &to, &ti, &tdt, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "ids[3] = 5") != NULL, "message names position and value: %s", err.msg);
  expect_untouched(dtable, 20, 7.0f, "dtable");

  int32_t negative[4] = {-1, 0, 0, 0};
  ti = df_i32(negative, 4);
  cr_expect_eq(df_embedding_forward(ctx, &tt, &ti, &to, &err), DF_ERR_INVALID);
  cr_expect(strstr(err.msg, "ids[0] = -1") != NULL, "message names position and value: %s", err.msg);
  expect_untouched(out, 16, 7.0f, "out");
  cr_expect_eq(df_embedding_backward(ctx, &to, &ti, &tdt, &err), DF_ERR_INVALID);
  expect_untouched(dtable, 20, 7.0f, "dtable");
  df_ctx_destroy(ctx);
}

// Many tokens over few ids, large enough to run in parallel: the scatter must equal a serial sum in token
// order bit for bit, for any thread count (no races, no order change).
Test(embedding, backward_is_deterministic_with_repeats) {
  enum { V = 7, H = 200, T = 3000 };
  float *dout = malloc(sizeof(float) * T * H), *want = calloc(V * H, 4);
  int32_t *ids = malloc(sizeof(int32_t) * T);
  df_test_fill_uniform(dout, (int64_t)T * H, 61, -1, 1);
  for (int t = 0; t < T; t++) ids[t] = (int32_t)((t * 5 + t / 7) % V);
  for (int t = 0; t < T; t++)
    for (int j = 0; j < H; j++) want[ids[t] * H + j] += dout[(int64_t)t * H + j];
  df_tensor td = df_f32(dout, T, H), ti = df_i32(ids, T);
  for (int nt = 1; nt <= 3; nt++) {
    df_ctx *ctx = df_test_cpu_ctx(nt);
    df_error err = {0};
    float *dtable = calloc(V * H, 4);
    df_tensor tdt = df_f32(dtable, V, H);
    DF_ASSERT_OK(df_embedding_backward(ctx, &td, &ti, &tdt, &err), &err);
    cr_expect_eq(memcmp(dtable, want, sizeof(float) * V * H), 0, "%d threads: not the serial token-order sum", nt);
    free(dtable);
    df_ctx_destroy(ctx);
  }
  free(dout), free(want), free(ids);
}

typedef struct {
  df_ctx *ctx;
  df_tensor table, ids, out;
  const float *r;
  int64_t n;
} emb_probe;

static double emb_probe_loss(void *p) {
  emb_probe *ep = p;
  df_error err = {0};
  df_embedding_forward(ep->ctx, &ep->table, &ep->ids, &ep->out, &err);
  const float *o = ep->out.data;
  double s = 0;
  for (int64_t i = 0; i < ep->n; i++) s += (double)ep->r[i] * o[i];
  return s;
}

// out is linear in table: central differences are exact up to fp32 rounding of the probe.
Test(embedding, finite_differences) {
  enum { V = 5, H = 3, T = 6 };
  float table[V * H], out[T * H], r[T * H], dtable[V * H] = {0};
  int32_t ids[T] = {4, 1, 4, 0, 1, 4}; // row 2 and 3 unused: their gradient must be 0
  df_test_fill_uniform(table, V * H, 71, -1, 1);
  df_test_fill_uniform(r, T * H, 72, -1, 1);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  emb_probe ep = {ctx, df_f32(table, V, H), df_i32(ids, T), df_f32(out, T, H), r, T * H};
  df_tensor tr = df_f32(r, T, H), tdt = df_f32(dtable, V, H);
  DF_ASSERT_OK(df_embedding_backward(ctx, &tr, &ep.ids, &tdt, &err), &err);
  df_fd_check("dtable", table, dtable, V * H, emb_probe_loss, &ep, 1e-2, 1e-3, 1e-5, 64);
  df_ctx_destroy(ctx);
}

Test(embedding, rejects_bad_arguments) {
  float table[20] = {0}, out[12] = {0}, dtable[20] = {0};
  int32_t ids[3] = {0, 1, 2};
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  df_tensor tt = df_f32(table, 5, 4), ti = df_i32(ids, 3), to = df_f32(out, 3, 4), tdt = df_f32(dtable, 5, 4);
  df_tensor t1d = df_f32(table, 20);
  cr_expect_eq(df_embedding_forward(ctx, &t1d, &ti, &to, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "table");
  df_tensor ids_f32 = df_f32(table, 3);
  cr_expect_eq(df_embedding_forward(ctx, &tt, &ids_f32, &to, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "ids");
  df_tensor out_wide = df_f32(out, 2, 6);
  cr_expect_eq(df_embedding_forward(ctx, &tt, &ti, &out_wide, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "out");
  df_tensor out_rows = df_f32(out, 2, 4);
  cr_expect_eq(df_embedding_forward(ctx, &tt, &ti, &out_rows, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "out");
  df_tensor dt_1d = df_f32(dtable, 20);
  cr_expect_eq(df_embedding_backward(ctx, &to, &ti, &dt_1d, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dtable");
  df_tensor dout_wide = df_f32(out, 2, 6);
  cr_expect_eq(df_embedding_backward(ctx, &dout_wide, &ti, &tdt, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dout");
  df_ctx_destroy(ctx);
}
