// batch-adaptive (FlexSP's BatchAda): the static-ulysses plan at the power-of-two degree
// the cost-only estimate finds fastest for this batch.
#include <fmt/format.h>

#include "ballast/error.hpp"
#include "builders.hpp"
#include "ulysses.hpp"

namespace ballast::strategies {

namespace {

constexpr const char* kName = "batch-adaptive";

class BatchAdaptivePlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "FlexSP's BatchAda: the best homogeneous Ulysses degree for each batch (cost-model "
           "estimate)";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {{"degree", "a fixed Ulysses degree dividing the GPU count and the KV heads (as "
                       "--degree): static-ulysses at that degree [default: the degree the "
                       "cost-only estimate finds fastest for each step]"}};
  }
  /// Choosing per step is what this strategy does; degree=per-step would say nothing.
  void check_options(const PlannerOptions& options) const override {
    if (options.degree_per_step) {
      throw InputError(fmt::format("{}:degree={}: {} already chooses each step's degree; give a "
                                   "number or no degree",
                                   kName, kDegreePerStep, kName));
    }
  }
  /// Every allowed Ulysses degree (or the one given) is a candidate.
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    return longest_sequence_tokens_at_degree(cost, options, Scheme::ulysses, kName);
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    make_plan_skeleton(batch, cost, kName);  // input checks before degree selection
    if (options.degree) {
      return plan_static_ulysses(
          batch, cost, resolve_degree(batch, cost, options, Scheme::ulysses, kName), kName);
    }
    // Smallest feasible degree first (throws PlanningError when none is), then every larger
    // allowed one; strict < keeps the smaller degree on ties.
    const int smallest = default_degree(batch, cost, Scheme::ulysses, kName);
    Plan best = plan_static_ulysses(batch, cost, smallest, kName);
    Seconds best_time_s = estimate_plan_time_s(best, cost);
    for (int degree : allowed_degrees(cost, Scheme::ulysses)) {
      if (degree <= smallest) continue;
      Plan candidate = plan_static_ulysses(batch, cost, degree, kName);
      const Seconds time_s = estimate_plan_time_s(candidate, cost);
      if (time_s < best_time_s) {
        best = std::move(candidate);
        best_time_s = time_s;
      }
    }
    return best;
  }
};

}  // namespace

std::unique_ptr<Planner> make_batch_adaptive_planner() {
  return std::make_unique<BatchAdaptivePlanner>();
}

}  // namespace ballast::strategies
