// CostModel: the time of every operation a plan can contain, and memory per rank.
// Two families behind one interface: analytical (roofline from Cluster + Model) and
// profiled (FlexSP's a1, a2, b1, bw[d] coefficients loaded from JSON).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/collectives.hpp"
#include "ballast/model.hpp"
#include "ballast/units.hpp"

namespace ballast {

enum class Pass { forward, backward };

/// How many times a micro-batch runs `pass`: the forward twice under full recomputation
/// (Model::forward_passes), the backward once. The planners' estimates weight each pass's
/// time by it; the simulator adds the rerun as tasks.
inline double pass_count(const Model& model, Pass pass) {
  return pass == Pass::forward ? model.forward_passes() : 1.0;
}

/// Attention backward FLOPs / forward FLOPs: 5 matrix products (with recomputation) against
/// 2 (SYSTEMS.md section 1; FlashAttention-2's benchmarks count 2.5x).
inline constexpr double kAttentionBackwardFactor = 2.5;
/// Attention FLOPs per causal (query, key) pair per head dimension: QK^T and PV, 2 FLOPs
/// per multiply-add.
inline constexpr double kAttentionFlopsPerPairPerHeadDim = 4.0;

/// Bytes of model states per parameter under ZeRO-3 with mixed-precision Adam: 2 (bf16
/// weights) + 2 (bf16 grads) + 12 (fp32 master weights, Adam m and v) = 16, sharded over
/// all ranks (Rajbhandari et al., "ZeRO", SC'20, section 3). The one constant behind
/// CostModel::model_state_bytes_per_rank() and the runtime's memory budget.
inline constexpr double kModelStateBytesPerParameter = 16.0;

/// Causal attention of query positions [q_begin, q_end) against key positions
/// [kv_begin, kv_end) of one document; a query attends to keys at positions <= its own.
struct AttentionBlock {
  Tokens q_begin = 0;
  Tokens q_end = 0;
  Tokens kv_begin = 0;
  Tokens kv_end = 0;
};

/// Number of (query, key) pairs the causal mask allows in a block.
Tokens causal_pairs(const AttentionBlock& block);
/// A whole causal document of `length` tokens as one block.
inline AttentionBlock whole_document(Tokens length) { return {0, length, 0, length}; }
/// The equivalent causal document length L of `pairs` causal pairs: L(L+1)/2 = pairs.
double equivalent_causal_length(double pairs);
/// Tiles of the block's q x kv grid (tile_tokens square, aligned to q_begin and kv_begin,
/// the last row and column possibly partial) holding at least one allowed pair: what a
/// kernel that tiles each block on its own computes. O(1).
Tokens causal_tiles(const AttentionBlock& block, Tokens tile_tokens);

/// Consecutive tokens of one document in a packed token span: positions [begin, end) of
/// document `document` (an id: only equality and order of ids matter).
struct DocumentRange {
  std::int64_t document = 0;
  Tokens begin = 0;
  Tokens end = 0;
};

/// One call of a packed attention kernel: its query tokens and its key tokens, each the
/// ranges laid out one after another in order. A query sees a key of the same document at
/// a position <= its own. How ballast's runtime lays out its calls: docs/cost-model.md,
/// "Packed tiles".
struct PackedAttentionCall {
  std::span<const DocumentRange> queries;
  std::span<const DocumentRange> keys;
};

/// The call as blocks of one document each: every query range against every key range of
/// its document, in query-range then key-range order, blocks without a causal pair dropped.
std::vector<AttentionBlock> document_blocks(const PackedAttentionCall& call);
/// Number of (query, key) pairs the causal mask allows in a call.
Tokens causal_pairs(const PackedAttentionCall& call);
/// The (query tile, key tile) pairs a packed kernel computes: both spans cut into tiles of
/// `tile_tokens` consecutive tokens from their start, and a pair computed unless the
/// tiles' document ranges [min, max] are disjoint or the key tile's smallest position is
/// above the query tile's largest (ballast's runtime kernel, masked tiles included;
/// runtime::attention_tile_pairs is the reference it is tested against). O(ranges + tiles
/// log tiles); O(1) for one range on each side.
Tokens packed_tile_pairs(const PackedAttentionCall& call, Tokens tile_tokens);

/// The analytical family's attention pricing, built once from a Cluster: a block costs its
/// causal tiles (cluster.attention_tile_tokens square) at the tile efficiency of its pass's
/// curve at the block's equivalent causal length. A curve point (L, e) becomes the tile
/// efficiency e * tiles(L) * T^2 / pairs(L), so that a whole document of L tokens takes
/// exactly the time the curve states; between points it is linear in log(L), clamped
/// outside. A pass without a curve prices every tile at cluster.attention_efficiency.
class AttentionTilePricing {
 public:
  explicit AttentionTilePricing(const Cluster& cluster);
  /// The block's work in causal pairs at the pass's best tile efficiency: tiles x T^2 x
  /// best / efficiency(L). Always >= causal_pairs(block). It depends on the block's
  /// lengths and its queries' offset from its keys only (tiles and pairs do not move
  /// with the block), and planners price the same shapes again and again (every ring
  /// step of a zigzag split, every document of every candidate plan): remembered per
  /// thread by shape (effective_pairs_computed() on a miss; a fixed table of the latest
  /// shapes, entries tagged with this pricing's id, which no other pricing ever gets).
  double effective_pairs(const AttentionBlock& block, Pass pass) const;
  /// effective_pairs() without the memo: one log, one square root off the diagonal, a
  /// scan of the points, no allocation. The reference the memo is tested against.
  double effective_pairs_computed(const AttentionBlock& block, Pass pass) const;
  /// A packed call's work: its `tiles` tiles at the efficiency its per-document `blocks`
  /// get on average per block (the blocks' effective pairs x tiles / their own tiles; a
  /// call tiled as its blocks are costs exactly their sum). Every efficiency is at most
  /// the best, so the result is >= tiles x T^2 >= the call's pairs.
  double effective_pairs(Tokens tiles, std::span<const AttentionBlock> blocks, Pass pass) const;
  /// The best tile efficiency of the pass (every block is priced at or below it).
  double best_tile_efficiency(Pass pass) const;
  /// The best tile efficiency of the pass at any equivalent causal length <= `length`: a
  /// block of a document of at most `length` tokens is priced at or below it.
  double best_tile_efficiency_up_to(double length, Pass pass) const;

