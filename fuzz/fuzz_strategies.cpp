// fuzz_strategies: every planner on fuzzer-chosen clusters, models and batches. The bytes
// pick a cluster preset (1..8 nodes, sometimes fewer or more GPUs per node), a model
// preset, a strategy spec and 1..64 sequence lengths (1..200,000 tokens, weighted towards
// adversarial values: 1, 2^k, 2^k +- 1, the per-GPU token capacity, its fractions and
// multiples). A PlanningError / InputError is a clean rejection; a plan must then pass
// validate(), simulate no faster than lower_bound(), and be byte-identical when planned
// again. FlexSP's MILP (flexsp, flexsp-fast:refine=milp) gets batches of <= 8 sequences.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include <fuzzer/FuzzedDataProvider.h>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/workload.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace ballast;

constexpr Tokens kMaxFuzzLength = 200'000;
constexpr std::size_t kMaxSequences = 64;
constexpr std::size_t kMaxSmallSequences = 8;  // and every batch FlexSP's MILP solves

const std::vector<std::string> kClusterPresets = {"h100", "a800-roce", "a100-ib400", "h200"};

/// Strategy specs: every registered planner by name plus parameter variants. Specs that no
/// longer parse (a renamed planner or key) are dropped at start-up.
const std::vector<std::string>& strategy_specs() {
  static const std::vector<std::string> specs = [] {
    std::vector<std::string> candidates = planner_names();
    for (const char* variant :
         {"static-cp:degree=1", "static-cp:degree=2", "static-cp:degree=8", "static-cp:degree=16",
          "static-cp-allgather:degree=2", "static-cp-allgather:degree=8",
          "static-ulysses:degree=1", "static-ulysses:degree=4", "static-ulysses:degree=8",
          "static-ulysses:degree=32", "batch-adaptive:degree=8", "flexsp:buckets=exact",
          "flexsp-fast:refine=milp", "zeppelin:partition=even", "zeppelin:partition=even:degree=4",
          "zeppelin:routing=on", "zeppelin:routing=off", "zeppelin:remap=on", "zeppelin:remap=off",
          "zeppelin:routing=on:remap=on", "zeppelin:placement=node-totals", "ballast:budget=0",
          "ballast:portfolio=flexsp-fast+zeppelin:budget=4", "ballast:ring_routing=auto:budget=4"}) {
      candidates.emplace_back(variant);
    }
    std::vector<std::string> valid;
    for (const std::string& spec : candidates) {
      try {
        (void)parse_strategy_spec(spec);
        valid.push_back(spec);
      } catch (const InputError&) {
      }
    }
    return valid;
  }();
  return specs;
}

/// BALLAST_FUZZ_VERBOSE=1 prints each input's configuration (to read a reproducer).
bool verbose() {
  static const bool on = std::getenv("BALLAST_FUZZ_VERBOSE") != nullptr;
  return on;
}

bool solves_milp(const std::string& spec) {
  return spec == "flexsp" || spec.starts_with("flexsp:") || spec.find("refine=milp") != std::string::npos;
}

Cluster fuzzed_cluster(FuzzedDataProvider& bytes) {
  Cluster cluster = cluster_preset(bytes.PickValueInArray(
      {kClusterPresets[0], kClusterPresets[1], kClusterPresets[2], kClusterPresets[3]}));
  cluster.nodes = bytes.ConsumeIntegralInRange(1, 8);
  // Mostly the preset's 8 GPUs per node; sometimes a smaller or larger node.
  const int gpus_per_node = bytes.PickValueInArray({0, 0, 0, 0, 1, 2, 4, 16});
  if (gpus_per_node != 0) {
    cluster.gpus_per_node = gpus_per_node;
    cluster.nics_per_node = std::gcd(cluster.nics_per_node, gpus_per_node);
  }
  validate_cluster(cluster, "fuzz cluster");
  return cluster;
}

