// with_thousands: integer formatting for messages and reports.
#include "ballast/text.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>

#include <fmt/format.h>

namespace ballast {

std::string with_thousands(std::int64_t value) {
  // Unsigned negation: well defined even for the most negative value.
  const auto magnitude = value < 0 ? 0 - static_cast<std::uint64_t>(value)
                                   : static_cast<std::uint64_t>(value);
  const std::string digits = std::to_string(magnitude);
  std::string grouped = value < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

namespace {

char lower(char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); }

/// Optimal string alignment distance (Damerau-Levenshtein without repeated edits of one
/// substring), case-insensitive; O(|a| |b|) time, three rows of memory.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> two_back(b.size() + 1), previous(b.size() + 1), current(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t substitution = lower(a[i - 1]) == lower(b[j - 1]) ? 0 : 1;
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, previous[j - 1] + substitution});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1])) {
        current[j] = std::min(current[j], two_back[j - 2] + 1);
      }
    }
    std::swap(two_back, previous);
    std::swap(previous, current);
  }
  return previous[b.size()];
}

}  // namespace

std::string closest_match(std::string_view word, const std::vector<std::string>& candidates) {
  if (word.empty()) return "";
  std::string best;
  std::size_t best_distance = 0;
  for (const std::string& candidate : candidates) {
    const std::size_t distance = edit_distance(word, candidate);
    const std::size_t allowed = std::max<std::size_t>(1, std::max(word.size(), candidate.size()) / 3);
    if (distance <= allowed && (best.empty() || distance < best_distance)) {
      best = candidate;
      best_distance = distance;
    }
  }
  if (!best.empty()) return best;
  // A prefix of exactly one candidate ("zepp" -> "zeppelin").
  std::string prefixed;
  for (const std::string& candidate : candidates) {
    if (candidate.size() > word.size() &&
        std::equal(word.begin(), word.end(), candidate.begin(),
                   [](char x, char y) { return lower(x) == lower(y); })) {
      if (!prefixed.empty()) return "";
      prefixed = candidate;
    }
  }
  return prefixed;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string match = closest_match(word, candidates);
  return match.empty() ? "" : fmt::format(" (did you mean '{}'?)", match);
}

}  // namespace ballast
