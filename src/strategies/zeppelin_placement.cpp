// zeppelin's two-level placement: a batch pre-split into micro-batches by work, each
// sequence placed in its tier's ring on the least-loaded GPUs (Placer), the micro-batch's
// ring and local groups; and the even-split ablation (zeppelin.hpp; docs/zeppelin.md).
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>

#include "ballast/error.hpp"
#include "builders.hpp"
#include "zeppelin.hpp"

namespace ballast::strategies::zeppelin {

namespace {

/// Fraction of the cluster's token capacity a pre-split micro-batch is filled to, so the
/// two-level placement has room to balance (the remainder absorbs chunk rounding).
constexpr double kMicroBatchFill = 0.9;

struct Item {
  std::int64_t id = 0;
  Tokens length = 0;
  Seconds work_s = 0;    ///< attention + linear, one GPU (tier selection)
  Seconds weight_s = 0;  ///< what the placement balances (attention, + linear without remap)
  TierChoice choice;
  int first_rank = -1;  ///< the ring's first rank (inter: first GPU of its first node)
  Seconds share_s = 0;  ///< load charged to each member of its ring
};

bool heavier(const Item& a, const Item& b) {
  if (a.weight_s != b.weight_s) return a.weight_s > b.weight_s;
  return a.id < b.id;
}

class Placer {
 public:
  /// `target_load_s`: the step's mean per-GPU work (tier selection).
  Placer(const CostModel& cost, const TierContext& context, Seconds target_load_s,
         Switches::Placement placement)
      : cost_(cost), context_(context), gpus_(context.gpus_per_node), nodes_(context.nodes),
        ranks_(gpus_ * nodes_), target_load_s_(target_load_s), placement_(placement),
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
    tokens_.assign(static_cast<std::size_t>(ranks_), 0);
    if (placement_ == Switches::Placement::node_totals) return place_by_node_totals(items, overflow);
    return place_per_gpu(items, overflow);
  }

 private:
  /// Issue 22's placement: what sets the step is each GPU's time, so every sequence,
  /// heaviest first (inter-node rings before the rest), takes the block of its ring's
  /// size with the least loaded member and token room on every member (whole consecutive
  /// nodes for an inter-node ring, an aligned block of g GPUs for an intra-node ring, one
  /// GPU for a local sequence), charging exactly those members; then GPUs left without
  /// attention work widen a ring or local sequence next to them (widen_into_idle).
  std::vector<Item> place_per_gpu(std::vector<Item>& items, std::vector<std::int64_t>& overflow) {
    by_load_.clear();
    for (int r = 0; r < ranks_; ++r) by_load_.insert({load_[static_cast<std::size_t>(r)], r});
    std::vector<Item> placed;
    for (const bool inter_pass : {true, false}) {
      for (Item item : items) {
        if ((item.choice.tier == Tier::inter_node) != inter_pass) continue;
        item.first_rank = item.choice.degree == 1 ? least_loaded_with_room(item.length)
                                                  : least_loaded_block(item);
        keep_or_overflow(item, placed, overflow);
      }
    }
    widen_into_idle(placed);
    return placed;
  }

  /// The least-loaded GPU with room for `length` tokens (ties: lowest rank), -1 if none.
  int least_loaded_with_room(Tokens length) const {
    for (const auto& [load, rank] : by_load_) {
      if (tokens_[static_cast<std::size_t>(rank)] + length <= context_.capacity_tokens_per_rank) {
        return rank;
      }
    }
    return -1;
  }

  /// First rank of the block for item's ring with the least maximum member load whose
  /// members all have room (ties: lowest rank), -1 if none: inter-node rings start at a
  /// node's first GPU, intra-node blocks at a multiple of their size (so never across nodes).
  int least_loaded_block(const Item& item) const {
    const int degree = item.choice.degree;
    const int stride = item.choice.tier == Tier::inter_node ? gpus_ : degree;
    const Tokens per_gpu = ceil_div(item.length, degree);
    int best = -1;
    Seconds best_load = 0;
    for (int b = 0; b + degree <= ranks_; b += stride) {
      Seconds load = 0;
      bool fits = true;
      for (int r = b; r < b + degree && fits; ++r) {
        const auto ur = static_cast<std::size_t>(r);
        fits = tokens_[ur] + per_gpu <= context_.capacity_tokens_per_rank;
        load = std::max(load, load_[ur]);
      }
      if (fits && (best < 0 || load < best_load)) {
        best = b;
        best_load = load;
      }
    }
    return best;
  }

  /// A member's load for `item` on a ring of `degree`: its share of the weight plus the
  /// communication the ring cannot hide by the cost model (zero where it hides).
  Seconds share_s(const Item& item, int degree) const {
    const TierChoice choice{degree == 1 ? Tier::local : Tier::intra_node, degree};
    const Seconds exposed_s =
        ring_member_time_s(context_, item.length, choice) - item.work_s / degree;
    return item.weight_s / degree + std::max(0.0, exposed_s);
  }

