// The run driver (driver/run.hpp): acquire plans, run each step on the MPI runtime, check,
// update, gather measurements and the measured trace.
#include "ballast/driver/run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <climits>
#include <map>
#include <memory>
#include <optional>

#include "ballast/cost_model.hpp"
#include "ballast/driver/host_calibration.hpp"
#include "ballast/emulated_cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/corpus.hpp"
#include "ballast/runtime/emulation.hpp"
#include "ballast/runtime/fault.hpp"
#include "ballast/runtime/mpi.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/tensor_parallel.hpp"

namespace ballast::driver {

namespace {

/// Throws InputError unless the runtime's model splits over `tensor_parallel` GPUs: the
/// heads, KV heads and FFN columns divide evenly (column- and row-parallel linears).
void check_runtime_tensor_parallel(const runtime::ModelConfig& model, int tensor_parallel,
                                   const std::string& source) {
  const auto require = [&](int value, const char* flag) {
    if (value % tensor_parallel == 0) return;
    throw InputError(fmt::format("{}: tensor parallelism {} splits the runtime model's {} {} unevenly; "
                                 "choose {} a multiple of {} or a {} that divides it",
                                 source, tensor_parallel, flag, value, flag, tensor_parallel,
                                 setting_name("--tp")));
  };
  if (model.moe() && tensor_parallel > 1) {
    throw InputError(fmt::format("{}: tensor parallelism {} with an MoE model (--experts {}): the runtime does "
                                 "not split experts over a TP group; use {} 1 (--expert-parallel spreads "
                                 "the experts instead)", source, tensor_parallel, model.experts,
                                 setting_name("--tp")));
  }
  require(model.heads, "--heads");
  require(model.kv_heads, "--kv-heads");
  require(model.ffn_hidden, "--ffn");
}

/// Throws InputError naming the flags unless --expert-parallel fits the model (an MoE
/// model whose experts it divides) and `plan_ranks` (EP groups are consecutive ranks).
void check_runtime_expert_parallel(const RunOptions& options, int plan_ranks, const std::string& source) {
  const int expert_parallel = options.expert_parallel;
  if (expert_parallel == 1) return;
  if (expert_parallel < 1 || !options.model.moe() || options.model.experts % expert_parallel != 0) {
    throw InputError(fmt::format("{}: --expert-parallel {} needs an MoE model whose --experts ({}) it divides; "
                                 "pass --experts a multiple of it or --expert-parallel 1", source,
                                 expert_parallel, options.model.experts));
  }
  if (plan_ranks % expert_parallel != 0) {
    throw InputError(fmt::format("{}: --expert-parallel {} does not divide the plan's {} ranks (EP groups are "
                                 "consecutive ranks); choose a divisor of the rank count", source,
                                 expert_parallel, plan_ranks));
  }
}

/// Throws InputError naming `source` when `plan` cannot run on this job: another rank
/// count (the plan's ranks x its TP degree), TP that splits the model unevenly, other heads or KV heads than the model (Ulysses members own head ranges, so
/// the plan's groups were sized for its heads), or a micro-batch whose MPI messages would
/// not fit MPI's int element counts. The plan's layers, hidden size and FFN only set its
/// costs and memory, not what runs, so they may differ. Runs on every rank before any
/// communication, so every rank raises the same error and none blocks in MPI.
void check_plan_matches_job(const Plan& plan, const RunOptions& options, int ranks, const std::string& source) {
  const int tensor_parallel = plan.cluster.tensor_parallel.gpus;
  if (plan.cluster.gpus() != ranks) {
    const std::string planned = tensor_parallel > 1 ? fmt::format("{} GPUs ({} TP groups of {})", plan.cluster.gpus(),
                                                                  plan.cluster.ranks(), tensor_parallel)
                                                    : fmt::format("{} ranks", plan.cluster.ranks());
    throw InputError(fmt::format("{}: the plan is for {} but the job has {}; run with mpirun -np {}", source,
                                 planned, ranks, plan.cluster.gpus()));
  }
  check_runtime_tensor_parallel(options.model, tensor_parallel, source);
  if (plan.model.heads != options.model.heads || plan.model.kv_heads != options.model.kv_heads) {
    throw InputError(fmt::format("{}: the plan is for {} heads / {} KV heads but the model has {} / {}; "
                                 "pass --heads {} --kv-heads {} to match", source,
                                 plan.model.heads, plan.model.kv_heads, options.model.heads,
                                 options.model.kv_heads, plan.model.heads, plan.model.kv_heads));
  }
  // The largest message of a micro-batch (a ring block's [K, V, dK, dV], a Ulysses
  // member's QKV columns, a remap of hidden-wide rows) is at most 4 x hidden floats per
  // token of the micro-batch; MPI counts and displacements are int.
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    Tokens tokens = 0;
    for (const AttentionGroup& group : plan.micro_batches[m].groups) {
      for (const SequenceChunks& sequence : group.sequences) tokens += sequence.padded_length_tokens;
    }
    const double floats = 4.0 * static_cast<double>(options.model.hidden) * static_cast<double>(tokens);
    if (floats > INT_MAX) {
      throw InputError(fmt::format("{}: micro-batch {} holds {} tokens; with hidden size {} its MPI "
                                   "messages would reach {:.3g} floats, beyond MPI's int counts ({}); "
                                   "plan fewer tokens per micro-batch or use a smaller --hidden",
                                   source, m, tokens, options.model.hidden, floats, INT_MAX));
    }
  }
}

std::vector<Plan> read_plans(const RunOptions& options, int ranks) {
  std::vector<Plan> plans = read_plan_file(options.plan_path);
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const std::string source =
        plans.size() == 1 ? options.plan_path : fmt::format("{}[{}]", options.plan_path, i);
    check_plan_matches_job(plans[i], options, ranks, source);
    const auto plan_cost = make_cost_model(plans[i].cost_model, plans[i].cluster, plans[i].model);
    require_valid(plans[i], *plan_cost, source);
  }
  return plans;
}

