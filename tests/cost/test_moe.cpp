// Mixture-of-experts models: Mixtral's parameters against the published figures, linear
// FLOPs from the active experts, memory and gradient sync under expert parallelism, the
// JSON "moe" object, the expert-parallel all-to-all's price and the seeded expert loads.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ballast/cost_model.hpp"
#include "input_errors.hpp"

namespace ballast {
namespace {

using testing::expect_input_error;

/// Mixtral with its experts removed: the same attention, embeddings and one MLP per layer.
Model dense_twin(const Model& moe) {
  Model dense = moe;
  dense.experts = 0;
  dense.experts_per_token = 0;
  dense.expert_parallel = 1;
  dense.routing_skew_cv = 0;
  return dense;
}

TEST(MoeModel, MixtralParametersMatchThePublishedFigures) {
  // Mistral AI, "Mixtral of experts" (Dec 2023): 46.7B total, 12.9B active per token.
  const Model mixtral = model_preset("mixtral-8x7b");
  EXPECT_TRUE(mixtral.is_moe());
  EXPECT_NEAR(mixtral.parameters / 1e9, 46.7, 0.05);
  EXPECT_NEAR(mixtral.active_parameters(false) / 1e9, 12.9, 0.05);
  // 8 experts x 3 x 4096 x 14336 x 32 layers.
  EXPECT_DOUBLE_EQ(mixtral.routed_expert_parameters(), 8.0 * 3 * 4096 * 14336 * 32);
  const Model dense = dense_twin(mixtral);
  EXPECT_FALSE(dense.is_moe());
  EXPECT_EQ(dense.routed_expert_parameters(), 0.0);
  EXPECT_EQ(dense.expert_flops_per_token(), 0.0);
}

TEST(MoeModel, LinearFlopsCountTheActiveExperts) {
  const Model mixtral = model_preset("mixtral-8x7b");
  const Model dense = dense_twin(mixtral);
  const double expert_mlp_flops = 2.0 * 3 * 4096 * 14336 * 32;  // one expert, all layers
  const double router_flops = 2.0 * 4096 * 8 * 32;
  // Top-2: one more MLP than the dense twin, plus the router.
  EXPECT_NEAR(mixtral.linear_flops_per_token(),
              dense.linear_flops_per_token() + expert_mlp_flops + router_flops, 1.0);
  EXPECT_DOUBLE_EQ(mixtral.expert_flops_per_token(), 2 * expert_mlp_flops);
  // The linear layers are 2 FLOPs per active weight, less the input embedding (a lookup)
  // and the norms.
  const double embedding = 4096.0 * 32000;
  const double norms = 2.0 * 4096 * 32 + 4096;
  EXPECT_NEAR(mixtral.linear_flops_per_token(),
              2 * (mixtral.active_parameters(false) - embedding - norms), 1.0);
  // A shared expert adds one MLP per token and to the stored parameters.
  Model shared = mixtral;
  shared.shared_experts = 1;
  EXPECT_NEAR(shared.linear_flops_per_token() - mixtral.linear_flops_per_token(),
              expert_mlp_flops, 1.0);
  EXPECT_NEAR(estimate_parameters(shared, false) - estimate_parameters(mixtral, false),
              expert_mlp_flops / 2, 1.0);
}

TEST(MoeModel, MemoryAndGradientSyncUnderExpertParallelism) {
  const Model mixtral = model_preset("mixtral-8x7b");
  const AnalyticalCostModel cost(load_cluster("h800", 8), mixtral);
  // ZeRO-3 over 64 ranks: a rank holds 1/8 of the experts, sharded over the 8 ranks with
  // the same ones: the same bytes as all parameters over all ranks.
  EXPECT_EQ(cost.model_state_bytes_per_rank(),
            saturating_bytes(std::ceil(mixtral.parameters * kModelStateBytesPerParameter / 64)));
  // Gradients: the routed experts are reduced only among the ranks holding them.
  const double routed = mixtral.routed_expert_parameters();
  EXPECT_NEAR(mixtral.gradient_sync_parameters(), mixtral.parameters - routed + routed / 8, 1.0);
  Model more = mixtral;
  more.expert_parallel = 1;
  EXPECT_DOUBLE_EQ(more.gradient_sync_parameters(), mixtral.parameters);
  const AnalyticalCostModel replicated(load_cluster("h800", 8), more);
  EXPECT_LT(cost.gradient_sync_time_s(), replicated.gradient_sync_time_s() / 3);
  // A dense model's gradient sync is over all parameters, as before.
  const Model dense = dense_twin(mixtral);
  EXPECT_EQ(dense.gradient_sync_parameters(), dense.parameters);
}

TEST(MoeModel, JsonRoundTripAndErrors) {
  const Model mixtral = model_preset("mixtral-8x7b");
  const nlohmann::json json = to_json(mixtral);
  ASSERT_TRUE(json.contains("moe"));
  EXPECT_EQ(json["moe"]["experts"], 8);
  EXPECT_EQ(json["moe"]["experts_per_token"], 2);
  const Model back = model_from_json(json, "mixtral.json");
  EXPECT_EQ(to_json(back), json);
  EXPECT_EQ(back.expert_load_factor(3), mixtral.expert_load_factor(3));
  // Dense models write no "moe": their files and plans are as before.
  EXPECT_FALSE(to_json(model_preset("llama-7b")).contains("moe"));
  // Optional members take their defaults.
  nlohmann::json minimal = json;
  minimal["moe"] = {{"experts", 4}, {"experts_per_token", 1}};
  const Model parsed = model_from_json(minimal, "m.json");
  EXPECT_EQ(parsed.expert_parallel, 1);
  EXPECT_EQ(parsed.shared_experts, 0);
  EXPECT_EQ(parsed.routing_skew_cv, 0.0);
  nlohmann::json bad = json;
  bad["moe"]["expert_paralel"] = 2;
  expect_input_error([&] { model_from_json(bad, "m.json"); }, {"m.json", "expert_paralel", "expert_parallel"});
  bad = json;
  bad["moe"]["expert_parallel"] = 3;
  expect_input_error([&] { model_from_json(bad, "m.json"); }, {"m.json", "moe.expert_parallel", "divide experts"});
  bad = json;
  bad["moe"]["experts_per_token"] = 9;
  expect_input_error([&] { model_from_json(bad, "m.json"); }, {"moe.experts_per_token", "between 1 and experts"});
  bad = json;
  bad["moe"]["routing_skew_cv"] = -0.1;
  expect_input_error([&] { model_from_json(bad, "m.json"); }, {"moe.routing_skew_cv"});
  bad = json;
  bad["moe"] = 8;
  expect_input_error([&] { model_from_json(bad, "m.json"); }, {"m.json", "'moe'", "object"});
  // Expert parallelism must divide the ranks of the cluster.
  Model wide = mixtral;
  wide.expert_parallel = 8;
  Cluster three = load_cluster("h800", 1);
  three.gpus_per_node = 6;
  three.nics_per_node = 6;
  expect_input_error([&] { const AnalyticalCostModel built(three, wide); }, {"expert_parallel 8", "6 ranks"});
}

TEST(MoeCost, AllToAllOnTheExpertParallelGroup) {
  const Model moe = model_preset("moe-8x550m");
  const AnalyticalCostModel cost(load_cluster("h800", 2), moe);
  const Tokens tokens = 8192;
  // Every member holds tokens x top-2 hidden vectors; all_to_all_time_s on 8 ranks of a node.
  const std::vector<int> members = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<Bytes> held(8, tokens * 2 * moe.hidden_bytes_per_token());
  const Seconds one_s = cost.expert_parallel_all_to_all_time_s(tokens);
  EXPECT_NEAR(one_s, cost.all_to_all_time_s(members, held), 1e-12);
  // Dispatch and combine, forward and backward.
  EXPECT_NEAR(cost.expert_parallel_time_s(tokens), 4 * one_s, 1e-12);
  // Linear in the tokens past the latency; the latency is what 0 tokens would cost.
  EXPECT_NEAR(cost.expert_parallel_time_s(2 * tokens) - cost.expert_parallel_latency_s(),
              2 * (cost.expert_parallel_time_s(tokens) - cost.expert_parallel_latency_s()), 1e-12);
  EXPECT_EQ(cost.expert_parallel_all_to_all_time_s(0), 0.0);
  EXPECT_NEAR(cost.linear_collectives_time_s(tokens), cost.expert_parallel_time_s(tokens), 1e-15);
  // Full recomputation reruns the forward's two.
  Model recomputed = moe;
  recomputed.recompute = Recompute::full;
  const AnalyticalCostModel recomputed_cost(load_cluster("h800", 2), recomputed);
  EXPECT_NEAR(recomputed_cost.expert_parallel_time_s(tokens), 6 * one_s, 1e-12);
  // A group spanning nodes goes through the NICs: 4 GPUs per node, EP 8 over two nodes.
  Cluster narrow = load_cluster("h800", 2);
  narrow.gpus_per_node = 4;
  narrow.nics_per_node = 4;
  const AnalyticalCostModel spanning(narrow, moe);
  EXPECT_GT(spanning.expert_parallel_all_to_all_time_s(tokens), one_s);
  // No expert parallelism, or a dense model: no all-to-all.
  Model local = moe;
  local.expert_parallel = 1;
  EXPECT_EQ(AnalyticalCostModel(load_cluster("h800", 2), local).expert_parallel_time_s(tokens), 0.0);
  EXPECT_EQ(AnalyticalCostModel(load_cluster("h800", 2), dense_twin(moe)).linear_collectives_time_s(tokens),
            0.0);
}

TEST(MoeRouting, LoadFactorIsSeededAndDeterministic) {
  Model moe = model_preset("moe-8x550m");
  for (std::int64_t m = 0; m < 20; ++m) {
    const double factor = moe.expert_load_factor(m);
    EXPECT_GE(factor, 1.0);
    EXPECT_LE(factor, 8.0);  // at most all load on one of 8 ranks
    EXPECT_EQ(factor, moe.expert_load_factor(m));
  }
  EXPECT_NE(moe.expert_load_factor(0), moe.expert_load_factor(1));
  Model reseeded = moe;
  reseeded.routing_seed = 7;
  EXPECT_NE(reseeded.expert_load_factor(0), moe.expert_load_factor(0));
  // Balanced routing, one rank holding every expert, or a dense model: exactly 1.
  Model balanced = moe;
  balanced.routing_skew_cv = 0;
  EXPECT_EQ(balanced.expert_load_factor(5), 1.0);
  Model local = moe;
  local.expert_parallel = 1;
  EXPECT_EQ(local.expert_load_factor(5), 1.0);
  EXPECT_EQ(dense_twin(moe).expert_load_factor(5), 1.0);
  // The mean over micro-batches grows with the skew; at the presets' cv 0.2 the most
  // loaded of 8 experts is about 1.3x the mean (E[max of 8 normals] ~ 1.42 sigma).
  const auto mean_factor = [](Model model, double cv) {
    model.routing_skew_cv = cv;
    double sum = 0;
    for (std::int64_t m = 0; m < 50; ++m) sum += model.expert_load_factor(m);
    return sum / 50;
  };
  const double at_02 = mean_factor(moe, 0.2);
  EXPECT_GT(at_02, 1.2);
  EXPECT_LT(at_02, 1.4);
  EXPECT_LT(mean_factor(moe, 0.1), at_02);
  EXPECT_GT(mean_factor(moe, 0.5), at_02);
  // Two experts per rank average each other out: a smaller factor than one per rank.
  Model paired = moe;
  paired.expert_parallel = 4;
  EXPECT_LT(mean_factor(paired, 0.2), at_02);
}

TEST(MoeRouting, ImbalanceTimeIsTheExpertsShareOfTheExcess) {
  const Model moe = model_preset("moe-8x550m");
  const AnalyticalCostModel cost(load_cluster("h800", 1), moe);
  const Tokens tokens = 4096;
  for (Pass pass : {Pass::forward, Pass::backward}) {
    const double share = moe.expert_flops_per_token() / moe.linear_flops_per_token();
    EXPECT_NEAR(cost.expert_imbalance_time_s(tokens, pass, 2),
                cost.linear_time_s(tokens, pass) * share * (moe.expert_load_factor(2) - 1), 1e-15);
    EXPECT_GT(cost.expert_imbalance_time_s(tokens, pass, 2), 0.0);
  }
  EXPECT_EQ(cost.expert_imbalance_time_s(0, Pass::forward, 2), 0.0);
  const AnalyticalCostModel dense(load_cluster("h800", 1), dense_twin(moe));
  EXPECT_EQ(dense.expert_imbalance_time_s(tokens, Pass::forward, 2), 0.0);
}

TEST(MoePresets, ListedAndValid) {
  const auto names = model_preset_names();
  for (const char* name : {"moe-8x550m", "mixtral-8x7b"}) {
    ASSERT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    const Model model = model_preset(name);
    EXPECT_NO_THROW(validate_model(model, name));
    EXPECT_EQ(model.experts, 8);
    EXPECT_EQ(model.experts_per_token, 2);
    EXPECT_EQ(model.expert_parallel, 8);
    EXPECT_NE(model.provenance.find("estimate"), std::string::npos);
  }
  // Zeppelin's 8x550M: a 551M dense LLaMA-style model with 8 experts (inferred shape).
  const Model small = model_preset("moe-8x550m");
  EXPECT_NEAR(estimate_parameters(dense_twin(small), false) / 1e6, 551, 1);
  EXPECT_NE(small.provenance.find("inferred"), std::string::npos);
}

}  // namespace
}  // namespace ballast
