// `ballast run`: the MPI runtime (launched under mpirun -np N, one rank per emulated GPU).
#include <mpi.h>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ballast/error.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/driver/run.hpp"
#include "ballast/trace.hpp"
#include "commands.hpp"

namespace ballast::cli {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

void write_text(const driver::RunReport& report, const RunArgs& args, std::ostream& out) {
  fmt::print(out, "ballast run: strategy {}, {} ranks ({} per emulated node), corpus: {}\n",
             report.strategy, report.ranks, report.gpus_per_node, report.corpus_provenance);
  for (const driver::StepReport& step : report.steps) {
    fmt::print(out, "step {}: {} micro-batches, loss {:.4f}, imbalance {:.3f} (max/mean busy), step wall {:.3f} s",
               step.step, step.micro_batches, step.loss, step.imbalance, step.step_wall_s);
    if (step.max_relative_error >= 0) {
      fmt::print(out, ", max relative error vs single process {:.2e} ({})", step.max_relative_error,
                 step.worst_tensor);
    }
    fmt::print(out, "\n  {:>4} {:>4} {:>9} {:>9} {:>9} {:>8} {:>10} {:>10}\n", "rank", "node", "busy (s)",
               "wait (s)", "wall (s)", "tokens", "intra MiB", "inter MiB");
    for (std::size_t r = 0; r < step.ranks.size(); ++r) {
      const auto& m = step.ranks[r];
      fmt::print(out, "  {:>4} {:>4} {:>9.4f} {:>9.4f} {:>9.4f} {:>8} {:>10.2f} {:>10.2f}\n", r,
                 static_cast<int>(r) / std::max(1, report.gpus_per_node), m.busy_s, m.wait_s, m.wall_s,
                 m.tokens, m.intra_node_bytes / kMiB, m.inter_node_bytes / kMiB);
    }
  }
  if (!args.trace_path.empty()) fmt::print(out, "trace of the first step written to {}\n", args.trace_path);
}

nlohmann::ordered_json to_json(const driver::RunReport& report, bool check) {
  nlohmann::ordered_json json;
  json["schema"] = "ballast.run/1";
  json["strategy"] = report.strategy;
  json["ranks"] = report.ranks;
  json["steps"] = report.steps.size();
  json["loss"] = report.steps.empty() ? 0.0 : report.steps.back().loss;
  double worst = 0, imbalance = 0, wall = 0;
  for (const auto& step : report.steps) {
    worst = std::max(worst, step.max_relative_error);
    imbalance += step.imbalance / static_cast<double>(report.steps.size());
    wall += step.step_wall_s / static_cast<double>(report.steps.size());
  }
  if (check) json["max_rel_error"] = worst;
  json["imbalance"] = imbalance;
  json["step_wall_s"] = wall;
  json["corpus"] = report.corpus_provenance;
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const auto& step : report.steps) {
    nlohmann::ordered_json s;
    s["step"] = step.step;
    s["micro_batches"] = step.micro_batches;
    s["loss"] = step.loss;
    if (check) {
      s["max_rel_error"] = step.max_relative_error;
      s["worst_tensor"] = step.worst_tensor;
    }
    s["imbalance"] = step.imbalance;
    s["step_wall_s"] = step.step_wall_s;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    for (const auto& m : step.ranks) {
      ranks.push_back({{"busy_s", m.busy_s}, {"wait_s", m.wait_s}, {"wall_s", m.wall_s}, {"tokens", m.tokens},
                       {"intra_node_bytes", m.intra_node_bytes}, {"inter_node_bytes", m.inter_node_bytes}});
    }
    s["ranks"] = ranks;
    steps.push_back(s);
  }
  json["per_step"] = steps;
  return json;
}

/// Workload flags `ballast run` has no use for: it plans for the job it runs in.
constexpr struct {
  const char* flag;
  const char* instead;
} kIgnoredFlags[] = {
    {"--cluster", "the emulated cluster is the job's ranks (mpirun -np) in nodes of --gpus-per-node"},
    {"--nodes", "the emulated cluster is the job's ranks (mpirun -np) in nodes of --gpus-per-node"},
    {"--model", "the model is the runtime's own: set it with --hidden, --layers, --heads, --kv-heads, --ffn"},
    {"--cost-model", "plans use the analytical cost model calibrated to this runtime (docs/runtime.md)"},
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

}  // namespace

int run_run(const RunArgs& args) {
  using runtime::check_mpi;
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
  try {
    format = parse_format(args.output.format);
    if (format == Format::csv) throw InputError("ballast run prints text or json; use --format text or json");
    reject_flags_without_effect(args);
    options.record_trace = !args.trace_path.empty();
    options.settings.steps = args.workload.steps.value_or(1);
    apply_workload_flags(args.workload, options.settings);
    if (options.plan_path.empty()) {
      options.strategy = apply_ablation_flags(args.workload, {options.strategy}).front();
    }
    if (!args.workload.tokens_per_step && !args.workload.batch_size) {
      // Default budget: half of the job's memory, in the dataset's own (unscaled) tokens.
      options.settings.sampler.tokens_per_step = options.rank_tokens * ranks / 2 * options.length_scale;
    }
    prepared = driver::prepare_run(options, ranks);
  } catch (const InputError& error) {
    setup_code = kExitBadInput;
    setup_error = error.what();
  } catch (const std::exception& error) {
    setup_code = kExitInternal;
    setup_error = fmt::format("internal error (please report): {}", error.what());
  }
  const int job_code = agree_on_setup(setup_code, setup_error, rank, ranks);
  if (job_code != 0) {
    check_mpi(MPI_Finalize(), "MPI_Finalize");
    return job_code;
  }
  try {
    const driver::RunReport report = driver::run_training(options, std::move(*prepared), MPI_COMM_WORLD);
    if (rank == 0) {
      if (!args.trace_path.empty()) {
        std::ofstream file(args.trace_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("--trace {}: cannot write this file", args.trace_path));
        write_chrome_trace(report.trace, report.ranks, report.gpus_per_node, file);
      }
      std::ostringstream text;
      if (format == Format::json) {
        text << to_json(report, args.options.check).dump(1) << "\n";
      } else {
        write_text(report, args, text);
      }
      if (args.output.output_path.empty()) {
        std::cout << text.str();
      } else {
        std::ofstream file(args.output.output_path, std::ios::binary | std::ios::trunc);
        if (!file) throw InputError(fmt::format("-o {}: cannot write this file", args.output.output_path));
        file << text.str();
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
  check_mpi(MPI_Finalize(), "MPI_Finalize");
  return 0;
}

}  // namespace ballast::cli
