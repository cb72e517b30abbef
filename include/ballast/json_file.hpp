// Reading JSON files and fields with errors that name the file and the field.
#pragma once

#include <span>
#include <string>
#include <string_view>

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

/// The first member of `object` (in its iteration order: alphabetical for nlohmann's
/// default objects) whose name is not in `known_keys`; nullptr when there is none or
/// `object` is not an object.
const std::string* first_unknown_key(const nlohmann::json& object,
                                     std::span<const std::string_view> known_keys);

/// "unknown key \"nics_per_nodes\"; did you mean 'nics_per_node'?" (did_you_mean, text.hpp),
/// or "unknown key \"x\"; the known keys are a, b, c" when no known key is close. One
/// line: the key is shown JSON-escaped, its first 60 characters at most.
std::string unknown_key_message(std::string_view key, std::span<const std::string_view> known_keys);

/// Throws InputError "<where>: <unknown_key_message>" for the first member of `object` not
/// in `known_keys`: a misspelt optional key must not leave its default in place silently.
/// Does nothing when `object` is not an object (the caller reports the type).
void reject_unknown_keys(const nlohmann::json& object, std::span<const std::string_view> known_keys,
                         const std::string& where);

}  // namespace ballast

#include "ballast/detail/json_file_inl.hpp"
