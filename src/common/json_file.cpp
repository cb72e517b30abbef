// read_json_file / read_text_file: file I/O with errors that name the path.
#include "ballast/json_file.hpp"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ballast/error.hpp"

namespace ballast {

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(fmt::format("cannot open '{}': no such file or not readable; check the path",
                                 path));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw InputError(fmt::format("cannot read '{}'", path));
  return text.str();
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw InputError(fmt::format("'{}' is not valid JSON (byte {}): {}", path, error.byte,
                                 error.what()));
  }
}

}  // namespace ballast
