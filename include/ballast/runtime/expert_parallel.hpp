// Expert parallelism over MPI (docs/runtime.md, "Expert parallelism"): an MoE model's plan
// ranks in groups of E consecutive ranks (ranks Ei .. Ei + E - 1), member m of a group
// owning the experts {e : e % E == m} of every layer. ExpertParallelComm splits the job's
// communicator into the groups; MpiExpertParallelGroup runs a group's all-to-alls (the
// dispatch of routed token rows to the experts' owners and their return) and measures them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <mpi.h>

#include "ballast/runtime/model.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

/// This rank's EP group of `expert_parallel` consecutive ranks of `comm` (rank = member
/// index); expert_parallel = 1 makes none. Collective over `comm` (a split).
class ExpertParallelComm {
 public:
  /// Throws InputError unless expert_parallel >= 1 divides the ranks of `comm`.
  ExpertParallelComm(MPI_Comm comm, int expert_parallel);
  ~ExpertParallelComm();
  ExpertParallelComm(const ExpertParallelComm&) = delete;
  ExpertParallelComm& operator=(const ExpertParallelComm&) = delete;

  int expert_parallel() const { return expert_parallel_; }
  /// The group's communicator; MPI_COMM_NULL without expert parallelism.
  MPI_Comm group() const { return group_; }
  /// `comm`'s rank of the group's first member.
  int first_rank() const { return first_rank_; }

 private:
  int expert_parallel_ = 1;
  int first_rank_ = 0;
  MPI_Comm group_ = MPI_COMM_NULL;
};

/// An EP group over an MPI communicator (rank = member index): MPI_Alltoall of the row
/// counts and MPI_Alltoallv of the rows, their wall and CPU time and the bytes this member
/// sends to the others, intra- or inter-node by `same_node[m]` (member m shares this
/// member's node).
class MpiExpertParallelGroup final : public ExpertParallelGroup {
 public:
  MpiExpertParallelGroup(MPI_Comm group, std::vector<bool> same_node);
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void exchange_counts(std::span<const int> send, int per_member, std::span<int> received) override;
  void all_to_all(const float* send, std::span<const int> send_rows, int width, float* received,
                  std::span<const int> received_rows) override;

  /// Wall and CPU time blocked in the collectives and bytes sent per link class.
  const CommunicationStats& stats() const { return stats_; }
  /// Every collective's wall interval (MPI_Wtime), for the measured timeline.
  const std::vector<WallInterval>& calls() const { return calls_; }

 private:
  /// MPI counts and displacements of rows of `width` floats; throws InputError beyond int.

  MPI_Comm group_;
  int size_ = 1;
  int rank_ = 0;
  std::vector<bool> same_node_;
  std::vector<int> send_counts_, send_displacements_, received_counts_, received_displacements_;
  CommunicationStats stats_;
  std::vector<WallInterval> calls_;
};

}  // namespace ballast::runtime
