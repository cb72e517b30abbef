// FlexSP planner latency versus batch size and cluster size: flexsp-fast (and, at the
// paper's 64 GPUs, the faithful MILP) plans consecutive Wikipedia documents on A100 nodes
// with FlexSP's profiled GPT-7B coefficients at 192K context (the flexsp-7b-192k setting).
// Run: build/bench/bench_flexsp [--benchmark_filter=fast] [--benchmark_format=json]
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <utility>

#include "ballast/compare.hpp"
#include "ballast/error.hpp"
#include "ballast/simulator.hpp"

namespace {

using namespace ballast;

struct Fixture {
  std::unique_ptr<CostModel> cost;
  Batch batch;
};

/// One batch of `sequences` consecutive documents on `gpus` / 8 nodes, built once.
const Fixture& fixture(int sequences, int gpus) {
  static std::map<std::pair<int, int>, Fixture> made;
  auto found = made.find({sequences, gpus});
  if (found != made.end()) return found->second;
  RunSettings settings;
  apply_scenario(find_scenario("flexsp-7b-192k"), settings);
  settings.nodes = gpus / 8;
  settings.steps = 1;
  settings.sampler.batch_size = sequences;
  RunInputs inputs = resolve_inputs(settings);
  return made.emplace(std::make_pair(sequences, gpus),
                      Fixture{std::move(inputs.cost), inputs.batches.front()})
      .first->second;
}

void plan_flexsp(benchmark::State& state, const std::string& strategy) {
  const auto sequences = static_cast<int>(state.range(0));
  const auto gpus = static_cast<int>(state.range(1));
  const Fixture& shared = fixture(sequences, gpus);
  const StrategySpec spec = parse_strategy_spec(strategy);
  std::size_t micro_batches = 0;
  const SimulatorEvaluator evaluator(*shared.cost);
  try {
    for (auto _ : state) {
      Plan plan = spec.planner->plan(shared.batch, *shared.cost, spec.options, evaluator);
      micro_batches = plan.micro_batches.size();
      benchmark::DoNotOptimize(plan);
    }
  } catch (const InputError& error) {
    state.SkipWithError(error.what());
  }
  state.counters["sequences"] = sequences;
  state.counters["gpus"] = gpus;
  state.counters["micro_batches"] = static_cast<double>(micro_batches);
}

const bool registered = [] {
  auto* fast = benchmark::RegisterBenchmark("fast", plan_flexsp, "flexsp-fast");
  for (int sequences : {128, 256, 512, 1024, 2048, 4096}) fast->Args({sequences, 64});
  for (int gpus : {16, 32, 128, 256, 512, 1024}) fast->Args({512, gpus});
  fast->Args({4096, 1024});  // the largest batch on the largest cluster
  fast->Unit(benchmark::kMillisecond);
  // The faithful MILP at the paper's size only: seconds per plan.
  benchmark::RegisterBenchmark("milp", plan_flexsp, "flexsp")
      ->Args({512, 64})
      ->Unit(benchmark::kMillisecond)
      ->Iterations(1);
  return true;
}();

}  // namespace

BENCHMARK_MAIN();
