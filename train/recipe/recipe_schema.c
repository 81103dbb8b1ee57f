// SpecForge's run-config schema (specforge/config/schema.py at sgl-project/SpecForge a6b6b02; shared/reference/
// dflash-dspark.md §6.1) as one table: every key SpecForge accepts, with whether draftforge uses it, accepts it
// without effect (inert: listed once at start-up), or refuses it (only its default passes). Growing draftforge
// means flipping rows from DEFAULT_ONLY to USED and adding rows for new keys; the parser itself does not change.
// Whole features a recipe may ask for (EAGLE-3, P-EAGLE, a disaggregated deployment) are refused
// earlier, with one line each, by train/recipe/recipe_features.c.
#include "train/recipe/recipe_schema.h"

#include <stddef.h>
#include <string.h>

#include "strategies/strategy.h"

#define K(sec, name, ty, ...)                                                                                          \
  { .section = (sec), .key = (name), .type = (ty), __VA_ARGS__ }
#define GT(x)      .has_lo = true, .lo_open = true, .lo = (x)
#define GE(x)      .has_lo = true, .lo = (x)
#define LE(x)      .has_hi = true, .hi = (x)
#define USED       .support = DF_RS_USED
#define INERT(why) .support = DF_RS_INERT, .note = (why)
#define TODO(why)  .support = DF_RS_DEFAULT_ONLY, .note = (why)
#define INPUT      .input = true
#define HUB        .input = true, .hub = true

static const char *const STRATEGIES[] = {"eagle3", "dflash", "dspark", "domino", "peagle", NULL};
static const char *const LOSS_TYPES[] = {"dflash", "dpace", "dpace-cumulative-confidence-only",
                                         "dpace-continuation-value-only", NULL};
static const char *const ATTENTION[] = {"eager", "sdpa", "flex_attention", "fa", "usp", NULL};
static const char *const ATTENTION_OK[] = {"eager", "sdpa", "flex_attention", NULL};
static const char *const FSDP[] = {"SHARD_GRAD_OP", "FULL_SHARD", "NO_SHARD", NULL};
static const char *const LK_LOSS[] = {"lambda", "alpha", NULL};
static const char *const ROLES[] = {"auto", "all", "producer", "consumer", NULL};
static const char *const ROLES_OK[] = {"all", NULL};
static const char *const SCHEDULERS[] = {"cosine", "constant", NULL};
static const char *const BACKENDS[] = {"sglang", NULL}; // SpecForge dropped hf / custom with its server-only capture
static const char *const DTYPES[] = {"bfloat16", "float16", "float32", NULL};
static const char *const DTYPES_OK[] = {"bfloat16", "float32", NULL};
static const char *const REPORT_TO[] = {"none", "wandb", "tensorboard", "swanlab", "mlflow", NULL};
static const char *const DEPLOY_MODES[] = {"local_colocated", "disaggregated", NULL};
static const char *const DEPLOY_MODES_OK[] = {"local_colocated", NULL};
static const char *const STORE_BACKENDS[] = {"shared_dir", "mooncake", NULL};
static const char *const MOONCAKE_PROTOCOLS[] = {"tcp", "rdma", NULL};
static const char *const FEATURE_DTYPES[] = {"bfloat16", "float32", NULL};
static const char *const DEVICES[] = {"auto", "cpu", "cuda", NULL}; // in df_device_choice order

#define OFFLINE                                                                                                        \
  "no SGLang engine ever starts: offline runs read captured hidden states, online runs use draftforge's own target "   \
  "forward (modeling/target/)"
#define PREP   "applies when the data is prepared; offline runs read captured hidden states"
#define EXT    "draftforge extension"
#define ONLINE "online data (data.train_data_path / prompts_path / eval_data_path)"
#define CONV   "used when " ONLINE " holds conversations: tools/run/prepare_data.py applies it once into data.cache_dir"
#define TRACK  "used only with tracking.report_to"
#define DISAGG "a disaggregated deployment (SGLang capture servers + Mooncake) is not supported"
#define ONLINE_INSTEAD                                                                                                 \
  "train online instead: deployment.mode: local_colocated (no deployment.disaggregated) with data.train_data_path; "   \
  "draftforge train runs the target in-process on every batch (docs/target.md)"
