// simulate(): validates a plan, runs its step's task graph through the event pump and
// turns the timeline into per-rank busy / communication / exposed / idle times and a trace;
// isolated_transfer_time_s(): one transfer alone through the same task graph.
#include "ballast/simulator.hpp"

#include <algorithm>
#include <numeric>
#include <tuple>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "program.hpp"
#include "schemes.hpp"
#include "simulate_validated.hpp"
#include "timeline.hpp"

namespace ballast {

namespace {

using Interval = std::pair<Seconds, Seconds>;  // [start, end)

/// Sorted, disjoint union of intervals.
std::vector<Interval> merged(std::vector<Interval> intervals) {
  std::sort(intervals.begin(), intervals.end());
  std::vector<Interval> out;
  for (const Interval& interval : intervals) {
    if (!out.empty() && interval.first <= out.back().second) {
      out.back().second = std::max(out.back().second, interval.second);
    } else {
      out.push_back(interval);
    }
  }
  return out;
}

Seconds measure(const std::vector<Interval>& disjoint) {
  Seconds total = 0;
  for (const auto& [start, end] : disjoint) total += end - start;
  return total;
}

/// Measure of the intersection of two sorted, disjoint interval lists.
Seconds overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  Seconds total = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    total += std::max(0.0, std::min(a[i].second, b[j].second) - std::max(a[i].first, b[j].first));
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return total;
}

/// Busy, communication and exposed communication of every rank from the timeline; with
/// `before_sync_s`, also each rank's busy time plus the exposed communication of its
/// micro-batches alone (the gradient sync's collectives, micro_batch -1, left out).
void account_ranks(const sim::TaskGraph& graph, Seconds step_s, std::vector<RankTimes>& ranks,
                   std::vector<Seconds>* before_sync_s = nullptr) {
  std::vector<std::vector<Interval>> compute(ranks.size());
  std::vector<std::vector<Interval>> communication(ranks.size());
  std::vector<std::vector<Interval>> sync(ranks.size());
  for (int id = 0; id < graph.size(); ++id) {
    const sim::Task& task = graph.task(id);
    if (task.end_s <= task.start_s || task.kind == sim::TaskKind::join) continue;
    auto& lists = task.kind == sim::TaskKind::compute ? compute
                  : task.micro_batch < 0              ? sync
                                                      : communication;
    for (int rank : graph.parties(id)) lists[rank].emplace_back(task.start_s, task.end_s);
  }
  if (before_sync_s != nullptr) before_sync_s->assign(ranks.size(), 0.0);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::vector<Interval> busy = merged(std::move(compute[r]));
    RankTimes& times = ranks[r];
    times.busy_s = measure(busy);
    std::vector<Interval>& all = communication[r];
    if (before_sync_s != nullptr) {
      // Merged in place: merging it again with the sync's intervals gives the same union.
      all = merged(std::move(all));
      (*before_sync_s)[r] = times.busy_s + measure(all) - overlap(all, busy);
    }
    all.insert(all.end(), sync[r].begin(), sync[r].end());
    const std::vector<Interval> talking = merged(std::move(all));
    times.communication_s = measure(talking);
    times.exposed_communication_s = times.communication_s - overlap(talking, busy);
    times.idle_s = std::max(0.0, step_s - times.busy_s - times.exposed_communication_s);
  }
}

const char* lane_of(sim::TaskKind kind, bool sender) {
  switch (kind) {
    case sim::TaskKind::compute:
      return "compute";
    case sim::TaskKind::transfer:
      return sender ? "send" : "recv";
    default:
      return "collective";
  }
}

