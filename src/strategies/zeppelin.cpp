// zeppelin: hierarchical partitioning with the attention engine's queues, routing and
// remapping (zeppelin.hpp; docs/zeppelin.md). Candidate plans that differ in what the
// placement balances and whether linear modules are remapped are compared by the
// PlanEvaluator the caller hands the planner (the simulator), so a technique is kept only
// where the simulator says it pays.
#include "zeppelin.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "ballast/error.hpp"
#include "ballast/text.hpp"
#include "builders.hpp"
#include "zeppelin_remap.hpp"

namespace ballast::strategies::zeppelin {

namespace {

/// Fraction of the cluster's token capacity a pre-split micro-batch is filled to, so the
/// two-level placement has room to balance (the remainder absorbs chunk rounding).
constexpr double kMicroBatchFill = 0.9;
constexpr int kRoutingChunkChoices[] = {1, 2, 4, 8, 16};

Seconds attention_s(const CostModel& cost, Tokens length) {
  const AttentionBlock block = whole_document(length);
  return cost.attention_time_s({&block, 1}, 1, Pass::forward) +
         cost.attention_time_s({&block, 1}, 1, Pass::backward);
}

Seconds linear_s(const CostModel& cost, Tokens tokens) {
  return cost.linear_time_s(tokens, Pass::forward) + cost.linear_time_s(tokens, Pass::backward);
}

/// Forward attention of one zigzag ring step of a member holding c tokens: its two chunks
/// of c/2 against the owner's two, of which two pairs of chunks are fully visible.
Seconds ring_step_attention_s(const CostModel& cost, Tokens c) {
  const Tokens half = std::max<Tokens>(1, c / 2);
  const AttentionBlock blocks[] = {{2 * half, 3 * half, 0, half}, {3 * half, 4 * half, half, 2 * half}};
  return cost.attention_time_s(blocks, 1, Pass::forward);
}

/// Smallest c in [1, 2^30] with ring_step_attention(c) >= hop(c) (binary search on the
/// cost model; attention grows as c^2 and a hop as c, so the difference changes sign once
/// up to tile rounding). 2^30 when even that does not hide the hop.
template <typename Hop>
Tokens crossover_tokens(const CostModel& cost, Hop hop) {
  Tokens low = 1, high = Tokens{1} << 30;
  if (ring_step_attention_s(cost, high) < hop(high)) return high;
  while (low < high) {
    const Tokens mid = low + (high - low) / 2;
    if (ring_step_attention_s(cost, mid) >= hop(mid)) high = mid;
    else low = mid + 1;
  }
  return low;
}

std::vector<int> power_of_two_divisors(int value) {
  std::vector<int> out;
  for (int d = 2; d <= value; d *= 2) {
    if (value % d == 0) out.push_back(d);
  }
  return out;
}

// ---- hierarchical placement ----

struct Item {
  std::int64_t id = 0;
  Tokens length = 0;
  Seconds work_s = 0;    ///< attention + linear, one GPU (tier selection)
  Seconds weight_s = 0;  ///< what the placement balances (attention, + linear without remap)
  TierChoice choice;
  int first_rank = -1;  ///< the ring's first rank (inter: first GPU of its first node)
};

bool heavier(const Item& a, const Item& b) {
  if (a.weight_s != b.weight_s) return a.weight_s > b.weight_s;
  return a.id < b.id;
}

class Placer {
 public:
  /// `target_load_s`: the step's mean per-GPU work (tier selection).
  Placer(const CostModel& cost, const TierContext& context, Seconds target_load_s)
      : cost_(cost), context_(context), gpus_(context.gpus_per_node), nodes_(context.nodes),
        ranks_(gpus_ * nodes_), target_load_s_(target_load_s),
        load_(static_cast<std::size_t>(ranks_), 0) {}