void check_sampling_options(const RunOptions& options) {
  if (options.length_scale < 1) throw InputError("--length-scale must be at least 1");
  if (options.rank_tokens < 1) throw InputError("--rank-tokens must be at least 1");
  check_step_count(options.settings.steps);
}

std::vector<Plan> sample_and_plan(const RunOptions& options, int ranks) {
  check_sampling_options(options);
  // planning_model() initialises the whole parameter vector to count it: once.
  const Model model = runtime::planning_model(options.model);
  // --tp N: the plan's ranks are TP groups of N of the job's ranks (one per emulated GPU).
  const int tensor_parallel = options.settings.tensor_parallel;
  check_runtime_tensor_parallel(options.model, tensor_parallel, setting_name("--tp"));
  const auto cost = make_cost_model(
      load_cost_model_spec("analytical"),
      tensor_parallel_units(emulated_cluster(model, ranks, options.gpus_per_node, options.rank_tokens, options.host),
                            model, tensor_parallel),
      model);
  const SimulatorEvaluator evaluator(*cost, options.settings.gradient_sync);
  const Dataset dataset = load_dataset(options.settings.dataset);
  BatchSampler sampler(dataset, options.settings.sampler);
  // The run's context shrinks with its lengths: the static strategies fix their degree from it.
  PlannerOptions planner = options.settings.planner_options();
  planner.context_tokens = ceil_div(*planner.context_tokens, options.length_scale);
  const StrategySpec spec = parse_strategy_spec(options.strategy, planner);
  check_strategy_spec(spec, *cost);  // before any planning, as plan / simulate / compare do
  std::vector<Plan> plans;
  for (int step = 0; step < options.settings.steps; ++step) {
    std::vector<Tokens> lengths = sampler.next().lengths_tokens;
    for (Tokens& length : lengths) length = ceil_div(length, options.length_scale);
    const Batch batch = make_batch(lengths, step);
    Plan plan = spec.planner->plan(batch, *cost, spec.options, evaluator);
    require_valid(plan, *cost, "made by " + options.strategy);
    check_plan_matches_job(plan, options, ranks, fmt::format("step {} planned by {}", step, options.strategy));
    plans.push_back(std::move(plan));
  }
  return plans;
}

/// Rank 0's view of a step: every rank's measurement, the busiest over the mean, the
/// slowest wall time.
void summarise_measurements(std::vector<runtime::RankMeasurement> ranks, StepReport& step) {
  step.ranks = std::move(ranks);
  double busiest = 0, total = 0;
  for (const runtime::RankMeasurement& rank : step.ranks) {
    busiest = std::max(busiest, rank.busy_s);
    total += rank.busy_s;
    step.step_wall_s = std::max(step.step_wall_s, rank.wall_s);
  }
  step.imbalance = total > 0 ? busiest / (total / static_cast<double>(step.ranks.size())) : 1.0;
}

