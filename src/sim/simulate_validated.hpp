// Internal to the simulator: simulate() without its validation, for callers that validated
// the plan themselves (SimulatorEvaluator: a planner validates each candidate once).
#pragma once

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"

namespace ballast::sim {

/// simulate() of a plan that validate() accepted against `cost`; an unvalidated plan may
/// trip internal checks instead of raising InputError.
SimulationReport simulate_validated(const Plan& validated_plan, const CostModel& cost,
                                    const SimulationOptions& options);

}  // namespace ballast::sim
