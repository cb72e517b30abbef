// Exactness under MPI: for every registered strategy (planner_names()) and a few parameter
// variants, the loss and every parameter gradient of one step executed over the job's ranks
// equal the single-process reference of the same batch (fp32, norm-wise relative error per
// tensor under 1e-5). Batches hold one-token documents, odd lengths (no padding to 2g) and
// a document longer than one rank's memory budget. Run by ctest under mpirun with 2, 4 and
// 8 ranks; exit 0 only when every spec matches on every rank's view and every registered
// strategy was checked (one that can hold neither batch fails, it is not skipped). Built a
// second time with BALLAST_EXACTNESS_TP = 2 (mpi_exactness_tp2): the plans are for TP
// groups of 2 ranks (tensor_parallel_units), each member running its half of the heads and
// of the FFN, and the sequence-parallel collectives between them. Hand-built plans add what
// no registered strategy plans yet: Ulysses beyond the KV heads (KV heads replicated, their
// dK/dV summed back: a group of all 8 ranks over 4 KV heads, of 4 TP groups over 2 KV heads
// per GPU, and groups of 2 and 3 over the one KV head of a multi-query model), rings,
// all-gathers and Ulysses groups of 3, 5 and 6 ranks, and USP groups (stages of 2 and 4, one
// KV head per TP GPU replicated on each stage's members). Built a third time with
// BALLAST_EXACTNESS_MOE = 2 (mpi_exactness_moe): the model's FFN is a mixture of 4 experts
// (top-2) and every plan runs with expert parallelism 2 (ranks 2i and 2i + 1 share the
// experts, each owning two, the routed rows all-to-all'd to them and back); each line also
// prints the reference's smallest gap between a token's 2nd and 3rd router logit, which
// must stay above kSmallestMargin so that fp32 reordering cannot flip a selection.
#include <mpi.h>

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
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

namespace {

/// "ring+ulysses+remap+routed": the schemes a plan uses, for the report line.
std::string schemes_of(const Plan& plan) {
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
  return schemes;
}

/// Random tokens for documents of `lengths`.
std::vector<std::vector<std::int32_t>> documents_of(const std::vector<Tokens>& lengths, int vocab,
                                                    std::uint64_t seed) {
  std::vector<std::vector<std::int32_t>> documents;
  for (Tokens length : lengths) {
    std::vector<std::int32_t> document;
    for (Tokens t = 0; t < length; ++t) {
      document.push_back(static_cast<std::int32_t>(uniform_below(seed, static_cast<std::uint64_t>(vocab))));
    }
    documents.push_back(document);
  }
  return documents;
}

/// Runs `plan` over MPI and against the single-process reference; prints one line on rank 0;
/// returns 1 on a mismatch, else 0.
#ifdef BALLAST_EXACTNESS_MOE
constexpr int kExpertParallel = BALLAST_EXACTNESS_MOE;
#else
constexpr int kExpertParallel = 1;
#endif
/// The smallest gap between a token's k-th and (k+1)-th router logit the reference may
/// show: the distributed run's logits differ from the reference's only by fp32 summation
/// order (~1e-7 relative on logits of ~0.2, so ~1e-8 absolute), a hundredfold below it.
constexpr double kSmallestMargin = 1e-6;

int check_plan(const std::string& label, const Plan& plan, const ModelConfig& config,
               const Parameters& parameters, const std::vector<std::vector<std::int32_t>>& documents,
               int rank) {
  LocalAttentionEngine reference_engine;
  const StepOutput reference = forward_backward(config, parameters, pack_documents(documents), reference_engine);
  StepOptions options;
  options.expert_parallel = kExpertParallel;
  const StepResult step = run_step(plan, config, parameters, documents, MPI_COMM_WORLD, options);
  const StepDifference difference = compare_with_reference(parameters, step.loss_sum, step.gradients, reference);
  const bool margin_ok = !config.moe() || reference.smallest_top_k_margin > kSmallestMargin;
  const bool ok = difference.max_relative_error < 1e-5 && step.targets == reference.target_count && margin_ok;
  if (rank == 0) {
    const std::string margin =
        config.moe() ? fmt::format(", top-k margin {:.1e}{}", reference.smallest_top_k_margin,
                                   margin_ok ? "" : " (near tie)")
                     : "";
    std::printf("%-34s %-28s %zu micro-batches, loss %.6f, max relative error %.2e (%s)%s%s\n", label.c_str(),
                schemes_of(plan).c_str(), plan.micro_batches.size(), step.loss_sum / step.targets,
                difference.max_relative_error, difference.worst.c_str(), margin.c_str(), ok ? "" : "  FAILED");
  }
  return ok ? 0 : 1;
}

/// A group of a hand-built plan: its scheme, ranks (ring order) and sequence ids.
struct HandGroup {
  Scheme scheme = Scheme::local;
  std::vector<int> ranks;
  std::vector<std::int64_t> sequences;
  int ulysses_degree = 1;  ///< usp: ranks per stage
};

/// A plan on `cost`'s cluster and model with one micro-batch per entry of `micro_batches`;
/// each sequence of a group is cut into contiguous, near-equal chunks, one per member in
/// rank-list order (empty chunks left out).
Plan hand_plan(const CostModel& cost, const std::vector<Tokens>& lengths,
               const std::vector<std::vector<HandGroup>>& micro_batches) {
  Plan plan;
  plan.strategy = "hand";
  plan.cluster = cost.cluster();
  plan.model = cost.model();
  plan.cost_model = cost.spec();
  plan.sequence_lengths_tokens = lengths;
  for (const auto& groups : micro_batches) {
    MicroBatch micro_batch;
    for (const HandGroup& hand : groups) {
      AttentionGroup group;
      group.scheme = hand.scheme;
      group.ranks = hand.ranks;
      group.ulysses_degree = hand.ulysses_degree;
      const auto size = static_cast<Tokens>(hand.ranks.size());
      for (std::int64_t id : hand.sequences) {
        const Tokens length = lengths[static_cast<std::size_t>(id)];
        SequenceChunks sequence{id, length, {}};
        for (Tokens i = 0; i < size; ++i) {
          const Tokens begin = length * i / size, end = length * (i + 1) / size;
          if (begin < end) sequence.chunks.push_back({hand.ranks[static_cast<std::size_t>(i)], begin, end});
        }
        group.sequences.push_back(sequence);
      }
      micro_batch.groups.push_back(group);
    }
    plan.micro_batches.push_back(micro_batch);
  }
  return plan;
}

/// Ranks [first, end).
std::vector<int> rank_range(int first, int end) {
  std::vector<int> ranks;
  for (int r = first; r < end; ++r) ranks.push_back(r);
  return ranks;
}

}  // namespace

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
    config.kv_heads = 4;  // GQA: Ulysses groups of up to 4 split the KV heads, of 8 replicate them
    config.ffn_hidden = 48;
