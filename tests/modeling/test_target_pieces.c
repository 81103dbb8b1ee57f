// Target pieces: tied (shared pointer, no lm_head needed), untied, missing keys, [V, H] disagreements,
// sharded targets.
#define _GNU_SOURCE // nftw
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/safetensors.h"
#include "modeling/target_pieces.h"
#include "tests/common/fixture.h"

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  return remove(p);
}

static char g_dir[64];
static void setup(void) {
  snprintf(g_dir, sizeof g_dir, "/tmp/df_tp_test_XXXXXX");
  cr_assert_not_null(mkdtemp(g_dir));
}
static void teardown(void) { nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS); }

enum { V = 10, H = 4 };
static float g_embed[V * H], g_head[V * (H + 1)];

// An HF-like target directory: config.json and model.safetensors with a BF16 embedding and an optional F32
// lm_head of [V, head_h].
static void make_target(const char *embed_key, bool with_head, int head_h) {
  df_test_fill_uniform(g_embed, V * H, 1, -1, 1);
  df_test_fill_uniform(g_head, V * (H + 1), 2, -1, 1);
  char path[160];
  snprintf(path, sizeof path, "%s/config.json", g_dir);
  FILE *fp = fopen(path, "w");
  fputs("{\"vocab_size\": 10, \"hidden_size\": 4}\n", fp);
  fclose(fp);
  df_error err = {0};
  df_st_writer *w;
  DF_ASSERT_OK(df_st_writer_new(&w, &err), &err);
  DF_ASSERT_OK(df_st_writer_add_f32_as(w, embed_key, DF_ST_BF16, 2, (int64_t[]){V, H}, g_embed, &err), &err);
  if (with_head)
    DF_ASSERT_OK(df_st_writer_add(w, "lm_head.weight", DF_ST_F32, 2, (int64_t[]){V, head_h}, g_head, &err), &err);
  float norm[H] = {1, 1, 1, 1};
  DF_ASSERT_OK(df_st_writer_add(w, "model.norm.weight", DF_ST_F32, 1, (int64_t[]){H}, norm, &err), &err);
  snprintf(path, sizeof path, "%s/model.safetensors", g_dir);
  DF_ASSERT_OK(df_st_writer_write(w, path, &err), &err);
  df_st_writer_free(w);
}

static void expect_embed_values(const df_target_pieces *tp) {
  for (int i = 0; i < V * H; i++)
    cr_expect_eq(tp->embed[i], df_st_bf16_to_f32(df_st_f32_to_bf16(g_embed[i])), "embed[%d]", i);
}

Test(target_pieces, tied_shares_the_embedding, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, false, H);
  df_target_pieces tp;
  df_error err = {0};
  df_target_pieces_options o = {.tied = true, .expect_vocab = V, .expect_hidden = H};
  DF_ASSERT_OK(df_target_pieces_load(g_dir, &o, &tp, &err), &err);
  cr_expect(tp.vocab == V && tp.hidden == H && tp.tied);
  cr_expect_eq(tp.lm_head, tp.embed, "tied: one buffer, shared by reference");
  expect_embed_values(&tp);
  df_tensor e = df_target_embed_view(&tp), h = df_target_lm_head_view(&tp);
  cr_expect(e.shape[0] == V && e.shape[1] == H && h.data == e.data);
  df_target_pieces_free(&tp);
  cr_expect_null(tp.embed);
}

Test(target_pieces, tied_ignores_a_present_lm_head, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, true, H);
  df_target_pieces tp;
  df_error err = {0};
  DF_ASSERT_OK(df_target_pieces_load(g_dir, &(df_target_pieces_options){.tied = true}, &tp, &err), &err);
  cr_expect_eq(tp.lm_head, tp.embed);
  df_target_pieces_free(&tp);
}

Test(target_pieces, untied_loads_both, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, true, H);
  df_target_pieces tp;
  df_error err = {0};
  DF_ASSERT_OK(df_target_pieces_load(g_dir, NULL, &tp, &err), &err);
  cr_expect_neq(tp.lm_head, tp.embed);
  cr_expect(!tp.tied);
  expect_embed_values(&tp);
  df_expect_close_elementwise("lm_head", tp.lm_head, g_head, V * H, 0, 0);
  df_target_pieces_free(&tp);
}

