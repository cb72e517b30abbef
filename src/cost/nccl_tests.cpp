// Readers of nccl-tests results: the CSV layout of data/profiles and the text output of
// all_reduce_perf, all_gather_perf, reduce_scatter_perf, alltoall_perf and sendrecv_perf.
#include "ballast/nccl_tests.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/limits.hpp"

namespace ballast {

namespace {

constexpr Seconds kMicrosecond = 1e-6;
/// The longest time a row may give: an hour (nccl-tests' slowest rows, 8 GiB over a
/// 10 Gb/s Ethernet link, take seconds); a larger one is a typo or a unit mix-up, and
/// 1e308 printed a 300-digit row.
constexpr double kMaxRowTimeUs = 3.6e9;
/// The largest message a row may give: 2^40 bytes (1 TiB), more than any GPU holds
/// (nccl-tests' -e is bounded by device memory).
constexpr Bytes kMaxRowSizeBytes = Bytes{1} << 40;
/// How much of an offending field a message shows.
constexpr std::size_t kExcerptChars = 40;

std::vector<std::string_view> split_whitespace(std::string_view line) {
  std::vector<std::string_view> tokens;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r')) ++i;
    const std::size_t begin = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t' && line[i] != '\r') ++i;
    if (i > begin) tokens.push_back(line.substr(begin, i - begin));
  }
  return tokens;
}

std::vector<std::string_view> split_commas(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = line.find(',', begin);
    std::string_view field = line.substr(begin, comma == std::string_view::npos ? line.npos : comma - begin);
    while (!field.empty() && (field.back() == ' ' || field.back() == '\r')) field.remove_suffix(1);
    while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
    fields.push_back(field);
    if (comma == std::string_view::npos) return fields;
    begin = comma + 1;
  }
}

std::string_view trim_left(std::string_view line) {
  while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
  return line;
}

template <typename T>
std::optional<T> parse_number(std::string_view text) {
  T value{};
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool starts_with_digit(std::string_view token) {
  return !token.empty() && token.front() >= '0' && token.front() <= '9';
}

/// The offending text as it goes into a one-line message: short, printable.
std::string excerpt(std::string_view text) {
  std::string shown;
  for (char c : text.substr(0, kExcerptChars)) {
    shown += std::isprint(static_cast<unsigned char>(c)) != 0 ? c : '?';
  }
  if (text.size() > kExcerptChars) shown += "...";
  return shown;
}

/// Throws InputError when `text` is not text: a NUL or another control character than
/// tab, line feed, carriage return, vertical tab and form feed (an executable, an archive,
/// a core file given by mistake). Its bytes are not echoed.
void require_text(const std::string& text, const std::string& path) {
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto byte = static_cast<unsigned char>(text[i]);
    if ((byte < 0x20 && byte != '\t' && byte != '\n' && byte != '\r' && byte != '\v' &&
         byte != '\f') ||
        byte == 0x7f) {
      throw InputError(fmt::format(
          "{}: not a text file (byte {} is the control character 0x{:02x}); give nccl-tests' "
          "text output (all_reduce_perf ... > ar.txt) or a CSV with the columns op, ngpu, "
          "size_bytes, t_us_out",
          path, i + 1, byte));
    }
  }
}

/// The lines of `text` with their 1-based numbers.
template <typename Visit>
void for_each_line(const std::string& text, Visit visit) {
  std::size_t begin = 0;
  int number = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    visit(std::string_view(text).substr(begin, end - begin), ++number);
    begin = end + 1;
  }
}

Seconds checked_time(double time_us, std::string_view token, const std::string& where) {
  if (!(time_us > 0)) {
    throw InputError(fmt::format("{}: the time must be > 0 us, got '{}'", where, excerpt(token)));
  }
  if (!(time_us <= kMaxRowTimeUs)) {
    throw InputError(fmt::format("{}: the time must be at most {:.0f} us (an hour), got '{}'; "
                                 "give nccl-tests' time column in us",
                                 where, kMaxRowTimeUs, excerpt(token)));
  }
  return time_us * kMicrosecond;
}

// ---- CSV ----

