// calibrate_cluster: a cluster's collective and point-to-point constants fitted to
// nccl-tests rows, and each row's measured-vs-predicted error.
#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/nccl_tests.hpp"

namespace ballast {

namespace {

/// How a row is used.
enum class RowUse { collective, p2p_intra_node, p2p_inter_node, checked, not_fitted };

std::pair<RowUse, std::string> classify(const NcclTestsRow& row, const Cluster& base) {
  if (row.gpus < 2) return {RowUse::not_fitted, "runs on one GPU: no communication to fit"};
  if (row.hosts > 1) {
    if (row.op == CollectiveOp::send_recv) return {RowUse::p2p_inter_node, ""};
    if (row.op == CollectiveOp::all_reduce && row.gpus % row.hosts == 0) {
      return {RowUse::checked,
              "all_reduce across hosts, checked against the gradient sync's all-reduce (the "
              "nodes' NICs together; docs/cost-model.md, \"Gradient sync\")"};
    }
    return {RowUse::not_fitted,
            fmt::format("{} across {} hosts: collectives spanning nodes are not fitted (their "
                        "NIC constants come from sendrecv across hosts)",
                        collective_op_name(row.op), row.hosts)};
  }
  if (row.gpus > base.gpus_per_node) {
    return {RowUse::not_fitted,
            fmt::format("{} GPUs on one host, more than the base cluster's gpus_per_node ({})",
                        row.gpus, base.gpus_per_node)};
  }
  if (row.op == CollectiveOp::send_recv) return {RowUse::p2p_intra_node, ""};
  return {RowUse::collective, ""};
}

std::vector<CollectiveSample> samples_of(std::span<const NcclTestsRow> rows,
                                         const std::vector<std::size_t>& indices) {
  std::vector<CollectiveSample> samples;
  samples.reserve(indices.size());
  for (std::size_t i : indices) samples.push_back({rows[i].size_bytes, rows[i].time_s});
  return samples;
}

/// The cluster an all_reduce row across hosts ran on: `hosts` nodes of gpus / hosts GPUs,
/// with the NICs of those GPUs (at least one per node).
Cluster row_cluster(const Cluster& cluster, const NcclTestsRow& row) {
  Cluster ran = cluster;
  ran.nodes = row.hosts;
  ran.gpus_per_node = row.gpus / row.hosts;
  ran.nics_per_node = std::max(1, ran.gpus_per_node / cluster.gpus_per_nic());
  return ran;
}

std::string fitted_summary(const CollectiveFitTable& fitted, bool p2p_intra, bool p2p_inter) {
  std::vector<std::string> parts;
  for (const auto& [op, fits] : fitted) {
    std::vector<int> gpus;
    for (const CollectiveFit& fit : fits) gpus.push_back(fit.gpus);
    parts.push_back(fmt::format("{} on {} GPUs", collective_op_name(op), fmt::join(gpus, "/")));
  }
  if (p2p_intra) parts.emplace_back("intra-node sendrecv (intra_node_p2p_bw_bytes_per_s, intra_node_latency_s)");
  if (p2p_inter) parts.emplace_back("inter-node sendrecv (nic_bw_bytes_per_s, inter_node_latency_s)");
  return fmt::format("{}", fmt::join(parts, "; "));
}

}  // namespace

Calibration calibrate_cluster(const Cluster& base, std::span<const NcclTestsRow> rows,
                              std::span<const std::string> files, const std::string& name) {
  Calibration result;
  result.cluster = base;
  result.cluster.name = name.empty() ? base.name + "-calibrated" : name;

  std::map<std::pair<CollectiveOp, int>, std::vector<std::size_t>> collective_groups;
  std::vector<std::size_t> p2p_intra, p2p_inter;
  std::map<std::string, int> not_fitted;  // note -> rows
  std::vector<RowUse> uses;
  for (std::size_t i = 0; i < rows.size(); ++i) {
    auto [use, note] = classify(rows[i], base);
    uses.push_back(use);
    CalibrationRow calibration_row;
    calibration_row.row = rows[i];
    calibration_row.fitted = use != RowUse::not_fitted && use != RowUse::checked;
    calibration_row.checked = use == RowUse::checked;
    calibration_row.note = note;
    result.rows.push_back(std::move(calibration_row));
    switch (use) {
      case RowUse::collective: collective_groups[{rows[i].op, rows[i].gpus}].push_back(i); break;
      case RowUse::p2p_intra_node: p2p_intra.push_back(i); break;
      case RowUse::p2p_inter_node: p2p_inter.push_back(i); break;
      case RowUse::checked:
      case RowUse::not_fitted: ++not_fitted[note]; break;
    }
  }

  CollectiveFitTable fitted;
  for (const auto& [key, indices] : collective_groups) {
    const auto [op, gpus] = key;
    fitted[op].push_back(fit_collective(op, gpus, samples_of(rows, indices),
                                        fmt::format("rows from {}", rows[indices.front()].source)));
  }
  for (auto& [op, fits] : fitted) result.cluster.intra_node_collectives[op] = fits;
  if (!p2p_intra.empty()) {
    const CollectiveFit fit = fit_collective(CollectiveOp::send_recv, 2, samples_of(rows, p2p_intra),
                                             fmt::format("rows from {}", rows[p2p_intra.front()].source));
    result.cluster.intra_node_p2p_bw_bytes_per_s = fit.bus_bw_bytes_per_s;
    result.cluster.intra_node_latency_s = fit.latency_s;
  }
  if (!p2p_inter.empty()) {
    const CollectiveFit fit = fit_collective(CollectiveOp::send_recv, 2, samples_of(rows, p2p_inter),
                                             fmt::format("rows from {}", rows[p2p_inter.front()].source));
    result.cluster.nic_bw_bytes_per_s = fit.bus_bw_bytes_per_s;
    result.cluster.inter_node_latency_s = fit.latency_s;
  }

  const Cluster& cluster = result.cluster;
  std::size_t worst = rows.size();
  std::size_t worst_checked = rows.size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    CalibrationRow& row = result.rows[i];
    const auto bytes = static_cast<double>(rows[i].size_bytes);
    switch (uses[i]) {
      case RowUse::collective:
        row.predicted_s = intra_node_collective_time_s(cluster, rows[i].op, rows[i].gpus,
                                                       rows[i].size_bytes);
        break;
      case RowUse::p2p_intra_node:  // CostModel::p2p_time_s inside a node, one layer
        row.predicted_s = cluster.intra_node_latency_s + bytes / cluster.intra_node_p2p_bw_bytes_per_s;
        break;
      case RowUse::p2p_inter_node:  // CostModel::p2p_time_s across nodes, one layer
        row.predicted_s = cluster.inter_node_latency_s + bytes / cluster.nic_bw_bytes_per_s;
        break;
      case RowUse::checked:  // with the calibrated NIC constants, if any
        row.predicted_s = all_reduce_link_time_s(row_cluster(cluster, rows[i]), bytes);
        break;
      case RowUse::not_fitted: continue;
    }
    row.relative_error = (row.predicted_s - rows[i].time_s) / rows[i].time_s;
    if (uses[i] == RowUse::checked) {  // not in the fit's worst error
      if (worst_checked == rows.size() ||
          std::abs(row.relative_error) > std::abs(result.rows[worst_checked].relative_error)) {
        worst_checked = i;
      }
      continue;
    }
    if (worst == rows.size() || std::abs(row.relative_error) > result.worst_relative_error) {
      worst = i;
      result.worst_relative_error = std::abs(row.relative_error);
    }
  }
  for (const auto& [note, count] : not_fitted) {
    result.notes.push_back(fmt::format("{} row(s) not fitted: {}", count, note));
  }
  if (worst_checked < rows.size()) {
    const CalibrationRow& row = result.rows[worst_checked];
    result.notes.push_back(fmt::format(
        "all_reduce across hosts checked against the cost model: largest error {:+.1f}% ({} "
        "GPUs on {} hosts, {} bytes, {}; positive: predicted slower than measured)",
        100 * row.relative_error, row.row.gpus, row.row.hosts, row.row.size_bytes, row.row.source));
  }

  std::string worst_text = "no row fitted";
  if (worst < rows.size()) {
    worst_text = fmt::format("worst relative error {:.1f}% ({} on {} GPUs, {} bytes, {})",
                             100 * result.worst_relative_error, collective_op_name(rows[worst].op),
                             rows[worst].gpus, rows[worst].size_bytes, rows[worst].source);
  }
  const auto fitted_rows = static_cast<std::size_t>(
      std::count_if(result.rows.begin(), result.rows.end(), [](const CalibrationRow& r) { return r.fitted; }));
  result.cluster.provenance = fmt::format(
      "{} Calibrated by `ballast calibrate` from nccl-tests results {} ({} rows, {} fitted): "
      "{}; {}.{}",
      base.provenance, fmt::join(files, ", "), rows.size(), fitted_rows,
      fitted_summary(fitted, !p2p_intra.empty(), !p2p_inter.empty()), worst_text,
      result.notes.empty() ? "" : fmt::format(" Not fitted: {}.", fmt::join(result.notes, "; ")));
  validate_cluster(result.cluster, fmt::format("cluster calibrated from {}", fmt::join(files, ", ")));
  return result;
}

}  // namespace ballast