Test(target_pieces, untied_without_lm_head_names_the_key, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, false, H);
  df_target_pieces tp;
  df_error err = {0};
  cr_expect_eq(df_target_pieces_load(g_dir, NULL, &tp, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "lm_head.weight") && strstr(err.msg, "lm_head.weight"), "%s [%s]", err.msg, err.where);
  cr_expect(strstr(err.where, g_dir) != NULL, "names the file: %s", err.where);
  cr_expect(strstr(err.hint, "tie_word_embeddings") != NULL, "%s", err.hint);
  cr_expect_null(tp.embed, "nothing handed out on error");
}

Test(target_pieces, missing_or_custom_embed_key, .init = setup, .fini = teardown) {
  make_target("transformer.wte.weight", false, H);
  df_target_pieces tp;
  df_error err = {0};
  cr_expect_eq(df_target_pieces_load(g_dir, &(df_target_pieces_options){.tied = true}, &tp, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, DF_TARGET_EMBED_KEY) != NULL, "%s", err.where);
  df_target_pieces_options o = {.embed_key = "transformer.wte.weight", .tied = true};
  DF_ASSERT_OK(df_target_pieces_load(g_dir, &o, &tp, &err), &err);
  expect_embed_values(&tp);
  df_target_pieces_free(&tp);
}

Test(target_pieces, shape_disagreement_reports_v_and_h, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, true, H + 1);
  df_target_pieces tp;
  df_error err = {0};
  cr_expect_eq(df_target_pieces_load(g_dir, NULL, &tp, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "V=10") && strstr(err.msg, "H=4") && strstr(err.msg, "[10, 5]"), "%s", err.msg);
  cr_expect(strstr(err.where, "lm_head.weight") != NULL);
  // The config's vocab_size / hidden_size are checked when given.
  df_target_pieces_options o = {.tied = true, .expect_vocab = 12};
  cr_expect_eq(df_target_pieces_load(g_dir, &o, &tp, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.msg, "vocab_size=12") && strstr(err.msg, "V=10"), "%s", err.msg);
}

Test(target_pieces, embedding_must_be_a_matrix, .init = setup, .fini = teardown) {
  make_target(DF_TARGET_EMBED_KEY, false, H);
  df_target_pieces tp;
  df_error err = {0};
  df_target_pieces_options o = {.embed_key = "model.norm.weight", .tied = true};
  cr_expect_eq(df_target_pieces_load(g_dir, &o, &tp, &err), DF_ERR_FORMAT);
  cr_expect(strstr(err.where, "model.norm.weight") && strstr(err.msg, "[4]"), "%s", err.msg);
}

Test(target_pieces, sharded_untied_target) {
  df_target_pieces tp;
  df_error err = {0};
  DF_ASSERT_OK(df_target_pieces_load(DF_FIXTURE_DIR "/safetensors/sharded", NULL, &tp, &err), &err);
  cr_expect(tp.vocab == 6 && tp.hidden == 4);
  df_st_file *want;
  DF_ASSERT_OK(df_st_open(DF_FIXTURE_DIR "/safetensors/sharded_expected.safetensors", &want, &err), &err);
  float ref[24];
  DF_ASSERT_OK(df_st_read_f32(want, df_st_find(want, "lm_head.weight"), ref, 24, &err), &err);
  df_expect_close_elementwise("lm_head", tp.lm_head, ref, 24, 0, 0);
  DF_ASSERT_OK(df_st_read_f32(want, df_st_find(want, "model.embed_tokens.weight"), ref, 24, &err), &err);
  df_expect_close_elementwise("embed", tp.embed, ref, 24, 0, 0);
  df_st_close(want);
  df_target_pieces_free(&tp);
}

Test(target_pieces, no_weights_in_directory, .init = setup, .fini = teardown) {
  df_target_pieces tp;
  df_error err = {0};
  cr_expect_eq(df_target_pieces_load(g_dir, NULL, &tp, &err), DF_ERR_IO);
  cr_expect(strstr(err.msg, "model.safetensors") != NULL, "%s", err.msg);
}
