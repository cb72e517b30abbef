// fuzz_plan: plan JSON (plan_from_json), its canonical text round trip, validate() with the
// plan's own cost model, and simulate() on every plan validate() accepts.
// Input: JSON text, as written by `ballast plan` (docs/plan-format.md); inputs of odd size
// are read from a scratch file by read_plan_file() (one plan or an array of plans).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace ballast;

/// to_json -> plan_from_json -> plan_to_string gives the same text (docs/plan-format.md:
/// byte-identical for equal plans).
void check_round_trip(const Plan& plan) {
  const std::string text = plan_to_string(plan);
  const Plan again = plan_from_json(nlohmann::json::parse(text), "round trip");
  FUZZ_REQUIRE(plan_to_string(again) == text, "plan text round trip differs:\n" + text);
  FUZZ_REQUIRE(to_json(again) == to_json(plan), "plan JSON round trip differs");
}

void check_report(const Plan& plan, const CostModel& cost, const SimulationReport& report) {
  const LowerBound bound = lower_bound(plan.sequence_lengths_tokens, cost);
  FUZZ_REQUIRE(!std::isnan(report.step_time_s) && report.step_time_s >= 0,
               "step time " + std::to_string(report.step_time_s));
  FUZZ_REQUIRE(report.step_time_s >= bound.time_s * (1 - 1e-9),
               "step " + std::to_string(report.step_time_s) + " s beats the lower bound " +
                   std::to_string(bound.time_s) + " s (" + bound.binding + ")");
  FUZZ_REQUIRE(static_cast<int>(report.ranks.size()) == plan.cluster.ranks(), "one entry per rank");
  for (const RankTimes& rank : report.ranks) {
    FUZZ_REQUIRE(rank.busy_s >= 0 && rank.busy_s <= report.step_time_s * (1 + 1e-9) + 1e-12,
                 "busy time outside [0, step]");
    FUZZ_REQUIRE(rank.peak_memory_bytes <= cost.memory_limit_bytes(),
                 "a validated plan over the memory limit");
  }
  // Deterministic: a second run gives the same step time.
  FUZZ_REQUIRE(simulate(plan, cost).step_time_s == report.step_time_s, "simulate() not deterministic");
}

/// Round trip, then validate() with the plan's own cost model, then simulate() if valid.
void check_plan(const Plan& plan) {
  check_round_trip(plan);
  const auto cost = make_cost_model(plan.cost_model, plan.cluster, plan.model);
  const ValidationResult result = validate(plan, *cost);
  if (!result.ok) {
    FUZZ_REQUIRE(!result.message.empty(), "an invalid plan without a message");
    return;
  }
  check_report(plan, *cost, simulate(plan, *cost));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  // Inputs of odd size go through the file reader (read_plan_file: read_json_file's
  // errors, its size and value limits, arrays of plans); even ones are parsed here.
  if (size % 2 == 1) {
    return ballast::fuzz::run_one_input([&] {
      const std::vector<Plan> plans = [&] {
        const ballast::fuzz::ScratchFile file("plan", data, size);
        return read_plan_file(file.path());
      }();
      for (const Plan& plan : plans) check_plan(plan);
    });
  }
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON (or a number beyond a double's range): a clean rejection
  }
  return ballast::fuzz::run_one_input([&] { check_plan(plan_from_json(json, "fuzz")); });
}

