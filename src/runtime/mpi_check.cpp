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
  // The checker's own calls are not checked (tests/runtime/check_mpi_calls.py lists
  // them): it is already failing, and a failure here leaves rank -1 or exits below.
  int rank = -1;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  const bool running = initialized && !finalized;  // MPI_Abort is only allowed in between
  if (running) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "MPI error in %s on rank %d: %s\n", what, rank, message);
  std::fflush(stderr);
  if (running) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);  // MPI not initialised, already finalised, or MPI_Abort failed
}

}  // namespace ballast::runtime
