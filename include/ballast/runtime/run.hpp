// `ballast run`: plans batches with any strategy (or reads plan files) and trains the
// runtime's model on real text over MPI, one rank per emulated GPU; measures per rank the
// busy compute time (thread CPU time outside MPI calls), the time blocked in
// communication, bytes sent per link class and wall time; optionally checks every step
// against the single-process reference.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <mpi.h>

#include "ballast/compare.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/simulator.hpp"

namespace ballast::runtime {

struct RunOptions {
  RunSettings settings;        ///< dataset, sampler, steps, seed (cluster/model: see below)
  std::string strategy = "zeppelin";  ///< a strategy spec, used when plan_path is empty
  std::string plan_path;       ///< plans written by `ballast plan` (one or an array)
  ModelConfig model;
  /// Sampled lengths are divided by this (rounded up) so documents of a 128K corpus fit a
  /// CPU step; the shape of the distribution is kept.
  std::int64_t length_scale = 64;
  Tokens rank_tokens = 4096;   ///< per-rank memory budget in tokens (sets the planning memory)
  int gpus_per_node = 2;       ///< emulated node size (node membership for routing and bytes)
  std::string corpus;          ///< text source; empty: Debian's /usr/share/common-licenses
  AdamWConfig adamw;
  bool check = false;          ///< also run the single-process reference and compare
};

struct RankMeasurement {
  double busy_s = 0;  ///< thread CPU time of the step outside MPI calls
  double wait_s = 0;  ///< wall time blocked in MPI calls
  double wall_s = 0;
  std::int64_t intra_node_bytes = 0;
  std::int64_t inter_node_bytes = 0;
  std::int64_t tokens = 0;  ///< tokens this rank ran the per-token ops on (all micro-batches)
};

struct StepReport {
  int step = 0;
  int micro_batches = 0;
  double loss = 0;             ///< mean cross-entropy over the step's targets
  double max_relative_error = -1;  ///< with check: worst of loss and every gradient tensor
  std::string worst_tensor;
  std::vector<RankMeasurement> ranks;  ///< on rank 0; empty elsewhere
  double imbalance = 1;        ///< max / mean busy
  double step_wall_s = 0;      ///< max over ranks
};

struct RunReport {
  std::string strategy;
  int ranks = 0;
  std::string corpus_provenance;
  std::vector<StepReport> steps;
  std::vector<TraceEvent> trace;  ///< rank 0: the first step's events of every rank
  int gpus_per_node = 1;
};

/// Runs on every rank of `comm` (collective). Throws InputError on bad options (before any
/// communication when the plans do not match the job).
RunReport run_training(const RunOptions& options, MPI_Comm comm);

/// The cluster and planning model a run plans with: `ranks` GPUs in nodes of
/// gpus_per_node, memory for rank_tokens tokens of the runtime model.
Cluster run_cluster(const RunOptions& options, int ranks);
Model run_planning_model(const RunOptions& options);

}  // namespace ballast::runtime
