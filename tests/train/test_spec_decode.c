// Speculative decoding on the golden target (tests/fixtures/target/qwen3_gqa_untied_f32) with randomly
// initialized DFlash and DSpark drafts: the output equals plain greedy decoding, whose first token is
// transformers' argmax; the counts add up (every verification commits 1..proposals+1 tokens, τ in range).
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../common/fixture.h"
#include "../common/json_edit.h"
#include "modeling/eagle3_model.h"
#include "modeling/strict_load.h"
#include "train/eval/spec_decode.h"

#define TARGET DF_FIXTURE_DIR "/target/qwen3_gqa_untied_f32"
#define TMP    "/tmp/df_test_spec_decode"

static const df_draft_config *draft_config(bool dspark) {
  json_t *d = df_test_config_doc(dspark ? "tiny-dspark.json" : "tiny-dflash.json");
  df_test_json_set(d, "hidden_size", df_test_json("32"));
  df_test_json_set(d, "vocab_size", df_test_json("96"));
  df_test_json_set(d, "num_target_layers", df_test_json("3"));
  df_test_json_set(d, "head_dim", df_test_json("8"));
  df_test_json_set(d, "intermediate_size", df_test_json("64"));
  df_test_json_set(d, "dflash_config.target_layer_ids", df_test_json("[1, 0]"));
  df_test_json_set(d, "dflash_config.mask_token_id", df_test_json("95"));
  df_test_json_set(d, "initializer_range", df_test_json("0.5"));
  char *text = json_dumps(d, 0);
  json_decref(d);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), &err);
  free(text);
  return cfg;
}

static void write_prompts(const int32_t *ids) {
  cr_assert_eq(system("mkdir -p " TMP), 0);
  FILE *fp = fopen(TMP "/data.jsonl", "w");
  for (int line = 0; line < 3; line++) {
    const int P = 4 + 3 * line;
    fprintf(fp, "{\"input_ids\": [");
    for (int i = 0; i <= P; i++) fprintf(fp, "%s%d", i ? ", " : "", ids[i]);
    fprintf(fp, "], \"loss_mask\": [");
    for (int i = 0; i <= P; i++) fprintf(fp, "%s%d", i ? ", " : "", i == P);
    fprintf(fp, "]}\n");
  }
  fclose(fp);
}

// Speculative decoding of the three prompts on ctx (taken) with a draft initialised from seed 7; the sequences
// go to seq_path.
static df_spec_report decode_on(df_ctx *ctx, bool dspark, const char *seq_path) {
  df_error err = {0};
  df_target *t = NULL;
  DF_ASSERT_OK(df_target_load(TARGET, ctx, &t, &err), &err);
  const df_draft_config *cfg = draft_config(dspark);
  df_draft_model *m = NULL;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, 7, &err), &err);
  df_spec_options o = {.max_new_tokens = 24, .mask_token_id = 95, .sequences_out = seq_path};
  df_spec_report rep;
  DF_ASSERT_OK(df_spec_decode_run(t, m, cfg, TMP "/data.jsonl", &o, &rep, &err), &err);
  df_draft_model_free(m);
  df_draft_config_free(cfg);
  df_target_free(t);
  df_ctx_destroy(ctx);
  return rep;
}

