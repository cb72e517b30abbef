// `ballast calibrate --host`: measures this machine under mpirun (driver/host_calibration.hpp)
// and writes the cluster `ballast run` plans and predicts with.
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "ballast/driver/host_calibration.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"
#include "commands.hpp"

namespace ballast::cli {

namespace {

/// Flags of the nccl-tests calibration that mean nothing with --host.
constexpr const char* kFileFlags[] = {"--nccl-tests", "--attention", "--cluster", "--name"};

void write_host_table(const driver::HostCalibration& calibration, std::ostream& out) {
  fmt::print(out, "{:<28} {:>22} {:>13} {:>13} {:>8}\n", "measured", "size", "measured_us", "fitted_us",
             "error_%");
  for (const driver::HostCalibrationRow& row : calibration.rows) {
    fmt::print(out, "{:<28} {:>22} {:>13.2f} {:>13.2f} {:>+8.1f}\n", row.what, row.size, row.measured_s * 1e6,
               row.fitted_s * 1e6, row.measured_s > 0 ? 100 * (row.fitted_s / row.measured_s - 1) : 0.0);
  }
  const Cluster& cluster = calibration.cluster;
  fmt::print(out,
             "peak {:.2f} GFLOP/s (sgemm), linear layers at {:.1f}% of it, attention best {:.1f}% (forward), "
             "p2p {:.2f} GB/s after {:.2f} us; {:.1f} s\n",
             cluster.peak_flops_per_s / 1e9, 100 * cluster.matmul_efficiency, 100 * cluster.attention_efficiency,
             cluster.intra_node_p2p_bw_bytes_per_s / 1e9, cluster.intra_node_latency_s * 1e6, calibration.seconds);
}

nlohmann::json host_rows_json(const driver::HostCalibration& calibration) {
  nlohmann::json rows = nlohmann::json::array();
  for (const driver::HostCalibrationRow& row : calibration.rows) {
    rows.push_back({{"measured", row.what},
                    {"size", row.size},
                    {"measured_s", row.measured_s},
                    {"predicted_s", row.fitted_s},
                    {"relative_error", row.measured_s > 0 ? row.fitted_s / row.measured_s - 1 : 0.0}});
  }
  return {{"rows", std::move(rows)}, {"cluster", calibration.cluster.name}, {"seconds", calibration.seconds}};
}

}  // namespace

int run_calibrate_host(const CalibrateArgs& args) {
  using runtime::check_mpi;
  // As `ballast run` does: one BLAS thread per rank unless the user chose.
  driver::pin_blas_threads();
  check_mpi(MPI_Init(nullptr, nullptr), "MPI_Init");
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size");
  int code = 0;
  try {
    std::vector<std::string> conflicting;
    for (const char* flag : kFileFlags) {
      if (std::find(args.flags_given.begin(), args.flags_given.end(), flag) != args.flags_given.end()) {
        conflicting.push_back(flag);
      }
    }
    if (!conflicting.empty()) {
      throw InputError(fmt::format("--host measures this machine; {} fit(s) a GPU cluster from files instead: "
                                   "drop {}", fmt::join(conflicting, ", "), conflicting.size() == 1 ? "it" : "them"));
    }
    if (args.format != "text" && args.format != "json") {
      throw InputError(fmt::format("--format {}: unknown format; use text or json", args.format));
    }
    if (ranks < 2) {
      throw InputError("calibrate --host measures the MPI links between ranks, and this job has one rank: "
                       "launch it under mpirun with the ranks `ballast run` will use, e.g. "
                       "`mpirun -np 2 ballast calibrate --host` (scripts/ballast-run adds the flags this "
                       "machine needs)");
    }
    args.model.check();
    if (!args.output_path.empty()) {
      const auto parent = std::filesystem::path(args.output_path).parent_path();
      if (!parent.empty() && !std::filesystem::is_directory(parent)) {
        throw InputError(fmt::format("-o {}: the folder '{}' does not exist; check the path", args.output_path,
                                     parent.string()));
      }
    }
  } catch (const InputError& error) {
    // Every rank sees the same flags and rank count: each fails alike; rank 0 says why.
    if (rank == 0) std::cerr << "ballast calibrate: " << error.what() << "\n";
    code = kExitBadInput;
  }
  if (code != 0) {
    check_mpi(MPI_Finalize(), "MPI_Finalize");
    return code;
  }
  try {
    const driver::HostCalibration calibration = driver::calibrate_host(args.model, MPI_COMM_WORLD);
    if (rank == 0) {
      const std::string path = args.output_path.empty()
                                   ? driver::host_calibration_cache_path(*calibration.cluster.measured_on)
                                   : args.output_path;
      driver::write_cluster_file(calibration.cluster, path);
      if (args.format == "json") {
        nlohmann::json json = host_rows_json(calibration);
        json["path"] = path;
        std::cout << json.dump(1) << "\n";
      } else {
        write_host_table(calibration, std::cout);
      }
      fmt::print(std::cerr, "ballast calibrate: wrote cluster '{}' to {}{}\n", calibration.cluster.name, path,
                 args.output_path.empty() ? " (the cache `ballast run` reads)" : "");
    }
  } catch (const InputError& error) {
    std::cerr << fmt::format("ballast calibrate: error on rank {}: {}\n", rank, error.what());
    MPI_Abort(MPI_COMM_WORLD, kExitBadInput);  // the other ranks may wait in a collective
    std::_Exit(kExitBadInput);
  }
  check_mpi(MPI_Finalize(), "MPI_Finalize");
  return 0;
}

}  // namespace ballast::cli
