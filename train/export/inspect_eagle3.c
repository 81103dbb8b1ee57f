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
// A P-EAGLE export (parallel_drafting true; docs/peagle.md) is vLLM's alone: its Eagle3LlamaForCausalLM with
// speculative_config.parallel_drafting reads layers.N (layer 0 2H wide), mask_hidden (viewed as [1, 3·Ht]),
// embed_tokens, norm_before_residual and the mask token (dflash_config.mask_token_id, else the top level). SGLang's
// class has no parallel drafting and names the layers after the first differently (additional_layers.*, normed by
// hidden_norm), skipping ours silently: it cannot serve one.
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

// A P-EAGLE directory: draftforge's export (parallel_drafting) or a SpecForge checkpoint (PEagleDraftModel).
static bool is_parallel(const json_t *root) {
  const char *a = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
  return json_is_true(json_object_get(root, "parallel_drafting")) || (a && !strcmp(a, "PEagleDraftModel"));
}

// P-EAGLE's own keys, as vLLM's parallel drafting reads them.
static void parallel_keys(df_serve_log *log, const json_t *root, const df_draft_config *c) {
  const json_t *dc = json_object_get(root, "dflash_config");
  const json_t *m = json_is_object(dc) ? json_object_get(dc, "mask_token_id") : NULL;
  if (!m) m = json_object_get(root, "mask_token_id");
  if (!json_is_integer(m))
    df_serve_line(log, "PROBLEM", "%-30s absent: vLLM's parallel drafting has no token for the mask rows",
                  "mask_token_id");
  else
    df_serve_line(log, !c || json_integer_value(m) == c->dflash.mask_token_id ? "ok" : "PROBLEM",
                  "%-30s %-12lld the token of the mask rows", "mask_token_id", (long long)json_integer_value(m));
  const bool nbr = json_is_true(json_object_get(root, "norm_before_residual"));
  df_serve_line(log, !c || nbr == c->eagle3.norm_before_residual ? "ok" : "PROBLEM", "%-30s %-12s",
                "norm_before_residual", nbr ? "true" : "false");
}

static void config_keys(df_serve_log *log, const json_t *root, const df_draft_config *c) {
  bool p;
  const bool parallel = is_parallel(root);
  if (c) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads;
    size_key(log, root, "hidden_size", -1, H, "absent");
    size_key(log, root, "intermediate_size", -1, c->intermediate_size, "absent");
    size_key(log, root, "num_hidden_layers", -1, parallel ? c->num_hidden_layers : 1, "absent");
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
  if (parallel)
    parallel_keys(log, root, c);
  else
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
  char name[64];
  int64_t d0, d1, d2; // d1, d2 0: fewer dimensions
  bool seen;
} want_t;

static int want(want_t *w, int n, const char *name, int64_t d0, int64_t d1, int64_t d2) {
  snprintf(w[n].name, sizeof w[n].name, "%s", name);
  w[n].d0 = d0, w[n].d1 = d1, w[n].d2 = d2, w[n].seen = false;
  return n + 1;
}

// One decoder layer's tensors under prefix (EAGLE-3's midlayer, P-EAGLE's layers.i): q/k/v read win.
static int layer_wants(want_t *w, int n, const char *prefix, const df_draft_config *c, int64_t win, bool first) {
  const int64_t H = c->hidden_size, q = c->num_attention_heads * c->head_dim, kv = c->num_key_value_heads * c->head_dim;
  const int64_t I = c->intermediate_size;
  char b[64];
#define NM(x) (snprintf(b, sizeof b, "%s.%s", prefix, x), b)
  n = want(w, n, NM("self_attn.q_proj.weight"), q, win, 0), n = want(w, n, NM("self_attn.k_proj.weight"), kv, win, 0);
  n = want(w, n, NM("self_attn.v_proj.weight"), kv, win, 0), n = want(w, n, NM("self_attn.o_proj.weight"), H, q, 0);
  n = want(w, n, NM("mlp.gate_proj.weight"), I, H, 0), n = want(w, n, NM("mlp.up_proj.weight"), I, H, 0);
  n = want(w, n, NM("mlp.down_proj.weight"), H, I, 0);
  if (first) n = want(w, n, NM("hidden_norm.weight"), H, 0, 0);
  n = want(w, n, NM("input_layernorm.weight"), H, 0, 0), n = want(w, n, NM("post_attention_layernorm.weight"), H, 0, 0);
#undef NM
  return n;
}

