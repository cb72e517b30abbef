// FlexSP's fast planner (flexsp.hpp), the same group space and rules as the MILP without a
// solver: a search for the least target makespan at which a greedy packing fits the ranks
// picks how many groups of each degree to use; a local search around the slowest group
// polishes the plan, and a hill climb over the group structure refines small ones.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <queue>
#include <set>
#include <utility>

#include "ballast/error.hpp"
#include "flexsp.hpp"

namespace ballast::strategies::flexsp {

namespace {

/// Two times closer than this fraction of the makespan count as equal: a local-search
/// move must beat it, so rounding noise cannot make the search cycle.
constexpr double kRelativeTolerance = 1e-9;
/// The target search stops when its bracket is this narrow (relative); the local search
/// closes the rest (coarser brackets measurably lose quality, finer ones only time).
constexpr double kTargetPrecision = 1e-3;
/// The target search steps away from its first guess by this fraction, doubling: on
/// Wikipedia micro-batches the answer lies a median 0.9% (90th percentile 5%) above the
/// lower bound it starts from.
constexpr double kFirstTargetStep = 2e-3;
/// Sequences after the current one that the `fullest` rule judges a new group on.
constexpr std::size_t kLookaheadSequences = 32;
/// Budget of the structure hill climb, in sequence placements: each neighbour costs the
/// sequences times (1 + its local-search steps), and one is tried only while
/// kStepsPerNeighbour steps' worth is left: micro-batches of up to 2048 / 8 = 256
/// sequences get one neighbour or more, small ones (where the structure matters most)
/// dozens. On Wikipedia micro-batches of 16 and 64 GPUs this budget gets within 0.03% on
/// average of a 16x larger one, for under twice the time of no climb on small
/// micro-batches and no extra time on large ones.
constexpr std::size_t kStructureWork = 2048;
constexpr std::size_t kStepsPerNeighbour = 8;

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

Seconds makespan_of(const WorkPlan& plan) {
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

class FastPlanner {
 public:
  FastPlanner(const GroupCosts& costs, const Problem& problem)
      : costs_(costs),
        problem_(problem),
        degrees_(costs.degree_count()),
        every_gpu_used_(every_gpu_used(costs, problem)) {
    const std::size_t items = problem.lengths_tokens.size();
    min_degree_index_.resize(items);
    item_s_.assign(items * degrees_, std::numeric_limits<Seconds>::infinity());
    for (std::size_t item = 0; item < items; ++item) {
      const Tokens length = problem.lengths_tokens[item];
      min_degree_index_[item] = costs.min_degree_index(length);
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        item_s_[item * degrees_ + k] = costs.sequence_s(length, k);
      }
      sequences_.insert(sequences_.end(), static_cast<std::size_t>(problem.counts[item]), item);
    }
    area_.resize(items);
    area_target_s_.assign(items, -1.0);
    // Longest first (ties: item index), the order of every greedy pass.
    std::stable_sort(sequences_.begin(), sequences_.end(), [&](std::size_t a, std::size_t b) {
      return problem.lengths_tokens[a] > problem.lengths_tokens[b];
    });
  }

  /// Starts: the best homogeneous plan and, per opening rule, the target search's packing
  /// as built and reassigned longest first. They are polished fastest first, each only if
  /// it starts faster than the best polished plan so far (a slower start rarely
  /// overtakes it, and polishing is most of the time); the best then goes through the
  /// structure hill climb. Infeasible when no start is feasible.
  Solution solve() {
    std::vector<WorkPlan> starts;
    std::optional<Solution> homogeneous_solution;
    Seconds limit_s = untimed_target_s();
    if (std::optional<WorkPlan> homogeneous = best_homogeneous()) {
      homogeneous_solution = to_solution(*homogeneous);
      limit_s = makespan_of(*homogeneous);
      starts.push_back(std::move(*homogeneous));
    }
    const Seconds bound_s = makespan_bound_s(limit_s);
    Seconds guess_s = bound_s;
    Packing packing;
    for (Opening opening : {Opening::cheapest, Opening::fullest}) {
      // Without a homogeneous plan the limit is where targets stop mattering; a packing
      // that fails there fails everywhere.
      if (!homogeneous_solution && !pack_at_target(limit_s, opening, packing)) continue;
      std::optional<std::pair<WorkPlan, Seconds>> packed =
          search_target(opening, bound_s, guess_s, limit_s);
      if (!packed) continue;
      // The fullest rule (second) is worth a start only where it packs tighter.
      guess_s = limit_s = packed->second;
      std::vector<std::size_t> structure;
      for (const WorkGroup& group : packed->first.groups) structure.push_back(group.degree_index);
      if (std::optional<WorkPlan> reassigned = assign_longest_first(structure)) {
        starts.push_back(std::move(*reassigned));
      }
      starts.push_back(std::move(packed->first));
    }
    std::stable_sort(starts.begin(), starts.end(), [](const WorkPlan& a, const WorkPlan& b) {
      return makespan_of(a) < makespan_of(b);
    });
    std::optional<WorkPlan> best;
    for (WorkPlan& plan : starts) {
      if (best && makespan_of(plan) >= makespan_of(*best)) break;
      if (finish(plan) &&
          (!best || makespan_of(plan) < makespan_of(*best) * (1 - kRelativeTolerance))) {
        best = std::move(plan);
      }
    }
    if (!best) return {};
    search_structures(*best);
    Solution solution = to_solution(*best);
    // Makespans here sum a group's times in another order than makespan_s(): a tie with
    // the homogeneous plan must not be lost to rounding.
    if (homogeneous_solution && homogeneous_solution->makespan_s <= solution.makespan_s) {
      solution = std::move(*homogeneous_solution);
    }
    const std::string violation = check_solution(costs_, problem_, solution);
    BALLAST_CHECK(violation.empty(), "solve_fast broke FlexSP's rules: " + violation);
    return solution;
  }

 private:
  Seconds item_s(std::size_t item, std::size_t k) const { return item_s_[item * degrees_ + k]; }
  Tokens length(std::size_t item) const { return problem_.lengths_tokens[item]; }
  int degree(std::size_t k) const { return costs_.at(k).degree; }
  bool can_hold(std::size_t k, Tokens tokens, std::size_t item) const {
    return k >= min_degree_index_[item] && tokens + length(item) <= costs_.at(k).capacity_tokens;
  }
  /// The order of a group's items in the local search.
  bool shorter(std::size_t a, std::size_t b) const {
    return length(a) < length(b) || (length(a) == length(b) && a < b);
  }

  Solution to_solution(const WorkPlan& plan) const {
    Solution solution;
    for (const WorkGroup& group : plan.groups) {
      SolvedGroup solved{group.degree_index, group.items};
      std::sort(solved.items.begin(), solved.items.end());
      solution.groups.push_back(std::move(solved));
    }
    solution.makespan_s = makespan_s(costs_, problem_, solution.groups);
    return solution;
  }

  /// Recomputes a group's time and tokens from its items (no drift from many updates).
  void refresh(WorkGroup& group) const {
    group.time_s = costs_.at(group.degree_index).fixed_s;
    group.tokens = 0;
    for (std::size_t item : group.items) {
      group.time_s += item_s(item, group.degree_index);
      group.tokens += length(item);
    }
  }

  // ---- assignment onto a fixed structure ----

  /// The best of homogeneous_solutions()'s plans, built as assign_longest_first() on N/d
  /// groups of each degree d (the same choices: least loaded group with room, ties
  /// lowest). A degree whose makespan cannot beat the best so far (its longest sequence
  /// alone, or its mean group time, is no faster) is not built. Empty if none is feasible.
  std::optional<WorkPlan> best_homogeneous() const {
    std::size_t needed = 0;
    for (std::size_t k : min_degree_index_) needed = std::max(needed, k);
    std::vector<std::pair<Seconds, std::size_t>> bounds;  // (lower bound, degree index)
    for (std::size_t k = needed; k < degrees_; ++k) {
      const auto groups = static_cast<std::size_t>(costs_.ranks() / degree(k));
      if (every_gpu_used_ && sequences_.size() < groups) continue;
      Seconds longest_s = 0, total_s = 0;
      for (std::size_t item = 0; item < min_degree_index_.size(); ++item) {
        longest_s = std::max(longest_s, item_s(item, k));
        total_s += item_s(item, k) * static_cast<double>(problem_.counts[item]);
      }
      const Seconds mean_s = total_s / static_cast<double>(groups);
      bounds.push_back({costs_.at(k).fixed_s + std::max(longest_s, mean_s), k});
    }
    std::stable_sort(bounds.begin(), bounds.end());
    std::optional<WorkPlan> best;
    for (const auto& [bound_s, k] : bounds) {
      if (best && bound_s >= makespan_of(*best)) break;
      const auto groups = static_cast<std::size_t>(costs_.ranks() / degree(k));
      std::optional<WorkPlan> plan = assign_longest_first(std::vector<std::size_t>(groups, k));
      if (!plan || (every_gpu_used_ && plan->free_ranks > 0)) continue;
      if (!best || makespan_of(*plan) < makespan_of(*best)) best = std::move(plan);
    }
    return best;
  }

  /// Sequences longest first, each to the group where it finishes earliest (ties: lowest
  /// group), except that when every GPU must be used and only as many sequences remain
  /// as groups are empty, each goes to an empty group. Groups left empty return their
  /// ranks. Empty if a sequence fits no group.
  std::optional<WorkPlan> assign_longest_first(const std::vector<std::size_t>& structure) const {
    WorkPlan plan;
    plan.free_ranks = costs_.ranks();
    // Per degree, the groups by (time, index): the least loaded one with room is the
    // only candidate of its degree; entries older than their group's time are dropped
    // when met. Groups without room for the current length wait, by room, until the
    // lengths (longest first) come down to it: each group waits at most once per sequence
    // it takes.
    using Entry = std::pair<Seconds, std::size_t>;
    using MinHeap = std::priority_queue<Entry, std::vector<Entry>, std::greater<>>;
    using Waiting = std::priority_queue<std::pair<Tokens, std::size_t>>;
    std::vector<MinHeap> least(degrees_);
    std::vector<Waiting> waiting(degrees_);
    for (std::size_t k : structure) {
      least[k].push({costs_.at(k).fixed_s, plan.groups.size()});
      plan.groups.push_back({k, costs_.at(k).fixed_s, 0, {}});
      plan.free_ranks -= degree(k);
    }
    std::size_t empty_groups = structure.size();
    for (std::size_t position = 0; position < sequences_.size(); ++position) {
      const std::size_t item = sequences_[position];
      const bool fill_empty = every_gpu_used_ && sequences_.size() - position <= empty_groups;
      std::size_t chosen_k = GroupCosts::kNone;
      Entry chosen{std::numeric_limits<Seconds>::infinity(), 0};
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        const Tokens capacity = costs_.at(k).capacity_tokens;
        while (!waiting[k].empty() && waiting[k].top().first >= length(item)) {
          const std::size_t g = waiting[k].top().second;
          waiting[k].pop();
          least[k].push({plan.groups[g].time_s, g});
        }
        while (!least[k].empty()) {
          const auto [time_s, g] = least[k].top();
          if (plan.groups[g].time_s == time_s && can_hold(k, plan.groups[g].tokens, item)) break;
          least[k].pop();
          if (plan.groups[g].time_s == time_s) {
            waiting[k].push({capacity - plan.groups[g].tokens, g});
          }
        }
        // An empty group has the least time of its degree (fixed_s), so it is on top.
        if (!least[k].empty() &&
            !(fill_empty && !plan.groups[least[k].top().second].items.empty())) {
          const Entry candidate{least[k].top().first + item_s(item, k), least[k].top().second};
          if (candidate < chosen) {
            chosen = candidate;
            chosen_k = k;
          }
        }
      }
      if (chosen_k == GroupCosts::kNone) return std::nullopt;
      least[chosen_k].push(chosen);
      WorkGroup& group = plan.groups[chosen.second];
      if (group.items.empty()) --empty_groups;
      group.items.push_back(item);
      group.time_s = chosen.first;
      group.tokens += length(item);
    }
    std::erase_if(plan.groups, [&](const WorkGroup& group) {
      if (!group.items.empty()) return false;
      plan.free_ranks += degree(group.degree_index);
      return true;
    });
    return plan;
  }

