// `draftforge inspect EXPORT` for EAGLE-3 directories (train/export/inspect_export.h): the config keys and tensors
// SGLang's LlamaForCausalLMEagle3 (python/sglang/srt/models/llama_eagle3.py) and vLLM's Eagle3LlamaForCausalLM
// (vllm/model_executor/models/llama_eagle3.py) read, against what draftforge trained (df_draft_config of the same
// file). What each reads, from their loaders:
// - SGLang: midlayer.* (q/k/v fused into qkv_proj without bias; o_proj with a bias when attention_bias), fc (a bias
//   when "bias"), norm, lm_head over draft_vocab_size (absent: the target's head; tie_word_embeddings: the embedding),
//   d2t (hot tokens = d2t + arange), t2d ignored, unknown tensors skipped; capture layers from
//   eagle_config.eagle_aux_hidden_state_layer_ids, each + 1 ("before layer k + 1"), default [2, L/2, L − 3].
// - vLLM: "midlayer." → "layers.0.", other names but lm_head under "model."; q/k/v biases when attention_bias, MLP
//   biases when mlp_bias, norm_before_residual; d2t → draft_id_to_target_id, t2d skipped, an unknown tensor raises;
//   capture layers from the top-level eagle_aux_hidden_state_layer_ids as they stand (vLLM's "before layer" ids),
//   default (2, L/2, L − 3).
// Neither has EAGLE 3.1's fc_norm nor norm_output false.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "modeling/draft_config.h"
#include "modeling/safetensors.h"
#include "train/export/inspect_export.h"

static int64_t int_or(const json_t *root, const char *key, int64_t def, bool *present) {
  const json_t *v = json_object_get(root, key);
  *present = json_is_integer(v);
  return *present ? json_integer_value(v) : def;
}

static void size_key(df_serve_log *log, const json_t *root, const char *key, int64_t def, int64_t want,
                     const char *dflt) {
  bool present;
  const int64_t v = int_or(root, key, def, &present);
  df_serve_line(log, v == want ? "ok" : "PROBLEM", "%-30s %-12lld %s%s", key, (long long)v,
                present ? "top level" : dflt, v == want ? "" : "; draftforge trained another size");
}

// A switch neither server may see on: the trained draft has no such piece.
static void off_key(df_serve_log *log, const json_t *root, const char *key, const char *what) {
  const json_t *v = json_object_get(root, key);
  if (json_is_true(v))
    df_serve_line(log, "PROBLEM", "%-30s true: %s", key, what);
  else
    df_serve_line(log, "ok", "%-30s %-12s", key, v ? "false" : "absent (false)");
}

static void capture_keys(df_serve_log *log, const json_t *root, const df_draft_config *cfg) {
  const json_t *ec = json_object_get(root, "eagle_config");
  const json_t *sg = json_is_object(ec) ? json_object_get(ec, "eagle_aux_hidden_state_layer_ids") : NULL;
  const json_t *vl = json_object_get(root, "eagle_aux_hidden_state_layer_ids");
  const int *want = cfg ? cfg->dflash.target_layer_ids : NULL;
  const bool known = cfg && cfg->dflash.num_target_layer_ids == 3;
  if (!sg) {
    df_serve_line(log, "NOTE",
                  "%-30s absent: SGLang captures its default [2, L/2, L-3] (before-layer ids), right only for "
                  "SpecForge's default [1, L/2-1, L-4]",
                  "eagle_config.aux_layer_ids");
  } else {
    bool same = known && json_array_size(sg) == 3;
    for (size_t i = 0; same && i < 3; i++) same = json_integer_value(json_array_get(sg, i)) == want[i];
    char *t = json_dumps(sg, JSON_COMPACT);
    df_serve_line(log, same || !known ? "ok" : "PROBLEM", "%-30s %-12s SGLang captures the output of these layers",
                  "eagle_config.aux_layer_ids", t ? t : "?");
    free(t);
  }
  if (!vl) {
    df_serve_line(log, "NOTE", "%-30s absent at the top level: vLLM captures its default (2, L/2, L-3)",
                  "eagle_aux_hidden_state_layer_ids");
    return;
  }
  bool same = known && json_array_size(vl) == 3;
  for (size_t i = 0; same && i < 3; i++) same = json_integer_value(json_array_get(vl, i)) == want[i] + 1;
  char *t = json_dumps(vl, JSON_COMPACT);
  df_serve_line(log, same || !known ? "ok" : "PROBLEM", "%-30s %-12s vLLM's before-layer ids (draftforge's + 1)%s",
                "eagle_aux_hidden_state_layer_ids", t ? t : "?", same || !known ? "" : ": another capture");
  free(t);
}

