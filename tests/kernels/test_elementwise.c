// fill, scale, cast and gather_rows on the CPU: exact values (bf16 rounding by hand), argument errors naming
// the tensor.
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "tests/common/fixture.h"

Test(elementwise, fill_every_dtype) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  float f[5];
  double d[3];
  int32_t i[4];
  uint8_t u[6];
  uint16_t b[2];
  df_tensor tf = df_f32(f, 5), td = df_view(d, DF_F64, DF_DEV_CPU, 1, DF_SHAPE(3)), ti = df_i32(i, 4), tu = df_u8(u, 6),
            tb = df_view(b, DF_BF16, DF_DEV_CPU, 1, DF_SHAPE(2));
  DF_ASSERT_OK(df_fill(ctx, &tf, 1.5, &err), &err);
  DF_ASSERT_OK(df_fill(ctx, &td, -2.25, &err), &err);
  DF_ASSERT_OK(df_fill(ctx, &ti, 7, &err), &err);
  DF_ASSERT_OK(df_fill(ctx, &tu, 1, &err), &err);
  DF_ASSERT_OK(df_fill(ctx, &tb, 1.0, &err), &err);
  for (int k = 0; k < 5; k++) cr_expect_eq(f[k], 1.5f);
  for (int k = 0; k < 3; k++) cr_expect_eq(d[k], -2.25);
  for (int k = 0; k < 4; k++) cr_expect_eq(i[k], 7);
  for (int k = 0; k < 6; k++) cr_expect_eq(u[k], 1);
  cr_expect_eq(b[0], 0x3f80); // bf16 of 1.0
  DF_ASSERT_OK(df_fill(ctx, &tf, 0.0, &err), &err);
  for (int k = 0; k < 5; k++) cr_expect_eq(f[k], 0.0f);
  cr_expect_eq(df_fill(ctx, &ti, NAN, &err), DF_ERR_INVALID);
  cr_expect_eq(df_fill(ctx, NULL, 0.0, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "t");
  df_ctx_destroy(ctx);
}

Test(elementwise, scale_in_place) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  float x[3] = {1, -2, 4};
  df_tensor t = df_f32(x, 3);
  DF_ASSERT_OK(df_scale(ctx, &t, 0.5f, &err), &err);
  cr_expect(x[0] == 0.5f && x[1] == -1.0f && x[2] == 2.0f);
  cr_expect_eq(df_scale(ctx, &t, INFINITY, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "alpha");
  cr_expect(x[0] == 0.5f, "a refused scale writes nothing");
  df_ctx_destroy(ctx);
}

// bf16 is the top half of the f32 bits, rounded to nearest with ties to even.
Test(elementwise, cast_rounds_to_nearest_even) {
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_error err = {0};
  uint32_t bits[6] = {0x3f800000u,
                      0x3f808000u /* tie, even below */,
                      0x3f818000u /* tie, odd below: up */,
                      0x3f80c000u /* above half: up */,
                      0xbf804000u /* below half: down */,
                      0x7fc00001u /* NaN */};
  float x[6], back[6];
  memcpy(x, bits, sizeof x);
  uint16_t h[6];
  df_tensor tx = df_f32(x, 6), th = df_view(h, DF_BF16, DF_DEV_CPU, 1, DF_SHAPE(6)), tb = df_f32(back, 6);
  DF_ASSERT_OK(df_cast(ctx, &tx, &th, &err), &err);
  const uint16_t want[5] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0xbf80};
  for (int k = 0; k < 5; k++) cr_expect_eq(h[k], want[k], "h[%d] = %#x, want %#x", k, h[k], want[k]);
  cr_expect((h[5] & 0x7f80) == 0x7f80 && (h[5] & 0x7f), "NaN stays NaN (%#x)", h[5]);
  DF_ASSERT_OK(df_cast(ctx, &th, &tb, &err), &err);
  cr_expect_eq(back[0], 1.0f);
  cr_expect_eq(back[2], 1.015625f); // 0x3f820000
  float y[5];
  df_tensor ty = df_f32(y, 5);
  cr_expect_eq(df_cast(ctx, &tx, &ty, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "dst");
  df_ctx_destroy(ctx);
}

Test(elementwise, gather_rows_with_holes) {
  df_ctx *ctx = df_test_cpu_ctx(2);
  df_error err = {0};
  float src[4 * 3];
  for (int k = 0; k < 12; k++) src[k] = (float)k;
  int32_t idx[5] = {2, -1, 0, 3, 2};
  float out[5 * 3];
  memset(out, 0xff, sizeof out);
  df_tensor ts = df_f32(src, 4, 3), ti = df_i32(idx, 5), to = df_f32(out, 5, 3);
  DF_ASSERT_OK(df_gather_rows(ctx, &ts, &ti, &to, &err), &err);
  const int rows[5] = {2, -1, 0, 3, 2};
  for (int r = 0; r < 5; r++)
    for (int j = 0; j < 3; j++) cr_expect_eq(out[r * 3 + j], rows[r] < 0 ? 0.0f : src[rows[r] * 3 + j]);
  idx[3] = 4;
  cr_expect_eq(df_gather_rows(ctx, &ts, &ti, &to, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "idx");
  df_tensor bad = df_f32(out, 5, 2);
  idx[3] = 3;
  cr_expect_eq(df_gather_rows(ctx, &ts, &ti, &bad, &err), DF_ERR_INVALID);
  cr_expect_str_eq(err.where, "out");
  df_ctx_destroy(ctx);
}
