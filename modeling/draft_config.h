// The draft-model config (SpecForge/HF config.json form of a DFlash or DSpark draft), resolved once into an
// immutable, validated struct with every default filled in; the source JSON is kept for export round trips.
#ifndef DF_MODELING_DRAFT_CONFIG_H
#define DF_MODELING_DRAFT_CONFIG_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

struct df_target_config;
struct df_moe_config; // opaque here: the "moe" FFN kind's config (moe/config.h)
struct df_ffn_kind;   // modeling/ffn.h

// Caps that keep a hostile file from asking for absurd allocations; far above any real draft.
enum {
  DF_DRAFT_MAX_LAYERS = 1024,       // num_hidden_layers, and target layer ids K
  DF_DRAFT_MAX_TARGET_LAYERS = 8192 // num_target_layers
};

typedef enum {
  DF_DRAFT_DFLASH = 0,
  DF_DRAFT_DSPARK = 1,
  DF_DRAFT_DOMINO = 2,
  DF_DRAFT_EAGLE3 = 3,
  DF_DRAFT_PEAGLE = 4
} df_draft_kind;

typedef enum { DF_LAYER_FULL_ATTENTION = 0, DF_LAYER_SLIDING_ATTENTION = 1 } df_layer_type;

typedef enum { DF_ATTENTION_GQA = 0, DF_ATTENTION_MHA = 1 } df_attention_mode;

typedef enum { DF_MARKOV_VANILLA = 0, DF_MARKOV_GATED = 1, DF_MARKOV_RNN = 2 } df_markov_head_type;

// dflash_config.projector_type: absent resolves to the kind's own (DSpark forces "dspark", Domino "domino"). A
// DFlashDraftModel with projector_type "domino" (SpecForge's Domino export) is a Domino draft.
typedef enum { DF_PROJECTOR_DFLASH = 0, DF_PROJECTOR_DSPARK = 1, DF_PROJECTOR_DOMINO = 2 } df_projector_type;

// The RoPE variants draftforge builds tables for (HF rope_type names).
typedef enum { DF_ROPE_DEFAULT = 0, DF_ROPE_LINEAR = 1, DF_ROPE_YARN = 2, DF_ROPE_LLAMA3 = 3 } df_rope_type;

// Everything a RoPE table builder needs, from rope_theta + rope_scaling / rope_parameters (HF semantics).
typedef struct {
  df_rope_type type;
  double theta;                    // rope_theta (base)
  int64_t head_dim;                // rotary dim (partial_rotary_factor other than 1 is rejected)
  int64_t max_position_embeddings; // the config's, for YaRN's default original length
  double factor;                   // linear / yarn / llama3 scale factor; 1 for default
  // YaRN (HF defaults when absent: attention_factor derived from factor/mscale, beta 32/1, truncate true).
  bool has_attention_factor;
  double attention_factor;
  double beta_fast, beta_slow;
  double mscale, mscale_all_dim; // 0 when absent
  bool truncate;
  // YaRN (optional) and llama3 (required): the pre-extension context length; 0 when absent.
  int64_t original_max_position_embeddings;
  // llama3 only.
  double low_freq_factor, high_freq_factor;
} df_rope_config;

// dflash_config: the algorithm keys. DSpark and Domino keys are validated and stored; a draft rejects values
// that would ask for a head it does not have.
typedef struct {
  int64_t mask_token_id;    // -1 when absent: resolved later (recipe model.mask_token_id / tokenizer)
  int num_target_layer_ids; // K
  const int *target_layer_ids;
  bool target_layer_ids_defaulted; // built by df_draft_config_build_target_layer_ids
  df_projector_type projector_type;
  df_attention_mode attention_mode;
  int64_t markov_rank; // 0 disables the Markov head
  df_markov_head_type markov_head_type;
  double confidence_head_alpha;
  bool enable_confidence_head; // default: confidence_head_alpha > 0
  bool confidence_head_with_markov;
  // Domino (DominoDraftModel; other drafts accept only the defaults 0 / false): the GRU correction head's widths
  // (required), the slots before suffix_start that keep the base logits, and next-token labels.
  int64_t emb_dim;        // E: embed_proj's hidden width (0 for other drafts)
  int64_t gru_hidden_dim; // G: the GRU state width (0 for other drafts)
  int64_t pure_draft_prefix_len;
  bool shift_label;
} df_dflash_config;