static void config_keys(df_serve_log *log, const json_t *root, const df_draft_config *c) {
  bool p;
  if (c) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads;
    size_key(log, root, "hidden_size", -1, H, "absent");
    size_key(log, root, "intermediate_size", -1, c->intermediate_size, "absent");
    size_key(log, root, "num_hidden_layers", -1, 1, "absent");
    size_key(log, root, "num_attention_heads", -1, nh, "absent");
    size_key(log, root, "num_key_value_heads", nh, c->num_key_value_heads, "LlamaConfig default");
    size_key(log, root, "head_dim", H / nh, c->head_dim, "LlamaConfig default hidden_size / heads");
    size_key(log, root, "vocab_size", -1, c->vocab_size, "absent");
    size_key(log, root, "target_hidden_size", H, c->eagle3.target_hidden_size, "default hidden_size");
  }
  const int64_t D = int_or(root, "draft_vocab_size", -1, &p);
  if (!p)
    df_serve_line(log, "PROBLEM", "%-30s absent: both servers read logits from the target's head, not lm_head",
                  "draft_vocab_size");
  else
    df_serve_line(log, !c || D == c->eagle3.draft_vocab_size ? "ok" : "PROBLEM", "%-30s %-12lld", "draft_vocab_size",
                  (long long)D);
  off_key(log, root, "tie_word_embeddings", "SGLang serves the embedding as lm_head");
  off_key(log, root, "attention_bias", "o_proj (SGLang) and q/k/v (vLLM) get biases the export does not have");
  off_key(log, root, "mlp_bias", "vLLM's MLP gets biases the export does not have");
  off_key(log, root, "bias", "SGLang's fc gets a bias the export does not have");
  off_key(log, root, "norm_before_residual", "vLLM puts hidden_norm before the residual (another computation)");
  off_key(log, root, "fc_norm", "EAGLE 3.1's fc_norm: neither server has it (SGLang skips fc_norm.*, vLLM refuses)");
  const json_t *no = json_object_get(root, "norm_output");
  if (json_is_false(no))
    df_serve_line(log, "PROBLEM", "%-30s false: both servers read logits through norm", "norm_output");
  const char *act = json_string_value(json_object_get(root, "hidden_act"));
  df_serve_line(log, !act || !strcmp(act, "silu") ? "ok" : "PROBLEM", "%-30s %-12s", "hidden_act", act ? act : "silu");
  const json_t *th = json_object_get(root, "rope_theta");
  const double theta = json_is_number(th) ? json_number_value(th) : 10000.0;
  df_serve_line(log, !c || theta == c->rope.theta ? "ok" : "PROBLEM", "%-30s %-12g %s", "rope_theta", theta,
                th ? "top level" : "LlamaConfig default");
  capture_keys(log, root, c);
}

// ---- tensors -----------------------------------------------------------------------------------------------------

typedef struct {
  const char *name;
  int64_t d0, d1;
  bool seen;
} want_t;