/// The cost model a step is predicted with: the host's measured constants in the plan's
/// node shape and memory, the runtime's own model (what runs, whatever model the plan was
/// made for).
std::unique_ptr<CostModel> prediction_cost(const Plan& plan, const RunOptions& options) {
  // With TP: the host's GPUs in the plan's node shape, grouped as the plan's ranks are.
  const int tensor_parallel = plan.cluster.tensor_parallel.gpus;
  Cluster cluster = options.host;
  cluster.name = plan.cluster.name;
  cluster.nodes = plan.cluster.nodes;
  cluster.gpus_per_node = plan.cluster.gpus_per_node * tensor_parallel;
  cluster.nics_per_node = tensor_parallel > 1 ? cluster.gpus_per_node : plan.cluster.nics_per_node;
  cluster.gpu_memory_bytes = plan.cluster.gpu_memory_bytes / tensor_parallel;
  cluster.memory_usable_fraction = plan.cluster.memory_usable_fraction;
  Model model = runtime::planning_model(options.model);
  // A plan made for another model is validated for memory against that model.
  model.activation_bytes_per_token =
      std::min(model.activation_bytes_per_token, plan.model.activation_bytes_per_token);
  model.parameters = std::min(model.parameters, plan.model.parameters);
  return make_cost_model(load_cost_model_spec("analytical"),
                         tensor_parallel_units(cluster, model, tensor_parallel), model);
}

/// The plan as the simulator prices it on this host: its cluster, model and cost model
/// replaced by prediction_cost's (the host calibration in the plan's node shape and
/// memory, the runtime's model). Sampled plans were made on these and stay the same; a
/// plan file made on another cluster (`ballast plan`'s h100, say) with the job's rank
/// count is priced on the host, once it is valid there. Throws InputError naming `source`,
/// the host calibration and what does not fit.
Plan priced_on_host(const Plan& plan, const CostModel& cost, const std::string& host_name,
                    const std::string& source) {
  Plan priced = plan;
  priced.cluster = cost.cluster();
  priced.model = cost.model();
  priced.cost_model = cost.spec();
  const ValidationResult fits = validate(priced, cost);
  if (!fits.ok) {
    throw InputError(fmt::format("{} does not fit the host calibration {} in the plan's shape ({}) with the "
                                 "runtime's model: {}; run without --plan to plan on this host",
                                 source, host_name, describe_cluster(priced.cluster), fits.message));
  }
  return priced;
}

double relative_error(double predicted, double measured) {
  return measured > 0 ? predicted / measured - 1.0 : 0.0;
}

/// The signed value of largest magnitude.
double worst_of(const std::vector<double>& values) {
  double worst = 0;
  for (const double value : values) {
    if (std::abs(value) > std::abs(worst)) worst = value;
  }
  return worst;
}

}  // namespace

PredictionSummary summarise_prediction(std::span<const StepReport> steps) {
  PredictionSummary summary;
  std::vector<double> busy, busy_magnitude, step, step_magnitude;
  for (const StepReport& report : steps) {
    if (report.predicted_busy_s.empty()) {  // no prediction: nothing to compare
      if (summary.note.empty()) summary.note = report.prediction_note;
      continue;
    }
    ++summary.predicted_steps;
    double measured_busiest = 0, predicted_busiest = 0;
    for (std::size_t r = 0; r < report.ranks.size() && r < report.predicted_busy_s.size(); ++r) {
      const double error = relative_error(report.predicted_busy_s[r], report.ranks[r].busy_s);
      busy.push_back(error);
      busy_magnitude.push_back(std::abs(error));
      measured_busiest = std::max(measured_busiest, report.ranks[r].busy_s);
      predicted_busiest = std::max(predicted_busiest, report.predicted_busy_s[r]);
    }
    summary.measured_busiest_s += measured_busiest;
    summary.predicted_busiest_s += predicted_busiest;
    summary.measured_step_s += report.step_wall_s;
    summary.predicted_step_s += report.predicted_step_s;
    const double error = relative_error(report.predicted_step_s, report.step_wall_s);
    step.push_back(error);
    step_magnitude.push_back(std::abs(error));
  }
  summary.busy_median_relative_error = median(busy_magnitude);
  summary.busy_worst_relative_error = worst_of(busy);
  summary.busiest_relative_error = relative_error(summary.predicted_busiest_s, summary.measured_busiest_s);
  summary.step_median_relative_error = median(step_magnitude);
  summary.step_worst_relative_error = worst_of(step);
  return summary;
}

