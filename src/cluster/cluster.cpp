// Cluster validation, JSON round trip and load_cluster (a preset name or a JSON file).
// The presets themselves live in presets.cpp.
#include <cmath>

#include "ballast/cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

/// Every member cluster_from_json reads (and to_json writes); any other is an error.
constexpr std::array<std::string_view, 22> kClusterKeys = {
    "name", "gpu_name", "nodes", "gpus_per_node", "gpu_memory_bytes", "peak_flops_per_s",
    "matmul_efficiency", "attention_efficiency", "attention_tile_tokens", "attention_tiles",
    "memory_usable_fraction", "intra_node_bus_bw_bytes_per_s", "intra_node_p2p_bw_bytes_per_s",
    "intra_node_latency_s", "nics_per_node", "nic_bw_bytes_per_s", "inter_node_latency_s",
    "provenance", "intra_node_collectives", "attention_efficiency_curve", "measured_on",
    "tensor_parallel"};
constexpr std::array<std::string_view, 7> kHostRecordKeys = {
    "host", "cpu", "mpi", "model", "ranks", "blas_threads", "measured_at"};

constexpr std::array<std::string_view, 3> kTensorParallelKeys = {"gpus", "all_gather",
                                                                 "reduce_scatter"};
constexpr std::array<std::string_view, 2> kTensorParallelFitKeys = {"latency_s",
                                                                    "bus_bw_bytes_per_s"};

/// The values of "attention_tiles": Cluster::attention_tiles_packed false, true.
constexpr std::string_view kTilesPerBlock = "per_block";
constexpr std::string_view kTilesPacked = "packed";

/// The members of "attention_efficiency_curve" and of each of its points.
constexpr std::array<std::string_view, 2> kCurvePassKeys = {"forward", "backward"};
constexpr std::array<std::string_view, 3> kCurvePointKeys = {"tokens", "efficiency", "source"};
/// A curve is searched on every attention call; dozens of points are already more than any
/// benchmark sweep gives (FlashAttention's charts have 6).
constexpr std::size_t kMaxCurvePoints = 64;

[[noreturn]] void reject(const std::string& source, const std::string& field,
                         const std::string& problem) {
  throw InputError(fmt::format("{}: cluster field '{}' {}", source, field, problem));
}

void require_positive(double value, const std::string& source, const std::string& field) {
  if (!(value > 0)) reject(source, field, fmt::format("must be > 0 (got {}); fix it", value));
}

void require_fraction(double value, const std::string& source, const std::string& field) {
  if (!(value > 0 && value <= 1)) {
    reject(source, field, fmt::format("must be in (0, 1] (got {}); fix it", value));
  }
}

void require_non_negative(double value, const std::string& source, const std::string& field) {
  if (!(value >= 0)) reject(source, field, fmt::format("must be >= 0 (got {}); fix it", value));
}

void validate_curve(const std::vector<EfficiencyPoint>& curve, const std::string& source,
                    const std::string& field) {
  if (curve.size() > kMaxCurvePoints) {
    reject(source, field, fmt::format("has {} points, over ballast's limit of {}; keep one point "
                                      "per benchmarked length", curve.size(), kMaxCurvePoints));
  }
  for (std::size_t i = 0; i < curve.size(); ++i) {
    const std::string point = fmt::format("{}[{}]", field, i);
    if (curve[i].tokens < 1) {
      reject(source, point + ".tokens", fmt::format("must be >= 1 (got {})", curve[i].tokens));
    }
    if (i > 0 && curve[i].tokens <= curve[i - 1].tokens) {
      reject(source, point + ".tokens",
             fmt::format("({}) must be greater than the previous point's ({}); list the points "
                         "by increasing length, one per length",
                         curve[i].tokens, curve[i - 1].tokens));
    }
    require_fraction(curve[i].efficiency, source, point + ".efficiency");
  }
}

