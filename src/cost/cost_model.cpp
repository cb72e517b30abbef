// CostModel base: causal pair counting, the alpha-beta link model shared by both
// families (point-to-point, all-to-all, all-gather, gradient sync) and memory per rank.
#include "ballast/cost_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ballast/error.hpp"

namespace ballast {

namespace {

/// Sum of the integers first..last (inclusive); 0 when last < first.
Tokens arithmetic_sum(Tokens first, Tokens last) {
  if (last < first) return 0;
  return (first + last) * (last - first + 1) / 2;
}

}  // namespace

Bytes saturating_bytes(double bytes) {
  // 2^63 is exact as a double; every double below it converts to int64 without overflow.
  constexpr double kTwoTo63 = 9223372036854775808.0;
  if (!(bytes < kTwoTo63)) return std::numeric_limits<Bytes>::max();  // also NaN
  if (!(bytes > 0)) return 0;
  return static_cast<Bytes>(bytes);
}

Tokens causal_pairs(const AttentionBlock& block) {
  // Query q sees keys k in [kv_begin, kv_end) with k <= q: min(q - kv_begin + 1, kv size)
  // clamped at 0. Split the query range where that count grows and where it saturates.
  const Tokens kv_size = block.kv_end - block.kv_begin;
  if (kv_size <= 0 || block.q_end <= block.q_begin) return 0;
  const Tokens growing_begin = std::max(block.q_begin, block.kv_begin);
  const Tokens growing_end = std::min(block.q_end, block.kv_end);  // exclusive
  Tokens pairs = 0;
  if (growing_end > growing_begin) {
    pairs += arithmetic_sum(growing_begin - block.kv_begin + 1, growing_end - block.kv_begin);
  }
  const Tokens saturated_begin = std::max(block.q_begin, block.kv_end);
  if (block.q_end > saturated_begin) pairs += (block.q_end - saturated_begin) * kv_size;
  return pairs;
}

namespace {
std::atomic<std::uint64_t> next_cost_model_id{1};
}  // namespace

CostModel::CostModel(Cluster cluster, Model model)
    : cluster_(std::move(cluster)),
      model_(std::move(model)),
      instance_id_(next_cost_model_id.fetch_add(1, std::memory_order_relaxed)) {
  for (const auto& [op, fits] : cluster_.intra_node_collectives) {
    collective_fits_[static_cast<std::size_t>(op)] = fits;
  }
  if (model_.is_moe() && model_.expert_parallel > 1) {
    const int group = model_.expert_parallel;
    if (cluster_.ranks() % group != 0) {
      throw InputError(fmt::format(
          "model '{}': expert_parallel {} does not divide the {} ranks of cluster '{}'; "
          "choose an expert-parallel degree that divides the ranks (or change {})",
          model_.name, group, cluster_.ranks(), cluster_.name, setting_name("--nodes")));
    }
    // The base class's link model (a profiled family's all-to-all is Ulysses' bw[d]).
    std::vector<int> members(static_cast<std::size_t>(group));
    for (int i = 0; i < group; ++i) members[static_cast<std::size_t>(i)] = i;
    constexpr Bytes kProbeBytes = Bytes{1} << 30;  // any size: the time is linear in it
    const std::vector<Bytes> none(members.size(), 0);
    const std::vector<Bytes> probe(members.size(), kProbeBytes);
    expert_all_to_all_latency_s_ = CostModel::all_to_all_time_s(members, none);
    expert_all_to_all_s_per_byte_ =
        (CostModel::all_to_all_time_s(members, probe) - expert_all_to_all_latency_s_) /
        static_cast<double>(kProbeBytes);
  }
}

Seconds CostModel::attention_call_time_s(const PackedAttentionCall& call, int head_split,
                                         Pass pass) const {
  const std::vector<AttentionBlock> blocks = document_blocks(call);
  return blocks.empty() ? 0.0 : attention_time_s(blocks, head_split, pass);
}

CollectiveFit CostModel::intra_node_fit(CollectiveOp op, int gpus) const {
  const std::vector<CollectiveFit>& fits = collective_fits_[static_cast<std::size_t>(op)];
  if (!fits.empty()) return interpolate_collective_fit(fits, gpus);
  return alpha_beta_collective_fit(cluster_, op, gpus);
}

Seconds CostModel::collective_time_s(CollectiveOp op, int gpus, Bytes bytes) const {
  if (gpus <= 1 || bytes <= 0) return 0.0;
  const CollectiveFit fit = intra_node_fit(op, gpus);
  return fit.latency_s +
         static_cast<double>(bytes) * bus_bandwidth_factor(op, gpus) / fit.bus_bw_bytes_per_s;
}

Seconds CostModel::attention_document_floor_s(Tokens length, Tokens /*padded_length*/, Pass pass) const {
  return attention_pair_floor_s(static_cast<double>(causal_pairs(whole_document(length))), pass);
}

Seconds CostModel::micro_batch_overhead_s(Pass /*pass*/) const { return 0.0; }

namespace {

/// All-gathers (and as many reduce-scatters) per layer and pass in Megatron-LM's sequence
/// parallelism (Korthikanti et al. 2022, section 4.2.2): one of each around the attention
/// block and around the MLP (the backward pass swaps them).
constexpr int kTensorParallelCollectivesPerLayerAndPass = 2;

/// Passes of a micro-batch: forward (twice under full recomputation, which reruns the
/// forward's collectives too) and backward.
double micro_batch_passes(const Model& model) {
  return pass_count(model, Pass::forward) + pass_count(model, Pass::backward);
}

}  // namespace

Seconds CostModel::tensor_parallel_collective_time_s(CollectiveOp op, Tokens tokens) const {
  const TensorParallelism& tp = cluster_.tensor_parallel;
  if (tp.gpus <= 1 || tokens <= 0) return 0.0;
  BALLAST_CHECK(op == CollectiveOp::all_gather || op == CollectiveOp::reduce_scatter,
                "tensor parallelism runs all-gathers and reduce-scatters");
  const CollectiveFit& fit = op == CollectiveOp::all_gather ? tp.all_gather : tp.reduce_scatter;
  // nccl-tests' size of both: the tokens x hidden buffer (all-gather's output,
  // reduce-scatter's input).
  const Bytes bytes = saturating_multiply(tokens, model_.hidden_bytes_per_token());
  return model_.layers * (fit.latency_s + static_cast<double>(bytes) *
                                              bus_bandwidth_factor(op, tp.gpus) /
                                              fit.bus_bw_bytes_per_s);
}

Seconds CostModel::tensor_parallel_time_s(Tokens tokens) const {
  return micro_batch_passes(model_) * kTensorParallelCollectivesPerLayerAndPass *
         (tensor_parallel_collective_time_s(CollectiveOp::all_gather, tokens) +
          tensor_parallel_collective_time_s(CollectiveOp::reduce_scatter, tokens));
}

Seconds CostModel::tensor_parallel_latency_s() const {
  const TensorParallelism& tp = cluster_.tensor_parallel;
  if (tp.gpus <= 1) return 0.0;
  return micro_batch_passes(model_) * kTensorParallelCollectivesPerLayerAndPass * model_.layers *
         (tp.all_gather.latency_s + tp.reduce_scatter.latency_s);
}

Seconds CostModel::expert_parallel_all_to_all_time_s(Tokens tokens) const {
  if (tokens <= 0 || expert_all_to_all_latency_s_ <= 0) return 0.0;
  const double bytes = static_cast<double>(tokens) * model_.experts_per_token *
                       static_cast<double>(model_.hidden_bytes_per_token());
  return expert_all_to_all_latency_s_ + bytes * expert_all_to_all_s_per_byte_;
}

namespace {

/// All-to-alls per MoE layer and pass: dispatch (tokens to their experts) and combine
/// (expert outputs back); the backward pass sends the gradients the same two ways.
constexpr int kExpertAllToAllsPerLayerAndPass = 2;

}  // namespace

Seconds CostModel::expert_parallel_time_s(Tokens tokens) const {
  return micro_batch_passes(model_) * kExpertAllToAllsPerLayerAndPass *
         expert_parallel_all_to_all_time_s(tokens);
}

Seconds CostModel::expert_parallel_latency_s() const {
  return micro_batch_passes(model_) * kExpertAllToAllsPerLayerAndPass *
         expert_all_to_all_latency_s_;
}

Seconds CostModel::linear_collectives_time_s(Tokens tokens) const {
  return tensor_parallel_time_s(tokens) + expert_parallel_time_s(tokens);
}

Seconds CostModel::linear_collectives_latency_s() const {
  return tensor_parallel_latency_s() + expert_parallel_latency_s();
}

Seconds CostModel::expert_imbalance_time_s(Tokens tokens, Pass pass, std::int64_t micro_batch) const {
  if (!model_.is_moe() || tokens <= 0) return 0.0;
  const double excess = model_.expert_load_factor(micro_batch) - 1.0;
  if (!(excess > 0)) return 0.0;
  const double expert_share = model_.expert_flops_per_token() / model_.linear_flops_per_token();
  return linear_time_s(tokens, pass) * expert_share * excess;
}

Seconds CostModel::p2p_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank) const {
  if (src_rank == dst_rank || bytes_per_layer <= 0) return 0.0;
  const bool intra = cluster_.same_node(src_rank, dst_rank);
  const double latency_s = intra ? cluster_.intra_node_latency_s : cluster_.inter_node_latency_s;
  const double bw = intra ? cluster_.intra_node_p2p_bw_bytes_per_s : cluster_.nic_bw_bytes_per_s;
  return model_.layers * (latency_s + static_cast<double>(bytes_per_layer) / bw);
}