static void run_case(bool dspark) {
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  const int32_t *ids = fx_get(e, "input_ids")->data;
  write_prompts(ids);
  const df_draft_config *cfg = draft_config(dspark);
  df_spec_report rep = decode_on(df_test_cpu_ctx(2), dspark, TMP "/seq.jsonl");
  cr_assert(rep.identical_to_greedy, "first mismatch: prompt %lld token %lld", (long long)rep.first_mismatch_prompt,
            (long long)rep.first_mismatch_pos);
  cr_assert_eq(rep.prompts, 3);
  cr_assert_eq(rep.proposals, dspark ? cfg->block_size : cfg->block_size - 1);
  cr_assert_eq(rep.generated_tokens, 3 * 24);
  cr_assert_eq(rep.target_forwards, rep.verifications + 3);
  cr_assert_geq(rep.committed, rep.generated_tokens - 3, "the last block may overshoot max_new_tokens");
  cr_assert_leq(rep.committed, rep.verifications * (rep.proposals + 1));
  cr_assert(rep.tau >= 1.0 && rep.tau <= rep.proposals + 1, "tau %g", rep.tau);
  cr_assert_eq(rep.reached[0], rep.verifications);
  for (int64_t k = 1; k < rep.proposals; k++) cr_assert_eq(rep.reached[k], rep.accepted[k - 1]);

  // The sequences file holds prompt + greedy output; the first generated token of prompt 0 is transformers'
  // argmax after the first 4 tokens (when its margin decides it).
  const fx_tensor *lg = fx_get(e, "logits");
  const float *z = (const float *)lg->data + 3 * lg->shape[1];
  int best = 0, second = -1;
  for (int v = 1; v < lg->shape[1]; v++)
    if (z[v] > z[best]) best = v;
  for (int v = 0; v < lg->shape[1]; v++)
    if (v != best && (second < 0 || z[v] > z[second])) second = v;
  FILE *fp = fopen(TMP "/seq.jsonl", "r");
  char line[8192];
  cr_assert(fgets(line, sizeof line, fp));
  fclose(fp);
  json_error_t je;
  json_t *row = json_loads(line, 0, &je);
  cr_assert(row, "%s", je.text);
  json_t *got = json_object_get(row, "input_ids");
  cr_assert_eq(json_array_size(got), 4 + 24);
  if (z[best] - z[second] > 1e-3) cr_assert_eq(json_integer_value(json_array_get(got, 4)), best);
  json_decref(row);
  df_spec_report_free(&rep);
  df_draft_config_free(cfg);
  fx_free(e);
}

Test(spec_decode, dflash_output_equals_greedy) { run_case(false); }
Test(spec_decode, dspark_output_equals_greedy) { run_case(true); }

static char *slurp(const char *path) {
  FILE *fp = fopen(path, "rb");
  cr_assert(fp, "cannot open %s", path);
  static char buf[1 << 16];
  const size_t n = fread(buf, 1, sizeof buf - 1, fp);
  fclose(fp);
  buf[n] = 0;
  return strdup(buf);
}

// The decode loop on the strict fake device (its buffers fault on any host dereference): the target's features,
// the block embedding and the draft's output stay on the device, and every count, the per-slot acceptance and the
// sequences equal the CPU run's exactly (the fake device runs the CPU kernels).
static void strict_device_equals_cpu(bool dspark) {
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  write_prompts(fx_get(e, "input_ids")->data);
  fx_free(e);
  df_spec_report a = decode_on(df_test_cpu_ctx(1), dspark, TMP "/seq_cpu.jsonl");
  df_spec_report b = decode_on(df_test_strict_fake_ctx(1), dspark, TMP "/seq_fake.jsonl");
  cr_assert(a.identical_to_greedy && b.identical_to_greedy);
  cr_expect_eq(a.verifications, b.verifications);
  cr_expect_eq(a.target_forwards, b.target_forwards);
  cr_expect_eq(a.committed, b.committed);
  cr_expect_eq(a.generated_tokens, b.generated_tokens);
  cr_assert_eq(a.proposals, b.proposals);
  for (int64_t k = 0; k < a.proposals; k++) {
    cr_expect_eq(a.reached[k], b.reached[k], "slot %lld reached", (long long)k + 1);
    cr_expect_eq(a.accepted[k], b.accepted[k], "slot %lld accepted", (long long)k + 1);
  }
  cr_expect(a.committed > a.verifications, "a random draft that never hits makes the comparison weak");
  char *sa = slurp(TMP "/seq_cpu.jsonl"), *sb = slurp(TMP "/seq_fake.jsonl");
  cr_expect_str_eq(sa, sb);
  free(sa), free(sb);
  df_spec_report_free(&a), df_spec_report_free(&b);
}

Test(spec_decode, dflash_on_the_strict_device_equals_cpu) { strict_device_equals_cpu(false); }
Test(spec_decode, dspark_on_the_strict_device_equals_cpu) { strict_device_equals_cpu(true); }

