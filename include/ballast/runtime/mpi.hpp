// MPI helpers of the runtime's distributed engine (library ballast_runtime_mpi, linked
// with MPI::MPI_CXX). Only code that runs under mpiexec includes this.
#pragma once

namespace ballast::runtime {

/// Checks the return code of an MPI call: on anything but MPI_SUCCESS prints
/// "MPI error in WHAT on rank R: <MPI_Error_string>" to stderr and calls
/// MPI_Abort(MPI_COMM_WORLD, 1), so a failing rank takes the whole job down instead of
/// leaving the others blocked. Calls must return codes, not abort inside MPI: set
/// MPI_ERRORS_RETURN on the communicator (MPI's default handler aborts without a message).
void check_mpi(int rc, const char* what);

}  // namespace ballast::runtime