void validate_topology(const Cluster& cluster, const std::string& source) {
  if (cluster.nodes < 1) reject(source, "nodes", fmt::format("must be >= 1 (got {})", cluster.nodes));
  if (cluster.gpus_per_node < 1) {
    reject(source, "gpus_per_node", fmt::format("must be >= 1 (got {})", cluster.gpus_per_node));
  }
  if (cluster.gpus_per_node > kMaxGpusPerNode) {
    reject(source, "gpus_per_node",
           fmt::format("is {}, over ballast's limit of {} GPUs per node; describe the machine "
                       "as more nodes",
                       cluster.gpus_per_node, kMaxGpusPerNode));
  }
  if (cluster.nics_per_node < 1) {
    reject(source, "nics_per_node", fmt::format("must be >= 1 (got {})", cluster.nics_per_node));
  }
  if (cluster.gpus_per_node % cluster.nics_per_node != 0) {
    reject(source, "nics_per_node",
           fmt::format("({}) must divide gpus_per_node ({}) so every NIC serves as many GPUs",
                       cluster.nics_per_node, cluster.gpus_per_node));
  }
  if (static_cast<long long>(cluster.nodes) * cluster.gpus_per_node > kMaxRanks) {
    reject(source, "nodes",
           fmt::format("({}) x gpus_per_node ({}) = {} GPUs, over ballast's limit of {} GPUs "
                       "per cluster; use at most {} nodes",
                       cluster.nodes, cluster.gpus_per_node,
                       static_cast<long long>(cluster.nodes) * cluster.gpus_per_node, kMaxRanks,
                       kMaxRanks / cluster.gpus_per_node));
  }
}

void validate_tensor_parallel(const Cluster& cluster, const std::string& source) {
  const TensorParallelism& tp = cluster.tensor_parallel;
  if (tp.gpus < 1 || tp.gpus > kMaxGpusPerNode) {
    reject(source, "tensor_parallel.gpus",
           fmt::format("is {}; a TP group holds 1 to {} GPUs of one node", tp.gpus,
                       kMaxGpusPerNode));
  }
  if (tp.gpus == 1) return;
  const std::pair<const char*, const CollectiveFit*> fits[] = {
      {"all_gather", &tp.all_gather}, {"reduce_scatter", &tp.reduce_scatter}};
  for (const auto& [name, fit] : fits) {
    if (fit->gpus != tp.gpus) {
      reject(source, fmt::format("tensor_parallel.{}", name),
             fmt::format("is for {} GPUs but the TP group has {}", fit->gpus, tp.gpus));
    }
    if (!(fit->latency_s >= 0) || !std::isfinite(fit->latency_s)) {
      reject(source, fmt::format("tensor_parallel.{}.latency_s", name),
             fmt::format("must be >= 0 (got {}); fix it", fit->latency_s));
    }
    require_positive(fit->bus_bw_bytes_per_s, source,
                     fmt::format("tensor_parallel.{}.bus_bw_bytes_per_s", name));
  }
}

nlohmann::json tensor_parallel_to_json(const TensorParallelism& tp) {
  const auto fit = [](const CollectiveFit& f) {
    return nlohmann::json{{"latency_s", f.latency_s}, {"bus_bw_bytes_per_s", f.bus_bw_bytes_per_s}};
  };
  return {{"gpus", tp.gpus},
          {"all_gather", fit(tp.all_gather)},
          {"reduce_scatter", fit(tp.reduce_scatter)}};
}

TensorParallelism tensor_parallel_from_json(const nlohmann::json& json, const std::string& source) {
  const std::string where = source + ": tensor_parallel";
  if (!json.is_object()) {
    reject(source, "tensor_parallel",
           "must be an object {\"gpus\", \"all_gather\", \"reduce_scatter\"}");
  }
  reject_unknown_keys(json, kTensorParallelKeys, where);
  TensorParallelism tp;
  tp.gpus = required_field<int>(json, "gpus", where);
  const auto fit = [&](const char* name) {
    const std::string fit_where = fmt::format("{}.{}", where, name);
    if (!json.contains(name) || !json[name].is_object()) {
      reject(source, fmt::format("tensor_parallel.{}", name),
             "must be an object {\"latency_s\", \"bus_bw_bytes_per_s\"}");
    }
    reject_unknown_keys(json[name], kTensorParallelFitKeys, fit_where);
    return CollectiveFit{tp.gpus, required_field<double>(json[name], "latency_s", fit_where),
                         required_field<double>(json[name], "bus_bw_bytes_per_s", fit_where)};
  };
  tp.all_gather = fit("all_gather");
  tp.reduce_scatter = fit("reduce_scatter");
  return tp;
}

nlohmann::json curve_to_json(const std::vector<EfficiencyPoint>& curve) {
  nlohmann::json points = nlohmann::json::array();
  for (const EfficiencyPoint& point : curve) {
    points.push_back(
        {{"tokens", point.tokens}, {"efficiency", point.efficiency}, {"source", point.source}});
  }
  return points;
}