std::vector<NcclTestsRow> parse_csv(const std::string& text, const std::string& path) {
  std::vector<NcclTestsRow> rows;
  std::vector<std::string_view> header;
  int op_column = -1, gpus_column = -1, size_column = -1, time_column = -1, hosts_column = -1;
  for_each_line(text, [&](std::string_view line, int number) {
    const std::string where = fmt::format("{}:{}", path, number);
    if (trim_left(line).empty() || trim_left(line).front() == '#') return;
    const std::vector<std::string_view> fields = split_commas(line);
    if (header.empty()) {
      header = fields;
      const auto column = [&](std::string_view name) {
        const auto it = std::find(header.begin(), header.end(), name);
        return it == header.end() ? -1 : static_cast<int>(it - header.begin());
      };
      op_column = column("op");
      gpus_column = column("ngpu");
      size_column = column("size_bytes");
      time_column = column("t_us_out");
      hosts_column = column("hosts");
      if (op_column < 0 || gpus_column < 0 || size_column < 0 || time_column < 0) {
        throw InputError(fmt::format(
            "{}: expected a CSV header naming the columns op, ngpu, size_bytes and t_us_out "
            "(as in data/profiles/h200_8gpu_nccl_tests.csv), got '{}'",
            where, excerpt(line)));
      }
      return;
    }
    if (fields.size() != header.size()) {
      throw InputError(fmt::format("{}: expected {} comma-separated fields as in the header, "
                                   "got {}", where, header.size(), fields.size()));
    }
    NcclTestsRow row;
    row.op = collective_op_from_name(fields[op_column], where + ": column 'op'");
    const auto gpus = parse_number<int>(fields[gpus_column]);
    const auto size = parse_number<Bytes>(fields[size_column]);
    const auto time_us = parse_number<double>(fields[time_column]);
    const auto hosts = hosts_column < 0 ? std::optional<int>(1) : parse_number<int>(fields[hosts_column]);
    if (!gpus || *gpus < 1 || *gpus > kMaxRanks) {
      throw InputError(fmt::format("{}: column 'ngpu' must be a GPU count from 1 to {}, got '{}'",
                                   where, kMaxRanks, excerpt(fields[gpus_column])));
    }
    if (!size || *size <= 0 || *size > kMaxRowSizeBytes) {
      throw InputError(fmt::format("{}: column 'size_bytes' must be a byte count from 1 to {} "
                                   "(1 TiB), got '{}'",
                                   where, kMaxRowSizeBytes, excerpt(fields[size_column])));
    }
    if (!time_us) {
      throw InputError(fmt::format("{}: column 't_us_out' must be a time in us, got '{}'", where,
                                   excerpt(fields[time_column])));
    }
    if (!hosts || *hosts < 1 || *hosts > *gpus) {
      throw InputError(fmt::format("{}: column 'hosts' must be in [1, ngpu], got '{}'", where,
                                   excerpt(fields[hosts_column])));
    }
    row.gpus = *gpus;
    row.hosts = *hosts;
    row.size_bytes = *size;
    row.time_s = checked_time(*time_us, fields[time_column], where);
    row.source = where;
    rows.push_back(std::move(row));
  });
  return rows;
}

// ---- nccl-tests' text output ----

/// The op a file name names ("all_reduce_perf_8gpu.log"), if exactly one.
std::optional<CollectiveOp> op_from_file_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  std::set<CollectiveOp> found;
  for (std::string_view spelling : {"all_gather", "reduce_scatter", "all_reduce", "alltoall",
                                    "all_to_all", "sendrecv", "send_recv"}) {
    if (name.find(spelling) != std::string::npos) {
      found.insert(collective_op_from_name(spelling, path));
    }
  }
  if (found.size() != 1) return std::nullopt;
  return *found.begin();
}

struct TextRun {
  std::optional<CollectiveOp> op;
  std::set<int> ranks;
  std::set<std::string> hosts;
  std::vector<std::string_view> header;  ///< tokens after '#'; empty: not seen yet
  int size_column = -1;
  int time_column = -1;  ///< the first "time": out-of-place
  int count_column = -1;  ///< "count" (elements); -1: not in the header
};

