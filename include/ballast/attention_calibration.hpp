// Attention calibration: a user's attention kernel benchmark (CSV) turned into the
// cluster's attention efficiency curves, with measured against predicted seconds per row.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// One row of an attention kernel benchmark: one call over `batch` causal documents of
/// `seq_len_tokens` tokens each, `heads` heads of `head_dim`, taking `time_s` seconds.
struct AttentionBenchmarkRow {
  Tokens seq_len_tokens = 0;
  Pass pass = Pass::forward;
  Seconds time_s = 0;
  int heads = 0;
  int head_dim = 0;
  Tokens batch = 1;  ///< documents per call (the CSV's optional `batch` column)
  int line = 0;      ///< line in the file, 1-based (the header is line 1)
};

/// Parses a benchmark CSV: a header naming the columns seq_len_tokens, pass, time_s,
/// heads, head_dim and optionally batch (any order), then one row per call. pass is
/// forward/backward (or fwd/bwd). Blank lines and lines starting with '#' are skipped.
/// Throws InputError "<source>:<line>: ..." saying what was expected; at least one row.
std::vector<AttentionBenchmarkRow> parse_attention_benchmark_csv(std::string_view text,
                                                                 const std::string& source);
/// read_text_file(path) then parse_attention_benchmark_csv(text, path).
std::vector<AttentionBenchmarkRow> read_attention_benchmark_csv(const std::string& path);

/// Causal FLOPs of one row's call: 4 * head_dim * heads * L(L+1)/2 * batch, x2.5 backward.
double attention_call_flops(const AttentionBenchmarkRow& row);

/// A row's call as `cluster`'s analytical attention pricing predicts it (whole documents,
/// one layer; AttentionTilePricing).
Seconds predicted_attention_call_s(const Cluster& cluster, const AttentionBenchmarkRow& row);

struct AttentionCalibrationRow {
  AttentionBenchmarkRow measured;
  double efficiency = 0;           ///< attention_call_flops / time_s / peak_flops_per_s
  Seconds base_predicted_s = 0;    ///< predicted with the base cluster's curves
  Seconds fitted_predicted_s = 0;  ///< predicted with the fitted curves
};

struct AttentionCalibration {
  /// The base cluster with each benchmarked pass's curve replaced by the measured points
  /// (one per distinct length: the mean efficiency of its rows); a pass with no rows keeps
  /// the base's curve.
  Cluster cluster;
  bool forward_fitted = false;
  bool backward_fitted = false;
  std::vector<AttentionCalibrationRow> rows;  ///< in input order
};

/// Fits the attention curves of `base` to `rows` (read from `source`, named in errors).
/// Throws InputError naming source and line when a row runs above the cluster's peak
/// (efficiency > 1: a wrong time, head count or peak_flops_per_s), or when there are no rows.
/// `ballast calibrate --attention FILE` prints `rows` as a table and writes `cluster`.
AttentionCalibration fit_attention_curves(const Cluster& base,
                                          std::span<const AttentionBenchmarkRow> rows,
                                          const std::string& source);

}  // namespace ballast
