// The lower bound's adversary (bound_adversary.hpp): random settings, every strategy's
// plans, mutations kept when they bring the step closer to the bound.
#include "sim/bound_adversary.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <utility>

#include "ballast/cluster.hpp"
#include "ballast/cost_model.hpp"
#include "ballast/error.hpp"
#include "ballast/model.hpp"
#include "ballast/plan.hpp"
#include "ballast/simulator.hpp"
#include "ballast/strategy.hpp"
#include "ballast/tensor_parallel.hpp"
#include "ballast/workload.hpp"

namespace ballast::testing {

namespace {

class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  /// Uniform in [0, below).
  int pick(int below) { return below <= 1 ? 0 : static_cast<int>(engine_() % static_cast<std::uint64_t>(below)); }
  bool chance(int one_in) { return pick(one_in) == 0; }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * std::uniform_real_distribution<double>(0.0, 1.0)(engine_);
  }
  /// 10^uniform(lo, hi): a factor over orders of magnitude.
  double decades(double lo, double hi) { return std::pow(10.0, uniform(lo, hi)); }
  template <typename T>
  const T& element(const std::vector<T>& items) { return items[static_cast<std::size_t>(pick(static_cast<int>(items.size())))]; }
  std::mt19937_64& engine() { return engine_; }

 private:
  std::mt19937_64 engine_;
};

/// One setting: cluster, model, cost model, gradient sync and batch.
struct Setting {
  std::unique_ptr<CostModel> cost;
  GradientSync sync = GradientSync::overlap;
  std::vector<Tokens> lengths;
  std::string words;
};

/// A preset moved over orders of magnitude: FLOP rate, NVLink and NIC bandwidths and
/// latencies; 1 to 3 nodes of 1 to 8 GPUs; sometimes no calibrated collectives, packed
/// attention tiles or tensor parallelism.
Cluster random_cluster(Random& random, const Model& model) {
  Cluster cluster = cluster_preset(random.element(std::vector<std::string>{"h100", "h200", "a100-ib400", "a800-roce", "h800"}));
  cluster.nodes = 1 + random.pick(3);
  cluster.gpus_per_node = std::vector<int>{1, 2, 4, 8, 8}[static_cast<std::size_t>(random.pick(5))];
  cluster.nics_per_node = std::gcd(cluster.nics_per_node, cluster.gpus_per_node);
  cluster.peak_flops_per_s *= random.decades(-1.0, 1.5);
  cluster.intra_node_bus_bw_bytes_per_s *= random.decades(-2.0, 1.0);
  cluster.intra_node_p2p_bw_bytes_per_s *= random.decades(-2.0, 1.0);
  cluster.nic_bw_bytes_per_s *= random.decades(-2.0, 1.0);
  cluster.intra_node_latency_s *= random.decades(-2.0, 2.0);
  cluster.inter_node_latency_s *= random.decades(-2.0, 2.0);
  if (random.chance(3)) cluster.intra_node_collectives.clear();
  if (random.chance(6)) cluster.attention_tiles_packed = true;
  if (random.chance(4) && cluster.gpus_per_node >= 2) {
    const int tensor_parallel = 2;
    if (model.heads % tensor_parallel == 0 && model.kv_heads % tensor_parallel == 0) {
      cluster = tensor_parallel_units(cluster, model, tensor_parallel);
    }
  }
  validate_cluster(cluster, "adversary cluster");
  return cluster;
}

/// A preset with 1 to all of its heads (KV heads dividing them), fewer parameters (so that
/// long sequences fit), sometimes full recomputation.
Model random_model(Random& random) {
  Model model = model_preset(random.element(model_preset_names()));
  if (random.chance(2)) {
    const std::vector<int> heads = {1, 2, 4, 8, 16, model.heads};
    model.heads = random.element(heads);
    std::vector<int> kv_heads;
    for (int k = 1; k <= model.heads; ++k)
      if (model.heads % k == 0) kv_heads.push_back(k);
    model.kv_heads = random.element(kv_heads);
  }
  model.parameters *= random.decades(-2.0, 0.0);
  if (random.chance(4)) model.recompute = Recompute::full;
  return model;
}

