// Text, CSV and JSON forms of one SimulationReport.
#include <algorithm>
#include <numeric>
#include <ostream>

#include <fmt/format.h>
#include <fmt/ostream.h>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/report.hpp"

namespace ballast {

nlohmann::ordered_json report_to_json(const SimulationReport& report) {
  nlohmann::ordered_json json;
  json["strategy"] = report.strategy;
  json["step_time_s"] = report.step_time_s;
  json["lower_bound_s"] = report.lower_bound.time_s;
  json["gap_to_lower_bound"] = gap_to_lower_bound(report.step_time_s, report.lower_bound.time_s);
  json["lower_bound"] = {{"compute_per_rank_s", report.lower_bound.compute_per_rank_s},
                         {"overhead_s", report.lower_bound.overhead_s},
                         {"gradient_sync_s", report.lower_bound.gradient_sync_s},
                         {"min_micro_batches", report.lower_bound.min_micro_batches},
                         {"expert_imbalance_s", report.lower_bound.expert_imbalance_s},
                         {"longest_sequence_s", report.lower_bound.longest_sequence_s},
                         {"gradient_buckets_s", report.lower_bound.gradient_buckets_s},
                         {"first_bucket_ready_s", report.lower_bound.first_bucket_ready_s},
                         {"binding", report.lower_bound.binding}};
  json["imbalance"] = report.imbalance;
  json["exposed_comm_fraction"] = report.exposed_communication_fraction;
  json["peak_memory_bytes"] = report.peak_memory_bytes;
  json["gradient_sync_s"] = report.gradient_sync_s;
  json["gradient_sync"] = gradient_sync_name(report.gradient_sync);
  json["gradient_sync_exposed_s"] = report.gradient_sync_exposed_s;
  json["micro_batches"] = report.micro_batches;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (std::size_t rank = 0; rank < report.ranks.size(); ++rank) {
    const RankTimes& times = report.ranks[rank];
    ranks.push_back({{"rank", rank},
                     {"busy_s", times.busy_s},
                     {"communication_s", times.communication_s},
                     {"exposed_communication_s", times.exposed_communication_s},
                     {"idle_s", times.idle_s},
                     {"peak_memory_bytes", times.peak_memory_bytes}});
  }
  json["ranks"] = ranks;
  return json;
}

void write_report_text(const SimulationReport& report, const Cluster& cluster, std::ostream& out,
                       int max_rank_rows) {
  const auto& bound = report.lower_bound;
  fmt::print(out, "strategy {}: step {:.4f} s, lower bound {:.4f} s (gap {:.1f}%; {})\n",
             report.strategy, report.step_time_s, bound.time_s,
             100.0 * gap_to_lower_bound(report.step_time_s, bound.time_s), bound.binding);
  fmt::print(out,
             "  {} micro-batches, imbalance {:.3f} (max/mean busy), exposed communication "
             "{:.1f}%, peak memory {:.2f} GiB, gradient sync {:.4f} s ({}: {:.4f} s exposed)\n",
             report.micro_batches, report.imbalance,
             100.0 * report.exposed_communication_fraction, report.peak_memory_bytes / kGiB,
             report.gradient_sync_s, gradient_sync_name(report.gradient_sync),
             report.gradient_sync_exposed_s);
  std::vector<std::size_t> order(report.ranks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return report.ranks[a].busy_s > report.ranks[b].busy_s;
  });
  const std::size_t rows = std::min<std::size_t>(order.size(), static_cast<std::size_t>(max_rank_rows));
  // The CLI prints every rank with --format csv or json; Python reads them from the report.
  const char* all_ranks = current_frontend() == Frontend::python
                              ? "report.ranks or report.to_json()"
                              : "--format csv or json";
  const int tp = cluster.tensor_parallel.gpus;
  if (tp > 1) {
    fmt::print(out, "  ranks are TP groups of {} GPUs (rank r: GPUs {}r to {}r+{}); peak memory per GPU\n",
               tp, tp, tp, tp - 1);
  }
  fmt::print(out, "  busiest {} of {} ranks (all ranks: {}):\n", rows, order.size(), all_ranks);
  fmt::print(out, "  {:>6} {:>5} {:>10} {:>10} {:>11} {:>10} {:>9}\n", "rank", "node", "busy (s)",
             "comm (s)", "exposed (s)", "idle (s)", "peak GiB");
  for (std::size_t i = 0; i < rows; ++i) {
    const RankTimes& times = report.ranks[order[i]];
    fmt::print(out, "  {:>6} {:>5} {:>10.4f} {:>10.4f} {:>11.4f} {:>10.4f} {:>9.2f}\n", order[i],
               cluster.node_of(static_cast<int>(order[i])), times.busy_s, times.communication_s,
               times.exposed_communication_s, times.idle_s, times.peak_memory_bytes / kGiB);
  }
}

void write_report_csv_header(std::ostream& out) {
  fmt::print(out, "step,strategy,rank,node,busy_s,communication_s,exposed_communication_s,idle_s,"
                  "peak_memory_bytes,step_time_s,lower_bound_s\n");
}

void write_report_csv_rows(const SimulationReport& report, std::int64_t step,
                           const Cluster& cluster, std::ostream& out) {
  for (std::size_t rank = 0; rank < report.ranks.size(); ++rank) {
    const RankTimes& times = report.ranks[rank];
    fmt::print(out, "{},{},{},{},{:.9g},{:.9g},{:.9g},{:.9g},{},{:.9g},{:.9g}\n", step,
               report.strategy, rank, cluster.node_of(static_cast<int>(rank)), times.busy_s,
               times.communication_s, times.exposed_communication_s, times.idle_s,
               times.peak_memory_bytes, report.step_time_s, report.lower_bound.time_s);
  }
}

}  // namespace ballast
