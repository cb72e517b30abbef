// The static Ulysses plan shared by static-ulysses and batch-adaptive.
#pragma once

#include <string>
#include <vector>

#include "builders.hpp"

namespace ballast::strategies {

/// How static-ulysses packs and pads (its spec parameters packing= and pad=).
struct UlyssesConventions {
  bool data_order = false;         ///< first fit in the batch's order instead of balanced
  Tokens pad_multiple_tokens = 1;  ///< every length padded up to a multiple of this
};

/// length rounded up to a multiple of pad_multiple_tokens (>= 1).
Tokens padded_to_multiple(Tokens length_tokens, Tokens pad_multiple_tokens);

/// A Ulysses group over `ranks` holding a pack: its sequences, each padded to a multiple of
/// pad_multiple_tokens (its padded_length_tokens), concatenated in pack order and split
/// into ranks.size() contiguous ranges differing by at most one token.
AttentionGroup ulysses_group(const Pack& pack, const std::vector<int>& ranks, const Plan& plan,
                             Tokens pad_multiple_tokens = 1);

/// The static-ulysses plan at a given (already validated) degree that holds every padded
/// length: packs of the padded lengths (token-balanced, or first fit in the batch's order)
/// dealt round-robin to the ranks() / degree groups.
Plan plan_static_ulysses(const Batch& batch, const CostModel& cost, int degree,
                         const std::string& strategy, const UlyssesConventions& conventions = {});

}  // namespace ballast::strategies
