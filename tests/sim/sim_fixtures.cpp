// Hand-built clusters, models and plans for the simulator tests.
#include "sim/sim_fixtures.hpp"

#include <algorithm>

namespace ballast::testing {

Cluster fake_cluster(int nodes, int gpus_per_node, int nics_per_node) {
  Cluster cluster;
  cluster.name = "fake";
  cluster.gpu_name = "fake-gpu";
  cluster.nodes = nodes;
  cluster.gpus_per_node = gpus_per_node;
  cluster.gpu_memory_bytes = 1LL << 40;
  cluster.peak_flops_per_s = 1e15;
  cluster.matmul_efficiency = 0.5;
  cluster.attention_efficiency = 0.5;
  cluster.memory_usable_fraction = 0.9;
  cluster.intra_node_bus_bw_bytes_per_s = 1e11;
  cluster.intra_node_p2p_bw_bytes_per_s = 1e11;
  cluster.intra_node_latency_s = 1e-5;
  cluster.nics_per_node = nics_per_node;
  cluster.nic_bw_bytes_per_s = 2.5e10;
  cluster.inter_node_latency_s = 2e-5;
  cluster.provenance = "test fixture";
  return cluster;
}

Model fake_model() {
  Model model;
  model.name = "fake";
  model.layers = 1;
  model.hidden = 6;
  model.heads = 2;
  model.kv_heads = 2;
  model.ffn_hidden = 16;
  model.vocab = 0;
  model.gated_mlp = true;
  model.bytes_per_element = 2;
  model.activation_bytes_per_token = 1;
  model.parameters = 0;
  model.provenance = "test fixture";
  return model;
}

Plan empty_plan(const CostModel& cost, std::vector<Tokens> lengths) {
  Plan plan;
  plan.strategy = "hand";
  plan.cluster = cost.cluster();
  plan.model = cost.model();
  plan.cost_model = cost.spec();
  plan.sequence_lengths_tokens = std::move(lengths);
  return plan;
}

AttentionGroup make_group(Scheme scheme, std::vector<int> ranks,
                          std::vector<SequenceSpec> sequences) {
  AttentionGroup group;
  group.scheme = scheme;
  group.ranks = std::move(ranks);
  for (SequenceSpec& spec : sequences) {
    SequenceChunks sequence;
    sequence.sequence_id = spec.id;
    for (const Chunk& chunk : spec.chunks) {
      sequence.padded_length_tokens = std::max(sequence.padded_length_tokens, chunk.end_tokens);
    }
    sequence.chunks = std::move(spec.chunks);
    group.sequences.push_back(std::move(sequence));
  }
  return group;
}

AttentionGroup local_group(int rank, std::int64_t id, Tokens length) {
  return make_group(Scheme::local, {rank}, {{id, {{rank, 0, length}}}});
}

}  // namespace ballast::testing
