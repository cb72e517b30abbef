// read_lengths_file: parses document-length files (JSON array, histogram CSV, one length
// per line), detecting the format by content, with errors that name file, line and fix.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/workload.hpp"

namespace ballast {
namespace {

// Longer than any real document; a larger value almost surely means bytes or a typo.
constexpr Tokens kMaxDocumentTokens = kMaxSequenceTokens;  // 2^31, units.hpp
constexpr std::size_t kExcerptChars = 40;
// Spreadsheet exports often start with one; it is not part of the first value.
constexpr std::string_view kUtf8ByteOrderMark = "\xEF\xBB\xBF";

std::string_view trim(std::string_view text) {
  const auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_space(text.back())) text.remove_suffix(1);
  return text;
}

// The offending text as it goes into a one-line message: short, printable.
std::string excerpt(std::string_view text) {
  std::string shown;
  for (char c : text.substr(0, kExcerptChars)) {
    shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  }
  if (text.size() > kExcerptChars) shown += "...";
  return shown;
}

bool is_skipped_line(std::string_view line) { return line.empty() || line.front() == '#'; }

/// Splits text into lines (without '\n'); calls visit(line_number, trimmed_line) for each.
template <typename Visit>
void for_each_line(std::string_view text, Visit&& visit) {
  std::int64_t line_number = 0;
  while (!text.empty()) {
    const std::size_t end = text.find('\n');
    const std::string_view line = text.substr(0, end);
    ++line_number;
    visit(line_number, trim(line));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

enum class Parsed { ok, not_integer, out_of_range };

/// Parses all of `text` as a signed decimal integer (no '+', no spaces, no fraction).
Parsed parse_integer(std::string_view text, std::int64_t& value) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (error == std::errc::result_out_of_range) return Parsed::out_of_range;
  if (error != std::errc() || stop != end) return Parsed::not_integer;
  return Parsed::ok;
}

[[noreturn]] void throw_over_limit(const std::string& where, std::string_view text) {
  throw InputError(fmt::format(
      "{}: length '{}' is over the limit of 2^31 = {} tokens; check that the file holds "
      "token counts (not bytes or characters)",
      where, excerpt(text), kMaxDocumentTokens));
}

// ---- one integer per line -------------------------------------------------------------

Tokens parse_length_line(const std::string& path, std::int64_t line_number, std::string_view line) {
  std::int64_t value = 0;
  const Parsed parsed = parse_integer(line, value);
  // A valid line builds no message (a dataset has ~10^5 lines).
  if (parsed == Parsed::ok && value > 0 && value <= kMaxDocumentTokens) return value;
  const std::string where = fmt::format("{}:{}", path, line_number);
  if (parsed == Parsed::out_of_range) throw_over_limit(where, line);
  if (parsed == Parsed::not_integer) {
    throw InputError(fmt::format(
        "{}: '{}' is not a document length; write one positive integer (tokens) per line "
        "(blank lines and lines starting with # are ignored)",
        where, excerpt(line)));
  }
  if (value <= 0) {
    throw InputError(fmt::format(
        "{}: length {} is not positive; every document has at least 1 token (remove the line)",
        where, value));
  }
  if (value > kMaxDocumentTokens) throw_over_limit(where, line);
  return value;
}

void read_line_lengths(const std::string& path, std::string_view text, Dataset& dataset) {
  // About 7 bytes per line in real files; reserving avoids most regrowth on 1M lines.
  dataset.lengths_tokens.reserve(text.size() / 6 + 1);
  for_each_line(text, [&](std::int64_t line_number, std::string_view line) {
    if (is_skipped_line(line)) return;
    dataset.lengths_tokens.push_back(parse_length_line(path, line_number, line));
  });
}

// ---- JSON array -----------------------------------------------------------------------

Tokens json_element_length(const std::string& path, std::size_t index,
                           const nlohmann::json& element) {
  if (element.is_number_integer()) {  // signed or unsigned; a valid one builds no message
    const auto value = element.get<std::int64_t>();
    if (value > 0 && value <= kMaxDocumentTokens) return value;
  }
  const std::string where = fmt::format("{}: element [{}]", path, index);
  if (element.is_number_unsigned()) {
    const auto value = element.get<std::uint64_t>();
    if (value > static_cast<std::uint64_t>(kMaxDocumentTokens)) {
      throw_over_limit(where, element.dump());
    }
  } else if (!element.is_number_integer()) {
    throw InputError(
        fmt::format("{} is {} (a JSON {}); expected a positive integer number of tokens, as in "
                    "[512, 2048]",
                    where, excerpt(element.dump()), element.type_name()));
  }
  const auto value = element.get<std::int64_t>();
  if (value <= 0) {
    throw InputError(
        fmt::format("{} is {}; document lengths must be positive (remove it)", where, value));
  }
  return value;
}

void read_json_lengths(const std::string& path, std::string_view text, Dataset& dataset) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& error) {
    throw InputError(fmt::format(
        "{}: not valid JSON (byte {}): {}; expected a JSON array of lengths like [512, 2048]", path,
        error.byte, error.what()));
  } catch (const nlohmann::json::out_of_range& error) {
    // A number beyond a double's range (1e400) is out_of_range, not a parse_error.
    throw InputError(fmt::format(
        "{}: not valid JSON: {}; expected a JSON array of lengths like [512, 2048]", path,
        error.what()));
  }
  if (!json.is_array()) {
    throw InputError(fmt::format(
        "{}: the top-level JSON value is of type {}, not an array; expected a JSON array "
        "of lengths like [512, 2048]",
        path, json.type_name()));
  }
  dataset.lengths_tokens.reserve(json.size());
  for (std::size_t index = 0; index < json.size(); ++index) {
    dataset.lengths_tokens.push_back(json_element_length(path, index, json[index]));
  }
}