std::vector<EfficiencyPoint> curve_from_json(const nlohmann::json& curves, const std::string& pass,
                                             const std::string& source) {
  if (!curves.contains(pass)) return {};
  const std::string field = "attention_efficiency_curve." + pass;
  const nlohmann::json& points = curves[pass];
  if (!points.is_array() || points.empty()) {
    reject(source, field,
           "must be a non-empty array of {\"tokens\", \"efficiency\", \"source\"} points; "
           "omit the pass to use attention_efficiency");
  }
  std::vector<EfficiencyPoint> curve;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const std::string where = fmt::format("{}: {}[{}]", source, field, i);
    if (!points[i].is_object()) {
      throw InputError(where + ": a point must be an object {\"tokens\", \"efficiency\", "
                               "\"source\"}");
    }
    reject_unknown_keys(points[i], kCurvePointKeys, where);
    EfficiencyPoint point;
    point.tokens = required_field<Tokens>(points[i], "tokens", where);
    point.efficiency = required_field<double>(points[i], "efficiency", where);
    point.source = optional_field<std::string>(points[i], "source", "", where);
    curve.push_back(std::move(point));
  }
  return curve;
}

}  // namespace

void validate_cluster(const Cluster& cluster, const std::string& source) {
  if (cluster.name.empty()) reject(source, "name", "must not be empty");
  validate_topology(cluster, source);
  require_positive(static_cast<double>(cluster.gpu_memory_bytes), source, "gpu_memory_bytes");
  require_positive(cluster.peak_flops_per_s, source, "peak_flops_per_s");
  require_fraction(cluster.matmul_efficiency, source, "matmul_efficiency");
  require_fraction(cluster.attention_efficiency, source, "attention_efficiency");
  if (cluster.attention_tile_tokens < 1) {
    reject(source, "attention_tile_tokens",
           fmt::format("must be >= 1 (got {})", cluster.attention_tile_tokens));
  }
  require_fraction(cluster.memory_usable_fraction, source, "memory_usable_fraction");
  require_positive(cluster.intra_node_bus_bw_bytes_per_s, source, "intra_node_bus_bw_bytes_per_s");
  require_positive(cluster.intra_node_p2p_bw_bytes_per_s, source, "intra_node_p2p_bw_bytes_per_s");
  require_non_negative(cluster.intra_node_latency_s, source, "intra_node_latency_s");
  require_positive(cluster.nic_bw_bytes_per_s, source, "nic_bw_bytes_per_s");
  require_non_negative(cluster.inter_node_latency_s, source, "inter_node_latency_s");
  validate_collective_fits(cluster.intra_node_collectives, cluster.gpus_per_node, source);
  validate_curve(cluster.attention_forward_curve, source, "attention_efficiency_curve.forward");
  validate_curve(cluster.attention_backward_curve, source, "attention_efficiency_curve.backward");
  validate_tensor_parallel(cluster, source);
}

std::string describe_cluster(const Cluster& cluster) {
  const int tp = cluster.tensor_parallel.gpus;
  const std::string groups =
      tp > 1 ? fmt::format(" in {} TP groups of {}", cluster.ranks(), tp) : std::string();
  return fmt::format("{} ({} nodes x {} {}, {} GPUs{})", cluster.name, cluster.nodes,
                     cluster.gpus_per_node * tp, cluster.gpu_name, cluster.gpus(), groups);
}

double curve_efficiency(std::span<const EfficiencyPoint> curve, double tokens) {
  BALLAST_CHECK(!curve.empty(), "curve_efficiency needs at least one point");
  if (tokens <= static_cast<double>(curve.front().tokens)) return curve.front().efficiency;
  if (tokens >= static_cast<double>(curve.back().tokens)) return curve.back().efficiency;
  std::size_t upper = 1;
  while (static_cast<double>(curve[upper].tokens) < tokens) ++upper;
  const EfficiencyPoint& left = curve[upper - 1];
  const EfficiencyPoint& right = curve[upper];
  const double position = std::log(tokens / static_cast<double>(left.tokens)) /
                          std::log(static_cast<double>(right.tokens) /
                                   static_cast<double>(left.tokens));
  return left.efficiency + position * (right.efficiency - left.efficiency);
}

