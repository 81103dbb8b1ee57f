// The TCP exchange that hands a small blob (NCCL's unique id) from rank 0 to every other rank before any
// communicator exists, the torchrun way: rank 0 listens on a port, the others connect to MASTER_ADDR at it.
// One request and one answer per rank, once; it is a bootstrap, never a transport for training data.
#ifndef DF_TRAIN_DIST_TCP_BOOTSTRAP_H
#define DF_TRAIN_DIST_TCP_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#include "base/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_TCP_BOOTSTRAP_MAX_BLOB 4096

typedef struct {
  const char *addr; // where rank 0 listens (clients connect here; rank 0 listens on every interface)
  int port;
  int rank, world_size;
  uint64_t job_key; // every rank passes the same value (a hash of the run), so another job's server is refused
  double timeout_s; // rank 0: until every rank has its copy; the others: until they have theirs
} df_tcp_bootstrap_options;

// Rank 0 sends blob (len bytes) to every other rank; the others receive it into blob. Rank 0 returns once all
// world − 1 ranks were served; past the timeout the error names the ranks that never came (rank 0) or the
// address that never answered (the others). Malformed connections (port scanners, another protocol) are
// dropped without disturbing the exchange.
df_status df_tcp_bootstrap(const df_tcp_bootstrap_options *o, void *blob, size_t len, df_error *err);

#ifdef __cplusplus
}
#endif

#endif
