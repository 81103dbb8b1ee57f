// The feed-forward block of a draft decoder layer behind one small vtable, so the layer code never knows
// whether it is the dense SwiGLU MLP or a sparse MoE. An FFN adds its parameters to the model's table,
// resolves its views once the flat buffers exist, and runs forward/backward on rows of [R, H].
#ifndef DF_MODELING_FFN_H
#define DF_MODELING_FFN_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/collective.h"
#include "base/error.h"
#include "kernels/ops.h"
#include "modeling/draft_config.h"
#include "modeling/param_table.h"
#include "modeling/strict_load.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_ffn df_ffn;

// Memory is the caller's: `saved` holds what the backward needs (kept from forward to backward, one
// region per layer); `scratch` is free to reuse between calls (shared by every layer, forward and backward).
typedef struct {
  const char *kind; // "dense", "moe", ...
  // Elements of the FFN's dtype (f->dt) of saved / scratch memory for R rows (an upper bound when the need is
  // data-dependent).
  int64_t (*saved_elems)(const df_ffn *f, int64_t rows);
  int64_t (*scratch_elems)(const df_ffn *f, int64_t rows);
  // Called after the table is finalized and the flat buffers are allocated on the context's device.
  df_status (*bind)(df_ffn *f, const df_params *p, float *weights, float *grads, df_device dev, df_error *err);
  // Optional: fp32 elements of persistent device state (kept across steps, never checkpointed: the MoE FFN's
  // statistics record and stashes), and its binding to state_elems zeroed floats, 16-float aligned, on the
  // context's device. NULL: no state.
  int64_t (*state_elems)(const df_ffn *f);
  void (*bind_state)(df_ffn *f, float *state);
  // y [R, H] = ffn(x [R, H]).
  df_status (*forward)(df_ffn *f, df_ctx *ctx, const df_tensor *x, df_tensor *y, float *saved, float *scratch,
                       df_error *err);
  // dx [R, H] (= or +=) ∂/∂x of dy [R, H]; parameter gradients are added into the bound grads buffer.
  df_status (*backward)(df_ffn *f, df_ctx *ctx, const df_tensor *x, const df_tensor *dy, df_tensor *dx,
                        bool accumulate_dx, const float *saved, float *scratch, df_error *err);
  void (*destroy)(df_ffn *f);
} df_ffn_vtable;

// Every implementation starts with this header.
struct df_ffn {
  const df_ffn_vtable *vt;
  int64_t layer; // decoder layer index (names: layers.{layer}.mlp.*)
  // The storage dtype of x, y, dx, dy and of the saved / scratch elements (the model sets it before sizing them;
  // DF_F32 unless the draft trains in mixed precision).
  df_dtype dt;
};

// ---- FFN kinds -------------------------------------------------------------------------------------------------
// Every FFN other than the dense MLP is a kind: one table of hooks its module exports (moe/ffn_moe.c: "moe") and
// the build lists (train/ffn_kinds.c). modeling/ and train/ reach a kind only through this table — the draft config
// resolves it, the model builds, loads and drives its layers through it — and never includes the kind's headers.
typedef struct df_ffn_kind {
  const char *name;
  // Resolves the kind from a draft config.json root: *cfg = an owned config (config_free) when the document asks
  // for this kind, NULL when it does not (and then none of the kind's keys may appear).
  df_status (*config_resolve)(const json_t *root, const char *source, void **cfg, df_error *err);
  void (*config_free)(void *cfg);
  // `draftforge inspect CONFIG` rows, and whether a top-level key belongs to the kind.
  void (*config_print)(const void *cfg, FILE *fp);
  bool (*is_top_level_key)(const char *key);
  // Parameters of one layer's FFN: all of them, and those one token uses.
  void (*param_counts)(const void *cfg, int64_t hidden_size, int64_t *total, int64_t *active);
  df_status (*create)(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);
  // Loads a model file into the flat host buffer through the kind's checkpoint layout (strict, as
  // df_params_load_strict); optional_buffers: the kind's running buffers may be absent (warm start).
  df_status (*load)(const void *cfg, const df_params *p, float *flat, const df_st_model *f, const df_load_options *opt,
                    bool optional_buffers, df_error *err);
  // Model-level hooks over a model's FFNs (entries of other kinds are skipped): training/eval, and the FFN rows of
  // one sample (the model forward sets it).
  void (*set_training)(df_ffn *const *ffns, int n, bool training);
  void (*set_rows_per_sample)(df_ffn *const *ffns, int n, int64_t rows_per_sample);

  // ---- what a run needs from the kind beyond the forward (reached through df_ffn_set below) ----
  // Writes a flat buffer (weights, or a gradient dump) in the kind's checkpoint layout.
  df_status (*save)(const void *cfg, const df_params *p, const float *flat, const char *path, const df_save_options *so,
                    df_error *err);
  // Data parallel: the all-reduce the layers' deferred updates and routing statistics go through (NULL: one rank).
  void (*set_collective)(df_ffn *const *ffns, int n, const df_collective *c);
  // Statistics of training forwards kept on the device: their f64 elements, and where a training forward adds
  // them (sums NULL: nowhere) with the micro-batch's loss weight den.
  int64_t (*stats_elems)(df_ffn *const *ffns, int n);
  void (*set_stats)(df_ffn *const *ffns, int n, double *sums, double den);
  // The kind's term of the objective (the MoE aux loss): its value after a training forward that kept no device
  // sums, and ∂objective/∂term, set before the backward.
  double (*loss_term)(df_ffn *const *ffns, int n);
  void (*set_loss_term_grad)(df_ffn *const *ffns, int n, float scale);
  // Deferred updates a training forward left pending (centering mean, noaux_tc bias).
  df_status (*apply_pending)(df_ffn *const *ffns, int n, df_error *err);
  // From device sums read back: the term's part of loss_num, and the kind's metrics averaged over `micro` training
  // forwards, added into o under the kind's own keys (moe/...).
  double (*stats_loss_num)(df_ffn *const *ffns, int n, const double *sums);
  void (*stats_json)(df_ffn *const *ffns, int n, const double *sums, int micro, json_t *o);
  // Export: what serving engines cannot run is refused; the export draft's config JSON and weights (e.g. router
  // centering folded into a bias); the serving keys of config.json, with serving_class (the strategy's class for
  // drafts of this kind) as architectures.
  df_status (*export_check)(const void *cfg, df_error *err);
  df_status (*export_draft_json)(const void *cfg, const json_t *src, json_t **out, df_error *err);
  df_status (*export_weights)(const void *cfg, const df_params *sp, const float *sflat, const df_params *dp,
                              float *dflat, df_error *err);
  df_status (*export_config)(const void *cfg, json_t *norm, const char *serving_class, df_error *err);
  // Parameter names (substrings, NULL-terminated) a bf16 export keeps in fp32 (the MoE router).
  const char *const *keep_f32;
} df_ffn_kind;