typedef struct df_draft_config {
  const char *source; // the file path, or the name given with the JSON string
  df_draft_kind kind;
  const char *architecture; // architectures[0] (exactly one entry)
  const char *model_type;   // "qwen3"
  int64_t block_size;       // >= 2
  df_dflash_config dflash;
  int64_t num_target_layers;        // L: decoder layers of the target
  int64_t num_hidden_layers;        // n: draft decoder layers
  const df_layer_type *layer_types; // [n]
  bool use_sliding_window;
  int64_t sliding_window; // effective window (0 when no layer slides or use_sliding_window is false)
  int64_t max_window_layers;
  int64_t hidden_size, intermediate_size;
  int64_t num_attention_heads, num_key_value_heads, head_dim;
  double rms_norm_eps;
  df_rope_config rope;
  int64_t max_position_embeddings;
  int64_t vocab_size;
  bool attention_bias;
  bool tie_word_embeddings; // as written; drafts own no embedding, so SpecForge forces false
  double initializer_range;
  const char *hidden_act;  // "silu"
  const char *torch_dtype; // "dtype" or "torch_dtype"; NULL when absent
  // The FFN kind the document asks for (modeling/ffn.h; resolved through df_ffn_kinds) and its config: every
  // decoder layer's FFN is then that kind's. NULL, NULL for a dense draft. The one kind listed today is "moe"
  // (moe_preset): moe is its resolved config (moe/config.h), which modeling/ passes to the kind's hooks
  // without reading it.
  const struct df_ffn_kind *ffn_kind;
  const struct df_moe_config *moe;
  const json_t *json; // the whole document as read (unknown keys included); read-only
  // EAGLE-3 drafts (LlamaForCausalLMEagle3) and P-EAGLE drafts (PEagleDraftModel: the same inputs and head over
  // num_hidden_layers layers; modeling/draft_config_eagle3.c); zero for the block kinds. Their three capture layers
  // are dflash.target_layer_ids (num_target_layer_ids 3) once resolved, 0 ids before; a P-EAGLE draft's mask token
  // (its top-level mask_token_id, -1 when absent) is dflash.mask_token_id.
  struct {
    int64_t draft_vocab_size;   // D: the rows of lm_head (d2t [D], t2d [vocab_size])
    int64_t target_hidden_size; // Ht: fc reads 3·Ht (equal to hidden_size: the draft embeds with the target's table)
    bool fc_norm;               // EAGLE 3.1: an RMSNorm per captured layer before fc
    bool norm_output;           // false: the logits read the un-normed layer output
    bool norm_before_residual;  // P-EAGLE: layer 0's residual is hidden_norm(hidden), not hidden
    int64_t pad_token_id;       // P-EAGLE: its embedding's padding row (never trained, nn.Embedding's); -1: none
  } eagle3;
} df_draft_config;

// Builds a config from a file, or from len bytes of JSON text (name is used in messages). On success *out
// owns everything; free it with df_draft_config_free. On failure *out is NULL and err names the key path.
df_status df_draft_config_from_file(const char *path, const df_draft_config **out, df_error *err);
df_status df_draft_config_from_json(const char *text, size_t len, const char *name, const df_draft_config **out,
                                    df_error *err);
void df_draft_config_free(const df_draft_config *cfg);

// SpecForge build_target_layer_ids(L, n): [L/2] for n == 1, else round(1 + i*(L-4)/(n-1)) for i < n, with
// Python's round (half to even). out has n entries.
void df_draft_config_build_target_layer_ids(int64_t num_target_layers, int64_t num_draft_layers, int *out);

