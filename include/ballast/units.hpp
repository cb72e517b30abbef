// Unit-carrying type aliases shared by every part of ballast.
#pragma once

#include <cstdint>
#include <limits>

#include "ballast/limits.hpp"  // kMaxSequenceTokens and the other scale limits

namespace ballast {

using Tokens = std::int64_t;  ///< a count of tokens (64-bit everywhere)
using Bytes = std::int64_t;   ///< a size in bytes
using Seconds = double;       ///< a duration or time point in seconds (traces convert to us)

/// a * b, or the largest int64 when it would overflow (memory checks on absurd plans
/// must fail, never wrap around and pass). Both factors must be >= 0.
inline std::int64_t saturating_multiply(std::int64_t a, std::int64_t b) {
  std::int64_t product = 0;
  return __builtin_mul_overflow(a, b, &product) ? std::numeric_limits<std::int64_t>::max() : product;
}
/// numerator / denominator rounded up, for numerator >= 0 and denominator > 0; no
/// intermediate overflow even for a denominator near 2^63 (a saturated capacity).
inline std::int64_t ceil_div(std::int64_t numerator, std::int64_t denominator) {
  return numerator / denominator + (numerator % denominator != 0 ? 1 : 0);
}
/// a + b, or the largest int64 when it would overflow. Both terms must be >= 0.
inline std::int64_t saturating_add(std::int64_t a, std::int64_t b) {
  std::int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<std::int64_t>::max() : sum;
}

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGB = 1e9;

}  // namespace ballast
