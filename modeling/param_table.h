// The parameter table: every named parameter of a model (HF checkpoint name, shape, role, flags) and its
// offset in one flat fp32 buffer; params, grads, masters and AdamW m, v all share this layout.
#ifndef DF_MODELING_PARAM_TABLE_H
#define DF_MODELING_PARAM_TABLE_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"
#include "kernels/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  DF_ROLE_WEIGHT, // linear / projection weights
  DF_ROLE_BIAS,
  DF_ROLE_NORM,   // RMSNorm / LayerNorm scales
  DF_ROLE_EMBED,  // embeddings owned by the draft
  DF_ROLE_ROUTER, // MoE router weights (fp32 router math)
  DF_ROLE_BUFFER, // non-trained state that is still checkpointed
} df_param_role;

const char *df_param_role_name(df_param_role r);

// Offsets are multiples of this many elements (64 bytes of fp32), so every view is 64-byte aligned when the
// flat buffer is; the padding between entries stays zero and belongs to no parameter.
#define DF_PARAMS_ALIGN_ELEMS 16

typedef struct {
  const char *name; // HF / SpecForge checkpoint name
  int ndim;
  int64_t shape[DF_MAX_DIMS];
  int64_t numel;
  df_dtype dtype; // dtype of the checkpoint / export tensor; the flat state buffers are fp32
  df_param_role role;
  int64_t offset; // in elements, into the flat buffer
  bool trainable;
  bool weight_decay;
} df_param;

// What df_params_add takes; dtype defaults to DF_F32 when zero-initialised.
typedef struct {
  const char *name;
  df_param_role role;
  int ndim;
  const int64_t *shape;
  df_dtype dtype;
  bool trainable;
  bool weight_decay;
} df_param_spec;

typedef struct df_params df_params;

df_status df_params_new(df_params **out, df_error *err);
void df_params_free(df_params *p);
// Appends an entry (copies name and shape); entries keep the order they were added in.
df_status df_params_add(df_params *p, const df_param_spec *spec, df_error *err);
// Freezes the table: assigns aligned offsets, builds the name index, rejects duplicate names.
df_status df_params_finalize(df_params *p, df_error *err);

bool df_params_is_final(const df_params *p);
// Elements a flat buffer needs (padding included), after finalize.
int64_t df_params_numel(const df_params *p);
// Elements that belong to parameters (padding excluded).
int64_t df_params_param_numel(const df_params *p);
int df_params_count(const df_params *p);
const df_param *df_params_at(const df_params *p, int i);
const df_param *df_params_find(const df_params *p, const char *name); // after finalize; NULL when absent

// A contiguous fp32 view of entry e inside flat (which holds df_params_numel elements) on device dev; the first
// form is a CPU view (host buffers: checkpoints, tests).
df_tensor df_params_view_on(const df_param *e, float *flat, df_device dev);
df_tensor df_params_view(const df_param *e, float *flat);
// The same, by name; fails naming the parameter when it is absent.
df_status df_params_view_named(const df_params *p, const char *name, float *flat, df_tensor *out, df_error *err);

// A parameter and its gradient by name, as views on dev (the draft modules' weight/grad pairs).
df_status df_params_bind(const df_params *p, const char *name, float *weights, float *grads, df_device dev,
                         df_tensor *w, df_tensor *g, df_error *err);
// The same, with the weight view always in the fp32 flat buffer `weights` itself, never the mixed-precision compute
// copy: the fp32 islands of a bf16 draft (the MoE FFN, Domino's GRU head) read their masters.
df_status df_params_bind_masters(const df_params *p, const char *name, float *weights, float *grads, df_device dev,
                                 df_tensor *w, df_tensor *g, df_error *err);

// The optimizer's element mask (mask holds df_params_numel bytes): each trainable parameter's elements get
// DF_PARAM_TRAIN, plus DF_PARAM_DECAY with weight decay (kernels/ops.h); padding, buffers and frozen entries 0.
void df_params_optim_mask(const df_params *p, uint8_t *mask);

// Mixed precision: a later df_params_bind of the flat buffer `masters` gives the weight view in `compute` (the same
// element offsets, dtype dt: the bf16 copy the forward reads), the gradient view as before. compute NULL: off.
void df_params_set_compute(df_params *p, const float *masters, void *compute, df_dtype dt);

// Adds a trainable fp32 parameter of shape [d0] (ndim 1) or [d0, d1]; weights and embeddings get weight decay.
df_status df_params_add_f32(df_params *p, const char *name, df_param_role role, int ndim, int64_t d0, int64_t d1,
                            df_error *err);
// Adds a 1-D buffer of n elements of dtype dt (checkpointed, not trained: the EAGLE family's t2d / d2t).
df_status df_params_add_buffer(df_params *p, const char *name, df_dtype dt, int64_t n, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
