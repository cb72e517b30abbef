// Template definitions for json_file.hpp.
#pragma once

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
