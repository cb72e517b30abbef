// Planner and simulator latency on a fixed batch: each registered strategy plans (and the
// simulator simulates) a 512-sequence wlbllm batch on 8 x 8 H100 with LLaMA-2-7B; the
// "-tp2" benchmarks do the same with --tp 2 (32 TP groups of the 64 GPUs). The portfolio
// (flexsp-fast, zeppelin, ballast) also plans two other 64-GPU batches whose zeppelin rings
// are routed and costlier to simulate: "plan@h200/" the default workload (1 Mi tokens,
// 211 sequences) on 8 x 8 H200, "plan@a100-ib400/" the 512-sequence batch on a100-ib400.
// Run: build/bench/bench_planners [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <memory>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/simulator.hpp"

namespace {

using namespace ballast;

/// The batch and cost model every benchmark shares (sampled once, seed 0).
struct Fixture {
  std::unique_ptr<CostModel> cost;
  Batch batch;
};

/// The batches: "" (h100, 512 sequences), "-tp2" (the same with --tp 2), "@h200" (the
/// default workload on h200), "@a100-ib400" (512 sequences on a100-ib400).
Fixture make_fixture(const std::string& variant) {
  RunSettings settings;  // defaults: wlbllm, h100 x 8 nodes, llama-7b, analytical
  settings.steps = 1;
  if (variant != "@h200") {
    settings.sampler.batch_size = 512;
    settings.sampler.tokens_per_step.reset();
  }
  if (variant == "-tp2") settings.tensor_parallel = 2;
  if (variant == "@h200") settings.cluster = "h200";
  if (variant == "@a100-ib400") settings.cluster = "a100-ib400";
  RunInputs inputs = resolve_inputs(settings);
  return Fixture{std::move(inputs.cost), inputs.batches.front()};
}

const Fixture& fixture(const std::string& variant) {
  static const Fixture h100 = make_fixture("");
  static const Fixture with_tp2 = make_fixture("-tp2");
  if (variant == "") return h100;
  if (variant == "-tp2") return with_tp2;
  static const Fixture h200 = make_fixture("@h200");
  static const Fixture a100 = make_fixture("@a100-ib400");
  return variant == "@h200" ? h200 : a100;
}

void plan_strategy(benchmark::State& state, const std::string& strategy, const std::string& variant) {
  const Fixture& shared = fixture(variant);
  const Planner& planner = find_planner(strategy);
  const SimulatorEvaluator evaluator(*shared.cost);
  try {
    for (auto _ : state) {
      Plan plan = planner.plan(shared.batch, *shared.cost, {}, evaluator);
      benchmark::DoNotOptimize(plan);
    }
  } catch (const PlanningError& error) {
    state.SkipWithError(error.what());
  }
  state.counters["sequences"] = static_cast<double>(shared.batch.lengths_tokens.size());
  state.counters["ranks"] = shared.cost->cluster().ranks();
}

void simulate_strategy(benchmark::State& state, const std::string& strategy, const std::string& variant) {
  const Fixture& shared = fixture(variant);
  Plan plan;
  try {
    plan = find_planner(strategy).plan(shared.batch, *shared.cost, {},
                                       SimulatorEvaluator(*shared.cost));
  } catch (const PlanningError& error) {
    state.SkipWithError(error.what());
    return;
  }
  for (auto _ : state) {
    SimulationReport report = simulate(plan, *shared.cost);
    benchmark::DoNotOptimize(report);
  }
}

const bool registered = [] {
  for (const std::string suffix : {"", "-tp2"}) {
    for (const std::string& name : planner_names()) {
      benchmark::RegisterBenchmark(("plan" + suffix + "/" + name).c_str(), plan_strategy, name, suffix)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("simulate" + suffix + "/" + name).c_str(), simulate_strategy,
                                   name, suffix)
          ->Unit(benchmark::kMillisecond);
    }
  }
  for (const std::string variant : {"@h200", "@a100-ib400"}) {
    for (const std::string name : {"flexsp-fast", "zeppelin", "ballast"}) {
      benchmark::RegisterBenchmark(("plan" + variant + "/" + name).c_str(), plan_strategy, name, variant)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
