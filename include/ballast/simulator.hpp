// Simulator: runs a Plan against a CostModel as a discrete-event simulation with one
// compute stream per rank and one queue per link port, and bounds the step from below.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <mutex>
#include <tuple>
#include <span>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/strategy.hpp"
#include "ballast/trace.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// When the data-parallel gradient synchronisation runs.
enum class GradientSync {
  /// In buckets, one per layer, each started as soon as the last micro-batch's backward
  /// has produced its gradients (PyTorch DDP's and FSDP's bucketed reduce-scatter /
  /// all-reduce, DeepSpeed ZeRO-3's overlap_comm): only what the backward pass cannot hide
  /// is exposed. The default.
  overlap,
  /// All of it after the last backward pass, nothing overlapped.
  end,
};
/// "overlap" or "end".
const char* gradient_sync_name(GradientSync mode);
/// Throws InputError naming `setting` ("--grad-sync", "grad_sync") and the choices.
GradientSync parse_gradient_sync(const std::string& text, const std::string& setting);

/// Buckets of the overlapped gradient sync: one per layer (FSDP wraps each transformer
/// layer and reduce-scatters its gradients as one unit; DeepSpeed ZeRO-3 and DDP buckets
/// are of the same order, tens of MB). At least 1.
int gradient_sync_buckets(const Model& model);

struct RankTimes {
  Seconds busy_s = 0;           ///< compute stream busy
  Seconds communication_s = 0;  ///< union of intervals with a transfer/collective of this rank
  Seconds exposed_communication_s = 0;  ///< communication not overlapped by own compute
  Seconds idle_s = 0;           ///< step - busy - exposed communication
  /// Peak memory of one GPU of the rank: with tensor parallelism the rank is a TP group of
  /// N GPUs that hold 1/N of its bytes each (ceil(rank peak / N)).
  Bytes peak_memory_bytes = 0;
};

/// A lower bound on the step time of any plan for a batch on a cluster and cost model.
struct LowerBound {
  Seconds time_s = 0;
  /// (sum of linear + attention-pair floors + TP collectives' bandwidth time) / ranks
  Seconds compute_per_rank_s = 0;
  Seconds overhead_s = 0;          ///< memory-forced micro-batches * per-micro-batch overhead
  Seconds gradient_sync_s = 0;     ///< the part of the gradient sync no schedule hides
  std::int64_t min_micro_batches = 1;  ///< ceil(total tokens / (ranks * token capacity))
  /// An MoE model's expert load imbalance no plan avoids, per rank (in the spread's term,
  /// with the micro-batch overheads and latencies a plan of that many micro-batches pays
  /// beyond the min_micro_batches already counted; docs/simulator.md section 7); 0 for a
  /// dense model.
  Seconds expert_imbalance_s = 0;
  /// The longest sequence's attention on the best group for it, with every micro-batch's
  /// overhead: over every scheme and group size, the larger of its busiest member's program
  /// (its share of the attention, the overheads and the scheme's collectives) and the KV it
  /// receives point to point (docs/simulator.md section 7); 0 for an empty batch.
  Seconds longest_sequence_s = 0;
  /// With GradientSync::overlap, all the gradient buckets back to back (the simulator runs
  /// them one after another); 0 otherwise or for an empty batch.
  Seconds gradient_buckets_s = 0;
  /// With GradientSync::overlap, the earliest the first bucket can start: every rank's
  /// forward work and 1 / B of its last backward pass, at the compute floors, averaged
  /// over ranks (the bucket waits for all of them), and the linear backward work beyond
  /// what one micro-batch's token capacity holds and the attention backward work beyond
  /// the most that sequences of ranks x capacity tokens hold (only the last micro-batch's
  /// backward pass can hide buckets); 0 otherwise or for an empty batch.
  /// The step is at least this plus gradient_buckets_s.
  Seconds first_bucket_ready_s = 0;
  std::string binding;             ///< which term dominates, in words
};

/// step / lower bound - 1; 0 when the bound is 0 (an empty step).
inline double gap_to_lower_bound(Seconds step_s, Seconds lower_bound_s) {
  return lower_bound_s > 0 ? step_s / lower_bound_s - 1.0 : 0.0;
}

/// max(compute / ranks (with an MoE model's expert load imbalance no plan avoids), ..., the
/// longest sequence's best group time) + overheads (with TP,
/// the TP collectives' latency per rank-micro-batch too) + the gradient sync that no
/// schedule hides (all
/// of it with GradientSync::end; its last bucket, which waits for the end of the last
/// backward pass, with overlap); no plan beats it.
LowerBound lower_bound(std::span<const Tokens> lengths_tokens, const CostModel& cost,
                       GradientSync gradient_sync = GradientSync::overlap);

struct SimulationOptions {
  bool record_trace = false;
  GradientSync gradient_sync = GradientSync::overlap;
};