// A model's FFNs with their kind, as a run drives them: every df_ffn_set_* call is a no-op (or 0, or writes
// nothing) for a dense model (kind NULL).
typedef struct {
  const df_ffn_kind *kind;
  const void *cfg; // the kind's resolved config
  df_ffn *const *ffns;
  int n;
} df_ffn_set;

bool df_ffn_set_active(const df_ffn_set *s); // a kind other than dense
df_status df_ffn_set_save(const df_ffn_set *s, const df_params *p, const float *flat, const char *path,
                          const df_save_options *so, df_error *err);
void df_ffn_set_collective(const df_ffn_set *s, const df_collective *c);
int64_t df_ffn_set_stats_elems(const df_ffn_set *s);
void df_ffn_set_stats(const df_ffn_set *s, double *sums, double den);
double df_ffn_set_loss_term(const df_ffn_set *s);
void df_ffn_set_loss_term_grad(const df_ffn_set *s, float scale);
df_status df_ffn_set_apply_pending(const df_ffn_set *s, df_error *err);
double df_ffn_set_stats_loss_num(const df_ffn_set *s, const double *sums);
void df_ffn_set_stats_json(const df_ffn_set *s, const double *sums, int micro, json_t *o);
// The same hooks from a draft config alone (export: no model is needed to check or rename).
df_status df_ffn_config_save(const df_draft_config *cfg, const df_params *p, const float *flat, const char *path,
                             const df_save_options *so, df_error *err);
df_status df_ffn_export_check(const df_draft_config *cfg, df_error *err);
df_status df_ffn_export_draft_json(const df_draft_config *cfg, json_t **out, df_error *err);
df_status df_ffn_export_weights(const df_draft_config *cfg, const df_params *sp, const float *sflat,
                                const df_params *dp, float *dflat, df_error *err);
df_status df_ffn_export_config(const df_draft_config *cfg, json_t *norm, const char *serving_class, df_error *err);

// The kinds the build lists (train/ffn_kinds.c).
extern const df_ffn_kind *const df_ffn_kinds[];
extern const int df_ffn_num_kinds;

// Builds the FFN the config asks for at layer `layer` and appends its parameters to p (not yet finalized),
// in checkpoint order: the config's kind (cfg->ffn_kind) when it has one, else the dense SwiGLU MLP.
df_status df_ffn_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);
// The dense SwiGLU MLP: mlp.{gate,up,down}_proj.weight ([I, H], [I, H], [H, I]); y = down(silu(gate x) ⊙ up x).
df_status df_ffn_dense_create(const df_draft_config *cfg, int64_t layer, df_params *p, df_ffn **out, df_error *err);

static inline void df_ffn_free(df_ffn *f) {
  if (f) f->vt->destroy(f);
}

#ifdef __cplusplus
}
#endif

#endif
