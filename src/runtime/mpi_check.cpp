#include <mpi.h>

#include <cstdio>
#include <cstdlib>

#include "ballast/runtime/mpi.hpp"

namespace ballast::runtime {

void check_mpi(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(rc, message, &length) != MPI_SUCCESS) {
    std::snprintf(message, sizeof message, "unknown MPI error code %d", rc);
  }
  int rank = -1;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "MPI error in %s on rank %d: %s\n", what, rank, message);
  std::fflush(stderr);
  if (initialized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI not (yet) initialised: nothing to abort
}

}  // namespace ballast::runtime