void read_rank_line(const std::vector<std::string_view>& tokens, TextRun& run,
                    const std::string& where) {
  const auto rank = tokens.size() >= 2 ? parse_number<int>(tokens[1]) : std::nullopt;
  const auto on = std::find(tokens.begin(), tokens.end(), "on");
  if (!rank || on == tokens.end() || on + 1 == tokens.end()) {
    throw InputError(fmt::format("{}: expected a device line '#  Rank  N Group  G Pid  P on "
                                 "HOST device  D ...'", where));
  }
  if (!run.ranks.insert(*rank).second) {
    throw InputError(fmt::format(
        "{}: rank {} is listed twice; nccl-tests built without MPI runs every process as its "
        "own 1-GPU job: rebuild it with MPI=1 (or use -g N in one process)",
        where, *rank));
  }
  run.hosts.emplace(*(on + 1));
}

void read_header_line(const std::vector<std::string_view>& tokens, TextRun& run) {
  run.header = tokens;
  const auto size = std::find(tokens.begin(), tokens.end(), "size");
  const auto time = std::find(tokens.begin(), tokens.end(), "time");
  const auto count = std::find(tokens.begin(), tokens.end(), "count");
  run.size_column = static_cast<int>(size - tokens.begin());
  run.time_column = static_cast<int>(time - tokens.begin());
  run.count_column = count == tokens.end() ? -1 : static_cast<int>(count - tokens.begin());
}

/// Whether a line whose first token is no byte count ("abc", or one that overflows) is
/// still a result row, to be reported rather than skipped: after a column header, as many
/// columns as it names (or up to two fewer, as some versions print for alltoall and
/// sendrecv) and a number where it names the element count (or, without one, the time).
/// NCCL INFO lines ("host:pid:tid [0] NCCL INFO ...") and banners fail the last test.
bool looks_like_result_row(const std::vector<std::string_view>& tokens, const TextRun& run) {
  const std::size_t columns = run.header.size();
  if (columns == 0 || tokens.size() > columns || tokens.size() + 2 < columns) return false;
  const int missing = static_cast<int>(columns - tokens.size());
  const int column = run.count_column > run.size_column ? run.count_column : run.time_column - missing;
  if (column <= 0 || column >= static_cast<int>(tokens.size())) return false;
  return parse_number<double>(tokens[column]).has_value();
}

NcclTestsRow read_result_line(const std::vector<std::string_view>& tokens, const TextRun& run,
                              const std::string& where) {
  if (run.header.empty()) {
    throw InputError(fmt::format(
        "{}: a result row before the column header ('#  size  count  type  redop  root  time  "
        "algbw  busbw ...'); is this nccl-tests output?", where));
  }
  if (!run.op) {
    throw InputError(fmt::format(
        "{}: which collective? expected a line '# Collective test starting: <op>_perf' before "
        "the results, or the op in the file name (all_reduce_perf.txt, ...)", where));
  }
  if (run.ranks.empty()) {
    throw InputError(fmt::format("{}: no '#  Rank  N Group ... on HOST device ...' lines before "
                                 "the results, so the GPU count is unknown; keep nccl-tests' "
                                 "'# Using devices' block in the file", where));
  }
  // Some versions print no redop/root for alltoall and sendrecv: the missing columns lie
  // between size and time, so count the time column from the right of them.
  const int missing = static_cast<int>(run.header.size()) - static_cast<int>(tokens.size());
  const int time_column = missing > 0 ? run.time_column - missing : run.time_column;
  if (time_column <= run.size_column || time_column >= static_cast<int>(tokens.size())) {
    throw InputError(fmt::format("{}: expected {} columns as the header names ({}), got {}", where,
                                 run.header.size(), fmt::join(run.header, " "), tokens.size()));
  }
  const auto size = parse_number<Bytes>(tokens[run.size_column]);
  const auto time_us = parse_number<double>(tokens[time_column]);
  if (!size || *size <= 0) {
    throw InputError(fmt::format("{}: expected the size in bytes in column {} ('size'), got '{}'",
                                 where, run.size_column + 1, excerpt(tokens[run.size_column])));
  }
  if (*size > kMaxRowSizeBytes) {
    throw InputError(fmt::format("{}: the size must be at most {} bytes (1 TiB), got '{}'", where,
                                 kMaxRowSizeBytes, excerpt(tokens[run.size_column])));
  }
  if (!time_us) {
    throw InputError(fmt::format("{}: expected the out-of-place time in us in column {} "
                                 "('time'), got '{}'",
                                 where, time_column + 1, excerpt(tokens[time_column])));
  }
  NcclTestsRow row;
  row.op = *run.op;
  row.gpus = static_cast<int>(run.ranks.size());
  row.hosts = static_cast<int>(run.hosts.size());
  row.size_bytes = *size;
  row.time_s = checked_time(*time_us, tokens[time_column], where);
  row.source = where;
  return row;
}