// ---- histogram CSV --------------------------------------------------------------------

bool looks_like_histogram_header(std::string_view line) {
  std::string lower(line);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("range") != std::string::npos;
}

bool looks_like_histogram_row(std::string_view line) { return line.starts_with("\"["); }

/// A tiny cursor over one CSV row; each expect_* returns false on mismatch.
struct RowCursor {
  std::string_view rest;

  void skip_spaces() {
    while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
  }
  bool expect(char c) {
    skip_spaces();
    if (rest.empty() || rest.front() != c) return false;
    rest.remove_prefix(1);
    return true;
  }
  /// Consumes `c` if it is next; always true, so it chains with expect().
  bool accept(char c) {
    (void)expect(c);
    return true;
  }
  bool integer(std::int64_t& value, bool& out_of_range) {
    skip_spaces();
    const auto [stop, error] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
    if (error == std::errc::result_out_of_range) out_of_range = true;
    if (error != std::errc()) return false;
    rest.remove_prefix(static_cast<std::size_t>(stop - rest.data()));
    return true;
  }
};

void check_bin(const std::string& where, const LengthBin& bin) {
  const std::string shown = fmt::format("bin [{}, {}]", bin.min_tokens, bin.max_tokens);
  if (bin.min_tokens < 0) {
    throw InputError(
        fmt::format("{}: {} starts below 0; lengths are token counts (>= 0)", where, shown));
  }
  if (bin.min_tokens > bin.max_tokens) {
    throw InputError(
        fmt::format("{}: {} has lo > hi; write the smaller bound first", where, shown));
  }
  if (bin.max_tokens < 1) {
    throw InputError(fmt::format("{}: {} holds no positive length; remove the row", where, shown));
  }
  if (bin.max_tokens > kMaxDocumentTokens) {
    throw_over_limit(where, std::to_string(bin.max_tokens));
  }
  if (bin.documents < 0) {
    throw InputError(
        fmt::format("{}: {} has a negative count ({}); counts are numbers of documents (>= 0)",
                    where, shown, bin.documents));
  }
}

