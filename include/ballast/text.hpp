// Small text helpers shared by messages and reports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ballast {

/// 37120 -> "37,120": a fixed separator, so messages never depend on the locale.
std::string with_thousands(std::int64_t value);

/// The candidate nearest to `word` by edit distance (insertions, deletions, substitutions
/// and swaps of adjacent characters, case-insensitive), or "" when none is close enough to
/// be a likely typo: at most one edit per three characters of the longer of the two (at
/// least one edit), or else `word` a prefix of exactly one candidate. Ties go to the earliest candidate, so the
/// answer is deterministic.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

/// " (did you mean 'nics_per_node'?)" for the closest_match(), or "" when there is none:
/// appended to the message of an unknown key, flag, preset, dataset or strategy.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace ballast
