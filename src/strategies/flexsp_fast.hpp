// FlexSP's fast planner (flexsp.hpp), the same group space and rules as the MILP without a
// solver: a search for the least target makespan at which a greedy packing fits the ranks
// picks how many groups of each degree to use; a local search around the slowest group
// polishes the plan, and a hill climb over the group structure refines small ones.
// Internal to the planner's two parts: flexsp_fast.cpp builds the starts (construction),
// flexsp_fast_search.cpp improves them (local search, structure hill climb).
#pragma once

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "flexsp.hpp"

namespace ballast::strategies::flexsp::fast {

/// Two times closer than this fraction of the makespan count as equal: a local-search
/// move must beat it, so rounding noise cannot make the search cycle.
inline constexpr double kRelativeTolerance = 1e-9;

/// A group under construction: its items (one entry per sequence), time and tokens.
struct WorkGroup {
  std::size_t degree_index = 0;
  Seconds time_s = 0;  ///< fixed_s + the item times
  Tokens tokens = 0;
  std::vector<std::size_t> items;  ///< in the local search: ascending length, then index
};

/// Non-empty groups plus the ranks no group holds yet.
struct WorkPlan {
  std::vector<WorkGroup> groups;
  int free_ranks = 0;
};

inline Seconds makespan_of(const WorkPlan& plan) {
  Seconds makespan = 0;
  for (const WorkGroup& group : plan.groups) makespan = std::max(makespan, group.time_s);
  return makespan;
}

/// A packing of the sequences (longest first) into groups, without their items.
struct Packing {
  std::vector<std::size_t> group_of_sequence;   ///< by position in the longest-first order
  std::vector<std::size_t> group_degree_index;  ///< per group
};

/// How the target packing picks the degree of a group it opens for a sequence.
enum class Opening {
  cheapest,  ///< least GPU time per unit of room: degree * sequence_s / (target - fixed_s)
  fullest,   ///< the degree whose group the next sequences (longest first) fill best
};

/// The groups of one degree open during a packing, for first fit: a max-tree over slots
/// of the time and tokens each group still has room for, so the leftmost group with room
/// for both is found in about log(groups) steps.
class RoomTree {
 public:
  explicit RoomTree(std::size_t slots) {
    while (leaves_ < slots) leaves_ *= 2;
    room_s_.assign(2 * leaves_, -1.0);
    room_tokens_.assign(2 * leaves_, -1);
  }
  void clear() {
    std::fill(room_s_.begin(), room_s_.end(), -1.0);
    std::fill(room_tokens_.begin(), room_tokens_.end(), -1);
  }
  void set(std::size_t slot, Seconds room_s, Tokens room_tokens) {
    std::size_t node = leaves_ + slot;
    room_s_[node] = room_s;
    room_tokens_[node] = room_tokens;
    for (node /= 2; node >= 1; node /= 2) {
      const Seconds max_s = std::max(room_s_[2 * node], room_s_[2 * node + 1]);
      const Tokens max_tokens = std::max(room_tokens_[2 * node], room_tokens_[2 * node + 1]);
      if (max_s == room_s_[node] && max_tokens == room_tokens_[node]) break;  // above: unchanged
      room_s_[node] = max_s;
      room_tokens_[node] = max_tokens;
    }
  }
  /// Leftmost slot with room_s >= need_s and room_tokens >= need_tokens; kNone if none.
  std::size_t find(Seconds need_s, Tokens need_tokens) const {
    return find(1, need_s, need_tokens);
  }

 private:
  std::size_t find(std::size_t node, Seconds need_s, Tokens need_tokens) const {
    if (room_s_[node] < need_s || room_tokens_[node] < need_tokens) return GroupCosts::kNone;
    if (node >= leaves_) return node - leaves_;
    const std::size_t left = find(2 * node, need_s, need_tokens);
    return left != GroupCosts::kNone ? left : find(2 * node + 1, need_s, need_tokens);
  }

  std::size_t leaves_ = 1;
  std::vector<Seconds> room_s_;
  std::vector<Tokens> room_tokens_;
};

/// The fast planner over one micro-batch; solve_fast() runs it once.
class FastPlanner {
 public:
  FastPlanner(const GroupCosts& costs, const Problem& problem);

  /// Starts: the best homogeneous plan and, per opening rule, the target search's packing
  /// as built and reassigned longest first. They are polished fastest first, each only if
  /// it starts faster than the best polished plan so far (a slower start rarely
  /// overtakes it, and polishing is most of the time); the best then goes through the
  /// structure hill climb. Infeasible when no start is feasible.
  Solution solve();

