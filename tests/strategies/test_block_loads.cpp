// hybrid-dp's BlockLoads (src/strategies/block_loads.hpp) against the plain scan it
// replaced: after every charge, for every block size, the least-loaded buddy-aligned block
// (ties: lowest start) must be the one a scan over per-rank loads finds.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "block_loads.hpp"

namespace ballast::strategies {
namespace {

/// The reference: scan every aligned block of `degree` ranks, max_element over its ranks.
int scan_least_loaded(const std::vector<double>& load, int degree) {
  const int ranks = static_cast<int>(load.size());
  double best_load = 0;
  int best_start = -1;
  for (int start = 0; start + degree <= ranks; start += degree) {
    const double block_load =
        *std::max_element(load.begin() + start, load.begin() + start + degree);
    if (best_start < 0 || block_load < best_load) {
      best_load = block_load;
      best_start = start;
    }
  }
  return best_start;
}

TEST(BlockLoads, MatchesTheScanOnRandomPlacements) {
  std::mt19937_64 rng(20261129);
  int cases = 0;
  for (const int ranks : {1, 2, 3, 8, 10, 24, 64, 96, 512, 4096}) {
    for (int trial = 0; trial < 30; ++trial, ++cases) {
      std::vector<int> degrees;
      for (int d = 1; d <= ranks; d *= 2) degrees.push_back(d);
      BlockLoads fast(ranks);
      std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
      // Small integer loads make ties frequent; some trials use real-valued ones.
      std::uniform_int_distribution<int> small(0, 3);
      std::uniform_real_distribution<double> real(0.0, 1.0);
      const int placements = ranks <= 64 ? 200 : 60;
      for (int i = 0; i < placements; ++i) {
        const int degree = degrees[rng() % degrees.size()];
        const int expected = scan_least_loaded(load, degree);
        ASSERT_EQ(fast.least_loaded(degree), expected)
            << ranks << " ranks, trial " << trial << ", placement " << i << ", degree " << degree;
        const double amount = trial % 2 == 0 ? small(rng) : real(rng);
        fast.charge(expected, degree, amount);
        for (int r = expected; r < expected + degree; ++r) load[static_cast<std::size_t>(r)] += amount;
      }
      for (const int degree : degrees) {
        ASSERT_EQ(fast.least_loaded(degree), scan_least_loaded(load, degree)) << ranks;
      }
    }
  }
  EXPECT_EQ(cases, 300);
}

}  // namespace
}  // namespace ballast::strategies
