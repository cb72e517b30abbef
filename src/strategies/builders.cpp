// Shared strategy building blocks: plan skeletons, best-fit-decreasing, token-balanced and
// in-order first-fit packing, dealing packs to groups, and zigzag / contiguous chunking.
#include "builders.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <set>
#include <utility>

#include "ballast/error.hpp"

namespace ballast::strategies {

bool is_power_of_two(std::int64_t value) { return value > 0 && (value & (value - 1)) == 0; }

std::int64_t next_power_of_two(std::int64_t value) {
  BALLAST_CHECK(value >= 1, "next_power_of_two needs a positive value");
  std::int64_t power = 1;
  while (power < value) power *= 2;
  return power;
}

std::vector<int> consecutive_ranks(int first_rank, int count) {
  std::vector<int> ranks(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) ranks[static_cast<std::size_t>(i)] = first_rank + i;
  return ranks;
}

namespace {

/// The fewest micro-batches any plan of the batch has (the lower bound's: every rank holds
/// at most its token capacity per micro-batch) against kMaxMicroBatches and
/// kMaxRankMicroBatches, before a planner builds per-micro-batch tables.
void check_micro_batch_limits(const Batch& batch, const CostModel& cost,
                              const std::string& strategy) {
  const int ranks = cost.cluster().ranks();
  const Tokens cluster_tokens = saturating_multiply(ranks, cost.token_capacity_per_rank());
  const Tokens total = batch.total_tokens();  // <= kMaxBatchTokens: no overflow below
  const std::int64_t needed = ceil_div(total, cluster_tokens);
  const std::int64_t limit = std::min(kMaxMicroBatches, kMaxRankMicroBatches / ranks);
  if (needed <= limit) return;
  throw PlanningError(fmt::format(
      "{} cannot plan the batch: its {} tokens need at least {} micro-batches on {} GPUs of "
      "{} tokens each, more than the {} a plan on {} GPUs may hold (ballast's limits: {} "
      "micro-batches, and micro-batches x GPUs <= {}); split the batch into several steps",
      strategy, with_thousands(total), with_thousands(needed), ranks,
      with_thousands(cost.token_capacity_per_rank()), with_thousands(limit), ranks,
      with_thousands(kMaxMicroBatches), with_thousands(kMaxRankMicroBatches)));
}

}  // namespace

Plan make_plan_skeleton(const Batch& batch, const CostModel& cost, const std::string& strategy) {
  if (batch.lengths_tokens.empty()) {
    throw InputError(fmt::format("{}: the batch (step {}) is empty; give at least one sequence",
                                 strategy, batch.step));
  }
  // A Batch may be built without make_batch: the same limits, named for this strategy.
  try {
    check_batch_limits(batch.lengths_tokens);
  } catch (const InputError& error) {
    throw InputError(fmt::format("{}: {}", strategy, error.what()));
  }
  check_micro_batch_limits(batch, cost, strategy);
  Plan plan;
  plan.strategy = strategy;
  plan.cluster = cost.cluster();
  plan.model = cost.model();
  plan.cost_model = cost.spec();
  plan.step = batch.step;
  plan.sequence_lengths_tokens = batch.lengths_tokens;
  return plan;
}

void check_plan_chunks(std::int64_t chunks, const std::string& strategy, const std::string& why) {
  if (chunks <= kMaxPlanChunks) return;
  throw PlanningError(fmt::format(
      "{} would make a plan of {} attention chunks ({}), over ballast's limit of {} chunks "
      "per plan; plan fewer sequences per step or use a smaller degree",
      strategy, with_thousands(chunks), why, with_thousands(kMaxPlanChunks)));
}

void check_ring_steps(std::int64_t steps, const std::string& strategy, const std::string& why) {
  if (steps <= kMaxRingSteps) return;
  throw PlanningError(fmt::format(
      "{} would make a plan whose rings take {} simulated steps ({}; a ring of g GPUs takes "
      "g^2), over ballast's limit of {} per plan; use smaller rings (a lower degree, or "
      "lower {}) or fewer micro-batches per step",
      strategy, with_thousands(steps), why, with_thousands(kMaxRingSteps),
      setting_name("--max-context")));
}

std::vector<Pack> best_fit_decreasing(std::span<const PackItem> items, Tokens capacity_tokens) {
  std::vector<PackItem> sorted(items.begin(), items.end());
  std::sort(sorted.begin(), sorted.end(), [](const PackItem& a, const PackItem& b) {
    if (a.size_tokens != b.size_tokens) return a.size_tokens > b.size_tokens;
    return a.sequence_id < b.sequence_id;
  });
  std::vector<Pack> packs;
  // (remaining room, pack index): lower_bound(size) is the tightest fit, lowest index on ties.
  std::set<std::pair<Tokens, std::size_t>> open_packs;
  for (const PackItem& item : sorted) {
    BALLAST_CHECK(item.size_tokens > 0 && item.size_tokens <= capacity_tokens,
                  fmt::format("sequence {} ({} tokens) must fit a pack of {} tokens",
                              item.sequence_id, item.size_tokens, capacity_tokens));
    auto best = open_packs.lower_bound({item.size_tokens, 0});
    Tokens remaining = capacity_tokens;
    std::size_t index = packs.size();
    if (best != open_packs.end()) {
      remaining = best->first;
      index = best->second;
      open_packs.erase(best);
    } else {
      packs.emplace_back();
    }
    packs[index].push_back(item.sequence_id);
    if (remaining - item.size_tokens > 0) open_packs.insert({remaining - item.size_tokens, index});
  }
  return packs;
}

std::vector<Pack> balanced_packs(std::span<const PackItem> items, Tokens capacity_tokens,
                                 int groups) {
  BALLAST_CHECK(groups >= 1, "balanced packing needs at least one group");
  std::vector<PackItem> sorted(items.begin(), items.end());
  std::sort(sorted.begin(), sorted.end(), [](const PackItem& a, const PackItem& b) {
    if (a.size_tokens != b.size_tokens) return a.size_tokens > b.size_tokens;
    return a.sequence_id < b.sequence_id;
  });
  for (const PackItem& item : sorted) {
    BALLAST_CHECK(item.size_tokens > 0 && item.size_tokens <= capacity_tokens,
                  fmt::format("sequence {} ({} tokens) must fit a pack of {} tokens",
                              item.sequence_id, item.size_tokens, capacity_tokens));
  }
  if (sorted.empty()) return {};
  const auto group_count = static_cast<std::size_t>(groups);
  const std::size_t bfd_count = best_fit_decreasing(sorted, capacity_tokens).size();
  for (std::size_t rounds = (bfd_count + group_count - 1) / group_count;; ++rounds) {
    const std::size_t pack_count = rounds * group_count;
    std::vector<Pack> packs(pack_count);
    std::vector<Tokens> totals(pack_count, 0);
    // (tokens, pack index): begin() is the least-loaded pack, lowest index on ties.
    std::set<std::pair<Tokens, std::size_t>> by_load;
    for (std::size_t p = 0; p < pack_count; ++p) by_load.insert({0, p});
    bool fits = true;
    for (const PackItem& item : sorted) {
      const auto [tokens, index] = *by_load.begin();
      if (tokens + item.size_tokens > capacity_tokens) {
        fits = false;  // the roomiest pack is too full: no pack has room
        break;
      }
      by_load.erase(by_load.begin());
      packs[index].push_back(item.sequence_id);
      totals[index] = tokens + item.size_tokens;
      by_load.insert({totals[index], index});
    }
    if (!fits) continue;
    std::vector<std::size_t> order(pack_count);
    for (std::size_t p = 0; p < pack_count; ++p) order[p] = p;
    std::stable_sort(order.begin(), order.end(),
                     [&totals](std::size_t a, std::size_t b) { return totals[a] > totals[b]; });
    std::vector<Pack> result;
    for (std::size_t p : order) {
      if (!packs[p].empty()) result.push_back(std::move(packs[p]));
    }
    return result;
  }
}

std::vector<Pack> first_fit_in_order(std::span<const PackItem> items, Tokens capacity_tokens) {
  // A max-tree over the room of packs 0, 1, ...: a leaf per pack that may ever open (one
  // per item at most), unopened packs at full room. Packs open in index order, so the
  // leftmost leaf with room for an item is an open pack or, if none has room, the next
  // one to open.
  const auto item_count = static_cast<std::int64_t>(items.size());
  const auto leaves = static_cast<std::size_t>(next_power_of_two(std::max<std::int64_t>(1, item_count)));
  std::vector<Tokens> max_room(2 * leaves, capacity_tokens);
  std::vector<Pack> packs;
  for (const PackItem& item : items) {
    BALLAST_CHECK(item.size_tokens > 0 && item.size_tokens <= capacity_tokens,
                  fmt::format("sequence {} ({} tokens) must fit a pack of {} tokens",
                              item.sequence_id, item.size_tokens, capacity_tokens));
    std::size_t node = 1;
    while (node < leaves) node = max_room[2 * node] >= item.size_tokens ? 2 * node : 2 * node + 1;
    const std::size_t index = node - leaves;
    if (index == packs.size()) packs.emplace_back();
    packs[index].push_back(item.sequence_id);
    max_room[node] -= item.size_tokens;
    for (node /= 2; node >= 1; node /= 2) {
      max_room[node] = std::max(max_room[2 * node], max_room[2 * node + 1]);
    }
  }
  return packs;
}

Tokens pack_tokens(const Pack& pack, std::span<const Tokens> size_by_sequence_tokens) {
  Tokens total = 0;
  for (std::int64_t id : pack) total += size_by_sequence_tokens[static_cast<std::size_t>(id)];
  return total;
}

void sort_packs_by_tokens_descending(std::vector<Pack>& packs,
                                     std::span<const Tokens> size_by_sequence_tokens) {
  std::vector<std::pair<Tokens, Pack>> keyed;
  keyed.reserve(packs.size());
  for (Pack& pack : packs) {
    keyed.emplace_back(pack_tokens(pack, size_by_sequence_tokens), std::move(pack));
  }
  std::stable_sort(keyed.begin(), keyed.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t i = 0; i < packs.size(); ++i) packs[i] = std::move(keyed[i].second);
}

void deal_packs_round_robin(Plan& plan, const std::vector<Pack>& packs, int degree,
                            const GroupBuilder& build_group) {
  const int ranks = plan.cluster.ranks();
  BALLAST_CHECK(degree >= 1 && ranks % degree == 0, "degree must divide the rank count");
  const auto groups = static_cast<std::size_t>(ranks / degree);
  const std::size_t first_micro_batch = plan.micro_batches.size();
  for (std::size_t p = 0; p < packs.size(); ++p) {
    const std::size_t micro_batch = first_micro_batch + p / groups;
    if (micro_batch >= plan.micro_batches.size()) plan.micro_batches.emplace_back();
    const int first_rank = static_cast<int>(p % groups) * degree;
    plan.micro_batches[micro_batch].groups.push_back(
        build_group(packs[p], consecutive_ranks(first_rank, degree)));
  }
}

Tokens zigzag_padded_length(Tokens length_tokens, int ring_size) {
  const Tokens multiple = 2 * static_cast<Tokens>(ring_size);
  return (length_tokens + multiple - 1) / multiple * multiple;
}

namespace {

/// Zigzag chunks from the 2g chunk sizes (position order): member i gets i and 2g-1-i.
std::vector<Chunk> zigzag_from_sizes(const std::vector<Tokens>& sizes,
                                     std::span<const int> ring_ranks) {
  std::vector<Tokens> offsets(sizes.size() + 1, 0);
  for (std::size_t c = 0; c < sizes.size(); ++c) offsets[c + 1] = offsets[c] + sizes[c];
  const std::size_t ring_size = ring_ranks.size();
  std::vector<Chunk> chunks;
  for (std::size_t member = 0; member < ring_size; ++member) {
    for (std::size_t c : {member, 2 * ring_size - 1 - member}) {
      if (sizes[c] == 0) continue;
      chunks.push_back({ring_ranks[member], offsets[c], offsets[c + 1]});
    }
  }
  return chunks;
}

}  // namespace

std::vector<Chunk> zigzag_chunks_padded(Tokens length_tokens, std::span<const int> ring_ranks) {
  BALLAST_CHECK(!ring_ranks.empty(), "a ring needs at least one rank");
  const int ring_size = static_cast<int>(ring_ranks.size());
  const Tokens chunk_tokens = zigzag_padded_length(length_tokens, ring_size) / (2 * ring_size);
  return zigzag_from_sizes(std::vector<Tokens>(2 * ring_ranks.size(), chunk_tokens), ring_ranks);
}

std::vector<Chunk> zigzag_chunks_unpadded(Tokens length_tokens, std::span<const int> ring_ranks) {
  BALLAST_CHECK(!ring_ranks.empty(), "a ring needs at least one rank");
  const std::size_t ring_size = ring_ranks.size();
  const auto chunk_count = static_cast<Tokens>(2 * ring_size);
  std::vector<Tokens> sizes(2 * ring_size, length_tokens / chunk_count);
  const Tokens remainder = length_tokens % chunk_count;
  for (Tokens k = 0; k < remainder; ++k) {
    // k-th extra token: member k mod g, its first chunk for k < g, its second after.
    const auto member = static_cast<std::size_t>(k) % ring_size;
    const bool first = static_cast<std::size_t>(k) < ring_size;
    ++sizes[first ? member : 2 * ring_size - 1 - member];
  }
  return zigzag_from_sizes(sizes, ring_ranks);
}

std::vector<Chunk> contiguous_chunks(Tokens length_tokens, std::span<const int> ranks) {
  BALLAST_CHECK(!ranks.empty(), "a split needs at least one rank");
  const auto parts = static_cast<Tokens>(ranks.size());
  std::vector<Chunk> chunks;
  Tokens begin = 0;
  for (Tokens k = 0; k < parts; ++k) {
    const Tokens size = length_tokens / parts + (k < length_tokens % parts ? 1 : 0);
    if (size > 0) chunks.push_back({ranks[static_cast<std::size_t>(k)], begin, begin + size});
    begin += size;
  }
  return chunks;
}

SequenceChunks whole_sequence(std::int64_t sequence_id, Tokens length_tokens, int rank) {
  return {sequence_id, length_tokens, {{rank, 0, length_tokens}}};
}

}  // namespace ballast::strategies
