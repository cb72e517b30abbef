// FlexSP (ASPLOS'25, SYSTEMS.md section 2): per micro-batch, heterogeneous Ulysses
// groups of power-of-two degrees chosen by a MILP over bucketed sequences. This header
// is the contract between the parts of the strategy (internal to src/strategies and its
// tests):
//
//   GroupCosts     the cost model reduced to what the MILP sees: a group of degree d
//                  costs fixed_s(d) + sum over its sequences of sequence_s(s, d), and
//                  holds at most capacity_tokens(d) tokens (flexsp_costs.cpp)
//   blaster        Sequence Blaster: sort, min-max token split into M micro-batches
//   bucketize      FlexSP's padding-minimising DP buckets (Q = 16, raised)
//   homogeneous    greedy one-degree plans: the MILP's warm starts (flexsp_costs.cpp)
//   solve_milp     the bucketed / per-sequence MILP, solved by CBC (flexsp_milp.cpp)
//   solve_fast     the fast planner over the same group space (flexsp_fast.cpp)
//   planners       flexsp (faithful MILP) and flexsp-fast (flexsp.cpp)
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "ballast/cost_model.hpp"
#include "builders.hpp"

namespace ballast::strategies::flexsp {

/// One Ulysses degree the planner may use, with the constants of its groups.
struct DegreeCost {
  int degree = 1;
  /// Per group, whatever it holds: the micro-batch overhead (FlexSP's b1, both passes)
  /// plus the all-to-all latency of the group's 2 x 2 all-to-alls (0 for degree 1) plus,
  /// with tensor parallelism, the latency of a member's TP collectives.
  Seconds fixed_s = 0;
  /// All-to-all bandwidth time per token of the group (both passes; 0 for degree 1), plus
  /// with tensor parallelism a member's TP collectives' bandwidth time per token / d.
  Seconds comm_s_per_token = 0;
  /// Most tokens a group of this degree holds: degree * usable_tokens_per_rank(ulysses).
  Tokens capacity_tokens = 0;
};

/// The cost model seen through FlexSP's separable group form, for groups placed
/// buddy-aligned (by symmetry, a group of degree d costs what ranks [0, d) cost).
/// A group of degree index k holding sequences S costs
///   group_time_s(k, S) = fixed_s + sum_{s in S} sequence_s(s, k)
/// where sequence_s = attention (fwd + bwd, heads split d ways) + linear(s) / d +
/// comm_s_per_token * s. This equals estimate_plan_time_s() of a one-group micro-batch up
/// to the rounding of s / d (tested).
class GroupCosts {
 public:
  /// Degrees: every allowed Ulysses degree (powers of two dividing the rank count and
  /// ulysses_kv_heads()), 1 included, ascending. Throws InputError if the cost model
  /// has no token capacity.
  explicit GroupCosts(const CostModel& cost);

  int ranks() const { return ranks_; }
  const std::vector<DegreeCost>& degrees() const { return degrees_; }
  std::size_t degree_count() const { return degrees_.size(); }
  const DegreeCost& at(std::size_t k) const { return degrees_[k]; }

  /// Time of one sequence of `length_tokens` in a group of degree index k, fixed part
  /// excluded.
  Seconds sequence_s(Tokens length_tokens, std::size_t k) const;
  /// The fluid bound's share of the ranks a sequence takes to end by `target_s` (FastPlanner's
  /// targets, makespan_floor_s): over the degrees whose group ends it by then
  /// (time_s[k] <= target_s - fixed_s), the least d x time_s[k] / (target_s - fixed_s);
  /// infinity when none does. `time_s`: its sequence_s() per degree index, infinity where
  /// a group cannot hold it.
  double rank_share(std::span<const Seconds> time_s, Seconds target_s) const;
  /// Its time alone in its best group: the least fixed_s + time_s[k] (same `time_s`).
  Seconds alone_s(std::span<const Seconds> time_s) const;
  /// Smallest degree index whose group holds `length_tokens` alone; kNone if none does.
  std::size_t min_degree_index(Tokens length_tokens) const;
  /// Index of a degree; kNone if it is not allowed.
  std::size_t index_of_degree(int degree) const;
  /// Total tokens the cluster holds in one micro-batch (every rank at its local capacity:
  /// Sequence Blaster's C * N).
  Tokens cluster_capacity_tokens() const { return cluster_capacity_tokens_; }

  static constexpr std::size_t kNone = std::numeric_limits<std::size_t>::max();

