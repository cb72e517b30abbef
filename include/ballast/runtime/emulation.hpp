// The runtime's own model as planners see it (with emulated_cluster.hpp's cluster, what
// `ballast run` plans for). No MPI: tests use it too.
#pragma once

#include "ballast/model.hpp"
#include "ballast/runtime/model.hpp"

namespace ballast::runtime {

/// The runtime's fp32 model as a planning Model: its shape, parameter count and the
/// activation bytes its forward keeps per token (used only for planning memory). An MoE
/// model is planned as the dense model of the same FLOPs per token (FFN width k x
/// expert_ffn_hidden), without the simulator's MoE fields.
Model planning_model(const ModelConfig& model);

}  // namespace ballast::runtime