#define OTHER_ALGO "another algorithm's knob; DFlash does not read it"
#define LAUNCH     "checked against the launcher's environment at start-up (docs/distributed.md)"
#define ENGINE     "a setting of the SGLang capture engine, which offline runs never start"

static const df_recipe_key SCHEMA[] = {
    // ---- top level
    K("", "model", DF_RT_SECTION, .required = true, USED),
    K("", "data", DF_RT_SECTION, .required = true, USED),
    K("", "training", DF_RT_SECTION, USED),
    K("", "tracking", DF_RT_SECTION, USED),
    K("", "profiling", DF_RT_SECTION, USED),
    K("", "runtime", DF_RT_SECTION, USED),
    K("", "deployment", DF_RT_SECTION, USED),
    K("", "run_id", DF_RT_STRING, .def = "specforge-run", USED),
    K("", "output_dir", DF_RT_PATH, .def = "./output", USED),
    // ---- model
    K("model", "target_model_path", DF_RT_PATH, .required = true, USED, HUB),
    K("model", "draft_model_config", DF_RT_PATH, .nullable = true, USED, HUB),
    K("model", "draft_checkpoint_path", DF_RT_PATH, .nullable = true, USED, INPUT),
    K("model", "draft_num_hidden_layers", DF_RT_INT, .nullable = true, GT(0),
      TODO("set num_hidden_layers in the draft config instead")),
    K("model", "draft_block_size", DF_RT_INT, .nullable = true, GT(0),
      TODO("set block_size in the draft config instead")),
    K("model", "target_backend", DF_RT_ENUM, .def = "sglang", .choices = BACKENDS, INERT(OFFLINE)),
    K("model", "shard_target_output", DF_RT_BOOL, .def = "false",
      TODO("the online target runs whole in the trainer's process (no tensor parallelism)")),
    K("model", "input_modality", DF_RT_STRING, .def = "text", TODO("only text drafts are supported")),
    K("model", "trust_remote_code", DF_RT_BOOL, .def = "false", INERT("draftforge runs no model code")),
    K("model", "use_liger_kernel", DF_RT_BOOL, .def = "false", INERT("draftforge always runs its fused chunked CE")),
    K("model", "embedding_key", DF_RT_STRING, .def = "model.embed_tokens.weight", USED),
    K("model", "lm_head_key", DF_RT_STRING, .def = "lm_head.weight", USED),
    K("model", "vocab_mapping_path", DF_RT_STRING, .def = "", USED,
      .note = "EAGLE-3: the draft vocabulary mapping (d2t / t2d); an existing file is read (safetensors, or torch .pt "
              "through tools/run/eagle3_vocab_pt.py), else the mapping derived from the training data is cached there"),
    K("model", "load_target_embedding", DF_RT_BOOL, .def = "true", USED,
      .note = "P-EAGLE: a cold start's own (trained) embedding starts as the target's; false keeps the init draw. "
              "The other drafts always embed with the target's table, frozen"),
    K("model", "aux_hidden_state_layer_ids", DF_RT_INT_LIST, .nullable = true, USED,
      .note = "EAGLE-3: the three captured target layers (id k = hidden_states[k + 1]); else the draft config's "
              "eagle_config, else [1, L/2 - 1, L - 4]. DFlash-family drafts set dflash_config.target_layer_ids"),
    K("model", "torch_dtype", DF_RT_ENUM, .def = "bfloat16", .choices = DTYPES, .supported = DTYPES_OK, USED,
      .note = "the draft's storage on CUDA: bfloat16 (weights, activations and activation gradients bf16; fp32 "
              "masters, weight gradients, AdamW moments and statistics) or float32; the CPU backend computes in "
              "float32 either way; float16 would need loss scaling"),
    K("model", "cache_dir", DF_RT_STRING, .nullable = true, USED,
      .note = "the Hugging Face hub cache that hub ids in the model paths resolve in (from_pretrained's cache_dir)"),
    K("model", "mask_token_id", DF_RT_INT, .nullable = true, GE(0), USED),
    K("model", "tokenizer_pad_token_id", DF_RT_INT, .nullable = true, GE(0),
      INERT("pads prompts when they are tokenized; offline runs read captured, already padded data")),
    K("model", "sglang_attention_backend", DF_RT_STRING, .def = "flashinfer", INERT(OFFLINE)),
    K("model", "sglang_mem_fraction_static", DF_RT_FLOAT, .def = "0.4", GT(0), LE(1), INERT(OFFLINE)),
    K("model", "sglang_disable_radix_cache", DF_RT_BOOL, .def = "true", INERT(ENGINE)),
    K("model", "sglang_context_length", DF_RT_INT, .nullable = true, GT(0), INERT(OFFLINE)),
    K("model", "sglang_enable_nccl_nvls", DF_RT_BOOL, .def = "false", INERT(OFFLINE)),
    K("model", "sglang_enable_symm_mem", DF_RT_BOOL, .def = "false", INERT(OFFLINE)),
    K("model", "sglang_enable_torch_compile", DF_RT_BOOL, .def = "false", INERT(OFFLINE)),
    K("model", "sglang_enable_dp_attention", DF_RT_BOOL, .def = "false", INERT(OFFLINE)),
    K("model", "sglang_enable_dp_lm_head", DF_RT_BOOL, .def = "false", INERT(OFFLINE)),
    K("model", "sglang_ep_size", DF_RT_INT, .def = "1", GT(0), INERT(OFFLINE)),
    K("model", "sglang_max_running_requests", DF_RT_INT, .nullable = true, GT(0), INERT(OFFLINE)),
    K("model", "sglang_max_total_tokens", DF_RT_INT, .nullable = true, GT(0), INERT(OFFLINE)),
    K("model", "sglang_dp_size", DF_RT_INT, .nullable = true, GT(0), INERT(ENGINE)),
    K("model", "sglang_moe_a2a_backend", DF_RT_STRING, .nullable = true, INERT(ENGINE)),
    K("model", "sglang_moe_runner_backend", DF_RT_STRING, .nullable = true, INERT(ENGINE)),
    K("model", "sglang_page_size", DF_RT_INT, .nullable = true, GT(0), INERT(ENGINE)),
    K("model", "sglang_quantization", DF_RT_STRING, .nullable = true, INERT(ENGINE)),
    K("model", "sglang_fp4_gemm_runner_backend", DF_RT_STRING, .nullable = true, INERT(ENGINE)),
    K("model", "sglang_mamba_radix_cache_strategy", DF_RT_STRING, .nullable = true, INERT(ENGINE)),
    K("model", "sglang_max_mamba_cache_size", DF_RT_INT, .nullable = true, GT(0), INERT(ENGINE)),
    K("model", "sglang_swa_full_tokens_ratio", DF_RT_FLOAT, .nullable = true, GT(0), LE(1), INERT(ENGINE)),
    K("model", "sglang_mamba_full_memory_ratio", DF_RT_FLOAT, .nullable = true, GT(0), LE(1), INERT(ENGINE)),
    // ---- data
    K("data", "train_data_path", DF_RT_PATH, .def = "", USED, INPUT,
      .note = "online training: conversations (ShareGPT / OpenAI JSONL, prepared once by tools/run/prepare_data.py) or "
              "a token JSONL; the target runs in-process on every batch. Exactly one of train_data_path, "
              "prompts_path, hidden_states_path is set"),
    K("data", "prompts_path", DF_RT_PATH, .def = "", USED, INPUT,
      .note = "read like data.train_data_path (as SpecForge does)"),
    K("data", "hidden_states_path", DF_RT_PATH, .def = "", USED, INPUT,
      .note = "offline training: captured HDF5 shards"),
    K("data", "eval_data_path", DF_RT_PATH, .def = "", USED, INPUT,
      .note = "online eval data, read like data.train_data_path (SpecForge refuses it)"),
    K("data", "eval_hidden_states_path", DF_RT_PATH, .def = "", USED, INPUT,
      .note = "offline eval data; at most one of it and eval_data_path"),
    K("data", "max_length", DF_RT_INT, .def = "2048", GT(0), USED),
    K("data", "chat_template", DF_RT_STRING, .def = "llama3", USED, .note = CONV),
    K("data", "is_preformatted", DF_RT_BOOL, .def = "false", USED,
      .note = "true is refused for online conversations: tools/run/prepare_data.py applies the chat template itself"),
    K("data", "train_only_last_turn", DF_RT_BOOL, .def = "false", USED, .note = CONV),
    K("data", "build_dataset_num_proc", DF_RT_INT, .def = "8", GT(0), INERT(PREP)),
    K("data", "dataloader_num_workers", DF_RT_INT, .nullable = true, GE(0),
      INERT("a loader thread count; the batches are the same")),
    K("data", "cache_dir", DF_RT_PATH, .def = "./cache", USED,
      .note = "where conversations are prepared: <cache_dir>/prepared/<key>.jsonl, reused while the key matches"),
    K("data", "cache_key", DF_RT_STRING, .nullable = true, INERT("the prepared file's key hashes its inputs")),
    K("data", "max_prompts", DF_RT_INT, .nullable = true, GE(0), USED,
      .note = "online data only: the first N kept samples (0 or null: all)"),
    K("data", "online_feature_dtype", DF_RT_ENUM, .def = "bfloat16", .choices = FEATURE_DTYPES, USED,
      .note = EXT ": online features are rounded to this dtype as a capture of that dtype stores them, so online "
                  "and capture-then-train runs train on the same bits"),
    // ---- training
    K("training", "strategy", DF_RT_ENUM, .def = "eagle3", .choices = STRATEGIES, .supported = df_strategy_names, USED),
    K("training", "num_epochs", DF_RT_INT, .def = "1", GT(0), USED),
    K("training", "max_steps", DF_RT_INT, .nullable = true, GT(0), USED),
    K("training", "total_steps", DF_RT_INT, .nullable = true, GT(0), USED),
    K("training", "batch_size", DF_RT_INT, .def = "1", GT(0), USED),
    K("training", "accumulation_steps", DF_RT_INT, .def = "1", GT(0), USED),
    K("training", "fsdp_sharding", DF_RT_ENUM, .def = "SHARD_GRAD_OP", .choices = FSDP, USED,
      .note = "on several ranks: SHARD_GRAD_OP shards the AdamW moments and the update (ZeRO-1: reduce-scatter of the "
              "gradients, AdamW on this rank's shard, all-gather of the parameters); FULL_SHARD does the same (the "
              "parameters stay replicated); NO_SHARD all-reduces the gradients and updates everywhere"),
    K("training", "learning_rate", DF_RT_FLOAT, .def = "1e-4", GT(0), USED),
    K("training", "lr_scheduler", DF_RT_ENUM, .def = "cosine", .choices = SCHEDULERS, USED),
    K("training", "warmup_ratio", DF_RT_FLOAT, .def = "0.015", GE(0), LE(1), USED),
    K("training", "max_grad_norm", DF_RT_FLOAT, .def = "0.5", GT(0), USED),
    // AdamW knobs and the skip limit are draftforge extensions (SpecForge fixes β (0.9, 0.999), eps 1e-8, wd 0).
    K("training", "weight_decay", DF_RT_FLOAT, .def = "0.0", GE(0), USED, .note = EXT),
    K("training", "adam_beta1", DF_RT_FLOAT, .def = "0.9", GE(0), .has_hi = true, .hi_open = true, .hi = 1, USED,
      .note = EXT),
    K("training", "adam_beta2", DF_RT_FLOAT, .def = "0.999", GE(0), .has_hi = true, .hi_open = true, .hi = 1, USED,
      .note = EXT),
    K("training", "adam_eps", DF_RT_FLOAT, .def = "1e-8", GT(0), USED, .note = EXT),
    K("training", "max_consecutive_skips", DF_RT_INT, .def = "5", GT(0), USED,
      .note = EXT ": optimizer steps skipped in a row for a NaN/Inf loss or gradient norm before the run stops"),
    K("training", "optimizer_cpu_offload", DF_RT_BOOL, .def = "false",
      INERT("the fp32 masters and AdamW moments live on the training device")),
    K("training", "device", DF_RT_ENUM, .def = "auto", .choices = DEVICES, USED,
      .note = EXT ": cpu, cuda, or auto (cuda when the build has it, a GPU is visible and its backend runs every op "
                  "of the step; else cpu); --device overrides it"),
    K("training", "ttt_length", DF_RT_INT, .def = "7", GT(0), USED, .note = "EAGLE-3: training-time-test steps"),
    K("training", "attention_backend", DF_RT_ENUM, .def = "flex_attention", .choices = ATTENTION,
      .supported = ATTENTION_OK, INERT("eager, sdpa and flex_attention compute the same masked attention")),
    K("training", "tp_size", DF_RT_INT, .def = "1", GT(0), TODO("trainer tensor parallelism is always 1")),
    K("training", "sp_ulysses_size", DF_RT_INT, .def = "1", GT(0), TODO("sequence parallelism is EAGLE3-only")),
    K("training", "sp_ring_size", DF_RT_INT, .def = "1", GT(0), TODO("sequence parallelism is EAGLE3-only")),
    K("training", "dist_timeout", DF_RT_FLOAT, .def = "10", GT(0), USED,
      .note = "minutes a collective may wait for the other ranks before the run stops naming the silent rank; "
              "fractions of a minute are accepted too"),
    K("training", "dp_bucket_mb", DF_RT_FLOAT, .def = "25", GT(0), USED,
      .note = EXT ": data parallel: the gradient all-reduce goes in buckets of this many MiB (PyTorch DDP's "
                  "bucket_cap_mb); on GPU ranks a bucket is reduced as soon as the backward has finished it"),
    K("training", "lk_loss_type", DF_RT_ENUM, .nullable = true, .choices = LK_LOSS, USED,
      .note = "EAGLE-3: null (forward KL), alpha (-log acceptance) or lambda (KL and 1 - acceptance, weighted)"),
    K("training", "kl_scale", DF_RT_FLOAT, .def = "1.0", USED, .note = "EAGLE-3 with lk_loss_type lambda"),
    K("training", "kl_decay", DF_RT_FLOAT, .def = "1.0", USED, .note = "EAGLE-3 with lk_loss_type lambda"),
    K("training", "num_anchors", DF_RT_INT, .def = "512", GT(0), USED),
    K("training", "loss_decay_gamma", DF_RT_FLOAT, .nullable = true, GE(0), USED),
    K("training", "objective_chunk_blocks", DF_RT_INT, .def = "128", GE(0), USED),
    K("training", "loss_type", DF_RT_ENUM, .def = "dflash", .choices = LOSS_TYPES, USED),
    K("training", "dpace_alpha", DF_RT_FLOAT, .def = "0.5", GE(0), LE(1), USED),
    K("training", "lambda_base_start", DF_RT_FLOAT, .def = "1.0", USED,
      .note = "Domino: the base-CE weight lambda_base at step 0 (clamped to [0, 1]); other strategies do not read it"),
    K("training", "lambda_base_decay_ratio", DF_RT_FLOAT, .def = "0.5", GE(0), USED,
      .note = "Domino: lambda_base falls linearly to 0 over the first int(horizon x ratio) optimizer steps (horizon: "
              "total_steps, else max_steps, else what the data gives)"),
    K("training", "global_step", DF_RT_INT, .def = "0", GE(0), USED,
      .note = EXT ", draftforge step only: optimizer steps already taken when the dumped micro-step runs (sets a "
                  "step-dependent objective such as Domino's lambda_base); train and eval count the run's own steps"),
    K("training", "dspark_ce_loss_alpha", DF_RT_FLOAT, .def = "0.1", GE(0), USED),
    K("training", "dspark_l1_loss_alpha", DF_RT_FLOAT, .def = "0.9", GE(0), USED),
    K("training", "dspark_confidence_head_alpha", DF_RT_FLOAT, .def = "1.0", GE(0), USED),
    K("training", "num_depths", DF_RT_INT, .def = "8", GT(0), USED,
      .note = "P-EAGLE: draft depths trained per anchor (the rows a parallel draft proposes)"),
    K("training", "down_sample_ratio", DF_RT_FLOAT, .def = "0.8", GT(0), LE(1), USED,
      .note = "P-EAGLE: COD sampling keeps max(r^d, down_sample_ratio_min) of the supervised positions at depth d"),
    K("training", "down_sample_ratio_min", DF_RT_FLOAT, .def = "0.2", GT(0), LE(1), USED,
      .note = "P-EAGLE: the floor of COD's keep ratio (<= down_sample_ratio)"),
    K("training", "norm_before_residual", DF_RT_BOOL, .nullable = true, USED,
      .note = "P-EAGLE: layer 0's residual is hidden_norm(hidden) (null: the draft config's norm_before_residual)"),
    K("training", "save_interval", DF_RT_INT, .def = "0", GE(0), USED),
    K("training", "save_interval_minutes", DF_RT_FLOAT, .def = "15", GE(0), USED,
      .note = EXT " (SpecForge saves by steps only): also checkpoint when this many minutes passed since the last "
                  "checkpoint (0: off)"),
    K("training", "eval_interval", DF_RT_INT, .def = "0", GE(0), USED),
    K("training", "log_interval", DF_RT_INT, .def = "50", GT(0), USED),
    K("training", "max_checkpoints", DF_RT_INT, .def = "0", GE(0), USED),
    K("training", "compact_teacher", DF_RT_BOOL, .def = "false", USED,
      .note = "EAGLE-3: recorded in the resume contract; the teacher is always computed in vocabulary chunks (the "
              "same numbers)"),
    K("training", "compact_teacher_chunk_size", DF_RT_INT, .nullable = true, GT(0), USED,
      .note = "EAGLE-3: recorded in the resume contract; the chunking is draftforge's own"),
    K("training", "resume_from", DF_RT_PATH, .nullable = true, USED),
    K("training", "role", DF_RT_ENUM, .def = "all", .choices = ROLES, .supported = ROLES_OK, USED),
    K("training", "seed", DF_RT_INT, .def = "42", GE(0), USED),
    K("training", "prompt_seed", DF_RT_INT, .nullable = true, GE(0),
      INERT("disaggregated prompt sampling only; online batches follow training.seed")),
    // Legacy spellings SpecForge's loader still migrates into deployment.* (migrate_legacy_config).
    K("training", "deployment_mode", DF_RT_ENUM, .nullable = true, .choices = DEPLOY_MODES,
      .supported = DEPLOY_MODES_OK, USED, .note = "legacy spelling of deployment.mode"),
    K("training", "server_urls", DF_RT_STRING_LIST, .nullable = true, TODO(DISAGG)),
    K("training", "metadata_db_path", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    // ---- tracking
    K("tracking", "report_to", DF_RT_ENUM, .def = "none", .choices = REPORT_TO, USED,
      .note = "tensorboard: event files in <output_dir>/tensorboard; wandb, swanlab, mlflow: tools/run/track.py"),
    K("tracking", "wandb_project", DF_RT_STRING, .nullable = true, USED, .note = TRACK),
    K("tracking", "wandb_name", DF_RT_STRING, .nullable = true, USED, .note = TRACK " (default: run_id)"),
    K("tracking", "wandb_key", DF_RT_STRING, .nullable = true, USED, .note = TRACK " (better: WANDB_API_KEY)"),
    K("tracking", "wandb_offline", DF_RT_BOOL, .def = "false", USED, .note = TRACK),
    K("tracking", "wandb_dir", DF_RT_STRING, .nullable = true, USED, .note = TRACK " (default: output_dir)"),
    K("tracking", "swanlab_project", DF_RT_STRING, .nullable = true, USED, .note = TRACK),
    K("tracking", "swanlab_name", DF_RT_STRING, .nullable = true, USED, .note = TRACK " (default: run_id)"),
    K("tracking", "swanlab_key", DF_RT_STRING, .nullable = true, USED, .note = TRACK),
    K("tracking", "mlflow_tracking_uri", DF_RT_STRING, .nullable = true, USED,
      .note = TRACK " (default: <output_dir>/mlruns)"),
    K("tracking", "mlflow_experiment_name", DF_RT_STRING, .nullable = true, USED, .note = TRACK),
    K("tracking", "mlflow_run_name", DF_RT_STRING, .nullable = true, USED, .note = TRACK " (default: run_id)"),
    // ---- profiling
    K("profiling", "enabled", DF_RT_BOOL, .def = "false", TODO("the profiler")),
    K("profiling", "start_step", DF_RT_INT, .def = "30", GE(0), INERT("used only with profiling.enabled")),
    K("profiling", "num_steps", DF_RT_INT, .def = "4", GT(0), INERT("used only with profiling.enabled")),
    K("profiling", "record_shapes", DF_RT_BOOL, .def = "false", INERT("used only with profiling.enabled")),
    // ---- runtime (disaggregated producer bounds)
    K("runtime", "producer_lease", DF_RT_INT, .def = "8", GT(0), INERT(DISAGG)),
    K("runtime", "producer_concurrency", DF_RT_INT, .def = "1", GT(0), INERT(DISAGG)),
    K("runtime", "in_flight_high_watermark", DF_RT_INT, .def = "256", GT(0), INERT(DISAGG)),
    K("runtime", "in_flight_low_watermark", DF_RT_INT, .def = "192", GE(0), INERT(DISAGG)),
    K("runtime", "resident_high_watermark_bytes", DF_RT_INT, .nullable = true, GT(0), INERT(DISAGG)),
    K("runtime", "resident_low_watermark_bytes", DF_RT_INT, .nullable = true, GE(0), INERT(DISAGG)),
    K("runtime", "feature_store_max_resident_bytes", DF_RT_INT, .nullable = true, GT(0), INERT(DISAGG)),
    // ---- deployment
    K("deployment", "mode", DF_RT_ENUM, .def = "local_colocated", .choices = DEPLOY_MODES, TODO(DISAGG),
      .hint = ONLINE_INSTEAD),
    K("deployment", "trainer", DF_RT_SECTION, USED),
    K("deployment", "disaggregated", DF_RT_SECTION, .nullable = true, TODO(DISAGG), .hint = ONLINE_INSTEAD),
    K("deployment.trainer", "nnodes", DF_RT_INT, .def = "1", GT(0), USED, .note = LAUNCH),
    K("deployment.trainer", "nproc_per_node", DF_RT_INT, .def = "1", GT(0), USED, .note = LAUNCH),
    K("deployment.trainer", "node_rank", DF_RT_INT, .nullable = true, GE(0), USED, .note = LAUNCH),
    K("deployment.trainer", "master_addr", DF_RT_STRING, .nullable = true, USED,
      .note = "rank 0's address for NCCL's id exchange when MASTER_ADDR is unset"),
    K("deployment.trainer", "master_port", DF_RT_INT, .def = "29500", GT(0), LE(65535), USED,
      .note = "the id exchange's port when MASTER_PORT is unset"),
// deployment.disaggregated: the producer/consumer topology. The section is refused as a whole, so these rows
// document SpecForge's keys (and their types) without ever being read.
#define DG "deployment.disaggregated"
    K(DG, "control_dir", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "consumer_state_dir", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "inbox_server_url", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "backend", DF_RT_ENUM, .nullable = true, .choices = STORE_BACKENDS, TODO(DISAGG)),
    K(DG, "store_root", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "store_id", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "server_urls", DF_RT_STRING_LIST, .nullable = true, TODO(DISAGG)),
    K(DG, "mooncake_metadata_server", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "mooncake_master_server_addr", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "mooncake_local_hostname", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "mooncake_protocol", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "mooncake_rdma_devices", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(DG, "producer_segment_size", DF_RT_INT, .nullable = true, GT(0), TODO(DISAGG)),
    K(DG, "client_buffer_size", DF_RT_INT, .def = "268435456", GT(0), TODO(DISAGG)),
    K(DG, "idle_timeout_s", DF_RT_FLOAT, .nullable = true, GT(0), TODO(DISAGG)),
    K(DG, "peer_wait_timeout_s", DF_RT_FLOAT, .nullable = true, GT(0), TODO(DISAGG)),
    K(DG, "producer_hold_s", DF_RT_FLOAT, .nullable = true, GT(0), TODO(DISAGG)),
    K(DG, "shutdown_grace_s", DF_RT_FLOAT, .def = "30.0", GT(0), TODO(DISAGG)),
    K(DG, "managed_local", DF_RT_SECTION, .nullable = true, TODO(DISAGG)),
#define ML DG ".managed_local"
    K(ML, "trainer_cuda_visible_devices", DF_RT_STRING_LIST, .nullable = true, TODO(DISAGG)),
    K(ML, "mooncake", DF_RT_SECTION, .nullable = true, TODO(DISAGG)),
    K(ML, "capture_servers", DF_RT_MAPPING_LIST, .nullable = true, TODO(DISAGG)),
    K(ML, "shutdown_grace_s", DF_RT_FLOAT, .def = "30.0", GT(0), TODO(DISAGG)),
    K(ML ".mooncake", "rpc_port", DF_RT_INT, .def = "35551", GT(0), LE(65535), TODO(DISAGG)),
    K(ML ".mooncake", "metadata_port", DF_RT_INT, .def = "35880", GT(0), LE(65535), TODO(DISAGG)),
    K(ML ".mooncake", "metrics_port", DF_RT_INT, .def = "35903", GT(0), LE(65535), TODO(DISAGG)),
    K(ML ".mooncake", "local_hostname", DF_RT_STRING, .def = "127.0.0.1", TODO(DISAGG)),
    K(ML ".mooncake", "protocol", DF_RT_ENUM, .def = "tcp", .choices = MOONCAKE_PROTOCOLS, TODO(DISAGG)),
    K(ML ".mooncake", "rdma_devices", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(ML ".mooncake", "global_segment_size_bytes", DF_RT_INT, .def = "34359738368", GT(0), TODO(DISAGG)),
    K(ML ".mooncake", "local_buffer_size_bytes", DF_RT_INT, .def = "1073741824", GT(0), TODO(DISAGG)),
    K(ML ".mooncake", "startup_timeout_s", DF_RT_FLOAT, .def = "60.0", GT(0), TODO(DISAGG)),
    K(ML ".capture_servers[]", "port", DF_RT_INT, .nullable = true, GT(0), LE(65535), TODO(DISAGG)),
    K(ML ".capture_servers[]", "cuda_visible_devices", DF_RT_STRING_LIST, .nullable = true, TODO(DISAGG)),
    K(ML ".capture_servers[]", "tp_size", DF_RT_INT, .def = "1", GT(0), TODO(DISAGG)),
    K(ML ".capture_servers[]", "mem_fraction_static", DF_RT_FLOAT, .nullable = true, GT(0), LE(1), TODO(DISAGG)),
    K(ML ".capture_servers[]", "attention_backend", DF_RT_STRING, .nullable = true, TODO(DISAGG)),
    K(ML ".capture_servers[]", "startup_timeout_s", DF_RT_FLOAT, .def = "1800.0", GT(0), TODO(DISAGG)),
#undef ML
#undef DG
};

const df_recipe_key *df_recipe_schema(void) { return SCHEMA; }

int df_recipe_schema_count(void) { return (int)(sizeof SCHEMA / sizeof SCHEMA[0]); }

int df_recipe_schema_find(const char *section, const char *key) {
  for (int i = 0; i < df_recipe_schema_count(); i++)
    if (!strcmp(SCHEMA[i].section, section) && !strcmp(SCHEMA[i].key, key)) return i;
  return -1;
}

bool df_recipe_schema_is_section(const char *section) {
  for (int i = 0; i < df_recipe_schema_count(); i++)
    if (!strcmp(SCHEMA[i].section, section)) return true;
  return false;
}