#ifdef BALLAST_EXACTNESS_MOE
    // Mixtral's routing, tiny: 4 experts of width 16, top-2 (EP 2: two experts per member).
    config.experts = 4;
    config.experts_per_token = 2;
    config.expert_ffn_hidden = 16;
#endif
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
      const StrategySpec spec = parse_strategy_spec(text);
      checked.insert(spec.planner->name());
      const Plan plan = spec.planner->plan(batch, *cost, spec.options, SimulatorEvaluator(*cost));
      require_valid(plan, *cost, text);
      failures += check_plan(text, plan, config, parameters,
                             documents_of(lengths, config.vocab, 100 + static_cast<std::uint64_t>(which)), rank);
    }
    // Hand-built plans: Ulysses beyond the KV heads and groups of any size.
    const std::vector<Tokens> hand_lengths = {70, 1, 45, 23, 9, 64, 31, 5, 50, 17, 2, 38};
    const int tp = kTensorParallel;
    std::vector<std::pair<std::string, Plan>> hand;
    {
      // This model (8 heads, 4 KV heads; per TP GPU 8 / tp and 4 / tp): a Ulysses group of
      // every plan rank (8 ranks, or 4 TP groups of 2: each KV head on 2 members), then a
      // ring of 3 and an all-gather of the other ranks (5 at 8 ranks).
      std::vector<std::vector<HandGroup>> micro_batches;
      if (plan_ranks >= 2 && ulysses_degree_allowed(model, tp, plan_ranks)) {
        micro_batches.push_back({{Scheme::ulysses, rank_range(0, plan_ranks), {0, 1, 2, 3}}});
      } else {
        micro_batches.push_back({{Scheme::local, {0}, {0, 1, 2, 3}}});
      }
      std::vector<HandGroup> mixed = {{Scheme::ring, rank_range(0, std::min(3, plan_ranks)), {4, 5, 6}}};
      if (plan_ranks > 4) {
        mixed.push_back({Scheme::all_gather, rank_range(3, plan_ranks), {7, 8, 9, 10, 11}});
      } else if (plan_ranks == 4) {
        mixed.push_back({Scheme::local, {3}, {7, 8, 9, 10, 11}});
      } else {
        mixed.front().sequences.insert(mixed.front().sequences.end(), {7, 8, 9, 10, 11});
      }
      micro_batches.push_back(mixed);
      hand.emplace_back("hand:ulysses-replicated+any-size", hand_plan(*cost, hand_lengths, micro_batches));
    }
    for (auto& [label, plan] : hand) {
      require_valid(plan, *cost, label);
      failures += check_plan(label, plan, config, parameters, documents_of(hand_lengths, config.vocab, 300), rank);
    }
    if (plan_ranks >= 4) {
      // USP (stages of u consecutive ranks of the list, rings of their members m): this
      // model with u = 2 (and 4 at 8 ranks, TP 1), stages on one node or across nodes
      // ({4, 6} and {5, 7}), rings in both directions.
      std::vector<std::vector<HandGroup>> usp = {{{Scheme::usp, rank_range(0, 4), {0, 1, 2, 3}, 2}}};
      if (plan_ranks >= 8) {
        usp[0].push_back({Scheme::usp, {4, 6, 5, 7}, {4, 5, 6}, 2});
        usp.push_back({{Scheme::usp, rank_range(0, 8), {7, 8, 9, 10, 11}, 4}});
      } else {
        usp[0].front().sequences.insert(usp[0].front().sequences.end(), {4, 5, 6});
        usp.push_back({{Scheme::usp, {3, 2, 1, 0}, {7, 8, 9, 10, 11}, 2}});
      }
      const Plan plan = hand_plan(*cost, hand_lengths, usp);
      require_valid(plan, *cost, "hand:usp");
      failures += check_plan("hand:usp", plan, config, parameters, documents_of(hand_lengths, config.vocab, 302), rank);
      // One KV head per TP GPU (8 heads, kv_heads = TP degree): every u >= 2 replicates it
      // on u members of a stage, their dK/dV summed back after the ring.
      ModelConfig gqa = config;
      gqa.kv_heads = kTensorParallel;
      const Parameters gqa_parameters = init_parameters(gqa, 10);
      const Model gqa_model = planning_model(gqa);
      const auto gqa_cost = make_cost_model(
          load_cost_model_spec("analytical"),
          tensor_parallel_units(emulated_cluster(gqa_model, ranks, kGpusPerNode, 160), gqa_model, kTensorParallel),
          gqa_model);
      std::vector<std::vector<HandGroup>> replicated;
      if (plan_ranks >= 8) {
        replicated = {{{Scheme::usp, rank_range(0, 8), {0, 1, 2, 3, 4, 5}, 4}},
                      {{Scheme::usp, {7, 6, 5, 4, 3, 2, 1, 0}, {6, 7, 8, 9, 10, 11}, 2}}};
      } else {
        replicated = {{{Scheme::usp, rank_range(0, 4), {0, 1, 2, 3, 4, 5}, 2}},
                      {{Scheme::usp, {2, 3, 0, 1}, {6, 7, 8, 9, 10, 11}, 2}}};
      }
      const Plan replicated_plan = hand_plan(*gqa_cost, hand_lengths, replicated);
      require_valid(replicated_plan, *gqa_cost, "hand:usp-replicated");
      failures += check_plan("hand:usp-replicated-kv", replicated_plan, gqa, gqa_parameters,
                             documents_of(hand_lengths, gqa.vocab, 303), rank);
    }
    if (kTensorParallel == 1 && plan_ranks >= 3) {
      // Multi-query attention, 6 heads: Ulysses groups of 3 and (at 8 ranks) 6 hold the one
      // KV head on every member; a ring of 2 or a local group takes the rest.
      ModelConfig mqa = config;
      mqa.heads = 6;
      mqa.kv_heads = 1;
      mqa.hidden = 48;
      const Parameters mqa_parameters = init_parameters(mqa, 9);
      const Model mqa_model = planning_model(mqa);
      const auto mqa_cost = make_cost_model(load_cost_model_spec("analytical"),
                                            emulated_cluster(mqa_model, ranks, kGpusPerNode, 160), mqa_model);
      std::vector<std::vector<HandGroup>> micro_batches = {
          {{Scheme::ulysses, {0, 1, 2}, {0, 1, 2}}, {Scheme::local, {plan_ranks - 1}, {3, 4}}}};
      if (plan_ranks >= 8) {
        micro_batches.push_back({{Scheme::ulysses, rank_range(0, 6), {5, 6, 7}}, {Scheme::ring, {7, 6}, {8, 9}}});
      } else {
        micro_batches.push_back({{Scheme::ulysses, {2, 1, 0}, {5, 6, 7}}, {Scheme::local, {3}, {8, 9}}});
      }
      micro_batches.push_back({{Scheme::ring, {1, 2, 0}, {10, 11}}});
      const Plan plan = hand_plan(*mqa_cost, hand_lengths, micro_batches);
      require_valid(plan, *mqa_cost, "hand:mqa");
      failures += check_plan("hand:ulysses-mqa+any-size", plan, mqa, mqa_parameters,
                             documents_of(hand_lengths, mqa.vocab, 301), rank);
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