Setting random_setting(Random& random) {
  Setting setting;
  const Model model = random_model(random);
  const Cluster cluster = random_cluster(random, model);
  const bool profiled = random.chance(6);
  setting.cost = make_cost_model(load_cost_model_spec(profiled ? "flexsp-a100-192k" : "analytical"), cluster, model);
  setting.sync = random.chance(2) ? GradientSync::end : GradientSync::overlap;
  const Tokens capacity = setting.cost->token_capacity_per_rank();
  const Tokens longest = std::clamp<Tokens>(capacity * cluster.ranks() / 2, 1, 65'536);
  // A third of the batches hold one or two sequences, where the longest sequence's term
  // binds; the rest up to 16.
  const int count = random.chance(3) ? 1 + random.pick(2) : 1 + random.pick(16);
  for (int s = 0; s < count; ++s) {
    const double log_length = random.uniform(0.0, std::log(static_cast<double>(longest)));
    setting.lengths.push_back(std::max<Tokens>(1, static_cast<Tokens>(std::exp(log_length))));
  }
  setting.words = fmt::format(
      "{} x{} ({} ranks of {} GPUs, {:.3g} FLOP/s, NVLink {:.3g}/{:.3g} B/s, NIC {:.3g} B/s, "
      "latencies {:.3g}/{:.3g} s{}{}), {} ({} heads, {} KV heads{}), {} cost, sync {}, {} sequences",
      cluster.name, cluster.nodes, cluster.ranks(), cluster.tensor_parallel.gpus, cluster.peak_flops_per_s,
      cluster.intra_node_bus_bw_bytes_per_s, cluster.intra_node_p2p_bw_bytes_per_s, cluster.nic_bw_bytes_per_s,
      cluster.intra_node_latency_s, cluster.inter_node_latency_s,
      cluster.intra_node_collectives.empty() ? ", no collective fits" : "",
      cluster.attention_tiles_packed ? ", packed tiles" : "", model.name, model.heads, model.kv_heads,
      model.recompute == Recompute::full ? ", full recomputation" : "", profiled ? "profiled" : "analytical",
      setting.sync == GradientSync::end ? "end" : "overlap", setting.lengths.size());
  return setting;
}

/// Every registered strategy but FlexSP's faithful MILP (seconds of CBC per plan); ballast
/// with a small search budget.
std::vector<std::string> strategy_specs() {
  std::vector<std::string> specs;
  for (const std::string& name : planner_names()) {
    if (name == "flexsp") continue;
    specs.push_back(name == "ballast" ? "ballast:budget=4" : name);
  }
  return specs;
}

/// Plan edits that keep the plan well-formed enough to validate (validate() decides).
class Mutator {
 public:
  Mutator(Random& random, const Plan& plan) : random_(random), ranks_(plan.cluster.ranks()) {}

  /// One random edit; false when it found nothing to change.
  bool mutate(Plan& plan) {
    switch (random_.pick(12)) {
      case 10: return make_local(plan);
      case 11: return relayout_linear(plan);
      case 0: return move_sequence(plan);
      case 1: return change_scheme(plan);
      case 2: return resize_group(plan);
      case 3: return rechunk(plan);
      case 4: return relayout_linear(plan);
      case 5: return split_micro_batch(plan);
      case 6: return merge_micro_batches(plan);
      case 7: return reorder_micro_batches(plan);
      case 8: return reroute(plan);
      default: return reorder_queue(plan);
    }
  }

 private:
  /// The sequence's chunks for `group`'s scheme: whole on a local rank, contiguous equal
  /// parts (Ulysses, USP, sometimes rings), zigzag over 2g chunks padded to 2g, or random
  /// cuts over random members.
  void chunk(const AttentionGroup& group, SequenceChunks& sequence, Tokens length) {
    const auto g = static_cast<Tokens>(group.ranks.size());
    sequence.chunks.clear();
    sequence.padded_length_tokens = length;
    const int style = group.ranks.size() == 1 ? 0 : random_.pick(4);
    if (style == 0 || (style == 1 && (group.scheme == Scheme::ring || group.scheme == Scheme::all_gather))) {
      // zigzag
      if (g == 1) {
        sequence.chunks.push_back({group.ranks[0], 0, length});
        return;
      }
      sequence.padded_length_tokens = (length + 2 * g - 1) / (2 * g) * (2 * g);
      const Tokens size = sequence.padded_length_tokens / (2 * g);
      for (Tokens c = 0; c < 2 * g; ++c) {
        sequence.chunks.push_back({group.ranks[static_cast<std::size_t>(c < g ? c : 2 * g - 1 - c)], c * size, (c + 1) * size});
      }
    } else if (style <= 2) {  // contiguous equal parts
      for (Tokens i = 0; i < g; ++i) {
        sequence.chunks.push_back({group.ranks[static_cast<std::size_t>(i)], length * i / g, length * (i + 1) / g});
      }
    } else {  // random cuts over random members
      const int pieces = 1 + random_.pick(static_cast<int>(std::min<Tokens>(2 * g, length)));
      std::set<Tokens> cuts = {0, length};
      while (static_cast<int>(cuts.size()) < pieces + 1) cuts.insert(1 + static_cast<Tokens>(random_.engine()() % static_cast<std::uint64_t>(std::max<Tokens>(1, length - 1))));
      std::vector<Tokens> at(cuts.begin(), cuts.end());
      for (std::size_t i = 0; i + 1 < at.size(); ++i) {
        if (at[i + 1] > at[i]) sequence.chunks.push_back({random_.element(group.ranks), at[i], at[i + 1]});
      }
    }
    std::erase_if(sequence.chunks, [](const Chunk& c) { return c.size() <= 0; });
  }

  void rechunk_group(AttentionGroup& group, const Plan& plan) {
    for (SequenceChunks& sequence : group.sequences) chunk(group, sequence, plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)]);
  }

  /// A micro-batch with at least one group, or -1.
  int any_micro_batch(const Plan& plan) {
    return plan.micro_batches.empty() ? -1 : random_.pick(static_cast<int>(plan.micro_batches.size()));
  }

  static void erase_group(MicroBatch& micro_batch, int index) {
    micro_batch.groups.erase(micro_batch.groups.begin() + index);
    for (auto& queue : micro_batch.queues) {
      std::erase(queue, index);
      for (int& entry : queue)
        if (entry > index) --entry;
    }
  }

  static void append_group(MicroBatch& micro_batch, AttentionGroup group) {
    const int index = static_cast<int>(micro_batch.groups.size());
    if (!micro_batch.queues.empty()) {
      for (int rank : group.ranks) micro_batch.queues[static_cast<std::size_t>(rank)].push_back(index);
    }
    micro_batch.groups.push_back(std::move(group));
  }

  /// The linear slices of the attention chunks (what an empty layout means).
  static std::vector<LinearSlice> slices_of_chunks(const MicroBatch& micro_batch, const Plan& plan) {
    std::vector<LinearSlice> slices;
    for (const AttentionGroup& group : micro_batch.groups) {
      for (const SequenceChunks& sequence : group.sequences) {
        const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
        for (const Chunk& c : sequence.chunks) {
          const Tokens end = std::min(c.end_tokens, length);
          if (end > c.begin_tokens) slices.push_back({c.rank, sequence.sequence_id, c.begin_tokens, end});
        }
      }
    }
    return slices;
  }

  bool move_sequence(Plan& plan) {
    const int from = any_micro_batch(plan);
    if (from < 0 || plan.micro_batches[static_cast<std::size_t>(from)].groups.empty()) return false;
    MicroBatch& source = plan.micro_batches[static_cast<std::size_t>(from)];
    const int g = random_.pick(static_cast<int>(source.groups.size()));
    AttentionGroup& group = source.groups[static_cast<std::size_t>(g)];
    if (group.sequences.empty()) return false;
    const int s = random_.pick(static_cast<int>(group.sequences.size()));
    SequenceChunks sequence = group.sequences[static_cast<std::size_t>(s)];
    group.sequences.erase(group.sequences.begin() + s);
    std::vector<LinearSlice> moved_slices;
    std::erase_if(source.linear_layout, [&](const LinearSlice& slice) {
      if (slice.sequence_id != sequence.sequence_id) return false;
      moved_slices.push_back(slice);
      return true;
    });
    if (group.sequences.empty()) erase_group(source, g);
    const bool remove_source = source.groups.empty();
    const int to = random_.chance(3) ? from : any_micro_batch(plan);
    MicroBatch& target = plan.micro_batches[static_cast<std::size_t>(to)];
    if (target.groups.empty() || random_.chance(3)) {
      AttentionGroup local;
      local.ranks = {random_.pick(ranks_)};
      local.sequences.push_back(sequence);
      chunk(local, local.sequences.back(), plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)]);
      append_group(target, std::move(local));
    } else {
      AttentionGroup& into = target.groups[static_cast<std::size_t>(random_.pick(static_cast<int>(target.groups.size())))];
      into.sequences.push_back(sequence);
      chunk(into, into.sequences.back(), plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)]);
    }
    if (!target.linear_layout.empty()) {
      if (to == from && !moved_slices.empty()) {
        for (const LinearSlice& slice : moved_slices) target.linear_layout.push_back(slice);
      } else {
        const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
        target.linear_layout.push_back({random_.pick(ranks_), sequence.sequence_id, 0, length});
      }
    }
    if (remove_source && to != from) plan.micro_batches.erase(plan.micro_batches.begin() + from);
    return true;
  }

  /// A random group of a random micro-batch, with its micro-batch and index there.
  struct PickedGroup {
    MicroBatch* micro_batch = nullptr;
    int index = -1;
    AttentionGroup* group = nullptr;
  };
  PickedGroup pick_group(Plan& plan) {
    const int m = any_micro_batch(plan);
    if (m < 0) return {};
    MicroBatch& micro_batch = plan.micro_batches[static_cast<std::size_t>(m)];
    if (micro_batch.groups.empty()) return {};
    const int index = random_.pick(static_cast<int>(micro_batch.groups.size()));
    return {&micro_batch, index, &micro_batch.groups[static_cast<std::size_t>(index)]};
  }

  AttentionGroup* any_group(Plan& plan, std::size_t min_ranks) {
    const PickedGroup picked = pick_group(plan);
    return picked.group != nullptr && picked.group->ranks.size() >= min_ranks ? picked.group : nullptr;
  }

  bool change_scheme(Plan& plan) {
    AttentionGroup* group = any_group(plan, 2);
    if (group == nullptr) return false;
    const auto g = static_cast<int>(group->ranks.size());
    group->scheme = std::vector<Scheme>{Scheme::ring, Scheme::all_gather, Scheme::ulysses, Scheme::usp}[static_cast<std::size_t>(random_.pick(4))];
    group->ulysses_degree = 1;
    if (group->scheme == Scheme::usp) {
      std::vector<int> degrees;
      for (int u = 2; u < g; ++u)
        if (g % u == 0) degrees.push_back(u);
      if (degrees.empty()) {
        group->scheme = Scheme::ring;
      } else {
        group->ulysses_degree = random_.element(degrees);
      }
    }
    if (group->scheme != Scheme::ring) {
      group->routing_proxies = 1;
      group->routing_chunks = 1;
    }
    rechunk_group(*group, plan);
    return true;
  }

  bool resize_group(Plan& plan) {
    const PickedGroup picked = pick_group(plan);
    if (picked.group == nullptr) return false;
    MicroBatch& micro_batch = *picked.micro_batch;
    const int index = picked.index;
    AttentionGroup& group = *picked.group;
    if (group.ranks.size() >= 2 && random_.chance(2)) {
      const int position = random_.pick(static_cast<int>(group.ranks.size()));
      const int removed = group.ranks[static_cast<std::size_t>(position)];
      group.ranks.erase(group.ranks.begin() + position);
      if (!micro_batch.queues.empty()) std::erase(micro_batch.queues[static_cast<std::size_t>(removed)], index);
    } else {
      std::vector<int> outside;
      for (int r = 0; r < ranks_; ++r)
        if (std::find(group.ranks.begin(), group.ranks.end(), r) == group.ranks.end()) outside.push_back(r);
      if (outside.empty()) return false;
      const int added = random_.element(outside);
      group.ranks.insert(group.ranks.begin() + random_.pick(static_cast<int>(group.ranks.size()) + 1), added);
      if (!micro_batch.queues.empty()) micro_batch.queues[static_cast<std::size_t>(added)].push_back(index);
    }
    if (group.ranks.size() == 1) group.scheme = Scheme::local;
    if (group.scheme == Scheme::local && group.ranks.size() > 1) group.scheme = Scheme::ring;
    if (group.scheme == Scheme::usp && group.ranks.size() % static_cast<std::size_t>(group.ulysses_degree) != 0) {
      group.scheme = Scheme::ring;
      group.ulysses_degree = 1;
    }
    rechunk_group(group, plan);
    return true;
  }

  /// A group of several ranks becomes a local group on one of them (queues: the others
  /// drop it).
  bool make_local(Plan& plan) {
    const PickedGroup picked = pick_group(plan);
    if (picked.group == nullptr || picked.group->ranks.size() < 2) return false;
    MicroBatch& micro_batch = *picked.micro_batch;
    const int index = picked.index;
    AttentionGroup& group = *picked.group;
    const int kept = random_.element(group.ranks);
    if (!micro_batch.queues.empty()) {
      for (int rank : group.ranks)
        if (rank != kept) std::erase(micro_batch.queues[static_cast<std::size_t>(rank)], index);
    }
    group.ranks = {kept};
    group.scheme = Scheme::local;
    group.ulysses_degree = 1;
    group.routing_proxies = 1;
    group.routing_chunks = 1;
    rechunk_group(group, plan);
    return true;
  }

  bool rechunk(Plan& plan) {
    AttentionGroup* group = any_group(plan, 1);
    if (group == nullptr || group->sequences.empty()) return false;
    SequenceChunks& sequence = group->sequences[static_cast<std::size_t>(random_.pick(static_cast<int>(group->sequences.size())))];
    chunk(*group, sequence, plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)]);
    return true;
  }

  /// A random linear layout (1 to 4 random slices per sequence on random ranks, or each
  /// sequence split evenly over every rank), or none.
  bool relayout_linear(Plan& plan) {
    const int m = any_micro_batch(plan);
    if (m < 0) return false;
    MicroBatch& micro_batch = plan.micro_batches[static_cast<std::size_t>(m)];
    micro_batch.linear_layout.clear();
    if (random_.chance(4)) return true;
    const bool even = random_.chance(2);
    for (const AttentionGroup& group : micro_batch.groups) {
      for (const SequenceChunks& sequence : group.sequences) {
        const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
        const Tokens parts = std::min<Tokens>(length, even ? ranks_ : 1 + random_.pick(4));
        for (Tokens p = 0; p < parts; ++p) {
          const Tokens begin = length * p / parts, end = length * (p + 1) / parts;
          if (end > begin) micro_batch.linear_layout.push_back({even ? static_cast<int>(p) : random_.pick(ranks_), sequence.sequence_id, begin, end});
        }
      }
    }
    return true;
  }

  /// Groups [0, cut) stay, the rest go to a new micro-batch after it (queues filtered,
  /// linear slices with their sequences).
  bool split_micro_batch(Plan& plan) {
    const int m = any_micro_batch(plan);
    if (m < 0) return false;
    MicroBatch& micro_batch = plan.micro_batches[static_cast<std::size_t>(m)];
    const int groups = static_cast<int>(micro_batch.groups.size());
    if (groups < 2) return false;
    const int cut = 1 + random_.pick(groups - 1);
    MicroBatch second;
    std::set<std::int64_t> moved;
    for (int g = cut; g < groups; ++g) {
      for (const SequenceChunks& s : micro_batch.groups[static_cast<std::size_t>(g)].sequences) moved.insert(s.sequence_id);
      second.groups.push_back(micro_batch.groups[static_cast<std::size_t>(g)]);
    }
    micro_batch.groups.resize(static_cast<std::size_t>(cut));
    if (!micro_batch.queues.empty()) {
      second.queues.resize(micro_batch.queues.size());
      for (std::size_t r = 0; r < micro_batch.queues.size(); ++r) {
        std::vector<int> kept;
        for (int entry : micro_batch.queues[r]) (entry < cut ? kept : second.queues[r]).push_back(entry < cut ? entry : entry - cut);
        micro_batch.queues[r] = kept;
      }
    }
    std::erase_if(micro_batch.linear_layout, [&](const LinearSlice& slice) {
      if (!moved.contains(slice.sequence_id)) return false;
      second.linear_layout.push_back(slice);
      return true;
    });
    plan.micro_batches.insert(plan.micro_batches.begin() + m + 1, std::move(second));
    return true;
  }

  bool merge_micro_batches(Plan& plan) {
    if (plan.micro_batches.size() < 2) return false;
    const int m = random_.pick(static_cast<int>(plan.micro_batches.size()) - 1);
    MicroBatch& first = plan.micro_batches[static_cast<std::size_t>(m)];
    MicroBatch second = plan.micro_batches[static_cast<std::size_t>(m) + 1];
    const int offset = static_cast<int>(first.groups.size());
    if (!first.queues.empty() || !second.queues.empty()) {
      std::vector<std::vector<int>> a = effective_queues(first, ranks_), b = effective_queues(second, ranks_);
      for (std::size_t r = 0; r < a.size(); ++r)
        for (int entry : b[r]) a[r].push_back(entry + offset);
      first.queues = std::move(a);
    }
    if (!first.linear_layout.empty() || !second.linear_layout.empty()) {
      if (first.linear_layout.empty()) first.linear_layout = slices_of_chunks(first, plan);
      if (second.linear_layout.empty()) second.linear_layout = slices_of_chunks(second, plan);
      first.linear_layout.insert(first.linear_layout.end(), second.linear_layout.begin(), second.linear_layout.end());
    }
    for (AttentionGroup& group : second.groups) first.groups.push_back(std::move(group));
    plan.micro_batches.erase(plan.micro_batches.begin() + m + 1);
    return true;
  }

  bool reorder_micro_batches(Plan& plan) {
    if (plan.micro_batches.size() < 2) return false;
    const int a = random_.pick(static_cast<int>(plan.micro_batches.size()));
    const int b = random_.pick(static_cast<int>(plan.micro_batches.size()));
    if (a == b) return false;
    std::swap(plan.micro_batches[static_cast<std::size_t>(a)], plan.micro_batches[static_cast<std::size_t>(b)]);
    return true;
  }

  bool reroute(Plan& plan) {
    AttentionGroup* group = any_group(plan, 2);
    if (group == nullptr || group->scheme != Scheme::ring) return false;
    group->routing_proxies = 1 + random_.pick(std::max(1, plan.cluster.gpus_per_node));
    group->routing_chunks = 1 << random_.pick(4);
    return true;
  }

  bool reorder_queue(Plan& plan) {
    const int m = any_micro_batch(plan);
    if (m < 0) return false;
    MicroBatch& micro_batch = plan.micro_batches[static_cast<std::size_t>(m)];
    micro_batch.queues = effective_queues(micro_batch, ranks_);
    auto& queue = micro_batch.queues[static_cast<std::size_t>(random_.pick(ranks_))];
    if (queue.size() < 2) return false;
    std::swap(queue[static_cast<std::size_t>(random_.pick(static_cast<int>(queue.size())))],
              queue[static_cast<std::size_t>(random_.pick(static_cast<int>(queue.size())))]);
    return true;
  }

  Random& random_;
  int ranks_;
};