Seconds CostModel::p2p_latency_s(int src_rank, int dst_rank) const {
  if (src_rank == dst_rank) return 0.0;
  return model_.layers * (cluster_.same_node(src_rank, dst_rank) ? cluster_.intra_node_latency_s
                                                                 : cluster_.inter_node_latency_s);
}

Seconds CostModel::all_to_all_time_s(std::span<const int> ranks,
                                     std::span<const Bytes> bytes_per_rank) const {
  BALLAST_CHECK(ranks.size() == bytes_per_rank.size(), "one byte count per rank");
  const auto group_size = static_cast<double>(ranks.size());
  if (ranks.size() <= 1) return 0.0;
  // Per node its members, per NIC its bytes: small sorted vectors (a group spans few
  // nodes; a std::map allocated a node per entry, and the simulator prices two
  // all-to-alls per Ulysses group and pass). Each NIC's bytes are summed in rank order.
  const auto slot = [](auto& entries, int key, auto zero) -> auto& {
    auto it = std::lower_bound(entries.begin(), entries.end(), key,
                               [](const auto& entry, int k) { return entry.first < k; });
    if (it == entries.end() || it->first != key) it = entries.insert(it, {key, zero});
    return it->second;
  };
  std::vector<std::pair<int, int>> members_per_node;
  for (int rank : ranks) ++slot(members_per_node, cluster_.node_of(rank), 0);
  // Each member sends bytes/d to every member; the part for other nodes leaves through
  // its own NIC (NICs are not aggregated), shared with the GPUs mapped to that NIC.
  double max_intra_bytes = 0;
  std::vector<std::pair<int, double>> nic_bytes;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const double share = static_cast<double>(bytes_per_rank[i]) / group_size;
    const int same_node_peers = slot(members_per_node, cluster_.node_of(ranks[i]), 0) - 1;
    const double remote_peers = group_size - 1 - same_node_peers;
    max_intra_bytes = std::max(max_intra_bytes, share * same_node_peers);
    slot(nic_bytes, cluster_.nic_of(ranks[i]), 0.0) += share * remote_peers;
  }
  double max_nic_bytes = 0;
  for (const auto& [nic, bytes] : nic_bytes) max_nic_bytes = std::max(max_nic_bytes, bytes);
  int max_members = 0;
  for (const auto& [node, members] : members_per_node) max_members = std::max(max_members, members);
  // The NVLink part: the node-local all-to-all's constants (calibrated per GPU count, or
  // alpha-beta); across nodes its latency gives way to the inter-node one.
  const CollectiveFit nvlink = intra_node_fit(CollectiveOp::all_to_all, std::max(2, max_members));
  const bool spans_nodes = members_per_node.size() > 1;
  const double latency_s = spans_nodes ? cluster_.inter_node_latency_s : nvlink.latency_s;
  const double transfer_s = std::max(max_intra_bytes / nvlink.bus_bw_bytes_per_s,
                                     max_nic_bytes / cluster_.nic_bw_bytes_per_s);
  return model_.layers * (latency_s + transfer_s);
}

