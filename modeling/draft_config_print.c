// `draftforge inspect config.json`: every resolved value, defaults included, and the keys kept verbatim.
#include <string.h>

#include "modeling/draft_config_internal.h"
#include "modeling/ffn.h"

#define ROW "  %-36s "

// Top-level keys the parser reads; everything else is listed as kept-but-unused.
static bool known_top_key(const char *key) {
  static const char *const keys[] = {"architectures",
                                     "model_type",
                                     "block_size",
                                     "dflash_config",
                                     "num_target_layers",
                                     "num_hidden_layers",
                                     "layer_types",
                                     "use_sliding_window",
                                     "sliding_window",
                                     "max_window_layers",
                                     "hidden_size",
                                     "intermediate_size",
                                     "num_attention_heads",
                                     "num_key_value_heads",
                                     "head_dim",
                                     "rms_norm_eps",
                                     "rope_theta",
                                     "rope_scaling",
                                     "rope_parameters",
                                     "partial_rotary_factor",
                                     "max_position_embeddings",
                                     "vocab_size",
                                     "attention_bias",
                                     "attention_dropout",
                                     "tie_word_embeddings",
                                     "initializer_range",
                                     "hidden_act",
                                     "dtype",
                                     "torch_dtype",
                                     "target_hidden_size",
                                     "markov_rank",
                                     "markov_head_type",
                                     "enable_confidence_head",
                                     "confidence_head_with_markov",
                                     "emb_dim",
                                     "gru_hidden_dim",
                                     "draft_vocab_size",
                                     "fc_norm",
                                     "norm_output",
                                     "eagle_config",
                                     "eagle_aux_hidden_state_layer_ids",
                                     "pretraining_tp",
                                     "mlp_bias"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (!strcmp(key, keys[i])) return true;
  for (int i = 0; i < df_ffn_num_kinds; i++)
    if (df_ffn_kinds[i]->is_top_level_key(key)) return true;
  return false;
}

static void print_rope(const df_rope_config *r, FILE *fp) {
  fprintf(fp, ROW "%s\n", "rope.type", df_rope_type_name(r->type));
  fprintf(fp, ROW "%g\n", "rope.theta", r->theta);
  if (r->type != DF_ROPE_DEFAULT) fprintf(fp, ROW "%g\n", "rope.factor", r->factor);
  if (r->original_max_position_embeddings)
    fprintf(fp, ROW "%lld\n", "rope.original_max_pos_embeddings", (long long)r->original_max_position_embeddings);
  if (r->type == DF_ROPE_YARN) {
    if (r->has_attention_factor)
      fprintf(fp, ROW "%g\n", "rope.attention_factor", r->attention_factor);
    else
      fprintf(fp, ROW "%s\n", "rope.attention_factor", "(derived from factor / mscale)");
    fprintf(fp, ROW "%g / %g\n", "rope.beta_fast / beta_slow", r->beta_fast, r->beta_slow);
    fprintf(fp, ROW "%g / %g\n", "rope.mscale / mscale_all_dim", r->mscale, r->mscale_all_dim);
    fprintf(fp, ROW "%s\n", "rope.truncate", r->truncate ? "true" : "false");
  }
  if (r->type == DF_ROPE_LLAMA3)
    fprintf(fp, ROW "%g / %g\n", "rope.low / high_freq_factor", r->low_freq_factor, r->high_freq_factor);
}

static void print_dflash(const df_draft_config *cfg, FILE *fp) {
  static const char *const modes[] = {"gqa", "mha"}, *const markov[] = {"vanilla", "gated", "rnn"};
  const df_dflash_config *d = &cfg->dflash;
  if (d->mask_token_id >= 0)
    fprintf(fp, ROW "%lld\n", "dflash.mask_token_id", (long long)d->mask_token_id);
  else
    fprintf(fp, ROW "%s\n", "dflash.mask_token_id", "(unset: the recipe or tokenizer supplies it)");
  fprintf(fp, ROW "[", "dflash.target_layer_ids");
  for (int i = 0; i < d->num_target_layer_ids; i++) fprintf(fp, "%s%d", i ? ", " : "", d->target_layer_ids[i]);
  fprintf(fp, "]  (K = %d%s)\n", d->num_target_layer_ids, d->target_layer_ids_defaulted ? ", default" : "");
  static const char *const projectors[] = {"dflash", "dspark", "domino"};
  fprintf(fp, ROW "%s\n", "dflash.projector_type", projectors[d->projector_type]);
  if (cfg->kind == DF_DRAFT_DOMINO) {
    fprintf(fp, ROW "%lld\n", "dflash.emb_dim", (long long)d->emb_dim);
    fprintf(fp, ROW "%lld\n", "dflash.gru_hidden_dim", (long long)d->gru_hidden_dim);
    fprintf(fp, ROW "%lld\n", "dflash.pure_draft_prefix_len", (long long)d->pure_draft_prefix_len);
    fprintf(fp, ROW "%s\n", "dflash.shift_label", d->shift_label ? "true (next-token labels)" : "false");
    fprintf(fp, ROW "%lld (the first corrected slot)\n", "dflash.suffix_start",
            (long long)(d->shift_label ? d->pure_draft_prefix_len : 1 + d->pure_draft_prefix_len));
  }
  if (cfg->kind != DF_DRAFT_DSPARK) return;
  fprintf(fp, ROW "%s\n", "dflash.attention_mode", modes[d->attention_mode]);
  fprintf(fp, ROW "%lld%s\n", "dflash.markov_rank", (long long)d->markov_rank,
          d->markov_rank ? "" : " (no Markov head)");
  fprintf(fp, ROW "%s\n", "dflash.markov_head_type", markov[d->markov_head_type]);
  fprintf(fp, ROW "%g\n", "dflash.confidence_head_alpha", d->confidence_head_alpha);
  fprintf(fp, ROW "%s\n", "dflash.enable_confidence_head", d->enable_confidence_head ? "true" : "false");
  fprintf(fp, ROW "%s\n", "dflash.confidence_head_with_markov", d->confidence_head_with_markov ? "true" : "false");
}

static void print_layers(const df_draft_config *cfg, FILE *fp) {
  fprintf(fp, ROW "%lld\n", "num_hidden_layers", (long long)cfg->num_hidden_layers);
  fprintf(fp, ROW "[", "layer_types");
  for (int64_t i = 0; i < cfg->num_hidden_layers; i++)
    fprintf(fp, "%s%s", i ? ", " : "", cfg->layer_types[i] == DF_LAYER_SLIDING_ATTENTION ? "sliding" : "full");
  fprintf(fp, "]\n");
  fprintf(fp, ROW "%s\n", "use_sliding_window", cfg->use_sliding_window ? "true" : "false");
  if (cfg->sliding_window)
    fprintf(fp, ROW "%lld\n", "sliding_window", (long long)cfg->sliding_window);
  else
    fprintf(fp, ROW "%s\n", "sliding_window", "(none)");
  fprintf(fp, ROW "%lld\n", "max_window_layers", (long long)cfg->max_window_layers);
}

static bool known_dflash_key(const char *key) {
  static const char *const keys[] = {"mask_token_id",
                                     "target_layer_ids",
                                     "projector_type",
                                     "attention_mode",
                                     "markov_rank",
                                     "markov_head_type",
                                     "confidence_head_alpha",
                                     "enable_confidence_head",
                                     "confidence_head_with_markov",
                                     "pure_draft_prefix_len",
                                     "shift_label",
                                     "emb_dim",
                                     "gru_hidden_dim"};
  for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
    if (!strcmp(key, keys[i])) return true;
  return !strncmp(key, "moe_", 4); // resolved (and checked) with the MoE config
}

// Keys carried for export round trips that change nothing here (bos/eos ids, auto_map, use_cache, ...).
static void print_kept_keys(const df_draft_config *cfg, FILE *fp) {
  const char *key;
  json_t *val;
  int n = 0;
  fprintf(fp, ROW, "kept, not interpreted");
  json_object_foreach((json_t *)cfg->json, key, val) {
    if (!known_top_key(key)) fprintf(fp, "%s%s", n++ ? ", " : "", key);
  }
  json_t *dc = json_object_get(cfg->json, "dflash_config");
  if (json_is_object(dc)) {
    json_object_foreach(dc, key, val) {
      if (!known_dflash_key(key)) fprintf(fp, "%sdflash_config.%s", n++ ? ", " : "", key);
    }
  }
  fprintf(fp, "%s\n", n ? "" : "(none)");
}

void df_draft_config_print(const df_draft_config *cfg, FILE *fp) {
  fprintf(fp, "draft config %s\n", cfg->source);
  fprintf(fp, ROW "%s (%s)\n", "kind", df_draft_kind_name(cfg->kind), cfg->architecture);
  fprintf(fp, ROW "%s\n", "model_type", cfg->model_type);
  if (df_draft_is_eagle(cfg)) {
    df_eagle3_config_print(cfg, fp);
  } else {
    fprintf(fp, ROW "%lld\n", "block_size", (long long)cfg->block_size);
    print_dflash(cfg, fp);
    fprintf(fp, ROW "%lld\n", "num_target_layers", (long long)cfg->num_target_layers);
  }
  print_layers(cfg, fp);
  fprintf(fp, ROW "%lld\n", "hidden_size", (long long)cfg->hidden_size);
  fprintf(fp, ROW "%lld\n", "intermediate_size", (long long)cfg->intermediate_size);
  fprintf(fp, ROW "%lld / %lld\n", "attention / key_value heads", (long long)cfg->num_attention_heads,
          (long long)cfg->num_key_value_heads);
  fprintf(fp, ROW "%lld\n", "head_dim", (long long)cfg->head_dim);
  fprintf(fp, ROW "%g\n", "rms_norm_eps", cfg->rms_norm_eps);
  print_rope(&cfg->rope, fp);
  fprintf(fp, ROW "%lld\n", "max_position_embeddings", (long long)cfg->max_position_embeddings);
  fprintf(fp, ROW "%lld\n", "vocab_size", (long long)cfg->vocab_size);
  fprintf(fp, ROW "%s\n", "attention_bias", cfg->attention_bias ? "true" : "false");
  fprintf(fp, ROW "%s\n", "tie_word_embeddings", cfg->tie_word_embeddings ? "true" : "false");
  fprintf(fp, ROW "%g\n", "initializer_range", cfg->initializer_range);
  fprintf(fp, ROW "%s\n", "hidden_act", cfg->hidden_act);
  fprintf(fp, ROW "%s\n", "torch_dtype", cfg->torch_dtype ? cfg->torch_dtype : "(absent)");
  if (cfg->ffn_kind)
    cfg->ffn_kind->config_print(cfg->moe, fp);
  else
    fprintf(fp, ROW "%s\n", "ffn", "dense");
  int64_t total = 0, active = 0;
  df_draft_config_param_counts(cfg, &total, &active);
  fprintf(fp, ROW "%.4g B total, %.4g B active\n", "parameters", (double)total / 1e9, (double)active / 1e9);
  print_kept_keys(cfg, fp);
}
