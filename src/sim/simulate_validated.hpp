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

/// simulate_validated(...).step_time_s without the report (rank accounting, memory, lower
/// bound), when that step is below `stop_at_s`; otherwise a time >= stop_at_s and no later
/// than that step: the simulation stops once its clock reaches `stop_at_s` with tasks left.
/// With stop_at_s = infinity, exactly simulate_validated(...).step_time_s.
Seconds simulate_step_time_s(const Plan& validated_plan, const CostModel& cost,
                             GradientSync gradient_sync, Seconds stop_at_s);

/// simulate_step_time_s() and, when that step is below `stop_at_s`, each rank's
/// busy_s + exposed_communication_s as simulate_validated() reports them (bit for bit);
/// no rank times when the simulation stopped at `stop_at_s`.
PlanEvaluation simulate_evaluation(const Plan& validated_plan, const CostModel& cost,
                                   GradientSync gradient_sync, Seconds stop_at_s);

}  // namespace ballast::sim
