// The whole training step on the GPU through the CLI, against the CPU's fp32 results:
//   - `draftforge step --device cuda` on every DFlash, DSpark, MoE and Domino parity fixture: the trainer's storage is
//   fp32
//     on the GPU too, so the CPU parity test's tolerances apply: loss rel ≤ 1e-5 against the fixture's PyTorch
//     fp32 loss, every gradient tensor max|Δ| ≤ 1e-4·max|ref| + 1e-6 (a bf16-storage run would get 1e-2);
//   - 50 training steps of the synthetic-data demo recipes on GPU and CPU: mean relative loss gap ≤ 2e-2 over the
//     curve, and the last 10 steps' mean loss within 3e-2 (recipes/demo-dflash.yaml needs captured data);
//   - resume on the GPU: 25 steps, resume to 50, against 50 straight (one LR horizon, training.total_steps, for all
//     three runs): every logged loss bit for bit.
// In the CUDA emulator (DF_CUDA=EMU), where a demo step costs about a hundred times the CPU backend's, the demo runs
// take 20 steps of batch 2 with 4 anchors (the last 5 steps as the tail), under the same checks.
// These need the CUDA backend wired into the op table (training.device: cuda / --device cuda); on a machine without
// a GPU they skip. On a GPU machine where the device option is still missing they fail and say so.
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "modeling/safetensors.h"
#include "tests/cuda/cu_test.h"

static double json_num(json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }

#ifdef DF_CUDA_EMU
enum { STEPS = 20, TAIL = 5 };
#define DEMO_SHAPE "--set training.batch_size=2 --set training.num_anchors=4"
#else
enum { STEPS = 50, TAIL = 10 };
#define DEMO_SHAPE ""
#endif

static void expect_grads_close(const char *name, const char *want_path, const char *got_path) {
  df_st_file *wf = NULL, *gf = NULL;
  df_error err = {0};
  DF_ASSERT_OK(df_st_open(want_path, &wf, &err), &err);
  DF_ASSERT_OK(df_st_open(got_path, &gf, &err), &err);
  cr_expect_eq(df_st_count(gf), df_st_count(wf), "%s: gradient tensor count", name);
  for (int i = 0; i < df_st_count(wf); i++) {
    const df_st_tensor *w = df_st_at(wf, i), *g = df_st_find(gf, w->name);
    cr_expect_not_null(g, "%s: gradient %s missing", name, w->name);
    if (!g || g->numel != w->numel) continue;
    float *x = malloc(4 * (size_t)w->numel + 4), *y = malloc(4 * (size_t)w->numel + 4);
    DF_ASSERT_OK(df_st_read_f32(gf, g, x, g->numel, &err), &err);
    DF_ASSERT_OK(df_st_read_f32(wf, w, y, w->numel, &err), &err);
    double maxd = 0, ref = 0;
    for (int64_t k = 0; k < w->numel; k++) {
      maxd = fmax(maxd, isnan(x[k]) ? INFINITY : fabs((double)x[k] - y[k]));
      ref = fmax(ref, fabs((double)y[k]));
    }
    cr_expect_leq(maxd, 1e-4 * ref + 1e-6, "%s: %s max|Δ| %.3g > 1e-4·max|ref| (%.3g) + 1e-6", name, w->name, maxd,
                  ref);
    free(x), free(y);
  }
  df_st_close(wf), df_st_close(gf);
}

