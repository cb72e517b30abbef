// Collectives inside one node: op names, nccl-tests' bus-bandwidth factors, the
// per-(op, GPU count) constants (interpolation, fallback, validation, JSON) and their fit.
#include "ballast/collectives.hpp"

#include <algorithm>
#include <array>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

constexpr std::array<CollectiveOp, kCollectiveOpCount> kOps = {
    CollectiveOp::all_gather, CollectiveOp::reduce_scatter, CollectiveOp::all_reduce,
    CollectiveOp::all_to_all, CollectiveOp::send_recv};

constexpr std::array<std::string_view, 3> kFitKeys = {"gpus", "latency_s", "bus_bw_bytes_per_s"};

/// Ring steps the uncalibrated model charges one intra_node_latency_s for (the formulas
/// CostModel used before calibrated constants existed).
double latency_steps(CollectiveOp op, int gpus) {
  switch (op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter: return static_cast<double>(gpus - 1);
    case CollectiveOp::all_reduce: return 2.0 * (gpus - 1);
    case CollectiveOp::all_to_all:
    case CollectiveOp::send_recv: return 1.0;
  }
  return 1.0;
}

std::string field_path(CollectiveOp op, std::size_t index, std::string_view key) {
  return fmt::format("intra_node_collectives.{}[{}].{}", collective_op_name(op), index, key);
}

[[noreturn]] void reject_fit(const std::string& source, const std::string& field,
                             const std::string& problem) {
  throw InputError(fmt::format("{}: cluster field '{}' {}", source, field, problem));
}

}  // namespace

std::string_view collective_op_name(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::all_gather: return "all_gather";
    case CollectiveOp::reduce_scatter: return "reduce_scatter";
    case CollectiveOp::all_reduce: return "all_reduce";
    case CollectiveOp::all_to_all: return "all_to_all";
    case CollectiveOp::send_recv: return "send_recv";
  }
  return "?";
}

std::span<const CollectiveOp> collective_ops() { return kOps; }