LengthBin parse_histogram_row(const std::string& path, std::int64_t line_number,
                              std::string_view line) {
  const std::string where = fmt::format("{}:{}", path, line_number);
  LengthBin bin;
  bool out_of_range = false;
  RowCursor row{line};
  const bool ok = row.accept('"') && row.expect('[') && row.integer(bin.min_tokens, out_of_range) &&
                  row.expect(',') && row.integer(bin.max_tokens, out_of_range) && row.expect(']') &&
                  row.accept('"') && row.expect(',') && row.integer(bin.documents, out_of_range);
  row.skip_spaces();
  if (out_of_range) throw_over_limit(where, line);
  if (!ok || !(row.rest.empty() || row.rest.front() == ',')) {
    throw InputError(fmt::format(
        "{}: '{}' is not a histogram row; expected \"[lo, hi]\",count[,...] with integer "
        "bounds and count",
        where, excerpt(line)));
  }
  check_bin(where, bin);
  return bin;
}

void read_histogram(const std::string& path, std::string_view text, Dataset& dataset) {
  // The bins' total must stay a valid int64 (Dataset::documents() sums them).
  constexpr std::int64_t kMaxHistogramDocuments = std::int64_t{1} << 62;
  bool header_seen = false;
  std::int64_t total_documents = 0;
  for_each_line(text, [&](std::int64_t line_number, std::string_view line) {
    if (is_skipped_line(line)) return;
    if (!header_seen && dataset.histogram.empty() && looks_like_histogram_header(line)) {
      header_seen = true;
      return;
    }
    const LengthBin bin = parse_histogram_row(path, line_number, line);
    if (bin.documents > kMaxHistogramDocuments - total_documents) {
      throw InputError(fmt::format(
          "{}:{}: the histogram's counts add up to more than 2^62 documents; check the count "
          "column",
          path, line_number));
    }
    total_documents += bin.documents;
    dataset.histogram.push_back(bin);
  });
  if (!dataset.histogram.empty() && dataset.documents() == 0) {
    throw InputError(
        fmt::format("{}: every histogram bin has count 0; the histogram holds no documents", path));
  }
}

// ---- format detection -----------------------------------------------------------------

enum class LengthFormat { json_array, histogram_csv, one_per_line };

LengthFormat detect_format(std::string_view text) {
  // '{' too, so that a JSON object gets the JSON reader's "not an array" message.
  const std::string_view content = trim(text);
  if (content.starts_with('[') || content.starts_with('{')) return LengthFormat::json_array;
  LengthFormat format = LengthFormat::one_per_line;
  bool decided = false;
  for_each_line(text, [&](std::int64_t, std::string_view line) {
    if (decided || is_skipped_line(line)) return;
    decided = true;
    if (looks_like_histogram_header(line) || looks_like_histogram_row(line)) {
      format = LengthFormat::histogram_csv;
    }
  });
  return format;
}

}  // namespace

Dataset read_lengths_file(const std::string& path) {
  const std::string contents = read_text_file(path);
  std::string_view text = contents;
  if (text.starts_with(kUtf8ByteOrderMark)) text.remove_prefix(kUtf8ByteOrderMark.size());
  Dataset dataset;
  dataset.name = path;
  dataset.source = path;
  switch (detect_format(text)) {
    case LengthFormat::json_array: read_json_lengths(path, text, dataset); break;
    case LengthFormat::histogram_csv: read_histogram(path, text, dataset); break;
    case LengthFormat::one_per_line: read_line_lengths(path, text, dataset); break;
  }
  if (dataset.lengths_tokens.empty() && dataset.histogram.empty()) {
    throw InputError(fmt::format(
        "{}: the file holds no document lengths; expected a JSON array, a histogram CSV or "
        "one positive integer per line",
        path));
  }
  return dataset;
}

}  // namespace ballast