static void step_cases(const char *sub) {
  char dir[600];
  snprintf(dir, sizeof dir, "%s/%s", CU_FIXTURE_PATH, sub);
  DIR *d = opendir(dir);
  cr_assert_not_null(d, "%s", dir);
  struct dirent *ent;
  int ran = 0;
  while ((ent = readdir(d))) {
    if (ent->d_name[0] == '.') continue;
    char recipe[1200], want[1200], wantg[1200], out[128], args[2600], log[256], got[300], gotg[300];
    snprintf(recipe, sizeof recipe, "%s/%s/recipe.yaml", dir, ent->d_name);
    if (access(recipe, R_OK) != 0) continue;
    snprintf(want, sizeof want, "%s/%s/expected/step.json", dir, ent->d_name);
    snprintf(wantg, sizeof wantg, "%s/%s/expected/grads.safetensors", dir, ent->d_name);
    cu_tmpdir(out, sizeof out, "step");
    snprintf(log, sizeof log, "%s/log.txt", out);
    snprintf(args, sizeof args, "step '%s' --dump '%s' --device cuda", recipe, out);
    cr_expect_eq(cu_run_cli(args, log), 0, "%s/%s: draftforge step on the GPU failed", sub, ent->d_name);
    snprintf(got, sizeof got, "%s/step.json", out);
    snprintf(gotg, sizeof gotg, "%s/grads.safetensors", out);
    json_error_t je;
    json_t *w = json_load_file(want, 0, &je), *g = json_load_file(got, 0, &je);
    cr_expect(w && g, "%s: step.json missing", ent->d_name);
    if (w && g) {
      const double lw = json_num(w, "loss"), lg = json_num(g, "loss"), e = fabs(lg - lw) / fmax(fabs(lw), 1e-30);
      cr_expect_leq(e, 1e-5, "%s/%s: GPU loss %.8g vs fp32 reference %.8g (rel %.3g)", sub, ent->d_name, lg, lw, e);
      expect_grads_close(ent->d_name, wantg, gotg);
    }
    json_decref(w), json_decref(g);
    cu_rmtree(out);
    ran++;
  }
  closedir(d);
  cr_expect_gt(ran, 0, "no cases under %s", dir);
}

Test(cuda_step, dflash_fixtures_on_gpu_match_fp32, .timeout = 300) {
  CU_REQUIRE_GPU();
  step_cases("dflash_step");
}

Test(cuda_step, dspark_fixtures_on_gpu_match_fp32, .timeout = 300) {
  CU_REQUIRE_GPU();
  step_cases("dspark_step");
}

Test(cuda_step, moe_fixtures_on_gpu_match_fp32, .timeout = 300) {
  CU_REQUIRE_GPU();
  step_cases("moe_step");
}

// Domino: the GRU, the masked SiLU, the two-logit-set LM head and its metrics on the GPU (step.json's loss is
// SpecForge's per-micro-step ratio, as the fixture's).
Test(cuda_step, domino_fixtures_on_gpu_match_fp32, .timeout = 300) {
  CU_REQUIRE_GPU();
  step_cases("domino_step");
}

// The train lines' losses of a run's metrics.jsonl (n at most).
static int read_losses(const char *run, double *loss, int n) {
  char p[400];
  snprintf(p, sizeof p, "%s/metrics.jsonl", run);
  FILE *f = fopen(p, "r");
  cr_assert_not_null(f, "%s", p);
  char line[1 << 14];
  int k = 0;
  while (k < n && fgets(line, sizeof line, f)) {
    json_error_t je;
    json_t *o = json_loads(line, 0, &je);
    if (o && json_object_get(o, "loss") && json_object_get(o, "lr")) loss[k++] = json_num(o, "loss");
    json_decref(o);
  }
  fclose(f);
  return k;
}

// max_steps: STEPS unless extra sets it (a later --set wins).
static void train_run(const char *recipe, const char *out, const char *device, const char *extra) {
  char args[2400], log[500];
  snprintf(log, sizeof log, "%s.log", out);
  snprintf(args, sizeof args,
           "train '%s/%s' --set output_dir='%s' --set training.device=%s --set training.max_steps=%d "
           "--set training.eval_interval=0 --set training.log_interval=1 %s %s",
           CU_SOURCE_PATH, recipe, out, device, STEPS, DEMO_SHAPE, extra ? extra : "");
  cr_assert_eq(cu_run_cli(args, log), 0, "training %s on %s failed", recipe, device);
}

