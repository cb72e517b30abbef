// `ballast calibrate`: fits a cluster's collective constants to nccl-tests results, writes
// the calibrated cluster JSON and prints every row's measured and fitted time.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>

#include "ballast/attention_calibration.hpp"
#include "ballast/cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/nccl_tests.hpp"
#include "commands.hpp"

namespace ballast::cli {

namespace {

void write_table(const Calibration& calibration, std::ostream& out) {
  fmt::print(out, "{:<15} {:>4} {:>5} {:>12} {:>13} {:>13} {:>8}  {}\n", "op", "gpus", "hosts",
             "bytes", "measured_us", "fitted_us", "error_%", "source");
  for (const CalibrationRow& row : calibration.rows) {
    const NcclTestsRow& measured = row.row;
    if (row.fitted || row.checked) {
      fmt::print(out, "{:<15} {:>4} {:>5} {:>12} {:>13.2f} {:>13.2f} {:>+8.1f}  {}{}\n",
                 collective_op_name(measured.op), measured.gpus, measured.hosts,
                 measured.size_bytes, measured.time_s * 1e6, row.predicted_s * 1e6,
                 100 * row.relative_error, measured.source, row.checked ? " (checked, not fitted)" : "");
    } else {
      fmt::print(out, "{:<15} {:>4} {:>5} {:>12} {:>13.2f} {:>13} {:>8}  {} (not fitted)\n",
                 collective_op_name(measured.op), measured.gpus, measured.hosts,
                 measured.size_bytes, measured.time_s * 1e6, "-", "-", measured.source);
    }
  }
  fmt::print(out, "worst relative error: {:.1f}% over {} fitted rows\n",
             100 * calibration.worst_relative_error,
             std::count_if(calibration.rows.begin(), calibration.rows.end(),
                           [](const CalibrationRow& r) { return r.fitted; }));
  for (const std::string& note : calibration.notes) fmt::print(out, "note: {}\n", note);
}

void write_attention_table(const AttentionCalibration& attention, std::ostream& out) {
  fmt::print(out, "\n{:<9} {:>10} {:>6} {:>9} {:>6} {:>13} {:>13} {:>13} {:>8}\n", "pass",
             "seq_len", "batch", "heads", "hdim", "measured_us", "before_us", "fitted_us",
             "error_%");
  double worst = 0;
  for (const AttentionCalibrationRow& row : attention.rows) {
    const AttentionBenchmarkRow& m = row.measured;
    const double error = row.fitted_predicted_s / m.time_s - 1;
    worst = std::max(worst, std::abs(error));
    fmt::print(out, "{:<9} {:>10} {:>6} {:>9} {:>6} {:>13.2f} {:>13.2f} {:>13.2f} {:>+8.1f}\n",
               m.pass == Pass::forward ? "forward" : "backward", m.seq_len_tokens, m.batch,
               m.heads, m.head_dim, m.time_s * 1e6, row.base_predicted_s * 1e6,
               row.fitted_predicted_s * 1e6, 100 * error);
  }
  fmt::print(out, "attention: worst relative error {:.1f}% over {} rows (before: the base "
                  "cluster's curves)\n",
             100 * worst, attention.rows.size());
}

nlohmann::json attention_rows_json(const AttentionCalibration& attention) {
  nlohmann::json rows = nlohmann::json::array();
  for (const AttentionCalibrationRow& row : attention.rows) {
    const AttentionBenchmarkRow& m = row.measured;
    rows.push_back({{"pass", m.pass == Pass::forward ? "forward" : "backward"},
                    {"seq_len_tokens", m.seq_len_tokens},
                    {"batch", m.batch},
                    {"heads", m.heads},
                    {"head_dim", m.head_dim},
                    {"measured_s", m.time_s},
                    {"base_predicted_s", row.base_predicted_s},
                    {"predicted_s", row.fitted_predicted_s},
                    {"relative_error", row.fitted_predicted_s / m.time_s - 1},
                    {"efficiency", row.efficiency}});
  }
  return rows;
}

nlohmann::json rows_json(const Calibration& calibration) {
  nlohmann::json rows = nlohmann::json::array();
  for (const CalibrationRow& row : calibration.rows) {
    nlohmann::json entry = {{"op", collective_op_name(row.row.op)},
                            {"gpus", row.row.gpus},
                            {"hosts", row.row.hosts},
                            {"bytes", row.row.size_bytes},
                            {"measured_s", row.row.time_s},
                            {"source", row.row.source},
                            {"fitted", row.fitted}};
    if (row.fitted || row.checked) {
      entry["predicted_s"] = row.predicted_s;
      entry["relative_error"] = row.relative_error;
      if (row.checked) {
        entry["checked"] = true;
        entry["note"] = row.note;
      }
    } else {
      entry["predicted_s"] = nullptr;
      entry["relative_error"] = nullptr;
      entry["note"] = row.note;
    }
    rows.push_back(std::move(entry));
  }
  return {{"rows", std::move(rows)},
          {"worst_relative_error", calibration.worst_relative_error},
          {"notes", calibration.notes},
          {"cluster", calibration.cluster.name}};
}

}  // namespace

int run_calibrate(const CalibrateArgs& args) {
  if (args.format != "text" && args.format != "json") {
    throw InputError(fmt::format("--format {}: unknown format; use text or json", args.format));
  }
  if (args.nccl_tests_files.empty()) {
    throw InputError("calibrate needs --nccl-tests FILE... (nccl-tests output or CSV)");
  }
  // Checked before any work, so a typo in -o does not cost the fit.
  if (!args.output_path.empty()) {
    const auto parent = std::filesystem::path(args.output_path).parent_path();
    if (!parent.empty() && !std::filesystem::is_directory(parent)) {
      throw InputError(fmt::format("-o {}: the folder '{}' does not exist; check the path",
                                   args.output_path, parent.string()));
    }
  }
  const Cluster base = load_cluster(args.cluster);
  std::vector<NcclTestsRow> rows;
  for (const std::string& path : args.nccl_tests_files) {
    std::vector<NcclTestsRow> file_rows = read_nccl_tests_file(path);
    rows.insert(rows.end(), file_rows.begin(), file_rows.end());
  }
  Calibration calibration = calibrate_cluster(base, rows, args.nccl_tests_files, args.name);
  std::optional<AttentionCalibration> attention;
  if (!args.attention_path.empty()) {
    const std::vector<AttentionBenchmarkRow> attention_rows =
        read_attention_benchmark_csv(args.attention_path);
    attention = fit_attention_curves(calibration.cluster, attention_rows, args.attention_path);
    attention->cluster.provenance +=
        fmt::format(" Attention efficiency curves fitted to {} ({} rows: {}{}{}).",
                    std::filesystem::path(args.attention_path).filename().string(),
                    attention_rows.size(), attention->forward_fitted ? "forward" : "",
                    attention->forward_fitted && attention->backward_fitted ? ", " : "",
                    attention->backward_fitted ? "backward" : "");
    calibration.cluster = attention->cluster;
  }

  if (args.format == "json") {
    nlohmann::json json = rows_json(calibration);
    if (attention) json["attention_rows"] = attention_rows_json(*attention);
    std::cout << json.dump(1) << "\n";
  } else {
    write_table(calibration, std::cout);
    if (attention) write_attention_table(*attention, std::cout);
  }
  if (!args.output_path.empty()) {
    std::ofstream file(args.output_path, std::ios::binary | std::ios::trunc);
    file << to_json(calibration.cluster).dump(1) << "\n";
    file.flush();
    if (!file) {
      throw InputError(fmt::format("-o {}: cannot write this file; check the path", args.output_path));
    }
    fmt::print(std::cerr, "ballast calibrate: wrote cluster '{}' to {}\n", calibration.cluster.name,
               args.output_path);
  }
  return 0;
}

}  // namespace ballast::cli
