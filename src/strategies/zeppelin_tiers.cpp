// zeppelin's tiers: the crossovers (the shortest per-member share whose ring step hides its
// KV hop, per link), the routing choice for an inter-node transfer, and each sequence's tier
// and ring size (zeppelin.hpp; docs/zeppelin.md, "Tiers" and "Routing layer").
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include "ballast/error.hpp"
#include "ballast/text.hpp"
#include "builders.hpp"
#include "zeppelin.hpp"

namespace ballast::strategies::zeppelin {

namespace {

constexpr int kRoutingChunkChoices[] = {1, 2, 4, 8, 16};

/// Forward attention of one zigzag ring step of a member holding c tokens: its two chunks
/// of c/2 against the owner's two, of which two pairs of chunks are fully visible.
Seconds ring_step_attention_s(const CostModel& cost, Tokens c) {
  const Tokens half = std::max<Tokens>(1, c / 2);
  const AttentionBlock blocks[] = {{2 * half, 3 * half, 0, half}, {3 * half, 4 * half, half, 2 * half}};
  return cost.attention_time_s(blocks, 1, Pass::forward);
}

/// Smallest c in [1, 2^30] with hidden(c), ring_step_attention(c) >= hop(c) (binary search
/// on the cost model; attention grows as c^2 and a hop as c, so the difference changes sign
/// once up to tile rounding). 2^30 when even that does not hide the hop.
template <typename Hidden>
Tokens crossover_tokens(Hidden hidden) {
  Tokens low = 1, high = Tokens{1} << 30;
  if (!hidden(high)) return high;
  while (low < high) {
    const Tokens mid = low + (high - low) / 2;
    if (hidden(mid)) high = mid;
    else low = mid + 1;
  }
  return low;
}

/// choose_routing's choices in the order of its ties: fewer proxies, then fewer chunks.
std::vector<Routing> routing_choices(const Cluster& cluster) {
  std::vector<Routing> out;
  for (int proxies = 1; proxies <= cluster.nics_per_node; proxies *= 2) {
    for (int chunks : kRoutingChunkChoices) {
      if (proxies == 1 && chunks > 1) break;  // a direct transfer is never cut
      out.push_back({proxies, chunks});
    }
  }
  return out;
}

/// What choose_routing minimises: the forward transfer (KV) plus the backward one (KV and
/// dKV, twice the bytes).
Seconds both_passes_s(const PlanEvaluator& evaluator, Bytes bytes, int src, int dst,
                      Routing routing) {
  return evaluator.transfer_time_s(bytes, src, dst, routing.proxies, routing.chunks) +
         evaluator.transfer_time_s(2 * bytes, src, dst, routing.proxies, routing.chunks);
}

Seconds both_passes_floor_s(const PlanEvaluator& evaluator, Bytes bytes, int src, int dst,
                            Routing routing) {
  return evaluator.transfer_time_floor_s(bytes, src, dst, routing.proxies, routing.chunks) +
         evaluator.transfer_time_floor_s(2 * bytes, src, dst, routing.proxies, routing.chunks);
}

/// Relative slack of every comparison against a floor or an upper bound: they add the same
/// task times as the simulation in another order, so they may differ from it by rounding.
constexpr double kBoundSlack = 1e-9;

Routing choose_pruned(const std::vector<Routing>& choices, const PlanEvaluator& evaluator, Bytes bytes,
                      int src, int dst) {
  // Priced most proxies first (the lowest floors), fewer chunks first within; a choice
  // whose floor is above the best found cannot be the minimum and stays unpriced.
  std::vector<std::size_t> order(choices.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return choices[a].proxies > choices[b].proxies;
  });
  const Seconds unpriced = std::numeric_limits<Seconds>::infinity();
  std::vector<Seconds> priced(choices.size(), unpriced);
  Seconds best_s = unpriced;
  for (const std::size_t i : order) {
    if (both_passes_floor_s(evaluator, bytes, src, dst, choices[i]) * (1 - kBoundSlack) > best_s) {
      continue;
    }
    priced[i] = both_passes_s(evaluator, bytes, src, dst, choices[i]);
    best_s = std::min(best_s, priced[i]);
  }
  // The ties' order: the first choice with the minimum, as choose_routing_exhaustive.
  for (std::size_t i = 0; i < choices.size(); ++i) {
    if (priced[i] == best_s) return choices[i];
  }
  return {};
}

std::vector<int> power_of_two_divisors(int value) {
  std::vector<int> out;
  for (int d = 2; d <= value; d *= 2) {
    if (value % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

Seconds attention_s(const CostModel& cost, Tokens length) {
  const AttentionBlock block = whole_document(length);
  return pass_count(cost.model(), Pass::forward) *
             cost.attention_time_s({&block, 1}, 1, Pass::forward) +
         cost.attention_time_s({&block, 1}, 1, Pass::backward);
}

Seconds linear_s(const CostModel& cost, Tokens tokens) {
  // With TP, the linear modules' collectives too (their latency is per micro-batch, not
  // per sequence: only the part that grows with the tokens).
  const Seconds tensor_parallel_s =
      tokens > 0 ? cost.linear_collectives_time_s(tokens) - cost.linear_collectives_latency_s() : 0.0;
  return pass_count(cost.model(), Pass::forward) * cost.linear_time_s(tokens, Pass::forward) +
         cost.linear_time_s(tokens, Pass::backward) + tensor_parallel_s;
}

const char* to_string(Tier tier) {
  switch (tier) {
    case Tier::local: return "local";
    case Tier::intra_node: return "intra-node";
    case Tier::inter_node: return "inter-node";
  }
  return "?";
}

Routing choose_routing_exhaustive(const CostModel& cost, const PlanEvaluator& evaluator,
                                  Bytes bytes_per_layer, int src_rank, int dst_rank) {
  Routing best;
  Seconds best_s = std::numeric_limits<Seconds>::infinity();
  if (cost.cluster().same_node(src_rank, dst_rank)) return best;
  for (const Routing& routing : routing_choices(cost.cluster())) {
    const Seconds time_s = both_passes_s(evaluator, bytes_per_layer, src_rank, dst_rank, routing);
    if (time_s < best_s) {
      best_s = time_s;
      best = routing;
    }
  }
  return best;
}

Routing choose_routing(const CostModel& cost, const PlanEvaluator& evaluator, Bytes bytes_per_layer,
                       int src_rank, int dst_rank) {
  if (cost.cluster().same_node(src_rank, dst_rank)) return {};
  return choose_pruned(routing_choices(cost.cluster()), evaluator, bytes_per_layer, src_rank,
                       dst_rank);
}

namespace {

Crossovers find_crossovers_with(const CostModel& cost, const PlanEvaluator& evaluator,
                                bool exhaustive) {
  const Cluster& cluster = cost.cluster();
  const Bytes kv = cost.model().kv_bytes_per_token();
  Crossovers out;
  if (cluster.gpus_per_node > 1) {
    out.intra_node_tokens_per_rank = crossover_tokens([&](Tokens c) {
      return ring_step_attention_s(cost, c) >= cost.p2p_time_s(kv * c, 0, 1);
    });
  }
  if (cluster.nodes > 1) {
    const int src = cluster.gpus_per_node - 1, dst = cluster.gpus_per_node;
    out.inter_node_tokens_per_rank = crossover_tokens([&](Tokens c) {
      return ring_step_attention_s(cost, c) >= cost.p2p_time_s(kv * c, src, dst);
    });
    const std::vector<Routing> choices = routing_choices(cluster);
    const auto smallest_floor_s = [&](Bytes bytes) {
      Seconds floor_s = std::numeric_limits<Seconds>::infinity();
      for (const Routing& routing : choices) {
        floor_s = std::min(floor_s, evaluator.transfer_time_floor_s(bytes, src, dst,
                                                                    routing.proxies,
                                                                    routing.chunks));
      }
      return floor_s;
    };
    std::optional<Routing> previous;  // the last step's choice
    out.inter_node_routed_tokens_per_rank = crossover_tokens([&](Tokens c) {
      const Seconds attention_s = ring_step_attention_s(cost, c);
      const Bytes bytes = kv * c;
      if (exhaustive) {
        const Routing routing = choose_routing_exhaustive(cost, evaluator, bytes, src, dst);
        return attention_s >=
               evaluator.transfer_time_s(bytes, src, dst, routing.proxies, routing.chunks);
      }
      // The chosen routing's time is at least its floor, so at least the smallest floor.
      if (attention_s < smallest_floor_s(bytes) * (1 - kBoundSlack)) return false;
      if (previous) {
        // And at most its both passes (no more than any choice's, the previous one's)
        // less its backward transfer (at least the smallest floor of twice the bytes).
        const Seconds previous_s = both_passes_s(evaluator, bytes, src, dst, *previous);
        const Seconds upper_s = previous_s - smallest_floor_s(2 * bytes);
        if (attention_s >= upper_s + kBoundSlack * previous_s) return true;
      }
      const Routing routing = choose_pruned(choices, evaluator, bytes, src, dst);
      previous = routing;
      return attention_s >=
             evaluator.transfer_time_s(bytes, src, dst, routing.proxies, routing.chunks);
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

}  // namespace

Crossovers find_crossovers(const CostModel& cost, const PlanEvaluator& evaluator) {
  return find_crossovers_with(cost, evaluator, /*exhaustive=*/false);
}

Crossovers find_crossovers_exhaustive(const CostModel& cost, const PlanEvaluator& evaluator) {
  return find_crossovers_with(cost, evaluator, /*exhaustive=*/true);
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

Seconds ring_member_time_s(const TierContext& context, Tokens length, TierChoice choice) {
  const CostModel& cost = *context.cost;
  const Seconds linear = linear_s(cost, length) / choice.degree;
  const AttentionBlock whole = whole_document(length);
  // The forward's ring steps run twice under full recomputation.
  const double forward_passes = pass_count(cost.model(), Pass::forward);
  const Seconds forward = cost.attention_time_s({&whole, 1}, 1, Pass::forward);
  const Seconds backward = cost.attention_time_s({&whole, 1}, 1, Pass::backward);
  if (choice.degree == 1) return forward_passes * forward + backward + linear;
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
  return forward_passes * degree * std::max(forward / (degree * degree), hop_s(bytes)) +
         degree * std::max(backward / (degree * degree), hop_s(2 * bytes)) + linear;
}

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
      const Seconds time_s = ring_member_time_s(context, length_tokens, c.choice);
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
      "{} or add {}",
      sequence_id, with_thousands(length_tokens), gpus * context.nodes,
      with_thousands(capacity * gpus * context.nodes), shorter_sequences_advice(),
      setting_name("--nodes")));
}

}  // namespace ballast::strategies::zeppelin