  /// Places as many of `ids` as fit into the next micro-batch; the rest go to `overflow`.
  /// Loads carry over from earlier micro-batches (they are not barriers: a GPU's step is
  /// the sum of its micro-batches), token counts do not.
  std::vector<Item> place(const std::vector<std::int64_t>& ids, const Batch& batch,
                          bool balance_linear, std::vector<std::int64_t>& overflow) {
    std::vector<Item> items;
    for (std::int64_t id : ids) {
      Item item;
      item.id = id;
      item.length = batch.lengths_tokens[static_cast<std::size_t>(id)];
      const Seconds attention = attention_s(cost_, item.length);
      const Seconds linear = linear_s(cost_, item.length);
      item.work_s = attention + linear;
      item.weight_s = attention + (balance_linear ? linear : 0.0);
      items.push_back(item);
    }
    for (Item& item : items) {
      item.choice = choose_tier(item.id, item.length, target_load_s_, context_);
    }
    std::sort(items.begin(), items.end(), heavier);

    // Level 1 (nodes): inter-node rings on the k consecutive nodes with the least load, then
    // everything else LPT over nodes, both under the nodes' token capacity.
    const Tokens node_capacity = gpus_ * context_.capacity_tokens_per_rank;
    std::vector<Seconds> node_load(static_cast<std::size_t>(nodes_), 0);
    for (int r = 0; r < ranks_; ++r) node_load[static_cast<std::size_t>(r / gpus_)] += load_[static_cast<std::size_t>(r)];
    std::vector<Tokens> node_tokens(static_cast<std::size_t>(nodes_), 0);
    std::vector<int> node_of_item(items.size(), -1);
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& item = items[i];
      if (item.choice.tier != Tier::inter_node) continue;
      const int k = item.choice.degree / gpus_;
      const Tokens per_node = gpus_ * ceil_div(item.length, item.choice.degree);
      int best = -1;
      Seconds best_load = 0;
      for (int a = 0; a + k <= nodes_; ++a) {
        Seconds load = 0;
        bool fits = true;
        for (int n = a; n < a + k; ++n) {
          fits = fits && node_tokens[static_cast<std::size_t>(n)] + per_node <= node_capacity;
          load = std::max(load, node_load[static_cast<std::size_t>(n)]);
        }
        if (fits && (best < 0 || load < best_load)) {
          best = a;
          best_load = load;
        }
      }
      if (best < 0) continue;
      node_of_item[i] = best;
      for (int n = best; n < best + k; ++n) {
        node_load[static_cast<std::size_t>(n)] += item.weight_s / k;
        node_tokens[static_cast<std::size_t>(n)] += per_node;
      }
    }
    // The least-loaded node with room (ties: lowest index): nodes ordered by load, so the
    // first with room is usually the first looked at (a scan of every node per sequence
    // dominated planning at 512 nodes and 10^5 sequences).
    std::set<std::pair<Seconds, int>> nodes_by_load;
    for (int n = 0; n < nodes_; ++n) {
      nodes_by_load.insert({node_load[static_cast<std::size_t>(n)], n});
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      const Item& item = items[i];
      if (item.choice.tier == Tier::inter_node) continue;
      auto best = nodes_by_load.begin();
      while (best != nodes_by_load.end() &&
             node_tokens[static_cast<std::size_t>(best->second)] + item.length > node_capacity) {
        ++best;
      }
      if (best == nodes_by_load.end()) continue;
      const int node = best->second;
      const auto un = static_cast<std::size_t>(node);
      node_of_item[i] = node;
      nodes_by_load.erase(best);
      node_load[un] += item.weight_s;
      node_tokens[un] += item.length;
      nodes_by_load.insert({node_load[un], node});
    }

    // Level 2 (GPUs): inter-node rings take every GPU of their nodes; then, node by node
    // in item order, intra-node rings on the aligned block of g GPUs with the least load
    // and local sequences on the least-loaded GPU, under each GPU's token capacity.
    tokens_.assign(static_cast<std::size_t>(ranks_), 0);
    std::vector<Item> placed;
    for (std::size_t i = 0; i < items.size(); ++i) {
      Item item = items[i];
      if (item.choice.tier != Tier::inter_node) continue;
      if (node_of_item[i] < 0) {
        overflow.push_back(item.id);
        continue;
      }
      item.first_rank = node_of_item[i] * gpus_;
      charge(item, item.first_rank, item.choice.degree);
      placed.push_back(item);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      Item item = items[i];
      if (item.choice.tier == Tier::inter_node) continue;
      item.first_rank = node_of_item[i] < 0 ? -1 : place_in_node(item, node_of_item[i]);
      for (int n = 0; item.first_rank < 0 && n < nodes_; ++n) {
        if (n != node_of_item[i]) item.first_rank = place_in_node(item, n);
      }
      if (item.first_rank < 0) {
        overflow.push_back(item.id);
        continue;
      }
      charge(item, item.first_rank, item.choice.degree);
      placed.push_back(item);
    }
    return placed;
  }

