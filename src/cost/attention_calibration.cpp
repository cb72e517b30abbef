// Attention calibration: reads a kernel benchmark CSV and fits the cluster's attention
// efficiency curves to it (one point per benchmarked length and pass).
#include "ballast/attention_calibration.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/limits.hpp"
#include "ballast/text.hpp"

namespace ballast {

namespace {

enum Column { kSeqLen, kPass, kTime, kHeads, kHeadDim, kBatch, kColumnCount };
constexpr std::array<std::string_view, kColumnCount> kColumnNames = {
    "seq_len_tokens", "pass", "time_s", "heads", "head_dim", "batch"};
constexpr std::string_view kExpectedHeader = "seq_len_tokens,pass,time_s,heads,head_dim[,batch]";

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) {
    text.remove_suffix(1);
  }
  return text;
}

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> fields;
  std::size_t begin = 0;
  while (true) {
    const std::size_t comma = line.find(',', begin);
    fields.push_back(trim(line.substr(begin, comma - begin)));
    if (comma == std::string_view::npos) return fields;
    begin = comma + 1;
  }
}

/// Where each column sits in a row; throws naming line 1 for a missing, unknown or
/// repeated column.
std::array<std::optional<std::size_t>, kColumnCount> read_header(std::string_view line,
                                                                 const std::string& where) {
  std::array<std::optional<std::size_t>, kColumnCount> position;
  const std::vector<std::string> known(kColumnNames.begin(), kColumnNames.end());
  const std::vector<std::string_view> fields = split_fields(line);
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const auto it = std::find(kColumnNames.begin(), kColumnNames.end(), fields[i]);
    if (it == kColumnNames.end()) {
      throw InputError(fmt::format("{}: unknown column '{}'{}; expected the header {}", where,
                                   fields[i], did_you_mean(fields[i], known), kExpectedHeader));
    }
    auto& slot = position[static_cast<std::size_t>(it - kColumnNames.begin())];
    if (slot) throw InputError(fmt::format("{}: column '{}' appears twice", where, fields[i]));
    slot = i;
  }
  for (std::size_t column = 0; column < kBatch; ++column) {
    if (!position[column]) {
      throw InputError(fmt::format("{}: the header has no column '{}'; expected {}", where,
                                   kColumnNames[column], kExpectedHeader));
    }
  }
  return position;
}

template <typename Number>
Number parse_number(std::string_view field, std::string_view column, const std::string& where,
                    std::string_view expected) {
  Number value{};
  const auto [end, error] = std::from_chars(field.data(), field.data() + field.size(), value);
  if (field.empty() || error != std::errc() || end != field.data() + field.size()) {
    throw InputError(fmt::format("{}: column '{}' is '{}'; expected {}", where, column, field,
                                 expected));
  }
  return value;
}

Pass parse_pass(std::string_view field, const std::string& where) {
  if (field == "forward" || field == "fwd") return Pass::forward;
  if (field == "backward" || field == "bwd") return Pass::backward;
  throw InputError(fmt::format("{}: column 'pass' is '{}'; expected forward, backward, fwd or bwd",
                               where, field));
}

AttentionBenchmarkRow parse_row(std::string_view line,
                                const std::array<std::optional<std::size_t>, kColumnCount>& at,
                                std::size_t columns, const std::string& where) {
  const std::vector<std::string_view> fields = split_fields(line);
  if (fields.size() != columns) {
    throw InputError(fmt::format("{}: {} fields; expected {}, one per header column", where,
                                 fields.size(), columns));
  }
  AttentionBenchmarkRow row;
  row.seq_len_tokens = parse_number<Tokens>(fields[*at[kSeqLen]], "seq_len_tokens", where,
                                            fmt::format("an integer in [1, {}]", kMaxSequenceTokens));
  row.pass = parse_pass(fields[*at[kPass]], where);
  row.time_s = parse_number<double>(fields[*at[kTime]], "time_s", where, "seconds > 0");
  row.heads = parse_number<int>(fields[*at[kHeads]], "heads", where, "an integer >= 1");
  row.head_dim = parse_number<int>(fields[*at[kHeadDim]], "head_dim", where, "an integer >= 1");
  if (at[kBatch]) {
    row.batch = parse_number<Tokens>(fields[*at[kBatch]], "batch", where, "an integer >= 1");
  }
  if (row.seq_len_tokens < 1 || row.seq_len_tokens > kMaxSequenceTokens) {
    throw InputError(fmt::format("{}: seq_len_tokens {} is outside [1, {}]", where,
                                 row.seq_len_tokens, kMaxSequenceTokens));
  }
  if (!(row.time_s > 0) || !std::isfinite(row.time_s)) {
    throw InputError(fmt::format("{}: time_s {} must be a finite number of seconds > 0", where,
                                 row.time_s));
  }
  if (row.heads < 1 || row.head_dim < 1 || row.batch < 1) {
    throw InputError(fmt::format("{}: heads ({}), head_dim ({}) and batch ({}) must be >= 1",
                                 where, row.heads, row.head_dim, row.batch));
  }
  return row;
}

}  // namespace