static void curves_agree(const char *recipe) {
  char root[128], cpu[300], gpu[300];
  cu_tmpdir(root, sizeof root, "curve");
  snprintf(cpu, sizeof cpu, "%s/cpu", root), snprintf(gpu, sizeof gpu, "%s/gpu", root);
  train_run(recipe, cpu, "cpu", NULL);
  train_run(recipe, gpu, "cuda", NULL);
  double lc[STEPS], lg[STEPS];
  const int nc = read_losses(cpu, lc, STEPS), ng = read_losses(gpu, lg, STEPS);
  cr_assert_eq(nc, STEPS, "%s: CPU logged %d steps", recipe, nc);
  cr_assert_eq(ng, STEPS, "%s: GPU logged %d steps", recipe, ng);
  double mean_rel = 0, tail_c = 0, tail_g = 0;
  for (int i = 0; i < STEPS; i++) {
    mean_rel += fabs(lg[i] - lc[i]) / fmax(fabs(lc[i]), 1e-30) / STEPS;
    if (i >= STEPS - TAIL) tail_c += lc[i] / TAIL, tail_g += lg[i] / TAIL;
  }
  cr_expect_leq(mean_rel, 2e-2, "%s: mean relative loss gap GPU vs CPU %.3g", recipe, mean_rel);
  cr_expect_leq(fabs(tail_g - tail_c) / tail_c, 3e-2, "%s: last-%d mean loss GPU %.6g vs CPU %.6g", recipe, TAIL,
                tail_g, tail_c);
  cu_rmtree(root);
}

Test(cuda_step, demo_loss_curve_dflash_gpu_vs_cpu, .timeout = 300) {
  CU_REQUIRE_GPU();
  curves_agree("recipes/demo-dflash-synthetic.yaml");
}

Test(cuda_step, demo_loss_curve_dspark_gpu_vs_cpu, .timeout = 300) {
  CU_REQUIRE_GPU();
  curves_agree("recipes/demo-dspark.yaml");
}

Test(cuda_step, demo_loss_curve_moe_gpu_vs_cpu, .timeout = 300) {
  CU_REQUIRE_GPU();
  curves_agree("recipes/demo-dflash-moe.yaml");
}

Test(cuda_step, demo_loss_curve_dspark_moe_gpu_vs_cpu, .timeout = 300) {
  CU_REQUIRE_GPU();
  curves_agree("recipes/demo-dspark-moe.yaml");
}

Test(cuda_step, resume_on_gpu_is_bit_exact, .timeout = 600) {
  CU_REQUIRE_GPU();
  char root[128], straight[300], split[300], extra[700];
  cu_tmpdir(root, sizeof root, "resume");
  snprintf(straight, sizeof straight, "%s/straight", root), snprintf(split, sizeof split, "%s/split", root);
  // One LR horizon for the three runs (training.total_steps): the resumed run must continue the split run's schedule,
  // and the trainer refuses a resume whose horizon differs from the checkpoint's.
  char common[200], first[300];
  snprintf(common, sizeof common, "--set training.save_interval=%d --set training.total_steps=%d", STEPS / 2, STEPS);
  train_run("recipes/demo-dflash-synthetic.yaml", straight, "cuda", common);
  snprintf(first, sizeof first, "%s --set training.max_steps=%d", common, STEPS / 2);
  train_run("recipes/demo-dflash-synthetic.yaml", split, "cuda", first);
  snprintf(extra, sizeof extra, "%s --resume '%s'", common, split);
  train_run("recipes/demo-dflash-synthetic.yaml", split, "cuda", extra); // max_steps back to STEPS
  double a[STEPS], b[STEPS];
  cr_assert_eq(read_losses(straight, a, STEPS), STEPS);
  cr_assert_eq(read_losses(split, b, STEPS), STEPS);
  for (int i = 0; i < STEPS; i++) cr_expect(a[i] == b[i], "step %d: loss %.17g vs resumed %.17g", i + 1, a[i], b[i]);
  cu_rmtree(root);
}