nlohmann::json to_json(const Cluster& cluster) {
  nlohmann::json json;
  json["name"] = cluster.name;
  json["gpu_name"] = cluster.gpu_name;
  json["nodes"] = cluster.nodes;
  json["gpus_per_node"] = cluster.gpus_per_node;
  json["gpu_memory_bytes"] = cluster.gpu_memory_bytes;
  json["peak_flops_per_s"] = cluster.peak_flops_per_s;
  json["matmul_efficiency"] = cluster.matmul_efficiency;
  json["attention_efficiency"] = cluster.attention_efficiency;
  json["attention_tile_tokens"] = cluster.attention_tile_tokens;
  // Only when packed, so plans on the usual (per-block) clusters keep their bytes.
  if (cluster.attention_tiles_packed) json["attention_tiles"] = kTilesPacked;
  json["memory_usable_fraction"] = cluster.memory_usable_fraction;
  json["intra_node_bus_bw_bytes_per_s"] = cluster.intra_node_bus_bw_bytes_per_s;
  json["intra_node_p2p_bw_bytes_per_s"] = cluster.intra_node_p2p_bw_bytes_per_s;
  json["intra_node_latency_s"] = cluster.intra_node_latency_s;
  json["nics_per_node"] = cluster.nics_per_node;
  json["nic_bw_bytes_per_s"] = cluster.nic_bw_bytes_per_s;
  json["inter_node_latency_s"] = cluster.inter_node_latency_s;
  json["provenance"] = cluster.provenance;
  // Only when calibrated, so plans on uncalibrated clusters keep their bytes.
  if (!cluster.intra_node_collectives.empty()) {
    json["intra_node_collectives"] = collective_fits_to_json(cluster.intra_node_collectives);
  }
  if (!cluster.attention_forward_curve.empty() || !cluster.attention_backward_curve.empty()) {
    nlohmann::json curves = nlohmann::json::object();
    if (!cluster.attention_forward_curve.empty()) {
      curves["forward"] = curve_to_json(cluster.attention_forward_curve);
    }
    if (!cluster.attention_backward_curve.empty()) {
      curves["backward"] = curve_to_json(cluster.attention_backward_curve);
    }
    json["attention_efficiency_curve"] = std::move(curves);
  }
  if (cluster.measured_on) {
    const HostRecord& host = *cluster.measured_on;
    json["measured_on"] = {{"host", host.host},   {"cpu", host.cpu},
                           {"mpi", host.mpi},     {"model", host.model},
                           {"ranks", host.ranks}, {"blas_threads", host.blas_threads},
                           {"measured_at", host.measured_at}};
  }
  // Only with TP, so plans and clusters without it keep their bytes.
  if (cluster.tensor_parallel.gpus > 1) {
    json["tensor_parallel"] = tensor_parallel_to_json(cluster.tensor_parallel);
  }
  return json;
}

