// ExpertParallelComm and MpiExpertParallelGroup (expert_parallel.hpp): the EP groups of an
// MoE model's ranks and the all-to-alls that carry routed token rows to the experts' owners.
#include "ballast/runtime/expert_parallel.hpp"

#include <fmt/format.h>

#include <utility>

#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"

namespace ballast::runtime {

ExpertParallelComm::ExpertParallelComm(MPI_Comm comm, int expert_parallel)
    : expert_parallel_(expert_parallel) {
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  if (expert_parallel < 1 || ranks % expert_parallel != 0) {
    throw InputError(fmt::format("expert parallelism {} does not divide the plan's {} ranks; choose an EP "
                                 "size that divides them (EP groups are consecutive ranks)",
                                 expert_parallel, ranks));
  }
  first_rank_ = rank - rank % expert_parallel;
  if (expert_parallel == 1) return;
  check_mpi(MPI_Comm_split(comm, rank / expert_parallel, rank, &group_), "MPI_Comm_split (EP group)");
}

ExpertParallelComm::~ExpertParallelComm() {
  if (group_ != MPI_COMM_NULL) check_mpi(MPI_Comm_free(&group_), "MPI_Comm_free (EP group)");
}

MpiExpertParallelGroup::MpiExpertParallelGroup(MPI_Comm group, std::vector<bool> same_node)
    : group_(group), same_node_(std::move(same_node)) {
  check_mpi(MPI_Comm_rank(group, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(group, &size_), "MPI_Comm_size");
  BALLAST_CHECK(static_cast<int>(same_node_.size()) == size_, "EP group with a node map of another size");
}


void MpiExpertParallelGroup::exchange_counts(std::span<const int> send, int per_member,
                                             std::span<int> received) {
  BALLAST_CHECK(per_member >= 0 && send.size() == static_cast<std::size_t>(per_member) * size_ &&
                    received.size() == send.size(),
                "EP count exchange with buffers for another group size");
  timed_collective(stats_, calls_, [&] {
    check_mpi(MPI_Alltoall(send.data(), per_member, MPI_INT, received.data(), per_member, MPI_INT, group_),
              "MPI_Alltoall (expert parallel counts)");
  });
}

void MpiExpertParallelGroup::all_to_all(const float* send, std::span<const int> send_rows, int width,
                                        float* received, std::span<const int> received_rows) {
  BALLAST_CHECK(static_cast<int>(send_rows.size()) == size_ && static_cast<int>(received_rows.size()) == size_,
                "EP all-to-all with row counts for another group size");
  mpi_row_counts(send_rows, width, "an expert-parallel all-to-all", send_counts_, send_displacements_);
  mpi_row_counts(received_rows, width, "an expert-parallel all-to-all", received_counts_, received_displacements_);
  for (int m = 0; m < size_; ++m) {
    if (m == rank_) continue;  // rows an expert of this member runs stay here
    const std::int64_t bytes = static_cast<std::int64_t>(send_counts_[static_cast<std::size_t>(m)]) *
                               static_cast<std::int64_t>(sizeof(float));
    (same_node_[static_cast<std::size_t>(m)] ? stats_.intra_node_bytes_sent : stats_.inter_node_bytes_sent) += bytes;
  }
  timed_collective(stats_, calls_, [&] {
    check_mpi(MPI_Alltoallv(send, send_counts_.data(), send_displacements_.data(), MPI_FLOAT, received,
                            received_counts_.data(), received_displacements_.data(), MPI_FLOAT, group_),
              "MPI_Alltoallv (expert parallel rows)");
  });
}

}  // namespace ballast::runtime
