// Cluster and Model: presets, derived quantities, JSON round trips, malformed input.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "cost/input_errors.hpp"
#include "ballast/model.hpp"

namespace ballast {
namespace {

using testing::expect_input_error;
using testing::input_error_message;


std::string write_temp_json(const std::string& name, const nlohmann::json& json) {
  const std::string path = ::testing::TempDir() + "ballast_test_cost_" + name + ".json";
  std::ofstream(path) << json.dump(1);
  return path;
}

TEST(ClusterPresets, NamesInOrderAndAllValid) {
  const std::vector<std::string> expected = {"a100-ib400", "a800-roce", "h100", "h200", "h800"};
  EXPECT_EQ(cluster_preset_names(), expected);
  for (const std::string& name : cluster_preset_names()) {
    const Cluster cluster = cluster_preset(name);
    EXPECT_EQ(cluster.name, name);
    EXPECT_NO_THROW(validate_cluster(cluster, name));
    EXPECT_FALSE(cluster.provenance.empty());
    EXPECT_EQ(cluster.ranks(), 64);
  }
}

TEST(ClusterPresets, HardwareConstants) {
  const Cluster a100 = cluster_preset("a100-ib400");
  EXPECT_EQ(a100.nics_per_node, 1);
  EXPECT_EQ(a100.gpus_per_nic(), 8);
  EXPECT_DOUBLE_EQ(a100.memory_usable_fraction * a100.gpu_memory_bytes, 30.0 * kGiB);
  const Cluster a800 = cluster_preset("a800-roce");
  EXPECT_EQ(a800.gpus_per_nic(), 2);
  EXPECT_DOUBLE_EQ(a800.nic_bw_bytes_per_s, 24e9);
  const Cluster h100 = cluster_preset("h100");
  EXPECT_EQ(h100.gpus_per_nic(), 1);
  // Fallback only: FA3's causal forward at 16K (SYSTEMS.md 5); the curves price attention.
  EXPECT_DOUBLE_EQ(h100.attention_efficiency, 616.0 / 989.0);
  ASSERT_EQ(h100.attention_forward_curve.size(), 6u);
  EXPECT_EQ(h100.attention_forward_curve.front().tokens, 512);
  EXPECT_DOUBLE_EQ(h100.attention_forward_curve.front().efficiency, 290.0 / 989.0);
  EXPECT_DOUBLE_EQ(h100.attention_forward_curve.back().efficiency, 616.0 / 989.0);
  EXPECT_DOUBLE_EQ(a100.attention_forward_curve.back().efficiency, 200.0 / 312.0);
  EXPECT_EQ(a800.attention_backward_curve, a100.attention_backward_curve);
  const Cluster h200 = cluster_preset("h200");
  EXPECT_DOUBLE_EQ(h200.intra_node_bus_bw_bytes_per_s, 367e9);
  EXPECT_EQ(h200.gpu_memory_bytes, static_cast<Bytes>(141 * kGiB));
  EXPECT_EQ(h200.attention_forward_curve, h100.attention_forward_curve);
  // Zeppelin's cluster B: H100's compute, NVLink at 400 of 900 GB/s, 8 NICs of 400 Gb/s.
  const Cluster h800 = cluster_preset("h800");
  EXPECT_DOUBLE_EQ(h800.peak_flops_per_s, h100.peak_flops_per_s);
  EXPECT_EQ(h800.attention_forward_curve, h100.attention_forward_curve);
  EXPECT_EQ(h800.gpu_memory_bytes, static_cast<Bytes>(80 * kGiB));
  EXPECT_DOUBLE_EQ(h800.intra_node_bus_bw_bytes_per_s, 370e9 * 400.0 / 900.0);
  EXPECT_LT(h800.intra_node_p2p_bw_bytes_per_s, h100.intra_node_p2p_bw_bytes_per_s / 2);
  EXPECT_TRUE(h800.intra_node_collectives.empty());
  EXPECT_EQ(h800.gpus_per_nic(), 1);
  EXPECT_DOUBLE_EQ(h800.nic_bw_bytes_per_s, 47e9);
  EXPECT_NE(h800.provenance.find("estimate"), std::string::npos);
}

TEST(ClusterTopology, NodeAndNicMapping) {
  const Cluster a800 = cluster_preset("a800-roce");
  EXPECT_EQ(a800.node_of(9), 1);
  EXPECT_EQ(a800.nic_of(0), 0);
  EXPECT_EQ(a800.nic_of(1), 0);
  EXPECT_EQ(a800.nic_of(2), 1);
  EXPECT_EQ(a800.nic_of(9), 4);
  EXPECT_TRUE(a800.same_node(8, 15));
  EXPECT_FALSE(a800.same_node(7, 8));
}

TEST(ClusterJson, RoundTripEveryPreset) {
  for (const std::string& name : cluster_preset_names()) {
    const Cluster cluster = cluster_preset(name);
    const nlohmann::json json = to_json(cluster);
    EXPECT_EQ(to_json(cluster_from_json(json, "test")), json) << name;
  }
}

TEST(ClusterJson, ProvenanceIsOptional) {
  nlohmann::json json = to_json(cluster_preset("h100"));
  json.erase("provenance");
  EXPECT_EQ(cluster_from_json(json, "test").provenance, "");
}

TEST(ClusterJson, AttentionTilesPackedRoundTripsAndPerBlockIsNotWritten) {
  Cluster cluster = cluster_preset("h100");
  EXPECT_FALSE(cluster.attention_tiles_packed);
  EXPECT_FALSE(to_json(cluster).contains("attention_tiles"));  // per-block plans keep their bytes
  cluster.attention_tiles_packed = true;
  const nlohmann::json json = to_json(cluster);
  EXPECT_EQ(json.at("attention_tiles"), "packed");
  EXPECT_TRUE(cluster_from_json(json, "test").attention_tiles_packed);
  EXPECT_EQ(to_json(cluster_from_json(json, "test")), json);
  nlohmann::json per_block = json;
  per_block["attention_tiles"] = "per_block";  // the default, also accepted when written
  EXPECT_FALSE(cluster_from_json(per_block, "test").attention_tiles_packed);
}

TEST(ClusterJson, AttentionTilesBadValueNamesFileAndAllowedValues) {
  nlohmann::json json = to_json(cluster_preset("h100"));
  json["attention_tiles"] = "pakced";
  expect_input_error([&] { cluster_from_json(json, "my.json"); },
                     {"my.json", "attention_tiles", "\"pakced\"", "\"per_block\"", "\"packed\""});
  json["attention_tiles"] = true;
  expect_input_error([&] { cluster_from_json(json, "my.json"); }, {"my.json", "attention_tiles"});
}

TEST(ClusterJson, MissingFieldNamesSourceAndField) {
  nlohmann::json json = to_json(cluster_preset("h100"));
  json.erase("nic_bw_bytes_per_s");
  expect_input_error([&] { cluster_from_json(json, "my.json"); }, {"my.json", "nic_bw_bytes_per_s"});
}

TEST(ClusterJson, WrongTypeNamesField) {
  nlohmann::json json = to_json(cluster_preset("h100"));
  json["nodes"] = "eight";
  expect_input_error([&] { cluster_from_json(json, "my.json"); }, {"my.json", "nodes"});
  expect_input_error([&] { cluster_from_json(nlohmann::json::array(), "list.json"); }, {"list.json"});
}


TEST(ClusterJson, UnknownKeyIsAnErrorWithASuggestion) {
  // The case: a misspelt optional key used to leave the default NIC count in place.
  nlohmann::json json = to_json(cluster_preset("h100"));
  json["nics_per_nodes"] = 4;
  EXPECT_EQ(input_error_message([&] { cluster_from_json(json, "cluster.json"); }),
            "cluster.json: unknown key \"nics_per_nodes\" (did you mean 'nics_per_node'?)");
  // A misspelt required key: the suggestion, not "missing field".
  json = to_json(cluster_preset("h100"));
  json["gpus_per_nod"] = json["gpus_per_node"];
  json.erase("gpus_per_node");
  EXPECT_EQ(input_error_message([&] { cluster_from_json(json, "cluster.json"); }),
            "cluster.json: unknown key \"gpus_per_nod\" (did you mean 'gpus_per_node'?)");
  // Through load_cluster, the path names the file.
  json = to_json(cluster_preset("h100"));
  json["provenence"] = "typo";
  const std::string path = write_temp_json("unknown_cluster_key", json);
  expect_input_error([&] { load_cluster(path); }, {path, "\"provenence\"", "'provenance'"});
  std::filesystem::remove(path);
}

TEST(ClusterJson, NicsMustDivideGpus) {
  nlohmann::json json = to_json(cluster_preset("a800-roce"));
  json["nics_per_node"] = 3;
  expect_input_error([&] { cluster_from_json(json, "my.json"); }, {"my.json", "nics_per_node"});
}

TEST(ClusterValidation, EveryImpossibleField) {
  using Mutation = void (*)(Cluster&);
  const std::vector<std::pair<std::string, Mutation>> cases = {
      {"nodes", [](Cluster& c) { c.nodes = 0; }},
      {"gpus_per_node", [](Cluster& c) { c.gpus_per_node = 0; }},
      {"nics_per_node", [](Cluster& c) { c.nics_per_node = 0; }},
      {"gpu_memory_bytes", [](Cluster& c) { c.gpu_memory_bytes = 0; }},
      {"peak_flops_per_s", [](Cluster& c) { c.peak_flops_per_s = -1; }},
      {"matmul_efficiency", [](Cluster& c) { c.matmul_efficiency = 1.5; }},
      {"attention_efficiency", [](Cluster& c) { c.attention_efficiency = 0; }},
      {"attention_tile_tokens", [](Cluster& c) { c.attention_tile_tokens = 0; }},
      {"memory_usable_fraction", [](Cluster& c) { c.memory_usable_fraction = 0; }},
      {"intra_node_bus_bw_bytes_per_s", [](Cluster& c) { c.intra_node_bus_bw_bytes_per_s = 0; }},
      {"intra_node_p2p_bw_bytes_per_s", [](Cluster& c) { c.intra_node_p2p_bw_bytes_per_s = 0; }},
      {"intra_node_latency_s", [](Cluster& c) { c.intra_node_latency_s = -1e-6; }},
      {"nic_bw_bytes_per_s", [](Cluster& c) { c.nic_bw_bytes_per_s = 0; }},
      {"inter_node_latency_s", [](Cluster& c) { c.inter_node_latency_s = -1e-6; }},
      {"nodes", [](Cluster& c) { c.nodes = 10000; }},  // 80,000 ranks > 65,536
      {"name", [](Cluster& c) { c.name.clear(); }},
  };
  for (const auto& [field, mutate] : cases) {
    Cluster cluster = cluster_preset("h100");
    mutate(cluster);
    expect_input_error([&] { validate_cluster(cluster, "src"); }, {"src", field});
  }
}

TEST(LoadCluster, PresetFileAndNodesOverride) {
  EXPECT_EQ(load_cluster("h100").nodes, 8);
  const Cluster two = load_cluster("h100", 2);
  EXPECT_EQ(two.nodes, 2);
  EXPECT_EQ(two.ranks(), 16);
  expect_input_error([] { load_cluster("h100", 0); }, {"nodes", ">= 1"});

  nlohmann::json json = to_json(cluster_preset("a800-roce"));
  json["name"] = "my-cluster";
  const std::string path = write_temp_json("cluster", json);
  const Cluster from_file = load_cluster(path, 3);
  EXPECT_EQ(from_file.name, "my-cluster");
  EXPECT_EQ(from_file.nodes, 3);
  std::filesystem::remove(path);
}

TEST(LoadCluster, UnknownListsPresets) {
  expect_input_error([] { load_cluster("dgx-z9"); },
                     {"dgx-z9", "a100-ib400", "a800-roce", "h100", "h200"});
  expect_input_error([] { cluster_preset("dgx-z9"); }, {"dgx-z9", "a100-ib400", "h200"});
}

TEST(LoadCluster, BundledExampleFileLoads) {
  const Cluster cluster =
      load_cluster(std::string(BALLAST_SOURCE_DIR) + "/data/presets/example-cluster.json");
  EXPECT_EQ(cluster.name, "example-cluster");
}

TEST(ModelPresets, NamesInOrderAndAllValid) {
  const std::vector<std::string> expected = {
      "gpt-7b",   "gpt-13b",   "gpt-30b",   "llama-3b",  "openllama-3b",
      "llama-7b", "llama3-8b", "llama-13b", "llama-30b", "moe-8x550m", "mixtral-8x7b"};
  EXPECT_EQ(model_preset_names(), expected);
  for (const std::string& name : model_preset_names()) {
    const Model model = model_preset(name);
    EXPECT_EQ(model.name, name);
    EXPECT_NO_THROW(validate_model(model, name));
    EXPECT_FALSE(model.provenance.empty());
  }
}

TEST(ModelPresets, FlexSPTableValues) {
  const Model gpt7 = model_preset("gpt-7b");
  EXPECT_DOUBLE_EQ(gpt7.activation_bytes_per_token, 4.48 * kMiB);
  EXPECT_DOUBLE_EQ(gpt7.parameters, 7.117 * kGiB);
  EXPECT_FALSE(gpt7.gated_mlp);
  EXPECT_EQ(gpt7.ffn_hidden, 4 * 4096);
  EXPECT_EQ(gpt7.head_dim(), 64);
  EXPECT_DOUBLE_EQ(model_preset("gpt-30b").parameters, 31.525 * kGiB);
}

TEST(ModelPresets, LlamaShapesAndEstimates) {
  const Model llama7 = model_preset("llama-7b");
  // Llama-2-7B has 6,738,415,616 parameters (Hugging Face config, untied embeddings).
  EXPECT_DOUBLE_EQ(llama7.parameters, 6738415616.0);
  // 34 * h * L bytes (Korthikanti et al. 2022): 4.25 MiB, close to FlexSP's 4.48 MB.
  EXPECT_DOUBLE_EQ(llama7.activation_bytes_per_token, 34.0 * 4096 * 32);
  const Model llama8 = model_preset("llama3-8b");
  EXPECT_EQ(llama8.kv_dim(), 1024);
  // Llama-3-8B: 8,030,261,248 parameters.
  EXPECT_DOUBLE_EQ(llama8.parameters, 8030261248.0);
  EXPECT_EQ(model_preset("llama-30b").head_dim(), 128);
  // OpenLLaMA-3B (Zeppelin's 3B): MHA, 100 head dims; Hugging Face lists 3.43 B parameters.
  const Model open3 = model_preset("openllama-3b");
  EXPECT_EQ(open3.kv_heads, open3.heads);
  EXPECT_EQ(open3.head_dim(), 100);
  EXPECT_NEAR(open3.parameters, 3.43e9, 0.01e9);
}

TEST(ModelRecompute, StoredBytesPerMode) {
  Model model = model_preset("llama-7b");
  const double selective = 34.0 * 4096 * 32;
  EXPECT_EQ(model.recompute, Recompute::selective);
  EXPECT_DOUBLE_EQ(model.stored_activation_bytes_per_token(), selective);
  EXPECT_EQ(model.forward_passes(), 1);
  model.recompute = Recompute::none;  // fused attention stores no scores: as selective
  EXPECT_DOUBLE_EQ(model.stored_activation_bytes_per_token(), selective);
  EXPECT_EQ(model.forward_passes(), 1);
  model.recompute = Recompute::full;  // every layer's input + one layer being recomputed
  EXPECT_DOUBLE_EQ(model.stored_activation_bytes_per_token(), 4096.0 * 2 * 32 + selective / 32);
  EXPECT_EQ(model.forward_passes(), 2);
  EXPECT_DOUBLE_EQ(pass_count(model, Pass::forward), 2.0);
  EXPECT_DOUBLE_EQ(pass_count(model, Pass::backward), 1.0);
}

TEST(ModelRecompute, JsonWritesOnlyTheNonDefaultAndRejectsUnknownModes) {
  Model model = model_preset("llama-7b");
  EXPECT_FALSE(to_json(model).contains("recompute"));  // plans from before read the same
  model.recompute = Recompute::full;
  const nlohmann::json json = to_json(model);
  EXPECT_EQ(json.at("recompute"), "full");
  EXPECT_EQ(model_from_json(json, "m.json").recompute, Recompute::full);
  nlohmann::json bad = json;
  bad["recompute"] = "partial";
  expect_input_error([&] { model_from_json(bad, "m.json"); },
                     {"m.json", "recompute", "'partial'", "selective", "full", "none"});
  expect_input_error([&] { parse_recompute("Full", "--recompute"); }, {"--recompute", "'Full'"});
}

TEST(ModelRecompute, CapacityGrowsAndProfiledCoefficientsRefuseFull) {
  Model model = model_preset("llama-7b");
  const Cluster cluster = load_cluster("h100", 1);
  const auto selective = make_cost_model(load_cost_model_spec("analytical"), cluster, model);
  model.recompute = Recompute::full;
  const auto full = make_cost_model(load_cost_model_spec("analytical"), cluster, model);
  EXPECT_GT(full->token_capacity_per_rank(), 10 * selective->token_capacity_per_rank());
  Model gpt = model_preset("gpt-7b");
  gpt.recompute = Recompute::full;
  expect_input_error(
      [&] {
        make_cost_model(load_cost_model_spec("flexsp-a100-192k"), load_cluster("a100-ib400", 1),
                        gpt);
      },
      {"flexsp-a100-192k", "full recomputation", "--recompute selective", "--cost-model"});
  gpt.recompute = Recompute::none;  // the same as selective: accepted
  EXPECT_NO_THROW(make_cost_model(load_cost_model_spec("flexsp-a100-192k"),
                                  load_cluster("a100-ib400", 1), gpt));
}

TEST(ModelDerived, FlopsAndBytesPerToken) {
  const Model llama8 = model_preset("llama3-8b");
  const double h = 4096, kv = 1024, ffn = 14336, layers = 32, vocab = 128256;
  const double qkv = h * h + 2 * h * kv;
  const double per_layer = qkv + h * h + 3 * h * ffn;
  const double expected = 2 * per_layer * layers + 2 * h * vocab;
  EXPECT_DOUBLE_EQ(llama8.linear_flops_per_token(), expected);
  EXPECT_DOUBLE_EQ(llama8.qkv_flops_fraction(), 2 * qkv * layers / expected);
  EXPECT_EQ(llama8.kv_bytes_per_token(), 2 * 1024 * 2);
  EXPECT_EQ(llama8.qkv_bytes_per_token(), (4096 + 2 * 1024) * 2);
  EXPECT_EQ(llama8.hidden_bytes_per_token(), 4096 * 2);

  const Model gpt7 = model_preset("gpt-7b");  // GELU MLP: two matrices
  const double gpt_layer = 4 * 4096.0 * 4096 + 2 * 4096.0 * 16384;
  EXPECT_DOUBLE_EQ(gpt7.linear_flops_per_token(), 2 * gpt_layer * 32 + 2 * 4096.0 * 50257);
}

TEST(ModelParameters, TiedEmbeddingsCountOnce) {
  const Model model = model_preset("llama-3b");
  EXPECT_DOUBLE_EQ(estimate_parameters(model, false) - estimate_parameters(model, true),
                   3072.0 * 128256);
}

TEST(ModelJson, RoundTripEveryPreset) {
  for (const std::string& name : model_preset_names()) {
    const nlohmann::json json = to_json(model_preset(name));
    EXPECT_EQ(to_json(model_from_json(json, "test")), json) << name;
  }
}

TEST(ModelJson, MalformedInput) {
  nlohmann::json json = to_json(model_preset("llama-7b"));
  json.erase("ffn_hidden");
  expect_input_error([&] { model_from_json(json, "m.json"); }, {"m.json", "ffn_hidden"});
  json = to_json(model_preset("llama-7b"));
  json["gated_mlp"] = 3.5;
  expect_input_error([&] { model_from_json(json, "m.json"); }, {"m.json", "gated_mlp"});
}

TEST(ModelJson, UnknownKeyIsAnErrorWithASuggestion) {
  nlohmann::json json = to_json(model_preset("llama-7b"));
  json["kv_head"] = 8;
  EXPECT_EQ(input_error_message([&] { model_from_json(json, "model.json"); }),
            "model.json: unknown key \"kv_head\" (did you mean 'kv_heads'?)");
  json = to_json(model_preset("llama-7b"));
  json["tied_embeddings"] = true;  // nothing close: the known keys
  const std::string message = input_error_message([&] { model_from_json(json, "model.json"); });
  EXPECT_EQ(message.rfind("model.json: unknown key \"tied_embeddings\"; the known keys are name, ",
                          0),
            0u)
      << message;
}

TEST(ModelValidation, ImpossibleShapes) {
  using Mutation = void (*)(Model&);
  const std::vector<std::pair<std::string, Mutation>> cases = {
      {"layers", [](Model& m) { m.layers = 0; }},
      {"hidden", [](Model& m) { m.hidden = -4096; }},
      {"heads", [](Model& m) { m.heads = 0; }},
      {"heads", [](Model& m) { m.heads = 3; }},  // does not divide 4096
      {"kv_heads", [](Model& m) { m.kv_heads = 0; }},
      {"kv_heads", [](Model& m) { m.kv_heads = 5; }},  // does not divide 32
      {"ffn_hidden", [](Model& m) { m.ffn_hidden = 0; }},
      {"vocab", [](Model& m) { m.vocab = 0; }},
      {"bytes_per_element", [](Model& m) { m.bytes_per_element = 0; }},
      {"activation_bytes_per_token", [](Model& m) { m.activation_bytes_per_token = 0; }},
      {"parameters", [](Model& m) { m.parameters = 0; }},
      {"name", [](Model& m) { m.name.clear(); }},
  };
  for (const auto& [field, mutate] : cases) {
    Model model = model_preset("llama-7b");
    mutate(model);
    expect_input_error([&] { validate_model(model, "src"); }, {"src", field});
  }
}

TEST(LoadModel, PresetFileAndUnknown) {
  EXPECT_EQ(load_model("gpt-13b").layers, 40);
  nlohmann::json json = to_json(model_preset("llama-7b"));
  json["name"] = "my-model";
  const std::string path = write_temp_json("model", json);
  EXPECT_EQ(load_model(path).name, "my-model");
  std::filesystem::remove(path);
  expect_input_error([] { load_model("gpt-5"); }, {"gpt-5", "gpt-7b", "llama-30b"});
  expect_input_error([] { model_preset("gpt-5"); }, {"gpt-5", "llama3-8b"});
  const Model example =
      load_model(std::string(BALLAST_SOURCE_DIR) + "/data/presets/example-model.json");
  EXPECT_EQ(example.name, "example-model");
}

}  // namespace
}  // namespace ballast