/// One event per compute op, a send and a recv per transfer, one per collective member;
/// ordered by rank, start, lane, then creation.
std::vector<TraceEvent> trace_of(const sim::TaskGraph& graph) {
  std::vector<std::tuple<int, Seconds, int, int, TraceEvent>> keyed;
  for (int id = 0; id < graph.size(); ++id) {
    const sim::Task& task = graph.task(id);
    if (task.end_s <= task.start_s || task.kind == sim::TaskKind::join) continue;
    const auto parties = graph.parties(id);
    for (std::size_t p = 0; p < parties.size(); ++p) {
      TraceEvent event{parties[p],     lane_of(task.kind, p == 0),
                       graph.name(id), task.micro_batch,
                       task.start_s,   task.end_s - task.start_s,
                       graph.category(id)};
      keyed.emplace_back(event.rank, event.start_s, trace_lane_index(event.lane), id, std::move(event));
    }
  }
  std::sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) {
    return std::tie(std::get<0>(a), std::get<1>(a), std::get<2>(a), std::get<3>(a)) <
           std::tie(std::get<0>(b), std::get<1>(b), std::get<2>(b), std::get<3>(b));
  });
  std::vector<TraceEvent> events;
  events.reserve(keyed.size());
  for (auto& entry : keyed) events.push_back(std::move(std::get<4>(entry)));
  return events;
}

void summarise(SimulationReport& report) {
  const auto ranks = static_cast<double>(report.ranks.size());
  Seconds max_busy_s = 0;
  Seconds total_busy_s = 0;
  Seconds total_exposed_s = 0;
  for (const RankTimes& times : report.ranks) {
    max_busy_s = std::max(max_busy_s, times.busy_s);
    total_busy_s += times.busy_s;
    total_exposed_s += times.exposed_communication_s;
    report.peak_memory_bytes = std::max(report.peak_memory_bytes, times.peak_memory_bytes);
  }
  const Seconds mean_busy_s = total_busy_s / ranks;
  report.imbalance = mean_busy_s > 0 ? max_busy_s / mean_busy_s : 1.0;
  report.exposed_communication_fraction =
      report.step_time_s > 0 ? total_exposed_s / (ranks * report.step_time_s) : 0.0;
}

}  // namespace

const char* gradient_sync_name(GradientSync mode) {
  return mode == GradientSync::overlap ? "overlap" : "end";
}

GradientSync parse_gradient_sync(const std::string& text, const std::string& setting) {
  if (text == "overlap") return GradientSync::overlap;
  if (text == "end") return GradientSync::end;
  throw InputError(fmt::format(
      "{} '{}' is not a gradient sync mode; use overlap (buckets overlapped with the "
      "backward pass, the default) or end (all of it after the last backward pass)",
      setting, text));
}

int gradient_sync_buckets(const Model& model) { return std::max(1, model.layers); }

void require_at_or_above_bound(const Plan& plan, const SimulationReport& report) {
  const LowerBound& bound = report.lower_bound;
  if (!(report.step_time_s < bound.time_s * (1.0 - 1e-9))) return;
  throw InternalError(fmt::format(
      "the simulated step of plan '{}' ({} sequences, {} micro-batches, {} ranks) takes {:.9g} s, "
      "below its lower bound of {:.9g} s (binding term: {}; compute spread {:.9g} s, overheads "
      "{:.9g} s, longest sequence {:.9g} s, gradient sync {:.9g} s, first bucket ready {:.9g} s, "
      "buckets {:.9g} s, expert imbalance {:.9g} s): a valid plan never beats the bound, so this "
      "is a bug in the simulator or the bound; please report it with the plan's JSON",
      plan.strategy, plan.sequence_lengths_tokens.size(), plan.micro_batches.size(),
      plan.cluster.ranks(), report.step_time_s, bound.time_s, bound.binding,
      bound.compute_per_rank_s, bound.overhead_s, bound.longest_sequence_s,
      bound.gradient_sync_s, bound.first_bucket_ready_s, bound.gradient_buckets_s,
      bound.expert_imbalance_s));
}

SimulationReport simulate(const Plan& plan, const CostModel& cost,
                          const SimulationOptions& options) {
  require_valid(plan, cost, "plan");
  SimulationReport report = sim::simulate_validated(plan, cost, options);
  require_at_or_above_bound(plan, report);
  // The report ends a plan's simulations (planners evaluate through SimulatorEvaluator):
  // what comes next (its JSON, a trace) needs no simulator buffers.
  sim::release_spare_buffers();
  return report;
}