 private:
  /// One pass's curve in the form the fast path reads.
  struct Table {
    std::vector<double> tokens;            ///< L of each point
    std::vector<double> log_tokens;        ///< log(L) of each point
    std::vector<double> inverse_log_step;  ///< 1 / (log L[i+1] - log L[i])
    std::vector<double> tile_efficiency;   ///< each point's efficiency on tile work
    double best = 0;                       ///< the largest tile efficiency (flat: the constant)
  };
  static Table make_table(const std::vector<EfficiencyPoint>& curve, double flat_efficiency,
                          Tokens tile_tokens);
  /// The curve's tile efficiency at equivalent causal length `length` (a non-empty curve).
  static double tile_efficiency(const Table& curve, double length);
  const Table& table(Pass pass) const { return pass == Pass::forward ? forward_ : backward_; }

  Tokens tile_tokens_;
  Table forward_;
  Table backward_;
  /// Tags this pricing's entries in the threads' memos (effective_pairs): unique per
  /// constructed pricing (a copy has the same tables and keeps it).
  std::uint64_t memo_id_;
};

/// Every operation's time is for the whole model: an op that happens once per layer
/// (attention, a ring transfer, an all-to-all) is charged for all `layers` layers.
/// Exceptions, charged once: micro_batch_overhead_s (per rank per micro-batch) and
/// gradient_sync_time_s (per step).
class CostModel {
 public:
  CostModel(Cluster cluster, Model model);
  virtual ~CostModel() = default;

  /// "analytical" or the profiled preset's name.
  virtual std::string name() const = 0;
  /// JSON that make_cost_model() turns back into an equal cost model.
  virtual nlohmann::json spec() const = 0;

  const Cluster& cluster() const { return cluster_; }
  const Model& model() const { return model_; }
  /// Distinct for every cost model this process constructs (a copy keeps its original's:
  /// it prices the same, and a cost model never changes once built): what caches of its
  /// prices that outlive a call key on (the simulator's ring and USP step times).
  std::uint64_t instance_id() const { return instance_id_; }