 private:
  /// First rank of the best block of item.choice.degree GPUs in `node`, -1 if none fits.
  int place_in_node(const Item& item, int node) const {
    const int degree = item.choice.degree;
    const Tokens per_gpu = ceil_div(item.length, degree);
    int best = -1;
    Seconds best_load = 0;
    for (int b = node * gpus_; b + degree <= (node + 1) * gpus_; b += degree) {
      Seconds load = 0;
      bool fits = true;
      for (int r = b; r < b + degree; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        fits = fits && tokens_[ur] + per_gpu <= context_.capacity_tokens_per_rank;
        load = std::max(load, load_[ur]);
      }
      if (fits && (best < 0 || load < best_load)) {
        best = b;
        best_load = load;
      }
    }
    return best;
  }

  void charge(const Item& item, int first_rank, int degree) {
    for (int r = first_rank; r < first_rank + degree; ++r) {
      load_[static_cast<std::size_t>(r)] += item.weight_s / degree;
      tokens_[static_cast<std::size_t>(r)] += ceil_div(item.length, degree);
    }
  }

  const CostModel& cost_;
  const TierContext& context_;
  int gpus_, nodes_, ranks_;
  Seconds target_load_s_;
  std::vector<Seconds> load_;  ///< work placed on each GPU so far in the step
  std::vector<Tokens> tokens_;  ///< tokens on each GPU in the current micro-batch
};

/// A ring group over `ranks` holding `ids`, each zigzag-split without padding (one rank:
/// a local group).
AttentionGroup ring_group(const std::vector<int>& ranks, const std::vector<std::int64_t>& ids,
                          const Plan& plan) {
  AttentionGroup group;
  group.ranks = ranks;
  group.scheme = ranks.size() == 1 ? Scheme::local : Scheme::ring;
  std::vector<int> rotated = ranks;
  for (std::int64_t id : ids) {
    const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
    if (ranks.size() == 1) {
      group.sequences.push_back(whole_sequence(id, length, ranks[0]));
    } else {
      // Each sequence starts its zigzag one member further, so the members' remainder
      // tokens (unpadded chunks differ by one) do not all land on the first member.
      group.sequences.push_back({id, length, zigzag_chunks_unpadded(length, rotated)});
      std::rotate(rotated.begin(), rotated.begin() + 1, rotated.end());
    }
  }
  return group;
}

/// Micro-batch of placed items: inter-node rings (one group per node range), intra-node
/// rings (one per GPU block), one local group per GPU, in that order.
MicroBatch build_micro_batch(const std::vector<Item>& items, const Plan& plan) {
  std::map<std::pair<int, int>, std::vector<std::int64_t>> inter, intra;
  std::map<int, std::vector<std::int64_t>> local;
  for (const Item& item : items) {
    const std::pair<int, int> key{item.first_rank, item.choice.degree};
    switch (item.choice.tier) {
      case Tier::inter_node: inter[key].push_back(item.id); break;
      case Tier::intra_node: intra[key].push_back(item.id); break;
      case Tier::local: local[item.first_rank].push_back(item.id); break;
    }
  }
  MicroBatch micro_batch;
  for (const auto* rings : {&inter, &intra}) {
    for (const auto& [key, ids] : *rings) {
      micro_batch.groups.push_back(ring_group(consecutive_ranks(key.first, key.second), ids, plan));
    }
  }
  for (const auto& [rank, ids] : local) micro_batch.groups.push_back(ring_group({rank}, ids, plan));
  return micro_batch;
}

/// Splits the batch into micro-batches by LPT on work under kMicroBatchFill of the
/// cluster's token capacity (one micro-batch when everything fits).
std::vector<std::vector<std::int64_t>> pre_split(const Batch& batch, const CostModel& cost,
                                                 Tokens capacity_tokens_per_rank) {
  const auto& lengths = batch.lengths_tokens;
  const Tokens total = std::accumulate(lengths.begin(), lengths.end(), Tokens{0});
  const auto budget = static_cast<Tokens>(kMicroBatchFill * static_cast<double>(
                                              capacity_tokens_per_rank * cost.cluster().ranks()));
  const auto bins = static_cast<std::size_t>(std::max<Tokens>(1, ceil_div(total, std::max<Tokens>(1, budget))));
  std::vector<std::int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<Seconds> work(lengths.size());
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    work[i] = attention_s(cost, lengths[i]) + linear_s(cost, lengths[i]);
  }
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return work[static_cast<std::size_t>(a)] > work[static_cast<std::size_t>(b)];
  });
  std::vector<std::vector<std::int64_t>> split(bins);
  std::vector<Seconds> bin_work(bins, 0);
  std::vector<Tokens> bin_tokens(bins, 0);
  for (std::int64_t id : order) {
    const Tokens length = lengths[static_cast<std::size_t>(id)];
    std::size_t best = bins;
    for (std::size_t b = 0; b < split.size(); ++b) {
      if (bin_tokens[b] + length > budget && bin_tokens[b] > 0) continue;
      if (best == bins || bin_work[b] < bin_work[best]) best = b;
    }
    if (best == bins) {  // every bin full: open one more
      split.emplace_back();
      bin_work.push_back(0);
      bin_tokens.push_back(0);
      best = split.size() - 1;
    }
    split[best].push_back(id);
    bin_work[best] += work[static_cast<std::size_t>(id)];
    bin_tokens[best] += length;
  }
  std::erase_if(split, [](const auto& ids) { return ids.empty(); });
  return split;
}

