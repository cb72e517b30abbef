// The lower bound's adversary, a bounded slice (the long run: bound_adversary, docs/
// simulator.md section 7): mutated plans of every strategy on random settings never
// simulate below their bound.
#include <gtest/gtest.h>

#include "sim/bound_adversary.hpp"

namespace ballast::testing {
namespace {

TEST(LowerBoundAdversary, NoMutatedPlanBeatsItsBound) {
  for (const std::uint64_t seed : {1u, 2u}) {
    AdversaryOptions options;
    options.seed = seed;
    options.simulations = 10000;
    const AdversaryResult result = search_below_bounds(options);
    SCOPED_TRACE("seed " + std::to_string(seed) + ", closest: " + result.closest);
    EXPECT_GE(result.simulated, options.simulations);
    EXPECT_GT(result.starts, 10);
    for (const std::string& finding : result.findings) ADD_FAILURE() << finding;
    EXPECT_GE(result.closest_ratio, 1.0 - 1e-9);
  }
}

}  // namespace
}  // namespace ballast::testing
