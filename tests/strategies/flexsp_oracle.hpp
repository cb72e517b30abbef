// The exact FlexSP optimum of a small micro-batch by exhaustive search, the slow
// reference the MILP and the fast planner are compared with: every multiset of allowed
// degrees that fits the rank rule, each solved by a subset DP over the sequences.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "ballast/error.hpp"
#include "flexsp.hpp"

namespace ballast::strategies::flexsp::testing {

namespace oracle_detail {

constexpr Seconds kInfinite = std::numeric_limits<Seconds>::infinity();

/// The search over group structures. Degrees are chosen non-increasing (a structure is a
/// multiset), and one DP level is computed per chosen group, so structures sharing a
/// prefix share its levels:
///   best[i][mask] = min over non-empty S within mask of max(best[i-1][mask \ S], time(S, k_i))
/// the least makespan of putting the sequences of `mask` into the first i groups.
class ExhaustiveSearch {
 public:
  ExhaustiveSearch(const GroupCosts& costs, const Problem& problem)
      : costs_(costs), problem_(problem), all_(every_gpu_used(costs, problem)) {
    for (std::size_t item = 0; item < problem.counts.size(); ++item) {
      sequences_.insert(sequences_.end(), static_cast<std::size_t>(problem.counts[item]), item);
    }
    full_ = (std::uint32_t{1} << sequences_.size()) - 1;
    const std::size_t masks = std::size_t{full_} + 1;
    // time_[k][mask]: fixed + sequence times summed in ascending item order, exactly as
    // makespan_s() sums them; infinite when the group breaks capacity or a minimum degree.
    time_.assign(costs.degree_count(), std::vector<Seconds>(masks, kInfinite));
    feasible_.resize(costs.degree_count());
    for (std::size_t k = 0; k < costs.degree_count(); ++k) {
      for (std::uint32_t mask = 1; mask <= full_; ++mask) {
        Seconds time_s = costs.at(k).fixed_s;
        Tokens tokens = 0;
        bool allowed = true;
        for (std::size_t i = 0; i < sequences_.size() && allowed; ++i) {
          if ((mask >> i & 1u) == 0) continue;
          const Tokens length = problem.lengths_tokens[sequences_[i]];
          allowed = costs.min_degree_index(length) <= k;
          tokens += length;
          time_s += costs.sequence_s(length, k);
        }
        if (allowed && tokens <= costs.at(k).capacity_tokens) {
          time_[k][mask] = time_s;
          feasible_[k].push_back(mask);
        }
      }
    }
  }

  Solution run() {
    if (sequences_.empty()) return {};
    std::vector<Seconds> empty(std::size_t{full_} + 1, kInfinite);
    empty[0] = 0;
    levels_.push_back({costs_.degree_count(), std::move(empty), {}});
    extend(costs_.ranks());
    Solution solution;
    if (best_groups_.empty()) return solution;
    solution.groups = best_groups_;
    solution.makespan_s = makespan_s(costs_, problem_, solution.groups);
    return solution;
  }

 private:
  struct Level {
    std::size_t degree_index = 0;       ///< of this level's group
    std::vector<Seconds> best;          ///< best[mask]
    std::vector<std::uint32_t> choice;  ///< the S that achieves best[mask]
  };

  /// Tries every next group of degree index <= the previous one within `ranks_left`.
  void extend(int ranks_left) {
    const Level& last = levels_.back();
    const bool structure_done = all_ ? ranks_left == 0 : levels_.size() > 1;
    if (structure_done && last.best[full_] < best_makespan_s_) record();
    if (levels_.size() > sequences_.size()) return;  // every group needs a sequence
    const std::size_t top = std::min(last.degree_index + 1, costs_.degree_count());
    for (std::size_t k = top; k-- > 0;) {
      if (costs_.at(k).degree > ranks_left) continue;
      levels_.push_back(next_level(levels_.back(), k));
      extend(ranks_left - costs_.at(k).degree);
      levels_.pop_back();
    }
  }

  /// Enumerates, for each group set S the degree can hold, every rest of the sequences
  /// left to the earlier groups: sum over feasible S of 2^(n - |S|), at most 3^n.
  Level next_level(const Level& previous, std::size_t k) const {
    Level level{k, std::vector<Seconds>(std::size_t{full_} + 1, kInfinite),
                std::vector<std::uint32_t>(std::size_t{full_} + 1, 0)};
    for (std::uint32_t group : feasible_[k]) {
      const Seconds group_s = time_[k][group];
      const std::uint32_t others = full_ & ~group;
      for (std::uint32_t rest = others;; rest = (rest - 1) & others) {
        const Seconds rest_s = previous.best[rest];
        const std::uint32_t mask = rest | group;
        if (rest_s != kInfinite && std::max(rest_s, group_s) < level.best[mask]) {
          level.best[mask] = std::max(rest_s, group_s);
          level.choice[mask] = group;
        }
        if (rest == 0) break;
      }
    }
    return level;
  }

  /// Walks the choices back from the full mask: one group per level.
  void record() {
    best_makespan_s_ = levels_.back().best[full_];
    best_groups_.clear();
    std::uint32_t mask = full_;
    for (std::size_t i = levels_.size() - 1; i > 0; --i) {
      const std::uint32_t group = levels_[i].choice[mask];
      SolvedGroup solved{levels_[i].degree_index, {}};
      for (std::size_t s = 0; s < sequences_.size(); ++s) {
        if (group >> s & 1u) solved.items.push_back(sequences_[s]);
      }
      best_groups_.push_back(std::move(solved));
      mask &= ~group;
    }
  }

  const GroupCosts& costs_;
  const Problem& problem_;
  const bool all_;
  std::vector<std::size_t> sequences_;  ///< item of each sequence, ascending
  std::uint32_t full_ = 0;
  std::vector<std::vector<Seconds>> time_;
  std::vector<std::vector<std::uint32_t>> feasible_;  ///< per degree, masks time_ allows
  std::vector<Level> levels_;                         ///< levels_[0]: no group yet
  Seconds best_makespan_s_ = kInfinite;
  std::vector<SolvedGroup> best_groups_;
};

}  // namespace oracle_detail

/// The least-makespan solution obeying check_solution()'s rules, found by trying every
/// structure; an infeasible Solution (no groups) when none exists. For up to 12
/// sequences and 16 ranks.
inline Solution solve_exhaustive(const GroupCosts& costs, const Problem& problem) {
  BALLAST_CHECK(problem.sequences() <= 12, "the exhaustive oracle takes at most 12 sequences");
  BALLAST_CHECK(costs.ranks() <= 16, "the exhaustive oracle takes at most 16 ranks");
  BALLAST_CHECK(problem.lengths_tokens.size() == problem.counts.size(),
                "one count per item length");
  return oracle_detail::ExhaustiveSearch(costs, problem).run();
}

}  // namespace ballast::strategies::flexsp::testing
