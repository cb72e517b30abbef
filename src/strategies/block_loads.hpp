// Least-loaded buddy-aligned blocks of ranks (hybrid-dp's placement); a header of its own
// so that tests/strategies/test_block_loads.cpp can compare it with the plain scan.
#pragma once

#include <algorithm>
#include <cstddef>
#include <set>
#include <utility>
#include <vector>

namespace ballast::strategies {

/// Per-rank proxy loads with, for every power-of-two block size, the buddy-aligned blocks
/// ordered by their maximum load: the least-loaded block of a size is found in O(log
/// blocks) and charging a block of d ranks updates O(d + log ranks) block maxima, instead
/// of scanning every block of the cluster per sequence (10^5 sequences x 4,096 ranks took
/// seconds). Block maxima are recomputed from their halves, so they equal a scan's
/// max_element bit for bit.
class BlockLoads {
 public:
  explicit BlockLoads(int ranks) {
    for (int size = 1; size <= ranks; size *= 2) {
      const auto blocks = static_cast<std::size_t>(ranks / size);  // full blocks only
      max_load_.emplace_back(blocks, 0.0);
      by_load_.emplace_back();
      for (std::size_t b = 0; b < blocks; ++b) by_load_.back().insert({0.0, b});
    }
  }

  /// First rank of the block of `degree` ranks with the least maximum load (ties: lowest).
  int least_loaded(int degree) const {
    return static_cast<int>(by_load_[level_of(degree)].begin()->second) * degree;
  }

  void charge(int first_rank, int degree, double load) {
    for (std::size_t level = 0; level < max_load_.size(); ++level) {
      const auto size = std::size_t{1} << level;
      const auto first = static_cast<std::size_t>(first_rank) / size;
      const auto last = (static_cast<std::size_t>(first_rank + degree) - 1) / size;
      for (std::size_t b = first; b <= last && b < max_load_[level].size(); ++b) {
        const double updated = level == 0 ? max_load_[0][b] + load
                                          : std::max(max_load_[level - 1][2 * b],
                                                     max_load_[level - 1][2 * b + 1]);
        by_load_[level].erase({max_load_[level][b], b});
        by_load_[level].insert({updated, b});
        max_load_[level][b] = updated;
      }
    }
  }

 private:
  static std::size_t level_of(int degree) {
    std::size_t level = 0;
    while ((1 << level) < degree) ++level;
    return level;
  }

  std::vector<std::vector<double>> max_load_;  ///< [level][block]: max over its ranks
  std::vector<std::set<std::pair<double, std::size_t>>> by_load_;  ///< [level]: (max, block)
};

}  // namespace ballast::strategies
