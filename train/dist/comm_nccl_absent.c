// Built when CMake found no CUDA toolkit with NCCL: the NCCL communicator answers with what is missing.
#include "train/dist/comm.h"

#define NO_NCCL_HINT "build on a machine with the CUDA toolkit and NCCL (nccl.h, libnccl), or run on the CPU (MPI)"

df_status df_comm_nccl_new_id(df_nccl_id *id, df_error *err) {
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "NCCL", NO_NCCL_HINT, "this draftforge was built without NCCL");
}

df_status df_comm_create_nccl(const df_comm_nccl_options *opt, df_comm **out, df_error *err) {
  *out = NULL;
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "NCCL", NO_NCCL_HINT,
                 "this draftforge was built without NCCL, which GPU data-parallel runs need");
}
