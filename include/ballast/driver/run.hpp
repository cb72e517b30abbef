// The run driver (`ballast run`): acquires the step's plans (samples batches and plans them
// with any strategy, or reads plan files and checks they fit the job), runs each step on the
// MPI runtime, checks it against the single-process reference, applies AdamW, and gathers
// every rank's measurements and the first step's measured timeline into a report. The
// runtime (src/runtime) only executes; planning and reporting live here.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <mpi.h>

#include "ballast/plan.hpp"
#include "ballast/runtime/corpus.hpp"
#include "ballast/runtime/fault.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/runtime/step.hpp"
#include "ballast/settings.hpp"
#include "ballast/trace.hpp"

namespace ballast::driver {

struct RunOptions {
  RunSettings settings;        ///< dataset, sampler, steps, seed (cluster/model: see below)
  std::string strategy = "zeppelin";  ///< a strategy spec, used when plan_path is empty
  std::string plan_path;       ///< plans written by `ballast plan` (one or an array)
  runtime::ModelConfig model;
  /// An MoE model's expert-parallel size (runtime::StepOptions::expert_parallel).
  int expert_parallel = 1;
  /// Sampled lengths are divided by this (rounded up) so documents of a 128K corpus fit a
  /// CPU step; the shape of the distribution is kept.
  std::int64_t length_scale = 64;
  Tokens rank_tokens = 4096;   ///< per-rank memory budget in tokens (sets the planning memory)
  int gpus_per_node = 2;       ///< emulated node size (node membership for routing and bytes)
  std::string corpus;          ///< text source; empty: Debian's /usr/share/common-licenses
  runtime::AdamWConfig adamw;
  bool check = false;          ///< also run the single-process reference and compare
  bool record_trace = false;   ///< measure the first step's timeline (RunReport::trace)
  /// This host's measured constants (`ballast calibrate --host`, checked against the job):
  /// the cluster plans are made on and every step is predicted with. Required.
  Cluster host;
  std::string host_source;     ///< where host came from, for the report
};

/// `ballast run --check`'s tolerance: a step passes when the norm-wise relative error of
/// its loss and of every gradient tensor against the single-process reference is at most
/// this (docs/runtime.md#exactness: distribution only reorders fp32 sums, ~1e-6; the
/// mpi_exactness tests use the same bound).
inline constexpr double kCheckTolerance = 1e-5;

struct StepReport {
  int step = 0;
  int micro_batches = 0;
  double loss = 0;             ///< mean cross-entropy over the step's targets
  double max_relative_error = -1;  ///< with check: worst of loss and every gradient tensor
  bool check_passed() const { return max_relative_error <= kCheckTolerance; }  ///< with check
  std::string worst_tensor;
  std::vector<runtime::RankMeasurement> ranks;  ///< on rank 0; empty elsewhere
  double imbalance = 1;        ///< max / mean busy
  double step_wall_s = 0;      ///< max over ranks
  /// The simulator's prediction of this step's plan on the host's constants (rank 0):
  /// the step (GradientSync::end, as the runtime all-reduces after the last backward) and
  /// each rank's busy time (compute), next to ranks[r].busy_s.
  double predicted_step_s = 0;
  std::vector<double> predicted_busy_s;
  std::string prediction_note;  ///< why there is no prediction (predicted_busy_s empty)
};

/// How far the predictions of a run were from its measurements: relative errors
/// predicted / measured - 1 of every rank's busy time in every step, of the busiest rank's
/// busy time summed over the steps, and of every step's time against its wall time. Only
/// the steps with a prediction count (predicted_steps of them; none: every figure is
/// meaningless, and note says why).
struct PredictionSummary {
  int predicted_steps = 0;
  std::string note;                       ///< the first unpredicted step's prediction_note
  double busy_median_relative_error = 0;  ///< median of |error| over ranks and steps
  double busy_worst_relative_error = 0;   ///< the largest |error|, signed
  double busiest_relative_error = 0;      ///< sum over steps of max busy, predicted vs measured
  double step_median_relative_error = 0;  ///< median |error| of predicted step vs step wall
  double step_worst_relative_error = 0;   ///< signed
  double predicted_busiest_s = 0;         ///< sum over steps
  double measured_busiest_s = 0;
  double predicted_step_s = 0;            ///< sum over steps
  double measured_step_s = 0;
};
PredictionSummary summarise_prediction(std::span<const StepReport> steps);


/// How many attention groups of one scheme and size the run's plans held (every step and
/// micro-batch): what the strategy actually ran (static-cp on a short context runs only
/// local groups, say).
struct GroupsRun {
  std::string scheme;  ///< to_string(Scheme)
  int ranks = 1;       ///< the group's plan ranks
  int groups = 0;
};

struct RunReport {
  std::string strategy;
  std::vector<GroupsRun> groups_run;  ///< by scheme (in Scheme order), then size
  int ranks = 0;
  std::string corpus_provenance;
  std::vector<StepReport> steps;
  std::vector<TraceEvent> trace;  ///< rank 0, with record_trace: the first step's events of every rank
  /// rank 0, with record_trace: the simulator's timeline of the first step's plan
  std::vector<TraceEvent> predicted_trace;
  int gpus_per_node = 1;
  std::string host_name;           ///< the host calibration's name
  std::string host_source;         ///< where it came from (RunOptions::host_source)
  std::string host_measured_at;    ///< its measured_on time (ISO 8601 UTC); empty: none
  std::string host_provenance;
  std::string blas_note;           ///< how many BLAS threads each rank ran, and why
};

/// Whether the simulator orders several strategies' runs of the same batches as they
/// measured: the busiest rank's busy time summed over the steps, measured and predicted,
/// their Spearman rank correlation, and the pairs the prediction orders the wrong way
/// among those whose measured times differ by more than `margin` (closer ones are ties).
/// Strategies run on the same batches, measured against predicted. A strategy with a step
/// the simulator did not predict (a --plan file that does not fit the host calibration)
/// has no predicted figure (nullopt, with `notes[i]` saying why) and is left out of the
/// correlation and the order; its measured figure stands.
struct StrategyRanking {
  std::vector<std::string> strategies;
  std::vector<double> measured_busiest_s;  ///< sum over the steps of the busiest rank's busy time
  std::vector<std::optional<double>> predicted_busiest_s;
  std::vector<std::string> notes;  ///< why a strategy has no prediction (empty when it has)
  double rank_correlation = 1;
  std::vector<std::string> disagreements;  ///< "a/b": measured a < b, predicted a > b
  double margin = 0.05;
};
StrategyRanking rank_strategies(std::span<const RunReport> runs, double margin = 0.05);

/// The plans of the run, the same on every rank: read from options.plan_path (each checked
/// against the job: rank count, heads, MPI message sizes; and validated), or
/// options.settings.steps batches sampled, scaled by length_scale and planned with
/// options.strategy on the emulated cluster. Throws InputError (before any communication,
/// identically on every rank) or PlanningError.
std::vector<Plan> acquire_plans(const RunOptions& options, int ranks);

/// Checks what can be checked of `options` before the host calibration is read or
/// measured (seconds, and a cache file): the model, and without a plan file the sampling
/// flags, --tp, the emulated shape (--gpus-per-node), --expert-parallel and the strategy
/// spec. Throws InputError naming the flag; communicates nothing.
void check_run_options(const RunOptions& options, int ranks);

/// What a run needs before its first message: the plans (acquire_plans), the corpus and
/// the initial parameters.
struct PreparedRun {
  std::vector<Plan> plans;
  runtime::Corpus corpus;
  runtime::Parameters parameters;
  std::optional<runtime::FaultInjection> fault;  ///< BALLAST_FAULT (test-only), read once
};
/// The run's set-up on one rank of `ranks`: acquire_plans(), the BALLAST_FAULT check, the
/// corpus, the parameters. Communicates nothing and is identical on every rank (same
/// flags, files and seed), so a caller can let the ranks agree on its outcome with one
/// collective and report a failure once (tools/ballast/run_command.cpp). Throws InputError
/// for bad options, plans or files.
PreparedRun prepare_run(const RunOptions& options, int ranks);
/// What a run is predicted to take, known before its first step (rank 0).
struct RunForecast {
  std::size_t steps = 0;
  int predicted_steps = 0;   ///< steps with a prediction
  double predicted_s = 0;    ///< their predicted step times summed (each rank on its own core)
  std::string note;          ///< the first unpredicted step's prediction_note
};
/// Rank 0's view of a run as it goes, for the caller to show (the driver prints nothing):
/// `started` once the steps are predicted, before the first runs; `stepped` after each
/// step (its report, index and the step count). Either may be empty.
struct RunProgress {
  std::function<void(const RunReport&, const RunForecast&)> started;
  std::function<void(const StepReport&, std::size_t step, std::size_t steps)> stepped;
};

/// Runs the prepared steps on every rank of `comm` (collective): rank 0 first predicts
/// every step (the simulator on the host calibration), then each step, the check against
/// the single-process reference, AdamW, the gathered measurements.
RunReport run_training(const RunOptions& options, PreparedRun prepared, MPI_Comm comm,
                       const RunProgress& progress = {});

}  // namespace ballast::driver