/// One length in [1, kMaxFuzzLength], weighted towards boundary values.
Tokens fuzzed_length(FuzzedDataProvider& bytes, Tokens capacity, Tokens previous) {
  const int power = bytes.ConsumeIntegralInRange(0, 17);  // 2^17 = 131072 <= 200,000
  Tokens length = 1;
  switch (bytes.ConsumeIntegralInRange(0, 7)) {
    case 0: length = bytes.ConsumeIntegralInRange<Tokens>(1, kMaxFuzzLength); break;
    case 1: length = 1; break;
    case 2: length = Tokens{1} << power; break;
    case 3: length = (Tokens{1} << power) + 1; break;
    case 4: length = (Tokens{1} << power) - 1; break;
    case 5: {  // capacity * m / 4 + {-1, 0, 1}, m in 1..12: fractions and multiples
      const Tokens multiple = capacity * bytes.ConsumeIntegralInRange<Tokens>(1, 12) / 4;
      length = multiple + bytes.ConsumeIntegralInRange<Tokens>(-1, 1);
      break;
    }
    case 6: length = previous; break;
    default: length = bytes.ConsumeIntegralInRange<Tokens>(1, 4096); break;
  }
  return std::clamp<Tokens>(length, 1, kMaxFuzzLength);
}

void check_plan(const Plan& plan, const Batch& batch, const CostModel& cost, const std::string& spec) {
  const std::string context = spec + " on " + plan.cluster.name + " x" +
                              std::to_string(plan.cluster.nodes) + " (" +
                              std::to_string(plan.cluster.gpus_per_node) + " GPUs/node), " +
                              plan.model.name;
  const ValidationResult result = validate(plan, cost);
  FUZZ_REQUIRE(result.ok, context + ": planner made an invalid plan: " + result.message);
  FUZZ_REQUIRE(plan.sequence_lengths_tokens == batch.lengths_tokens,
               context + ": plan is for other lengths");
  const SimulationReport report = simulate(plan, cost);
  const LowerBound bound = lower_bound(batch.lengths_tokens, cost);
  FUZZ_REQUIRE(report.step_time_s >= bound.time_s * (1 - 1e-9),
               context + ": step " + std::to_string(report.step_time_s) +
                   " s beats the lower bound " + std::to_string(bound.time_s) + " s (" +
                   bound.binding + ")");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider bytes(data, size);
  return ballast::fuzz::run_one_input([&] {
    const Cluster cluster = fuzzed_cluster(bytes);
    const std::vector<std::string> models = model_preset_names();
    const Model model = model_preset(models[bytes.ConsumeIntegralInRange<std::size_t>(0, models.size() - 1)]);
    const std::vector<std::string>& specs = strategy_specs();
    const std::string& spec_text = specs[bytes.ConsumeIntegralInRange<std::size_t>(0, specs.size() - 1)];
    // Mostly analytical; sometimes FlexSP's profiled coefficients (GPT models only, else
    // make_cost_model rejects the pair cleanly).
    const bool profiled = bytes.ConsumeIntegralInRange(0, 7) == 0;
    const auto cost = make_cost_model(
        load_cost_model_spec(profiled ? "flexsp-a100-192k" : "analytical"), cluster, model);
    const Tokens capacity = cost->token_capacity_per_rank();  // InputError: model does not fit

    // Two batches in three have at most 8 sequences: they plan fast (a 64-sequence batch on
    // 64 GPUs takes ~1 s under the sanitizers), so the fuzzer explores more of them.
    const bool small_batch = solves_milp(spec_text) || bytes.ConsumeIntegralInRange(0, 2) != 0;
    const std::size_t sequences =
        bytes.ConsumeIntegralInRange<std::size_t>(1, small_batch ? kMaxSmallSequences : kMaxSequences);
    std::vector<Tokens> lengths;
    for (std::size_t i = 0; i < sequences; ++i) {
      lengths.push_back(fuzzed_length(bytes, capacity, lengths.empty() ? 1 : lengths.back()));
    }
    const Batch batch = make_batch(lengths, bytes.ConsumeIntegralInRange<std::int64_t>(0, 3));

    if (verbose()) {
      std::string shown;
      for (Tokens length : lengths) shown += " " + std::to_string(length);
      std::fprintf(stderr, "fuzz_strategies: %s on %s x%d (%d GPUs/node), %s, %s cost, lengths%s\n",
                   spec_text.c_str(), cluster.name.c_str(), cluster.nodes, cluster.gpus_per_node,
                   model.name.c_str(), profiled ? "profiled" : "analytical", shown.c_str());
    }
    const StrategySpec spec = parse_strategy_spec(spec_text);
    const SimulatorEvaluator evaluator(*cost);
    const Plan plan = spec.planner->plan(batch, *cost, spec.options, evaluator);  // PlanningError: clean
    check_plan(plan, batch, *cost, spec_text);
    const Plan again = spec.planner->plan(batch, *cost, spec.options, evaluator);
    FUZZ_REQUIRE(plan_to_string(again) == plan_to_string(plan),
                 spec_text + ": planning the same batch twice gave different plans");
  });
}