/// How a simulation ended: the ratio step / bound, or a finding, or an invalid plan.
struct Outcome {
  bool valid = false;
  double ratio = INFINITY;
};

class Search {
 public:
  Search(const AdversaryOptions& options, AdversaryResult& result) : options_(options), result_(result) {}

  /// Simulates a plan (validated first); records findings.
  Outcome simulate_one(const Plan& plan, const Setting& setting) {
    if (!validate(plan, *setting.cost).ok) {
      ++result_.invalid;
      return {};
    }
    ++result_.simulated;
    try {
      const SimulationReport report = simulate(plan, *setting.cost, {.gradient_sync = setting.sync});
      const double ratio = report.lower_bound.time_s > 0 ? report.step_time_s / report.lower_bound.time_s : INFINITY;
      if (ratio < result_.closest_ratio || result_.closest.empty()) {
        result_.closest_ratio = ratio;
        result_.closest = fmt::format("{} from {}: step {:.9g} s, bound {:.9g} s ({})", setting.words,
                                      plan.strategy, report.step_time_s, report.lower_bound.time_s,
                                      report.lower_bound.binding);
      }
      return {true, ratio};
    } catch (const InternalError& error) {
      record_finding(plan, setting, error.what());
      return {true, 0.0};
    } catch (const InputError& error) {
      // A plan validate() accepted that the simulator refuses (queues that deadlock).
      ++result_.invalid;
      return {};
    }
  }