 private:
  Seconds item_s(std::size_t item, std::size_t k) const { return item_s_[item * degrees_ + k]; }
  /// item_s() for every degree index (infinity below the item's minimum degree).
  std::span<const Seconds> item_times_s(std::size_t item) const {
    return std::span<const Seconds>(item_s_).subspan(item * degrees_, degrees_);
  }
  Tokens length(std::size_t item) const { return problem_.lengths_tokens[item]; }
  int degree(std::size_t k) const { return costs_.at(k).degree; }
  bool can_hold(std::size_t k, Tokens tokens, std::size_t item) const {
    return k >= min_degree_index_[item] && tokens + length(item) <= costs_.at(k).capacity_tokens;
  }
  /// The order of a group's items in the local search.
  bool shorter(std::size_t a, std::size_t b) const {
    return length(a) < length(b) || (length(a) == length(b) && a < b);
  }

  Solution to_solution(const WorkPlan& plan) const;

  /// Recomputes a group's time and tokens from its items (no drift from many updates).
  void refresh(WorkGroup& group) const;

  // ---- assignment onto a fixed structure (flexsp_fast.cpp) ----

  /// The best of homogeneous_solutions()'s plans, built as assign_longest_first() on N/d
  /// groups of each degree d (the same choices: least loaded group with room, ties
  /// lowest). A degree whose makespan cannot beat the best so far (its longest sequence
  /// alone, or its mean group time, is no faster) is not built. Empty if none is feasible.
  std::optional<WorkPlan> best_homogeneous() const;

  /// Sequences longest first, each to the group where it finishes earliest (ties: lowest
  /// group), except that when every GPU must be used and only as many sequences remain
  /// as groups are empty, each goes to an empty group. Groups left empty return their
  /// ranks. Empty if a sequence fits no group.
  std::optional<WorkPlan> assign_longest_first(const std::vector<std::size_t>& structure) const;

  // ---- target search (flexsp_fast.cpp) ----

  /// Share of the ranks the sequences' GPU time needs at this target, each at its
  /// cheapest degree meeting it alone: a group of degree d spends at most d * (target -
  /// fixed_s) on its sequences, so at or above the makespan this is <= 1.
  double work_share(Seconds target_s) const;

  /// Packs every sequence, longest first, into groups of at most `target_s` each: into the
  /// open group where it costs the least GPU time (first fit within a degree), else into
  /// a new group whose degree the opening rule picks. False when a sequence meets the
  /// target at no degree or the groups need more than the ranks.
  bool pack_at_target(Seconds target_s, Opening opening, Packing& packing);

  /// The plan a packing describes.
  WorkPlan plan_of(const Packing& packing) const;

  /// The least share of GPUs an item needs at this target: degree times the larger of its
  /// time and token fractions of one group, at its best degree. Memoised per packing.
  double area(std::size_t item, Seconds target_s);

  /// The degree of a new group for the sequence at `position` (kNone if none meets the
  /// target): `cheapest` takes the least degree * sequence_s / (target - fixed_s);
  /// `fullest` fills a group of each degree with the sequence and, first fit, the next
  /// kLookaheadSequences, and takes the degree whose group covers the most GPU share
  /// (area()) per rank, since groups that the sequences fill badly waste ranks.
  std::size_t opening_degree(std::size_t position, Seconds target_s, Opening opening);

  /// A target above any group's possible time (every fixed cost plus every sequence at its
  /// slowest degree): there only the tokens limit a packing.
  Seconds untimed_target_s() const;

  /// A lower bound on the makespan: each sequence alone at its best degree, and the
  /// least target (to kTargetPrecision, below `high_s`) at which work_share() <= 1.
  Seconds makespan_bound_s(Seconds high_s) const;

  /// The least target (to kTargetPrecision) whose packing fits the ranks, between the
  /// lower bound and `limit_s`: from the guess, down or up in doubling steps until the
  /// packing changes from fitting to not, then bisected. Returns that packing's plan and
  /// target; nothing if no target up to the limit fits.
  std::optional<std::pair<WorkPlan, Seconds>> search_target(Opening opening, Seconds bound_s,
                                                            Seconds guess_s, Seconds limit_s);

  // ---- structure search (flexsp_fast_search.cpp) ----

  /// Groups per degree index.
  std::vector<int> structure_of(const WorkPlan& plan) const;

