// read_json_file / read_text_file: file I/O with errors that name the path.
#include "ballast/json_file.hpp"

#include <filesystem>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "ballast/limits.hpp"

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

}  // namespace ballast