  /// GPUs of this micro-batch without attention work take half of a doubled ring: a local
  /// sequence or intra-node ring whose aligned buddy block (same size, same node) is idle
  /// doubles into it when that lowers the largest load of the two blocks. The item on the
  /// most loaded block goes first; repeated until no GPU is idle or no doubling pays.
  void widen_into_idle(std::vector<Item>& placed) {
    for (;;) {
      std::size_t best = placed.size();
      Seconds best_old_s = 0;
      for (std::size_t i = 0; i < placed.size(); ++i) {
        const Item& item = placed[i];
        const int degree = item.choice.degree;
        if (item.choice.tier == Tier::inter_node || 2 * degree > gpus_ ||
            gpus_ % (2 * degree) != 0 || item.length < 4 * degree) {
          continue;
        }
        const int buddy = item.first_rank ^ degree;  // aligned: first_rank % (2 degree) is 0 or degree
        Seconds old_s = 0;
        bool idle = true;
        for (int k = 0; k < degree; ++k) {
          idle = idle && tokens_[static_cast<std::size_t>(buddy + k)] == 0;
          old_s = std::max({old_s, load_[static_cast<std::size_t>(item.first_rank + k)],
                            load_[static_cast<std::size_t>(buddy + k)]});
        }
        if (!idle) continue;
        const Seconds wider_s = share_s(item, 2 * degree);
        Seconds new_s = 0;
        for (int k = 0; k < degree; ++k) {
          new_s = std::max({new_s,
                            load_[static_cast<std::size_t>(item.first_rank + k)] - item.share_s + wider_s,
                            load_[static_cast<std::size_t>(buddy + k)] + wider_s});
        }
        if (new_s < old_s && (best == placed.size() || old_s > best_old_s)) {
          best = i;
          best_old_s = old_s;
        }
      }
      if (best == placed.size()) return;
      Item& item = placed[best];
      charge(item, -1);
      item.first_rank = std::min(item.first_rank, item.first_rank ^ item.choice.degree);
      item.choice = {Tier::intra_node, 2 * item.choice.degree};
      item.share_s = share_s(item, item.choice.degree);
      charge(item, +1);
    }
  }

  /// The previous approximation (Switches::Placement::node_totals): node totals first (an
  /// inter-node ring on the k consecutive nodes with the least load, then everything else
  /// LPT over nodes), then GPUs inside each node.
  std::vector<Item> place_by_node_totals(std::vector<Item>& items,
                                         std::vector<std::int64_t>& overflow) {
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
    std::vector<Item> placed;
    for (std::size_t i = 0; i < items.size(); ++i) {
      Item item = items[i];
      if (item.choice.tier != Tier::inter_node) continue;
      item.first_rank = node_of_item[i] < 0 ? -1 : node_of_item[i] * gpus_;
      keep_or_overflow(item, placed, overflow);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      Item item = items[i];
      if (item.choice.tier == Tier::inter_node) continue;
      item.first_rank = node_of_item[i] < 0 ? -1 : place_in_node(item, node_of_item[i]);
      for (int n = 0; item.first_rank < 0 && n < nodes_; ++n) {
        if (n != node_of_item[i]) item.first_rank = place_in_node(item, n);
      }
      keep_or_overflow(item, placed, overflow);
    }
    return placed;
  }

  /// An item given its first rank: charged (an equal share of its weight on each member)
  /// and placed; one that found no room (first rank -1) goes to the next micro-batch.
  void keep_or_overflow(Item& item, std::vector<Item>& placed, std::vector<std::int64_t>& overflow) {
    if (item.first_rank < 0) {
      overflow.push_back(item.id);
      return;
    }
    item.share_s = item.weight_s / item.choice.degree;
    charge(item, +1);
    placed.push_back(item);
  }

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

  /// Adds (sign +1) or removes (-1) item's share and tokens on its ring's members, keeping
  /// the per-GPU placement's load order.
  void charge(const Item& item, int sign) {
    const int degree = item.choice.degree;
    for (int r = item.first_rank; r < item.first_rank + degree; ++r) {
      const auto ur = static_cast<std::size_t>(r);
      const bool ordered = by_load_.erase({load_[ur], r}) > 0;
      load_[ur] += sign * item.share_s;
      tokens_[ur] += sign * ceil_div(item.length, degree);
      if (ordered) by_load_.insert({load_[ur], r});
    }
  }

  const CostModel& cost_;
  const TierContext& context_;
  int gpus_, nodes_, ranks_;
  Seconds target_load_s_;
  Switches::Placement placement_;
  std::vector<Seconds> load_;  ///< work placed on each GPU so far in the step
  std::vector<Tokens> tokens_;  ///< tokens on each GPU in the current micro-batch
  std::set<std::pair<Seconds, int>> by_load_;  ///< (load, rank), per-GPU placement only
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

}  // namespace

Plan hierarchical_plan(const Batch& batch, const CostModel& cost, const TierContext& context,
                       bool balance_linear, Switches::Placement placement,
                       const std::string& label) {
  Plan plan = make_plan_skeleton(batch, cost, label);
  Seconds total_work_s = 0;
  for (Tokens length : batch.lengths_tokens) total_work_s += attention_s(cost, length) + linear_s(cost, length);
  Placer placer(cost, context, total_work_s / cost.cluster().ranks(), placement);
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

}  // namespace ballast::strategies::zeppelin
