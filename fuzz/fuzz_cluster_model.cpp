// fuzz_cluster_model: cluster and model JSON (cluster_from_json, model_from_json, their
// validation and round trip), then a cost model built on what was accepted and queried.
// Input: JSON text. An object with "cluster" and/or "model" members (and optionally a
// "cost_model" spec, default analytical) supplies those parts; a bare object is tried as
// a cluster and as a model. A missing part is a preset (h100 on 2 nodes, llama-7b).
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/model.hpp"
#include "fuzz_support.hpp"

namespace {

using namespace ballast;

void require_time(Seconds time_s, const char* what) {
  FUZZ_REQUIRE(!std::isnan(time_s) && time_s >= 0, std::string(what) + " = " + std::to_string(time_s));
}

/// to_json -> from_json gives back the same JSON.
void check_round_trip(const Cluster& cluster, const Model& model) {
  const nlohmann::json cluster_json = to_json(cluster);
  FUZZ_REQUIRE(to_json(cluster_from_json(cluster_json, "round trip")) == cluster_json,
               "cluster JSON round trip differs: " + cluster_json.dump());
  const nlohmann::json model_json = to_json(model);
  FUZZ_REQUIRE(to_json(model_from_json(model_json, "round trip")) == model_json,
               "model JSON round trip differs: " + model_json.dump());
}

/// Every query a planner or the simulator makes, on a few shapes.
void query_cost_model(const CostModel& cost) {
  const Tokens capacity = cost.token_capacity_per_rank();  // InputError: the model does not fit
  FUZZ_REQUIRE(capacity >= 1, "capacity < 1 without an InputError");
  const int ranks = cost.cluster().ranks();
  const std::vector<Tokens> lengths = {1, 127, 128, 129, 4096, std::min<Tokens>(capacity, kMaxSequenceTokens)};
  for (Tokens length : lengths) {
    for (Pass pass : {Pass::forward, Pass::backward}) {
      require_time(cost.linear_time_s(length, pass), "linear_time_s");
      const AttentionBlock block = whole_document(length);
      for (int split : {1, 2, cost.model().kv_heads}) {
        require_time(cost.attention_time_s({&block, 1}, split, pass), "attention_time_s");
      }
      require_time(cost.attention_pair_floor_s(static_cast<double>(causal_pairs(block)), pass),
                   "attention_pair_floor_s");
      require_time(cost.micro_batch_overhead_s(pass), "micro_batch_overhead_s");
    }
    const Bytes bytes = saturating_multiply(length, cost.model().kv_bytes_per_token());
    require_time(cost.p2p_time_s(bytes, 0, ranks - 1), "p2p_time_s");
  }
  // Collectives over a node's GPUs and over at most 1024 ranks (bounded work per input).
  std::vector<int> group;
  for (int rank = 0; rank < ranks && rank < 1024; ++rank) group.push_back(rank);
  const std::vector<Bytes> bytes_per_rank(group.size(), 1 << 20);
  require_time(cost.all_to_all_time_s(group, bytes_per_rank), "all_to_all_time_s");
  require_time(cost.all_gather_time_s(group, bytes_per_rank), "all_gather_time_s");
  require_time(cost.gradient_sync_time_s(), "gradient_sync_time_s");
  FUZZ_REQUIRE(cost.model_state_bytes_per_rank() >= 0, "negative model states");
  FUZZ_REQUIRE(cost.activation_bytes_per_token() >= 1, "activation bytes per token < 1");
  // make_cost_model(spec()) gives back an equal cost model.
  const auto again = make_cost_model(cost.spec(), cost.cluster(), cost.model());
  FUZZ_REQUIRE(again->spec() == cost.spec(), "cost model spec round trip differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(data, data + size);
  } catch (const nlohmann::json::exception&) {
    return 0;  // not JSON (or a number beyond a double's range): a clean rejection
  }
  return ballast::fuzz::run_one_input([&] {
    if (!json.is_object()) {
      (void)cluster_from_json(json, "fuzz");  // must throw InputError
      FUZZ_REQUIRE(false, "a non-object was accepted as a cluster");
    }
    const bool has_parts = json.contains("cluster") || json.contains("model");
    Cluster cluster = cluster_preset("h100");
    cluster.nodes = 2;
    Model model = model_preset("llama-7b");
    if (has_parts) {
      if (json.contains("cluster")) cluster = cluster_from_json(json["cluster"], "fuzz: cluster");
      if (json.contains("model")) model = model_from_json(json["model"], "fuzz: model");
    } else {
      // A bare object: one of the two at most can accept it; try both.
      bool accepted = false;
      try {
        cluster = cluster_from_json(json, "fuzz");
        accepted = true;
      } catch (const InputError&) {
      }
      try {
        model = model_from_json(json, "fuzz");
        accepted = true;
      } catch (const InputError&) {
      }
      if (!accepted) return;
    }
    validate_cluster(cluster, "fuzz: cluster");
    validate_model(model, "fuzz: model");
    check_round_trip(cluster, model);
    const nlohmann::json spec =
        json.contains("cost_model") ? json["cost_model"] : load_cost_model_spec("analytical");
    const auto cost = make_cost_model(spec, cluster, model);
    query_cost_model(*cost);
  });
}