Plan hierarchical_plan(const Batch& batch, const CostModel& cost, const TierContext& context,
                       bool balance_linear, const std::string& label) {
  Plan plan = make_plan_skeleton(batch, cost, label);
  Seconds total_work_s = 0;
  for (Tokens length : batch.lengths_tokens) total_work_s += attention_s(cost, length) + linear_s(cost, length);
  Placer placer(cost, context, total_work_s / cost.cluster().ranks());
  std::vector<std::vector<std::int64_t>> pending =
      pre_split(batch, cost, context.capacity_tokens_per_rank);
  std::int64_t chunks = 0;
  std::int64_t ring_steps = 0;
  for (std::size_t m = 0; m < pending.size(); ++m) {
    std::vector<std::int64_t> overflow;
    const std::vector<Item> placed = placer.place(pending[m], batch, balance_linear, overflow);
    if (placed.empty()) {
      throw PlanningError(fmt::format("{} could not place sequence {} on an empty cluster",
                                      label, pending[m].front()));
    }
    for (const Item& item : placed) {
      const int degree = item.choice.degree;
      chunks += degree == 1 ? 1 : std::min<Tokens>(item.length, 2 * degree);
    }
    check_plan_chunks(chunks, label, "sequences cut into 2 x their ring size");
    plan.micro_batches.push_back(build_micro_batch(placed, plan));
    for (const AttentionGroup& group : plan.micro_batches.back().groups) {
      const auto size = static_cast<std::int64_t>(group.ranks.size());
      if (size > 1) ring_steps += size * size;
    }
    check_ring_steps(ring_steps, label, "its intra- and inter-node rings");
    if (overflow.empty()) continue;
    std::sort(overflow.begin(), overflow.end());
    if (m + 1 == pending.size()) pending.emplace_back();
    pending[m + 1].insert(pending[m + 1].end(), overflow.begin(), overflow.end());
  }
  return plan;
}

/// Partitioning replaced by even splitting (the ablation): TE CP's static rings of d
/// consecutive ranks and token-balanced packs dealt round-robin, but zigzag without padding.
Plan even_plan(const Batch& batch, const CostModel& cost, std::optional<int> degree,
               const std::string& label) {
  Plan plan = make_plan_skeleton(batch, cost, label);
  PlannerOptions options;
  options.degree = degree;
  const int d = resolve_degree(batch, cost, options, Scheme::ring, label);
  std::int64_t chunks = 0;  // unpadded zigzag: min(length, 2d) non-empty chunks
  for (const Tokens length : batch.lengths_tokens) {
    chunks += d == 1 ? 1 : std::min<Tokens>(length, 2 * d);
  }
  check_plan_chunks(chunks, label, fmt::format("every sequence cut into up to 2 x {} chunks", d));
  const Tokens capacity = d * usable_tokens_per_rank(cost, Scheme::ring, d);
  // A sequence occupies d * ceil(s / d): its largest member share on every member.
  std::vector<PackItem> items;
  for (std::size_t id = 0; id < batch.lengths_tokens.size(); ++id) {
    items.push_back({static_cast<std::int64_t>(id), d * ceil_div(batch.lengths_tokens[id], d)});
  }
  const std::vector<Pack> packs = balanced_packs(items, capacity, cost.cluster().ranks() / d);
  if (d > 1) {
    const auto rings = static_cast<std::int64_t>(packs.size());
    check_ring_steps(rings * d * d, label, fmt::format("{} rings of {} GPUs", rings, d));
  }
  deal_packs_round_robin(plan, packs, d, [&](const Pack& pack, const std::vector<int>& ranks) {
    return ring_group(ranks, pack, plan);
  });
  return plan;
}

