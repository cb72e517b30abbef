// The strategy registry: one line per strategy, in a fixed order.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/strategy.hpp"
#include "builders.hpp"

namespace ballast {

namespace {

using PlannerFactory = std::unique_ptr<Planner> (*)();

constexpr PlannerFactory kFactories[] = {
    strategies::make_packed_dp_planner,           strategies::make_static_cp_planner,
    strategies::make_static_cp_allgather_planner, strategies::make_static_ulysses_planner,
    strategies::make_batch_adaptive_planner,      strategies::make_hybrid_dp_planner,
};

}  // namespace

const std::vector<std::unique_ptr<Planner>>& planners() {
  static const std::vector<std::unique_ptr<Planner>> all = [] {
    std::vector<std::unique_ptr<Planner>> made;
    for (PlannerFactory factory : kFactories) made.push_back(factory());
    return made;
  }();
  return all;
}

std::vector<std::string> planner_names() {
  std::vector<std::string> names;
  for (const auto& planner : planners()) names.push_back(planner->name());
  return names;
}

const Planner& find_planner(const std::string& name) {
  for (const auto& planner : planners()) {
    if (planner->name() == name) return *planner;
  }
  throw InputError(
      fmt::format("unknown strategy '{}'; known: {}", name, fmt::join(planner_names(), ", ")));
}

}  // namespace ballast