// The CLI end to end: a random DFlash draft saved as an export directory, `draftforge eval --spec-decode`
// writes the report with its documented keys, exits 0 (output identical to greedy); a missing flag is a
// usage error.
Test(spec_decode, cli_report_has_the_documented_keys) {
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  write_prompts(fx_get(e, "input_ids")->data);
  fx_free(e);
  cr_assert_eq(system("rm -rf " TMP "/export && mkdir -p " TMP "/export"), 0);
  json_t *d = df_test_config_doc("tiny-dflash.json");
  const char *keys[][2] = {{"hidden_size", "32"},
                           {"vocab_size", "96"},
                           {"num_target_layers", "3"},
                           {"head_dim", "8"},
                           {"intermediate_size", "64"},
                           {"dflash_config.target_layer_ids", "[1, 0]"},
                           {"dflash_config.mask_token_id", "95"}};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) df_test_json_set(d, keys[i][0], df_test_json(keys[i][1]));
  cr_assert_eq(json_dump_file(d, TMP "/export/config.json", 0), 0);
  char *text = json_dumps(d, 0);
  json_decref(d);
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "draft", &cfg, &err), &err);
  free(text);
  df_ctx *ctx = df_test_cpu_ctx(1);
  df_draft_model *m = NULL;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, 3, &err), &err);
  DF_ASSERT_OK(
      df_params_save(df_draft_model_params(m), df_draft_model_weights(m), TMP "/export/model.safetensors", NULL, &err),
      &err);
  df_draft_model_free(m);
  df_draft_config_free(cfg);
  df_ctx_destroy(ctx);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "%s eval --spec-decode --target %s --draft %s/export --data %s/data.jsonl --max-new-tokens 12 --out "
           "%s/report.json > %s/cli.log 2>&1",
           DF_DRAFTFORGE_BIN, TARGET, TMP, TMP, TMP, TMP);
  cr_assert_eq(system(cmd), 0, "see " TMP "/cli.log");
  json_error_t je;
  json_t *r = json_load_file(TMP "/report.json", 0, &je);
  cr_assert(r, "%s", je.text);
  const char *want[] = {
      "tau", "tau_simulated", "per_position_acceptance", "generated_tokens", "target_forwards", "identical_to_greedy"};
  for (size_t i = 0; i < sizeof want / sizeof *want; i++)
    cr_assert(json_object_get(r, want[i]), "report lacks '%s'", want[i]);
  cr_assert(json_is_true(json_object_get(r, "identical_to_greedy")));
  cr_assert_eq(json_integer_value(json_object_get(r, "generated_tokens")), 3 * 12);
  cr_assert_eq(json_array_size(json_object_get(r, "per_position_acceptance")), 3); // block 4: 3 proposals
  const double tau = json_real_value(json_object_get(r, "tau")),
               sim = json_real_value(json_object_get(r, "tau_simulated"));
  cr_assert(tau >= 1.0 && tau <= 4.0 && sim >= 1.0 && sim <= 4.0, "tau %g, simulated %g", tau, sim);
  json_decref(r);
  snprintf(cmd, sizeof cmd, "%s eval --spec-decode --target %s --data x.jsonl > /dev/null 2>&1", DF_DRAFTFORGE_BIN,
           TARGET);
  cr_assert_eq(WEXITSTATUS(system(cmd)), 2, "a missing --draft is a usage error");
}

// ---- EAGLE-3: chain drafting with the draft's own KV cache ------------------------------------------------------

static const df_draft_config *eagle3_config(void) {
  static const char text[] =
      "{\"architectures\": [\"LlamaForCausalLMEagle3\"], \"hidden_size\": 32, \"intermediate_size\": 64, "
      "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 16, \"vocab_size\": 96, "
      "\"draft_vocab_size\": 40, \"initializer_range\": 0.5, \"rope_theta\": 10000, "
      "\"eagle_config\": {\"eagle_aux_hidden_state_layer_ids\": [0, 1, 0]}}";
  const df_draft_config *cfg = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_draft_config_from_json(text, strlen(text), "eagle3", &cfg, &err), &err);
  return cfg;
}