Seconds CostModel::all_gather_time_s(std::span<const int> ranks,
                                     std::span<const Bytes> bytes_per_rank) const {
  BALLAST_CHECK(ranks.size() == bytes_per_rank.size(), "one byte count per rank");
  if (ranks.size() <= 1) return 0.0;
  struct NodeShare {
    double bytes = 0;
    int members = 0;
    std::set<int> nics;
  };
  double total_bytes = 0;
  double min_own_bytes = INFINITY;
  std::map<int, NodeShare> nodes;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const auto bytes = static_cast<double>(bytes_per_rank[i]);
    total_bytes += bytes;
    min_own_bytes = std::min(min_own_bytes, bytes);
    NodeShare& node = nodes[cluster_.node_of(ranks[i])];
    node.bytes += bytes;
    ++node.members;
    node.nics.insert(cluster_.nic_of(ranks[i]));
  }
  // Ring all-gather: every member receives everything it does not hold. Inside one node:
  // the calibrated (or alpha-beta) constants of an all-gather on this many GPUs.
  const int group_size = static_cast<int>(ranks.size());
  if (nodes.size() == 1) {
    const CollectiveFit nvlink = intra_node_fit(CollectiveOp::all_gather, group_size);
    return model_.layers *
           (nvlink.latency_s + (total_bytes - min_own_bytes) / nvlink.bus_bw_bytes_per_s);
  }
  // Across nodes: each node receives the other nodes' bytes through the NICs its members
  // use; the NVLink part at the bandwidth of an all-gather on the largest node's members;
  // one inter-node latency per ring step.
  int largest_node_members = 2;
  for (const auto& [id, node] : nodes) largest_node_members = std::max(largest_node_members, node.members);
  const CollectiveFit nvlink = intra_node_fit(CollectiveOp::all_gather, largest_node_members);
  double transfer_s = (total_bytes - min_own_bytes) / nvlink.bus_bw_bytes_per_s;
  for (const auto& [id, node] : nodes) {
    const double nics = static_cast<double>(node.nics.size());
    transfer_s = std::max(transfer_s, (total_bytes - node.bytes) / (nics * cluster_.nic_bw_bytes_per_s));
  }
  const double steps = static_cast<double>(group_size - 1);
  return model_.layers * (steps * cluster_.inter_node_latency_s + transfer_s);
}

