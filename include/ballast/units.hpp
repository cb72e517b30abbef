// Unit-carrying type aliases shared by every part of ballast.
#pragma once

#include <cstdint>

namespace ballast {

using Tokens = std::int64_t;  ///< a count of tokens (64-bit everywhere)
using Bytes = std::int64_t;   ///< a size in bytes
using Seconds = double;       ///< a duration or time point in seconds (traces convert to us)

inline constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
inline constexpr double kMiB = 1024.0 * 1024.0;
inline constexpr double kGB = 1e9;

}  // namespace ballast