 private:
  const CostModel* cost_;
  int ranks_ = 0;
  std::vector<DegreeCost> degrees_;
  Tokens cluster_capacity_tokens_ = 0;
};

/// A micro-batch as the solvers see it: distinct item lengths (bucket upper bounds, or
/// real sequence lengths) and how many sequences each stands for.
struct Problem {
  std::vector<Tokens> lengths_tokens;  ///< one per item, any order, each >= 1
  std::vector<std::int64_t> counts;    ///< sequences per item, each >= 1
  std::int64_t sequences() const;
  Tokens total_tokens() const;         ///< sum of length * count
};

/// A group of a solution: its degree index and the items it holds, one entry per
/// sequence (an item with count 3 split 2 + 1 appears twice in one group, once in
/// another), ascending.
struct SolvedGroup {
  std::size_t degree_index = 0;
  std::vector<std::size_t> items;
};

struct Solution {
  std::vector<SolvedGroup> groups;
  /// max over groups of group_time_s, by GroupCosts on the problem's item lengths.
  Seconds makespan_s = std::numeric_limits<double>::infinity();
  bool feasible() const { return !groups.empty(); }
};

/// The rules every solution obeys (FlexSP's constraints): each sequence in exactly one
/// group; every group non-empty, within capacity_tokens, and of at least each of its
/// items' minimum degree; the groups' degrees sum to the rank count when
/// every_gpu_used(), else to at most it.
/// every_gpu_used: the problem has at least ranks / (largest degree) sequences, so that
/// enough non-empty groups exist (with GQA the largest degree can be below the rank
/// count, and a micro-batch of two long sequences cannot fill 64 GPUs with 8-way groups).
bool every_gpu_used(const GroupCosts& costs, const Problem& problem);
/// Empty string when `solution` obeys the rules for `problem`, else the first violation.
std::string check_solution(const GroupCosts& costs, const Problem& problem,
                           const Solution& solution);
/// Recomputes makespan_s from the groups (group_time_s maximum).
Seconds makespan_s(const GroupCosts& costs, const Problem& problem,
                   std::span<const SolvedGroup> groups);

/// Greedy homogeneous plans (the MILP's warm starts), one per degree d at least every
/// item's minimum degree: N/d groups of degree d, sequences longest first, each to the
/// group with the least time that still has room (ties: lowest group). Groups left empty
/// are dropped; when every_gpu_used() that makes the degree infeasible (fewer sequences
/// than groups). Infeasible degrees are skipped. Ascending degree.
std::vector<Solution> homogeneous_solutions(const GroupCosts& costs, const Problem& problem);

// ---- Sequence Blaster and bucketing ----

/// Splits `sorted_lengths` (ascending) into `micro_batches` contiguous non-empty ranges
/// minimising the largest range token sum (DP over prefix sums; ties: the earliest cut).
/// Returns the range starts (size micro_batches, first 0). Needs 1 <= micro_batches <=
/// size.
std::vector<std::size_t> min_max_token_split(std::span<const Tokens> sorted_lengths,
                                             std::size_t micro_batches);

/// FlexSP's bucketing of `sorted_lengths` (ascending): the Q contiguous buckets that
/// minimise the padded tokens (every sequence padded to its bucket's largest length),
/// Q = 16 raised while the padded total exceeds (real + capacity) / 2; with no more
/// distinct lengths than Q every distinct length is its own bucket (exact). Returns the
/// problem (bucket upper bounds and counts) and, per sequence of the input order, its
/// item index.
struct Buckets {
  Problem problem;
  std::vector<std::size_t> item_of_sequence;
};
Buckets bucketize(std::span<const Tokens> sorted_lengths, Tokens capacity_tokens,
                  std::size_t initial_buckets = 16);
/// Every distinct length its own item (the per-sequence MILP).
Buckets exact_items(std::span<const Tokens> sorted_lengths);

/// A batch's sequences (ascending) as the group-cost model sees them: runs of equal
/// lengths, and per run and degree index a sequence's time in such a group (fixed part
/// excluded; infinity where the group cannot hold it).
struct SequenceTimes {
  std::vector<std::size_t> first;  ///< per run of equal lengths: its first position
  std::vector<Seconds> time_s;     ///< per run, degree_count() values
};
SequenceTimes sequence_times(const GroupCosts& costs, std::span<const Tokens> ascending);

/// Relative precision of makespan_floor_s()'s search: the floor is at most that far below
/// the least makespan the fluid bound allows (a floor need not be tight).
inline constexpr double kMakespanFloorPrecision = 1e-3;

/// A makespan no solution of the sequences at positions [begin, end) of `times` beats,
/// by the group-cost model both solvers' plans are timed with (a group of degree d takes
/// fixed_s plus its sequences' times, and the groups' degrees sum to at most the ranks):
/// the larger of the slowest sequence alone in its best group and the least T at which
/// the sequences fit the ranks fluidly (each takes d x its time / (T - fixed_s) of the
/// ranks in its best degree; a group done by T fills at most d ranks so), as
/// FastPlanner::makespan_bound_s. plan_flexsp gives up on a micro-batch count with it.
Seconds makespan_floor_s(const GroupCosts& costs, const SequenceTimes& times, std::size_t begin,
                         std::size_t end);

/// Whether plan_flexsp gives up on a micro-batch count that cannot beat the best one
/// (on by default; off is the reference the tests compare with), and how many it gave
/// up on this thread.
bool& give_up_losing_micro_batch_counts();
std::int64_t& given_up_micro_batch_counts();

// ---- solvers ----

struct MilpOptions {
  /// Branch-and-bound node budget (deterministic, unlike a time limit). The original
  /// stops SCIP after 10 s and plans a step in 5-15 s; CBC's root alone (LP, 10 cut
  /// passes, heuristics with proximity search) plans flexsp-7b-192k's steps in ~12 s on
  /// a 2-core CI-class machine, and 20 nodes took 21 s for the same plans (docs/flexsp.md).
  int max_nodes = 0;
  /// Feasible solutions offered to CBC as MIP starts (the best one is used).
  std::vector<Solution> warm_starts;
};
struct MilpResult {
  Solution solution;        ///< the incumbent; infeasible (no groups) if none was found
  bool proven_optimal = false;
  double objective_s = 0;   ///< CBC's objective (the makespan C)
  double best_bound_s = 0;  ///< CBC's lower bound at the end
  int nodes = 0;            ///< branch-and-bound nodes explored
};
/// FlexSP's MILP over virtual groups (N/d copies of each degree d), solved by CBC
/// single-threaded with the node budget; deterministic.
MilpResult solve_milp(const GroupCosts& costs, const Problem& problem, const MilpOptions& options);

/// The fast planner: no solver, same group space and rules; deterministic. Returns an
/// infeasible Solution when it finds no feasible one.
Solution solve_fast(const GroupCosts& costs, const Problem& problem);

}  // namespace ballast::strategies::flexsp