  // ---- target search ----

  /// Share of the ranks the sequences' GPU time needs at this target, each at its
  /// cheapest degree meeting it alone: a group of degree d spends at most d * (target -
  /// fixed_s) on its sequences, so at or above the makespan this is <= 1.
  double work_share(Seconds target_s) const {
    double ranks = 0;
    for (std::size_t item = 0; item < min_degree_index_.size(); ++item) {
      double share = std::numeric_limits<double>::infinity();
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        const Seconds room_s = target_s - costs_.at(k).fixed_s;
        if (item_s(item, k) <= room_s) {
          share = std::min(share, degree(k) * item_s(item, k) / room_s);
        }
      }
      ranks += share * static_cast<double>(problem_.counts[item]);
    }
    return ranks / costs_.ranks();
  }

  /// Packs every sequence, longest first, into groups of at most `target_s` each: into the
  /// open group where it costs the least GPU time (first fit within a degree), else into
  /// a new group whose degree the opening rule picks. False when a sequence meets the
  /// target at no degree or the groups need more than the ranks.
  bool pack_at_target(Seconds target_s, Opening opening, Packing& packing) {
    if (trees_.empty()) {
      for (std::size_t k = 0; k < degrees_; ++k) {
        trees_.emplace_back(static_cast<std::size_t>(costs_.ranks() / degree(k)));
        slots_.emplace_back();
      }
    }
    for (std::size_t k = 0; k < degrees_; ++k) {
      trees_[k].clear();
      slots_[k].clear();
    }
    packing.group_of_sequence.clear();
    packing.group_degree_index.clear();
    group_room_s_.clear();
    group_room_tokens_.clear();
    slot_of_group_.clear();
    int ranks_used = 0;
    for (std::size_t position = 0; position < sequences_.size(); ++position) {
      const std::size_t item = sequences_[position];
      std::size_t chosen = GroupCosts::kNone;
      double chosen_cost = std::numeric_limits<double>::infinity();
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        const std::size_t slot = trees_[k].find(item_s(item, k), length(item));
        const double gpu_s = degree(k) * item_s(item, k);
        if (slot != GroupCosts::kNone && gpu_s < chosen_cost) {
          chosen = slots_[k][slot];
          chosen_cost = gpu_s;
        }
      }
      if (chosen == GroupCosts::kNone) {
        const std::size_t k = opening_degree(position, target_s, opening);
        if (k == GroupCosts::kNone) return false;
        ranks_used += degree(k);
        if (ranks_used > costs_.ranks()) return false;
        chosen = packing.group_degree_index.size();
        packing.group_degree_index.push_back(k);
        group_room_s_.push_back(target_s - costs_.at(k).fixed_s);
        group_room_tokens_.push_back(costs_.at(k).capacity_tokens);
        slot_of_group_.push_back(slots_[k].size());
        slots_[k].push_back(chosen);
      }
      const std::size_t k = packing.group_degree_index[chosen];
      packing.group_of_sequence.push_back(chosen);
      group_room_s_[chosen] -= item_s(item, k);
      group_room_tokens_[chosen] -= length(item);
      trees_[k].set(slot_of_group_[chosen], group_room_s_[chosen], group_room_tokens_[chosen]);
    }
    return true;
  }

  /// The plan a packing describes.
  WorkPlan plan_of(const Packing& packing) const {
    WorkPlan plan;
    plan.free_ranks = costs_.ranks();
    for (std::size_t k : packing.group_degree_index) {
      plan.groups.push_back({k, 0, 0, {}});
      plan.free_ranks -= degree(k);
    }
    for (std::size_t position = 0; position < sequences_.size(); ++position) {
      plan.groups[packing.group_of_sequence[position]].items.push_back(sequences_[position]);
    }
    for (WorkGroup& group : plan.groups) refresh(group);
    return plan;
  }

  /// The least share of GPUs an item needs at this target: degree times the larger of its
  /// time and token fractions of one group, at its best degree. Memoised per packing.
  double area(std::size_t item, Seconds target_s) {
    if (area_target_s_[item] == target_s) return area_[item];
    area_target_s_[item] = target_s;
    area_[item] = std::numeric_limits<double>::infinity();
    for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
      const Seconds room_s = target_s - costs_.at(k).fixed_s;
      if (item_s(item, k) > room_s) continue;
      const double token_share =
          static_cast<double>(length(item)) / static_cast<double>(costs_.at(k).capacity_tokens);
      area_[item] =
          std::min(area_[item], degree(k) * std::max(item_s(item, k) / room_s, token_share));
    }
    return area_[item];
  }

  /// The degree of a new group for the sequence at `position` (kNone if none meets the
  /// target): `cheapest` takes the least degree * sequence_s / (target - fixed_s);
  /// `fullest` fills a group of each degree with the sequence and, first fit, the next
  /// kLookaheadSequences, and takes the degree whose group covers the most GPU share
  /// (area()) per rank, since groups that the sequences fill badly waste ranks.
  std::size_t opening_degree(std::size_t position, Seconds target_s, Opening opening) {
    const std::size_t item = sequences_[position];
    std::size_t best_k = GroupCosts::kNone;
    double best_cost = std::numeric_limits<double>::infinity();
    for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
      const Seconds room_s = target_s - costs_.at(k).fixed_s;
      const Tokens capacity = costs_.at(k).capacity_tokens;
      if (item_s(item, k) > room_s || length(item) > capacity) continue;
      double cost = degree(k) * item_s(item, k) / room_s;
      if (opening == Opening::fullest) {
        Seconds time_s = item_s(item, k);
        Tokens tokens = length(item);
        double covered = area(item, target_s);
        const std::size_t end = std::min(sequences_.size(), position + 1 + kLookaheadSequences);
        for (std::size_t next_position = position + 1; next_position < end; ++next_position) {
          const std::size_t next = sequences_[next_position];
          if (k < min_degree_index_[next] || time_s + item_s(next, k) > room_s ||
              tokens + length(next) > capacity) {
            continue;
          }
          time_s += item_s(next, k);
          tokens += length(next);
          covered += area(next, target_s);
        }
        cost = -covered / degree(k);
      }
      if (cost < best_cost) {
        best_k = k;
        best_cost = cost;
      }
    }
    return best_k;
  }

  /// A target above any group's possible time (every fixed cost plus every sequence at its
  /// slowest degree): there only the tokens limit a packing.
  Seconds untimed_target_s() const {
    Seconds target_s = 0;
    for (const DegreeCost& degree : costs_.degrees()) target_s = std::max(target_s, degree.fixed_s);
    for (std::size_t item : sequences_) {
      Seconds slowest_s = 0;
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        slowest_s = std::max(slowest_s, item_s(item, k));
      }
      target_s += slowest_s;
    }
    return target_s;
  }

  /// A lower bound on the makespan: each sequence alone at its best degree, and the
  /// least target (to kTargetPrecision, below `high_s`) at which work_share() <= 1.
  Seconds makespan_bound_s(Seconds high_s) const {
    Seconds low_s = 0;
    for (std::size_t item : sequences_) {
      Seconds alone_s = std::numeric_limits<Seconds>::infinity();
      for (std::size_t k = min_degree_index_[item]; k < degrees_; ++k) {
        alone_s = std::min(alone_s, costs_.at(k).fixed_s + item_s(item, k));
      }
      low_s = std::max(low_s, alone_s);
    }
    if (!(low_s < high_s) || work_share(low_s) <= 1) return low_s;
    while (high_s - low_s > kTargetPrecision * high_s) {
      const Seconds middle_s = 0.5 * (low_s + high_s);
      (work_share(middle_s) > 1 ? low_s : high_s) = middle_s;
    }
    return low_s;
  }

  /// The least target (to kTargetPrecision) whose packing fits the ranks, between the
  /// lower bound and `limit_s`: from the guess, down or up in doubling steps until the
  /// packing changes from fitting to not, then bisected. Returns that packing's plan and
  /// target; nothing if no target up to the limit fits.
  std::optional<std::pair<WorkPlan, Seconds>> search_target(Opening opening, Seconds bound_s,
                                                            Seconds guess_s, Seconds limit_s) {
    Packing trial, best;
    Seconds low_s = bound_s, high_s = limit_s;
    if (pack_at_target(guess_s, opening, best)) {
      high_s = guess_s;
      for (double step = kFirstTargetStep; high_s > bound_s; step *= 2) {
        const Seconds target_s = std::max(guess_s * (1 - step), bound_s);
        if (!pack_at_target(target_s, opening, trial)) {
          low_s = target_s;
          break;
        }
        std::swap(best, trial);
        high_s = target_s;
      }
    } else {
      low_s = guess_s;
      bool found = false;
      for (double step = kFirstTargetStep; !found; step *= 2) {
        const Seconds target_s = std::min(guess_s * (1 + step), limit_s);
        found = pack_at_target(target_s, opening, best);
        if (found) {
          high_s = target_s;
        } else if (target_s >= limit_s || !std::isfinite(target_s)) {
          return std::nullopt;
        } else {
          low_s = target_s;
        }
      }
    }
    while (high_s - low_s > kTargetPrecision * high_s) {
      const Seconds middle_s = 0.5 * (low_s + high_s);
      if (pack_at_target(middle_s, opening, trial)) {
        std::swap(best, trial);
        high_s = middle_s;
      } else {
        low_s = middle_s;
      }
    }
    return std::pair{plan_of(best), high_s};
  }

  // ---- structure search ----

  /// Groups per degree index.
  std::vector<int> structure_of(const WorkPlan& plan) const {
    std::vector<int> counts(degrees_, 0);
    for (const WorkGroup& group : plan.groups) ++counts[group.degree_index];
    return counts;
  }

  /// The structures one change away: two groups of a degree merged into one of twice
  /// it; one split into two of half; one promoted with ranks from the free ones, then
  /// from the smallest groups (two 1-way groups make a 2-way group a 4-way one); one
  /// group added on free ranks, or removed.
  std::vector<std::vector<int>> neighbours_of(const std::vector<int>& counts,
                                              int free_ranks) const {
    std::vector<std::vector<int>> neighbours;
    const int groups = std::accumulate(counts.begin(), counts.end(), 0);
    auto add = [&](std::vector<int> next) { neighbours.push_back(std::move(next)); };
    for (std::size_t k = 0; k < degrees_; ++k) {
      std::vector<int> next = counts;
      if (k + 1 < degrees_ && counts[k] >= 2) {
        next[k] -= 2;
        ++next[k + 1];
        add(std::exchange(next, counts));
      }
      if (k > 0 && counts[k] >= 1) {
        --next[k];
        next[k - 1] += 2;
        add(std::exchange(next, counts));
      }
      if (k + 1 < degrees_ && counts[k] >= 1) {
        --next[k];
        ++next[k + 1];
        int needed = degree(k) - std::min(degree(k), free_ranks);
        for (std::size_t j = 0; j <= k && needed > 0; ++j) {
          for (; next[j] > 0 && degree(j) <= needed; --next[j]) needed -= degree(j);
        }
        if (needed == 0) add(next);
        next = counts;
      }
      if (degree(k) <= free_ranks) {
        ++next[k];
        add(std::exchange(next, counts));
      }
      if (counts[k] >= 1 && groups > 1) {
        --next[k];
        add(std::move(next));
      }
    }
    return neighbours;
  }

  /// Hill climbing over structures: each neighbour of the best plan's structure is
  /// assigned longest first and polished; the first that beats the plan replaces it.
  /// Stops when none does or when the work spent, counted as sequences times (1 +
  /// local-search steps) per neighbour, would pass kStructureWork (a deterministic budget:
  /// small micro-batches, where the structure matters most, get many neighbours, large
  /// ones few or none).
  void search_structures(WorkPlan& best) const {
    std::set<std::vector<int>> seen = {structure_of(best)};
    std::size_t work = 0;
    for (bool improved = true; improved;) {
      improved = false;
      for (const std::vector<int>& next : neighbours_of(structure_of(best), best.free_ranks)) {
        if (!seen.insert(next).second) continue;
        if (work + kStepsPerNeighbour * sequences_.size() > kStructureWork) return;
        std::vector<std::size_t> structure;
        for (std::size_t k = 0; k < degrees_; ++k) {
          structure.insert(structure.end(), static_cast<std::size_t>(next[k]), k);
        }
        std::optional<WorkPlan> plan = assign_longest_first(structure);
        work += sequences_.size();
        if (!plan) continue;
        const std::optional<std::size_t> steps = finish(*plan);
        if (!steps) continue;
        work += sequences_.size() * *steps;
        seen.insert(structure_of(*plan));
        if (makespan_of(*plan) < makespan_of(best) * (1 - kRelativeTolerance)) {
          best = std::move(*plan);
          improved = true;
          break;
        }
      }
    }
  }

  // ---- local search ----

  /// Polishes the plan and, when every GPU must be used, hands out the ranks it left free
  /// and polishes again. Returns the local-search steps taken; nothing if the free ranks
  /// cannot be handed out.
  std::optional<std::size_t> finish(WorkPlan& plan) const {
    for (WorkGroup& group : plan.groups) {
      std::sort(group.items.begin(), group.items.end(),
                [&](std::size_t a, std::size_t b) { return shorter(a, b); });
    }
    std::size_t steps = polish(plan);
    if (!every_gpu_used_ || plan.free_ranks == 0) return steps;
    if (!spend_free_ranks(plan)) return std::nullopt;
    return steps + polish(plan);
  }

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
  std::size_t polish(WorkPlan& plan) const {
    const std::size_t max_steps =
        4 * (sequences_.size() + static_cast<std::size_t>(costs_.ranks()));
    for (std::size_t step = 0; step < max_steps && !plan.groups.empty(); ++step) {
      std::size_t slowest = 0;
      for (std::size_t g = 1; g < plan.groups.size(); ++g) {
        if (plan.groups[g].time_s > plan.groups[slowest].time_s) slowest = g;
      }
      const Move move = best_move(plan, slowest);
      if (!(move.value_s < plan.groups[slowest].time_s * (1 - kRelativeTolerance))) return step;
      apply(plan, slowest, move);
    }
    return max_steps;
  }

  /// The best change of the slowest group: swaps are tried only when no cheaper move
  /// brings it below the makespan (they cost a pass over every group).
  Move best_move(const WorkPlan& plan, std::size_t slowest) const {
    Move best;
    auto offer = [&](const Move& candidate) {
      if (candidate.value_s < best.value_s) best = candidate;
    };
    const WorkGroup& bottleneck = plan.groups[slowest];
    const std::size_t kb = bottleneck.degree_index;
    const bool alone = bottleneck.items.size() == 1;
    const int freed_ranks = alone ? degree(kb) : 0;
    for (std::size_t position = 0; position < bottleneck.items.size(); ++position) {
      const std::size_t item = bottleneck.items[position];
      // With its only sequence gone the group disappears (its ranks come free).
      const Seconds rest_s = alone ? 0 : bottleneck.time_s - item_s(item, kb);
      for (std::size_t g = 0; g < plan.groups.size() && !(alone && every_gpu_used_); ++g) {
        const WorkGroup& other = plan.groups[g];
        if (g == slowest || !can_hold(other.degree_index, other.tokens, item)) continue;
        offer({Move::Kind::move, std::max(rest_s, other.time_s + item_s(item, other.degree_index)),
               position, g});
      }
      for (std::size_t k = min_degree_index_[item];
           k < degrees_ && degree(k) <= plan.free_ranks + freed_ranks; ++k) {
        if (!can_hold(k, 0, item) || (every_gpu_used_ && degree(k) < freed_ranks)) continue;
        const Seconds value_s = std::max(rest_s, costs_.at(k).fixed_s + item_s(item, k));
        offer({Move::Kind::new_group, value_s, position, 0, 0, k});
      }
    }
    if (kb + 1 < degrees_ && bottleneck.tokens <= costs_.at(kb + 1).capacity_tokens) {
      const Seconds promoted_s = group_time_s(bottleneck.items, kb + 1);
      if (plan.free_ranks >= degree(kb)) offer({Move::Kind::promote, promoted_s});
      for (std::size_t g = 0; g < plan.groups.size() && promoted_s < best.value_s; ++g) {
        const WorkGroup& other = plan.groups[g];
        if (g == slowest || other.degree_index != kb ||
            bottleneck.tokens + other.tokens > costs_.at(kb + 1).capacity_tokens) {
          continue;
        }
        offer({Move::Kind::merge,
               promoted_s + group_time_s(other.items, kb + 1) - costs_.at(kb + 1).fixed_s, 0, g});
      }
    }
    if (kb > 0 && !alone) {
      if (std::optional<std::pair<WorkGroup, WorkGroup>> halves = split(bottleneck)) {
        offer({Move::Kind::split, std::max(halves->first.time_s, halves->second.time_s)});
      }
    }
    if (best.value_s < bottleneck.time_s * (1 - kRelativeTolerance)) return best;
    offer_swaps(plan, slowest, best);
    return best;
  }

  /// Swaps of a sequence of the slowest group with a shorter one of another group. Those
  /// that fit both groups are a range of lengths, hence of positions in the other group,
  /// and along it the slowest group's new time rises while the other's falls, so the best
  /// is at their crossing. A swap never leaves the other group faster than it was, so
  /// groups at or above the best value so far are skipped.
  void offer_swaps(const WorkPlan& plan, std::size_t slowest, Move& best) const {
    const WorkGroup& bottleneck = plan.groups[slowest];
    const std::size_t kb = bottleneck.degree_index;
    for (std::size_t position = 0; position < bottleneck.items.size(); ++position) {
      const std::size_t item = bottleneck.items[position];
      if (position > 0 && item == bottleneck.items[position - 1]) continue;
      const Seconds rest_s = bottleneck.time_s - item_s(item, kb);
      const Tokens room_tokens = costs_.at(kb).capacity_tokens - (bottleneck.tokens - length(item));
      for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        const WorkGroup& other = plan.groups[g];
        const std::size_t k = other.degree_index;
        if (g == slowest || k < min_degree_index_[item] || other.time_s >= best.value_s) continue;
        const Seconds gained_s = other.time_s + item_s(item, k);
        const Tokens shortest = other.tokens + length(item) - costs_.at(k).capacity_tokens;
        const Tokens longest = std::min(length(item) - 1, room_tokens);
        const auto begin =
            std::partition_point(other.items.begin(), other.items.end(),
                                 [&](std::size_t j) { return length(j) < shortest; });
        const auto end = std::partition_point(begin, other.items.end(),
                                              [&](std::size_t j) { return length(j) <= longest; });
        const auto crossing = std::partition_point(begin, end, [&](std::size_t j) {
          return rest_s + item_s(j, kb) < gained_s - item_s(j, k);
        });
        for (auto at = crossing == begin ? crossing : crossing - 1; at != end && at <= crossing;
             ++at) {
          const Seconds value_s = std::max(rest_s + item_s(*at, kb), gained_s - item_s(*at, k));
          if (value_s < best.value_s) {
            best = {Move::Kind::swap, value_s, position, g,
                    static_cast<std::size_t>(at - other.items.begin())};
          }
        }
      }
    }
  }

  Seconds group_time_s(const std::vector<std::size_t>& items, std::size_t k) const {
    Seconds time_s = costs_.at(k).fixed_s;
    for (std::size_t item : items) time_s += item_s(item, k);
    return time_s;
  }

  /// The group's sequences over two groups of half its degree, longest first to the
  /// less loaded one; empty if they do not fit.
  std::optional<std::pair<WorkGroup, WorkGroup>> split(const WorkGroup& group) const {
    const std::size_t k = group.degree_index - 1;
    WorkGroup halves[2] = {{k, costs_.at(k).fixed_s, 0, {}}, {k, costs_.at(k).fixed_s, 0, {}}};
    for (auto it = group.items.rbegin(); it != group.items.rend(); ++it) {
      const std::size_t item = *it;
      const int first = halves[1].time_s < halves[0].time_s ? 1 : 0;
      int chosen = -1;
      for (int h : {first, 1 - first}) {
        if (chosen < 0 && can_hold(k, halves[h].tokens, item)) chosen = h;
      }
      if (chosen < 0) return std::nullopt;
      halves[chosen].items.push_back(item);
      halves[chosen].time_s += item_s(item, k);
      halves[chosen].tokens += length(item);
    }
    if (halves[1].items.empty()) return std::nullopt;
    for (WorkGroup& half : halves) std::reverse(half.items.begin(), half.items.end());
    return std::pair{std::move(halves[0]), std::move(halves[1])};
  }

  /// Inserts an item into a group, keeping the order.
  void insert_item(WorkGroup& group, std::size_t item) const {
    group.items.insert(
        std::upper_bound(group.items.begin(), group.items.end(), item,
                         [&](std::size_t a, std::size_t b) { return shorter(a, b); }),
        item);
  }

  void apply(WorkPlan& plan, std::size_t slowest, const Move& move) const {
    WorkGroup& bottleneck = plan.groups[slowest];
    const std::size_t kb = bottleneck.degree_index;
    const auto at = [](std::vector<std::size_t>& items, std::size_t position) {
      return items.begin() + static_cast<std::ptrdiff_t>(position);
    };
    switch (move.kind) {
      case Move::Kind::none:
        return;
      case Move::Kind::move:
      case Move::Kind::new_group: {
        const std::size_t item = bottleneck.items[move.position];
        bottleneck.items.erase(at(bottleneck.items, move.position));
        std::size_t target = move.other;
        if (move.kind == Move::Kind::new_group) {
          target = plan.groups.size();
          plan.groups.push_back({move.degree_index, 0, 0, {}});
          plan.free_ranks -= degree(move.degree_index);
        }
        insert_item(plan.groups[target], item);
        refresh(plan.groups[target]);
        refresh(plan.groups[slowest]);
        break;
      }
      case Move::Kind::swap: {
        WorkGroup& other = plan.groups[move.other];
        const std::size_t item = bottleneck.items[move.position];
        const std::size_t swapped = other.items[move.other_position];
        bottleneck.items.erase(at(bottleneck.items, move.position));
        other.items.erase(at(other.items, move.other_position));
        insert_item(bottleneck, swapped);
        insert_item(other, item);
        refresh(bottleneck);
        refresh(other);
        break;
      }
      case Move::Kind::promote:
        plan.free_ranks -= degree(kb);
        bottleneck.degree_index = kb + 1;
        refresh(bottleneck);
        break;
      case Move::Kind::merge: {
        std::vector<std::size_t>& items = plan.groups[move.other].items;
        const std::size_t middle = bottleneck.items.size();
        bottleneck.items.insert(bottleneck.items.end(), items.begin(), items.end());
        std::inplace_merge(bottleneck.items.begin(), at(bottleneck.items, middle),
                           bottleneck.items.end(),
                           [&](std::size_t a, std::size_t b) { return shorter(a, b); });
        bottleneck.degree_index = kb + 1;
        refresh(bottleneck);
        items.clear();
        break;
      }
      case Move::Kind::split: {
        std::optional<std::pair<WorkGroup, WorkGroup>> halves = split(bottleneck);
        plan.groups[slowest] = std::move(halves->first);
        plan.groups.push_back(std::move(halves->second));
        break;
      }
    }
    // A group emptied by a move disappears; merged groups keep their ranks in the
    // promoted group, any other emptied group frees its ranks.
    std::erase_if(plan.groups, [&](const WorkGroup& group) {
      if (!group.items.empty()) return false;
      if (move.kind != Move::Kind::merge) plan.free_ranks += degree(group.degree_index);
      return true;
    });
  }

  /// Hands the free ranks out one change at a time, each the one that leaves the least
  /// makespan (ties: the more ranks used, then the faster changed group): promote a group
  /// to twice its degree, or open a group on free ranks with one sequence taken from a
  /// group holding several. False if no change is possible.
  bool spend_free_ranks(WorkPlan& plan) const {
    while (plan.free_ranks > 0) {
      // The two largest times give the makespan of the groups a change leaves alone.
      std::size_t first = GroupCosts::kNone;
      Seconds second_s = 0;
      for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        const Seconds time_s = plan.groups[g].time_s;
        if (first == GroupCosts::kNone || time_s > plan.groups[first].time_s) {
          if (first != GroupCosts::kNone) second_s = plan.groups[first].time_s;
          first = g;
        } else {
          second_s = std::max(second_s, time_s);
        }
      }
      struct Change {
        Seconds makespan_s = std::numeric_limits<Seconds>::infinity();
        int ranks = 0;
        Seconds changed_s = 0;
        std::size_t group = 0;
        std::size_t position = GroupCosts::kNone;  ///< kNone: promote `group`
        std::size_t degree_index = 0;              ///< of the opened group
      } best;
      auto offer = [&](const Change& change) {
        if (change.makespan_s < best.makespan_s ||
            (change.makespan_s == best.makespan_s &&
             (change.ranks > best.ranks ||
              (change.ranks == best.ranks && change.changed_s < best.changed_s)))) {
          best = change;
        }
      };
      for (std::size_t g = 0; g < plan.groups.size(); ++g) {
        const WorkGroup& group = plan.groups[g];
        const Seconds others_s = g == first ? second_s : plan.groups[first].time_s;
        const std::size_t kg = group.degree_index;
        if (kg + 1 < degrees_ && degree(kg) <= plan.free_ranks &&
            group.tokens <= costs_.at(kg + 1).capacity_tokens) {
          const Seconds promoted_s = group_time_s(group.items, kg + 1);
          offer({std::max(others_s, promoted_s), degree(kg), promoted_s, g});
        }
        if (group.items.size() < 2) continue;
        for (std::size_t position = 0; position < group.items.size(); ++position) {
          const std::size_t item = group.items[position];
          const Seconds rest_s = group.time_s - item_s(item, kg);
          for (std::size_t k = 0; k < degrees_ && degree(k) <= plan.free_ranks; ++k) {
            if (!can_hold(k, 0, item)) continue;
            const Seconds changed_s = std::max(rest_s, costs_.at(k).fixed_s + item_s(item, k));
            offer({std::max(others_s, changed_s), degree(k), changed_s, g, position, k});
          }
        }
      }
      if (best.makespan_s == std::numeric_limits<Seconds>::infinity()) return false;
      WorkGroup& group = plan.groups[best.group];
      plan.free_ranks -= best.ranks;
      if (best.position == GroupCosts::kNone) {
        ++group.degree_index;
        refresh(group);
        continue;
      }
      const std::size_t item = group.items[best.position];
      group.items.erase(group.items.begin() + static_cast<std::ptrdiff_t>(best.position));
      refresh(group);
      WorkGroup opened{best.degree_index, 0, 0, {item}};
      refresh(opened);
      plan.groups.push_back(std::move(opened));
    }
    return true;
  }

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

}  // namespace

Solution solve_fast(const GroupCosts& costs, const Problem& problem) {
  BALLAST_CHECK(problem.lengths_tokens.size() == problem.counts.size(),
                "one count per item length");
  if (problem.lengths_tokens.empty()) return {};
  for (std::size_t item = 0; item < problem.lengths_tokens.size(); ++item) {
    BALLAST_CHECK(problem.lengths_tokens[item] >= 1 && problem.counts[item] >= 1,
                  "item lengths and counts >= 1");
    if (costs.min_degree_index(problem.lengths_tokens[item]) == GroupCosts::kNone) return {};
  }
  return FastPlanner(costs, problem).solve();
}

}  // namespace ballast::strategies::flexsp