  // ---- compute ----
  /// Attention over `blocks` on one rank with the heads split `head_split` ways
  /// (the Ulysses degree; 1 = all heads on this rank).
  virtual Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                                   Pass pass) const = 0;
  /// One call of a packed attention kernel as ballast's runtime makes it (a rank's tokens
  /// of a group against one member's; the simulator calls it when
  /// cluster().attention_tiles_packed), heads split `head_split` ways. This default prices
  /// the call's per-document blocks (each query range against each key range of its
  /// document sharing a causal pair, in query then key order) with attention_time_s; the
  /// analytical family on a packed cluster counts the kernel's tiles instead.
  virtual Seconds attention_call_time_s(const PackedAttentionCall& call, int head_split,
                                        Pass pass) const;
  /// A floor no block shape beats: `pairs` causal pairs at the best efficiency, all
  /// heads. attention_time_s(blocks, d, p) * d >= attention_pair_floor_s(sum pairs, p),
  /// and likewise for attention_call_time_s and the call's pairs.
  virtual Seconds attention_pair_floor_s(double pairs, Pass pass) const = 0;
  /// A floor no scheme beats for ONE document of `length` tokens padded to at most
  /// `padded_length` (>= length): the sum over any blocks that cover its causal triangle
  /// of attention_time_s(blocks, d, pass) * d is >= this. Default (and on a packed cluster,
  /// where a document sharing a kernel call with a longer one may run at that one's
  /// efficiency): attention_pair_floor_s(causal pairs of `length`). The analytical family
  /// on an unpacked cluster prices the pairs at the best tile efficiency of lengths up to
  /// `padded_length` (every block of the document is at most that long), so short
  /// documents, which FlashAttention runs far below its peak, count at their own curve.
  virtual Seconds attention_document_floor_s(Tokens length, Tokens padded_length, Pass pass) const;
  /// QKV/O projections and MLP over `tokens` tokens; exactly proportional to tokens.
  virtual Seconds linear_time_s(Tokens tokens, Pass pass) const = 0;
  /// Fixed cost per rank per micro-batch (FlexSP's b1); 0 in the analytical family.
  virtual Seconds micro_batch_overhead_s(Pass pass) const;

