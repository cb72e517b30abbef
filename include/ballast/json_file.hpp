// Reading JSON files and fields with errors that name the file and the field.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace ballast {

/// Parses a JSON file; throws InputError naming the path (missing, unreadable, or the
/// parse error with its byte offset).
nlohmann::json read_json_file(const std::string& path);

/// Parses `text` read from `path`; throws InputError naming the path on a parse error
/// (with its byte offset) or a number beyond a double's range.
nlohmann::json parse_json_text(const std::string& text, const std::string& path);

/// Reads the whole file as text; throws InputError naming the path if it cannot or if it
/// is larger than kMaxInputFileBytes (1 GiB, limits.hpp).
std::string read_text_file(const std::string& path);

/// json[key] converted to T; throws InputError "<source>: field '<key>' ..." when the
/// key is missing or has the wrong type.
template <typename T>
T required_field(const nlohmann::json& json, const std::string& key, const std::string& source);

/// json[key] converted to T, or `fallback` when the key is absent.
template <typename T>
T optional_field(const nlohmann::json& json, const std::string& key, const T& fallback,
                 const std::string& source);

}  // namespace ballast

#include "ballast/detail/json_file_inl.hpp"
