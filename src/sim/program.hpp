// Internal to the simulator: each rank's program for one step (micro-batches, forward
// then backward, remaps, attention groups in queue order, the gradient sync) as tasks.
#pragma once

#include <limits>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "timeline.hpp"

namespace ballast::sim {

/// What build_step_program returns when it stopped at `stop_at_s`.
constexpr int kStepBuildStopped = -1;

/// Adds every task of the plan's step to `graph`, the gradient sync's last (per
/// `gradient_sync`: one collective after everything, or gradient_sync_buckets() buckets
/// overlapping the last backward pass). Returns the id of the first gradient sync task,
/// or kStepBuildStopped when, after an attention group or a pass, the longest path of the
/// tasks so far (graph.longest_path_s()) is already past_stop() of `stop_at_s`: the step
/// lasts at least that, and the rest is not built. Throws InputError when the queues of a micro-batch
/// admit no deadlock-free order (validate() refuses such plans; a stopped build may not
/// reach the micro-batch).
int build_step_program(const Plan& plan, const CostModel& cost, const LinkPorts& ports,
                       GradientSync gradient_sync, TaskGraph& graph,
                       Seconds stop_at_s = std::numeric_limits<Seconds>::infinity());

}  // namespace ballast::sim
