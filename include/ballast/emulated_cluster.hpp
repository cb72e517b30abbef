// The cluster that CPU processes emulate, one process per GPU: what `ballast run` (MPI
// ranks) and ballast.torch's gloo examples plan for, with compute and link figures
// calibrated to the runtime's CPU kernels on this machine (docs/runtime.md).
#pragma once

#include "ballast/cluster.hpp"
#include "ballast/model.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// `ranks` emulated GPUs in nodes of gpus_per_node (clamped to [1, ranks]; it must divide
/// ranks, else InputError naming it), with memory for rank_tokens tokens of `model`'s
/// activations next to its ZeRO-3 model states (kModelStateBytesPerParameter), 90% usable.
/// Its compute and link figures are fixed estimates (src/cost/emulated_cluster.cpp), what
/// ballast.torch's gloo processes plan with.
Cluster emulated_cluster(const Model& model, int ranks, int gpus_per_node, Tokens rank_tokens);

/// The same shape and memory with `host`'s measured constants (a cluster written by
/// `ballast calibrate --host`: peak, efficiencies, attention curves, tiling, links and
/// collective fits, measured_on): what `ballast run` plans and predicts with.
Cluster emulated_cluster(const Model& model, int ranks, int gpus_per_node, Tokens rank_tokens,
                         const Cluster& host);

}  // namespace ballast
