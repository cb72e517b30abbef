// Tensor parallelism over MPI (docs/runtime.md, "Tensor parallelism"): a plan whose
// cluster has TP groups of N GPUs runs on plan.cluster.ranks() x N MPI ranks, MPI rank r
// being member r % N of plan rank (TP group) r / N. TensorParallelComms splits the job's
// communicator into the TP group's ranks (the sequence-parallel all-gathers and
// reduce-scatters of the linears) and the ranks of the same member index across groups
// (the plan's attention engine, each member with its 1/N of the heads);
// MpiTensorParallelGroup runs the group's collectives and measures them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <mpi.h>

#include "ballast/runtime/model.hpp"
#include "ballast/runtime/plan_engine.hpp"

namespace ballast::runtime {

/// The two communicators of an MPI rank under N-way tensor parallelism; N = 1 keeps the
/// job's communicator as the plan's and makes no group. Collective over `comm` (splits).
class TensorParallelComms {
 public:
  /// Throws InputError unless `comm` has plan_ranks x tensor_parallel ranks.
  TensorParallelComms(MPI_Comm comm, int plan_ranks, int tensor_parallel);
  ~TensorParallelComms();
  TensorParallelComms(const TensorParallelComms&) = delete;
  TensorParallelComms& operator=(const TensorParallelComms&) = delete;

  int tensor_parallel() const { return tensor_parallel_; }
  /// The ranks of this member index, rank = plan rank (the attention engine's).
  MPI_Comm plan() const { return plan_; }
  /// This rank's TP group, rank = member index; MPI_COMM_NULL without tensor parallelism.
  MPI_Comm group() const { return group_; }
  int plan_rank() const { return plan_rank_; }

 private:
  int tensor_parallel_ = 1;
  int plan_rank_ = 0;
  MPI_Comm plan_ = MPI_COMM_NULL;
  MPI_Comm group_ = MPI_COMM_NULL;
  bool owns_plan_ = false;
};

/// A TP group over an MPI communicator (rank = member index): MPI_Allgatherv and
/// MPI_Reduce_scatter on rows of floats, their wall and CPU time and the bytes this member
/// sends (intra-node: a TP group is GPUs of one node).
class MpiTensorParallelGroup final : public TensorParallelGroup {
 public:
  explicit MpiTensorParallelGroup(MPI_Comm group);
  int size() const override { return size_; }
  int rank() const override { return rank_; }
  void all_gather(const float* mine, std::span<const int> row_counts, int width,
                  float* all) override;
  void reduce_scatter(const float* all, std::span<const int> row_counts, int width,
                      float* mine) override;

  /// Wall and CPU time blocked in the collectives, bytes sent (intra_node_bytes_sent).
  const CommunicationStats& stats() const { return stats_; }
  /// Every collective's wall interval (MPI_Wtime), for the measured timeline.
  const std::vector<WallInterval>& calls() const { return calls_; }

 private:
  /// MPI counts and displacements of rows of `width` floats; throws InputError beyond int.
  void set_counts(std::span<const int> row_counts, int width);

  MPI_Comm group_;
  int size_ = 1;
  int rank_ = 0;
  std::vector<int> counts_, displacements_;
  CommunicationStats stats_;
  std::vector<WallInterval> calls_;
};

}  // namespace ballast::runtime
