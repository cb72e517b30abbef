// SimulatorEvaluator: the PlanEvaluator planners are handed by the CLI, compare, the Python
// module and tests; step times by the simulator (no second validation), transfer times by
// isolated_transfer_time_s.
#include "ballast/simulator.hpp"
#include "simulate_validated.hpp"

namespace ballast {

SimulatorEvaluator::SimulatorEvaluator(const CostModel& cost) : cost_(cost) {}

Seconds SimulatorEvaluator::step_time_s(const Plan& validated_plan) const {
  return sim::simulate_validated(validated_plan, cost_, {}).step_time_s;
}

Seconds SimulatorEvaluator::transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank,
                                            int routing_proxies, int routing_chunks) const {
  return isolated_transfer_time_s(cost_, bytes_per_layer, src_rank, dst_rank, routing_proxies,
                                  routing_chunks);
}

}  // namespace ballast
