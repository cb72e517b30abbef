// Zeppelin (EuroSys'26): hierarchical sequence partitioning (local / intra-node ring /
// inter-node ring) with the attention engine's queue order, the routing layer (inter-node
// ring transfers split over proxy GPUs and their NICs) and the remapping layer (a
// token-balanced layout for the linear modules). Internal to src/strategies and its
// tests; docs/zeppelin.md explains the choices. Code: zeppelin_tiers.cpp (crossovers,
// routing, tier choice), zeppelin_placement.cpp (two-level placement, the even ablation),
// zeppelin_remap.cpp (the linear layout), zeppelin.cpp (candidates and the planner).
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/strategy.hpp"
#include "ballast/workload.hpp"

namespace ballast::strategies::zeppelin {

/// The communication tier a sequence runs in.
enum class Tier : std::uint8_t { local, intra_node, inter_node };
const char* to_string(Tier tier);

/// The switches of the ablation: each technique can be turned off on its own.
struct Switches {
  bool hierarchical = true;  ///< false: every sequence split evenly over static rings (TE CP)
  enum class Mode : std::uint8_t { off, auto_, on };
  Mode routing = Mode::auto_;  ///< auto: route an inter-node ring where it pays
  Mode remap = Mode::auto_;    ///< auto: remap a micro-batch where it pays
  /// What the hierarchical placement balances (docs/zeppelin.md, "Placement").
  enum class Placement : std::uint8_t {
    per_gpu,     ///< each GPU's time; rings charge exactly their members (issue 22)
    node_totals  ///< node totals, then GPUs inside a node (the previous approximation)
  };
  Placement placement = Placement::per_gpu;
};

/// Routing of one inter-node transfer: proxies (1 = the sender's own NIC) and pipeline chunks.
struct Routing {
  int proxies = 1;
  int chunks = 1;
};

/// The (proxies, chunks) that minimise the evaluator's isolated time of the forward
/// transfer of `bytes_per_layer` plus the backward one (twice the bytes) from src to dst:
/// proxies in {1, 2, 4, ...} up to nics_per_node, chunks in {1, 2, 4, 8, 16}; ties go to
/// fewer proxies, then fewer chunks, so routing is chosen only where it pays. Prices the
/// choices with the most proxies first and skips one whose floor
/// (PlanEvaluator::transfer_time_floor_s, both passes) is above the best time found: it
/// cannot be the minimum, so the choice is choose_routing_exhaustive()'s.
Routing choose_routing(const CostModel& cost, const PlanEvaluator& evaluator, Bytes bytes_per_layer,
                       int src_rank, int dst_rank);
/// The routing of a ring over `group`'s ranks (in ring order): choose_routing() for the KV
/// bytes its fullest member holds, on its first hop between nodes; none ({1, 1}) within one
/// node. What zeppelin gives its inter-node rings, and ballast's moves every ring over
/// several nodes they build.
Routing ring_routing(const AttentionGroup& group, const CostModel& cost, const PlanEvaluator& evaluator);
/// The reference: every choice priced, in the order of the ties.
Routing choose_routing_exhaustive(const CostModel& cost, const PlanEvaluator& evaluator,
                                  Bytes bytes_per_layer, int src_rank, int dst_rank);

/// The cost model's crossover points for this cluster and model. A ring step of a member
/// holding c tokens (two zigzag chunks of c/2) computes c^2/2 causal pairs against one
/// block and sends one KV block of c tokens; the step hides its transfer when the
/// attention takes at least as long as the transfer (forward pass).
struct Crossovers {
  Tokens intra_node_tokens_per_rank = 0;  ///< smallest c hiding an NVLink hop
  Tokens inter_node_tokens_per_rank = 0;  ///< smallest c hiding a NIC hop (one NIC)
  Tokens inter_node_routed_tokens_per_rank = 0;  ///< same with the best routing
  /// Shortest document whose attention (fwd) takes at least its linear modules' time.
  Tokens attention_over_linear_tokens = 0;
};
/// Routed transfer times come from `evaluator`. Each step of the routed crossover's binary
/// search is decided, where it can be, without choosing the routing: not hidden when the
/// attention is below every choice's floor, hidden when it reaches an upper bound from the
/// previous step's choice; otherwise choose_routing. The same steps and results as
/// find_crossovers_exhaustive().
Crossovers find_crossovers(const CostModel& cost, const PlanEvaluator& evaluator);
/// The reference: every step of the routed search priced by choose_routing_exhaustive.
Crossovers find_crossovers_exhaustive(const CostModel& cost, const PlanEvaluator& evaluator);

/// Where a sequence runs: its tier and the ranks of its ring (1 for local; g GPUs of a
/// node for intra-node; all GPUs of `degree / gpus_per_node` nodes for inter-node).
struct TierChoice {
  Tier tier = Tier::local;
  int degree = 1;
};

/// What tier selection needs about the cluster and cost model, computed once per plan.
struct TierContext {
  const CostModel* cost = nullptr;
  const PlanEvaluator* evaluator = nullptr;  ///< prices inter-node hops (routed transfers)
  Crossovers crossovers;
  Tokens capacity_tokens_per_rank = 0;  ///< ring members' usable tokens (the tighter cap)
  int gpus_per_node = 1;
  int nodes = 1;
  bool routing = true;
  /// Spread stragglers over rings that cannot hide their traffic (rule 2 below); the
  /// planner evaluates plans with and without it and keeps the faster.
  bool spread_stragglers = false;
  /// Memo of an inter-node ring hop's evaluated time by bytes (the best routing's isolated
  /// transfer): rule 2 prices every inter-node ring for every straggler, and their
  /// per-member byte counts repeat (a pure function of the bytes for this context).
  mutable std::map<Bytes, Seconds> inter_node_hop_s;
};
/// Keeps pointers to `cost` and `evaluator`, which must outlive the context.
TierContext make_tier_context(const CostModel& cost, const PlanEvaluator& evaluator,
                              const Switches& switches);

/// Tier selection (docs/zeppelin.md, "Tiers"). Candidates in order: local; an intra-node
/// ring of g = 2, 4, ... GPUs (g divides gpus_per_node), which hides its traffic when each
/// member's floor(s/g) tokens reach the intra-node crossover; an inter-node ring over
/// k = 2, 3, ... whole nodes, hiding when floor(s/(k G)) reaches the inter-node crossover
/// (routed when routing is on). Each must fit memory (ceil(s/degree) <= capacity).
/// 1. The first candidate that hides its traffic and whose share of the sequence's work
///    (attention + linear on one GPU) / degree is at most `target_load_s` (the mean
///    per-GPU work of the step, over all its micro-batches; docs/zeppelin.md) wins.
/// 2. With spread_stragglers, a straggler (no candidate of rule 1) goes to the smallest
///    fitting candidate whose member finishes within the target by the cost model,
///    exposed communication included, else to the one whose member finishes first.
/// 3. Otherwise the widest candidate that hides its traffic; when memory allows none that
///    hides, the smallest ring that fits. Without spread_stragglers a sequence is never
///    split over a ring that cannot hide its traffic unless memory forces it.
/// Throws PlanningError naming the sequence when no ring of the cluster holds it.
TierChoice choose_tier(std::int64_t sequence_id, Tokens length_tokens, Seconds target_load_s,
                       const TierContext& context);

/// One member's time (seconds, fwd + bwd, whole model) in `choice`'s ring for a sequence of
/// `length` tokens by the cost model: per pass, degree ring steps of max(the step's share of
/// the attention, one KV hop of the tier's link: NVLink, or the NIC with the best routing),
/// plus its share of the linear modules. Degree 1: the whole local work.
Seconds ring_member_time_s(const TierContext& context, Tokens length, TierChoice choice);

/// One document's attention, forward + backward, on one GPU (seconds, whole model).
Seconds attention_s(const CostModel& cost, Tokens length);
/// The linear modules over `tokens`, forward + backward, on one GPU (seconds, whole model);
/// with tensor parallelism, on one TP group, their TP collectives' bandwidth time included.
Seconds linear_s(const CostModel& cost, Tokens tokens);

/// The hierarchical partition (zeppelin_placement.cpp): micro-batches pre-split by work,
/// each sequence in the ring choose_tier gives it, placed to balance attention (+ linear
/// when `balance_linear`, i.e. without a remap) over the GPUs. No queues or routing yet.
/// `placement` picks what is balanced: each GPU's time (default) or node totals first (the
/// previous approximation, kept for the ablation and as the property test's reference).
Plan hierarchical_plan(const Batch& batch, const CostModel& cost, const TierContext& context,
                       bool balance_linear, Switches::Placement placement,
                       const std::string& label);
/// The even-split ablation (partition=even): TE CP's static rings of `degree` (the planner
/// passes static-cp's degree for the run; without one: the smallest holding the longest
/// sequence) with token-balanced packs, zigzag unpadded.
Plan even_plan(const Batch& batch, const CostModel& cost, std::optional<int> degree,
               const std::string& label);

/// The zeppelin planner's plan (strategy label `label`): the fastest valid candidate by
/// `evaluator`, which also prices routed transfers. With a finite `cap_s`
/// (Planner::plan_below), the same plan when its step is below the cap; otherwise a valid
/// plan whose step is not (each candidate's simulation stops at the cap).
Plan plan_zeppelin(const Batch& batch, const CostModel& cost, const PlanEvaluator& evaluator,
                   const Switches& switches, std::optional<int> even_degree,
                   const std::string& label,
                   Seconds cap_s = std::numeric_limits<Seconds>::infinity());
/// How often plan_zeppelin on this thread planned again without its cap because a plan
/// derived from a stage-1 candidate was below it (for tests).
std::int64_t& uncapped_replan_count();

}  // namespace ballast::strategies::zeppelin