namespace sim {

SimulationReport simulate_validated(const Plan& plan, const CostModel& cost,
                                    const SimulationOptions& options) {
  const sim::LinkPorts ports(plan.cluster);
  sim::TaskGraph graph(options.record_trace);
  const int first_sync_task =
      sim::build_step_program(plan, cost, ports, options.gradient_sync, graph);
  graph.run(ports.count());

  SimulationReport report;
  report.strategy = plan.strategy;
  report.gpus_per_node = plan.cluster.gpus_per_node;
  report.tensor_parallel = plan.cluster.tensor_parallel.gpus;
  report.micro_batches = static_cast<int>(plan.micro_batches.size());
  report.gradient_sync_s = cost.gradient_sync_time_s();
  report.gradient_sync = options.gradient_sync;
  report.lower_bound = lower_bound(plan.sequence_lengths_tokens, cost, options.gradient_sync);
  Seconds work_end_s = 0;  // the end of the last compute or transfer, gradient sync aside
  for (int id = 0; id < graph.size(); ++id) {
    report.step_time_s = std::max(report.step_time_s, graph.task(id).end_s);
    if (id < first_sync_task) work_end_s = std::max(work_end_s, graph.task(id).end_s);
  }
  report.gradient_sync_exposed_s = report.step_time_s - work_end_s;
  report.ranks.resize(static_cast<std::size_t>(plan.cluster.ranks()));
  account_ranks(graph, report.step_time_s, report.ranks);
  const std::vector<Bytes> peak_bytes = peak_memory_bytes_per_rank(plan, cost);
  BALLAST_CHECK(peak_bytes.size() == report.ranks.size(), "one peak memory per rank");
  const Bytes gpus_per_rank = plan.cluster.tensor_parallel.gpus;
  for (std::size_t r = 0; r < report.ranks.size(); ++r)
    report.ranks[r].peak_memory_bytes = ceil_div(peak_bytes[r], gpus_per_rank);
  summarise(report);
  if (options.record_trace) report.trace = trace_of(graph);
  return report;
}

namespace {

/// The plan's step built into `graph` and run until `stop_at_s` (TaskGraph::run_until's
/// answer); a build that stopped on its tasks' path answers from that path, unrun.
Seconds build_and_run_until(const Plan& validated_plan, const CostModel& cost,
                            const sim::LinkPorts& ports, GradientSync gradient_sync,
                            Seconds stop_at_s, sim::TaskGraph& graph) {
  if (sim::build_step_program(validated_plan, cost, ports, gradient_sync, graph, stop_at_s) ==
      sim::kStepBuildStopped) {
    ++sim::path_stop_count();
    return sim::path_stop_answer_s(graph.longest_path_s(), stop_at_s);
  }
  return graph.run_until(ports.count(), stop_at_s);
}

}  // namespace

Seconds simulate_step_time_s(const Plan& validated_plan, const CostModel& cost,
                             GradientSync gradient_sync, Seconds stop_at_s) {
  const sim::LinkPorts ports(validated_plan.cluster);
  sim::TaskGraph graph(/*keep_names=*/false);
  return build_and_run_until(validated_plan, cost, ports, gradient_sync, stop_at_s, graph);
}

PlanEvaluation simulate_evaluation(const Plan& validated_plan, const CostModel& cost,
                                   GradientSync gradient_sync, Seconds stop_at_s) {
  const sim::LinkPorts ports(validated_plan.cluster);
  sim::TaskGraph graph(/*keep_names=*/false);
  PlanEvaluation evaluation{
      build_and_run_until(validated_plan, cost, ports, gradient_sync, stop_at_s, graph), {}, {}};
  if (evaluation.step_time_s >= stop_at_s) return evaluation;
  std::vector<RankTimes> ranks(static_cast<std::size_t>(validated_plan.cluster.ranks()));
  account_ranks(graph, evaluation.step_time_s, ranks, &evaluation.rank_time_before_sync_s);
  evaluation.rank_time_s.reserve(ranks.size());
  for (const RankTimes& rank : ranks) {
    evaluation.rank_time_s.push_back(rank.busy_s + rank.exposed_communication_s);
  }
  return evaluation;
}

}  // namespace sim

