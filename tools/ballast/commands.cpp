// ballast plan / validate / simulate / compare: resolve flags, call the library, write
// the chosen format (ballast list: list_command.cpp).
#include "commands.hpp"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/json_file.hpp"
#include "ballast/report.hpp"
#include "ballast/simulator.hpp"
#include "ballast/tensor_parallel.hpp"
#include "ballast/text.hpp"
#include "plot.hpp"

namespace ballast::cli {

namespace {

/// stdout, or the -o file. The file is written only by commit(), once the command has
/// succeeded: a command that fails leaves an existing file as it was and creates none
/// (its writability is checked up front, before any work).
class Output {
 public:
  explicit Output(std::string path) : path_(std::move(path)) {
    if (!path_.empty() && !can_write(path_)) {
      throw InputError(fmt::format("-o {}: cannot write this file; check the path", path_));
    }
  }
  std::ostream& stream() { return path_.empty() ? std::cout : buffer_; }
  void commit() {
    if (path_.empty()) return;
    std::ofstream file(path_, std::ios::binary | std::ios::trunc);
    file << buffer_.str();
    file.flush();
    if (!file) throw InputError(fmt::format("-o {}: cannot write this file; check the path", path_));
  }

 private:
  std::string path_;
  std::ostringstream buffer_;
};

/// One status line on stderr, rewritten in place, only when stderr is a terminal (never in
/// pipes, files or CI logs); cleared when the command's work is done.
class Progress {
 public:
  explicit Progress(std::string command) : command_(std::move(command)) {
    enabled_ = isatty(STDERR_FILENO) != 0;
  }
  ~Progress() { done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  bool enabled() const { return enabled_; }
  void show(const std::string& what) {
    if (!enabled_) return;
    fmt::print(stderr, "\r\033[K{}: {}", command_, what);
    std::fflush(stderr);
    shown_ = true;
  }
  void done() {
    if (shown_) fmt::print(stderr, "\r\033[K");
    shown_ = false;
  }

 private:
  std::string command_;
  bool enabled_ = false;
  bool shown_ = false;
};

/// The input of `plot.py timeline`: the step's report (report_to_json) and every trace
/// event with its category (docs/cli.md, "--plot").
nlohmann::ordered_json timeline_json(const SimulationReport& report, const Plan& plan) {
  nlohmann::ordered_json json;
  json["schema"] = "ballast.timeline/1";
  json["step"] = plan.step;
  const Cluster& cluster = plan.cluster;
  json["cluster"] = describe_cluster(cluster);
  json["model"] = plan.model.name;
  json["gpus_per_node"] = cluster.gpus_per_node;
  json["sequences"] = plan.sequence_lengths_tokens.size();
  const nlohmann::ordered_json summary = report_to_json(report);
  for (const auto& [key, value] : summary.items()) json[key] = value;
  nlohmann::ordered_json events = nlohmann::ordered_json::array();
  for (const TraceEvent& event : report.trace) {
    events.push_back({{"rank", event.rank},
                      {"lane", event.lane},
                      {"name", event.name},
                      {"category", event.category},
                      {"micro_batch", event.micro_batch},
                      {"start_s", event.start_s},
                      {"duration_s", event.duration_s}});
  }
  json["events"] = std::move(events);
  return json;
}

/// One warning line on stderr when the sampler dropped, truncated or split documents (the
/// text header repeats the counts, but a header field is easy to miss).
void warn_over_context(const SamplerOptions& options, const SamplerStats& stats) {
  const std::string warning = over_context_warning(options, stats);
  if (!warning.empty()) fmt::print(stderr, "ballast: warning: {}\n", warning);
}

std::unique_ptr<CostModel> cost_model_of(const Plan& plan) {
  return make_cost_model(plan.cost_model, plan.cluster, plan.model);
}

/// simulate --plan: the workload flags given that choose, sample or plan the batches. The
/// file's plans fix all of that (their sequence lengths, steps, strategy and TP degree), so
/// these would not apply.
std::vector<std::string> plan_fixed_flags_given(const WorkloadFlags& flags) {
  const std::pair<bool, const char*> fixed[] = {
      {flags.dataset.has_value(), "--dataset"},
      {flags.lengths_file.has_value(), "--lengths"},
      {flags.steps.has_value(), "--steps"},
      {flags.seed.has_value(), "--seed"},
      {flags.tokens_per_step.has_value(), "--tokens-per-step"},
      {flags.batch_size.has_value(), "--batch-size"},
      {flags.max_context.has_value(), "--max-context"},
      {flags.over_context.has_value(), "--over-context"},
      {flags.sampling.has_value(), "--sampling"},
      {flags.degree.has_value(), "--degree"},
      {flags.tp.has_value(), "--tp"},
      {flags.no_routing, "--no-routing"},
      {flags.no_remap, "--no-remap"},
      {flags.even_split, "--even-split"}};
  std::vector<std::string> given;
  for (const auto& [is_given, flag] : fixed) {
    if (is_given) given.emplace_back(flag);
  }
  return given;
}

/// simulate --plan with --cluster, --nodes, --model, --cost-model or --recompute: the cost
/// model of that cluster and model (what a flag does not give stays the first plan's own,
/// and the plans' TP degree is kept), every plan moved onto it; nullptr when none of them
/// is given (each plan keeps its own). Throws InputError when the cluster has another
/// number of ranks than a plan: a plan's groups name ranks, so it cannot be moved then.
std::unique_ptr<CostModel> move_plans(const WorkloadFlags& flags, const std::string& path,
                                      std::vector<Plan>& plans) {
  if (!flags.cluster && !flags.nodes && !flags.model && !flags.cost_model && !flags.recompute) {
    return nullptr;
  }
  const Plan& first = plans.front();
  const int tensor_parallel = first.cluster.tensor_parallel.gpus;
  Model model = flags.model ? load_model(*flags.model) : first.model;
  if (flags.recompute) model.recompute = parse_recompute(*flags.recompute, "--recompute");
  if (flags.nodes && *flags.nodes < 1) {
    throw InputError(fmt::format("--nodes {} must be at least 1", *flags.nodes));
  }
  Cluster cluster = first.cluster;
  if (flags.cluster) {
    cluster = tensor_parallel_units(load_cluster(*flags.cluster, flags.nodes), model, tensor_parallel);
  } else if (flags.nodes) {
    cluster.nodes = *flags.nodes;
    validate_cluster(cluster, fmt::format("the cluster of {} with --nodes {}", path, *flags.nodes));
  }
  const nlohmann::json spec = flags.cost_model ? load_cost_model_spec(*flags.cost_model) : first.cost_model;
  auto cost = make_cost_model(spec, cluster, model);
  cost->token_capacity_per_rank();  // fails early, naming model and cluster
  const Cluster& target = cost->cluster();
  for (std::size_t i = 0; i < plans.size(); ++i) {
    Plan& plan = plans[i];
    if (plan.cluster.ranks() != target.ranks()) {
      const std::string source = plans.size() == 1 ? path : fmt::format("{}[{}]", path, i);
      const std::string unit =
          tensor_parallel > 1 ? fmt::format("ranks (TP groups of {} GPUs)", tensor_parallel) : "GPUs";
      const int ranks_per_node = target.gpus_per_node;
      const std::string fix = plan.cluster.ranks() % ranks_per_node == 0
                                  ? fmt::format("give --nodes {}, or plan again on that cluster "
                                                "with `ballast plan`",
                                                plan.cluster.ranks() / ranks_per_node)
                                  : "plan again on that cluster with `ballast plan`";
      throw InputError(fmt::format("--plan {} is for {} {}; cluster {} has {} ({} nodes x {}), and "
                                   "a plan's groups name their ranks: {}",
                                   source, plan.cluster.ranks(), unit, target.name, target.ranks(),
                                   target.nodes, ranks_per_node, fix));
    }
    plan.cluster = target;
    plan.model = cost->model();
    plan.cost_model = cost->spec();
  }
  return cost;
}

}  // namespace

/// The run's settings: `default_steps`, then the scenario's (if any), then the flags.
RunSettings settings_from(const WorkloadFlags& flags, const std::string& scenario, int default_steps) {
  RunSettings settings;
  settings.steps = default_steps;
  if (!scenario.empty()) apply_scenario(find_scenario(scenario), settings);
  apply_workload_flags(flags, settings);
  return settings;
}

int run_plan(const PlanArgs& args) {
  const Format format = parse_format(args.output.format);
  if (format == Format::csv) throw InputError("ballast plan writes JSON; use --format json or text");
  const RunSettings settings = settings_from(args.workload, args.scenario, 1);
  const RunInputs inputs = resolve_inputs(settings);
  const std::string strategy = args.strategy.empty() ? std::string(kDefaultStrategy) : args.strategy;
  const StrategySpec spec = parse_strategy_spec(
      apply_ablation_flags(args.workload, {strategy}).front(), settings.planner_options());
  check_strategy_spec(spec, *inputs.cost);
  warn_over_context(settings.sampler, inputs.sampler_stats);
  Output output(args.output.output_path);
  // One plan: its canonical text; several: a JSON array of them.
  const bool several = inputs.batches.size() > 1;
  std::string text = several ? "[\n" : "";
  for (std::size_t i = 0; i < inputs.batches.size(); ++i) {
    const Plan plan = spec.planner->plan(inputs.batches[i], *inputs.cost, spec.options,
                                         SimulatorEvaluator(*inputs.cost, settings.gradient_sync));
    require_valid(plan, *inputs.cost, "made by " + strategy);
    if (several && i > 0) text += ",\n";
    text += plan_to_string(plan);
  }
  output.stream() << text << (several ? "]\n" : "");
  output.commit();
  return 0;
}

int run_validate(const ValidateArgs& args) {
  const Format format = parse_format(args.format);
  const std::vector<Plan> plans = read_plan_file(args.plan_path);
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  bool all_ok = true;
  for (std::size_t i = 0; i < plans.size(); ++i) {
    const Plan& plan = plans[i];
    const std::string name = plans.size() == 1 ? args.plan_path : fmt::format("{}[{}]", args.plan_path, i);
    const auto cost = cost_model_of(plan);
    const ValidationResult result = validate(plan, *cost);
    all_ok = all_ok && result.ok;
    std::size_t groups = 0;
    for (const auto& mb : plan.micro_batches) groups += mb.groups.size();
    if (format == Format::json) {
      results.push_back({{"plan", name}, {"valid", result.ok},
                         {"message", result.ok ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(result.message)}});
    } else if (result.ok) {
      // Per GPU, as simulate reports it: a rank of a TP plan is a group of N GPUs.
      const auto memory = peak_memory_bytes_per_rank(plan, *cost);
      const Bytes gpus_per_rank = plan.cluster.tensor_parallel.gpus;
      const Bytes peak = memory.empty() ? 0 : *std::max_element(memory.begin(), memory.end());
      fmt::print("{}: valid: strategy {}, {} sequences, {} micro-batches, {} groups, peak memory "
                 "{:.2f} GiB of {:.2f} GiB per GPU\n",
                 name, plan.strategy, plan.sequence_lengths_tokens.size(), plan.micro_batches.size(),
                 groups, ceil_div(peak, gpus_per_rank) / kGiB,
                 static_cast<double>(cost->memory_limit_bytes() / gpus_per_rank) / kGiB);
    } else {
      fmt::print("{}: invalid: {}\n", name, result.message);
    }
  }
  if (format == Format::json) std::cout << results.dump(1) << "\n";
  return all_ok ? 0 : kExitInvalidPlan;
}

int run_simulate(const SimulateArgs& args) {
  const Format format = parse_format(args.output.format);
  if (!args.plot_path.empty()) check_plot_target("simulate", args.plot_path);
  Progress progress("simulate");
  std::vector<Plan> plans;
  std::unique_ptr<CostModel> cost;
  std::string strategy_label;  // the spec as given (static-ulysses:degree=64), for the plot
  GradientSync gradient_sync = GradientSync::overlap;
  if (!args.plan_path.empty()) {
    if (args.workload.grad_sync) {
      gradient_sync = parse_gradient_sync(*args.workload.grad_sync, "--grad-sync");
    }
    if (!args.strategy.empty()) throw InputError("give either --plan or --strategy, not both");
    if (!args.scenario.empty()) {
      throw InputError("--scenario chooses the workload of --strategy; a --plan file carries its "
                       "own, so give one of them");
    }
    const std::vector<std::string> fixed = plan_fixed_flags_given(args.workload);
    if (!fixed.empty()) {
      throw InputError(fmt::format("--plan {}: the file's plans fix the batches (their sequence "
                                   "lengths and steps), the strategy and the TP degree, so {} "
                                   "would not apply; drop {} or plan again with `ballast plan`",
                                   args.plan_path, fmt::join(fixed, ", "),
                                   fixed.size() == 1 ? "it" : "them"));
    }
    plans = read_plan_file(args.plan_path);  // each plan carries its own cost model
    const auto source = [&](std::size_t i) {
      return plans.size() == 1 ? args.plan_path : fmt::format("{}[{}]", args.plan_path, i);
    };
    // Validated here, not only in simulate() (which calls every plan "plan"), to name the
    // file: first as planned, then on the cluster and model the flags move it to.
    for (std::size_t i = 0; i < plans.size(); ++i) {
      require_valid(plans[i], *cost_model_of(plans[i]), source(i));
    }
    cost = move_plans(args.workload, args.plan_path, plans);
    for (std::size_t i = 0; cost && i < plans.size(); ++i) {
      const ValidationResult result = validate(plans[i], *cost);
      if (result.ok) continue;
      throw InputError(fmt::format("plan {} does not fit cluster {}, model {}: {}; simulate it "
                                   "on the cluster and model it was planned for, or plan again "
                                   "on these with `ballast plan`",
                                   source(i), describe_cluster(plans[i].cluster),
                                   plans[i].model.name, result.message));
    }
  } else {
    const std::string strategy = args.strategy.empty() ? std::string(kDefaultStrategy) : args.strategy;
    const RunSettings settings = settings_from(args.workload, args.scenario, 1);
    RunInputs inputs = resolve_inputs(settings);
    const StrategySpec spec = parse_strategy_spec(
        apply_ablation_flags(args.workload, {strategy}).front(), settings.planner_options());
    check_strategy_spec(spec, *inputs.cost);
    warn_over_context(settings.sampler, inputs.sampler_stats);
    strategy_label = spec.text;
    gradient_sync = settings.gradient_sync;
    for (const Batch& batch : inputs.batches) {
      progress.show(fmt::format("planning {} step {}/{}", spec.text, plans.size() + 1,
                                inputs.batches.size()));
      plans.push_back(
          spec.planner->plan(batch, *inputs.cost, spec.options,
                             SimulatorEvaluator(*inputs.cost, gradient_sync)));
    }
    cost = std::move(inputs.cost);
  }
  Output output(args.output.output_path);
  std::ostream& out = output.stream();
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  nlohmann::ordered_json timeline;  // --plot: the first step's
  if (format == Format::csv) write_report_csv_header(out);
  if (format == Format::text) {  // where it ran: a --plan's own cluster, or --cluster's
    fmt::print(out, "{}simulated on cluster {}, model {}\n",
               args.plan_path.empty() ? "" : fmt::format("plan {} ", args.plan_path),
               describe_cluster(plans.front().cluster), plans.front().model.name);
  }
  for (std::size_t i = 0; i < plans.size(); ++i) {
    progress.show(fmt::format("simulating step {}/{}", i + 1, plans.size()));
    const auto plan_cost = cost ? nullptr : cost_model_of(plans[i]);
    const CostModel& step_cost = cost ? *cost : *plan_cost;
    SimulationOptions options;
    options.gradient_sync = gradient_sync;
    options.record_trace = i == 0 && (!args.trace_path.empty() || !args.plot_path.empty());
    const SimulationReport report = simulate(plans[i], step_cost, options);
    progress.done();  // a clean line for the step's output when both go to the terminal
    if (options.record_trace && !args.plot_path.empty()) {
      timeline = timeline_json(report, plans[i]);
      if (!strategy_label.empty()) timeline["strategy"] = strategy_label;
    }
    if (options.record_trace && !args.trace_path.empty()) {
      std::ofstream trace(args.trace_path, std::ios::binary | std::ios::trunc);
      if (!trace) throw InputError(fmt::format("--trace {}: cannot write this file", args.trace_path));
      write_chrome_trace(report, trace);
    }
    if (format == Format::text) {
      fmt::print(out, "step {}: ", plans[i].step);
      write_report_text(report, step_cost.cluster(), out);
    } else if (format == Format::csv) {
      write_report_csv_rows(report, plans[i].step, step_cost.cluster(), out);
    } else {
      auto json = report_to_json(report);
      json["step"] = plans[i].step;
      steps.push_back(json);
    }
  }
  if (!args.plot_path.empty() && !timeline.is_null()) {
    progress.show("drawing " + args.plot_path);
    draw_plot("timeline", timeline, args.plot_path);
  }
  progress.done();
  if (format == Format::json) {
    nlohmann::ordered_json json;
    json["schema"] = "ballast.simulate/1";
    json["steps"] = steps;
    out << json.dump(1) << "\n";
  }
  if (!args.trace_path.empty() && format == Format::text) {
    fmt::print(out, "trace of step {} written to {} (open in ui.perfetto.dev)\n", plans.front().step,
               args.trace_path);
  }
  if (!args.plot_path.empty() && format == Format::text && !timeline.is_null()) {
    fmt::print(out, "timeline of step {} drawn to {}\n", plans.front().step, args.plot_path);
  }
  output.commit();
  return 0;
}

namespace {

/// compare --sweep: the strategies expanded (expand_degree_sweep), one note line on stderr
/// per skipped value, and the baseline made explicit (the default one: static-cp if
/// compared, else the first), so that it keeps its row.
void apply_degree_sweep(const CompareArgs& args, RunSettings& settings) {
  if (args.workload.degree) {
    throw InputError("give either --degree or --sweep degree=..., not both");
  }
  std::vector<std::string> specs = settings.strategies.empty() ? planner_names() : settings.strategies;
  if (settings.baseline.empty()) {
    const bool has_static_cp = std::find(specs.begin(), specs.end(), "static-cp") != specs.end();
    settings.baseline = has_static_cp ? "static-cp" : specs.front();
  }
  const auto cost = resolve_cost_model(settings);  // what the comparison will plan on
  std::vector<std::string> notes;
  settings.strategies = expand_degree_sweep(args.sweep, specs, settings.baseline, *cost,
                                            settings.planner_options(), notes);
  for (const std::string& note : notes) fmt::print(stderr, "ballast: note: {}\n", note);
}

}  // namespace

std::vector<std::string> ablation_ladder() {
  return {"static-cp",
          "zeppelin:partition=even:routing=off:remap=off",
          "zeppelin:partition=even:remap=off",
          "zeppelin:remap=off",
          "zeppelin",
          "zeppelin:routing=off"};
}

int run_compare(const CompareArgs& args) {
  const Format format = parse_format(args.output.format);
  if (!args.plot_path.empty()) check_plot_target("compare", args.plot_path);
  RunSettings settings = settings_from(args.workload, args.scenario, RunSettings{}.steps);
  if (args.ablation) {
    if (!args.strategies.empty()) throw InputError("give either --ablation or --strategies, not both");
    settings.strategies = ablation_ladder();
    settings.baseline = "static-cp";
  }
  if (!args.strategies.empty()) {
    settings.strategies = split_list(args.strategies);
    if (settings.strategies.empty()) {
      throw InputError("--strategies lists no strategy; give names like packed-dp,hybrid-dp "
                       "(see `ballast list strategies`)");
    }
  }
  if (args.workload.no_routing || args.workload.no_remap || args.workload.even_split) {
    settings.strategies = apply_ablation_flags(
        args.workload, settings.strategies.empty() ? planner_names() : settings.strategies);
  }
  if (!args.baseline.empty()) {
    settings.baseline = args.baseline;
  } else if (std::find(settings.strategies.begin(), settings.strategies.end(), settings.baseline) ==
             settings.strategies.end()) {
    settings.baseline.clear();  // a scenario's baseline that --strategies left out: the default
  }
  if (!args.sweep.empty()) apply_degree_sweep(args, settings);
  Progress progress("compare");
  CompareProgress on_step;
  if (progress.enabled()) {
    on_step = [&progress](const std::string& strategy, int step, int steps) {
      progress.show(fmt::format("{} step {}/{}", strategy, step + 1, steps));
    };
  }
  const CompareResult result = ballast::run_compare(settings, on_step);
  progress.done();
  warn_over_context(result.settings.sampler, result.sampler_stats);
  if (std::all_of(result.results.begin(), result.results.end(),
                  [](const StrategyResult& r) { return !r.error.empty(); })) {
    // Nothing to compare: a usage error (exit 2), each strategy's reason on one line.
    std::vector<std::string> reasons;
    for (const StrategyResult& r : result.results) reasons.push_back(r.error);
    throw InputError(fmt::format("no strategy could run: {}", fmt::join(reasons, "; ")));
  }
  auto json = compare_to_json(result);
  if (!args.scenario.empty()) json["settings"]["scenario"] = args.scenario;
  if (!args.plot_path.empty()) {
    progress.show("drawing " + args.plot_path);
    draw_plot("compare", json, args.plot_path);
  }
  progress.done();
  Output output(args.output.output_path);
  std::ostream& out = output.stream();
  if (format == Format::text) {
    if (!args.scenario.empty()) fmt::print(out, "scenario {}\n", args.scenario);
    write_compare_text(result, out);
    if (!args.plot_path.empty()) fmt::print(out, "plot drawn to {}\n", args.plot_path);
  } else if (format == Format::csv) {
    write_compare_csv(result, out);
  } else {
    out << json.dump(1) << "\n";
  }
  output.commit();
  return 0;
}

}  // namespace ballast::cli
