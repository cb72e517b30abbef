// Property tests of every registered strategy on seeded batches: long-tailed samples of
// the bundled datasets, log-uniform random lengths and adversarial shapes (all-equal
// lengths, lengths of 1, powers of two plus one, one sequence of exactly one GPU's or the
// whole cluster's capacity, a sequence at and one past the strategy's limit, mixtures) over
// fifteen setups: cluster shapes, models (GQA and MHA), both cost models, and at a fifth of
// the batches each, full recomputation, tensor parallelism (two setups of TP groups) and
// mixture of experts (two setups). Each batch either
// raises a PlanningError naming a sequence the strategy cannot hold (exactly when its
// longest sequence exceeds Planner::longest_sequence_tokens), or gives a plan that
// validates, simulates to at least the lower bound, and is byte-identical (same simulated
// step) when planned again.
//
// BALLAST_VOLUME_SCALE (default 1) multiplies the batch counts: 0.1 for a sanitized build
// (scripts/test-sanitized), 10 for a long run. A planner whose solves_milp() says it costs
// CBC time per micro-batch gets fewer, smaller batches (<= 16 sequences on <= 16 GPUs,
// dense models only). A
// summary per strategy (batches, plans, PlanningErrors, seconds) is printed at the end.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/tensor_parallel.hpp"
#include "ballast/workload.hpp"
#include "builders.hpp"

