// Built when CMake found no MPI: the MPI communicator answers with what to install.
#include "train/dist/comm.h"

df_status df_comm_create_mpi(const df_comm_mpi_options *opt, df_comm **out, df_error *err) {
  *out = NULL;
  return DF_FAIL(err, DF_ERR_UNSUPPORTED, "MPI",
                 "install OpenMPI (Debian: openmpi-bin libopenmpi-dev; scripts/setup.sh does) and rebuild",
                 "this draftforge was built without MPI, which CPU data-parallel runs need");
}