std::vector<NcclTestsRow> parse_text_output(const std::string& text, const std::string& path) {
  std::vector<NcclTestsRow> rows;
  TextRun run;
  run.op = op_from_file_name(path);
  constexpr std::string_view kStarting = "Collective test starting:";
  for_each_line(text, [&](std::string_view raw, int number) {
    const std::string where = fmt::format("{}:{}", path, number);
    const std::string_view line = trim_left(raw);
    if (line.empty()) return;
    if (line.front() == '#') {
      const std::string_view body = line.substr(1);
      if (const auto at = body.find(kStarting); at != std::string_view::npos) {
        const auto name = split_whitespace(body.substr(at + kStarting.size()));
        std::string_view test = name.empty() ? std::string_view() : name.front();
        if (test.ends_with("_mpi")) test.remove_suffix(4);  // all_reduce_perf_mpi
        if (test.ends_with("_perf")) test.remove_suffix(5);
        run = TextRun{};
        run.op = collective_op_from_name(
            test, fmt::format("{}: nccl-tests '{}' (calibrate reads all_gather_perf, "
                              "reduce_scatter_perf, all_reduce_perf, alltoall_perf, sendrecv_perf)",
                              where, test));
        return;
      }
      const auto tokens = split_whitespace(body);
      if (tokens.empty()) return;
      if (tokens.front() == "Rank") {
        if (!run.header.empty()) {  // a second run without a start line: new devices
          const auto op = run.op;
          run = TextRun{};
          run.op = op;
        }
        read_rank_line(tokens, run, where);
      } else if (std::find(tokens.begin(), tokens.end(), "size") != tokens.end() &&
                 std::find(tokens.begin(), tokens.end(), "time") != tokens.end()) {
        read_header_line(tokens, run);
      }
      return;
    }
    const auto tokens = split_whitespace(line);
    if (tokens.empty()) return;  // a line of carriage returns
    if (!parse_number<Bytes>(tokens.front()) && !looks_like_result_row(tokens, run)) {
      return;  // NCCL INFO, warnings, banners
    }
    rows.push_back(read_result_line(tokens, run, where));
  });
  return rows;
}

bool looks_like_csv(const std::string& text) {
  bool csv = false;
  bool decided = false;
  for_each_line(text, [&](std::string_view line, int) {
    line = trim_left(line);
    if (decided || line.empty() || line.front() == '#') return;
    csv = line.find(',') != std::string_view::npos && !starts_with_digit(line);
    decided = true;
  });
  return csv;
}

}  // namespace

std::vector<NcclTestsRow> parse_nccl_tests_text(const std::string& text, const std::string& path) {
  require_text(text, path);
  std::vector<NcclTestsRow> rows =
      looks_like_csv(text) ? parse_csv(text, path) : parse_text_output(text, path);
  if (rows.empty()) {
    throw InputError(fmt::format(
        "{}: no nccl-tests results found; expected a CSV with columns op, ngpu, size_bytes, "
        "t_us_out, or the text output of all_reduce_perf (or all_gather_perf, "
        "reduce_scatter_perf, alltoall_perf, sendrecv_perf) with its '#  Rank' device lines, "
        "its '#  size  count ... time' header and one row per size",
        path));
  }
  return rows;
}

std::vector<NcclTestsRow> read_nccl_tests_file(const std::string& path) {
  return parse_nccl_tests_text(read_text_file(path), path);
}

}  // namespace ballast
