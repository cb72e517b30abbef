// Randomised plans (fixed seeds) of every scheme, with padding, routing, remaps and
// several micro-batches, under the analytical cost model of a real preset: the lower
// bound holds, the per-rank times add up to the step, and runs repeat exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "sim/sim_fixtures.hpp"
#include "schemes.hpp"
#include "timeline.hpp"

namespace ballast {
namespace {

class PlanGenerator {
 public:
  /// Sequences of min_tokens + [0, spread) tokens.
  PlanGenerator(const CostModel& cost, unsigned seed, int min_tokens = 64, int spread = 4000)
      : cost_(cost), random_(seed), min_tokens_(min_tokens), spread_(spread) {}

  /// Groups of any size from 1 to `largest` ranks at any offset (Ulysses only where
  /// ulysses_degree_allowed()), instead of aligned powers of two.
  PlanGenerator& any_size(int largest) {
    largest_any_size_ = largest;
    return *this;
  }

  /// Groups of 4 or more ranks become usp groups (stages of the largest allowed Ulysses
  /// degree below the size that divides it) half the time.
  PlanGenerator& with_usp() {
    with_usp_ = true;
    return *this;
  }

  Plan make() {
    std::vector<Tokens> lengths;
    const int count = 8 + pick(24);
    for (int s = 0; s < count; ++s) lengths.push_back(min_tokens_ + pick(spread_));
    Plan plan = testing::empty_plan(cost_, lengths);
    const int micro_batches = 1 + pick(3);
    for (int m = 0; m < micro_batches; ++m) plan.micro_batches.push_back(random_groups());
    // Sequences round-robin over the micro-batches' groups.
    std::size_t next_group = 0;
    std::vector<std::pair<int, int>> slots;  // (micro-batch, group)
    for (int m = 0; m < micro_batches; ++m) {
      for (std::size_t g = 0; g < plan.micro_batches[m].groups.size(); ++g) {
        slots.emplace_back(m, static_cast<int>(g));
      }
    }
    for (int s = 0; s < count; ++s) {
      const auto [m, g] = slots[next_group++ % slots.size()];
      place(plan.micro_batches[m].groups[g], s, lengths[s]);
    }
    for (MicroBatch& micro_batch : plan.micro_batches) {
      std::erase_if(micro_batch.groups,
                    [](const AttentionGroup& g) { return g.sequences.empty(); });
      if (pick(2) == 0) micro_batch.linear_layout = token_balanced(micro_batch, lengths);
    }
    std::erase_if(plan.micro_batches, [](const MicroBatch& m) { return m.groups.empty(); });
    return plan;
  }

 private:
  int pick(int below) { return static_cast<int>(random_() % static_cast<unsigned>(below)); }

  /// Ranks split into aligned blocks of 1, 2, 4 or 8 with a random scheme each.
  MicroBatch random_groups() {
    MicroBatch micro_batch;
    const int ranks = cost_.cluster().ranks();
    for (int first = 0; first < ranks;) {
      int size = 1 << pick(4);
      while (first % size != 0 || first + size > ranks) size /= 2;
      if (largest_any_size_ > 0) size = 1 + pick(std::min(largest_any_size_, ranks - first));
      AttentionGroup group;
      group.scheme = size == 1
                         ? Scheme::local
                         : std::array{Scheme::ring, Scheme::ulysses, Scheme::all_gather}[pick(3)];
      if (group.scheme == Scheme::ulysses &&
          !ulysses_degree_allowed(cost_.model(), cost_.cluster().tensor_parallel.gpus, size)) {
        group.scheme = Scheme::ring;
      }
      for (int r = first; r < first + size; ++r) group.ranks.push_back(r);
      if (with_usp_ && size >= 4 && pick(2) == 0) {
        for (int u = size / 2; u >= 2; --u) {
          if (size % u == 0 &&
              ulysses_degree_allowed(cost_.model(), cost_.cluster().tensor_parallel.gpus, u)) {
            group.scheme = Scheme::usp;
            group.ulysses_degree = u;
            break;
          }
        }
      }
      if (group.scheme == Scheme::ring && largest_any_size_ == 0) {  // proxies: whole nodes
        group.routing_proxies = 1 + pick(2);
        group.routing_chunks = 1 << pick(3);
      }
      micro_batch.groups.push_back(group);
      first += size;
    }
    return micro_batch;
  }

