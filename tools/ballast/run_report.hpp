// `ballast run`'s report: the text and JSON of each strategy's run, the ranking of several
// strategies, the --check verdict and the progress lines on stderr (run_command.cpp runs
// the job; this writes what it measured).
#pragma once

#include <chrono>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "ballast/driver/run.hpp"
#include "commands.hpp"

namespace ballast::cli {

/// The run of one strategy as text: header, groups run, calibration, each step's ranks
/// measured next to predicted, the prediction summary and (--check) the verdict.
void write_text(const driver::RunReport& report, const RunArgs& args, std::ostream& out);
/// The same as JSON (`ballast.run/1`; docs/cli.md).
nlohmann::ordered_json to_json(const driver::RunReport& report, const RunArgs& args);
/// Several strategies on the same batches, measured against predicted.
void write_ranking(const driver::StrategyRanking& ranking, std::ostream& out);
nlohmann::ordered_json ranking_json(const driver::StrategyRanking& ranking);
/// The first step of `report` that --check failed, or nullptr.
const driver::StepReport* failed_check(const driver::RunReport& report);
/// Why `step` of `report` failed --check.
std::string check_failure(const driver::RunReport& report, const driver::StepReport& step);

/// `ballast run`'s progress on rank 0's stderr: what the run is predicted to take before
/// its first step, then the steps as they end (at most one line a second, and the last).
/// Always printed, as plain lines: under mpirun a rank's stderr is a pipe to mpirun, never
/// a terminal, so `compare`'s terminal-only status line would never show, and a run of
/// large plans can take minutes.
class RunProgressLines {
 public:
  driver::RunProgress callbacks();

 private:
  using Clock = std::chrono::steady_clock;
  void started(const driver::RunReport& report, const driver::RunForecast& forecast);
  void stepped(const driver::StepReport& step, std::size_t index, std::size_t steps);

  std::string strategy_;
  Clock::time_point started_, last_line_;
};

}  // namespace ballast::cli
