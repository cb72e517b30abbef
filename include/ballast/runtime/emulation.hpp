// What `ballast run` plans for: the runtime's own model as planners see it, and the cluster
// its MPI ranks emulate (one CPU core per GPU), calibrated to this runtime's kernels
// (docs/runtime.md). No MPI: planners and tests use them too.
#pragma once

#include "ballast/cluster.hpp"
#include "ballast/model.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/units.hpp"

namespace ballast::runtime {

/// The runtime's fp32 model as a planning Model: its shape, parameter count and the
/// activation bytes its forward keeps per token (used only for planning memory).
Model planning_model(const ModelConfig& model);

/// `ranks` emulated GPUs in nodes of gpus_per_node (clamped to [1, ranks]; it must divide
/// ranks, else InputError naming --gpus-per-node), with memory for rank_tokens tokens of
/// the runtime's model next to its ZeRO-3 model states.
Cluster emulated_cluster(const ModelConfig& model, int ranks, int gpus_per_node, Tokens rank_tokens);

}  // namespace ballast::runtime
