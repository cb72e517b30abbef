// `ballast calibrate`: fits a cluster's collective constants to nccl-tests results, writes
// the calibrated cluster JSON and prints every row's measured and fitted time.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <nlohmann/json.hpp>

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
    if (row.fitted) {
      fmt::print(out, "{:<15} {:>4} {:>5} {:>12} {:>13.2f} {:>13.2f} {:>+8.1f}  {}\n",
                 collective_op_name(measured.op), measured.gpus, measured.hosts,
                 measured.size_bytes, measured.time_s * 1e6, row.predicted_s * 1e6,
                 100 * row.relative_error, measured.source);
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
    if (row.fitted) {
      entry["predicted_s"] = row.predicted_s;
      entry["relative_error"] = row.relative_error;
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
  const Calibration calibration =
      calibrate_cluster(base, rows, args.nccl_tests_files, args.name);

  if (args.format == "json") {
    std::cout << rows_json(calibration).dump(1) << "\n";
  } else {
    write_table(calibration, std::cout);
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
