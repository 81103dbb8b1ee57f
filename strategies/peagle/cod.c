// COD sampling (docs/peagle.md §3): SpecForge's generate_cod_sample_indices over one sample, with draftforge's RNG in
// place of torch.randperm (a partial Fisher–Yates draw of the same size, then sorted), so a run is reproducible and
// its Python twin (tools/reference/peagle_step.py) draws the same rows. Depth d keeps max(r^d, r_min) of the
// supervised positions that lie d past an anchor of the same sample, chosen among the targets of depth d − 1's rows
// moved one further: the anchors of depth d are a subset of depth d − 1's.
#include <stdlib.h>

#include "strategies/peagle/peagle.h"

static int cmp_i32(const void *a, const void *b) {
  const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
  return (x > y) - (x < y);
}

int64_t df_peagle_cod(const uint8_t *lm, int64_t S, int64_t L, int64_t T, double ratio, double ratio_min, bool full,
                      df_rng *rng, int32_t *anchors, int64_t *counts, int32_t *work) {
  int32_t *prev = work, *elig = work + S, *idx = work + 2 * S;
  int64_t nvalid = 0, nprev = 0, out = 0;
  for (int64_t p = 0; p < S; p++)
    if (lm[p]) prev[nprev++] = (int32_t)p;
  nvalid = nprev;
  counts[0] = S;
  for (int64_t d = 1; d < T; d++) counts[d] = 0;
  double powr = 1.0;
  for (int64_t d = 1; d < T; d++) {
    powr *= ratio; // r^d by repeated products: the same double on every machine (the Python twin does the same)
    int64_t ne = 0;
    for (int64_t i = 0; i < nprev; i++) // targets at least d in, inside the sample (its one document)
      if (prev[i] >= d && prev[i] < L) elig[ne++] = prev[i];
    const int64_t valid_length = nvalid - d > 0 ? nvalid - d : 0;
    const double keep = full ? 1.0 : (powr > ratio_min ? powr : ratio_min);
    int64_t k = (int64_t)((double)valid_length * keep);
    if (k > ne) k = ne;
    if (k <= 0) break;
    int32_t *rows = anchors + out;
    if (ne > k) {
      for (int64_t i = 0; i < ne; i++) idx[i] = (int32_t)i;
      for (int64_t i = 0; i < k; i++) { // partial Fisher–Yates: k distinct picks
        const int64_t j = i + (int64_t)df_rng_below(rng, (uint64_t)(ne - i));
        const int32_t t = idx[i];
        idx[i] = idx[j], idx[j] = t;
      }
      for (int64_t i = 0; i < k; i++) rows[i] = elig[idx[i]];
      qsort(rows, (size_t)k, sizeof *rows, cmp_i32);
    } else {
      for (int64_t i = 0; i < k; i++) rows[i] = elig[i]; // ascending already
    }
    nprev = 0; // the next depth's candidates: one further, still supervised
    for (int64_t i = 0; i < k; i++) {
      const int64_t t = (rows[i] + 1) % S;
      if (t != 0 && lm[t]) prev[nprev++] = (int32_t)t;
    }
    for (int64_t i = 0; i < k; i++) rows[i] -= (int32_t)d; // targets to anchors
    counts[d] = k, out += k;
  }
  return out;
}