namespace ballast::strategies {
namespace {


// ---- setups -------------------------------------------------------------------------

struct PropertySetup {
  std::string label;
  std::unique_ptr<CostModel> cost;
  double batch_share = 1.0;  ///< of kBatchesPerSetup (the variant setups run fewer)
};

/// h100 with `gpus_per_node` GPUs and `nics_per_node` NICs per node (fewer NICs than GPUs:
/// GPUs share a NIC, as on the a800-roce preset).
Cluster reshaped_h100(int nodes, int gpus_per_node, int nics_per_node) {
  Cluster cluster = load_cluster("h100", nodes);
  cluster.name = fmt::format("h100-{}x{}-{}nic", nodes, gpus_per_node, nics_per_node);
  cluster.gpus_per_node = gpus_per_node;
  cluster.nics_per_node = nics_per_node;
  validate_cluster(cluster, cluster.name);
  return cluster;
}

const std::vector<PropertySetup>& setups() {
  static const std::vector<PropertySetup> all = [] {
    std::vector<PropertySetup> made;
    const auto add = [&](std::string label, const Cluster& cluster, const std::string& model,
                         const std::string& cost_model) {
      made.push_back({std::move(label), make_cost_model(load_cost_model_spec(cost_model), cluster,
                                                        load_model(model))});
    };
    add("h100 1x8 llama-7b (MHA)", load_cluster("h100", 1), "llama-7b", "analytical");
    add("h100 2x4, 1 NIC/node, llama3-8b (GQA)", reshaped_h100(2, 4, 1), "llama3-8b", "analytical");
    add("h100 2x8 llama3-8b (GQA)", load_cluster("h100", 2), "llama3-8b", "analytical");
    add("h100 4x8 llama3-8b (GQA)", load_cluster("h100", 4), "llama3-8b", "analytical");
    add("a800-roce 1x8 llama3-8b", load_cluster("a800-roce", 1), "llama3-8b", "analytical");
    add("a800-roce 2x8 (4 NICs) llama-7b", load_cluster("a800-roce", 2), "llama-7b", "analytical");
    // FlexSP's profiled coefficients (per-micro-batch overhead b1) on its own cluster.
    add("a100-ib400 1x8 gpt-7b, profiled", load_cluster("a100-ib400", 1), "gpt-7b",
        "flexsp-a100-192k");
    add("a100-ib400 2x8 gpt-7b, profiled", load_cluster("a100-ib400", 2), "gpt-7b",
        "flexsp-a100-192k");
    // Rank counts that are not powers of two: 24 GPUs (llama-3b: 24 heads, 8 KV heads)
    // and 5 nodes of 2 GPUs sharing one NIC.
    add("h100 3x8 llama-3b (GQA, 24 ranks)", load_cluster("h100", 3), "llama-3b", "analytical");
    add("h100 5x2, 1 NIC/node, llama-7b", reshaped_h100(5, 2, 1), "llama-7b", "analytical");
    // Full recomputation: 11x the tokens per GPU, every forward run twice (the bound too).
    // A variant setup like the TP and MoE ones, at a fifth of the batches: its sequences of
    // millions of tokens made it 45% of zeppelin's time here at the full count.
    Model recomputed = load_model("llama-7b");
    recomputed.recompute = Recompute::full;
    made.push_back({"h100 2x8 llama-7b, full recomputation",
                    make_cost_model(load_cost_model_spec("analytical"), load_cluster("h100", 2),
                                    recomputed),
                    0.2});
    // Tensor parallelism: ranks are TP groups. TP 2 on llama3-8b leaves 4 KV heads per
    // GPU for Ulysses; TP groups spanning NICs (h100) and sharing one (4 GPUs per NIC, with
    // full recomputation: the forward's TP collectives run twice).
    const auto add_tp = [&](std::string label, const Cluster& gpus, Model shape, int tp) {
      made.push_back({std::move(label),
                      make_cost_model(load_cost_model_spec("analytical"),
                                      tensor_parallel_units(gpus, shape, tp), shape),
                      0.2});
    };
    // Mixture of experts (expert parallelism 8, seeded routing skew): inside one node of
    // h800 (Zeppelin's cluster B), and across two nodes of 4 GPUs with a larger skew.
    const auto add_moe = [&](std::string label, const Cluster& cluster, double cv) {
      Model moe = load_model("moe-8x550m");
      moe.routing_skew_cv = cv;
      made.push_back({std::move(label),
                      make_cost_model(load_cost_model_spec("analytical"), cluster, moe), 0.2});
    };
    add_moe("h800 2x8 moe-8x550m, EP 8", load_cluster("h800", 2), 0.2);
    Cluster narrow_h800 = load_cluster("h800", 2);
    narrow_h800.gpus_per_node = 4;
    narrow_h800.nics_per_node = 4;
    add_moe("h800 2x4 moe-8x550m, EP 8 across nodes, cv 0.5", narrow_h800, 0.5);
    add_tp("h100 2x8 llama3-8b, TP 2", load_cluster("h100", 2), load_model("llama3-8b"), 2);
    Model recomputed_gqa = load_model("llama3-8b");
    recomputed_gqa.recompute = Recompute::full;
    add_tp("h100 2x8, 2 NICs/node, llama3-8b, TP 2, full recomputation", reshaped_h100(2, 8, 2),
           recomputed_gqa, 2);
    return made;
  }();
  return all;
}

// ---- batch shapes -------------------------------------------------------------------

double uniform01(std::uint64_t& state) {
  return static_cast<double>(splitmix64_next(state) >> 11) * 0x1.0p-53;
}

Tokens log_uniform_tokens(std::uint64_t& state, Tokens max_tokens) {
  const double value = std::exp(uniform01(state) * std::log(static_cast<double>(max_tokens)));
  return std::clamp<Tokens>(static_cast<Tokens>(value), 1, max_tokens);
}

/// What a batch shape is sized against.
struct Capacities {
  int ranks = 1;
  Tokens strategy_max = 1;  ///< the longest sequence this strategy holds
  Tokens gpu = 1;           ///< one GPU's token capacity (local, no attention buffers)
  Tokens ring_gpu = 1;      ///< one GPU's capacity inside a ring (KV blocks in flight)
  Tokens cluster = 1;       ///< the whole cluster: ranks x ring_gpu (the longest any plan holds)
};

const Dataset& bundled(std::size_t index) {
  static const std::vector<Dataset> datasets = [] {
    std::vector<Dataset> loaded;
    for (const char* name : {"wlbllm", "prolong", "wikipedia", "magi"}) {
      loaded.push_back(load_dataset(name));
    }
    return loaded;
  }();
  return datasets[index % datasets.size()];
}

/// A long-tailed sample of a bundled dataset: a token budget of 0.2-4 steps of the
/// cluster, documents up to one GPU's capacity (every strategy runs it) or up to the
/// cluster's (some strategies cannot).
std::vector<Tokens> sampled(std::uint64_t seed, std::uint64_t& state, const Capacities& capacity) {
  SamplerOptions options;
  options.seed = seed;
  options.tokens_per_step = std::max<Tokens>(
      capacity.gpu, static_cast<Tokens>(static_cast<double>(capacity.ranks * capacity.gpu) *
                                        (0.2 + 3.8 * uniform01(state))));
  options.max_context_tokens =
      std::min(uniform01(state) < 0.5 ? capacity.gpu : capacity.cluster, *options.tokens_per_step);
  const double policy = uniform01(state);
  options.over_context = policy < 1.0 / 3   ? OverContextPolicy::drop
                         : policy < 2.0 / 3 ? OverContextPolicy::truncate
                                            : OverContextPolicy::split;
  options.order = seed % 3 == 0 ? SamplingOrder::sequential : SamplingOrder::random;
  const Dataset& dataset = bundled(seed / 11);
  if (dataset.is_histogram()) options.order = SamplingOrder::random;
  return BatchSampler(dataset, options).next().lengths_tokens;
}

enum class Shape {
  dataset,
  all_equal,
  ones,
  powers_of_two_plus_one,
  cluster_capacity,
  gpu_capacity,
  strategy_limit,
  boundaries,
  mixed,
  log_uniform,
  count,
};

const char* shape_name(Shape shape) {
  switch (shape) {
    case Shape::dataset:
      return "dataset sample";
    case Shape::all_equal:
      return "all equal";
    case Shape::ones:
      return "lengths of 1";
    case Shape::powers_of_two_plus_one:
      return "powers of two plus one";
    case Shape::cluster_capacity:
      return "one sequence of the cluster's capacity";
    case Shape::gpu_capacity:
      return "one sequence of one GPU's capacity";
    case Shape::strategy_limit:
      return "a sequence at / past the strategy's limit";
    case Shape::boundaries:
      return "lengths at tile and capacity boundaries";
    case Shape::mixed:
      return "mixed";
    case Shape::log_uniform:
      return "log-uniform random lengths";
    case Shape::count:
      break;
  }
  return "?";
}

std::vector<Tokens> make_lengths(Shape shape, std::uint64_t seed, const Capacities& capacity) {
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 7;
  std::vector<Tokens> lengths;
  const auto some_short = [&](std::size_t count, Tokens max_tokens) {
    for (std::size_t i = 0; i < count; ++i)
      lengths.push_back(log_uniform_tokens(state, max_tokens));
  };
  switch (shape) {
    case Shape::dataset:
      return sampled(seed, state, capacity);
    case Shape::all_equal: {
      const std::size_t count =
          capacity.ranks * (1 + uniform_below(state, 4)) + uniform_below(state, 3);
      const Tokens max_tokens = seed % 2 == 0 ? capacity.gpu : capacity.cluster / 4;
      lengths.assign(count, log_uniform_tokens(state, max_tokens));
      break;
    }
    case Shape::ones:
      lengths.assign(1 + uniform_below(state, 3000), 1);
      break;
    case Shape::powers_of_two_plus_one:
      for (Tokens power = 1; power + 1 <= capacity.cluster; power *= 2)
        lengths.push_back(power + 1);
      if (seed % 2 == 1) std::reverse(lengths.begin(), lengths.end());
      break;
    case Shape::cluster_capacity:
      lengths.push_back(capacity.cluster);
      some_short(uniform_below(state, 3) * capacity.ranks, capacity.gpu / 8);
      break;
    case Shape::gpu_capacity:
      lengths.push_back(seed % 2 == 0 ? capacity.gpu : capacity.ring_gpu);
      some_short(uniform_below(state, 2 * capacity.ranks), capacity.gpu / 4);
      break;
    case Shape::strategy_limit:
      some_short(uniform_below(state, capacity.ranks), capacity.gpu / 4);
      lengths.insert(lengths.begin() + static_cast<std::ptrdiff_t>(lengths.size() / 2),
                     capacity.strategy_max + (seed % 2 == 0 ? 0 : 1));
      break;
    case Shape::boundaries: {
      // Attention tiles (128), one GPU's and 2^k rings' capacities, each -1, 0, +1.
      std::vector<Tokens> edges = {128, capacity.gpu, capacity.ring_gpu};
      for (Tokens ring = 2; ring <= capacity.ranks; ring *= 2)
        edges.push_back(ring * capacity.ring_gpu);
      for (const Tokens edge : edges) {
        for (const Tokens delta : {-1, 0, 1}) {
          if (edge + delta >= 1 && edge + delta <= capacity.cluster && uniform01(state) < 0.6) {
            lengths.push_back(edge + delta);
          }
        }
      }
      some_short(uniform_below(state, capacity.ranks), 256);
      if (lengths.empty()) lengths.push_back(129);
      break;
    }
    case Shape::mixed:
      lengths.assign(uniform_below(state, 50), 1);
      lengths.insert(lengths.end(), uniform_below(state, 2 * capacity.ranks),
                     1 + static_cast<Tokens>(uniform_below(state, capacity.gpu)));
      for (Tokens power = 1; power + 1 <= capacity.cluster; power *= 4) {
        if (uniform01(state) < 0.5) lengths.push_back(power + 1);
      }
      some_short(uniform_below(state, 100), std::max<Tokens>(1, capacity.cluster / 2));
      if (lengths.empty()) lengths.push_back(1);
      // A seeded shuffle, so that ids do not follow the construction order.
      for (std::size_t i = lengths.size(); i > 1; --i) {
        std::swap(lengths[i - 1], lengths[uniform_below(state, i)]);
      }
      break;
    case Shape::log_uniform: {
      // 0.2-2.2 steps of the cluster's local budget in lengths up to one GPU's capacity
      // (every strategy runs it) or 9/8 of the cluster's (some cannot), at most 1,500.
      const Tokens max_tokens = seed % 2 == 0 ? capacity.gpu : capacity.cluster + capacity.cluster / 8;
      const double budget =
          capacity.ranks * static_cast<double>(capacity.gpu) * (0.2 + 2.0 * uniform01(state));
      double total = 0;
      while (total < budget && lengths.size() < 1500) {
        lengths.push_back(log_uniform_tokens(state, max_tokens));
        total += static_cast<double>(lengths.back());
      }
      break;
    }
    case Shape::count:
      break;
  }
  return lengths;
}

// ---- the property check -------------------------------------------------------------

struct Tally {
  int batches = 0;
  int plans = 0;
  int planning_errors = 0;
  double seconds = 0;
};

std::map<std::string, Tally>& tallies() {
  static std::map<std::string, Tally> all;
  return all;
}

/// CPU seconds of this process (the machine may be shared: wall time would count others).
double cpu_seconds() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

double volume_scale() {
  const char* text = std::getenv("BALLAST_VOLUME_SCALE");
  if (text == nullptr) return 1.0;
  const double scale = std::atof(text);
  return scale > 0 ? scale : 1.0;
}

/// A PlanningError must name a sequence (`sequence <id>`) that is longer than the strategy
/// can hold.
void expect_names_a_too_long_sequence(const std::string& message,
                                      const std::vector<Tokens>& lengths, Tokens strategy_max) {
  const std::size_t at = message.find("sequence ");
  ASSERT_NE(at, std::string::npos) << message;
  const long long id = std::atoll(message.c_str() + at + 9);
  ASSERT_GE(id, 0) << message;
  ASSERT_LT(static_cast<std::size_t>(id), lengths.size()) << message;
  EXPECT_GT(lengths[static_cast<std::size_t>(id)], strategy_max) << message;
}

/// Whether the planner plans with a portfolio of the other strategies (it takes a
/// "portfolio" parameter, as ballast does): it costs about their sum per batch, and each of
/// them is checked here on every batch already.
bool runs_a_portfolio(const Planner& planner) {
  const auto keys = planner.parameters();
  return std::any_of(keys.begin(), keys.end(),
                     [](const PlannerParameter& parameter) { return parameter.key == "portfolio"; });
}

/// The options a strategy runs with here: a portfolio planner gets a small search budget
/// (its search beyond that is the same code on more candidates).
PlannerOptions harness_options(const Planner& planner) {
  PlannerOptions options;
  if (runs_a_portfolio(planner)) options.parameters["budget"] = "4";
  return options;
}

/// Plans one batch and checks every property (gtest assertions; a fatal one returns early).
void check_batch(const Planner& planner, const CostModel& cost,
                 const SimulatorEvaluator& evaluator, const Batch& batch, Tokens strategy_max,
                 Tally& tally) {
  const PlannerOptions options = harness_options(planner);
  ++tally.batches;
  const bool runnable = batch.max_length_tokens() <= strategy_max;
  Plan plan;
  try {
    plan = planner.plan(batch, cost, options, evaluator);
  } catch (const PlanningError& error) {
    ++tally.planning_errors;
    EXPECT_FALSE(runnable) << "PlanningError on a batch whose longest sequence ("
                           << batch.max_length_tokens() << " tokens) fits the strategy's "
                           << strategy_max << ": " << error.what();
    expect_names_a_too_long_sequence(error.what(), batch.lengths_tokens, strategy_max);
    return;
  }
  ++tally.plans;
  ASSERT_TRUE(runnable) << "planned a batch with a sequence of " << batch.max_length_tokens()
                        << " tokens, over the strategy's " << strategy_max;
  const ValidationResult validation = validate(plan, cost);
  ASSERT_TRUE(validation.ok) << validation.message;
  const SimulationReport report = simulate(plan, cost);
  EXPECT_GE(report.step_time_s, report.lower_bound.time_s * (1 - 1e-9))
      << "bound " << report.lower_bound.time_s << " (" << report.lower_bound.binding << ")";
  const Plan again = planner.plan(batch, cost, options, evaluator);
  ASSERT_EQ(plan_to_string(plan), plan_to_string(again)) << "a rerun planned differently";
  EXPECT_EQ(report.step_time_s, simulate(again, cost).step_time_s);
}

/// Batches per (strategy, setup) at scale 1 (1,100 per strategy); a MILP planner gets
/// one of each shape per setup it runs on (86 small batches), a portfolio planner a third
/// (every shape still three times per setup). Sized for CI's time budget: at 150 per setup
/// and two of each shape for the MILP, these tests took 430 s of the suite's 890 s of CPU.
constexpr int kBatchesPerSetup = 100;
constexpr int kPortfolioBatchesPerSetup = kBatchesPerSetup / 3;
constexpr int kMilpBatchesPerSetup = static_cast<int>(Shape::count);
constexpr std::size_t kMilpMaxSequences = 16;
constexpr int kMilpMaxGpus = 16;

class StrategyProperties : public ::testing::TestWithParam<std::string> {};

TEST_P(StrategyProperties, ValidAboveTheBoundAndDeterministic) {
  const Planner& planner = find_planner(GetParam());
  const bool milp = planner.solves_milp({});
  const int batches = milp                         ? kMilpBatchesPerSetup
                      : runs_a_portfolio(planner) ? kPortfolioBatchesPerSetup
                                                  : kBatchesPerSetup;
  const int per_setup =
      std::max(1, static_cast<int>(std::lround(batches * volume_scale())));
  Tally& tally = tallies()[planner.name()];
  const double start_s = cpu_seconds();
  for (std::size_t s = 0; s < setups().size(); ++s) {
    const PropertySetup& setup = setups()[s];
    const CostModel& cost = *setup.cost;
    // CBC's time per micro-batch: MILP planners run on the dense setups of <= 16 GPUs
    // (MoE changes only the linear cost and memory they read, which the others cover).
    if (milp && (cost.cluster().ranks() > kMilpMaxGpus || cost.model().is_moe())) continue;
    const int setup_batches =
        std::max(1, static_cast<int>(std::lround(per_setup * setup.batch_share)));
    Capacities capacity;
    capacity.ranks = cost.cluster().ranks();
    const SimulatorEvaluator evaluator(cost);  // one per cost model, as compare keeps one
    capacity.strategy_max = planner.longest_sequence_tokens(cost, harness_options(planner));
    capacity.gpu = usable_tokens_per_rank(cost, Scheme::local, 1);
    capacity.ring_gpu = usable_tokens_per_rank(cost, Scheme::ring, 2);
    capacity.cluster = capacity.ring_gpu * capacity.ranks;
    for (int i = 0; i < setup_batches; ++i) {
      // The seed depends on the setup and index only: every strategy sees the same batches.
      const auto seed = static_cast<std::uint64_t>(s * 100'003 + static_cast<std::size_t>(i));
      const auto shape =
          static_cast<Shape>(static_cast<std::size_t>(i) % static_cast<std::size_t>(Shape::count));
      std::vector<Tokens> lengths = make_lengths(shape, seed, capacity);
      if (milp && lengths.size() > kMilpMaxSequences) {
        // Keep the longest (the shape's point) and the first others.
        const auto longest = std::max_element(lengths.begin(), lengths.end());
        std::iter_swap(lengths.begin(), longest);
        lengths.resize(kMilpMaxSequences);
      }
      const Batch batch = make_batch(std::move(lengths), static_cast<std::int64_t>(seed));
      SCOPED_TRACE(::testing::Message()
                   << planner.name() << " on " << setup.label << ", seed " << seed << ", "
                   << shape_name(shape) << ", " << batch.lengths_tokens.size()
                   << " sequences, longest " << batch.max_length_tokens());
      const double batch_start_s = cpu_seconds();
      check_batch(planner, cost, evaluator, batch, capacity.strategy_max, tally);
      if (std::getenv("BALLAST_VOLUME_VERBOSE") != nullptr) {
        std::printf("%s, %s, seed %llu, %s: %zu sequences, longest %lld: %.3f CPU s\n",
                    planner.name().c_str(), setup.label.c_str(),
                    static_cast<unsigned long long>(seed), shape_name(shape),
                    batch.lengths_tokens.size(), static_cast<long long>(batch.max_length_tokens()),
                    cpu_seconds() - batch_start_s);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  tally.seconds += cpu_seconds() - start_s;
  EXPECT_GT(tally.plans, 0);
}

INSTANTIATE_TEST_SUITE_P(AllStrategies, StrategyProperties, ::testing::ValuesIn(planner_names()),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(StrategyProperties, EveryRegisteredStrategyIsExercised) {
  // The harness is instantiated from the registry, so a new strategy is in it by itself;
  // this pins that no strategy is filtered out of it.
  std::vector<std::string> exercised;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(s);
    if (std::string(suite.name()) != "AllStrategies/StrategyProperties") continue;
    for (int t = 0; t < suite.total_test_count(); ++t) {
      const std::string name = suite.GetTestInfo(t)->name();
      exercised.push_back(name.substr(name.find('/') + 1));
    }
  }
  std::vector<std::string> registered;
  for (std::string name : planner_names()) {
    std::replace(name.begin(), name.end(), '-', '_');
    registered.push_back(name);
  }
  std::sort(exercised.begin(), exercised.end());
  std::sort(registered.begin(), registered.end());
  EXPECT_EQ(exercised, registered);
}

TEST(EstimateAgainstSimulator, UlyssesPlansAgreeWithinATenthOfAPercent) {
  // batch-adaptive ranks degrees by estimate_plan_time_s; the simulator is the reference.
  // Ulysses groups are disjoint and synchronous, so both must agree up to the one-token
  // differences between members (the estimate takes each member's own sum).
  for (const auto& [cluster, nodes, model, cost_model, tp] :
       {std::tuple{"a100-ib400", 2, "gpt-7b", "flexsp-a100-192k", 1},
        std::tuple{"h100", 2, "llama-7b", "analytical", 1},
        std::tuple{"h100", 2, "llama-7b", "analytical", 2}}) {
    const Model shape = load_model(model);
    const auto cost = make_cost_model(load_cost_model_spec(cost_model),
                                      tensor_parallel_units(load_cluster(cluster, nodes), shape, tp),
                                      shape);
    const SimulatorEvaluator evaluator(*cost);
    std::uint64_t state = 7;
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<Tokens> lengths;
      for (int i = 0; i < 64; ++i) lengths.push_back(log_uniform_tokens(state, 5'000));
      const Batch batch = make_batch(lengths, trial);
      for (int degree : {1, 2, 4, 8}) {
        PlannerOptions options;
        options.degree = degree;
        const Plan plan = find_planner("static-ulysses").plan(batch, *cost, options, evaluator);
        // The estimate charges the whole gradient sync after the step (the same for every
        // degree, so rankings do not depend on it): compare with the simulator's `end`.
        const double simulated_s =
            simulate(plan, *cost, {.gradient_sync = GradientSync::end}).step_time_s;
        EXPECT_NEAR(estimate_plan_time_s(plan, *cost) / simulated_s, 1.0, 1e-3)
            << cluster << " tp " << tp << " degree " << degree << " trial " << trial;
      }
    }
  }
}

/// Prints the summary after every test has run (one line per strategy that ran).
class Summary : public ::testing::Environment {
 public:
  void TearDown() override {
    if (tallies().empty()) return;
    std::printf("\nproperty summary (BALLAST_VOLUME_SCALE=%g)\n", volume_scale());
    std::printf("%-22s %8s %8s %16s %12s\n", "strategy", "batches", "plans", "PlanningErrors",
                "CPU seconds");
    Tally total;
    for (const auto& [name, tally] : tallies()) {
      std::printf("%-22s %8d %8d %16d %12.1f\n", name.c_str(), tally.batches, tally.plans,
                  tally.planning_errors, tally.seconds);
      total.batches += tally.batches;
      total.plans += tally.plans;
      total.planning_errors += tally.planning_errors;
      total.seconds += tally.seconds;
    }
    std::printf("%-22s %8d %8d %16d %12.1f\n", "total", total.batches, total.plans,
                total.planning_errors, total.seconds);
  }
};

const auto* const kSummary = ::testing::AddGlobalTestEnvironment(new Summary);

}  // namespace
}  // namespace ballast::strategies