/// Engine order: inter-node rings, intra-node rings, local; explicit queues; routing on
/// inter-node rings where it pays.
void finish_micro_batches(Plan& plan, const CostModel& cost, const PlanEvaluator& evaluator,
                          Switches::Mode routing) {
  const Cluster& cluster = cost.cluster();
  const Bytes kv_bytes = cost.model().kv_bytes_per_token();
  for (MicroBatch& micro_batch : plan.micro_batches) {
    auto tier_of = [&](const AttentionGroup& group) {
      if (group.ranks.size() == 1) return 2;
      return cluster.same_node(group.ranks.front(), group.ranks.back()) ? 1 : 0;
    };
    std::stable_sort(micro_batch.groups.begin(), micro_batch.groups.end(),
                     [&](const AttentionGroup& a, const AttentionGroup& b) {
                       return tier_of(a) < tier_of(b);
                     });
    micro_batch.queues.assign(static_cast<std::size_t>(cluster.ranks()), {});
    for (std::size_t g = 0; g < micro_batch.groups.size(); ++g) {
      AttentionGroup& group = micro_batch.groups[g];
      for (int rank : group.ranks) micro_batch.queues[static_cast<std::size_t>(rank)].push_back(static_cast<int>(g));
      if (tier_of(group) != 0 || routing == Switches::Mode::off) continue;
      // The first inter-node hop of the ring (ranks are node-major and consecutive).
      std::size_t hop = 0;
      while (cluster.same_node(group.ranks[hop], group.ranks[(hop + 1) % group.ranks.size()])) ++hop;
      Tokens most = 0;
      std::map<int, Tokens> held;
      for (const SequenceChunks& sequence : group.sequences) {
        for (const Chunk& chunk : sequence.chunks) most = std::max(most, held[chunk.rank] += chunk.size());
      }
      const int src = group.ranks[hop];
      const int dst = group.ranks[(hop + 1) % group.ranks.size()];
      Routing chosen = choose_routing(cost, evaluator, kv_bytes * most, src, dst);
      if (routing == Switches::Mode::on && chosen.proxies == 1 && cluster.nics_per_node > 1) {
        chosen = {cluster.nics_per_node, 4};
      }
      group.routing_proxies = chosen.proxies;
      group.routing_chunks = chosen.chunks;
    }
  }
}

/// Attaches the token-balanced layout to every micro-batch where it moves tokens and the
/// ranks' memory still fits (a rank with few attention tokens but a ring's buffers may not
/// take its full share of linear tokens).
Plan with_remap(Plan plan, const CostModel& cost) {
  for (MicroBatch& micro_batch : plan.micro_batches) {
    micro_batch.linear_layout = balanced_linear_layout(micro_batch, plan.cluster);
    if (remap_moves(micro_batch, micro_batch.linear_layout).empty()) {
      micro_batch.linear_layout.clear();
      continue;
    }
    const std::vector<Bytes> peak = peak_memory_bytes_per_rank(plan, cost);
    if (*std::max_element(peak.begin(), peak.end()) > cost.memory_limit_bytes()) {
      micro_batch.linear_layout.clear();
    }
  }
  return plan;
}

}  // namespace

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::local: return "local";
    case Tier::intra_node: return "intra-node";
    case Tier::inter_node: return "inter-node";
  }
  return "?";
}

Routing choose_routing(const CostModel& cost, const PlanEvaluator& evaluator, Bytes bytes_per_layer,
                       int src_rank, int dst_rank) {
  const Cluster& cluster = cost.cluster();
  Routing best;
  Seconds best_s = std::numeric_limits<Seconds>::infinity();
  if (cluster.same_node(src_rank, dst_rank)) return best;
  for (int proxies = 1; proxies <= cluster.nics_per_node; proxies *= 2) {
    for (int chunks : kRoutingChunkChoices) {
      if (proxies == 1 && chunks > 1) break;  // a direct transfer is never cut
      const Seconds time_s =
          evaluator.transfer_time_s(bytes_per_layer, src_rank, dst_rank, proxies, chunks) +
          evaluator.transfer_time_s(2 * bytes_per_layer, src_rank, dst_rank, proxies, chunks);
      if (time_s < best_s) {
        best_s = time_s;
        best = {proxies, chunks};
      }
    }
  }
  return best;
}