std::vector<AttentionBenchmarkRow> parse_attention_benchmark_csv(std::string_view text,
                                                                 const std::string& source) {
  std::vector<AttentionBenchmarkRow> rows;
  std::array<std::optional<std::size_t>, kColumnCount> at;
  std::size_t columns = 0;
  int line_number = 0;
  while (!text.empty()) {
    const std::size_t newline = text.find('\n');
    const std::string_view line = trim(text.substr(0, newline));
    text.remove_prefix(newline == std::string_view::npos ? text.size() : newline + 1);
    ++line_number;
    if (line.empty() || line.front() == '#') continue;
    const std::string where = fmt::format("{}:{}", source, line_number);
    if (columns == 0) {
      at = read_header(line, where);
      columns = split_fields(line).size();
      continue;
    }
    rows.push_back(parse_row(line, at, columns, where));
    rows.back().line = line_number;
  }
  if (rows.empty()) {
    throw InputError(fmt::format("{}: no benchmark rows; expected the header {} and one row per "
                                 "kernel call",
                                 source, kExpectedHeader));
  }
  return rows;
}

std::vector<AttentionBenchmarkRow> read_attention_benchmark_csv(const std::string& path) {
  return parse_attention_benchmark_csv(read_text_file(path), path);
}

double attention_call_flops(const AttentionBenchmarkRow& row) {
  const auto length = static_cast<double>(row.seq_len_tokens);
  const double pass_factor = row.pass == Pass::forward ? 1.0 : kAttentionBackwardFactor;
  return kAttentionFlopsPerPairPerHeadDim * row.head_dim * row.heads * (length * (length + 1) / 2) *
         static_cast<double>(row.batch) * pass_factor;
}

Seconds predicted_attention_call_s(const Cluster& cluster, const AttentionBenchmarkRow& row) {
  const AttentionTilePricing pricing(cluster);
  const double pass_factor = row.pass == Pass::forward ? 1.0 : kAttentionBackwardFactor;
  const double pairs = pricing.effective_pairs(whole_document(row.seq_len_tokens), row.pass);
  return pairs * static_cast<double>(row.batch) * kAttentionFlopsPerPairPerHeadDim *
         row.head_dim * row.heads * pass_factor /
         (cluster.peak_flops_per_s * pricing.best_tile_efficiency(row.pass));
}

AttentionCalibration fit_attention_curves(const Cluster& base,
                                          std::span<const AttentionBenchmarkRow> rows,
                                          const std::string& source) {
  if (rows.empty()) throw InputError(fmt::format("{}: no benchmark rows to fit", source));
  AttentionCalibration result;
  // (pass, length) -> (sum of efficiencies, lines): std::map keeps the lengths sorted.
  std::map<std::pair<Pass, Tokens>, std::pair<double, std::vector<int>>> points;
  for (const AttentionBenchmarkRow& row : rows) {
    const double efficiency = attention_call_flops(row) / row.time_s / base.peak_flops_per_s;
    if (!(efficiency <= 1)) {
      throw InputError(fmt::format(
          "{}:{}: this call ran at {:.3g} x the cluster's peak ({:.4g} FLOP/s); check time_s, "
          "heads, head_dim and batch, or the cluster's peak_flops_per_s",
          source, row.line, efficiency, base.peak_flops_per_s));
    }
    auto& [sum, lines] = points[{row.pass, row.seq_len_tokens}];
    sum += efficiency;
    lines.push_back(row.line);
    result.rows.push_back({row, efficiency, predicted_attention_call_s(base, row), 0.0});
  }
  result.cluster = base;
  for (Pass pass : {Pass::forward, Pass::backward}) {
    std::vector<EfficiencyPoint> curve;
    for (const auto& [key, value] : points) {
      if (key.first != pass) continue;
      const auto& [sum, lines] = value;
      curve.push_back({key.second, sum / static_cast<double>(lines.size()),
                       fmt::format("{} line{} {}", source, lines.size() == 1 ? "" : "s",
                                   fmt::join(lines, ", "))});
    }
    if (curve.empty()) continue;
    (pass == Pass::forward ? result.forward_fitted : result.backward_fitted) = true;
    (pass == Pass::forward ? result.cluster.attention_forward_curve
                           : result.cluster.attention_backward_curve) = std::move(curve);
  }
  validate_cluster(result.cluster, source);
  for (AttentionCalibrationRow& row : result.rows) {
    row.fitted_predicted_s = predicted_attention_call_s(result.cluster, row.measured);
  }
  return result;
}

}  // namespace ballast
