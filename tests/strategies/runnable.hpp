// The cost model of a named setup, shared by the property and volume tests (what each
// strategy can run on it is Planner::longest_sequence_tokens).
#pragma once

#include <memory>
#include <string>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/model.hpp"
#include "ballast/strategy.hpp"

namespace ballast::strategies::testing {

struct TestSetup {
  std::string cluster;
  int nodes = 1;
  std::string model;
  std::string cost_model = "analytical";
};

inline std::unique_ptr<CostModel> make_cost(const TestSetup& setup) {
  const Cluster cluster = load_cluster(setup.cluster, setup.nodes);
  const Model model = load_model(setup.model);
  return make_cost_model(load_cost_model_spec(setup.cost_model), cluster, model);
}

}  // namespace ballast::strategies::testing
