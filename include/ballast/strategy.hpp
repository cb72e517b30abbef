// Strategy: a planner registered by name. plan(batch, cost, options, evaluator) -> Plan,
// pure and deterministic; the PlanEvaluator (the caller's, usually SimulatorEvaluator)
// prices candidate plans, so planners never depend on the simulator. A new strategy is one
// file in src/strategies/ defining a Planner subclass and its factory
// `std::unique_ptr<Planner> strategies::make_<name>_planner()`, plus one line `X(<name>)`
// in BALLAST_STRATEGIES in src/strategies/registry.cpp (its position is its place in every
// listing). CMake globs that folder; the property, MPI exactness and Python tests loop
// over the registry and check that every registered strategy ran.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/workload.hpp"

namespace ballast {

struct PlannerOptions {
  /// Fixed SP/CP degree for static strategies (--degree, a spec's degree=N); without it
  /// they take their default rule (docs/strategies.md, "Default degree").
  std::optional<int> degree;
  /// A spec's degree=per-step: the static strategies pick, for every batch, the smallest
  /// power of two whose groups hold that batch's longest sequence, so the degree changes
  /// from step to step (not how runs are configured; kept for comparison). Never set
  /// together with `degree`.
  bool degree_per_step = false;
  /// The run's context length (--max-context: no sequence of the run is longer). The
  /// static strategies' default degree is the smallest whose groups hold it, the same for
  /// every step, as runs fix --context-parallel-size from the context. Every caller that
  /// plans the batches of a run sets it (RunSettings::planner_options()); without it (a
  /// batch planned on its own) the batch's longest sequence stands in for it.
  std::optional<Tokens> context_tokens;
  /// Strategy-specific parameters from a spec "name:key=value" (see StrategySpec); only
  /// keys the planner lists in Planner::parameters() get here.
  std::map<std::string, std::string> parameters;
};

/// What a planner may ask about candidate plans; provided by whoever calls the planner (the CLI,
/// compare, the Python module, tests), so planners never depend on the simulator.
/// A plan's predicted step and where its ranks spend it (PlanEvaluator::evaluate).
struct PlanEvaluation {
  Seconds step_time_s = 0;
  /// Per rank of the cluster, its own time summed over the micro-batches: compute plus the
  /// communication compute does not hide (RankTimes busy_s + exposed_communication_s).
  /// Empty when the evaluator only predicts step times.
  std::vector<Seconds> rank_time_s;
  /// Per rank, the same without the gradient sync: compute plus the exposed communication
  /// of its micro-batches. Under the overlapped sync a rank that finishes early waits in
  /// the sync's buckets for the slowest one; that wait counts in rank_time_s (as exposed
  /// communication), not here, so this is what the rank could still take on. Empty
  /// exactly when rank_time_s is.
  std::vector<Seconds> rank_time_before_sync_s;
};

class PlanEvaluator {
 public:
  virtual ~PlanEvaluator() = default;
  /// Predicted step time of a plan that validate() accepted.
  virtual Seconds step_time_s(const Plan& validated_plan) const = 0;
  /// step_time_s() when it is below `bound_s`; otherwise any time >= bound_s and <= the
  /// step (an evaluator may stop once the step is known to reach the bound). For a planner
  /// that only keeps a candidate faster than its best so far. Default: step_time_s().
  virtual Seconds step_time_below_s(const Plan& validated_plan, Seconds bound_s) const {
    static_cast<void>(bound_s);
    return step_time_s(validated_plan);
  }
  /// step_time_s() and, where the evaluator knows them, the ranks' own times (one
  /// simulation for both with SimulatorEvaluator). Default: no rank times.
  virtual PlanEvaluation evaluate(const Plan& validated_plan) const {
    return {step_time_s(validated_plan), {}, {}};
  }
  /// evaluate() when the step is below `bound_s`; otherwise a step_time_s >= bound_s and no
  /// later than the step, and rank times only if the evaluator has them (an evaluator may
  /// stop once the step is known to reach the bound). For a planner that needs the ranks'
  /// times of a candidate only when it beats its best so far. Default: evaluate().
  virtual PlanEvaluation evaluate_below(const Plan& validated_plan, Seconds bound_s) const {
    static_cast<void>(bound_s);
    return evaluate(validated_plan);
  }
  /// Time of one transfer alone on an idle cluster (see isolated_transfer_time_s).
  virtual Seconds transfer_time_s(Bytes bytes_per_layer, int src_rank, int dst_rank,
                                  int routing_proxies, int routing_chunks) const = 0;
  /// A time transfer_time_s() never goes below for the same arguments, known without
  /// computing it; planners skip routing choices that cannot win with it, so it changes no
  /// choice, only what is priced. Default: 0 (no floor known, nothing skipped).
  virtual Seconds transfer_time_floor_s(Bytes bytes_per_layer, int src_rank, int dst_rank,
                                        int routing_proxies, int routing_chunks) const {
    static_cast<void>(bytes_per_layer), static_cast<void>(src_rank), static_cast<void>(dst_rank);
    static_cast<void>(routing_proxies), static_cast<void>(routing_chunks);
    return 0.0;
  }
  /// Called by EvaluationSession: while a session is open, the evaluator may keep what its
  /// evaluations on this thread share (SimulatorEvaluator: the ring and USP groups' step
  /// compute times, open_simulation_cache) and must free it when the last one closes.
  /// Sessions nest. Kept results are the very numbers a new evaluation gives, so no answer
  /// changes. Default: nothing kept.
  virtual void open_session() const {}
  virtual void close_session() const {}
};

/// Held by a planner that evaluates many candidate plans sharing most of their groups
/// (ballast, zeppelin) for the length of one plan() on one thread: each plan starts cold,
/// so nothing one batch's planning kept reaches the next (and a benchmark that plans one
/// batch again and again measures a cold plan each time).
class EvaluationSession {
 public:
  explicit EvaluationSession(const PlanEvaluator& evaluator) : evaluator_(evaluator) {
    evaluator_.open_session();
  }
  ~EvaluationSession() { evaluator_.close_session(); }
  EvaluationSession(const EvaluationSession&) = delete;
  EvaluationSession& operator=(const EvaluationSession&) = delete;