  static void place(AttentionGroup& group, int id, Tokens length) {
    const auto g = static_cast<Tokens>(group.ranks.size());
    SequenceChunks sequence{id, length, {}};
    if (group.scheme == Scheme::local || group.scheme == Scheme::ulysses) {
      for (Tokens i = 0; i < g; ++i) {
        sequence.chunks.push_back({group.ranks[i], length * i / g, length * (i + 1) / g});
      }
    } else {  // zigzag over 2g chunks, padded to a multiple of 2g
      sequence.padded_length_tokens = (length + 2 * g - 1) / (2 * g) * (2 * g);
      const Tokens chunk = sequence.padded_length_tokens / (2 * g);
      for (Tokens c = 0; c < 2 * g; ++c) {
        const int rank = group.ranks[c < g ? c : 2 * g - 1 - c];
        sequence.chunks.push_back({rank, c * chunk, (c + 1) * chunk});
      }
    }
    group.sequences.push_back(sequence);
  }

  /// Each sequence's [0, length) cut into equal slices over all ranks.
  std::vector<LinearSlice> token_balanced(const MicroBatch& micro_batch,
                                          const std::vector<Tokens>& lengths) {
    std::vector<LinearSlice> layout;
    const int ranks = cost_.cluster().ranks();
    const int offset = pick(ranks);
    for (const AttentionGroup& group : micro_batch.groups) {
      for (const SequenceChunks& sequence : group.sequences) {
        const Tokens length = lengths[sequence.sequence_id];
        const Tokens parts = std::min<Tokens>(length, 1 + pick(4));
        for (Tokens p = 0; p < parts; ++p) {
          layout.push_back({static_cast<int>((offset + sequence.sequence_id + p) % ranks),
                            sequence.sequence_id, length * p / parts, length * (p + 1) / parts});
        }
      }
    }
    return layout;
  }

