// The ballast subcommands. Each returns the process exit code.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "ballast/driver/run.hpp"
#include "options.hpp"

namespace ballast::cli {

/// Exit codes (docs/cli.md): 0 success, 1 the plan is invalid (validate) or the run
/// differs from the single process (run --check), 2 bad input or usage, 3 internal error
/// (a bug: please report it).
inline constexpr int kExitInvalidPlan = 1;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitInternal = 3;

/// The strategy `ballast plan` and `ballast simulate` use without --strategy (issue 21):
/// ballast's own, the best of the others improved by its local search.
inline constexpr const char* kDefaultStrategy = "ballast";

struct PlanArgs {
  WorkloadFlags workload;
  OutputFlags output;
  std::string strategy;  ///< empty: kDefaultStrategy
  std::string scenario;  ///< --scenario: its workload settings (flags override them)
};
struct SimulateArgs {
  WorkloadFlags workload;
  OutputFlags output;
  std::string strategy;
  std::string plan_path;
  std::string scenario;  ///< --scenario: its workload settings (flags override them)
  std::string trace_path;
  std::string plot_path;  ///< --plot: the first step's per-rank timeline (.svg or .png)
};
struct CompareArgs {
  WorkloadFlags workload;
  OutputFlags output;
  std::string strategies;
  std::string baseline;
  std::string scenario;
  std::string plot_path;  ///< --plot: step time per strategy with bound and speedups
  std::string sweep;      ///< --sweep degree=V1,V2,...: see expand_degree_sweep()
  bool ablation = false;  ///< strategies = ablation_ladder()
};

/// Zeppelin's ablation ladder, one technique added per row (docs/zeppelin.md): TE CP,
/// even splitting without padding, + routing, + hierarchical partitioning and the engine,
/// + remapping; and the full system without routing.
std::vector<std::string> ablation_ladder();
struct RunArgs {
  WorkloadFlags workload;
  OutputFlags output;
  driver::RunOptions options;
  std::string trace_path;
  bool recalibrate = false;  ///< measure the host again and replace the cached calibration
  std::vector<std::string> flags_given;  ///< long names of the flags on the command line
};
/// `ballast calibrate` (calibrate_command.cpp).
struct CalibrateArgs {
  std::vector<std::string> nccl_tests_files;
  std::string cluster = "h100";  ///< the base cluster the fitted constants replace
  std::string name;              ///< default "<base>-calibrated"
  std::string output_path;       ///< the calibrated cluster JSON; empty: not written
  std::string format = "text";   ///< of the rows table on stdout: text or json
  std::string attention_path;    ///< an attention kernel benchmark CSV; empty: none
  bool host = false;             ///< --host: measure this machine under MPI instead
  runtime::ModelConfig model;    ///< with --host: the runtime model measured
  std::vector<std::string> flags_given;  ///< long names of the flags on the command line
};
struct ValidateArgs {
  std::string plan_path;
  std::string format = "text";
};

int run_list(const std::string& what, std::ostream& out);
int run_plan(const PlanArgs& args);
int run_simulate(const SimulateArgs& args);
int run_compare(const CompareArgs& args);
int run_validate(const ValidateArgs& args);
int run_calibrate(const CalibrateArgs& args);
/// `ballast calibrate --host` under mpirun (calibrate_host_command.cpp).
int run_calibrate_host(const CalibrateArgs& args);
/// Under mpirun: initialises MPI, runs, finalises; a failing rank aborts the job.
int run_run(const RunArgs& args);

}  // namespace ballast::cli