namespace {

/// 1-based ranks, ties sharing their mean rank.
std::vector<double> ranks_of(const std::vector<double>& values) {
  std::vector<std::size_t> order(values.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return values[a] < values[b]; });
  std::vector<double> result(values.size());
  for (std::size_t i = 0; i < order.size();) {
    std::size_t j = i;
    while (j + 1 < order.size() && values[order[j + 1]] == values[order[i]]) ++j;
    for (std::size_t k = i; k <= j; ++k) result[order[k]] = static_cast<double>(i + j) / 2.0 + 1.0;
    i = j + 1;
  }
  return result;
}

}  // namespace

StrategyRanking rank_strategies(std::span<const RunReport> runs, double margin) {
  StrategyRanking ranking;
  ranking.margin = margin;
  std::vector<std::size_t> predicted;  // the strategies with every step predicted
  for (const RunReport& run : runs) {
    const PredictionSummary summary = summarise_prediction(run.steps);
    double measured_busiest_s = 0;  // every step, predicted or not
    for (const StepReport& step : run.steps) {
      double busiest_s = 0;
      for (const runtime::RankMeasurement& rank : step.ranks) busiest_s = std::max(busiest_s, rank.busy_s);
      measured_busiest_s += busiest_s;
    }
    ranking.strategies.push_back(run.strategy);
    ranking.measured_busiest_s.push_back(measured_busiest_s);
    const bool every_step = summary.predicted_steps == static_cast<int>(run.steps.size()) && !run.steps.empty();
    if (every_step) predicted.push_back(ranking.strategies.size() - 1);
    ranking.predicted_busiest_s.push_back(every_step ? std::optional<double>(summary.predicted_busiest_s)
                                                     : std::nullopt);
    ranking.notes.push_back(every_step ? std::string()
                                       : summary.note.empty() ? "no step was predicted" : summary.note);
  }
  const std::size_t n = predicted.size();
  if (n >= 2) {
    std::vector<double> measured_s, predicted_s;
    for (std::size_t i : predicted) {
      measured_s.push_back(ranking.measured_busiest_s[i]);
      predicted_s.push_back(*ranking.predicted_busiest_s[i]);
    }
    const std::vector<double> x = ranks_of(measured_s), y = ranks_of(predicted_s);
    const double mean = (static_cast<double>(n) + 1.0) / 2.0;
    double covariance = 0, x_variance = 0, y_variance = 0;
    for (std::size_t i = 0; i < n; ++i) {
      covariance += (x[i] - mean) * (y[i] - mean);
      x_variance += (x[i] - mean) * (x[i] - mean);
      y_variance += (y[i] - mean) * (y[i] - mean);
    }
    ranking.rank_correlation =
        x_variance > 0 && y_variance > 0 ? covariance / std::sqrt(x_variance * y_variance) : 1.0;
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = i + 1; j < n; ++j) {
      const std::size_t a = predicted[i], b = predicted[j];
      const double ma = ranking.measured_busiest_s[a], mb = ranking.measured_busiest_s[b];
      if (std::max(ma, mb) <= std::min(ma, mb) * (1 + margin)) continue;  // a tie
      const double pa = *ranking.predicted_busiest_s[a], pb = *ranking.predicted_busiest_s[b];
      if ((ma < mb) != (pa < pb)) {
        ranking.disagreements.push_back(fmt::format("{}/{}", ranking.strategies[a], ranking.strategies[b]));
      }
    }
  }
  return ranking;
}

void check_run_options(const RunOptions& options, int ranks) {
  options.model.check();
  if (!options.plan_path.empty()) return;  // prepare_run checks the file's plans without the host
  check_sampling_options(options);
  const int tensor_parallel = options.settings.tensor_parallel;
  check_runtime_tensor_parallel(options.model, tensor_parallel, setting_name("--tp"));
  // The emulated shape (--gpus-per-node, --tp over it) with the fixed constants in place of
  // the host's: the same checks as the planning cluster's.
  const Model model = runtime::planning_model(options.model);
  const Cluster cluster = tensor_parallel_units(
      emulated_cluster(model, ranks, options.gpus_per_node, options.rank_tokens), model, tensor_parallel);
  check_runtime_expert_parallel(options, cluster.ranks(), "--expert-parallel");
  PlannerOptions planner = options.settings.planner_options();
  planner.context_tokens = ceil_div(*planner.context_tokens, options.length_scale);
  parse_strategy_spec(options.strategy, planner);
}