  // ---- communication (one op per layer, charged for all layers) ----
  /// One point-to-point transfer of `bytes_per_layer` bytes (alpha-beta over the link
  /// between the two ranks: NVLink inside a node, the ranks' NICs across nodes).
  virtual Seconds p2p_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank) const;
  /// The part of p2p_time_s that occupies no link (per-message latency, all layers): the
  /// simulator shares only the rest of a transfer with concurrent transfers on its links.
  virtual Seconds p2p_latency_s(int src_rank, int dst_rank) const;
  /// All-to-all inside `ranks`: rank ranks[i] holds bytes_per_rank[i] and sends an equal
  /// share to every member. Across nodes each GPU uses its own NIC (NICs cannot be
  /// aggregated) and GPUs sharing a NIC share its bandwidth.
  virtual Seconds all_to_all_time_s(std::span<const int> ranks,
                                    std::span<const Bytes> bytes_per_rank) const;
  /// All-gather inside `ranks` of bytes_per_rank[i] from each member (ring algorithm).
  virtual Seconds all_gather_time_s(std::span<const int> ranks,
                                    std::span<const Bytes> bytes_per_rank) const;
  /// ONE `op` on `gpus` GPUs of one node moving `bytes` in nccl-tests' size convention,
  /// NOT multiplied by the layers: intra_node_collective_time_s(cluster(), op, gpus, bytes)
  /// without its table lookup (the constants are cached at construction).
  Seconds collective_time_s(CollectiveOp op, int gpus, Bytes bytes) const;
  /// The tensor-parallel collectives of one micro-batch, forward and backward, on a rank
  /// (a TP group, cluster().tensor_parallel.gpus = N GPUs) whose linear modules run
  /// `tokens` tokens: Megatron-LM with sequence parallelism runs per layer 2 all-gathers
  /// and 2 reduce-scatters of the tokens x hidden activations in the forward pass and as
  /// many in the backward pass (the forward's twice under full recomputation, which reruns
  /// them), each collective_time_s on N GPUs at the GPU-level constants of
  /// cluster().tensor_parallel; charged for all layers. 0 without TP or tokens.
  Seconds tensor_parallel_time_s(Tokens tokens) const;
  /// ONE of those collectives (all_gather or reduce_scatter) per layer, all layers.
  Seconds tensor_parallel_collective_time_s(CollectiveOp op, Tokens tokens) const;
  /// The part of tensor_parallel_time_s that does not grow with the tokens (the
  /// collectives' latencies, all layers): tensor_parallel_time_s(n) - this is linear in n.
  Seconds tensor_parallel_latency_s() const;
  /// The expert-parallel all-to-alls of one micro-batch on a rank whose linear modules run
  /// `tokens` tokens of an MoE model (0 for a dense one or expert_parallel 1): per layer a
  /// dispatch and a combine in the forward pass and as many in the backward pass (the
  /// forward's twice under full recomputation), each expert_parallel_all_to_all_time_s.
  Seconds expert_parallel_time_s(Tokens tokens) const;
  /// ONE of those all-to-alls per layer, all layers: all_to_all_time_s on the rank's
  /// expert-parallel group (model().expert_parallel consecutive ranks) with every member
  /// holding tokens x experts_per_token hidden vectors (each token goes to its top-k
  /// experts, spread evenly over the group; the share for itself stays). Its latency and
  /// bandwidth are computed once, at construction. 0 without tokens.
  Seconds expert_parallel_all_to_all_time_s(Tokens tokens) const;
  /// The part of expert_parallel_time_s that does not grow with the tokens.
  Seconds expert_parallel_latency_s() const;
  /// The collectives of a rank's linear modules in one micro-batch: tensor_parallel_time_s
  /// + expert_parallel_time_s. What the planners' estimates and the lower bound charge.
  Seconds linear_collectives_time_s(Tokens tokens) const;
  /// tensor_parallel_latency_s + expert_parallel_latency_s.
  Seconds linear_collectives_latency_s() const;
  /// The time the routed experts of micro-batch `micro_batch` take, on a rank with `tokens`
  /// linear tokens, beyond linear_time_s (which prices balanced routing): the experts'
  /// share of linear_time_s x (model().expert_load_factor(micro_batch) - 1). >= 0; 0 for a
  /// dense model. The simulator adds it; planners cannot know the routing in advance.
  Seconds expert_imbalance_time_s(Tokens tokens, Pass pass, std::int64_t micro_batch) const;
  /// Data-parallel gradient synchronisation over all ranks, once per step: the gradients
  /// of model().gradient_sync_parameters() (an MoE model's routed experts are reduced
  /// only among the ranks holding the same experts).
  virtual Seconds gradient_sync_time_s() const;
  /// One of `buckets` equal buckets of that synchronisation (1/buckets of the bytes, the
  /// whole latency): what the simulator overlaps with the backward pass.
  virtual Seconds gradient_bucket_sync_time_s(int buckets) const;

  // ---- memory ----
  /// Model states (weights, gradients, optimizer) per rank: ZeRO-3 shards them over all
  /// ranks. With expert parallelism the same bytes: a rank holds experts / EP experts,
  /// sharded over the N / EP ranks holding the same ones.
  virtual Bytes model_state_bytes_per_rank() const;
  virtual Bytes activation_bytes_per_token() const;
  virtual Bytes memory_limit_bytes() const;
  /// floor((memory_limit - model_states) / activation_bytes_per_token); throws
  /// InputError naming cluster and model when not even one token fits.
  Tokens token_capacity_per_rank() const;

 protected:
  /// intra_node_collective_fit(cluster_, op, gpus) from the cache below.
  CollectiveFit intra_node_fit(CollectiveOp op, int gpus) const;

  Cluster cluster_;
  Model model_;
  /// One expert-parallel all-to-all, all layers: latency and seconds per byte a member holds.
  Seconds expert_all_to_all_latency_s_ = 0;
  double expert_all_to_all_s_per_byte_ = 0;

 private:
  /// cluster_.intra_node_collectives indexed by op: no map lookup on the planners' hot path.
  std::array<std::vector<CollectiveFit>, kCollectiveOpCount> collective_fits_;
  std::uint64_t instance_id_;
};

/// Roofline: FLOPs / (peak * efficiency), attention quantised to square tiles of
/// cluster.attention_tile_tokens (a 16-token document costs one 128x128 tile) and priced
/// at the efficiency of its pass's curve (AttentionTilePricing), links alpha-beta. On a
/// cluster with attention_tiles_packed, an attention call costs the tiles of its packed
/// spans (packed_tile_pairs): attention_time_s lays the blocks out one after another,
/// each block its own document (queries in block order, keys in block order).
class AnalyticalCostModel final : public CostModel {
 public:
  AnalyticalCostModel(Cluster cluster, Model model);
  std::string name() const override { return "analytical"; }
  nlohmann::json spec() const override;
  Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                           Pass pass) const override;
  Seconds attention_call_time_s(const PackedAttentionCall& call, int head_split,
                                Pass pass) const override;
  Seconds attention_pair_floor_s(double pairs, Pass pass) const override;
  Seconds attention_document_floor_s(Tokens length, Tokens padded_length, Pass pass) const override;
  Seconds linear_time_s(Tokens tokens, Pass pass) const override;

 private:
  AttentionTilePricing attention_pricing_;
};