  /// The structures one change away: two groups of a degree merged into one of twice
  /// it; one split into two of half; one promoted with ranks from the free ones, then
  /// from the smallest groups (two 1-way groups make a 2-way group a 4-way one); one
  /// group added on free ranks, or removed.
  std::vector<std::vector<int>> neighbours_of(const std::vector<int>& counts,
                                              int free_ranks) const;

  /// Hill climbing over structures: each neighbour of the best plan's structure is
  /// assigned longest first and polished; the first that beats the plan replaces it.
  /// Stops when none does or when the work spent, counted as sequences times (1 +
  /// local-search steps) per neighbour, would pass kStructureWork (a deterministic budget:
  /// small micro-batches, where the structure matters most, get many neighbours, large
  /// ones few or none).
  void search_structures(WorkPlan& best) const;

  // ---- local search (flexsp_fast_search.cpp) ----

  /// Polishes the plan and, when every GPU must be used, hands out the ranks it left free
  /// and polishes again. Returns the local-search steps taken; nothing if the free ranks
  /// cannot be handed out.
  std::optional<std::size_t> finish(WorkPlan& plan) const;

  /// One candidate change to the slowest group; applied only if `value_s`, the largest
  /// time among the groups it touches, is below the makespan.
  struct Move {
    enum class Kind { none, move, swap, new_group, promote, merge, split } kind = Kind::none;
    Seconds value_s = std::numeric_limits<Seconds>::infinity();
    std::size_t position = 0;        ///< of the item in the slowest group
    std::size_t other = 0;           ///< the other group (move, swap, merge)
    std::size_t other_position = 0;  ///< of the swapped item in the other group
    std::size_t degree_index = 0;    ///< of the new group
  };

  /// Repeatedly improves the slowest group (ties: the lowest index) by the best of: moving
  /// one of its sequences to another group or to a new group on free ranks; swapping one
  /// with a shorter sequence of another group; promoting it to twice the degree on free
  /// ranks, or merged with another group of its degree; splitting it into two groups of
  /// half the degree. Stops when none brings it below the makespan. When every GPU must
  /// be used, no move frees ranks (emptying a group would only shift the cost to
  /// whoever takes its ranks back).
  std::size_t polish(WorkPlan& plan) const;

  /// The best change of the slowest group: swaps are tried only when no cheaper move
  /// brings it below the makespan (they cost a pass over every group).
  Move best_move(const WorkPlan& plan, std::size_t slowest) const;

  /// Swaps of a sequence of the slowest group with a shorter one of another group. Those
  /// that fit both groups are a range of lengths, hence of positions in the other group,
  /// and along it the slowest group's new time rises while the other's falls, so the best
  /// is at their crossing. A swap never leaves the other group faster than it was, so
  /// groups at or above the best value so far are skipped.
  void offer_swaps(const WorkPlan& plan, std::size_t slowest, Move& best) const;

  Seconds group_time_s(const std::vector<std::size_t>& items, std::size_t k) const;

  /// The group's sequences over two groups of half its degree, longest first to the
  /// less loaded one; empty if they do not fit.
  std::optional<std::pair<WorkGroup, WorkGroup>> split(const WorkGroup& group) const;

  /// Inserts an item into a group, keeping the order.
  void insert_item(WorkGroup& group, std::size_t item) const;

  void apply(WorkPlan& plan, std::size_t slowest, const Move& move) const;

  /// Hands the free ranks out one change at a time, each the one that leaves the least
  /// makespan (ties: the more ranks used, then the faster changed group): promote a group
  /// to twice its degree, or open a group on free ranks with one sequence taken from a
  /// group holding several. False if no change is possible.
  bool spend_free_ranks(WorkPlan& plan) const;

  const GroupCosts& costs_;
  const Problem& problem_;
  const std::size_t degrees_;
  const bool every_gpu_used_;
  std::vector<std::size_t> min_degree_index_;  ///< per item
  std::vector<Seconds> item_s_;         ///< [item * degrees_ + k]; infinite below the minimum
  std::vector<std::size_t> sequences_;  ///< item of each sequence, longest first
  // Scratch of pack_at_target, reused by every packing.
  std::vector<RoomTree> trees_;                  ///< per degree: rooms of its groups by slot
  std::vector<std::vector<std::size_t>> slots_;  ///< per degree: group of each slot
  std::vector<std::size_t> slot_of_group_;
  std::vector<Seconds> group_room_s_;
  std::vector<Tokens> group_room_tokens_;
  std::vector<double> area_;            ///< per item: area() and the target it
  std::vector<Seconds> area_target_s_;  ///< was computed for
};

}  // namespace ballast::strategies::flexsp::fast
