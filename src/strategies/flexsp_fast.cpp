// The fast planner's construction (flexsp_fast.hpp): solve_fast, the starts (the best
// homogeneous plan and the target search's packings) and the choice among them.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "ballast/error.hpp"
#include "flexsp_fast.hpp"

namespace ballast::strategies::flexsp {

namespace fast {

namespace {

/// The target search stops when its bracket is this narrow (relative); the local search
/// closes the rest (coarser brackets measurably lose quality, finer ones only time).
constexpr double kTargetPrecision = 1e-3;
/// The target search steps away from its first guess by this fraction, doubling: on
/// Wikipedia micro-batches the answer lies a median 0.9% (90th percentile 5%) above the
/// lower bound it starts from.
constexpr double kFirstTargetStep = 2e-3;
/// Sequences after the current one that the `fullest` rule judges a new group on.
constexpr std::size_t kLookaheadSequences = 32;

}  // namespace

FastPlanner::FastPlanner(const GroupCosts& costs, const Problem& problem)
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

Solution FastPlanner::solve() {
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

Solution FastPlanner::to_solution(const WorkPlan& plan) const {
  Solution solution;
  for (const WorkGroup& group : plan.groups) {
    SolvedGroup solved{group.degree_index, group.items};
    std::sort(solved.items.begin(), solved.items.end());
    solution.groups.push_back(std::move(solved));
  }
  solution.makespan_s = makespan_s(costs_, problem_, solution.groups);
  return solution;
}

void FastPlanner::refresh(WorkGroup& group) const {
  group.time_s = costs_.at(group.degree_index).fixed_s;
  group.tokens = 0;
  for (std::size_t item : group.items) {
    group.time_s += item_s(item, group.degree_index);
    group.tokens += length(item);
  }
}

// ---- assignment onto a fixed structure ----

std::optional<WorkPlan> FastPlanner::best_homogeneous() const {
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

std::optional<WorkPlan> FastPlanner::assign_longest_first(
    const std::vector<std::size_t>& structure) const {
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

double FastPlanner::work_share(Seconds target_s) const {
  double ranks = 0;
  for (std::size_t item = 0; item < min_degree_index_.size(); ++item) {
    ranks += costs_.rank_share(item_times_s(item), target_s) * static_cast<double>(problem_.counts[item]);
  }
  return ranks / costs_.ranks();
}

bool FastPlanner::pack_at_target(Seconds target_s, Opening opening, Packing& packing) {
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

WorkPlan FastPlanner::plan_of(const Packing& packing) const {
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

double FastPlanner::area(std::size_t item, Seconds target_s) {
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

std::size_t FastPlanner::opening_degree(std::size_t position, Seconds target_s, Opening opening) {
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

Seconds FastPlanner::untimed_target_s() const {
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

Seconds FastPlanner::makespan_bound_s(Seconds high_s) const {
  Seconds low_s = 0;
  for (std::size_t item : sequences_) low_s = std::max(low_s, costs_.alone_s(item_times_s(item)));
  if (!(low_s < high_s) || work_share(low_s) <= 1) return low_s;
  while (high_s - low_s > kTargetPrecision * high_s) {
    const Seconds middle_s = 0.5 * (low_s + high_s);
    (work_share(middle_s) > 1 ? low_s : high_s) = middle_s;
  }
  return low_s;
}

std::optional<std::pair<WorkPlan, Seconds>> FastPlanner::search_target(
    Opening opening, Seconds bound_s, Seconds guess_s, Seconds limit_s) {
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

}  // namespace fast

Solution solve_fast(const GroupCosts& costs, const Problem& problem) {
  BALLAST_CHECK(problem.lengths_tokens.size() == problem.counts.size(),
                "one count per item length");
  if (problem.lengths_tokens.empty()) return {};
  for (std::size_t item = 0; item < problem.lengths_tokens.size(); ++item) {
    BALLAST_CHECK(problem.lengths_tokens[item] >= 1 && problem.counts[item] >= 1,
                  "item lengths and counts >= 1");
    if (costs.min_degree_index(problem.lengths_tokens[item]) == GroupCosts::kNone) return {};
  }
  return fast::FastPlanner(costs, problem).solve();
}

}  // namespace ballast::strategies::flexsp