// A top-level key of the source document (NULL when absent), e.g. "auto_map"; read-only.
const json_t *df_draft_config_get(const df_draft_config *cfg, const char *key);

bool df_draft_config_layer_is_sliding(const df_draft_config *cfg, int64_t layer);
const char *df_draft_kind_name(df_draft_kind kind);
const char *df_rope_type_name(df_rope_type type);

// Parameters of the draft (the draft's own: backbone, fc, norms, DSpark heads, FFNs; not the frozen target
// embedding / lm_head). active counts num_experts_per_tok of the routed experts per MoE layer, everything
// else whole (equal to total for a dense draft). Buffers (MoE centering, biases) are not parameters.
void df_draft_config_param_counts(const df_draft_config *cfg, int64_t *total, int64_t *active);

// The config as servers should read it (modeling/draft_config_serving.c): a copy of cfg->json with every
// value SGLang 0.5.23 / transformers look up written out as draftforge resolved it — block_size and
// num_target_layers at the top level (a disagreeing dflash_config copy is an error), target_layer_ids and,
// when mask_token_id >= 0, mask_token_id in dflash_config (and over any top-level / dspark_config copy), the
// backbone sizes and layer_types, RoPE mirrored as rope_theta + rope_scaling + rope_parameters, and for DSpark
// the four head keys at the top level and in dflash_config; an MoE draft names its MoE serving class
// (DFlashMoEDraftModel / Qwen3MoeDSparkModel), never a dense one. Checkpoints and exports write it as config.json;
// it parses back into the same draft. *out is a new reference.
df_status df_draft_config_resolved_json(const df_draft_config *cfg, int64_t mask_token_id, json_t **out, df_error *err);

// Keys of a draft config SGLang 0.5.23 reads that would make it serve another computation than draftforge trains
// (use_gemma_norm, rope_is_neox_style, dflash_config.conv_kernel_size, ...; DSpark: sample_from_anchor false):
// the number found; the first max are named in keys[] with what SGLang would do in whats[]. The resolved config
// refuses the first (training and export stop naming it); inspect flags them all.
int df_draft_config_serving_variants(const json_t *root, bool dspark, const char **keys, const char **whats, int max);

// The resolved values, defaults included (`draftforge inspect config.json`).
void df_draft_config_print(const df_draft_config *cfg, FILE *fp);

// EAGLE-3 and P-EAGLE drafts: the kinds that read three captured target layers through fc and predict over a draft
// vocabulary (modeling/draft_config_eagle3.c).
bool df_draft_is_eagle(const df_draft_config *cfg);
// A new config: cfg's document with the top-level key set to value (a recipe override such as P-EAGLE's
// training.norm_before_residual), parsed again.
df_status df_draft_config_set_bool(const df_draft_config *cfg, const char *key, bool value, const df_draft_config **out,
                                   df_error *err);
// EAGLE-3 (modeling/draft_config_eagle3.c). SpecForge's default capture layers for a target of L decoder layers:
// [1, L/2 − 1, L − 4] (id k = the output of decoder layer k, transformers' hidden_states[k + 1]).
void df_eagle3_default_aux_layers(int64_t num_target_layers, int out[3]);
// The draft's capture layers resolved against its target: ids (n = 3; model.aux_hidden_state_layer_ids) when given,
// else the config's eagle_config.eagle_aux_hidden_state_layer_ids, else the default for the target's depth. *out is
// a new config whose eagle_config carries them (what checkpoints and exports write), or NULL for a block draft
// (nothing to resolve: keep cfg).
df_status df_draft_config_resolve_capture(const df_draft_config *cfg, int64_t num_target_layers, const int *ids, int n,
                                          const df_draft_config **out, df_error *err);

// The draft must fit the target it trains against: equal hidden and vocab sizes, num_target_layers equal to
// the target's layer count, and every target layer id inside it.
df_status df_draft_config_check_target(const df_draft_config *cfg, const struct df_target_config *target,
                                       df_error *err);

#ifdef __cplusplus
}
#endif

#endif