  const CostModel& cost_;
  std::mt19937 random_;
  int min_tokens_;
  int spread_;
  int largest_any_size_ = 0;
  bool with_usp_ = false;
};

TEST(SimulatorRandom, LowerBoundHoldsAndTimesAddUp) {
  Cluster cluster = cluster_preset("a800-roce");  // 2 GPUs per NIC
  cluster.nodes = 2;
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  for (unsigned seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Plan plan = PlanGenerator(cost, seed).make();
    const SimulationReport report = simulate(plan, cost, {.record_trace = true});
    EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
    for (const RankTimes& times : report.ranks) {
      EXPECT_NEAR(times.busy_s + times.exposed_communication_s + times.idle_s, report.step_time_s,
                  1e-9 * report.step_time_s);
      EXPECT_LE(times.exposed_communication_s, times.communication_s + 1e-15);
      EXPECT_GE(times.exposed_communication_s, -1e-15);
    }
    const SimulationReport again = simulate(plan, cost, {.record_trace = true});
    EXPECT_EQ(again.step_time_s, report.step_time_s);
    EXPECT_EQ(again.trace.size(), report.trace.size());
  }
}

/// 2 nodes of 8 A800s behind one 100 Gb/s NIC each (12 GB/s): a gradient sync of llama-7b
/// (2.1 s) longer than its backward pass on a few thousand tokens per rank.
Cluster slow_sync_cluster() {
  Cluster cluster = cluster_preset("a800-roce");
  cluster.nodes = 2;
  cluster.nics_per_node = 1;
  cluster.nic_bw_bytes_per_s = 12e9;
  return cluster;
}

// Short batches on 16 GPUs, whose 32 overlapped gradient buckets (~2 s over one slow NIC) take
// longer than the backward pass (~1 s): the bound's sync term (the first bucket after the
// forward pass, docs/simulator.md section 7) binds and holds, with several micro-batches
// and full recomputation (the rerun forward counts as backward time); an even plan of
// local groups comes within 10% of it.
TEST(SimulatorRandom, GradientBucketsAfterTheForwardPassBoundTheStep) {
  Cluster cluster = slow_sync_cluster();
  int sync_binds = 0;
  for (const Recompute recompute : {Recompute::selective, Recompute::full}) {
    Model model = model_preset("llama-7b");
    model.recompute = recompute;
    const AnalyticalCostModel cost(cluster, model);
    for (unsigned seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE(std::string(recompute_name(recompute)) + " seed " + std::to_string(seed));
      const Plan plan = PlanGenerator(cost, seed).make();
      const SimulationReport report = simulate(plan, cost);
      EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
      EXPECT_GT(report.lower_bound.first_bucket_ready_s, 0.0);
      sync_binds += report.lower_bound.binding.starts_with("the gradient sync's");
    }
    std::vector<Tokens> lengths(16, 4096);
    Plan even = testing::empty_plan(cost, lengths);
    MicroBatch micro_batch;
    for (int rank = 0; rank < 16; ++rank) micro_batch.groups.push_back(testing::local_group(rank, rank, 4096));
    even.micro_batches.push_back(micro_batch);
    const SimulationReport report = simulate(even, cost);
    EXPECT_EQ(report.lower_bound.binding, "the gradient sync's 32 buckets after the forward pass");
    EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
    EXPECT_LT(report.step_time_s, 1.1 * report.lower_bound.time_s);
  }
  EXPECT_GT(sync_binds, 30);
}

// When memory forces several micro-batches, only the last one's backward pass can hide
// the gradient buckets: the linear backward work beyond one micro-batch's token capacity
// runs before the first bucket, and so does the attention backward work beyond the most
// that documents of ranks x capacity tokens hold. Plans of 2 to 4 micro-batches on 16 A800s with memory for
// ~8K tokens (llama-7b), every rank near its capacity in each: local documents, and 2- or
// 4-rank rings of documents longer than the capacity.
TEST(SimulatorRandom, OnlyTheLastMicroBatchHidesGradientBuckets) {
  Cluster cluster = slow_sync_cluster();
  int sync_binds = 0;
  for (const Recompute recompute : {Recompute::selective, Recompute::full}) {
    Model model = model_preset("llama-7b");
    model.recompute = recompute;
    {  // memory for about 8,192 tokens per rank
      const AnalyticalCostModel full(cluster, model);
      cluster.gpu_memory_bytes = static_cast<Bytes>(
          static_cast<double>(full.model_state_bytes_per_rank() + 8192 * full.activation_bytes_per_token()) /
          cluster.memory_usable_fraction);
    }
    const AnalyticalCostModel cost(cluster, model);
    const Tokens capacity = cost.token_capacity_per_rank();
    ASSERT_GT(capacity, 8000);
    ASSERT_LT(capacity, 8400);
    const int buckets = gradient_sync_buckets(model);
    for (unsigned seed = 1; seed <= 20; ++seed) {
      SCOPED_TRACE(std::string(recompute_name(recompute)) + " seed " + std::to_string(seed));
      std::mt19937 random(seed);
      const auto pick = [&](Tokens below) { return static_cast<Tokens>(random() % below); };
      std::vector<Tokens> lengths;
      std::vector<MicroBatch> micro_batches(static_cast<std::size_t>(2 + pick(3)));
      for (MicroBatch& micro_batch : micro_batches) {
        for (int first = 0; first < 16;) {
          const int size = pick(3) == 0 && first % 4 == 0 ? 2 << pick(2) : 1;
          std::vector<int> ranks(static_cast<std::size_t>(size));
          for (int i = 0; i < size; ++i) ranks[i] = first + i;
          if (size == 1) {  // documents of capacity/8 to capacity/2 while 90% fits
            std::vector<testing::SequenceSpec> documents;
            for (Tokens used = 0;;) {
              const Tokens length = capacity / 8 + pick(3 * capacity / 8);
              if (used + length > 9 * capacity / 10) break;  // room for attention buffers
              documents.push_back({static_cast<std::int64_t>(lengths.size()), {{first, 0, length}}});
              lengths.push_back(length);
              used += length;
            }
            micro_batch.groups.push_back(testing::make_group(Scheme::local, ranks, documents));
          } else {  // one document over the ring, longer than one rank holds
            const Tokens length = capacity + pick(9 * size * capacity / 10 - capacity);
            testing::SequenceSpec spec{static_cast<std::int64_t>(lengths.size()), {}};
            for (int i = 0; i < size; ++i) {
              spec.chunks.push_back({first + i, length * i / size, length * (i + 1) / size});
            }
            lengths.push_back(length);
            micro_batch.groups.push_back(testing::make_group(Scheme::ring, ranks, {spec}));
          }
          first += size;
        }
      }
      Plan plan = testing::empty_plan(cost, lengths);
      plan.micro_batches = micro_batches;
      const SimulationReport report = simulate(plan, cost);  // validates the plan
      const LowerBound& bound = report.lower_bound;
      EXPECT_LE(bound.time_s, report.step_time_s);
      // The term counts the linear backward work beyond one micro-batch's capacity.
      Tokens total = 0;
      for (Tokens length : lengths) total += length;
      ASSERT_GT(total, 16 * capacity);
      // By hand: the forward work and 1 / B of the backward (docs/simulator.md section 7),
      // plus (1 - 1 / B) of the linear backward work beyond one capacity per rank.
      Seconds forward_s = 0;
      Seconds backward_s = 0;
      std::vector<std::pair<double, Tokens>> attention;  // (backward attention per token, tokens)
      Seconds attention_backward_s = 0;
      for (Tokens length : lengths) {
        const Tokens padded = length + 1024;
        const Seconds attention_forward_s = cost.attention_document_floor_s(length, padded, Pass::forward);
        const Seconds fwd_s = cost.linear_time_s(length, Pass::forward) + attention_forward_s;
        forward_s += fwd_s;
        const Seconds attention_s = (model.forward_passes() - 1) * attention_forward_s +
                                    cost.attention_document_floor_s(length, padded, Pass::backward);
        backward_s += (model.forward_passes() - 1) * fwd_s + cost.linear_time_s(length, Pass::backward) +
                      cost.attention_document_floor_s(length, padded, Pass::backward);
        attention.push_back({attention_s / static_cast<double>(length), length});
        attention_backward_s += attention_s;
      }
      // The last micro-batch holds at most 16 x capacity tokens: at most the attention
      // backward work of the densest documents that many tokens hold (the last in part).
      std::sort(attention.begin(), attention.end(), std::greater<>());
      Seconds last_attention_s = 0;
      Tokens room = 16 * capacity;
      for (const auto& [per_token_s, length] : attention) {
        const Tokens taken = std::min(room, length);
        last_attention_s += per_token_s * static_cast<double>(taken);
        room -= taken;
      }
      const double per_token = 1 << 20;
      const Seconds linear_backward_per_token_s =
          ((model.forward_passes() - 1) * cost.linear_time_s(1 << 20, Pass::forward) +
           cost.linear_time_s(1 << 20, Pass::backward)) / per_token;
      const Seconds excess_s = (1.0 - 1.0 / buckets) * linear_backward_per_token_s *
                               static_cast<double>(total - 16 * capacity) / 16;
      const Seconds attention_excess_s = (1.0 - 1.0 / buckets) * (attention_backward_s - last_attention_s) / 16;
      EXPECT_NEAR(bound.first_bucket_ready_s, (forward_s + backward_s / buckets) / 16 + excess_s + attention_excess_s,
                  1e-9 * bound.first_bucket_ready_s);
      EXPECT_GT(excess_s, 0.05 * bound.first_bucket_ready_s);
      EXPECT_GT(attention_excess_s, 0.0);
      sync_binds += bound.binding.starts_with("the gradient sync's");
    }
  }
  EXPECT_GT(sync_binds, 30);
}

TEST(SimulatorRandom, PackedTilesLowerBoundHolds) {
  // A cluster whose kernel tiles packed spans (ballast's runtime), short and long sequences:
  // packed tiles cost less than tiles of their own, and still no less than the floor.
  Cluster cluster = cluster_preset("a800-roce");
  cluster.nodes = 2;
  cluster.attention_tile_tokens = 64;
  cluster.attention_tiles_packed = true;
  const AnalyticalCostModel cost(cluster, model_preset("llama-7b"));
  for (unsigned seed = 1; seed <= 40; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    const Plan plan = PlanGenerator(cost, seed, 8, seed % 2 == 0 ? 100 : 2000).make();
    const SimulationReport report = simulate(plan, cost);
    EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
    EXPECT_EQ(simulate(plan, cost).step_time_s, report.step_time_s);
  }
}

TEST(SimulatorRandom, GroupsOfAnySizeAndReplicatedKvHeads) {
  // Rings, all-gathers and Ulysses groups of 1 to 16 ranks at any offset on 16 GPUs:
  // Llama-3.2-3B's 24 heads with 2 KV heads (made up) allow Ulysses 2, 4, 6, 8 and 12,
  // KV heads replicated from 4 on; Llama-3-8B's 8 KV heads Ulysses 16 (replicated);
  // Llama-2-13B's 40 heads Ulysses 5 and 10.
  Cluster cluster = cluster_preset("a800-roce");
  cluster.nodes = 2;
  int ulysses_beyond_kv_heads = 0;
  int odd_sizes = 0;
  for (const char* name : {"llama-3b", "llama3-8b", "llama-13b"}) {
    Model model = model_preset(name);
    if (model.name == "llama-3b") model.kv_heads = 2;
    const AnalyticalCostModel cost(cluster, model);
    for (unsigned seed = 1; seed <= 12; ++seed) {
      SCOPED_TRACE(std::string(name) + " seed " + std::to_string(seed));
      const Plan plan = PlanGenerator(cost, seed, 64, 1000).any_size(16).make();
      for (const MicroBatch& micro_batch : plan.micro_batches) {
        for (const AttentionGroup& group : micro_batch.groups) {
          const auto size = static_cast<int>(group.ranks.size());
          odd_sizes += size > 1 && (size & (size - 1)) != 0;
          ulysses_beyond_kv_heads += group.scheme == Scheme::ulysses && size > model.kv_heads;
        }
      }
      const SimulationReport report = simulate(plan, cost);  // validates the plan
      EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
      EXPECT_EQ(simulate(plan, cost).step_time_s, report.step_time_s);
    }
  }
  EXPECT_GT(odd_sizes, 0);
  EXPECT_GT(ulysses_beyond_kv_heads, 0);
}

TEST(SimulatorRandom, UspLowerBoundHolds) {
  // usp groups beside every other scheme, unpacked and packed tiles, GQA (Llama-3-8B: 8
  // KV heads) and MHA (Llama-2-7B): the bound holds and runs repeat exactly.
  int usp_groups = 0;
  for (const bool packed : {false, true}) {
    for (const char* name : {"llama-7b", "llama3-8b"}) {
      Cluster cluster = cluster_preset("a800-roce");
      cluster.nodes = 2;
      cluster.attention_tile_tokens = packed ? 64 : cluster.attention_tile_tokens;
      cluster.attention_tiles_packed = packed;
      const AnalyticalCostModel cost(cluster, model_preset(name));
      for (unsigned seed = 1; seed <= 12; ++seed) {
        SCOPED_TRACE(std::string(name) + " seed " + std::to_string(seed));
        const Plan plan = PlanGenerator(cost, seed, 64, 1000).any_size(16).with_usp().make();
        for (const MicroBatch& micro_batch : plan.micro_batches) {
          for (const AttentionGroup& group : micro_batch.groups) {
            usp_groups += group.scheme == Scheme::usp;
          }
        }
        const SimulationReport report = simulate(plan, cost);  // validates the plan
        EXPECT_LE(report.lower_bound.time_s, report.step_time_s);
        EXPECT_EQ(simulate(plan, cost).step_time_s, report.step_time_s);
      }
    }
  }
  EXPECT_GT(usp_groups, 20);
}

/// Measure of the union of [start, end) intervals (sorted and merged here, independently
/// of the simulator's accounting).
Seconds union_measure(std::vector<std::pair<Seconds, Seconds>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  Seconds total = 0, end = -1;
  for (const auto& [a, b] : intervals) {
    if (a > end) {
      total += b - a;
      end = b;
    } else if (b > end) {
      total += b - end;
      end = b;
    }
  }
  return total;
}

/// Per rank, from the trace: busy time plus the communication of its micro-batches that
/// no compute hides (the gradient sync, micro_batch -1, left out); exposed = |comm u busy|
/// - |busy|.
std::vector<Seconds> time_before_sync_from_trace(const SimulationReport& report) {
  std::vector<std::vector<std::pair<Seconds, Seconds>>> busy(report.ranks.size()), both(report.ranks.size());
  for (const TraceEvent& event : report.trace) {
    if (event.duration_s <= 0) continue;
    const std::pair<Seconds, Seconds> interval{event.start_s, event.start_s + event.duration_s};
    const auto r = static_cast<std::size_t>(event.rank);
    if (event.lane == "compute") {
      busy[r].push_back(interval);
      both[r].push_back(interval);
    } else if (event.micro_batch >= 0) {
      both[r].push_back(interval);
    }
  }
  std::vector<Seconds> times;
  for (std::size_t r = 0; r < report.ranks.size(); ++r) {
    times.push_back(union_measure(busy[r]) + (union_measure(both[r]) - union_measure(busy[r])));
  }
  return times;
}

TEST(SimulatorRandom, EvaluatorStepTimesAndEarlyStopsMatchTheSimulation) {
  // SimulatorEvaluator's step-only path (no report), evaluate() and their early stops
  // against simulate(): the same step and rank times to the last bit; below a bound the
  // step itself (and evaluate_below() the rank times), at or above it a time between the
  // bound and the step (and no rank times). Routed rings (a800-roce: 2 GPUs per NIC), groups of any
  // size, usp, several micro-batches; both gradient sync modes. Low bounds stop on the
  // tasks' paths (the build or the run), which must keep the same contract.
  const std::int64_t path_stops_before = sim::path_stop_count();
  Cluster cluster = cluster_preset("a800-roce");
  cluster.nodes = 2;
  int stopped_early = 0;
  int checked = 0;
  int waits_in_sync = 0;  // ranks whose time the gradient sync's wait lengthens
  for (const char* name : {"llama-7b", "llama3-8b"}) {
    const AnalyticalCostModel cost(cluster, model_preset(name));
    for (const GradientSync sync : {GradientSync::overlap, GradientSync::end}) {
      const SimulatorEvaluator evaluator(cost, sync);
      for (unsigned seed = 1; seed <= 12; ++seed) {
        SCOPED_TRACE(std::string(name) + " seed " + std::to_string(seed));
        PlanGenerator generator(cost, seed, 64, 4000);
        if (seed % 2 == 0) generator.any_size(16).with_usp();
        const Plan plan = generator.make();
        const SimulationReport report = simulate(plan, cost, {.gradient_sync = sync});
        const Seconds step_s = report.step_time_s;
        EXPECT_EQ(evaluator.step_time_s(plan), step_s);
        // evaluate(): the report's step and each rank's busy + exposed communication.
        std::vector<Seconds> rank_time_s;
        for (const RankTimes& rank : report.ranks) rank_time_s.push_back(rank.busy_s + rank.exposed_communication_s);
        const PlanEvaluation evaluation = evaluator.evaluate(plan);
        EXPECT_EQ(evaluation.step_time_s, step_s);
        EXPECT_EQ(evaluation.rank_time_s, rank_time_s);
        // rank_time_before_sync_s: the same without the gradient sync, from the trace (its
        // ends are start + duration, so equal to rounding); never above rank_time_s, and
        // below it on some rank when the sync overlaps the backward pass.
        const SimulationReport traced = simulate(plan, cost, {.record_trace = true, .gradient_sync = sync});
        const std::vector<Seconds> before_sync_s = time_before_sync_from_trace(traced);
        ASSERT_EQ(evaluation.rank_time_before_sync_s.size(), before_sync_s.size());
        for (std::size_t r = 0; r < before_sync_s.size(); ++r) {
          EXPECT_NEAR(evaluation.rank_time_before_sync_s[r], before_sync_s[r], 1e-9 * step_s) << "rank " << r;
          EXPECT_LE(evaluation.rank_time_before_sync_s[r], rank_time_s[r] * (1 + 1e-12)) << "rank " << r;
          waits_in_sync += evaluation.rank_time_before_sync_s[r] < rank_time_s[r] - 1e-6 * step_s ? 1 : 0;
        }
        const Seconds infinity = std::numeric_limits<Seconds>::infinity();
        for (const Seconds bound_s : {infinity, 1.5 * step_s, std::nextafter(step_s, infinity),
                                      step_s, 0.999 * step_s, 0.5 * step_s, 0.01 * step_s, 0.0}) {
          const Seconds got_s = evaluator.step_time_below_s(plan, bound_s);
          // evaluate_below(): the same stop; below the bound, evaluate() to the bit.
          const PlanEvaluation below = evaluator.evaluate_below(plan, bound_s);
          EXPECT_EQ(below.step_time_s, got_s) << "bound " << bound_s;
          ++checked;
          if (step_s < bound_s) {
            EXPECT_EQ(got_s, step_s) << "bound " << bound_s;
            EXPECT_EQ(below.rank_time_s, rank_time_s) << "bound " << bound_s;
            EXPECT_EQ(below.rank_time_before_sync_s, evaluation.rank_time_before_sync_s) << "bound " << bound_s;
          } else {
            EXPECT_GE(got_s, bound_s);
            EXPECT_LE(got_s, step_s);
            EXPECT_TRUE(below.rank_time_s.empty()) << "bound " << bound_s;
            EXPECT_TRUE(below.rank_time_before_sync_s.empty()) << "bound " << bound_s;
            stopped_early += got_s < step_s;
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 2 * 2 * 12 * 8);
  EXPECT_GT(stopped_early, 2 * 2 * 12);  // the stop runs, not only the full simulation
  EXPECT_GT(sim::path_stop_count() - path_stops_before, 2 * 2 * 12);  // and the path stops
  EXPECT_GT(waits_in_sync, 0);
}

TEST(SimulatorRandom, KeptStepTimesGiveTheSameStepsToTheBit) {
  // Inside an EvaluationSession the simulator keeps ring and USP step times across
  // simulations (open_simulation_cache). Random plans (rings, all-gathers, Ulysses and USP
  // of any size, routed rings, several micro-batches) and copies with their micro-batches
  // in reverse order (the same groups at other times and after other work), on two
  // cost models (another model and a faster GPU: the same groups price differently) and
  // on a packed and an unpacked cluster, simulated in one session in an
  // interleaved order, twice: every step and rank time equals the one simulated without a
  // session, to the bit, and the kept times are actually used.
  std::int64_t hits = 0;
  int checked = 0;
  for (const bool packed : {false, true}) {
    Cluster cluster = cluster_preset("a800-roce");
    cluster.nodes = 2;
    cluster.attention_tiles_packed = packed;
    Cluster faster = cluster;  // the same links, GPUs of another peak: other compute times
    faster.peak_flops_per_s *= 1.5;
    const AnalyticalCostModel llama(cluster, model_preset("llama-7b"));
    const AnalyticalCostModel gqa(faster, model_preset("llama3-8b"));
    const std::vector<const CostModel*> costs{&llama, &gqa};
    std::vector<Plan> plans;
    for (unsigned seed = 1; seed <= 10; ++seed) {
      PlanGenerator generator(llama, seed, 64, 4000);
      if (seed % 2 == 0) generator.any_size(16).with_usp();
      plans.push_back(generator.make());
    }
    for (std::size_t i = 0; i < 10; ++i) {  // the same groups in another order
      if (plans[i].micro_batches.size() < 2) continue;
      Plan reordered = plans[i];
      std::reverse(reordered.micro_batches.begin(), reordered.micro_batches.end());
      plans.push_back(std::move(reordered));
    }
    // References: no session, a fresh evaluation each.
    std::vector<std::vector<PlanEvaluation>> reference(costs.size());
    for (std::size_t c = 0; c < costs.size(); ++c) {
      const SimulatorEvaluator evaluator(*costs[c]);
      for (const Plan& plan : plans) reference[c].push_back(evaluator.evaluate(plan));
    }
    const SimulatorEvaluator llama_evaluator(llama), gqa_evaluator(gqa);
    const std::vector<const SimulatorEvaluator*> evaluators{&llama_evaluator, &gqa_evaluator};
    const std::int64_t hits_before = sim::step_time_cache_hit_count();
    {
      const EvaluationSession session(llama_evaluator);
      const EvaluationSession nested(gqa_evaluator);  // sessions nest
      for (int round = 0; round < 2; ++round) {
        for (std::size_t p = 0; p < plans.size(); ++p) {
          for (std::size_t c = 0; c < costs.size(); ++c) {
            SCOPED_TRACE("packed " + std::to_string(packed) + " round " + std::to_string(round) +
                         " plan " + std::to_string(p) + " cost " + std::to_string(c));
            const PlanEvaluation got = evaluators[c]->evaluate(plans[p]);
            EXPECT_EQ(got.step_time_s, reference[c][p].step_time_s);
            EXPECT_EQ(got.rank_time_s, reference[c][p].rank_time_s);
            EXPECT_EQ(got.rank_time_before_sync_s, reference[c][p].rank_time_before_sync_s);
            ++checked;
          }
        }
      }
    }
    hits += sim::step_time_cache_hit_count() - hits_before;
    // Closed: nothing is kept (the same plan again takes no kept time).
    const std::int64_t hits_closed = sim::step_time_cache_hit_count();
    EXPECT_EQ(llama_evaluator.evaluate(plans.front()).step_time_s, reference[0][0].step_time_s);
    EXPECT_EQ(sim::step_time_cache_hit_count(), hits_closed);
  }
  EXPECT_GE(checked, 2 * 2 * 2 * 10);
  EXPECT_GT(hits, 100);
}

TEST(SimulatorRandom, UspOfOneStageOrOneRankPerStageCostsUlyssesOrRing) {
  // The USP builder's general code on the two shapes validate() spells otherwise: a usp
  // group with ulysses_degree 1 is a ring of its ranks, one with ulysses_degree = size is a
  // Ulysses group: the same step time, to the last bit (the one-rank all-to-alls are free).
  int rings = 0, ulysses = 0;
  for (const bool packed : {false, true}) {
    Cluster cluster = cluster_preset("a800-roce");
    cluster.nodes = 2;
    cluster.attention_tiles_packed = packed;
    const AnalyticalCostModel cost(cluster, model_preset("llama3-8b"));
    const SimulatorEvaluator evaluator(cost);
    for (unsigned seed = 1; seed <= 16; ++seed) {
      SCOPED_TRACE("seed " + std::to_string(seed));
      const Plan plan = PlanGenerator(cost, seed, 64, 4000).any_size(16).make();
      Plan as_usp = plan;
      for (MicroBatch& micro_batch : as_usp.micro_batches) {
        for (AttentionGroup& group : micro_batch.groups) {
          const auto size = static_cast<int>(group.ranks.size());
          if (size < 2) continue;
          if (group.scheme == Scheme::ring && group.routing_proxies == 1) {
            group.scheme = Scheme::usp;
            group.ulysses_degree = 1;
            ++rings;
          } else if (group.scheme == Scheme::ulysses) {
            group.scheme = Scheme::usp;
            group.ulysses_degree = size;
            ++ulysses;
          }
        }
      }
      EXPECT_EQ(evaluator.step_time_s(as_usp), evaluator.step_time_s(plan));
    }
  }
  EXPECT_GT(rings, 10);
  EXPECT_GT(ulysses, 10);
}

}  // namespace
}  // namespace ballast