static df_status tensors(const char *dir, const df_draft_config *c, df_serve_log *log, df_error *err) {
  if (!c) return DF_OK;
  const int64_t H = c->hidden_size, q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
  const int64_t I = c->intermediate_size, D = c->eagle3.draft_vocab_size;
  want_t w[] = {{"midlayer.self_attn.q_proj.weight", q, 2 * H, false},
                {"midlayer.self_attn.k_proj.weight", kv, 2 * H, false},
                {"midlayer.self_attn.v_proj.weight", kv, 2 * H, false},
                {"midlayer.self_attn.o_proj.weight", H, q, false},
                {"midlayer.mlp.gate_proj.weight", I, H, false},
                {"midlayer.mlp.up_proj.weight", I, H, false},
                {"midlayer.mlp.down_proj.weight", H, I, false},
                {"midlayer.hidden_norm.weight", H, 0, false},
                {"midlayer.input_layernorm.weight", H, 0, false},
                {"midlayer.post_attention_layernorm.weight", H, 0, false},
                {"fc.weight", H, 3 * c->eagle3.target_hidden_size, false},
                {"norm.weight", H, 0, false},
                {"lm_head.weight", D, H, false},
                {"d2t", D, 0, false}};
  const int nw = sizeof w / sizeof *w;
  df_st_model *m = NULL;
  DF_TRY(df_st_model_open(dir, &m, err));
  int unknown = 0;
  for (int i = 0; i < df_st_model_count(m); i++) {
    const df_st_file *f;
    const df_st_tensor *t = df_st_model_at(m, i, &f);
    if (!strcmp(t->name, "t2d") || !strcmp(t->name, "embed_tokens.weight")) continue; // ignored / optional
    int k = 0;
    while (k < nw && strcmp(w[k].name, t->name)) k++;
    if (k == nw) {
      if (unknown++ < 4)
        df_serve_line(log, "PROBLEM", "%-30s unexpected: SGLang skips it, vLLM's loader raises", t->name);
      continue;
    }
    w[k].seen = true;
    const bool shape_ok = t->shape[0] == w[k].d0 && (w[k].d1 ? t->ndim == 2 && t->shape[1] == w[k].d1 : t->ndim == 1);
    if (!shape_ok) df_serve_line(log, "PROBLEM", "%-30s shape does not match the config", t->name);
    if (!strcmp(t->name, "d2t") && df_st_dtype_is_float(t->dtype))
      df_serve_line(log, "PROBLEM", "%-30s %s: the servers index the target vocabulary with it (an integer dtype)",
                    "d2t", df_st_dtype_name(t->dtype));
    if (!strcmp(t->name, "d2t") && shape_ok && !df_st_dtype_is_float(t->dtype)) { // ascending target ids
      float *v = malloc(sizeof(float) * (size_t)D);
      df_status st = v ? df_st_read_f32(f, t, v, D, err) : DF_FAIL(err, DF_ERR_NOMEM, "d2t", NULL, "out of memory");
      int64_t bad = -1;
      for (int64_t d = 0; st == DF_OK && d < D && bad < 0; d++) {
        const double id = d + (double)v[d], prev = d ? d - 1 + (double)v[d - 1] : -1;
        if (id <= prev || id >= (double)c->vocab_size) bad = d;
      }
      free(v);
      if (st != DF_OK) return df_st_model_close(m), st;
      if (bad >= 0)
        df_serve_line(log, "PROBLEM", "%-30s draft id %lld maps outside the ascending target ids", "d2t",
                      (long long)bad);
    }
  }
  df_st_model_close(m);
  int missing = 0;
  for (int k = 0; k < nw; k++)
    if (!w[k].seen) {
      missing++;
      df_serve_line(log, "PROBLEM", "%-30s missing: %s", w[k].name,
                    strcmp(w[k].name, "d2t") ? "served uninitialised" : "the servers map draft ids to nothing");
    }
  if (!missing && !unknown)
    df_serve_line(log, "ok", "%-30s every tensor both loaders fill, shapes as configured", "tensors");
  return DF_OK;
}

df_status df_inspect_eagle3_export(const char *dir, const json_t *root, FILE *out, int *problems, df_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  df_serve_log log = {.out = out};
  const df_draft_config *cfg = NULL;
  df_error perr = {0};
  fprintf(out,
          "serving (SGLang LlamaForCausalLMEagle3 / vLLM Eagle3LlamaForCausalLM): %s\n  class    "
          "LlamaForCausalLMEagle3: stock SGLang (--speculative-algorithm EAGLE3) and vLLM (method eagle3)\n",
          dir);
  if (df_draft_config_from_file(path, &cfg, &perr) != DF_OK)
    fprintf(out, "serving: draftforge cannot read %s (%s); its keys are shown as the servers read them only\n", path,
            perr.msg);
  config_keys(&log, root, cfg);
  df_status st = tensors(dir, cfg, &log, err);
  if (st == DF_OK) {
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    if (dt && !strcmp(dt, "float32"))
      df_serve_line(&log, "NOTE", "%-30s float32: launch with --dtype bfloat16 (or export bfloat16)", "torch_dtype");
    fprintf(out,
            "launch:\n  python -m sglang.launch_server --model-path TARGET --speculative-algorithm EAGLE3 "
            "--speculative-draft-model-path %s --speculative-num-steps 3 --speculative-eagle-topk 1 "
            "--speculative-num-draft-tokens 4\n  vllm serve TARGET --speculative-config "
            "'{\"method\": \"eagle3\", \"model\": \"%s\", \"num_speculative_tokens\": 3}'\n",
            dir, dir);
    fprintf(out, "serving: %d problem(s), %d note(s)\n", log.problems, log.notes);
  }
  *problems = log.problems;
  df_draft_config_free(cfg);
  return st;
}