Crossovers find_crossovers(const CostModel& cost, const PlanEvaluator& evaluator) {
  const Cluster& cluster = cost.cluster();
  const Bytes kv = cost.model().kv_bytes_per_token();
  Crossovers out;
  if (cluster.gpus_per_node > 1) {
    out.intra_node_tokens_per_rank =
        crossover_tokens(cost, [&](Tokens c) { return cost.p2p_time_s(kv * c, 0, 1); });
  }
  if (cluster.nodes > 1) {
    const int src = cluster.gpus_per_node - 1, dst = cluster.gpus_per_node;
    out.inter_node_tokens_per_rank =
        crossover_tokens(cost, [&](Tokens c) { return cost.p2p_time_s(kv * c, src, dst); });
    out.inter_node_routed_tokens_per_rank = crossover_tokens(cost, [&](Tokens c) {
      const Routing routing = choose_routing(cost, evaluator, kv * c, src, dst);
      return evaluator.transfer_time_s(kv * c, src, dst, routing.proxies, routing.chunks);
    });
  }
  Tokens low = 1, high = kMaxSequenceTokens;
  while (low < high) {
    const Tokens mid = low + (high - low) / 2;
    const AttentionBlock block = whole_document(mid);
    if (cost.attention_time_s({&block, 1}, 1, Pass::forward) >= cost.linear_time_s(mid, Pass::forward)) {
      high = mid;
    } else {
      low = mid + 1;
    }
  }
  out.attention_over_linear_tokens = low;
  return out;
}

TierContext make_tier_context(const CostModel& cost, const PlanEvaluator& evaluator,
                              const Switches& switches) {
  TierContext context;
  context.crossovers = find_crossovers(cost, evaluator);
  context.capacity_tokens_per_rank = usable_tokens_per_rank(cost, Scheme::ring, 2);
  context.gpus_per_node = cost.cluster().gpus_per_node;
  context.nodes = cost.cluster().nodes;
  context.routing = switches.routing != Switches::Mode::off;
  context.cost = &cost;
  context.evaluator = &evaluator;
  return context;
}

namespace {

/// One member's time in a ring of `choice.degree` ranks for a sequence of `length`
/// tokens: per pass, degree steps of max(the step's share of the attention, one KV hop of
/// the tier's link: NVLink, or the NIC with the best routing), plus its share of the linear
/// modules. A local "ring" is the whole work.
Seconds member_time_s(const TierContext& context, Tokens length, TierChoice choice) {
  const CostModel& cost = *context.cost;
  const Seconds linear = linear_s(cost, length) / choice.degree;
  const AttentionBlock whole = whole_document(length);
  const Seconds forward = cost.attention_time_s({&whole, 1}, 1, Pass::forward);
  const Seconds backward = cost.attention_time_s({&whole, 1}, 1, Pass::backward);
  if (choice.degree == 1) return forward + backward + linear;
  const auto degree = static_cast<double>(choice.degree);
  const Bytes bytes = cost.model().kv_bytes_per_token() * ceil_div(length, choice.degree);
  const int gpus = context.gpus_per_node;
  const auto hop_s = [&](Bytes b) {
    if (choice.tier == Tier::intra_node) return cost.p2p_time_s(b, 0, 1);
    const auto [memo, missing] = context.inter_node_hop_s.try_emplace(b, 0.0);
    if (missing) {
      const PlanEvaluator& evaluator = *context.evaluator;
      const Routing routing =
          context.routing ? choose_routing(cost, evaluator, b, gpus - 1, gpus) : Routing{};
      memo->second = evaluator.transfer_time_s(b, gpus - 1, gpus, routing.proxies, routing.chunks);
    }
    return memo->second;
  };
  return degree * std::max(forward / (degree * degree), hop_s(bytes)) +
         degree * std::max(backward / (degree * degree), hop_s(2 * bytes)) + linear;
}

}  // namespace

