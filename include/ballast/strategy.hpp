// Strategy: a planner registered by name. plan(batch, cost, options) -> Plan, pure and
// deterministic. A new strategy is one file in src/strategies/ plus one line in
// src/strategies/registry.cpp.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/workload.hpp"

namespace ballast {

struct PlannerOptions {
  /// Fixed SP/CP degree for static strategies; default: the smallest power of two whose
  /// groups hold the batch's longest sequence in memory.
  std::optional<int> degree;
};

class Planner {
 public:
  virtual ~Planner() = default;
  virtual std::string name() const = 0;
  virtual std::string description() const = 0;  ///< one line for `ballast list strategies`
  /// Throws PlanningError naming the sequence and why when the batch cannot run.
  virtual Plan plan(const Batch& batch, const CostModel& cost,
                    const PlannerOptions& options) const = 0;
};

/// All registered planners in registration order.
const std::vector<std::unique_ptr<Planner>>& planners();
std::vector<std::string> planner_names();
/// Throws InputError listing the known strategies.
const Planner& find_planner(const std::string& name);

}  // namespace ballast
