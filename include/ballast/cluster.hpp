// Cluster: nodes x GPUs, their compute and memory, and the links between them.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ballast/collectives.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// A homogeneous GPU cluster. Ranks are numbered node-major: rank = node * gpus_per_node
/// + local index. Local GPU i uses NIC i / gpus_per_nic() of its node.
struct Cluster {
  std::string name;
  std::string gpu_name;
  int nodes = 1;
  int gpus_per_node = 8;

  Bytes gpu_memory_bytes = 0;
  double peak_flops_per_s = 0;        ///< dense BF16 peak per GPU
  double matmul_efficiency = 0;       ///< achieved / peak for the linear layers (GEMMs)
  double attention_efficiency = 0;    ///< achieved / peak for attention on long documents
  Tokens attention_tile_tokens = 128; ///< attention kernels work in square tiles of this size
  double memory_usable_fraction = 0;  ///< share of gpu_memory_bytes a plan may use

  double intra_node_bus_bw_bytes_per_s = 0;  ///< per-GPU collective bus bandwidth (NVLink)
  double intra_node_p2p_bw_bytes_per_s = 0;  ///< one GPU-to-GPU send inside a node
  Seconds intra_node_latency_s = 0;

  int nics_per_node = 1;
  double nic_bw_bytes_per_s = 0;  ///< achieved bandwidth of one NIC, one direction
  Seconds inter_node_latency_s = 0;

  std::string provenance;  ///< where the numbers come from

  /// Calibrated latency and bus bandwidth per collective and GPU count inside one node
  /// (nccl-tests fits, `ballast calibrate`); an op without entries uses the alpha-beta
  /// model of the fields above (collectives.hpp, intra_node_collective_fit). Optional in
  /// JSON ("intra_node_collectives"), written only when not empty.
  CollectiveFitTable intra_node_collectives;

  int ranks() const { return nodes * gpus_per_node; }
  int node_of(int rank) const { return rank / gpus_per_node; }
  int gpus_per_nic() const { return gpus_per_node / nics_per_node; }
  /// Global NIC index (node * nics_per_node + local NIC) used by a rank.
  int nic_of(int rank) const {
    return node_of(rank) * nics_per_node + (rank % gpus_per_node) / gpus_per_nic();
  }
  bool same_node(int rank_a, int rank_b) const { return node_of(rank_a) == node_of(rank_b); }
};

/// Throws InputError naming `source` and the field if the cluster is impossible
/// (no nodes, NICs not dividing the GPUs, non-positive bandwidth or memory, ...).
void validate_cluster(const Cluster& cluster, const std::string& source);

std::vector<std::string> cluster_preset_names();
/// Throws InputError listing the known presets when `name` is unknown.
Cluster cluster_preset(const std::string& name);
/// A preset name or a JSON file path; `nodes` overrides the node count.
Cluster load_cluster(const std::string& preset_or_file, std::optional<int> nodes = std::nullopt);

nlohmann::json to_json(const Cluster& cluster);
/// Every field is required except `provenance` and `intra_node_collectives`; throws InputError naming `source`.
Cluster cluster_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace ballast