// A random EAGLE-3 draft (its mapping: the first 40 ids but every third one shifted, so d2t matters) decoding the
// three prompts on ctx (taken), num_steps tokens per round.
static df_spec_report decode_eagle3(df_ctx *ctx, int64_t num_steps, const char *seq_path) {
  df_error err = {0};
  df_target *t = NULL;
  DF_ASSERT_OK(df_target_load(TARGET, ctx, &t, &err), &err);
  const df_draft_config *cfg = eagle3_config();
  df_draft_model *m = NULL;
  DF_ASSERT_OK(df_draft_model_create(cfg, ctx, &m, &err), &err);
  DF_ASSERT_OK(df_draft_model_init(m, 7, &err), &err);
  int64_t d2t[40];
  uint8_t t2d[96] = {0};
  for (int d = 0; d < 40; d++) d2t[d] = d >= 20 ? 30 : 0, t2d[d + d2t[d]] = 1;
  DF_ASSERT_OK(df_eagle3_vocab_write(df_draft_model_eagle3(m), d2t, t2d, &err), &err);
  df_spec_options o = {.max_new_tokens = 24, .mask_token_id = -1, .num_steps = num_steps, .sequences_out = seq_path};
  df_spec_report rep;
  DF_ASSERT_OK(df_spec_decode_run(t, m, cfg, TMP "/data.jsonl", &o, &rep, &err), &err);
  df_draft_model_free(m);
  df_draft_config_free(cfg);
  df_target_free(t);
  df_ctx_destroy(ctx);
  return rep;
}

Test(spec_decode, eagle3_chain_output_equals_greedy) {
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  write_prompts(fx_get(e, "input_ids")->data);
  fx_free(e);
  for (int64_t steps = 1; steps <= 4; steps += 3) {
    df_spec_report rep = decode_eagle3(df_test_cpu_ctx(2), steps, NULL);
    cr_assert(rep.identical_to_greedy, "%lld steps: first mismatch prompt %lld token %lld", (long long)steps,
              (long long)rep.first_mismatch_prompt, (long long)rep.first_mismatch_pos);
    cr_expect_eq(rep.proposals, steps);
    cr_expect_eq(rep.generated_tokens, 3 * 24);
    cr_expect_eq(rep.target_forwards, rep.verifications + 3);
    cr_expect_leq(rep.committed, rep.verifications * (rep.proposals + 1));
    cr_expect(rep.tau >= 1.0 && rep.tau <= steps + 1, "tau %g", rep.tau);
    for (int64_t k = 1; k < rep.proposals; k++) cr_expect_eq(rep.reached[k], rep.accepted[k - 1]);
    df_spec_report_free(&rep);
  }
}

// The chain on the strict fake device: the draft's KV cache, its hidden states and the target's features stay on
// the device; every count and the sequences equal the CPU run's.
Test(spec_decode, eagle3_on_the_strict_device_equals_cpu) {
  fx_file *e = fx_load("target/qwen3_gqa_untied_f32/expected.safetensors");
  write_prompts(fx_get(e, "input_ids")->data);
  fx_free(e);
  df_spec_report a = decode_eagle3(df_test_cpu_ctx(1), 3, TMP "/e3_cpu.jsonl");
  df_spec_report b = decode_eagle3(df_test_strict_fake_ctx(1), 3, TMP "/e3_fake.jsonl");
  cr_assert(a.identical_to_greedy && b.identical_to_greedy);
  cr_expect_eq(a.verifications, b.verifications);
  cr_expect_eq(a.committed, b.committed);
  for (int64_t k = 0; k < a.proposals; k++) cr_expect_eq(a.accepted[k], b.accepted[k], "slot %lld", (long long)k);
  char *sa = slurp(TMP "/e3_cpu.jsonl"), *sb = slurp(TMP "/e3_fake.jsonl");
  cr_expect_str_eq(sa, sb);
  free(sa), free(sb);
  df_spec_report_free(&a), df_spec_report_free(&b);
}
