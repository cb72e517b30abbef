// Internal to the simulator: each rank's program for one step (micro-batches, forward
// then backward, remaps, attention groups in queue order, the gradient sync) as tasks.
#pragma once

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "timeline.hpp"

namespace ballast::sim {

/// Adds every task of the plan's step to `graph`, the gradient sync's last (per
/// `gradient_sync`: one collective after everything, or gradient_sync_buckets() buckets
/// overlapping the last backward pass). Returns the id of the first gradient sync task.
/// Throws InputError when the queues of a micro-batch admit no deadlock-free order.
int build_step_program(const Plan& plan, const CostModel& cost, const LinkPorts& ports,
                       GradientSync gradient_sync, TaskGraph& graph);

}  // namespace ballast::sim