  bool done() const { return result_.simulated >= options_.simulations; }

 private:
  void record_finding(const Plan& plan, const Setting& setting, const std::string& what) {
    std::string where;
    if (!options_.findings_folder.empty()) {
      std::filesystem::create_directories(options_.findings_folder);
      const std::string path =
          fmt::format("{}/plan-{}.json", options_.findings_folder, result_.findings.size());
      std::ofstream(path) << plan_to_string(plan);
      where = " (plan written to " + path + ")";
    }
    result_.findings.push_back(fmt::format("{}: {}{}", setting.words, what, where));
  }

  const AdversaryOptions& options_;
  AdversaryResult& result_;
};

}  // namespace

AdversaryResult search_below_bounds(const AdversaryOptions& options) {
  AdversaryResult result;
  result.closest_ratio = INFINITY;
  Random random(options.seed);
  Search search(options, result);
  const std::vector<std::string> specs = strategy_specs();
  while (!search.done()) {
    Setting setting;
    try {
      setting = random_setting(random);
    } catch (const InputError&) {
      ++result.starts_rejected;
      continue;
    }
    const StrategySpec spec = parse_strategy_spec(random.element(specs));
    Plan plan;
    try {
      const SimulatorEvaluator evaluator(*setting.cost, setting.sync);
      plan = spec.planner->plan(make_batch(setting.lengths), *setting.cost, spec.options, evaluator);
    } catch (const InputError&) {
      ++result.starts_rejected;
      continue;
    }
    ++result.starts;
    Outcome current = search.simulate_one(plan, setting);
    if (!current.valid) continue;
    Mutator mutator(random, plan);
    for (int attempt = 0; attempt < options.mutations_per_start && !search.done(); ++attempt) {
      Plan candidate = plan;
      if (!mutator.mutate(candidate)) continue;
      const Outcome outcome = search.simulate_one(candidate, setting);
      // Keep edits that bring the step closer to the bound, and some others to wander.
      if (outcome.valid && (outcome.ratio <= current.ratio || random.chance(5))) {
        plan = std::move(candidate);
        current = outcome;
      }
    }
  }
  return result;
}

}  // namespace ballast::testing
