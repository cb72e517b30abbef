// MPI smoke test (no GoogleTest): every rank sends its rank to the next rank of a ring
// with MPI_Isend/MPI_Irecv and checks it received its predecessor's; an MPI_Allreduce sum
// of the ranks must equal size * (size - 1) / 2 on every rank. Exit status 0 only if
// every rank passed (the verdict is itself all-reduced), so mpiexec reports failure.
#include <mpi.h>

#include <cstdio>

#include "ballast/runtime/mpi.hpp"

using ballast::runtime::check_mpi;

int main(int argc, char** argv) {
  check_mpi(MPI_Init(&argc, &argv), "MPI_Init");
  // Errors come back as return codes that check_mpi turns into a readable abort.
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0;
  int size = 0;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");

  int failures = 0;
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  int sent = rank;
  int received = -1;
  MPI_Request requests[2];
  check_mpi(MPI_Irecv(&received, 1, MPI_INT, previous, 7, MPI_COMM_WORLD, &requests[0]), "MPI_Irecv");
  check_mpi(MPI_Isend(&sent, 1, MPI_INT, next, 7, MPI_COMM_WORLD, &requests[1]), "MPI_Isend");
  check_mpi(MPI_Waitall(2, requests, MPI_STATUSES_IGNORE), "MPI_Waitall");
  if (received != previous) {
    std::fprintf(stderr, "mpi_smoke: rank %d of %d received %d from the ring, expected %d\n", rank,
                 size, received, previous);
    ++failures;
  }

  long long sum = 0;
  const long long mine = rank;
  check_mpi(MPI_Allreduce(&mine, &sum, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  const long long expected = static_cast<long long>(size) * (size - 1) / 2;
  if (rank == 0 && sum != expected) {
    std::fprintf(stderr, "mpi_smoke: MPI_Allreduce sum of ranks is %lld, expected %lld\n", sum,
                 expected);
    ++failures;
  }

  int total_failures = 0;
  check_mpi(MPI_Allreduce(&failures, &total_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD),
            "MPI_Allreduce");
  if (rank == 0) {
    std::printf("mpi_smoke: %d ranks, %s\n", size, total_failures == 0 ? "passed" : "FAILED");
  }
  check_mpi(MPI_Finalize(), "MPI_Finalize");
  return total_failures == 0 ? 0 : 1;
}