namespace {

/// isolated_transfer_time_s()'s and isolated_transfer_floor_s()'s argument checks.
void check_isolated_transfer(const Cluster& cluster, int src_rank, int dst_rank,
                             int routing_proxies, int routing_chunks) {
  for (const int rank : {src_rank, dst_rank}) {
    if (rank < 0 || rank >= cluster.ranks()) {
      throw InputError(
          fmt::format("isolated_transfer_time_s: rank {} is outside the cluster's ranks [0, {})",
                      rank, cluster.ranks()));
    }
  }
  if (routing_proxies < 1 || routing_proxies > cluster.gpus_per_node) {
    throw InputError(fmt::format(
        "isolated_transfer_time_s: routing_proxies {} is outside [1, {}] (at least 1, at most "
        "the GPUs per node)",
        routing_proxies, cluster.gpus_per_node));
  }
  if (routing_chunks < 1 || routing_chunks > kMaxRoutingChunks) {
    throw InputError(fmt::format("isolated_transfer_time_s: routing_chunks {} is outside [1, {}]",
                                 routing_chunks, kMaxRoutingChunks));
  }
}

/// On an idle cluster only the two nodes' links carry the transfer: it is built on a copy
/// of the cluster holding just those nodes, ranks renumbered (src on node 0, dst on node
/// 0 or 1; the cost model's node test and proxy choice agree on them), so a call costs
/// O(GPUs per node) instead of O(ranks) (zeppelin prices thousands per plan).
std::pair<int, int> renumbered_pair(const Cluster& cluster, int src_rank, int dst_rank) {
  const int gpus = cluster.gpus_per_node;
  const bool same_node = cluster.same_node(src_rank, dst_rank);
  return {src_rank % gpus, (same_node ? 0 : gpus) + dst_rank % gpus};
}

}  // namespace

Seconds isolated_transfer_time_s(const CostModel& cost, Bytes bytes_per_layer, int src_rank,
                                 int dst_rank, int routing_proxies, int routing_chunks) {
  const Cluster& cluster = cost.cluster();
  check_isolated_transfer(cluster, src_rank, dst_rank, routing_proxies, routing_chunks);
  Cluster pair = cluster;
  pair.nodes = cluster.same_node(src_rank, dst_rank) ? 1 : 2;
  const auto [src, dst] = renumbered_pair(cluster, src_rank, dst_rank);
  const sim::LinkPorts ports(pair);
  sim::TaskGraph graph(/*keep_names=*/false);
  std::vector<int> cursor(static_cast<std::size_t>(pair.ranks()), -1);
  sim::BuildContext ctx{cost, ports, graph, cursor};
  const int arrival = sim::add_p2p(ctx, src, dst, bytes_per_layer, -1, routing_proxies,
                                   routing_chunks, [] { return std::string(); });
  graph.run(ports.count());
  return arrival < 0 ? 0.0 : graph.task(arrival).end_s;
}

Seconds isolated_transfer_floor_s(const CostModel& cost, Bytes bytes_per_layer, int src_rank,
                                  int dst_rank, int routing_proxies, int routing_chunks) {
  const Cluster& cluster = cost.cluster();
  check_isolated_transfer(cluster, src_rank, dst_rank, routing_proxies, routing_chunks);
  const auto [src, dst] = renumbered_pair(cluster, src_rank, dst_rank);
  return sim::p2p_floor_s(cost, src, dst, bytes_per_layer, routing_proxies, routing_chunks);
}

}  // namespace ballast
