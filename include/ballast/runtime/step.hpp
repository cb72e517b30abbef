// One training step of a Plan over MPI (collective over every rank of a communicator):
// every micro-batch through the plan's attention engine, the gradient all-reduce, and
// what this rank measured (busy and blocked time, bytes per link class, and optionally
// its timeline in the trace schema of trace.hpp). Also the collectives that bring every
// rank's measurements and timeline to rank 0.
#pragma once

#include <cstdint>
#include <vector>

#include <mpi.h>

#include "ballast/plan.hpp"
#include "ballast/runtime/fault.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/trace.hpp"

namespace ballast::runtime {

/// What one rank measured in one step.
struct RankMeasurement {
  double busy_s = 0;  ///< thread CPU time of the step outside MPI calls
  double wait_s = 0;  ///< wall time blocked in MPI calls
  double wall_s = 0;
  std::int64_t intra_node_bytes = 0;
  std::int64_t inter_node_bytes = 0;
  std::int64_t tokens = 0;  ///< tokens this rank ran the per-token ops on (all micro-batches; its sequence shard under TP)
};

struct StepOptions {
  /// Record this rank's timeline (StepResult::events); off, the step records nothing.
  bool record_trace = false;
  /// Test-only (fault.hpp): a fault that fires on this rank in this step, or null.
  const FaultInjection* fault = nullptr;
  /// An MoE model's expert parallelism: groups of this many consecutive plan ranks share
  /// each layer's experts (expert_parallel.hpp); 1 = every rank holds every expert. Must
  /// divide the plan's ranks and the experts; above 1 only without tensor parallelism.
  int expert_parallel = 1;
};

struct StepResult {
  double loss_sum = 0;           ///< cross-entropy summed over every rank's targets (nats)
  std::int64_t targets = 0;      ///< every rank's tokens with a target
  std::vector<float> gradients;  ///< d(loss_sum)/d(parameters), summed over ranks
  RankMeasurement measurement;   ///< this rank's
  /// This rank's measured timeline (with record_trace), seconds from the step's start:
  /// attention compute per group with group_category(), the linear modules between the
  /// engine's calls ("linear"), blocking waits (remap, group exchanges, ring shifts) and
  /// the gradient sync, in the categories the simulator uses.
  std::vector<TraceEvent> events;
};

/// Runs one step of `plan` on every rank of `comm` (collective; MPI rank = plan rank, or
/// with a plan of TP groups of N, MPI rank r = member r % N of plan rank r / N, which
/// needs plan.cluster.gpus() ranks: tensor_parallel.hpp; InputError otherwise):
/// forward and backward of every micro-batch over `documents` (document i = sequence i),
/// then the all-reduce of gradients, loss and target count. Does not update `parameters`.
/// An MoE model's experts run in EP groups of options.expert_parallel ranks.
StepResult run_step(const Plan& plan, const ModelConfig& model, const Parameters& parameters,
                    const std::vector<std::vector<std::int32_t>>& documents, MPI_Comm comm,
                    const StepOptions& options = {});

/// Every rank's measurement on rank 0, in rank order (empty elsewhere). Collective.
std::vector<RankMeasurement> gather_measurements(const RankMeasurement& mine, MPI_Comm comm);

/// Every rank's events on rank 0, in rank order (empty elsewhere). Collective.
std::vector<TraceEvent> gather_trace(const std::vector<TraceEvent>& mine, MPI_Comm comm);

}  // namespace ballast::runtime
