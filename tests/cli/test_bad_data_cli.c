// NaN/Inf in one sample's hidden states (issue 16 "Bad data"): `draftforge inspect` reports it by shard, sample
// and token (sampled by default, --full for every sample), training refuses it at start-up (and, when the scan is
// off, names the sample of every step it skips), and eval of it fails naming the samples.
#include <criterion/criterion.h>
#include <hdf5.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/common/cli_run.h"

#define FX DF_FIXTURE_DIR "/dflash_step"

static char out[1 << 16];

// root/<dir>/shard_000.h5: the fixture's 6 float32 samples with hidden_states[sample, token, column] = value.
static void poisoned_copy(const df_cli_dir *d, const char *dir, int64_t sample, int64_t token, int64_t column,
                          float value) {
  char cmd[900], path[600];
  snprintf(cmd, sizeof cmd, "mkdir -p %s/%s && cp %s/data/shard_000.h5 %s/%s/", d->root, dir, FX, d->root, dir);
  cr_assert_eq(system(cmd), 0);
  snprintf(path, sizeof path, "%s/%s/shard_000.h5", d->root, dir);
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  cr_assert_geq(f, 0);
  int64_t off[7];
  hid_t o = H5Dopen2(f, "sample_offsets", H5P_DEFAULT);
  cr_assert_geq(H5Dread(o, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, off), 0);
  H5Dclose(o);
  hid_t h = H5Dopen2(f, "hidden_states", H5P_DEFAULT), fs = H5Dget_space(h);
  hsize_t start[2] = {(hsize_t)(off[sample] + token), (hsize_t)column}, count[2] = {1, 1};
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, start, NULL, count, NULL);
  hid_t ms = H5Screate_simple(2, count, NULL);
  cr_assert_geq(H5Dwrite(h, H5T_NATIVE_FLOAT, ms, fs, H5P_DEFAULT, &value), 0);
  H5Sclose(ms), H5Sclose(fs), H5Dclose(h), H5Fclose(f);
}

Test(bad_data_cli, inspect_reports_non_finite_values_by_shard_sample_and_token) {
  df_cli_dir d;
  df_cli_dir_open(&d, "inspect_nan", NULL);
  poisoned_copy(&d, "nan", 3, 2, 5, NAN);
  poisoned_copy(&d, "inf", 1, 7, 100, INFINITY);
  cr_expect_eq(df_cli_run(&d, "inspect nan", out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "nan/shard_000.h5: sample 3 (#3), token 2: hidden_states column 5 is NaN"), "%s", out);
  cr_expect(strstr(out, "sampled scan of 6 samples"), "it says which scan ran: %s", out);
  cr_expect_eq(df_cli_run(&d, "inspect --full inf/shard_000.h5", out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "sample 1 (#1), token 7: hidden_states column 100 is +Inf"), "%s", out);
  cr_expect(strstr(out, "full scan of 6 samples"), "%s", out);
  char fx[300];
  snprintf(fx, sizeof fx, "inspect %s/data", FX);
  cr_expect_eq(df_cli_run(&d, fx, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "non-finite values: none"), "%s", out);
  // 160 small samples: the sampled scan reads 16 (the 256 MiB budget allows them all), as the Python tool does
  snprintf(fx, sizeof fx, "inspect %s/recipes/demo/train", DF_SOURCE_DIR);
  cr_expect_eq(df_cli_run(&d, fx, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "none (sampled scan of 16 of 160 samples; --full reads every sample)"), "%s", out);
  df_cli_dir_close(&d);
}

Test(bad_data_cli, training_refuses_non_finite_data_at_start_up) {
  df_cli_dir d;
  df_cli_dir_open(&d, "train_nan", NULL);
  poisoned_copy(&d, "nan", 3, 2, 5, NAN);
  cr_expect_eq(
      df_cli_run(&d, "train recipe.yaml --set output_dir=r --set data.hidden_states_path=nan", out, sizeof out), 1,
      "%s", out);
  cr_expect(strstr(out, "data.hidden_states_path") && strstr(out, "sample 3 (#3), token 2"), "%s", out);
  cr_expect(strstr(out, "sampled scan"), "%s", out);
  cr_expect_null(strstr(out, "step 1/"), "%s", out);
  df_cli_dir_close(&d);
}

// Which sample lands in which window depends on the data order; sample 3 is in some window of every epoch.
Test(bad_data_cli, training_names_the_sample_of_every_skipped_step) {
  df_cli_dir d;
  df_cli_dir_open(&d, "skip_nan", NULL);
  poisoned_copy(&d, "nan", 3, 2, 5, NAN);
  cr_expect_eq(df_cli_run(&d,
                          "train recipe.yaml --set output_dir=r --set data.hidden_states_path=nan "
                          "--set training.max_steps=6 --set training.max_consecutive_skips=6 --data-scan none",
                          out, sizeof out),
               0, "%s", out);
  cr_expect(strstr(out, "skipped step ") && strstr(out, "sample 3 (#3), token 2: hidden_states column 5 is NaN"), "%s",
            out);
  char *m = df_cli_slurp(&d, "r/metrics.jsonl");
  cr_assert(m);
  int skipped = 0;
  for (char *line = strtok(m, "\n"); line; line = strtok(NULL, "\n")) {
    json_t *o = json_loads(line, 0, NULL);
    if (o && json_is_true(json_object_get(o, "skipped"))) {
      skipped++;
      json_t *ids = json_object_get(o, "skip_samples");
      cr_expect(json_array_size(ids) == 1 && json_integer_value(json_array_get(ids, 0)) == 3, "%s", line);
    }
    json_decref(o);
  }
  cr_expect_geq(skipped, 2, "6 steps read 4 epochs: the window holding sample 3 is skipped in each: %s", out);
  free(m);
  df_cli_dir_close(&d);
}

Test(bad_data_cli, eval_with_a_non_finite_result_fails_naming_the_samples) {
  df_cli_dir d;
  df_cli_dir_open(&d, "eval_nan", NULL);
  poisoned_copy(&d, "nan", 4, 0, 0, NAN);
  char args[600];
  snprintf(args, sizeof args, "eval %s/draft_ckpt --recipe recipe.yaml --data nan --out e.json", FX);
  cr_expect_eq(df_cli_run(&d, args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "not finite") && strstr(out, "#4") && strstr(out, "sample 4 (#4), token 0"), "%s", out);
  cr_expect_not(df_cli_exists(&d, "e.json"), "no report of a non-finite result");
  snprintf(args, sizeof args, "eval %s/draft_ckpt --recipe recipe.yaml --data %s/data --out ok.json", FX, FX);
  cr_expect_eq(df_cli_run(&d, args, out, sizeof out), 0, "%s", out);
  df_cli_dir_close(&d);
}
