// Exactness under MPI: for every registered strategy (planner_names()) and a few parameter
// variants, the loss and every parameter gradient of one step executed over the job's ranks
// equal the single-process reference of the same batch (fp32, norm-wise relative error per
// tensor under 1e-5). Batches hold one-token documents, odd lengths (no padding to 2g) and
// a document longer than one rank's memory budget. Run by ctest under mpirun with 2, 4 and
// 8 ranks; exit 0 only when every spec matches on every rank's view and every registered
// strategy was checked (one that can hold neither batch fails, it is not skipped). Built a
// second time with BALLAST_EXACTNESS_TP = 2 (mpi_exactness_tp2): the plans are for TP
// groups of 2 ranks (tensor_parallel_units), each member running its half of the heads and
// of the FFN, and the sequence-parallel collectives between them.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/emulated_cluster.hpp"
#include "ballast/error.hpp"
#include "ballast/runtime/model.hpp"
#include "ballast/runtime/emulation.hpp"
#include "ballast/runtime/step.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/tensor_parallel.hpp"
#include "ballast/workload.hpp"

using namespace ballast;
using namespace ballast::runtime;

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int failures = 0;
  try {
    ModelConfig config;
    config.vocab = 64;
    config.hidden = 64;
    config.layers = 2;
    config.heads = 8;
    config.kv_heads = 4;  // GQA: Ulysses groups of up to 4 split the KV heads
    config.ffn_hidden = 48;
    const Parameters parameters = init_parameters(config, 7);
    // The cluster and model `ballast run` plans with, memory for ~160 tokens per rank;
    // under TP, its ranks grouped in pairs (4 GPUs per node: nodes of 2 TP groups).
#ifdef BALLAST_EXACTNESS_TP
    constexpr int kTensorParallel = BALLAST_EXACTNESS_TP;
    constexpr int kGpusPerNode = 4;
#else
    constexpr int kTensorParallel = 1;
    constexpr int kGpusPerNode = 2;
#endif
    const Model model = planning_model(config);
    const auto cost = make_cost_model(
        load_cost_model_spec("analytical"),
        tensor_parallel_units(emulated_cluster(model, ranks, kGpusPerNode, 160), model, kTensorParallel),
        model);
    const int plan_ranks = cost->cluster().ranks();
    const Tokens capacity = cost->token_capacity_per_rank();
    // One-token documents, odd lengths, and (batch 0 only) a document longer than one
    // rank's memory budget: a strategy runs batch 0 when it can hold that document (see
    // longest_sequence_tokens), else batch 1 (packed-dp never splits).
    std::uint64_t state = 11;
    std::vector<std::vector<Tokens>> batches_lengths(2);
    batches_lengths[0] = {1, 3, 17, 1, 64, 129, capacity + 7, 5, 1, 33, 77, 250};
    batches_lengths[1] = {1, 1, 2, 9, 31, 64, 100, 127, 3, 1};
    for (auto& lengths : batches_lengths) {
      while (lengths.size() < 24) lengths.push_back(1 + static_cast<Tokens>(uniform_below(state, 120)));
    }
    const auto longest_of = [](const std::vector<Tokens>& lengths) {
      return *std::max_element(lengths.begin(), lengths.end());
    };
    // Every registered strategy with its default options, on the first batch it can hold
    // (-1: neither, a failure below).
    std::vector<std::pair<std::string, int>> specs;
    for (const std::string& name : planner_names()) {
      const Tokens longest = find_planner(name).longest_sequence_tokens(*cost, {});
      int which = -1;
      for (std::size_t b = 0; b < batches_lengths.size() && which < 0; ++b) {
        if (longest_of(batches_lengths[b]) <= longest) which = static_cast<int>(b);
      }
      specs.push_back({name, which});
    }
    // Variants: batch-adaptive on the short batch too, zeppelin's ablations, and rings over
    // two emulated nodes (2 GPUs each) with every inter-node hop routed.
    specs.push_back({"batch-adaptive", 1});
    specs.push_back({"zeppelin:remap=on:partition=even", 0});
    specs.push_back({"zeppelin:remap=on", 0});
    if (plan_ranks >= 4) specs.push_back({"zeppelin:partition=even:degree=4:routing=on", 0});
    std::set<std::string> checked;  // registered strategies that ran (and passed or failed)
    for (const auto& [text, which] : specs) {
      if (which < 0) {
        failures += 1;
        if (rank == 0) {
          std::printf("%-34s cannot hold either test batch (longest %lld tokens)  FAILED\n",
                      text.c_str(), static_cast<long long>(
                                        find_planner(text).longest_sequence_tokens(*cost, {})));
        }
        continue;
      }
      const std::vector<Tokens>& lengths = batches_lengths[static_cast<std::size_t>(which)];
      const Batch batch = make_batch(lengths, which);
      std::vector<std::vector<std::int32_t>> documents;
      std::uint64_t token_state = 100 + static_cast<std::uint64_t>(which);
      for (Tokens length : lengths) {
        std::vector<std::int32_t> document;
        for (Tokens t = 0; t < length; ++t) {
          document.push_back(static_cast<std::int32_t>(uniform_below(token_state, config.vocab)));
        }
        documents.push_back(document);
      }
      LocalAttentionEngine reference_engine;
      const StepOutput reference =
          forward_backward(config, parameters, pack_documents(documents), reference_engine);
      const StrategySpec spec = parse_strategy_spec(text);
      checked.insert(spec.planner->name());
      const Plan plan = spec.planner->plan(batch, *cost, spec.options, SimulatorEvaluator(*cost));
      require_valid(plan, *cost, text);
      const StepResult step = run_step(plan, config, parameters, documents, MPI_COMM_WORLD);
      const StepDifference difference = compare_with_reference(parameters, step.loss_sum, step.gradients, reference);
      std::string schemes;
      for (const MicroBatch& micro_batch : plan.micro_batches) {
        for (const AttentionGroup& group : micro_batch.groups) {
          const std::string name = to_string(group.scheme);
          if (schemes.find(name) == std::string::npos) schemes += (schemes.empty() ? "" : "+") + name;
        }
        if (!micro_batch.linear_layout.empty() && schemes.find("remap") == std::string::npos) schemes += "+remap";
        for (const AttentionGroup& group : micro_batch.groups) {
          if (group.routing_proxies > 1 && !plan.cluster.same_node(group.ranks.front(), group.ranks.back()) &&
              schemes.find("routed") == std::string::npos) {
            schemes += "+routed";
          }
        }
      }
      const bool ok = difference.max_relative_error < 1e-5 && step.targets == reference.target_count;
      failures += ok ? 0 : 1;
      if (rank == 0) {
        std::printf("%-34s %-28s %zu micro-batches, loss %.6f, max relative error %.2e (%s)%s\n",
                    text.c_str(), schemes.c_str(), plan.micro_batches.size(), step.loss_sum / step.targets,
                    difference.max_relative_error, difference.worst.c_str(), ok ? "" : "  FAILED");
      }
    }
    // The check that every registered strategy is exercised under MPI.
    for (const std::string& name : planner_names()) {
      if (checked.count(name) == 0) {
        failures += 1;
        if (rank == 0) std::printf("%-34s registered but not run under MPI  FAILED\n", name.c_str());
      }
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