std::vector<Plan> acquire_plans(const RunOptions& options, int ranks) {
  options.model.check();
  return options.plan_path.empty() ? sample_and_plan(options, ranks) : read_plans(options, ranks);
}

PreparedRun prepare_run(const RunOptions& options, int ranks) {
  PreparedRun prepared;
  prepared.plans = acquire_plans(options, ranks);
  for (const Plan& plan : prepared.plans) {
    check_runtime_expert_parallel(options, plan.cluster.ranks(),
                                  options.plan_path.empty() ? "--expert-parallel" : options.plan_path);
  }
  // Test-only (fault.hpp): read once per run; a fault that can never fire is a mistake in
  // the test.
  prepared.fault = runtime::fault_from_environment();
  const std::optional<runtime::FaultInjection>& fault = prepared.fault;
  if (fault && (fault->rank >= ranks || fault->step >= static_cast<int>(prepared.plans.size()))) {
    throw InputError(fmt::format("{}={}: the job has ranks 0-{} and steps 0-{}; the fault would never fire",
                                 runtime::kFaultVariable, fault->spec, ranks - 1,
                                 prepared.plans.size() - 1));
  }
  prepared.corpus = runtime::load_corpus(options.corpus);
  prepared.parameters = runtime::init_parameters(options.model, options.settings.sampler.seed);
  if (prepared.parameters.values.size() > static_cast<std::size_t>(INT_MAX)) {
    throw InputError(fmt::format("the model has {} parameters; the gradient all-reduce is one MPI message "
                                 "with an int count (at most {}); use a smaller --hidden, --layers or --ffn",
                                 prepared.parameters.values.size(), INT_MAX));
  }
  return prepared;
}

namespace {

/// The simulator's prediction of one plan on the host (prediction_cost, priced_on_host):
/// the step, each MPI rank's busy time (a TP group's members share the group's), and with
/// `record_trace` the predicted events per MPI rank; `note` says why there is none.
struct StepPrediction {
  double step_s = 0;
  std::vector<double> busy_s;  ///< empty: no prediction
  std::vector<TraceEvent> trace;
  std::string note;
};

StepPrediction predict_step(const Plan& plan, const RunOptions& options, const std::string& source,
                            bool record_trace) {
  StepPrediction prediction;
  const auto cost = prediction_cost(plan, options);
  SimulationOptions simulation;
  simulation.gradient_sync = GradientSync::end;  // one all-reduce after the last backward
  simulation.record_trace = record_trace;
  try {
    SimulationReport predicted = simulate(priced_on_host(plan, *cost, options.host.name, source), *cost, simulation);
    prediction.step_s = predicted.step_time_s;
    // The simulator's rank is a TP group: each of its GPUs (MPI ranks) is predicted to be
    // busy and to run events as the group.
    const int tensor_parallel = plan.cluster.tensor_parallel.gpus;
    for (const RankTimes& times : predicted.ranks) {
      prediction.busy_s.insert(prediction.busy_s.end(), static_cast<std::size_t>(tensor_parallel), times.busy_s);
    }
    for (const TraceEvent& event : predicted.trace) {
      for (int member = 0; member < tensor_parallel; ++member) {
        TraceEvent gpu_event = event;
        gpu_event.rank = event.rank * tensor_parallel + member;
        prediction.trace.push_back(std::move(gpu_event));
      }
    }
  } catch (const InputError& error) {  // e.g. a plan file whose memory the host cannot hold
    prediction.note = fmt::format("no prediction: {}", error.what());
  }
  return prediction;
}

}  // namespace