TierChoice choose_tier(std::int64_t sequence_id, Tokens length_tokens, Seconds target_load_s,
                       const TierContext& context) {
  const Tokens capacity = context.capacity_tokens_per_rank;
  const int gpus = context.gpus_per_node;
  const Tokens inter_hide = context.routing ? context.crossovers.inter_node_routed_tokens_per_rank
                                            : context.crossovers.inter_node_tokens_per_rank;
  struct Candidate {
    TierChoice choice;
    bool hides;
  };
  // Candidates in order, made on demand: local, the intra-node rings, then an inter-node
  // ring over k = 2 .. nodes nodes (a list of them cost O(nodes) per sequence, which at
  // 512 nodes and 10^5 sequences dominated planning).
  const std::vector<int> intra_degrees = power_of_two_divisors(gpus);
  const std::size_t candidate_count =
      1 + intra_degrees.size() + static_cast<std::size_t>(std::max(0, context.nodes - 1));
  const auto candidate = [&](std::size_t index) -> Candidate {
    if (index == 0) return {{Tier::local, 1}, true};
    if (index <= intra_degrees.size()) {
      const int g = intra_degrees[index - 1];
      const bool hides = length_tokens / g >= context.crossovers.intra_node_tokens_per_rank;
      return {{Tier::intra_node, g}, hides};
    }
    const int k = static_cast<int>(index - intra_degrees.size()) + 1;
    return {{Tier::inter_node, k * gpus}, length_tokens / (k * gpus) >= inter_hide};
  };
  const auto fits = [&](const Candidate& c) {
    return ceil_div(length_tokens, c.choice.degree) <= capacity;
  };
  // 1. The cheapest tier that hides its traffic and brings the sequence under the target.
  const Seconds work_s = attention_s(*context.cost, length_tokens) + linear_s(*context.cost, length_tokens);
  for (std::size_t i = 0; i < candidate_count; ++i) {
    const Candidate c = candidate(i);
    if (c.hides && fits(c) && work_s / c.choice.degree <= target_load_s) return c.choice;
  }
  // 2. A straggler, when stragglers are spread: the smallest ring whose member finishes
  //    within the target by the cost model, exposed communication included, else the
  //    ring whose member finishes first.
  if (context.spread_stragglers) {
    std::optional<TierChoice> fastest;
    Seconds fastest_s = 0;
    for (std::size_t i = 0; i < candidate_count; ++i) {
      const Candidate c = candidate(i);
      if (!fits(c)) continue;
      const Seconds time_s = member_time_s(context, length_tokens, c.choice);
      if (time_s <= target_load_s) return c.choice;
      if (!fastest || time_s < fastest_s) {
        fastest = c.choice;
        fastest_s = time_s;
      }
    }
    if (fastest) return *fastest;
  }
  // 3. Otherwise the widest ring that hides its traffic, else (memory forces a split that
  //    cannot hide) the smallest ring that fits.
  std::optional<TierChoice> widest_hiding;
  for (std::size_t i = 0; i < candidate_count; ++i) {
    const Candidate c = candidate(i);
    if (c.hides && fits(c)) widest_hiding = c.choice;
  }
  if (widest_hiding) return *widest_hiding;
  for (std::size_t i = 0; i < candidate_count; ++i) {
    const Candidate c = candidate(i);
    if (fits(c)) return c.choice;
  }
  throw PlanningError(fmt::format(
      "zeppelin cannot run sequence {} ({} tokens): a ring over all {} GPUs holds {} tokens; "
      "lower --max-context or add --nodes",
      sequence_id, with_thousands(length_tokens), gpus * context.nodes,
      with_thousands(capacity * gpus * context.nodes)));
}