struct SimulationReport {
  std::string strategy;
  Seconds step_time_s = 0;
  LowerBound lower_bound;
  std::vector<RankTimes> ranks;
  double imbalance = 1;  ///< max busy / mean busy
  double exposed_communication_fraction = 0;  ///< sum exposed comm / (ranks * step)
  Bytes peak_memory_bytes = 0;  ///< max over ranks, per GPU (RankTimes::peak_memory_bytes)
  Seconds gradient_sync_s = 0;  ///< the whole synchronisation, as if nothing hid it
  /// The part of the step after the last rank's last compute or transfer: the gradient
  /// sync the backward pass did not hide (gradient_sync_s with GradientSync::end).
  Seconds gradient_sync_exposed_s = 0;
  GradientSync gradient_sync = GradientSync::overlap;
  int micro_batches = 0;
  int gpus_per_node = 1;  ///< the plan's cluster, to name trace processes "rank r (node n)"
  int tensor_parallel = 1;  ///< GPUs per rank (TP group), to name trace processes
  std::vector<TraceEvent> trace;  ///< filled when options.record_trace
};

/// Throws InternalError ("please report", naming the binding term, every term and the
/// plan) when the report's step is below its lower bound: the bound holds for every valid
/// plan (docs/simulator.md section 7), so such a step is a bug in the simulator or the
/// bound, never a figure to print. Relative tolerance 1e-9 for rounding (the two sum the
/// same costs in different orders). simulate() calls it on every report.
void require_at_or_above_bound(const Plan& plan, const SimulationReport& report);

/// Validates the plan first (an invalid plan throws InputError and is never simulated).
/// Deterministic: same plan and cost model, identical report.
SimulationReport simulate(const Plan& plan, const CostModel& cost,
                          const SimulationOptions& options = {});

/// Between open_simulation_cache() and the matching close on a thread, the simulator
/// keeps the ring and USP groups' step compute times it prices there, by everything they
/// depend on (the cost model's instance_id, the pass, the head split, the members' chunks
/// and, packed, the sequences' lengths), for the thread's later simulations: a planner
/// simulates many candidate plans that share most of their groups. A kept time is the very
/// number a new pricing gives, so no result changes. Opens nest; the last close frees what
/// was kept (at most 32 MiB a thread). SimulatorEvaluator opens and closes it for an
/// EvaluationSession (strategy.hpp). Without an open one nothing is kept.
void open_simulation_cache();
void close_simulation_cache();

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

/// A time isolated_transfer_time_s() with the same arguments never goes below, without
/// simulating: the longest chain of tasks the transfer is built from (the direct transfer,
/// or each routed part's first piece's dispatch, every piece's NIC crossing in turn and its
/// last piece's combine), each at its time alone (CostModel::p2p_time_s: a task never runs
/// faster than on idle links). Planners choosing a routing skip the choices whose floor
/// is above the best time found (choose_routing, zeppelin_tiers.cpp). Same argument checks.
Seconds isolated_transfer_floor_s(const CostModel& cost, Bytes bytes_per_layer, int src_rank,
                                  int dst_rank, int routing_proxies, int routing_chunks);

/// The PlanEvaluator of the simulator: what callers of Planner::plan hand the planner.
/// Keeps a reference to `cost`, which must outlive it and be the cost model the planner
/// plans on.
class SimulatorEvaluator final : public PlanEvaluator {
 public:
  explicit SimulatorEvaluator(const CostModel& cost,
                              GradientSync gradient_sync = GradientSync::overlap);
  /// simulate(validated_plan, cost).step_time_s without validating the plan again (the
  /// caller validated it; a planner validates each candidate once).
  Seconds step_time_s(const Plan& validated_plan) const override;
  /// The simulation stops once its clock reaches `bound_s` with tasks left (the step is then
  /// at least that long) and returns that clock.
  Seconds step_time_below_s(const Plan& validated_plan, Seconds bound_s) const override;
  /// One simulation: its step time and each rank's busy_s + exposed_communication_s (the
  /// report's figures, without the rest of the report: memory, lower bound, trace).
  PlanEvaluation evaluate(const Plan& validated_plan) const override;
  /// evaluate(), but the simulation stops once its clock reaches `bound_s` with tasks left
  /// and returns that clock with no rank times.
  PlanEvaluation evaluate_below(const Plan& validated_plan, Seconds bound_s) const override;
  /// isolated_transfer_time_s(cost, ...), remembered per argument tuple: planners ask for
  /// the same transfers again and again (Zeppelin's crossover search, every plan), and a
  /// routed transfer is a small flow simulation of its own. Thread-safe.
  Seconds transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank, int routing_proxies,
                          int routing_chunks) const override;
  /// isolated_transfer_floor_s(cost, ...).
  Seconds transfer_time_floor_s(Bytes bytes_per_layer, int src_rank, int dst_rank,
                                int routing_proxies, int routing_chunks) const override;
  /// open_simulation_cache() / close_simulation_cache() on the calling thread.
  void open_session() const override { open_simulation_cache(); }
  void close_session() const override { close_simulation_cache(); }

 private:
  using TransferKey = std::tuple<Bytes, int, int, int, int>;
  const CostModel& cost_;
  GradientSync gradient_sync_;
  mutable std::mutex transfers_mutex_;
  mutable std::map<TransferKey, Seconds> transfers_;
};

/// The report's trace as Chrome trace-event JSON (trace.hpp's writer for its ranks).
inline void write_chrome_trace(const SimulationReport& report, std::ostream& out) {
  write_chrome_trace(report.trace, static_cast<int>(report.ranks.size()), report.gpus_per_node, out,
                     report.tensor_parallel);
}

}  // namespace ballast
