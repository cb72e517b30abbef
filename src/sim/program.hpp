// Internal to the simulator: each rank's program for one step (micro-batches, forward
// then backward, remaps, attention groups in queue order, the gradient sync) as tasks.
#pragma once

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "timeline.hpp"

namespace ballast::sim {

/// Adds every task of the plan's step to `graph`; the last task is the gradient sync.
/// Throws InputError when the queues of a micro-batch admit no deadlock-free order.
void build_step_program(const Plan& plan, const CostModel& cost, const LinkPorts& ports,
                        TaskGraph& graph);

}  // namespace ballast::sim
