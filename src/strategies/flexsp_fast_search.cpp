// The fast planner's improvement (flexsp_fast.hpp): the local search around the slowest
// group that polishes every start, and the hill climb over the group structure.
#include <algorithm>
#include <cstddef>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "flexsp_fast.hpp"

namespace ballast::strategies::flexsp::fast {

namespace {

/// Budget of the structure hill climb, in sequence placements: each neighbour costs the
/// sequences times (1 + its local-search steps), and one is tried only while
/// kStepsPerNeighbour steps' worth is left: micro-batches of up to 2048 / 8 = 256
/// sequences get one neighbour or more, small ones (where the structure matters most)
/// dozens. On Wikipedia micro-batches of 16 and 64 GPUs this budget gets within 0.03% on
/// average of a 16x larger one, for under twice the time of no climb on small
/// micro-batches and no extra time on large ones.
constexpr std::size_t kStructureWork = 2048;
constexpr std::size_t kStepsPerNeighbour = 8;

}  // namespace

// ---- structure search ----

std::vector<int> FastPlanner::structure_of(const WorkPlan& plan) const {
  std::vector<int> counts(degrees_, 0);
  for (const WorkGroup& group : plan.groups) ++counts[group.degree_index];
  return counts;
}

std::vector<std::vector<int>> FastPlanner::neighbours_of(const std::vector<int>& counts,
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

void FastPlanner::search_structures(WorkPlan& best) const {
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

std::optional<std::size_t> FastPlanner::finish(WorkPlan& plan) const {
  for (WorkGroup& group : plan.groups) {
    std::sort(group.items.begin(), group.items.end(),
              [&](std::size_t a, std::size_t b) { return shorter(a, b); });
  }
  std::size_t steps = polish(plan);
  if (!every_gpu_used_ || plan.free_ranks == 0) return steps;
  if (!spend_free_ranks(plan)) return std::nullopt;
  return steps + polish(plan);
}

std::size_t FastPlanner::polish(WorkPlan& plan) const {
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

FastPlanner::Move FastPlanner::best_move(const WorkPlan& plan, std::size_t slowest) const {
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

void FastPlanner::offer_swaps(const WorkPlan& plan, std::size_t slowest, Move& best) const {
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

Seconds FastPlanner::group_time_s(const std::vector<std::size_t>& items, std::size_t k) const {
  Seconds time_s = costs_.at(k).fixed_s;
  for (std::size_t item : items) time_s += item_s(item, k);
  return time_s;
}

std::optional<std::pair<WorkGroup, WorkGroup>> FastPlanner::split(const WorkGroup& group) const {
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

void FastPlanner::insert_item(WorkGroup& group, std::size_t item) const {
  group.items.insert(
      std::upper_bound(group.items.begin(), group.items.end(), item,
                       [&](std::size_t a, std::size_t b) { return shorter(a, b); }),
      item);
}

void FastPlanner::apply(WorkPlan& plan, std::size_t slowest, const Move& move) const {
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

bool FastPlanner::spend_free_ranks(WorkPlan& plan) const {
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

}  // namespace ballast::strategies::flexsp::fast