Seconds CostModel::gradient_sync_time_s() const { return gradient_bucket_sync_time_s(1); }

Seconds CostModel::gradient_bucket_sync_time_s(int buckets) const {
  // All-reduce of bf16 gradients (ZeRO-3: reduce-scatter + all-gather, same volume):
  // 2 (N-1)/N of the gradient bytes per rank, a 1/buckets share of them per bucket.
  BALLAST_CHECK(buckets >= 1, "at least one gradient bucket");
  const int ranks = cluster_.ranks();
  if (ranks <= 1) return 0.0;
  const double gradient_bytes = model_.gradient_sync_parameters() * model_.bytes_per_element / buckets;
  // One node with measured all_reduce constants (nccl-tests fits): NCCL's own all_reduce.
  if (cluster_.nodes == 1 && cluster_.intra_node_collectives.count(CollectiveOp::all_reduce) > 0) {
    return collective_time_s(CollectiveOp::all_reduce, ranks, saturating_bytes(gradient_bytes));
  }
  return all_reduce_link_time_s(cluster_, gradient_bytes);
}

Bytes CostModel::model_state_bytes_per_rank() const {
  return saturating_bytes(
      std::ceil(model_.parameters * kModelStateBytesPerParameter / cluster_.ranks()));
}

Bytes CostModel::activation_bytes_per_token() const {
  return saturating_bytes(std::ceil(model_.stored_activation_bytes_per_token()));
}

Bytes CostModel::memory_limit_bytes() const {
  return saturating_bytes(static_cast<double>(cluster_.gpu_memory_bytes) *
                          cluster_.memory_usable_fraction);
}

Tokens CostModel::token_capacity_per_rank() const {
  const Bytes free_bytes = memory_limit_bytes() - model_state_bytes_per_rank();
  const Bytes per_token = activation_bytes_per_token();
  BALLAST_CHECK(per_token > 0, "activation bytes per token must be positive");
  if (free_bytes < per_token) {
    throw InputError(fmt::format(
        "model '{}' does not fit on cluster '{}': model states take {:.1f} GiB per GPU of a "
        "{:.1f} GiB limit, leaving no room for activations; use more nodes ({}) or a "
        "cluster with more memory",
        model_.name, cluster_.name, model_state_bytes_per_rank() / kGiB,
        memory_limit_bytes() / kGiB, setting_name("--nodes")));
  }
  return free_bytes / per_token;
}

}  // namespace ballast