RunReport run_training(const RunOptions& options, PreparedRun prepared, MPI_Comm comm,
                       const RunProgress& progress) {
  int rank = 0, ranks = 1;
  runtime::check_mpi(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  runtime::check_mpi(MPI_Comm_size(comm, &ranks), "MPI_Comm_size");
  const std::optional<runtime::FaultInjection>& fault = prepared.fault;
  const std::vector<Plan>& plans = prepared.plans;
  BALLAST_CHECK(!plans.empty(), "run_training needs the plans of prepare_run");
  const runtime::Corpus& corpus = prepared.corpus;
  runtime::Parameters& parameters = prepared.parameters;
  runtime::AdamWState adam;
  RunReport report;
  report.strategy = options.plan_path.empty() ? options.strategy : plans.front().strategy;
  report.ranks = ranks;
  report.corpus_provenance = corpus.provenance;
  report.gpus_per_node = plans.front().cluster.gpus_per_node * plans.front().cluster.tensor_parallel.gpus;
  std::map<std::pair<Scheme, int>, int> groups;
  for (const Plan& plan : plans) {
    for (const MicroBatch& micro_batch : plan.micro_batches) {
      for (const AttentionGroup& group : micro_batch.groups) {
        ++groups[{group.scheme, static_cast<int>(group.ranks.size())}];
      }
    }
  }
  for (const auto& [key, count] : groups) report.groups_run.push_back({to_string(key.first), key.second, count});
  report.host_name = options.host.name;
  report.host_source = options.host_source;
  if (options.host.measured_on) report.host_measured_at = options.host.measured_on->measured_at;
  report.host_provenance = options.host.provenance;

  // Rank 0 predicts every step before the first one runs, so the run's predicted time is
  // known (and shown, progress.started) before the work; the barrier keeps the simulation
  // out of every rank's measured steps.
  std::vector<StepPrediction> predictions;
  if (rank == 0) {
    RunForecast forecast;
    forecast.steps = plans.size();
    for (std::size_t s = 0; s < plans.size(); ++s) {
      const std::string source =
          options.plan_path.empty() ? fmt::format("step {} planned by {}", s, options.strategy)
          : plans.size() == 1       ? fmt::format("plan {}", options.plan_path)
                                    : fmt::format("plan {}[{}]", options.plan_path, s);
      predictions.push_back(predict_step(plans[s], options, source, options.record_trace && s == 0));
      if (predictions.back().busy_s.empty()) {
        if (forecast.note.empty()) forecast.note = predictions.back().note;
      } else {
        ++forecast.predicted_steps;
        forecast.predicted_s += predictions.back().step_s;
      }
    }
    if (progress.started) progress.started(report, forecast);
  }
  runtime::check_mpi(MPI_Barrier(comm), "MPI_Barrier");

  for (std::size_t s = 0; s < plans.size(); ++s) {
    const Plan& plan = plans[s];
    const std::vector<Tokens> lengths(plan.sequence_lengths_tokens.begin(), plan.sequence_lengths_tokens.end());
    const auto documents = runtime::cut_documents(corpus, lengths, options.settings.sampler.seed + s);
    runtime::StepOptions step_options;
    step_options.record_trace = options.record_trace && s == 0;
    step_options.expert_parallel = options.expert_parallel;
    const bool fault_now = fault && fault->rank == rank && fault->step == static_cast<int>(s);
    step_options.fault = fault_now ? &*fault : nullptr;
    runtime::StepResult result = runtime::run_step(plan, options.model, parameters, documents, comm, step_options);

    StepReport step;
    step.step = static_cast<int>(plan.step);
    step.micro_batches = static_cast<int>(plan.micro_batches.size());
    step.loss = result.targets > 0 ? result.loss_sum / static_cast<double>(result.targets) : 0.0;
    if (options.check) {
      // Every rank computes the reference (same inputs, same result): no extra messages.
      runtime::LocalAttentionEngine local;
      const runtime::StepOutput reference =
          runtime::forward_backward(options.model, parameters, runtime::pack_documents(documents), local);
      const runtime::StepDifference difference =
          runtime::compare_with_reference(parameters, result.loss_sum, result.gradients, reference);
      step.max_relative_error = difference.max_relative_error;
      step.worst_tensor = difference.worst;
    }
    std::vector<runtime::RankMeasurement> measured = runtime::gather_measurements(result.measurement, comm);
    if (rank == 0) {
      summarise_measurements(std::move(measured), step);
      StepPrediction& predicted = predictions[s];
      step.predicted_step_s = predicted.step_s;
      step.predicted_busy_s = std::move(predicted.busy_s);
      step.prediction_note = std::move(predicted.note);
      if (step_options.record_trace) report.predicted_trace = std::move(predicted.trace);
    }
    if (step_options.record_trace) report.trace = runtime::gather_trace(result.events, comm);
    // The optimizer step on the mean gradient (identical on every rank).
    if (result.targets > 0) {
      for (float& gradient : result.gradients) gradient /= static_cast<float>(result.targets);
    }
    runtime::adamw_step(options.adamw, result.gradients, parameters, adam);
    if (rank == 0 && progress.stepped) progress.stepped(step, s, plans.size());
    report.steps.push_back(std::move(step));
  }
  return report;
}

}  // namespace ballast::driver