/// FlexSP's profiled form: per sequence (a1*s^2 + a2*s)/d + b1 per group, all-to-all at
/// bw[d]; coefficients are whole-model forward+backward in ms and are split 1:2
/// between the passes. Point-to-point and all-gather fall back to the cluster's links.
struct ProfiledCoefficients {
  std::string name;        ///< preset name, e.g. "flexsp-a100"
  std::string model_name;  ///< the model these coefficients were profiled for
  double a1_ms_per_token2 = 0;
  double a2_ms_per_token = 0;
  double b1_ms = 0;
  double activation_mib_per_token = 0;
  double parameters_gi = 0;  ///< parameters in units of 2^30 numel (FlexSP's table)
  double memory_limit_gib = 0;
  std::vector<std::pair<int, double>> all_to_all_gb_per_s;  ///< (degree d, bw[d] GB/s)
  std::string provenance;
};

class ProfiledCostModel final : public CostModel {
 public:
  ProfiledCostModel(Cluster cluster, Model model, ProfiledCoefficients coefficients);
  std::string name() const override { return coefficients_.name; }
  nlohmann::json spec() const override;
  Seconds attention_time_s(std::span<const AttentionBlock> blocks, int head_split,
                           Pass pass) const override;
  Seconds attention_pair_floor_s(double pairs, Pass pass) const override;
  Seconds linear_time_s(Tokens tokens, Pass pass) const override;
  Seconds micro_batch_overhead_s(Pass pass) const override;
  Seconds all_to_all_time_s(std::span<const int> ranks,
                            std::span<const Bytes> bytes_per_rank) const override;
  Seconds gradient_sync_time_s() const override;
  Seconds gradient_bucket_sync_time_s(int buckets) const override;
  Bytes model_state_bytes_per_rank() const override;
  Bytes activation_bytes_per_token() const override;
  Bytes memory_limit_bytes() const override;
  const ProfiledCoefficients& coefficients() const { return coefficients_; }

 private:
  ProfiledCoefficients coefficients_;
};

/// A byte count computed in floating point, as Bytes: truncated towards zero and clamped
/// to [0, the largest int64] (NaN gives the largest). A valid but absurd model or cluster
/// (1e300 parameters) then fails the memory checks instead of overflowing the conversion.
Bytes saturating_bytes(double bytes);

/// "analytical", a profiled preset ("flexsp-a100-192k", "flexsp-a100-384k": one
/// coefficient set per GPT model, chosen by the model's name), or a JSON file path.
/// Returns the spec JSON; throws InputError listing the known names.
nlohmann::json load_cost_model_spec(const std::string& name_or_file);
std::vector<std::string> cost_model_names();
/// One line for `ballast list cost-models`: what the named cost model is and where it
/// applies; throws InputError for a name not in cost_model_names().
std::string cost_model_description(const std::string& name);
/// Builds a cost model from a spec; throws InputError if the spec is malformed (an unknown
/// key included), a profiled spec was made for another model, or a profiled spec meets a
/// cluster of TP groups (its coefficients were measured without TP; the message names --tp).
std::unique_ptr<CostModel> make_cost_model(const nlohmann::json& spec, const Cluster& cluster,
                                           const Model& model);
/// Throws InputError "<source>: unknown key ..." (json_file.hpp's reject_unknown_keys) when
/// `spec`, or an object inside a profiled spec ("<source>: models[1]: ..."), holds a member
/// its family does not define; a spec without "family" is checked against the profiled
/// keys, so "famliy" gets its suggestion. Anything else (not an object, a family ballast
/// does not know, wrong types) is left to make_cost_model(). load_cost_model_spec and
/// make_cost_model call it; plan_from_json checks a plan's cost_model with it.
void reject_unknown_cost_model_keys(const nlohmann::json& spec, const std::string& source);

}  // namespace ballast
