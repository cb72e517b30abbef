// read_json_file / read_text_file: file I/O with errors that name the path; unknown keys of
// a JSON object as errors with a suggestion.
#include "ballast/json_file.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/limits.hpp"
#include "ballast/text.hpp"

namespace ballast {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(fmt::format("cannot open '{}': no such file or not readable; check the path",
                                 path));
  }
  const auto too_large = [&] {
    return InputError(fmt::format(
        "'{}' is larger than {} bytes (1 GiB), ballast's limit for an input file; split it "
        "(length files: sample a subset; plans: fewer sequences per plan)",
        path, kMaxInputFileBytes));
  };
  // A regular file's size is known up front; a pipe's is not: either way reading stops at
  // the limit instead of exhausting memory.
  std::string text;
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) {
    const std::uintmax_t size = std::filesystem::file_size(path, error);
    if (!error && size > static_cast<std::uintmax_t>(kMaxInputFileBytes)) throw too_large();
    if (!error) text.reserve(static_cast<std::size_t>(size));
  }
  std::vector<char> block(std::size_t{1} << 20);
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    text.append(block.data(), static_cast<std::size_t>(in.gcount()));
    if (static_cast<std::int64_t>(text.size()) > kMaxInputFileBytes) throw too_large();
  }
  if (in.bad()) throw InputError(fmt::format("cannot read '{}'", path));
  return text;
}

nlohmann::json read_json_file(const std::string& path) {
  return parse_json_text(read_text_file(path), path);
}

nlohmann::json parse_json_text(const std::string& text, const std::string& path) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw InputError(fmt::format("'{}' is not valid JSON (byte {}): {}", path, error.byte,
                                 error.what()));
  } catch (const nlohmann::json::out_of_range& error) {
    // A number beyond a double's range (1e400) is out_of_range, not a parse_error.
    throw InputError(fmt::format("'{}' is not valid JSON: {}", path, error.what()));
  }
}

const std::string* first_unknown_key(const nlohmann::json& object,
                                     std::span<const std::string_view> known_keys) {
  if (!object.is_object()) return nullptr;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (std::find(known_keys.begin(), known_keys.end(), it.key()) == known_keys.end()) {
      return &it.key();
    }
  }
  return nullptr;
}

std::string unknown_key_message(std::string_view key, std::span<const std::string_view> known_keys) {
  constexpr std::size_t kMaxShownChars = 60;  // keeps a pasted blob from flooding the message
  const std::string shown = key.size() > kMaxShownChars
                                ? std::string(key.substr(0, kMaxShownChars)) + "..."
                                : std::string(key);
  // Escaped, so a key holding a newline still gives a one-line message; a cut inside a
  // UTF-8 sequence is replaced rather than thrown.
  const std::string quoted =
      nlohmann::json(shown).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  // The edit distance is O(|key| x |candidate|); a key over twice the longest candidate is
  // more than a third of its length away from every one, so it has no suggestion anyway.
  std::size_t longest = 0;
  for (std::string_view known : known_keys) longest = std::max(longest, known.size());
  std::string hint;
  if (key.size() <= 2 * longest) {
    hint = did_you_mean(key, std::vector<std::string>(known_keys.begin(), known_keys.end()));
  }
  if (hint.empty()) hint = fmt::format("; the known keys are {}", fmt::join(known_keys, ", "));
  return fmt::format("unknown key {}{}", quoted, hint);
}

void reject_unknown_keys(const nlohmann::json& object, std::span<const std::string_view> known_keys,
                         const std::string& where) {
  if (const std::string* key = first_unknown_key(object, known_keys)) {
    throw InputError(fmt::format("{}: {}", where, unknown_key_message(*key, known_keys)));
  }
}

}  // namespace ballast
