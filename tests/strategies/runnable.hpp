// What each strategy can run on a cost model, shared by the property and volume tests: the
// longest sequence it holds (a batch with a longer one must raise PlanningError, any other
// batch must plan) and the cost model of a named setup.
#pragma once

#include <algorithm>
#include <memory>
#include <string>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/model.hpp"
#include "builders.hpp"

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

/// The longest sequence a strategy can run on this cost model.
inline Tokens longest_runnable_tokens(const std::string& strategy, const CostModel& cost) {
  if (strategy == "packed-dp") return usable_tokens_per_rank(cost, Scheme::local, 1);
  if (strategy == "static-cp") return max_sequence_tokens(cost, Scheme::ring);
  if (strategy == "static-cp-allgather") return max_sequence_tokens(cost, Scheme::all_gather);
  if (strategy == "static-ulysses" || strategy == "batch-adaptive" || strategy == "flexsp" ||
      strategy == "flexsp-fast") {
    return max_sequence_tokens(cost, Scheme::ulysses);
  }
  // zeppelin: a ring over every GPU of the cluster, the ring budget per rank, no padding.
  if (strategy == "zeppelin") {
    return usable_tokens_per_rank(cost, Scheme::ring, 2) * cost.cluster().ranks();
  }
  // hybrid-dp: rings of any power of two up to the rank count, the ring budget per rank.
  const Tokens per_rank = usable_tokens_per_rank(cost, Scheme::ring, 2);
  Tokens longest = per_rank;
  for (Tokens d = 2; d <= cost.cluster().ranks(); d *= 2) {
    longest = std::max(longest, d * per_rank / (2 * d) * (2 * d));
  }
  return longest;
}

}  // namespace ballast::strategies::testing