static df_status tensors(const char *dir, const df_draft_config *c, bool parallel, df_serve_log *log, df_error *err) {
  if (!c) return DF_OK;
  const int64_t H = c->hidden_size, D = c->eagle3.draft_vocab_size, W = 3 * c->eagle3.target_hidden_size;
  const int layers = parallel ? (int)c->num_hidden_layers : 1;
  want_t *w = calloc((size_t)(8 + 10 * layers), sizeof *w);
  if (!w) return DF_FAIL(err, DF_ERR_NOMEM, dir, NULL, "out of memory");
  int nw = 0;
  for (int i = 0; i < layers; i++) {
    char prefix[32];
    snprintf(prefix, sizeof prefix, parallel ? "layers.%d" : "midlayer", i);
    nw = layer_wants(w, nw, prefix, c, i == 0 ? 2 * H : H, i == 0);
  }
  nw = want(w, nw, "fc.weight", H, W, 0), nw = want(w, nw, "norm.weight", H, 0, 0);
  nw = want(w, nw, "lm_head.weight", D, H, 0), nw = want(w, nw, "d2t", D, 0, 0);
  if (parallel) { // P-EAGLE's trained embedding and mask_hidden
    nw = want(w, nw, "embed_tokens.weight", c->vocab_size, H, 0);
    nw = want(w, nw, "mask_hidden", 1, 1, W);
  }
  df_st_model *m = NULL;
  DF_TRY(df_st_model_open(dir, &m, err));
  int unknown = 0;
  for (int i = 0; i < df_st_model_count(m); i++) {
    const df_st_file *f;
    const df_st_tensor *t = df_st_model_at(m, i, &f);
    if (!strcmp(t->name, "t2d") || (!parallel && !strcmp(t->name, "embed_tokens.weight"))) continue; // ignored
    int k = 0;
    while (k < nw && strcmp(w[k].name, t->name)) k++;
    if (k == nw) {
      if (unknown++ < 4)
        df_serve_line(log, "PROBLEM", "%-30s unexpected: SGLang skips it, vLLM's loader raises", t->name);
      continue;
    }
    w[k].seen = true;
    const int nd = w[k].d2 ? 3 : w[k].d1 ? 2 : 1;
    const bool shape_ok = t->ndim == nd && t->shape[0] == w[k].d0 && (nd < 2 || t->shape[1] == w[k].d1) &&
                          (nd < 3 || t->shape[2] == w[k].d2);
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
      if (st != DF_OK) return df_st_model_close(m), free(w), st;
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
    df_serve_line(log, "ok", "%-30s every tensor %s, shapes as configured", "tensors",
                  parallel ? "vLLM's loader fills" : "both loaders fill");
  free(w);
  return DF_OK;
}

df_status df_inspect_eagle3_export(const char *dir, const json_t *root, FILE *out, int *problems, df_error *err) {
  char path[4200];
  snprintf(path, sizeof path, "%s/config.json", dir);
  df_serve_log log = {.out = out};
  const df_draft_config *cfg = NULL;
  df_error perr = {0};
  const bool parallel = is_parallel(root);
  if (parallel)
    fprintf(out,
            "serving (vLLM Eagle3LlamaForCausalLM, parallel drafting): %s\n  class    P-EAGLE: vLLM (method eagle3, "
            "parallel_drafting true); SGLang's LlamaForCausalLMEagle3 has no parallel drafting\n",
            dir);
  else
    fprintf(out,
            "serving (SGLang LlamaForCausalLMEagle3 / vLLM Eagle3LlamaForCausalLM): %s\n  class    "
            "LlamaForCausalLMEagle3: stock SGLang (--speculative-algorithm EAGLE3) and vLLM (method eagle3)\n",
            dir);
  if (df_draft_config_from_file(path, &cfg, &perr) != DF_OK)
    fprintf(out, "serving: draftforge cannot read %s (%s); its keys are shown as the servers read them only\n", path,
            perr.msg);
  config_keys(&log, root, cfg);
  df_status st = tensors(dir, cfg, parallel, &log, err);
  if (st == DF_OK) {
    const char *dt = json_string_value(json_object_get(root, "torch_dtype"));
    if (dt && !strcmp(dt, "float32"))
      df_serve_line(&log, "NOTE", "%-30s float32: launch with --dtype bfloat16 (or export bfloat16)", "torch_dtype");
    if (parallel)
      fprintf(out,
              "launch (num_speculative_tokens: at most the training.num_depths it was trained with):\n  vllm serve "
              "TARGET --speculative-config '{\"method\": \"eagle3\", \"model\": \"%s\", \"num_speculative_tokens\": "
              "7, \"parallel_drafting\": true}'\n",
              dir);
    else
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