 private:
  const PlanEvaluator& evaluator_;
};

/// One parameter a planner takes in a strategy spec ("degree" sets PlannerOptions::degree,
/// or degree_per_step for the value kDegreePerStep).
struct PlannerParameter {
  std::string key;
  std::string help;  ///< one line: what it does, its values and default
};

class Planner {
 public:
  virtual ~Planner() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;  ///< one line for `ballast list strategies`
  /// Keys this planner takes in a strategy spec; none by default.
  virtual std::vector<PlannerParameter> parameters() const { return {}; }
  /// Throws InputError naming a parameter whose value this planner cannot take (checked
  /// when a spec is parsed, before any batch is planned).
  virtual void check_options(const PlannerOptions& /*options*/) const {}
  /// Whether a degree set for every strategy (--degree, a scenario's "degree") applies to
  /// this planner with these spec options; a degree in the spec itself always applies
  /// (and check_options() judges it). Default: the planner takes a "degree" parameter.
  virtual bool takes_common_degree(const PlannerOptions& options) const;
  /// The longest sequence (tokens) this planner can plan on this cost model with these
  /// options: a batch with a longer one raises PlanningError, any other batch plans (within
  /// the limits of limits.hpp). Throws InputError for options plan() would reject on this
  /// cost model (e.g. a degree that does not divide the rank count).
  virtual Tokens longest_sequence_tokens(const CostModel& cost,
                                         const PlannerOptions& options) const = 0;
  /// A hint to test harnesses and benchmarks, not a contract: true when planning with these
  /// options solves a MILP (CBC, up to seconds per micro-batch), so that a harness runs it
  /// on fewer and smaller batches.
  virtual bool solves_milp(const PlannerOptions& /*options*/) const { return false; }
  /// Throws PlanningError naming the sequence and why when the batch cannot run. `evaluator`
  /// prices candidate plans and transfers for planners that compare alternatives
  /// (SimulatorEvaluator in simulator.hpp is the usual one).
  virtual Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                    const PlanEvaluator& evaluator) const = 0;
  /// For a caller that keeps the plan only when its step is below `cap_s` (ballast's
  /// portfolio): plan()'s plan when its step by `evaluator` is below `cap_s`; otherwise any
  /// valid plan whose step is not (a planner that simulates candidates may stop each at the
  /// cap). Default: plan().
  virtual Plan plan_below(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                          const PlanEvaluator& evaluator, Seconds cap_s) const {
    static_cast<void>(cap_s);
    return plan(batch, cost, options, evaluator);
  }
  /// A hint, as solves_milp(): true when planning with these options simulates candidates
  /// (evaluator.step_time_below_s), so that plan_below() saves time; a caller running
  /// several planners runs these last, capped by the best plan of the others.
  virtual bool simulates_candidates(const PlannerOptions& /*options*/) const { return false; }
};

/// All registered planners in registration order.
const std::vector<std::unique_ptr<Planner>>& planners();
std::vector<std::string> planner_names();
/// Throws InputError listing the known strategies.
const Planner& find_planner(const std::string& name);

/// The value of a spec's "degree" that selects the per-step rule (degree_per_step).
inline constexpr const char* kDegreePerStep = "per-step";

/// A strategy as written in --strategy, --strategies and scenarios: "name" or
/// "name:key=value[:key=value...]", e.g. "static-ulysses:degree=32". The text is the
/// strategy's label in reports, so two specs of one strategy can be compared.
struct StrategySpec {
  std::string text;
  const Planner* planner = nullptr;
  PlannerOptions options;  ///< `base` with the spec's parameters applied
};
/// Throws InputError naming the spec and the fix: unknown strategy, a parameter not of
/// the form key=value, a key the strategy does not take (listing those it does), a
/// repeated key, a degree that is neither a positive integer nor per-step, or a value the
/// planner's check_options() rejects.
StrategySpec parse_strategy_spec(const std::string& text, const PlannerOptions& base = {});
/// Checks a parsed spec's options against the cluster and model before any batch is
/// planned (a degree that does not divide the ranks or the KV heads, a run's context that
/// no degree a static strategy can take holds...): throws InputError naming the spec, the
/// setting and the fix. A strategy that merely cannot run some batch is not an error here
/// (plan() raises PlanningError for that batch).
void check_strategy_spec(const StrategySpec& spec, const CostModel& cost);

/// The value of a spec parameter, or `fallback` when the spec did not set it.
std::string parameter_or(const PlannerOptions& options, const std::string& key,
                         const std::string& fallback);
/// An integer parameter in [min_value, max_value]; throws InputError naming the key.
long long integer_parameter_or(const PlannerOptions& options, const std::string& key,
                               long long fallback, long long min_value, long long max_value);

}  // namespace ballast
