// Planner and simulator latency on a fixed batch: each registered strategy plans (and the
// simulator simulates) a 512-sequence wlbllm batch on 8 x 8 H100 with LLaMA-2-7B; the
// "-tp2" benchmarks do the same with --tp 2 (32 TP groups of the 64 GPUs).
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

Fixture make_fixture(int tensor_parallel) {
  RunSettings settings;  // defaults: wlbllm, h100 x 8 nodes, llama-7b, analytical
  settings.steps = 1;
  settings.sampler.batch_size = 512;
  settings.sampler.tokens_per_step.reset();
  settings.tensor_parallel = tensor_parallel;
  RunInputs inputs = resolve_inputs(settings);
  return Fixture{std::move(inputs.cost), inputs.batches.front()};
}

const Fixture& fixture(int tensor_parallel) {
  static const Fixture without = make_fixture(1);
  static const Fixture with_tp2 = make_fixture(2);
  return tensor_parallel == 2 ? with_tp2 : without;
}

void plan_strategy(benchmark::State& state, const std::string& strategy, int tensor_parallel) {
  const Fixture& shared = fixture(tensor_parallel);
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

void simulate_strategy(benchmark::State& state, const std::string& strategy, int tensor_parallel) {
  const Fixture& shared = fixture(tensor_parallel);
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
  for (const int tp : {1, 2}) {
    const std::string suffix = tp == 1 ? "" : "-tp2";
    for (const std::string& name : planner_names()) {
      benchmark::RegisterBenchmark(("plan" + suffix + "/" + name).c_str(), plan_strategy, name, tp)
          ->Unit(benchmark::kMillisecond);
      benchmark::RegisterBenchmark(("simulate" + suffix + "/" + name).c_str(), simulate_strategy,
                                   name, tp)
          ->Unit(benchmark::kMillisecond);
    }
  }
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
