// The ballast strategy's parts (docs/strategies.md, "ballast"): its incremental step-time
// estimate and its local-search moves. Internal to src/strategies (and its tests).
//
// The estimate prices a plan per micro-batch and rank from the CostModel as the
// simulator's programs build it (src/sim/program.cpp, src/sim/schemes.cpp): overhead,
// linear layers on the rank's linear tokens, tensor-parallel collectives, the remap's
// transfers, and each attention group's compute plus the communication it cannot hide
// (ring: max(attention, KV hops) per pass; all-gather and Ulysses: their collectives in
// series with the compute; USP: the stage's all-to-alls, then a ring over the stages). A micro-batch takes its slowest rank; ranks do not wait for
// each other (queue order is ignored). Each group's per-member time is cached, so a move
// that rewrites a few groups of a micro-batch prices only those.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <memory>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/strategy.hpp"

namespace ballast::strategies::ballast_search {

/// Whether a Ulysses group of `group_ranks` ranks is allowed on this cost model: the one
/// place ballast asks: plan.hpp's ulysses_degree_allowed (a size dividing the heads per GPU
/// of a TP group, KV heads replicated when it exceeds them).
bool ulysses_group_allowed(const CostModel& cost, int group_ranks);

/// Time of one sequence alone on one rank (attention + linear, both passes): what a move
/// shifts from one rank to another.
Seconds local_sequence_time_s(const CostModel& cost, Tokens length);

/// One group's estimated time on each member (both passes, forward weighted by
/// pass_count), attention and the communication it waits for; no linear layers.
struct GroupEstimate {
  std::vector<int> ranks;
  std::vector<Seconds> member_time_s;  ///< parallel to `ranks`
};

GroupEstimate estimate_group(const AttentionGroup& group, const CostModel& cost,
                             const PlanEvaluator& evaluator);

/// A micro-batch's estimate: per rank, its time; the micro-batch takes the largest.
struct MicroBatchEstimate {
  /// Parallel to MicroBatch::groups; shared with the estimates that reuse them (a
  /// candidate's unchanged groups), never changed once made.
  std::vector<std::shared_ptr<const GroupEstimate>> groups;
  std::vector<Seconds> rank_time_s;   ///< per rank of the cluster; 0 for a rank left idle
  Seconds time_s = 0;
  bool remapped = false;  ///< the micro-batch has a linear layout (Zeppelin's remap)
};

/// `origin[g]` >= 0 says group g of `micro_batch` equals group origin[g] of the micro-batch
/// `previous` was made for (its cached estimate is reused); -1 (or an empty `origin`, or
/// no `previous`) prices the group afresh. With `previous` and no linear layout in either
/// micro-batch, a rank none of whose groups changed (every group holding it kept, none
/// added or erased on it) keeps its time from `previous`: the same terms summed in the
/// same order, so the same time to the bit (BallastEstimate.IncrementalEqualsFromScratch).
MicroBatchEstimate estimate_micro_batch(const MicroBatch& micro_batch, const CostModel& cost,
                                        const PlanEvaluator& evaluator,
                                        const MicroBatchEstimate* previous = nullptr,
                                        const std::vector<int>& origin = {});

/// The whole plan's estimate: sum of the micro-batches' plus the exposed gradient sync
/// (the last of gradient_sync_buckets, as GradientSync::overlap exposes it).
struct PlanEstimate {
  std::vector<MicroBatchEstimate> micro_batches;
  Seconds gradient_sync_s = 0;
  Seconds step_time_s() const;
};

PlanEstimate estimate_plan(const Plan& plan, const CostModel& cost, const PlanEvaluator& evaluator);

/// The estimate anchored to a simulation of the same plan: per micro-batch and rank, the
/// share of the rank's simulated time (PlanEvaluation::rank_time_s) that the estimate
/// misses, split over its micro-batches in proportion to the estimate (all of it with one
/// micro-batch). Adding it to a candidate's estimate keeps what the simulator saw on the
/// ranks a move leaves alone (a ring whose hops contend on the NICs, say) instead of
/// trusting the coarse estimate there. Empty when the evaluator gave no rank times.
using RankOffsets = std::vector<std::vector<Seconds>>;  ///< [micro-batch][rank]
RankOffsets rank_offsets(const PlanEstimate& estimate, const std::vector<Seconds>& simulated_rank_time_s);

/// `estimate` plus `offset_s` on each rank it gives time (a rank without work keeps 0),
/// its time_s the largest; `offset_s` empty leaves it as it is.
MicroBatchEstimate anchored(MicroBatchEstimate estimate, const std::vector<Seconds>& offset_s);

/// Every micro-batch anchored with its offsets (rank_offsets() of a simulation of the plan).
PlanEstimate anchored(const PlanEstimate& estimate, const RankOffsets& offsets);

/// A candidate: micro-batch `index` of a plan replaced by one whose group g is the plan's
/// group origin[g] of that micro-batch, kept where it is (`base`, not copied), or, where
/// origin[g] is -1, the new group added[added_index[g]]. The plan must outlive the edit
/// (a move is priced and applied while the plan it was made from stands).
struct MicroBatchEdit {
  int index = 0;
  const MicroBatch* base = nullptr;  ///< the plan's micro-batch `index`; null: appended
  std::vector<int> origin;           ///< per group: its index in `base`, or -1
  std::vector<int> added_index;      ///< per group: its index in `added`, or -1
  std::deque<AttentionGroup> added;  ///< a deque: growing it moves no group
  std::vector<std::vector<int>> queues;  ///< MicroBatch::queues of the result
  std::vector<LinearSlice> linear_layout;
  std::size_t group_count() const { return origin.size(); }
  const AttentionGroup& group(std::size_t g) const {
    return origin[g] >= 0 ? base->groups[static_cast<std::size_t>(origin[g])]
                          : added[static_cast<std::size_t>(added_index[g])];
  }
  /// The micro-batch it stands for (the kept groups copied).
  MicroBatch micro_batch() const;
};

/// estimate_micro_batch() of the edit's micro-batch, reusing `previous` (the estimate of
/// the micro-batch it edits) for the kept groups; only a remapped edit is copied whole.
MicroBatchEstimate estimate_edit(const MicroBatchEdit& edit, const CostModel& cost,
                                 const PlanEvaluator& evaluator, const MicroBatchEstimate* previous);

/// Which move made a candidate (the letters of docs/strategies.md, "ballast").
enum class MoveKind {
  move_local,      ///< (a) a local sequence from the slowest rank to the least-loaded one
  extract,         ///< (b) a sequence out of a multi-sequence group: local or a new group
  change_scheme,   ///< (c) ring / ulysses / all_gather on the same ranks
  split,           ///< (d) a multi-sequence group into two halves
  merge,           ///< (d) two groups of one scheme into one over their ranks
  to_micro_batch,  ///< (e) a sequence into another micro-batch
  level,           ///< (a) local sequences from the slowest ranks to the least-loaded, many at once
  grow,            ///< (d) a group over more ranks: the least-loaded of one node
  dissolve,        ///< (d) a group's sequences local on its ranks (or all but its longest)
  level_step,      ///< (f) level by the ranks' whole-step loads, within one micro-batch
  re_deal,         ///< (4th phase) every local sequence dealt again by the whole-step loads
  fill_last,       ///< (4th phase) each rank's local sequences into the last micro-batch first
  count,
};
const char* move_name(MoveKind kind);

struct Move {
  MoveKind kind = MoveKind::move_local;
  std::vector<MicroBatchEdit> edits;  ///< one or two micro-batches, ascending index
  /// A change of scheme of a group without the micro-batch's slowest rank: it cannot
  /// speed the step, only free ranks (tried as a sideways move, ballast.cpp's improve()).
  bool off_critical_path = false;
};

/// What the search takes for a rank's load: its time with the gradient sync's exposed
/// part (PlanEvaluation::rank_time_s), or without it (rank_time_before_sync_s: what the
/// rank could still take on before the sync). `whole_step` is the third phase: loads
/// before the sync, and only the moves that act across micro-batches (level_step, and
/// splits off the critical path that feed it) or are only tried on the plan the first two
/// phases left (groups' stages transposed across nodes). `re_deal` is the fourth: loads
/// before the sync, and only the re-deals (each local sequence kept in its micro-batch,
/// into the one with the most room, so with a new micro-batch appended, or into the last
/// micro-batch first) and fill-last (each rank's local sequences into the last
/// micro-batch first).
enum class Loads { with_sync, before_sync, whole_step, re_deal };

/// The moves tried from `plan` (estimated by `estimate`), in a fixed order: per
/// micro-batch (slowest first) around its slowest rank, then (e) between the slowest and
/// the fastest micro-batch, at most `max_moves` of them; then, marked off_critical_path,
/// (c) for every other multi-rank group of each micro-batch, at most `max_moves` more.
/// With Loads::before_sync also level, grow and dissolve (off the critical path too).
/// With Loads::whole_step only level_step per micro-batch (into it and into each other one,
/// swapping where none has room), (c) for every group over several nodes as USP with its
/// stages across the nodes and its rings inside them (grow offers that layout too) and,
/// off the critical path, (d) splits of the groups without a micro-batch's slowest rank.
/// With Loads::re_deal only the re-deal, up to four times: each local sequence kept in
/// its micro-batch, free to go to another, free with an empty micro-batch appended (the
/// move's last edit has the plan's micro-batch count as its index; only where memory
/// constrained the free deal) and, with several micro-batches, into the last one where the
/// rank has room there; then fill-last (MoveKind::fill_last). Deterministic.
/// With `ring_router`, every ring over several nodes a move builds is routed as zeppelin
/// routes its own (zeppelin::ring_routing, priced by it); without, unrouted (the default:
/// docs/strategies.md, "Routing the rings the search builds").
std::vector<Move> generate_moves(const Plan& plan, const PlanEstimate& estimate,
                                 const CostModel& cost, std::size_t max_moves, Loads loads,
                                 const PlanEvaluator* ring_router = nullptr);

/// Groups over every rank of the cluster holding the sequences `ids` (of `plan`) whole, one
/// per layout the search knows: a ring; Ulysses where the heads allow it; USP with stages
/// inside nodes (each degree the moves offer) and with stages across nodes. One local
/// group on a one-rank cluster. With `ring_router`, the ring routed as generate_moves()
/// routes its rings.
std::vector<AttentionGroup> whole_cluster_groups(const std::vector<std::int64_t>& ids, const Plan& plan,
                                                const CostModel& cost,
                                                const PlanEvaluator* ring_router = nullptr);

/// `plan` with the move's micro-batches replaced (an edit whose index is the plan's
/// micro-batch count appends one) and those it emptied dropped.
Plan apply_move(const Plan& plan, const Move& move);
/// apply_move() in place, without copying the micro-batches the move keeps: each edited
/// micro-batch is built (MicroBatchEdit::micro_batch) and swapped into `plan`, the old ones
/// into `swapped_out`; swap_in_move_undo() puts them back. False, and `plan` untouched,
/// when the move appends a micro-batch or empties one (apply_move() drops it).
bool swap_in_move(Plan& plan, const Move& move, std::vector<MicroBatch>& swapped_out);
void swap_in_move_undo(Plan& plan, const Move& move, std::vector<MicroBatch>& swapped_out);

/// 128 bits digesting every field of a plan's micro-batches (two independent 64-bit mixes):
/// what tells the search's candidates apart (they share the rest of the plan).
struct PlanDigest {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  bool operator==(const PlanDigest&) const = default;
};
PlanDigest digest_of(const std::vector<MicroBatch>& micro_batches);

/// A PlanEvaluator that remembers what `inner`'s evaluate_below() returned for each plan
/// (by digest_of its micro-batches) and answers a repeated call from memory where
/// evaluate_below's contract lets it: the stored evaluation when its step was below the
/// bound it was simulated under (then it is evaluate()'s, whatever the new bound), or
/// when its step reaches the new bound (a stopped simulation's step is at most the plan's,
/// so it is one the contract allows for the new bound too).
/// Every other call goes to `inner`. The search's phases and rounds generate many of the
/// same candidates from a plan none of them changed; remembering them changes no choice,
/// only what is simulated. Single-threaded (as the search is); `inner` must outlive it.
///
/// With `steps_too`, step_time_below_s() is evaluate_below()'s step (the same simulation,
/// its rank times kept as well), so a plan a planner priced by its step alone is remembered
/// for a later evaluate_below(): the portfolio's members share one with the portfolio,
/// which simulates zeppelin's plan after zeppelin priced it.
class RememberingEvaluator final : public PlanEvaluator {
 public:
  explicit RememberingEvaluator(const PlanEvaluator& inner, bool steps_too = false)
      : inner_(inner), steps_too_(steps_too) {}
  Seconds step_time_s(const Plan& plan) const override { return inner_.step_time_s(plan); }
  Seconds step_time_below_s(const Plan& plan, Seconds bound_s) const override {
    return steps_too_ ? evaluate_below(plan, bound_s).step_time_s : inner_.step_time_below_s(plan, bound_s);
  }
  PlanEvaluation evaluate(const Plan& plan) const override { return inner_.evaluate(plan); }
  PlanEvaluation evaluate_below(const Plan& plan, Seconds bound_s) const override;
  Seconds transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank, int routing_proxies,
                          int routing_chunks) const override {
    return inner_.transfer_time_s(bytes_per_layer, src_rank, dst_rank, routing_proxies, routing_chunks);
  }
  Seconds transfer_time_floor_s(Bytes bytes_per_layer, int src_rank, int dst_rank, int routing_proxies,
                                int routing_chunks) const override {
    return inner_.transfer_time_floor_s(bytes_per_layer, src_rank, dst_rank, routing_proxies, routing_chunks);
  }
  void open_session() const override { inner_.open_session(); }
  void close_session() const override { inner_.close_session(); }
  /// Calls of evaluate_below() passed to `inner` and answered from memory.
  long long passed() const { return passed_; }
  long long remembered() const { return remembered_; }

 private:
  struct Entry {
    PlanDigest digest;
    Seconds bound_s = 0;
    PlanEvaluation evaluation;
  };
  const PlanEvaluator& inner_;
  bool steps_too_ = false;
  mutable std::vector<Entry> entries_;
  mutable long long passed_ = 0;
  mutable long long remembered_ = 0;
};

}  // namespace ballast::strategies::ballast_search
