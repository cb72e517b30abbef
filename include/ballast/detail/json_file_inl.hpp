// Template definitions for json_file.hpp.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

#include "ballast/error.hpp"

namespace ballast {

template <typename T>
T required_field(const nlohmann::json& json, const std::string& key, const std::string& source) {
  if (!json.is_object()) {
    throw InputError(fmt::format("{}: expected a JSON object with field '{}'", source, key));
  }
  auto it = json.find(key);
  if (it == json.end()) {
    throw InputError(fmt::format("{}: missing field '{}'; add it", source, key));
  }
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    if (!it->is_number()) {
      throw InputError(fmt::format("{}: field '{}' has the wrong type ({}): {}", source, key,
                                   it->type_name(), it->dump()));
    }
    // nlohmann converts 4294967304 to int 8 and 2.5 to 2 without a word: reject both
    // (an integral float such as 8e10 is accepted).
    const double as_double = it->template get<double>();
    const bool integral_float =
        it->is_number_float() && std::isfinite(as_double) && std::trunc(as_double) == as_double;
    if (!it->is_number_integer() && !integral_float) {
      throw InputError(fmt::format("{}: field '{}' must be an integer, got {} {}", source, key,
                                   it->type_name(), it->dump()));
    }
    constexpr auto lowest = std::numeric_limits<T>::min();
    constexpr auto highest = std::numeric_limits<T>::max();
    bool fits = false;
    if (it->is_number_unsigned()) {
      fits = it->template get<std::uint64_t>() <= static_cast<std::uint64_t>(highest);
    } else if (it->is_number_integer()) {  // stored as signed (negative, or built in C++)
      const auto value = it->template get<std::int64_t>();
      if constexpr (std::is_signed_v<T>) {
        fits = value >= static_cast<std::int64_t>(lowest) &&
               value <= static_cast<std::int64_t>(highest);
      } else {
        fits = value >= 0 && static_cast<std::uint64_t>(value) <= highest;
      }
    } else {  // max + 1 is a power of two, exact as a double
      fits = as_double >= static_cast<double>(lowest) &&
             as_double < static_cast<double>(highest) + 1.0;
    }
    if (!fits) {
      throw InputError(fmt::format("{}: field '{}' is {}, outside the range [{}, {}]; fix it",
                                   source, key, it->dump(), lowest, highest));
    }
    if (integral_float) return static_cast<T>(as_double);
  }
  try {
    return it->template get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(fmt::format("{}: field '{}' has the wrong type ({}): {}", source, key,
                                 it->type_name(), it->dump()));
  }
}

template <typename T>
T optional_field(const nlohmann::json& json, const std::string& key, const T& fallback,
                 const std::string& source) {
  if (!json.is_object() || !json.contains(key)) return fallback;
  return required_field<T>(json, key, source);
}

}  // namespace ballast