Plan plan_zeppelin(const Batch& batch, const CostModel& cost, const PlanEvaluator& evaluator,
                   const Switches& switches, std::optional<int> even_degree,
                   const std::string& label) {
  if (batch.lengths_tokens.empty()) return make_plan_skeleton(batch, cost, label);  // throws
  std::vector<Plan> candidates;
  const bool remap_only = switches.remap == Switches::Mode::on;
  if (switches.hierarchical) {
    TierContext context = make_tier_context(cost, evaluator, switches);
    for (bool spread : {false, true}) {
      context.spread_stragglers = spread;
      candidates.push_back(hierarchical_plan(batch, cost, context, true, label));
      if (switches.remap != Switches::Mode::off) {
        candidates.push_back(hierarchical_plan(batch, cost, context, false, label));
      }
    }
  } else {
    candidates.push_back(even_plan(batch, cost, even_degree, label));
  }
  for (Plan& plan : candidates) finish_micro_batches(plan, cost, evaluator, switches.routing);
  if (switches.routing == Switches::Mode::auto_) {
    // The routing choice prices each transfer alone; in a busy ring the proxies' NVLink
    // ports also carry their own ring hops. Each routed candidate therefore gets an
    // unrouted twin, placed before it, so routing is kept only where the whole simulated
    // step is faster with it.
    std::vector<Plan> with_twins;
    for (Plan& plan : candidates) {
      Plan direct = plan;
      bool routed = false;
      for (MicroBatch& micro_batch : direct.micro_batches) {
        for (AttentionGroup& group : micro_batch.groups) {
          routed = routed || group.routing_proxies > 1;
          group.routing_proxies = 1;
          group.routing_chunks = 1;
        }
      }
      if (routed) with_twins.push_back(std::move(direct));
      with_twins.push_back(std::move(plan));
    }
    candidates = std::move(with_twins);
  }
  if (switches.remap != Switches::Mode::off) {
    const std::size_t plain = candidates.size();
    for (std::size_t i = 0; i < plain; ++i) candidates.push_back(with_remap(candidates[i], cost));
    if (remap_only) candidates.erase(candidates.begin(), candidates.begin() + static_cast<std::ptrdiff_t>(plain));
  }
  // Keep the fastest valid candidate by the evaluator (ties: the earlier, simpler one); each
  // candidate is validated once, here. The unremapped and unrouted candidates come first,
  // so a remap or a routing is kept only when it pays.
  const Plan* best = nullptr;
  Seconds best_s = 0;
  std::string first_problem;
  for (const Plan& plan : candidates) {
    const ValidationResult validation = validate(plan, cost);
    if (!validation.ok) {
      if (first_problem.empty()) first_problem = validation.message;
      continue;
    }
    const Seconds step_s = evaluator.step_time_s(plan);
    if (best == nullptr || step_s < best_s) {
      best = &plan;
      best_s = step_s;
    }
  }
  if (best == nullptr) {
    throw InternalError(fmt::format("{} made no valid plan: {}", label, first_problem));
  }
  return *best;
}

namespace {

Switches::Mode mode_of(const PlannerOptions& options, const std::string& key) {
  const std::string value = parameter_or(options, key, "auto");
  if (value == "auto") return Switches::Mode::auto_;
  if (value == "off") return Switches::Mode::off;
  if (value == "on") return Switches::Mode::on;
  throw InputError(fmt::format("strategy parameter {}={}: use auto, on or off", key, value));
}

Switches switches_of(const PlannerOptions& options) {
  Switches switches;
  const std::string partition = parameter_or(options, "partition", "hierarchical");
  if (partition != "hierarchical" && partition != "even") {
    throw InputError(fmt::format(
        "strategy parameter partition={}: use hierarchical (Zeppelin's tiers) or even (every "
        "sequence split over static rings, the ablation)",
        partition));
  }
  switches.hierarchical = partition == "hierarchical";
  switches.routing = mode_of(options, "routing");
  switches.remap = mode_of(options, "remap");
  if (options.degree && switches.hierarchical) {
    throw InputError(
        "zeppelin takes a degree only with partition=even (the hierarchical partition picks "
        "each sequence's ring); drop --degree / degree= or add partition=even");
  }
  return switches;
}

class ZeppelinPlanner final : public Planner {
 public:
  std::string name() const override { return "zeppelin"; }
  std::string description() const override {
    return "Zeppelin: sequences in the cheapest tier that hides their traffic (local / "
           "intra-node ring / inter-node ring), NIC routing, token-balanced remap";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {{"partition", "hierarchical (default) or even: every sequence zigzag-split over "
                          "static rings of d GPUs (the ablation of the partitioning)"},
            {"routing", "auto (default: inter-node ring transfers over proxy GPUs' NICs where "
                        "it pays), on (always all NICs) or off"},
            {"remap", "auto (default: token-balanced linear layout where it pays), on or off"},
            {"degree", "ring size with partition=even (default: the smallest power of two "
                       "holding the longest sequence)"}};
  }
  void check_options(const PlannerOptions& options) const override { switches_of(options); }
  /// Hierarchical: a ring over every GPU of the cluster, the ring budget per rank, no
  /// padding. Even: the static rings resolve_degree allows (static-cp's limit).
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    if (!switches_of(options).hierarchical) {
      return longest_sequence_tokens_at_degree(cost, options, Scheme::ring, name());
    }
    return usable_tokens_per_rank(cost, Scheme::ring, 2) * cost.cluster().ranks();
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& evaluator) const override {
    return plan_zeppelin(batch, cost, evaluator, switches_of(options), options.degree, name());
  }
};

}  // namespace

}  // namespace ballast::strategies::zeppelin

namespace ballast::strategies {
std::unique_ptr<Planner> make_zeppelin_planner() {
  return std::make_unique<zeppelin::ZeppelinPlanner>();
}
}  // namespace ballast::strategies
