// The static Ulysses plan shared by static-ulysses and batch-adaptive.
#pragma once

#include <string>
#include <vector>

#include "builders.hpp"

namespace ballast::strategies {

/// A Ulysses group over `ranks` holding a pack: its sequences concatenated in pack order
/// and split into ranks.size() contiguous ranges differing by at most one token.
AttentionGroup ulysses_group(const Pack& pack, const std::vector<int>& ranks, const Plan& plan);

/// The static-ulysses plan at a given (already validated) degree.
Plan plan_static_ulysses(const Batch& batch, const CostModel& cost, int degree,
                         const std::string& strategy);

}  // namespace ballast::strategies