CollectiveOp collective_op_from_name(std::string_view name, const std::string& where) {
  for (CollectiveOp op : kOps) {
    if (name == collective_op_name(op)) return op;
  }
  if (name == "alltoall") return CollectiveOp::all_to_all;  // nccl-tests' spellings
  if (name == "sendrecv") return CollectiveOp::send_recv;
  std::vector<std::string> known;
  for (CollectiveOp op : kOps) known.emplace_back(collective_op_name(op));
  const std::string suggestion =
      did_you_mean(name, {"all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                          "send_recv", "alltoall", "sendrecv"});
  throw InputError(fmt::format("{}: unknown collective '{}'{}; known: {} (nccl-tests' "
                               "alltoall and sendrecv are accepted too)",
                               where, name, suggestion, fmt::join(known, ", ")));
}

double bus_bandwidth_factor(CollectiveOp op, int gpus) {
  const double n = gpus;
  switch (op) {
    case CollectiveOp::all_gather:
    case CollectiveOp::reduce_scatter:
    case CollectiveOp::all_to_all: return (n - 1) / n;
    case CollectiveOp::all_reduce: return 2 * (n - 1) / n;
    case CollectiveOp::send_recv: return 1.0;
  }
  return 1.0;
}

CollectiveFit interpolate_collective_fit(std::span<const CollectiveFit> fits, int gpus) {
  BALLAST_CHECK(!fits.empty(), "interpolate_collective_fit needs at least one entry");
  if (gpus <= fits.front().gpus) return {gpus, fits.front().latency_s, fits.front().bus_bw_bytes_per_s};
  for (std::size_t i = 1; i < fits.size(); ++i) {
    const CollectiveFit& upper = fits[i];
    if (gpus > upper.gpus) continue;
    if (gpus == upper.gpus) return upper;
    const CollectiveFit& lower = fits[i - 1];
    const double weight =
        static_cast<double>(gpus - lower.gpus) / static_cast<double>(upper.gpus - lower.gpus);
    return {gpus, lower.latency_s + weight * (upper.latency_s - lower.latency_s),
            lower.bus_bw_bytes_per_s +
                weight * (upper.bus_bw_bytes_per_s - lower.bus_bw_bytes_per_s)};
  }
  return {gpus, fits.back().latency_s, fits.back().bus_bw_bytes_per_s};
}

CollectiveFit intra_node_collective_fit(const Cluster& cluster, CollectiveOp op, int gpus) {
  const auto it = cluster.intra_node_collectives.find(op);
  if (it != cluster.intra_node_collectives.end() && !it->second.empty()) {
    return interpolate_collective_fit(it->second, gpus);
  }
  return alpha_beta_collective_fit(cluster, op, gpus);
}

CollectiveFit alpha_beta_collective_fit(const Cluster& cluster, CollectiveOp op, int gpus) {
  const double bw = op == CollectiveOp::send_recv ? cluster.intra_node_p2p_bw_bytes_per_s
                                                  : cluster.intra_node_bus_bw_bytes_per_s;
  return {gpus, latency_steps(op, gpus) * cluster.intra_node_latency_s, bw};
}

Seconds intra_node_collective_time_s(const Cluster& cluster, CollectiveOp op, int gpus,
                                     Bytes bytes) {
  if (gpus <= 1 || bytes <= 0) return 0.0;
  const CollectiveFit fit = intra_node_collective_fit(cluster, op, gpus);
  return fit.latency_s +
         static_cast<double>(bytes) * bus_bandwidth_factor(op, gpus) / fit.bus_bw_bytes_per_s;
}

Seconds all_reduce_link_time_s(const Cluster& cluster, double bytes) {
  const int ranks = cluster.ranks();
  if (ranks <= 1 || !(bytes > 0)) return 0.0;
  // nccl-tests all_reduce_perf across nodes reports about the node's NICs together as
  // busbw: 8 H100 x 8 NDR NICs, 4 nodes, 365.84 GB/s (NVIDIA/nccl-tests#309); 8 A100 x 4
  // HDR NICs 86 GB/s on 2 nodes (#175), 84.8 on 3 (#119). Not one GPU's share of a NIC.
  const bool multi_node = cluster.nodes > 1;
  const double bw = multi_node ? std::min(cluster.intra_node_bus_bw_bytes_per_s,
                                          cluster.nic_bw_bytes_per_s * cluster.nics_per_node)
                               : cluster.intra_node_bus_bw_bytes_per_s;
  const Seconds latency_s = multi_node ? cluster.inter_node_latency_s : cluster.intra_node_latency_s;
  const double volume_bytes = 2.0 * (ranks - 1) / ranks * bytes;
  return volume_bytes / bw + 2.0 * std::ceil(std::log2(ranks)) * latency_s;
}

CollectiveFit fit_collective(CollectiveOp op, int gpus, std::span<const CollectiveSample> samples,
                             const std::string& where) {
  // Residual r = a x1 + b x2 - 1 with x1 = 1/t, x2 = w/t: the normal equations of a
  // two-parameter linear least-squares problem.
  double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
  const double factor = bus_bandwidth_factor(op, gpus);
  for (const CollectiveSample& sample : samples) {
    if (!(sample.time_s > 0) || sample.bytes <= 0) {
      throw InputError(fmt::format("{}: {} on {} GPUs: a measurement of {} bytes in {} s; "
                                   "sizes and times must be positive",
                                   where, collective_op_name(op), gpus, sample.bytes, sample.time_s));
    }
    const double x1 = 1.0 / sample.time_s;
    const double x2 = static_cast<double>(sample.bytes) * factor / sample.time_s;
    s11 += x1 * x1;
    s12 += x1 * x2;
    s22 += x2 * x2;
    r1 += x1;
    r2 += x2;
  }
  const double determinant = s11 * s22 - s12 * s12;
  const auto sizes_differ = [&] {
    return std::any_of(samples.begin(), samples.end(),
                       [&](const CollectiveSample& s) { return s.bytes != samples.front().bytes; });
  };
  if (samples.size() < 2 || !sizes_differ() || !(determinant > 0)) {
    throw InputError(fmt::format(
        "{}: {} on {} GPUs has {} measurement(s){}; a latency and a bandwidth need at least "
        "two different sizes (run nccl-tests with -b and -e apart, e.g. -b 8M -e 8G -f 2)",
        where, collective_op_name(op), gpus, samples.size(),
        samples.size() >= 2 ? " all of one size" : ""));
  }
  double latency_s = (r1 * s22 - r2 * s12) / determinant;
  double seconds_per_byte = (s11 * r2 - s12 * r1) / determinant;
  if (latency_s < 0) {  // clamp and refit the bandwidth alone: b = sum x2 / sum x2^2
    latency_s = 0;
    seconds_per_byte = r2 / s22;
  }
  if (!(seconds_per_byte > 0)) {
    throw InputError(fmt::format("{}: {} on {} GPUs: time does not grow with size, so no "
                                 "bandwidth fits; check the measurements",
                                 where, collective_op_name(op), gpus));
  }
  return {gpus, latency_s, 1.0 / seconds_per_byte};
}

CollectiveFit fit_collective_noisy(CollectiveOp op, int gpus, std::vector<CollectiveSample> samples,
                                   const std::string& where) {
  std::sort(samples.begin(), samples.end(),
            [](const CollectiveSample& a, const CollectiveSample& b) { return a.bytes < b.bytes; });
  for (std::size_t i = samples.size(); i-- > 1;) {
    samples[i - 1].time_s = std::min(samples[i - 1].time_s, samples[i].time_s);
  }
  // Times that grow somewhere: the relative-error fit's slope has the sign of a weighted
  // covariance of size and time, positive for non-decreasing, non-constant times.
  if (samples.size() < 2 || !(samples.front().time_s > 0) || samples.front().time_s < samples.back().time_s) {
    return fit_collective(op, gpus, samples, where);
  }
  const CollectiveSample& largest = samples.back();
  if (largest.bytes == samples.front().bytes) return fit_collective(op, gpus, samples, where);
  return {gpus, 0.0, static_cast<double>(largest.bytes) * bus_bandwidth_factor(op, gpus) / largest.time_s};
}

void validate_collective_fits(const CollectiveFitTable& table, int gpus_per_node,
                              const std::string& source) {
  for (const auto& [op, fits] : table) {
    for (std::size_t i = 0; i < fits.size(); ++i) {
      const CollectiveFit& fit = fits[i];
      // Not bounded by gpus_per_node: a preset reshaped to smaller nodes (Python's
      // cluster.gpus_per_node = 4 on h100) keeps its 8-GPU entries, which then only shape
      // the interpolation.
      if (fit.gpus < 2 || fit.gpus > kMaxGpusPerNode) {
        reject_fit(source, field_path(op, i, "gpus"),
                   fmt::format("is {}; a collective inside one node spans 2 to {} GPUs (this "
                               "cluster: {} per node): drop the entry or fix gpus",
                               fit.gpus, kMaxGpusPerNode, gpus_per_node));
      }
      if (i > 0 && fit.gpus <= fits[i - 1].gpus) {
        reject_fit(source, field_path(op, i, "gpus"),
                   fmt::format("is {} after an entry for {} GPUs; give each GPU count once, "
                               "entries sorted by gpus",
                               fit.gpus, fits[i - 1].gpus));
      }
      if (!(fit.latency_s >= 0) || !std::isfinite(fit.latency_s)) {
        reject_fit(source, field_path(op, i, "latency_s"),
                   fmt::format("must be >= 0 (got {}); fix it", fit.latency_s));
      }
      if (!(fit.bus_bw_bytes_per_s > 0) || !std::isfinite(fit.bus_bw_bytes_per_s)) {
        reject_fit(source, field_path(op, i, "bus_bw_bytes_per_s"),
                   fmt::format("must be > 0 (got {}); fix it", fit.bus_bw_bytes_per_s));
      }
    }
  }
}

nlohmann::json collective_fits_to_json(const CollectiveFitTable& table) {
  nlohmann::json json = nlohmann::json::object();
  for (const auto& [op, fits] : table) {
    nlohmann::json entries = nlohmann::json::array();
    for (const CollectiveFit& fit : fits) {
      entries.push_back({{"gpus", fit.gpus},
                         {"latency_s", fit.latency_s},
                         {"bus_bw_bytes_per_s", fit.bus_bw_bytes_per_s}});
    }
    json[std::string(collective_op_name(op))] = std::move(entries);
  }
  return json;
}

CollectiveFitTable collective_fits_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) {
    throw InputError(fmt::format(
        "{}: cluster field 'intra_node_collectives' must be an object such as {{\"all_gather\": "
        "[{{\"gpus\": 8, \"latency_s\": 5e-05, \"bus_bw_bytes_per_s\": 3.7e+11}}]}}; got {}",
        source, json.type_name()));
  }
  CollectiveFitTable table;
  for (auto it = json.begin(); it != json.end(); ++it) {
    const std::string where = fmt::format("{}: intra_node_collectives", source);
    const CollectiveOp op = collective_op_from_name(it.key(), where);
    if (table.count(op) != 0) {
      throw InputError(fmt::format("{}: '{}' names {} a second time; give each operation once",
                                   where, it.key(), collective_op_name(op)));
    }
    if (!it.value().is_array()) {
      throw InputError(fmt::format("{}.{} must be an array of {{\"gpus\", \"latency_s\", "
                                   "\"bus_bw_bytes_per_s\"}} objects; got {}",
                                   where, it.key(), it.value().type_name()));
    }
    std::vector<CollectiveFit> fits;
    for (std::size_t i = 0; i < it.value().size(); ++i) {
      const nlohmann::json& entry = it.value()[i];
      const std::string entry_source = fmt::format("{}.{}[{}]", where, it.key(), i);
      reject_unknown_keys(entry, kFitKeys, entry_source);
      fits.push_back({required_field<int>(entry, "gpus", entry_source),
                      required_field<double>(entry, "latency_s", entry_source),
                      required_field<double>(entry, "bus_bw_bytes_per_s", entry_source)});
    }
    // Sorted, so that a user need not order them; duplicates stay for validation to name.
    std::stable_sort(fits.begin(), fits.end(),
                     [](const CollectiveFit& a, const CollectiveFit& b) { return a.gpus < b.gpus; });
    table[op] = std::move(fits);
  }
  return table;
}

}  // namespace ballast
