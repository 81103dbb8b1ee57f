// The manifest of a checkpoint directory (docs/training.md "Checkpoints"): manifest.json lists every file with
// its size and XXH3-64 checksum (libxxhash). It is written last, so a checkpoint with a manifest was written
// whole; verifying it catches a file truncated or changed later (disk full on a copy, a partial sync).
#ifndef DF_TRAIN_RUN_CKPT_MANIFEST_H
#define DF_TRAIN_RUN_CKPT_MANIFEST_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_CKPT_MANIFEST         "manifest.json"
#define DF_CKPT_MANIFEST_FORMAT  "draftforge-checkpoint-manifest"
#define DF_CKPT_MANIFEST_VERSION 1

// XXH3-64 of a file's bytes, and its size.
df_status df_file_xxh3(const char *path, uint64_t *hash, int64_t *size, df_error *err);

// Hashes every regular file directly in dir (the manifest excepted) and writes dir/manifest.json (fsynced).
df_status df_ckpt_manifest_write(const char *dir, df_error *err);

// Checks every file the manifest lists: present, the same size, the same checksum. A directory without a
// manifest (written before manifests existed) passes with *has_manifest false. The error (DF_ERR_FORMAT) names
// the damaged file and what differs.
df_status df_ckpt_manifest_verify(const char *dir, bool *has_manifest, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
