// Cluster: nodes x GPUs, their compute and memory, and the links between them.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "ballast/collectives.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// One measured or published point of an attention kernel's efficiency curve.
struct EfficiencyPoint {
  /// Equivalent causal document length L of the work: a block with P causal (query, key)
  /// pairs has L(L+1)/2 = P; for a whole document, its length.
  Tokens tokens = 0;
  /// Achieved / peak_flops_per_s, FLOPs counted as 4 * head_dim * heads * L(L+1)/2 per
  /// call (x2.5 for the backward pass), as FlashAttention's benchmarks count them.
  double efficiency = 0;
  std::string source;  ///< where the number comes from (paper, figure, file)

  bool operator==(const EfficiencyPoint&) const = default;
};

/// Where and how a cluster's constants were measured on a host (`ballast calibrate --host`,
/// the cluster `ballast run` plans on): what a calibration must match to be reused.
struct HostRecord {
  std::string host;        ///< the host name of rank 0
  std::string cpu;         ///< /proc/cpuinfo's model name
  std::string mpi;         ///< the MPI library (first line of MPI_Get_library_version)
  std::string model;       ///< the runtime model's shape the GEMMs and attention ran at
  int ranks = 0;           ///< MPI ranks of the job that measured it
  int blas_threads = 1;    ///< OpenBLAS threads per rank while measuring
  std::string measured_at;  ///< UTC date and time, ISO 8601
  bool operator==(const HostRecord&) const = default;
};

/// Tensor parallelism of a cluster whose ranks are TP groups (tensor_parallel.hpp's
/// tensor_parallel_units()): each rank stands for `gpus` GPUs of one node that split every
/// linear layer and the attention heads `gpus` ways (Megatron-LM with sequence
/// parallelism), and the GPU-level constants of the collectives those GPUs run among
/// themselves. JSON "tensor_parallel": {"gpus", "all_gather", "reduce_scatter"}, written
/// only when gpus > 1, so clusters and plans without TP keep their bytes.
struct TensorParallelism {
  int gpus = 1;  ///< GPUs per TP group (the TP degree); 1 = no tensor parallelism
  /// An all-gather / reduce-scatter on `gpus` GPUs of one node (nccl-tests size
  /// convention; collectives.hpp), from the GPU cluster's intra_node_collective_fit().
  CollectiveFit all_gather;
  CollectiveFit reduce_scatter;
  bool operator==(const TensorParallelism&) const = default;
};

/// A homogeneous GPU cluster. Ranks are numbered node-major: rank = node * gpus_per_node
/// + local index. Local GPU i uses NIC i / gpus_per_nic() of its node. With
/// tensor_parallel.gpus = N > 1 a rank is a TP group of N GPUs and every per-GPU field
/// below describes one TP group (gpus_per_node: TP groups per node; compute, memory and
/// NVLink bandwidth N times one GPU's; see tensor_parallel_units()).
struct Cluster {
  std::string name;
  std::string gpu_name;
  int nodes = 1;
  int gpus_per_node = 8;

  Bytes gpu_memory_bytes = 0;
  double peak_flops_per_s = 0;        ///< dense BF16 peak per GPU
  double matmul_efficiency = 0;       ///< achieved / peak for the linear layers (GEMMs)
  /// Achieved / peak for attention tiles, used for a pass whose curve below is empty
  /// (older cluster files): every tile at this one efficiency, forward and backward.
  double attention_efficiency = 0;
  Tokens attention_tile_tokens = 128; ///< attention kernels work in square tiles of this size
  /// How the attention kernel tiles: false, each block on its own (GPU varlen kernels,
  /// FlashAttention's tiles never span two sequences); true, the blocks of one attention
  /// call are laid out one after another and tiled together, so short documents share
  /// tiles, as ballast's CPU runtime kernel does (docs/cost-model.md, "Packed tiles").
  /// JSON "attention_tiles": "per_block" (default, not written) or "packed".
  bool attention_tiles_packed = false;
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

  /// Attention efficiency by equivalent causal length, one curve per pass (tokens strictly
  /// increasing); empty = the flat attention_efficiency. See docs/cost-model.md.
  std::vector<EfficiencyPoint> attention_forward_curve;
  std::vector<EfficiencyPoint> attention_backward_curve;
  /// Set on clusters measured on a host by `ballast calibrate --host` (JSON
  /// "measured_on"); a reader checks it before planning on the constants.
  std::optional<HostRecord> measured_on;
  /// gpus = 1 on a cluster of GPUs; see TensorParallelism.
  TensorParallelism tensor_parallel;

  int ranks() const { return nodes * gpus_per_node; }
  int node_of(int rank) const { return rank / gpus_per_node; }
  int gpus_per_nic() const { return gpus_per_node / nics_per_node; }
  /// Global NIC index (node * nics_per_node + local NIC) used by a rank.
  int nic_of(int rank) const {
    return node_of(rank) * nics_per_node + (rank % gpus_per_node) / gpus_per_nic();
  }
  bool same_node(int rank_a, int rank_b) const { return node_of(rank_a) == node_of(rank_b); }
  /// GPUs of the cluster: ranks() x the TP degree.
  int gpus() const { return ranks() * tensor_parallel.gpus; }
  /// Field by field (validate()'s fast path: a plan's cluster equal to the cost model's
  /// needs no comparison of their JSON).
  bool operator==(const Cluster&) const = default;
};

/// "<name> (<nodes> nodes x <GPUs per node> <gpu>, <GPUs> GPUs)", and with tensor
/// parallelism "..., <GPUs> GPUs in <ranks> TP groups of <N>)": GPUs, whatever a rank is.
std::string describe_cluster(const Cluster& cluster);

/// Efficiency of `curve` at equivalent causal length `tokens`: linear in log(tokens)
/// between neighbouring points, the end point's value outside the table. `curve` must be
/// non-empty with strictly increasing tokens (validate_cluster checks both).
double curve_efficiency(std::span<const EfficiencyPoint> curve, double tokens);

/// Throws InputError naming `source` and the field if the cluster is impossible
/// (no nodes, NICs not dividing the GPUs, non-positive bandwidth or memory, ...).
void validate_cluster(const Cluster& cluster, const std::string& source);

std::vector<std::string> cluster_preset_names();
/// Throws InputError listing the known presets when `name` is unknown.
Cluster cluster_preset(const std::string& name);
/// A preset name or a JSON file path; `nodes` overrides the node count. A file holding a
/// cluster of TP groups ("tensor_parallel", as plans embed it) is rejected: --cluster
/// names GPUs, --tp groups them (tensor_parallel_units()).
Cluster load_cluster(const std::string& preset_or_file, std::optional<int> nodes = std::nullopt);

nlohmann::json to_json(const Cluster& cluster);
/// Every field is required except `provenance`, `intra_node_collectives`,
/// `attention_efficiency_curve` ({"forward": [{"tokens", "efficiency", "source"}, ...],
/// "backward": [...]}, either pass optional), `measured_on` and `tensor_parallel`
/// ({"gpus": N, "all_gather": {"latency_s", "bus_bw_bytes_per_s"}, "reduce_scatter":
/// {...}}, absent: no TP); throws InputError naming `source`.
Cluster cluster_from_json(const nlohmann::json& json, const std::string& source);

}  // namespace ballast
