// SimulatorEvaluator: the PlanEvaluator planners are handed by the CLI, compare, the Python
// module and tests; step times by the simulator (no second validation), transfer times by
// isolated_transfer_time_s.
#include "ballast/simulator.hpp"
#include "simulate_validated.hpp"

#include <limits>

namespace ballast {

SimulatorEvaluator::SimulatorEvaluator(const CostModel& cost, GradientSync gradient_sync)
    : cost_(cost), gradient_sync_(gradient_sync) {}

Seconds SimulatorEvaluator::step_time_s(const Plan& validated_plan) const {
  return sim::simulate_step_time_s(validated_plan, cost_, gradient_sync_,
                                   std::numeric_limits<Seconds>::infinity());
}

Seconds SimulatorEvaluator::step_time_below_s(const Plan& validated_plan, Seconds bound_s) const {
  return sim::simulate_step_time_s(validated_plan, cost_, gradient_sync_, bound_s);
}

PlanEvaluation SimulatorEvaluator::evaluate(const Plan& validated_plan) const {
  return sim::simulate_evaluation(validated_plan, cost_, gradient_sync_,
                                  std::numeric_limits<Seconds>::infinity());
}

PlanEvaluation SimulatorEvaluator::evaluate_below(const Plan& validated_plan, Seconds bound_s) const {
  return sim::simulate_evaluation(validated_plan, cost_, gradient_sync_, bound_s);
}

Seconds SimulatorEvaluator::transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank,
                                            int routing_proxies, int routing_chunks) const {
  const TransferKey key{bytes_per_layer, src_rank, dst_rank, routing_proxies, routing_chunks};
  {
    const std::lock_guard<std::mutex> lock(transfers_mutex_);
    if (const auto it = transfers_.find(key); it != transfers_.end()) return it->second;
  }
  const Seconds time_s = isolated_transfer_time_s(cost_, bytes_per_layer, src_rank, dst_rank,
                                                  routing_proxies, routing_chunks);
  const std::lock_guard<std::mutex> lock(transfers_mutex_);
  transfers_.emplace(key, time_s);
  return time_s;
}

Seconds SimulatorEvaluator::transfer_time_floor_s(Bytes bytes_per_layer, int src_rank,
                                                  int dst_rank, int routing_proxies,
                                                  int routing_chunks) const {
  return isolated_transfer_floor_s(cost_, bytes_per_layer, src_rank, dst_rank, routing_proxies,
                                   routing_chunks);
}

}  // namespace ballast
