// Rank queues: effective_queues() (explicit, or each rank's groups in index order) and the
// queue checks of validate(): one queue per rank listing its groups, no deadlock between ranks.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "ballast/plan.hpp"
#include "plan_internal.hpp"

namespace ballast {
namespace {

using Violation = std::optional<std::string>;

/// A rank's explicit queue against the groups that contain it (`expected`, ascending).
Violation check_rank_queue(std::size_t m, int rank, const std::vector<int>& queue,
                           const std::vector<int>& expected, std::size_t groups) {
  for (int entry : queue) {
    if (entry < 0 || static_cast<std::size_t>(entry) >= groups) {
      return fmt::format(
          "micro-batch {}: the queue of rank {} names group {}, but the "
          "micro-batch has {} groups",
          m, rank, entry, groups);
    }
  }
  std::vector<int> sorted = queue;
  std::sort(sorted.begin(), sorted.end());
  const auto duplicate = std::adjacent_find(sorted.begin(), sorted.end());
  if (duplicate != sorted.end()) {
    return fmt::format("micro-batch {}: the queue of rank {} lists group {} twice", m, rank,
                       *duplicate);
  }
  const auto mismatch =
      std::mismatch(sorted.begin(), sorted.end(), expected.begin(), expected.end());
  if (mismatch.first != sorted.end() &&
      (mismatch.second == expected.end() || *mismatch.first < *mismatch.second)) {
    return fmt::format(
        "micro-batch {}: the queue of rank {} lists group {}, which does not "
        "contain rank {}",
        m, rank, *mismatch.first, rank);
  }
  if (mismatch.second != expected.end()) {
    return fmt::format(
        "micro-batch {}: the queue of rank {} misses group {}, which contains "
        "rank {}",
        m, rank, *mismatch.second, rank);
  }
  return std::nullopt;
}

struct QueueEdge {
  int to_group = 0;
  int rank = 0;  ///< the lowest rank that runs the source group right before to_group
};

std::vector<std::vector<QueueEdge>> queue_graph(const std::vector<std::vector<int>>& queues,
                                                std::size_t groups) {
  std::vector<std::vector<QueueEdge>> edges(groups);
  for (std::size_t rank = 0; rank < queues.size(); ++rank) {
    const auto& queue = queues[rank];
    for (std::size_t i = 1; i < queue.size(); ++i) {
      edges[queue[i - 1]].push_back({queue[i], static_cast<int>(rank)});
    }
  }
  for (auto& out : edges) {  // one edge per target, keeping the lowest rank
    std::stable_sort(out.begin(), out.end(), [](const QueueEdge& a, const QueueEdge& b) {
      return a.to_group < b.to_group;
    });
    out.erase(std::unique(
                  out.begin(), out.end(),
                  [](const QueueEdge& a, const QueueEdge& b) { return a.to_group == b.to_group; }),
              out.end());
  }
  return edges;
}

struct CycleStep {
  int from_group = 0;
  int to_group = 0;
  int rank = 0;
};

std::string describe_deadlock(std::size_t m, const std::vector<CycleStep>& cycle) {
  if (cycle.size() == 2) {
    return fmt::format(
        "micro-batch {}: queues deadlock: rank {} runs group {} before group {} "
        "but rank {} runs {} before {}",
        m, cycle[0].rank, cycle[0].from_group, cycle[0].to_group, cycle[1].rank,
        cycle[1].from_group, cycle[1].to_group);
  }
  std::string text = fmt::format("micro-batch {}: queues deadlock:", m);
  for (std::size_t i = 0; i < cycle.size(); ++i) {
    text += fmt::format("{} rank {} runs group {} before group {}",
                        i == 0 ? "" : (i + 1 == cycle.size() ? ", and" : ","), cycle[i].rank,
                        cycle[i].from_group, cycle[i].to_group);
  }
  return text;
}

/// Iterative depth-first search (plans may hold thousands of groups); the first back
/// edge closes a cycle made of the search path from its target to its source.
std::optional<std::vector<CycleStep>> find_cycle(const std::vector<std::vector<QueueEdge>>& edges) {
  enum class Color { unvisited, on_path, done };
  std::vector<Color> color(edges.size(), Color::unvisited);
  struct Frame {
    int group = 0;
    std::size_t next_edge = 0;
    int entered_by_rank = -1;
  };
  for (std::size_t start = 0; start < edges.size(); ++start) {
    if (color[start] != Color::unvisited) continue;
    std::vector<Frame> path{{static_cast<int>(start), 0, -1}};
    color[start] = Color::on_path;
    while (!path.empty()) {
      Frame& top = path.back();
      if (top.next_edge == edges[top.group].size()) {
        color[top.group] = Color::done;
        path.pop_back();
        continue;
      }
      const QueueEdge edge = edges[top.group][top.next_edge++];
      if (color[edge.to_group] == Color::unvisited) {
        color[edge.to_group] = Color::on_path;
        path.push_back({edge.to_group, 0, edge.rank});
      } else if (color[edge.to_group] == Color::on_path) {
        std::vector<CycleStep> cycle;
        auto at = std::find_if(path.begin(), path.end(),
                               [&](const Frame& frame) { return frame.group == edge.to_group; });
        for (auto next = at + 1; next != path.end(); ++at, ++next) {
          cycle.push_back({at->group, next->group, next->entered_by_rank});
        }
        cycle.push_back({path.back().group, edge.to_group, edge.rank});
        return cycle;
      }
    }
  }
  return std::nullopt;
}

}  // namespace

namespace plan_detail {

std::optional<std::string> check_queues(const Plan& plan) {
  const int ranks = plan.cluster.ranks();
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    const auto& micro_batch = plan.micro_batches[m];
    if (micro_batch.queues.empty()) continue;
    if (static_cast<std::int64_t>(micro_batch.queues.size()) != ranks) {
      return fmt::format(
          "micro-batch {}: queues has {} entries but the cluster has {} ranks; "
          "give one queue per rank, or none",
          m, micro_batch.queues.size(), ranks);
    }
    const auto expected = default_queues(micro_batch, ranks);
    for (int rank = 0; rank < ranks; ++rank) {
      if (auto violation = check_rank_queue(m, rank, micro_batch.queues[rank], expected[rank],
                                            micro_batch.groups.size())) {
        return violation;
      }
    }
    if (auto cycle = find_cycle(queue_graph(micro_batch.queues, micro_batch.groups.size()))) {
      return describe_deadlock(m, *cycle);
    }
  }
  return std::nullopt;
}

std::vector<std::vector<int>> default_queues(const MicroBatch& micro_batch, int ranks) {
  std::vector<std::vector<int>> queues(static_cast<std::size_t>(std::max(ranks, 0)));
  for (std::size_t index = 0; index < micro_batch.groups.size(); ++index) {
    for (int rank : micro_batch.groups[index].ranks) {
      if (rank < 0 || rank >= ranks) continue;  // reported by validate()
      auto& queue = queues[rank];
      // A rank listed twice in one group (an invalid plan) still runs the group once.
      if (queue.empty() || queue.back() != static_cast<int>(index)) {
        queue.push_back(static_cast<int>(index));
      }
    }
  }
  return queues;
}

}  // namespace plan_detail

std::vector<std::vector<int>> effective_queues(const MicroBatch& micro_batch, int ranks) {
  if (!micro_batch.queues.empty()) return micro_batch.queues;
  return plan_detail::default_queues(micro_batch, ranks);
}

}  // namespace ballast