Cluster cluster_from_json(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) {
    throw InputError(fmt::format("{}: a cluster must be a JSON object; see "
                                 "data/presets/example-cluster.json", source));
  }
  // First, so that a misspelt required key gets its suggestion, not "missing field".
  reject_unknown_keys(json, kClusterKeys, source);
  Cluster cluster;
  cluster.name = required_field<std::string>(json, "name", source);
  cluster.gpu_name = required_field<std::string>(json, "gpu_name", source);
  cluster.nodes = required_field<int>(json, "nodes", source);
  cluster.gpus_per_node = required_field<int>(json, "gpus_per_node", source);
  cluster.gpu_memory_bytes = required_field<Bytes>(json, "gpu_memory_bytes", source);
  cluster.peak_flops_per_s = required_field<double>(json, "peak_flops_per_s", source);
  cluster.matmul_efficiency = required_field<double>(json, "matmul_efficiency", source);
  cluster.attention_efficiency = required_field<double>(json, "attention_efficiency", source);
  cluster.attention_tile_tokens = required_field<Tokens>(json, "attention_tile_tokens", source);
  const auto tiles =
      optional_field<std::string>(json, "attention_tiles", std::string(kTilesPerBlock), source);
  if (tiles != kTilesPerBlock && tiles != kTilesPacked) {
    reject(source, "attention_tiles",
           fmt::format("is {}; use \"{}\" (each block tiled on its own, GPU varlen "
                       "kernels; the default) or \"{}\" (the blocks of a call tiled together, "
                       "ballast's CPU runtime kernel)",
                       nlohmann::json(tiles).dump(), kTilesPerBlock, kTilesPacked));
  }
  cluster.attention_tiles_packed = tiles == kTilesPacked;
  cluster.memory_usable_fraction = required_field<double>(json, "memory_usable_fraction", source);
  cluster.intra_node_bus_bw_bytes_per_s =
      required_field<double>(json, "intra_node_bus_bw_bytes_per_s", source);
  cluster.intra_node_p2p_bw_bytes_per_s =
      required_field<double>(json, "intra_node_p2p_bw_bytes_per_s", source);
  cluster.intra_node_latency_s = required_field<double>(json, "intra_node_latency_s", source);
  cluster.nics_per_node = required_field<int>(json, "nics_per_node", source);
  cluster.nic_bw_bytes_per_s = required_field<double>(json, "nic_bw_bytes_per_s", source);
  cluster.inter_node_latency_s = required_field<double>(json, "inter_node_latency_s", source);
  cluster.provenance = optional_field<std::string>(json, "provenance", "", source);
  if (const auto it = json.find("intra_node_collectives"); it != json.end()) {
    cluster.intra_node_collectives = collective_fits_from_json(*it, source);
  }
  if (json.contains("attention_efficiency_curve")) {
    const nlohmann::json& curves = json["attention_efficiency_curve"];
    if (!curves.is_object()) {
      reject(source, "attention_efficiency_curve",
             "must be an object {\"forward\": [...], \"backward\": [...]}");
    }
    reject_unknown_keys(curves, kCurvePassKeys, source + ": attention_efficiency_curve");
    cluster.attention_forward_curve = curve_from_json(curves, "forward", source);
    cluster.attention_backward_curve = curve_from_json(curves, "backward", source);
  }
  if (const auto it = json.find("measured_on"); it != json.end()) {
    const std::string where = source + ": measured_on";
    if (!it->is_object()) {
      reject(source, "measured_on", "must be an object (see `ballast calibrate --host`)");
    }
    reject_unknown_keys(*it, kHostRecordKeys, where);
    HostRecord host;
    host.host = required_field<std::string>(*it, "host", where);
    host.cpu = required_field<std::string>(*it, "cpu", where);
    host.mpi = required_field<std::string>(*it, "mpi", where);
    host.model = required_field<std::string>(*it, "model", where);
    host.ranks = required_field<int>(*it, "ranks", where);
    host.blas_threads = required_field<int>(*it, "blas_threads", where);
    host.measured_at = required_field<std::string>(*it, "measured_at", where);
    if (host.ranks < 1 || host.blas_threads < 1) {
      reject(source, "measured_on", "ranks and blas_threads must be >= 1");
    }
    cluster.measured_on = std::move(host);
  }
  if (const auto it = json.find("tensor_parallel"); it != json.end()) {
    cluster.tensor_parallel = tensor_parallel_from_json(*it, source);
  }
  validate_cluster(cluster, source);
  return cluster;
}

Cluster load_cluster(const std::string& preset_or_file, std::optional<int> nodes) {
  Cluster cluster;
  std::string source = preset_or_file;
  const auto presets = cluster_preset_names();
  if (std::find(presets.begin(), presets.end(), preset_or_file) != presets.end()) {
    cluster = cluster_preset(preset_or_file);
    source = "cluster preset '" + preset_or_file + "'";
  } else if (std::filesystem::is_regular_file(preset_or_file)) {
    cluster = cluster_from_json(read_json_file(preset_or_file), preset_or_file);
    if (cluster.tensor_parallel.gpus > 1) {
      throw InputError(fmt::format(
          "{}: a cluster of TP groups (\"tensor_parallel\": {} GPUs, as a plan embeds it); "
          "give the cluster of GPUs and {} {} instead",
          preset_or_file, cluster.tensor_parallel.gpus, setting_name("--tp"),
          cluster.tensor_parallel.gpus));
    }
  } else {
    throw InputError(fmt::format(
        "unknown cluster '{}'{}: not a preset ({}) and not a JSON file; pick a preset or give "
        "the path of a cluster JSON file",
        preset_or_file, did_you_mean(preset_or_file, presets), fmt::join(presets, ", ")));
  }
  if (nodes) {
    if (*nodes < 1) {
      throw InputError(fmt::format("{} must be >= 1 (got {})", setting_name("--nodes"), *nodes));
    }
    if (static_cast<long long>(*nodes) * cluster.gpus_per_node > kMaxRanks) {
      throw InputError(fmt::format(
          "{} {} gives {} x {} = {} GPUs, over ballast's limit of {} GPUs per cluster; use "
          "{} {} or fewer",
          setting_name("--nodes"), *nodes, *nodes, cluster.gpus_per_node,
          static_cast<long long>(*nodes) * cluster.gpus_per_node, kMaxRanks,
          setting_name("--nodes"), kMaxRanks / cluster.gpus_per_node));
    }
    cluster.nodes = *nodes;
  }
  validate_cluster(cluster, source);
  return cluster;
}

}  // namespace ballast
