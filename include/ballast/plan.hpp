// Plan: the IR every other part reads. For each micro-batch, a set of attention groups;
// each group has ranks, a scheme and the chunks of its sequences. Serialised as
// versioned JSON; validate() checks the invariants listed in docs/plan-format.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/model.hpp"
#include "ballast/units.hpp"

namespace ballast {

inline constexpr int kPlanFormatVersion = 1;

/// Upper limit of AttentionGroup::routing_chunks: every chunk pays the link latency on
/// each of its three hops, so beyond this many chunks per-chunk latency dominates and
/// finer pipelining only slows a transfer down.
inline constexpr int kMaxRoutingChunks = 64;

/// How a group computes attention for its sequences.
enum class Scheme {
  local,       ///< one rank, whole documents, no communication (varlen attention)
  ring,        ///< ring attention over the group's ranks in order; KV blocks passed around
  all_gather,  ///< KV all-gathered over the group, then local attention on own queries
  ulysses,     ///< all-to-all from sequence to head sharding; heads split group-size ways
  /// Ulysses inside stages x ring across them (USP, Fang & Zhao 2024, arXiv 2405.07719):
  /// the ranks are r stages of AttentionGroup::ulysses_degree (u) consecutive ranks; each
  /// stage runs a Ulysses all-to-all (heads split u ways), member m of every stage runs ring
  /// attention over the stages' tokens for its heads, then the all-to-all back. 2 <= u and
  /// r >= 2 (u = 1 is a ring, r = 1 Ulysses: those plans are spelt with those schemes).
  usp,
};
std::string to_string(Scheme scheme);
Scheme parse_scheme(const std::string& text);  ///< throws InputError

/// Tokens [begin_tokens, end_tokens) of a sequence held by `rank` during attention.
struct Chunk {
  int rank = 0;
  Tokens begin_tokens = 0;
  Tokens end_tokens = 0;
  Tokens size() const { return end_tokens - begin_tokens; }
  bool operator==(const Chunk&) const = default;
};

/// The largest multiple a plan may pad a sequence's length to in a ulysses or local group:
/// 1,024 tokens. Data pipelines pad each length to a small multiple (FlexSP's runs to 128,
/// SYSTEMS.md section 2; Megatron's THD packing to 2 x CP x TP, 1,024 at CP 64 x TP 8);
/// a larger padding is a broken plan, not a convention.
inline constexpr Tokens kMaxPadMultipleTokens = 1024;

/// A sequence's place in one group. Chunks cover [0, padded_length_tokens) exactly
/// once; padded_length_tokens >= the sequence's length (padding is only allowed where
/// a convention needs it: static CP pads to a multiple of 2 * ring size in ring and
/// all_gather groups; ulysses and local groups may pad by less than kMaxPadMultipleTokens,
/// as static-ulysses:pad=N does).
struct SequenceChunks {
  std::int64_t sequence_id = 0;
  Tokens padded_length_tokens = 0;
  std::vector<Chunk> chunks;
  bool operator==(const SequenceChunks&) const = default;
};

struct AttentionGroup {
  Scheme scheme = Scheme::local;
  std::vector<int> ranks;  ///< ring order for Scheme::ring
  std::vector<SequenceChunks> sequences;
  /// Inter-node ring transfers of this group are split over this many proxy GPUs per node
  /// (Zeppelin's routing layer, plan_layout.hpp's routing_parts()); 1 = each transfer goes
  /// through the sender's own NIC. Every proxy must be a member of the group.
  int routing_proxies = 1;
  /// Each routed part of an inter-node transfer is pipelined in this many chunks so
  /// dispatch, NIC transfer and combine overlap; 1 = one piece per part.
  int routing_chunks = 1;
  /// Scheme::usp: ranks per stage (u, the Ulysses degree inside a stage); the group has
  /// ranks / u stages. 1 for every other scheme (and omitted from the JSON).
  int ulysses_degree = 1;
  bool operator==(const AttentionGroup&) const = default;
};

/// Tokens of a sequence held by a rank during the linear modules (Zeppelin's remap).
struct LinearSlice {
  int rank = 0;
  std::int64_t sequence_id = 0;
  Tokens begin_tokens = 0;
  Tokens end_tokens = 0;
  bool operator==(const LinearSlice&) const = default;
};

struct MicroBatch {
  std::vector<AttentionGroup> groups;
  /// queues[r] = indices into `groups` in the order rank r runs them. Empty: every rank
  /// runs the groups it belongs to in index order.
  std::vector<std::vector<int>> queues;
  /// Token layout for the linear modules. Empty: the attention chunks (no remap).
  std::vector<LinearSlice> linear_layout;
  bool operator==(const MicroBatch&) const = default;
};

/// A complete plan for one global batch, self-contained: it carries the cluster, the
/// model, the cost model spec and the sequence lengths it was made for.
struct Plan {
  int version = kPlanFormatVersion;
  std::string strategy;
  Cluster cluster;
  Model model;
  nlohmann::json cost_model;  ///< CostModel::spec()
  std::int64_t step = 0;
  std::vector<Tokens> sequence_lengths_tokens;  ///< index = sequence id
  std::vector<MicroBatch> micro_batches;
  /// For people reading the plan: why it looks as it does where that is not obvious (e.g.
  /// GPUs without attention work in a micro-batch). Written only when not empty; ignored
  /// by validate and the simulator.
  std::vector<std::string> notes;
};

/// Stable, deterministic JSON (keys in a fixed order, no floats formatted by locale).
nlohmann::json to_json(const Plan& plan);
/// Throws InputError naming `source` and the offending field, also for a plan over the
/// limits of limits.hpp (sequences, micro-batches, chunks + linear slices).
Plan plan_from_json(const nlohmann::json& json, const std::string& source);
/// The canonical text form of to_json(plan): objects one member per line, arrays of
/// numbers (lengths, chunks, queues) on one line; ends with "\n". Byte-identical for
/// equal plans.
std::string plan_to_string(const Plan& plan);
/// The plans of a file written by `ballast plan`: one plan object or a JSON array of them
/// (element i read with source "<path>[i]"). Throws InputError for an unreadable or
/// malformed file, an empty array, a file over kMaxInputFileBytes or one holding more
/// than kMaxPlanJsonValues JSON values (counted before the document is built).
std::vector<Plan> read_plan_file(const std::string& path);

/// queues[r] for every rank: the explicit queues, or the default index order.
std::vector<std::vector<int>> effective_queues(const MicroBatch& micro_batch, int ranks);

// ---- Ulysses head sharding (docs/plan-format.md, "Ulysses degrees") ----
// A rank is a TP group of N GPUs (cluster.tensor_parallel.gpus); each TP GPU holds h =
// heads / N query heads and k = kv_heads / N KV heads, and a Ulysses group of d ranks
// splits every TP GPU's heads d ways. Member m computes query heads [m h/d, (m+1) h/d):
// when d <= k it also holds their k/d KV heads; when d > k its query heads all read KV
// head m / (d/k), which d/k members hold (KV replication, as DeepSpeed-Ulysses and USP do
// for GQA): its K, V travel to each of them and their dK, dV are summed back.

/// Whether a Ulysses group of `degree` ranks can shard `model`'s heads at tensor
/// parallelism `tensor_parallel`: degree divides h and (k % degree == 0 or
/// degree % k == 0). False for degree < 1 or an N that does not divide heads and KV heads.
/// The one rule behind validate() and every planner that may replicate KV heads (the
/// baselines keep their published cap, degree dividing k: strategies/builders.hpp).
bool ulysses_degree_allowed(const Model& model, int tensor_parallel, int degree);
/// The degrees in [1, max_degree] that ulysses_degree_allowed() accepts, ascending (1
/// always, when N is valid).
std::vector<int> allowed_ulysses_degrees(const Model& model, int tensor_parallel, int max_degree);
/// Members of a Ulysses group of `degree` that hold each KV head: degree / k when
/// degree > k (rounded up for a degree the rule rejects), else 1.
int ulysses_kv_replication(const Model& model, int tensor_parallel, int degree);
/// Bytes per token of a USP stage's tokens in the KV block each member passes around the
/// ring (its query heads' KV heads, replicas included, all TP GPUs of the rank together):
/// kv_bytes_per_token x ulysses_kv_replication() / `degree` (exact: the degree divides the
/// KV heads or is a multiple of them).
Bytes usp_kv_bytes_per_token(const Model& model, int tensor_parallel, int degree);
/// Bytes per token of a member's tokens that the QKV all-to-all of a Ulysses group of
/// `degree` ranks carries, all TP GPUs of the rank together, and the same for the dQ,
/// dK, dV all-to-all back: (hidden + 2 kv_dim x ulysses_kv_replication()) x
/// bytes_per_element, qkv_bytes_per_token() when degree <= k. The member sends 1/degree
/// of it to each member (itself included).
Bytes ulysses_qkv_bytes_per_token(const Model& model, int tensor_parallel, int degree);

/// One layer's transient attention buffer on each member of a group of `group_ranks`
/// ranks (TP groups of `tensor_parallel` GPUs), in bytes: local 0; ring 2 *
/// kv_bytes_per_token * largest_member_tokens (the KV block in use plus the one in
/// flight, sized for the largest member's block); all_gather kv_bytes_per_token *
/// group_tokens (the whole group's KV); ulysses ulysses_qkv_bytes_per_token(group_ranks) *
/// ceil(group_tokens / group_ranks) (the group's Q for this member's heads and K, V of
/// the KV heads they read, replicated ones included, after the all-to-all); usp (u =
/// `ulysses_degree`) the Ulysses buffer of its stage, ulysses_qkv_bytes_per_token(u) *
/// largest_member_tokens (a stage's tokens / u, sized for the largest member), plus the
/// ring's two KV blocks of its heads, 2 * usp_kv_bytes_per_token(u) * min(group_tokens, u *
/// largest_member_tokens) (a stage's tokens, sized for the largest possible stage). Saturates
/// at the largest Bytes value. The one rule behind peak_memory_bytes_per_rank() and the
/// planners' per-scheme capacities.
Bytes attention_buffer_bytes(const Model& model, int tensor_parallel, Scheme scheme,
                             int group_ranks, Tokens largest_member_tokens, Tokens group_tokens,
                             int ulysses_degree = 1);

/// Peak memory of each rank over the micro-batches: model states + activation bytes per
/// token * max(attention tokens, linear tokens) + the largest attention_buffer_bytes() of
/// its groups in that micro-batch (a non-local group of any size pays its scheme's buffer).
std::vector<Bytes> peak_memory_bytes_per_rank(const Plan& plan, const CostModel& cost);

/// The trace category of a group's tasks, shared by predicted (simulator) and measured
/// (runtime) timelines: "local" for a group of one rank whatever its scheme, else the
/// scheme and whether its ranks span nodes: "ring intra-node", "ring inter-node",
/// "all-gather intra-node", "all-gather inter-node", "ulysses intra-node", "ulysses
/// inter-node", "usp intra-node", "usp inter-node" (Zeppelin's tiers for rings). `group` must have at least one rank.
const char* group_category(const AttentionGroup& group, const Cluster& cluster);

struct ValidationResult {
  bool ok = true;
  std::string message;  ///< the first violated invariant, in plain words
};

/// Checks, in this order, and reports the first violation: format version; the plan's
/// cluster (its tensor parallelism first) and model match the cost model's; the TP degree N
/// divides heads and KV heads; its size within limits.hpp (sequences,
/// micro-batches, micro-batches x GPUs, chunks + linear slices); rank indices in range and
/// distinct per group; every group non-empty with a known scheme (local: one rank; ulysses:
/// ulysses_degree_allowed(size); usp: 2 <= ulysses_degree < size, ulysses_degree divides
/// size and ulysses_degree_allowed(ulysses_degree), routing_proxies 1; ulysses_degree 1 in
/// every other scheme); routing_proxies in [1, gpus_per_node] and routing_chunks in
/// [1, kMaxRoutingChunks], and every proxy GPU of a routed ring hop a member of the ring
/// (plan_layout.hpp's routing rule); every sequence appears in exactly one group of one
/// micro-batch and its chunks cover [0, padded length) exactly once, with padded length
/// >= length and < length + 2 * group size (ring, all_gather, usp) or + kMaxPadMultipleTokens
/// (ulysses, local); every chunk on one of its group's ranks; queues (if given)
/// list exactly each rank's groups and admit a deadlock-free order (no cycle between ranks'
/// orders); the linear layout (if given) covers every sequence's [0, length) exactly once;
/// per-rank peak memory fits the cost model's memory limit.
ValidationResult validate(const Plan& plan, const CostModel& cost);

/// validate() and throw InputError("plan <source> is invalid: <message>") on failure.
void require_valid(const Plan& plan, const CostModel& cost, const std::string& source);

}  // namespace ballast
