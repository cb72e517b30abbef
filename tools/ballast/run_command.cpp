// `ballast run`: the MPI runtime (launched under mpirun -np N, one rank per emulated GPU):
// flags, the host calibration, the plans, the job; its report is run_report.cpp.
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/driver/host_calibration.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/driver/run.hpp"
#include "ballast/trace.hpp"
#include "commands.hpp"
#include "run_report.hpp"

namespace ballast::cli {

namespace {

/// Workload flags `ballast run` has no use for: it plans for the job it runs in.
constexpr struct {
  const char* flag;
  const char* instead;
} kIgnoredFlags[] = {
    {"--nodes", "the emulated cluster is the job's ranks (mpirun -np) in nodes of --gpus-per-node"},
    {"--model", "the model is the runtime's own: set it with --hidden, --layers, --heads, --kv-heads, --ffn"},
    {"--cost-model", "plans use the analytical cost model on this host's calibration (--cluster)"},
};

/// Flags that choose, sample or plan the batches. A plan file fixes all of that (its
/// sequence lengths, its steps, its strategy and its emulated cluster), so with --plan
/// they would silently run something other than what was asked. (--seed still picks
/// the text cut from the corpus and the initial weights.)
constexpr const char* kPlanningFlags[] = {
    "--dataset", "--lengths", "--steps", "--tokens-per-step", "--batch-size", "--max-context",
    "--over-context", "--sampling", "--degree", "--no-routing", "--no-remap", "--even-split",
    "--strategy", "--length-scale", "--rank-tokens", "--gpus-per-node"};

bool given(const RunArgs& args, const std::string& flag) {
  return std::find(args.flags_given.begin(), args.flags_given.end(), flag) != args.flags_given.end();
}

/// Throws InputError for flags that would have no effect on this run (before MPI talks).
void reject_flags_without_effect(const RunArgs& args) {
  for (const auto& ignored : kIgnoredFlags) {
    if (given(args, ignored.flag)) {
      throw InputError(fmt::format("{} has no effect on ballast run: {}; drop it", ignored.flag, ignored.instead));
    }
  }
  if (args.options.plan_path.empty()) return;
  std::vector<std::string> conflicting;
  for (const char* flag : kPlanningFlags) {
    if (given(args, flag)) conflicting.push_back(flag);
  }
  if (!conflicting.empty()) {
    throw InputError(fmt::format("--plan {}: the file's plans fix the batches (their sequence lengths and "
                                 "steps), the strategy and the emulated cluster, so {} would not apply; "
                                 "drop {} or plan again with `ballast plan`",
                                 args.options.plan_path, fmt::join(conflicting, ", "),
                                 conflicting.size() == 1 ? "it" : "them"));
  }
}

/// Ends every rank of the job with `code` (mpirun reports it). MPI_Abort does not
/// return; if it fails there is nothing left to report, so exit.
[[noreturn]] void abort_job(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

/// The job's exit code after set-up: 0 when every rank succeeded, else the worst code of
/// the failing ranks. The lowest failing rank prints its message once, saying how many
/// ranks failed. Collective: every rank of MPI_COMM_WORLD calls it.
int agree_on_setup(int code, const std::string& message, int rank, int ranks) {
  using runtime::check_mpi;
  int worst = 0, first = 0, failing = 0;
  const int mine_first = code != 0 ? rank : ranks;
  const int mine_failing = code != 0 ? 1 : 0;
  check_mpi(MPI_Allreduce(&code, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
  if (worst == 0) return 0;
  check_mpi(MPI_Allreduce(&mine_first, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce");
  check_mpi(MPI_Allreduce(&mine_failing, &failing, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  if (rank == first) {
    const std::string others = failing == ranks && ranks > 1 ? " (and every other rank)"
                               : failing > 1 ? fmt::format(" (and {} other ranks)", failing - 1)
                                             : "";
    std::cerr << fmt::format("ballast run: error on rank {}{}: {}\n", rank, others, message);
  }
  return worst;
}


/// The host calibration the run plans and predicts with, the same on every rank
/// (collective): --cluster FILE, checked against this job; else the cached calibration of
/// this host, job and model, measured now (and cached) when missing or stale. Rank 0 reads
/// and decides; the others receive the cluster. Throws InputError (on rank 0) for a bad
/// --cluster; `code`/`message` carry it so the ranks agree before anyone fails.
struct HostResolution {
  Cluster cluster;
  std::string source;
  bool measure = false;
  std::string cache_path;
};

HostResolution read_host_calibration(const RunArgs& args, const HostRecord& here) {
  HostResolution resolution;
  if (args.workload.cluster) {
    const std::string& path = *args.workload.cluster;
    if (args.recalibrate) {
      throw InputError(fmt::format("--recalibrate measures this host into the cache, --cluster {} gives a "
                                   "calibration: drop one (to measure into {}: `mpirun -np {} ballast "
                                   "calibrate --host -o {}`)", path, path, here.ranks, path));
    }
    if (!std::filesystem::is_regular_file(path)) {
      throw InputError(fmt::format("--cluster {}: ballast run needs this host's calibration, a file written by "
                                   "`mpirun -np {} ballast calibrate --host -o FILE`; drop --cluster to use "
                                   "(or make) the cached one", path, here.ranks));
    }
    resolution.cluster = load_cluster(path);
    driver::check_host_calibration(resolution.cluster, here, "--cluster " + path);
    resolution.source = "--cluster " + path;
    return resolution;
  }
  resolution.cache_path = driver::host_calibration_cache_path(here);
  if (!args.recalibrate && std::filesystem::is_regular_file(resolution.cache_path)) {
    try {
      resolution.cluster = load_cluster(resolution.cache_path);
      driver::check_host_calibration(resolution.cluster, here, resolution.cache_path);
      resolution.source = "cached at " + resolution.cache_path;
      return resolution;
    } catch (const InputError&) {
      // Stale or damaged: measure again and replace it.
    }
  }
  resolution.measure = true;
  return resolution;
}

}  // namespace

int run_run(const RunArgs& args) {
  using runtime::check_mpi;
  const std::string blas_note = driver::pin_blas_threads();  // before any GEMM
  check_mpi(MPI_Init(nullptr, nullptr), "MPI_Init");
  // Failing calls return their code to check_mpi, which names the call and the rank
  // before aborting; MPI's default handler would abort without either.
  check_mpi(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  int rank = 0, ranks = 1;
  check_mpi(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(MPI_COMM_WORLD, &ranks), "MPI_Comm_size");
  // Set-up (flags, plans, corpus) communicates nothing and is the same on every rank, so a
  // bad flag fails on all of them: the ranks agree on the outcome with collectives every
  // rank reaches, and the lowest failing rank alone prints the error (not one copy per
  // rank followed by MPI_Abort's banner); every rank then exits with the error's code.
  driver::RunOptions options = args.options;
  Format format = Format::text;
  std::optional<driver::PreparedRun> prepared;
  int setup_code = 0;
  std::string setup_error;
  const HostRecord here = driver::current_host(options.model, MPI_COMM_WORLD);
  HostResolution host;
  std::vector<std::pair<driver::RunOptions, driver::PreparedRun>> runs;
  // Runs a set-up stage, recording its failure (the ranks agree on it afterwards).
  const auto guarded = [&](const auto& stage) {
    try {
      stage();
    } catch (const InputError& error) {
      setup_code = kExitBadInput;
      setup_error = error.what();
    } catch (const std::exception& error) {
      setup_code = kExitInternal;
      setup_error = fmt::format("internal error (please report): {}", error.what());
    }
  };
  guarded([&] {
    format = parse_format(args.output.format);
    if (format == Format::csv) throw InputError("ballast run prints text or json; use --format text or json");
    reject_flags_without_effect(args);
    options.model.check();
    options.settings.steps = args.workload.steps.value_or(1);
    apply_workload_flags(args.workload, options.settings);
    if (!args.workload.tokens_per_step && !args.workload.batch_size) {
      // Default budget: half of the job's memory, in the dataset's own (unscaled) tokens.
      options.settings.sampler.tokens_per_step = options.rank_tokens * ranks / 2 * options.length_scale;
    }
    if (!options.plan_path.empty()) {
      // Plan files are checked against the job before anything is measured.
      prepared = driver::prepare_run(options, ranks);
    } else {
      // So are the flags: a bad one fails before the host is measured (and cached).
      for (const std::string& strategy : apply_ablation_flags(args.workload, split_list(options.strategy))) {
        driver::RunOptions strategy_options = options;
        strategy_options.strategy = strategy;
        driver::check_run_options(strategy_options, ranks);
      }
    }
    if (rank == 0) host = read_host_calibration(args, here);
  });
  // Collective: whether any rank failed so far; if so MPI is finalized and job_code holds
  // the worst code, which every rank returns.
  int job_code = 0;
  const auto agreed_failure = [&] {
    job_code = agree_on_setup(setup_code, setup_error, rank, ranks);
    if (job_code != 0) check_mpi(MPI_Finalize(), "MPI_Finalize");
    return job_code != 0;
  };
  if (agreed_failure()) return job_code;
  // Started without mpirun (Open MPI's launcher sets OMPI_COMM_WORLD_SIZE; a singleton has
  // no launcher), the job is this one rank: say so once the flags are good (a bad flag's
  // error stays the one line), rather than run it silently.
  if (ranks == 1 && std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMI_SIZE") == nullptr) {
    fmt::print(stderr, "ballast run: running 1 rank (started without mpirun); for N ranks use "
                       "`mpirun -np N ballast run ...` or scripts/ballast-run N ...\n");
  }
  // Rank 0 decided; measure here when needed (every rank), then every rank takes rank 0's.
  int measure = host.measure ? 1 : 0;
  check_mpi(MPI_Bcast(&measure, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  if (measure != 0) {
    if (rank == 0) {  // progress (docs/cli.md): measuring takes seconds, more with many ranks
      fmt::print(stderr, "ballast run: measuring this host's calibration ({}; cached at {} for later runs)\n",
                 args.recalibrate ? "--recalibrate" : "none cached for this job, or stale", host.cache_path);
      std::fflush(stderr);
    }
    driver::HostCalibration calibration;
    try {  // every rank fits the same reductions: all fail or none
      calibration = driver::calibrate_host(options.model, MPI_COMM_WORLD);
    } catch (const InputError& error) {
      setup_code = kExitBadInput;
      setup_error = fmt::format("calibrating this host: {}", error.what());
    }
    if (agreed_failure()) return job_code;
    host.cluster = calibration.cluster;
    if (rank == 0) {
      try {
        driver::write_cluster_file(host.cluster, host.cache_path);
        host.source = fmt::format("measured now{} in {:.1f} s, cached at {}",
                                  args.recalibrate ? " (--recalibrate)" : "", calibration.seconds, host.cache_path);
      } catch (const InputError& error) {
        host.source = fmt::format("measured now in {:.1f} s, not cached: {}", calibration.seconds, error.what());
      }
    }
  }
  std::string cluster_text = rank == 0 ? to_json(host.cluster).dump() : std::string();
  driver::broadcast_string(cluster_text, MPI_COMM_WORLD);
  guarded([&] {
    options.host = cluster_from_json(nlohmann::json::parse(cluster_text), "the host calibration");
    options.host_source = host.source;
    if (prepared) {
      runs.push_back({options, std::move(*prepared)});
    } else {
      // Several strategies run the same sampled batches, one after the other, each from
      // the same initial weights.
      for (const std::string& strategy :
           apply_ablation_flags(args.workload, split_list(options.strategy))) {
        driver::RunOptions strategy_options = options;
        strategy_options.strategy = strategy;
        driver::PreparedRun strategy_run = driver::prepare_run(strategy_options, ranks);
        runs.push_back({std::move(strategy_options), std::move(strategy_run)});
      }
    }
  });
  if (agreed_failure()) return job_code;
  int check_code = 0;  // kExitCheckFailed when --check failed
  try {
    std::vector<driver::RunReport> reports;
    for (auto& [run_options, prepared_run] : runs) {
      run_options.record_trace = !args.trace_path.empty();  // every strategy's first step
      RunProgressLines progress;
      reports.push_back(
          driver::run_training(run_options, std::move(prepared_run), MPI_COMM_WORLD, progress.callbacks()));
      reports.back().blas_note = blas_note;
    }
    if (rank == 0) {
      const driver::RunReport& first = reports.front();
      if (!args.trace_path.empty()) {
        std::ofstream file(args.trace_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("--trace {}: cannot write this file", args.trace_path));
        // Two timelines per strategy, one above the other: "measured" and "predicted", with
        // several strategies prefixed by theirs ("zeppelin measured rank 0 (node 0)").
        std::vector<std::string> labels;
        for (const driver::RunReport& report : reports) {
          const std::string prefix = reports.size() == 1 ? "" : report.strategy + " ";
          labels.push_back(prefix + "measured");
          labels.push_back(prefix + "predicted");
        }
        std::vector<TraceTimeline> timelines;
        for (std::size_t i = 0; i < reports.size(); ++i) {
          timelines.push_back({labels[2 * i], reports[i].trace});
          timelines.push_back({labels[2 * i + 1], reports[i].predicted_trace});
        }
        write_chrome_trace(timelines, first.ranks, first.gpus_per_node, file);
      }
      std::ostringstream text;
      if (format == Format::json) {
        if (reports.size() == 1) {
          text << to_json(first, args).dump(1) << "\n";
        } else {
          nlohmann::ordered_json set;
          set["schema"] = "ballast.run-set/1";
          set["runs"] = nlohmann::ordered_json::array();
          for (const driver::RunReport& report : reports) set["runs"].push_back(to_json(report, args));
          set["ranking"] = ranking_json(driver::rank_strategies(reports));
          text << set.dump(1) << "\n";
        }
      } else {
        for (const driver::RunReport& report : reports) write_text(report, args, text);
        if (reports.size() > 1) write_ranking(driver::rank_strategies(reports), text);
        if (!args.trace_path.empty()) {
          fmt::print(text, "measured and predicted timelines of the first step{} written to {}\n",
                     reports.size() == 1 ? "" : fmt::format(" of each of the {} strategies", reports.size()),
                     args.trace_path);
        }
      }
      if (args.output.output_path.empty()) {
        std::cout << text.str();
      } else {
        std::ofstream file(args.output.output_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("-o {}: cannot write this file", args.output.output_path));
        file << text.str();
      }
      if (args.options.check) {
        for (const driver::RunReport& report : reports) {
          const driver::StepReport* step = failed_check(report);
          if (step == nullptr) continue;
          std::cout.flush();
          std::cerr << fmt::format("ballast run: --check failed: {}\n", check_failure(report, *step));
          check_code = kExitCheckFailed;
          break;
        }
      }
    }
  } catch (const InputError& error) {
    std::cerr << fmt::format("ballast run: error on rank {}: {}\n", rank, error.what());
    abort_job(kExitBadInput);
  } catch (const std::exception& error) {
    std::cerr << fmt::format("ballast run: error on rank {}: internal error (please report): {}\n", rank,
                             error.what());
    abort_job(kExitInternal);
  }
  // Rank 0's verdict is every rank's exit code (mpirun reports the worst).
  check_mpi(MPI_Bcast(&check_code, 1, MPI_INT, 0, MPI_COMM_WORLD), "MPI_Bcast");
  check_mpi(MPI_Finalize(), "MPI_Finalize");
  return check_code;
}

}  // namespace ballast::cli
