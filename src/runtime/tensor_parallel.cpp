// TensorParallelComms and MpiTensorParallelGroup (tensor_parallel.hpp): the communicators
// of an MPI rank under tensor parallelism and the sequence-parallel collectives of its group.
#include "ballast/runtime/tensor_parallel.hpp"

#include <fmt/format.h>


#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"

namespace ballast::runtime {

TensorParallelComms::TensorParallelComms(MPI_Comm comm, int plan_ranks, int tensor_parallel)
    : tensor_parallel_(tensor_parallel), plan_(comm) {
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  BALLAST_CHECK(tensor_parallel >= 1, "a tensor-parallel size below 1");
  if (ranks != plan_ranks * tensor_parallel) {
    throw InputError(fmt::format(
        "the plan has {} ranks{} but the job has {} MPI ranks; run with mpirun -np {}", plan_ranks,
        tensor_parallel > 1 ? fmt::format(" (TP groups) of {} GPUs each", tensor_parallel) : "",
        ranks, plan_ranks * tensor_parallel));
  }
  plan_rank_ = rank / tensor_parallel;
  if (tensor_parallel == 1) return;
  const int member = rank % tensor_parallel;
  check_mpi(MPI_Comm_split(comm, member, plan_rank_, &plan_), "MPI_Comm_split (plan ranks)");
  owns_plan_ = true;
  check_mpi(MPI_Comm_split(comm, plan_rank_, member, &group_), "MPI_Comm_split (TP group)");
}

TensorParallelComms::~TensorParallelComms() {
  if (owns_plan_) check_mpi(MPI_Comm_free(&plan_), "MPI_Comm_free (plan ranks)");
  if (group_ != MPI_COMM_NULL) check_mpi(MPI_Comm_free(&group_), "MPI_Comm_free (TP group)");
}

MpiTensorParallelGroup::MpiTensorParallelGroup(MPI_Comm group) : group_(group) {
  check_mpi(MPI_Comm_rank(group, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(group, &size_), "MPI_Comm_size");
}

void MpiTensorParallelGroup::set_counts(std::span<const int> row_counts, int width) {
  BALLAST_CHECK(static_cast<int>(row_counts.size()) == size_,
                "TP collective with row counts for another group size");
  mpi_row_counts(row_counts, width, "a tensor-parallel collective", counts_, displacements_);
}

void MpiTensorParallelGroup::all_gather(const float* mine, std::span<const int> row_counts, int width,
                                        float* all) {
  set_counts(row_counts, width);
  const int my_floats = counts_[static_cast<std::size_t>(rank_)];
  // My shard goes to every other member.
  stats_.intra_node_bytes_sent += static_cast<std::int64_t>(my_floats) * (size_ - 1) *
                                  static_cast<std::int64_t>(sizeof(float));
  timed_collective(stats_, calls_, [&] {
    check_mpi(MPI_Allgatherv(mine, my_floats, MPI_FLOAT, all, counts_.data(), displacements_.data(),
                             MPI_FLOAT, group_),
              "MPI_Allgatherv (tensor parallel)");
  });
}

void MpiTensorParallelGroup::reduce_scatter(const float* all, std::span<const int> row_counts, int width,
                                            float* mine) {
  set_counts(row_counts, width);
  std::int64_t others = 0;  // every other member's rows go to their owner
  for (int m = 0; m < size_; ++m) {
    if (m != rank_) others += counts_[static_cast<std::size_t>(m)];
  }
  stats_.intra_node_bytes_sent += others * static_cast<std::int64_t>(sizeof(float));
  timed_collective(stats_, calls_, [&] {
    check_mpi(MPI_Reduce_scatter(all, mine, counts_.data(), MPI_FLOAT, MPI_SUM, group_),
              "MPI_Reduce_scatter (tensor parallel)");
  });
}

}  // namespace ballast::runtime
