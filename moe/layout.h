// Checkpoint layouts: the names (and per-expert split) MoE tensors take in files. Inside draftforge every MoE
// tensor has its native name (moe/params.h); a layout renames them only here, at the file boundary, for every
// read and write (checkpoint, resume, warm start, export). Round trips through any layout are exact.
//
//   native tensor (layers.{i}.mlp.)  native                 qwen                               deepseek
//   gate.weight            [E, H]    gate.weight            gate.weight                        gate.weight
//   gate.bias              [E]       gate.bias              gate.bias (logit bias)             gate.bias
//   gate.balance.bias      [E]       gate.balance.bias      gate.balance.bias                  gate.bias (selection)
//   gate.input_mean        [H]       gate.input_mean        gate.input_mean                    gate.input_mean
//   gate.input_mean_steps  [] I64    gate.input_mean_steps  gate.input_mean_steps              gate.input_mean_steps
//   experts.w1          [E, I, H]    experts.w1 (stacked)   experts.{e}.gate_proj.weight [I,H] experts.{e}.w1.weight
//   experts.w3          [E, I, H]    experts.w3 (stacked)   experts.{e}.up_proj.weight   [I,H] experts.{e}.w3.weight
//   experts.w2          [E, H, I]    experts.w2 (stacked)   experts.{e}.down_proj.weight [H,I] experts.{e}.w2.weight
//   shared_experts.w1.weight [S, H]  (same)                 shared_expert.gate_proj.weight     (same as native)
//   shared_experts.w3.weight [S, H]  (same)                 shared_expert.up_proj.weight       (same as native)
//   shared_experts.w2.weight [H, S]  (same)                 shared_expert.down_proj.weight     (same as native)
//   shared_experts.gate.weight [1,H] (same)                 shared_expert_gate.weight          (same as native)
//
// Non-MoE tensors pass through unchanged; a dense draft (no MoE config) uses the plain strict loader/saver.
#ifndef DF_MOE_LAYOUT_H
#define DF_MOE_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/error.h"
#include "modeling/ffn.h" // the FFN interface: parameter table, safetensors, strict loader
#include "moe/config.h"
#include "moe/params.h"

#ifdef __cplusplus
extern "C" {
#endif

// A layout is data: the file suffix (after "layers.{i}.mlp.") of each native tensor, NULL = the native suffix.
// A stacked tensor's suffix containing "{e}" is written as one [out, in] tensor per expert e = 0..E-1.
typedef struct df_moe_layout {
  const char *name;
  const char *file[DF_MOE_T_COUNT];
} df_moe_layout;

// The registered layout of that name (case-insensitive), or NULL.
const df_moe_layout *df_moe_layout_find(const char *name);
// The layout a resolved config selected (NULL for NULL, i.e. a dense draft).
const df_moe_layout *df_moe_layout_of(const df_moe_config *m);

// Whether the layout writes tensor t as one file tensor per expert.
bool df_moe_layout_splits(const df_moe_layout *l, df_moe_tensor t);
// The file name of tensor t of layer `layer` (expert e when the layout splits t; ignored otherwise); returns buf.
const char *df_moe_layout_file_name(const df_moe_layout *l, int64_t layer, df_moe_tensor t, int64_t expert, char *buf,
                                    size_t n);
// The inverse: whether name is a file name the layout writes for some MoE tensor (any layer, any expert index,
// which the caller range-checks). Sets *layer, *t and *expert (-1 when not split). With m, only the tensors m
// has are candidates (deepseek's "gate.bias" is the selection bias when there is no logit bias); NULL: all.
bool df_moe_layout_parse(const df_moe_layout *l, const df_moe_config *m, const char *name, int64_t *layer,
                         df_moe_tensor *t, int64_t *expert);
// The layout can hold this config: every present tensor gets its own file name, "{e}" appears in exactly the
// stacked tensors it splits. where names the config key in errors (e.g. "moe_layout").
df_status df_moe_layout_check(const df_moe_layout *l, const df_moe_config *m, const char *where, df_error *err);

typedef struct {
  df_load_options base;    // ignore suffixes, prefix renames, map hook and log, applied before the layout
  bool centering_optional; // warm start: gate.input_mean(_steps) may be absent (the flat buffer keeps its values)
} df_moe_load_options;

// Loads every tensor of f into flat (laid out by the finalized table p), MoE tensors through m's layout.
// Strict: a missing expert index, a missing tensor, an unexpected tensor (an expert index >= E, a name no
// parameter has, a native name the layout renames), a shape mismatch or a float/int crossing is an error
// naming the file tensor; all problems are listed, and flat is untouched unless everything checks.
// m == NULL (dense draft) is df_params_load_strict. opt and stats may be NULL.
df_status df_moe_layout_load(const df_moe_config *m, const df_params *p, float *flat, const df_st_model *f,
                             const df_moe_load_options *opt, df_load_stats *stats, df_error *err);

// Writes every entry of p from flat, MoE tensors through m's layout (stacked experts split per expert where
// the layout says so), atomically. fp32 buffers stay F32 and integer entries are written as I64 whatever
// opt->dtype says; opt->trainable_only (gradient dumps) skips buffers. m == NULL is df_params_save.
df_status df_moe_layout_save(const df_moe_config *m, const df_params *p, const float *flat, const char *path,
                             const df_save_options *opt, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
