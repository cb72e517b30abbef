// Simulator: runs a Plan against a CostModel as a discrete-event simulation with one
// compute stream per rank and one queue per link port, and bounds the step from below.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/strategy.hpp"
#include "ballast/trace.hpp"
#include "ballast/units.hpp"

namespace ballast {

struct RankTimes {
  Seconds busy_s = 0;           ///< compute stream busy
  Seconds communication_s = 0;  ///< union of intervals with a transfer/collective of this rank
  Seconds exposed_communication_s = 0;  ///< communication not overlapped by own compute
  Seconds idle_s = 0;           ///< step - busy - exposed communication
  Bytes peak_memory_bytes = 0;
};

/// A lower bound on the step time of any plan for a batch on a cluster and cost model.
struct LowerBound {
  Seconds time_s = 0;
  Seconds compute_per_rank_s = 0;  ///< (sum of linear + attention-pair floors) / ranks
  Seconds overhead_s = 0;          ///< memory-forced micro-batches * per-micro-batch overhead
  Seconds gradient_sync_s = 0;
  std::int64_t min_micro_batches = 1;  ///< ceil(total tokens / (ranks * token capacity))
  std::string binding;             ///< which term dominates, in words
};

/// step / lower bound - 1; 0 when the bound is 0 (an empty step).
inline double gap_to_lower_bound(Seconds step_s, Seconds lower_bound_s) {
  return lower_bound_s > 0 ? step_s / lower_bound_s - 1.0 : 0.0;
}

/// max(compute / ranks, ...) + overheads + gradient sync; no plan beats it.
LowerBound lower_bound(std::span<const Tokens> lengths_tokens, const CostModel& cost);

struct SimulationOptions {
  bool record_trace = false;
};

struct SimulationReport {
  std::string strategy;
  Seconds step_time_s = 0;
  LowerBound lower_bound;
  std::vector<RankTimes> ranks;
  double imbalance = 1;  ///< max busy / mean busy
  double exposed_communication_fraction = 0;  ///< sum exposed comm / (ranks * step)
  Bytes peak_memory_bytes = 0;  ///< max over ranks
  Seconds gradient_sync_s = 0;
  int micro_batches = 0;
  int gpus_per_node = 1;  ///< the plan's cluster, to name trace processes "rank r (node n)"
  std::vector<TraceEvent> trace;  ///< filled when options.record_trace
};

/// Validates the plan first (an invalid plan throws InputError and is never simulated).
/// Deterministic: same plan and cost model, identical report.
SimulationReport simulate(const Plan& plan, const CostModel& cost,
                          const SimulationOptions& options = {});

/// The time the simulator gives one transfer of bytes_per_layer from src to dst alone on
/// an idle cluster (whole model, like every CostModel time): the transfer is built and run
/// by the same code as a ring's transfers (routing_proxies clamped to nics_per_node; direct
/// inside a node or with one proxy; routed parts pipelined in routing_chunks pieces), so a
/// planner deciding whether routing pays sees exactly the simulator's arithmetic. 0 for
/// src == dst or no bytes. Throws InputError for a rank outside the cluster,
/// routing_proxies outside [1, gpus_per_node] or routing_chunks outside
/// [1, kMaxRoutingChunks] (the ranges validate() accepts).
Seconds isolated_transfer_time_s(const CostModel& cost, Bytes bytes_per_layer, int src_rank,
                                 int dst_rank, int routing_proxies, int routing_chunks);

/// The PlanEvaluator of the simulator: what callers of Planner::plan hand the planner.
/// Keeps a reference to `cost`, which must outlive it and be the cost model the planner
/// plans on.
class SimulatorEvaluator final : public PlanEvaluator {
 public:
  explicit SimulatorEvaluator(const CostModel& cost);
  /// simulate(validated_plan, cost).step_time_s without validating the plan again (the
  /// caller validated it; a planner validates each candidate once).
  Seconds step_time_s(const Plan& validated_plan) const override;
  /// isolated_transfer_time_s(cost, ...).
  Seconds transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank, int routing_proxies,
                          int routing_chunks) const override;

 private:
  const CostModel& cost_;
};

/// The report's trace as Chrome trace-event JSON (trace.hpp's writer for its ranks).
inline void write_chrome_trace(const SimulationReport& report, std::ostream& out) {
  write_chrome_trace(report.trace, static_cast<int>(report.ranks.size()), report.gpus_per_node, out);
}

}  // namespace ballast
