// validate(): the Plan invariants of docs/plan-format.md, checked in order, reporting the
// first violation in plain words with its location; require_valid(). One file (~700 lines)
// on purpose: the checks run in the order plan-format.md lists them and share the words
// that locate a violation ("micro-batch m, group g (scheme)"); split by invariant, that
// order and wording would be spread over files that must change together.
#include <algorithm>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/text.hpp"
#include "plan_internal.hpp"

namespace ballast {
namespace {

using Violation = std::optional<std::string>;

// ---------------------------------------------------------------- wording

bool known_scheme(Scheme scheme) {
  return scheme == Scheme::local || scheme == Scheme::ring || scheme == Scheme::all_gather ||
         scheme == Scheme::ulysses || scheme == Scheme::usp;
}

/// to_string() for valid schemes; never throws, so messages can name a corrupt value.
std::string scheme_name(Scheme scheme) {
  if (known_scheme(scheme)) return to_string(scheme);
  return fmt::format("unknown scheme {}", static_cast<int>(scheme));
}

std::string group_label(std::size_t micro_batch, std::size_t group_index,
                        const AttentionGroup& group) {
  return fmt::format("micro-batch {}, group {} ({})", micro_batch, group_index,
                     scheme_name(group.scheme));
}

/// group_label() formatted only when a message needs it: validate() runs on every
/// candidate a planner tries, and a valid plan needs no labels.
struct GroupLabel {
  std::size_t micro_batch = 0;
  std::size_t group_index = 0;
  const AttentionGroup* group = nullptr;
};

}  // namespace
}  // namespace ballast

template <>
struct fmt::formatter<ballast::GroupLabel> : fmt::formatter<std::string> {
  auto format(const ballast::GroupLabel& label, format_context& ctx) const {
    return fmt::formatter<std::string>::format(
        ballast::group_label(label.micro_batch, label.group_index, *label.group), ctx);
  }
};

namespace ballast {
namespace {

std::string gib(Bytes bytes, int decimals = 1) {
  return fmt::format("{:.{}f} GiB", static_cast<double>(bytes) / kGiB, decimals);
}

/// "0, 1, 2" or, for long lists, the first eight and a count.
std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 8;  // keeps the message on one line
  std::string text;
  for (std::size_t i = 0; i < ranks.size() && i < kShown; ++i) {
    text += (i == 0 ? "" : ", ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > kShown) text += fmt::format(", ... ({} ranks)", ranks.size());
  return text;
}

// ---------------------------------------------------------------- traversal

template <typename Visit>
Violation for_each_group(const Plan& plan, Visit visit) {
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    const auto& groups = plan.micro_batches[m].groups;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (auto violation = visit(m, g, groups[g])) return violation;
    }
  }
  return std::nullopt;
}

template <typename Visit>
Violation for_each_sequence(const Plan& plan, Visit visit) {
  return for_each_group(
      plan, [&](std::size_t m, std::size_t g, const AttentionGroup& group) -> Violation {
        for (const auto& sequence : group.sequences) {
          if (auto violation = visit(m, g, group, sequence)) return violation;
        }
        return std::nullopt;
      });
}

struct Range {
  Tokens begin = 0;
  Tokens end = 0;
};

/// The first gap or overlap of `ranges` (in-bounds, non-empty; sorted here) against
/// [0, total): "is missing tokens [a, b)" or "has tokens [a, b) in more than one <piece>".
std::optional<std::string> coverage_problem(std::vector<Range>& ranges, Tokens total,
                                            const char* piece) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  Tokens covered_until = 0;
  for (const auto& range : ranges) {
    if (range.begin > covered_until) {
      return fmt::format("is missing tokens [{}, {})", covered_until, range.begin);
    }
    if (range.begin < covered_until) {
      return fmt::format("has tokens [{}, {}) in more than one {}", range.begin,
                         std::min(covered_until, range.end), piece);
    }
    covered_until = range.end;
  }
  if (covered_until < total) return fmt::format("is missing tokens [{}, {})", covered_until, total);
  return std::nullopt;
}

// ---------------------------------------------------------------- plan-level checks

Violation check_version(const Plan& plan) {
  if (plan.version == kPlanFormatVersion) return std::nullopt;
  return fmt::format("plan format version {} is not supported; this ballast supports version {}",
                     plan.version, kPlanFormatVersion);
}

/// Names the first top-level field where two JSON objects differ.
Violation first_difference(const char* what, const nlohmann::json& in_plan,
                           const nlohmann::json& in_cost) {
  if (in_plan == in_cost) return std::nullopt;
  std::vector<std::string> keys;
  for (const auto& [key, value] : in_plan.items()) keys.push_back(key);
  for (const auto& [key, value] : in_cost.items()) keys.push_back(key);
  std::sort(keys.begin(), keys.end());
  for (const auto& key : keys) {
    const auto plan_value = in_plan.contains(key) ? in_plan.at(key).dump() : "absent";
    const auto cost_value = in_cost.contains(key) ? in_cost.at(key).dump() : "absent";
    if (plan_value != cost_value) {
      return fmt::format(
          "the plan's {} differs from the cost model's: '{}' is {} in the plan "
          "but {} in the cost model",
          what, key, plan_value, cost_value);
    }
  }
  return fmt::format("the plan's {} differs from the cost model's", what);
}

Violation check_matches_cost(const Plan& plan, const CostModel& cost) {
  const int plan_tp = plan.cluster.tensor_parallel.gpus;
  const int cost_tp = cost.cluster().tensor_parallel.gpus;
  if (plan_tp != cost_tp) {
    return fmt::format(
        "the plan is for tensor parallelism {} (cluster field tensor_parallel.gpus) but the "
        "cost model's cluster has {}; plan and simulate with the same {}",
        plan_tp, cost_tp, setting_name("--tp"));
  }
  // Equal fields serialise to equal JSON, so only unequal ones are compared as JSON (which
  // names the first difference, or finds none where the fields differ only in what JSON
  // does not hold). A planner's candidates carry the cost model's own cluster and model:
  // serialising both, curves and collective fits included, cost 0.46 million
  // instructions a call, 2% of ballast's planning at 64 GPUs / 512 sequences.
  if (!(plan.cluster == cost.cluster())) {
    if (auto violation = first_difference("cluster", to_json(plan.cluster), to_json(cost.cluster()))) {
      return violation;
    }
  }
  if (plan.model == cost.model()) return std::nullopt;
  return first_difference("model", to_json(plan.model), to_json(cost.model()));
}

/// The plan's size against limits.hpp, before any check allocates per-rank or
/// per-sequence tables.
Violation check_size(const Plan& plan) {
  const auto sequences = static_cast<std::int64_t>(plan.sequence_lengths_tokens.size());
  if (sequences > kMaxBatchSequences) {
    return fmt::format("the plan has {} sequences, over ballast's limit of {} per plan",
                       with_thousands(sequences), with_thousands(kMaxBatchSequences));
  }
  const auto micro_batches = static_cast<std::int64_t>(plan.micro_batches.size());
  const std::int64_t ranks = std::max(plan.cluster.ranks(), 1);
  if (micro_batches > kMaxMicroBatches || micro_batches * ranks > kMaxRankMicroBatches) {
    return fmt::format(
        "the plan has {} micro-batches on {} GPUs, over ballast's limits of {} micro-batches "
        "and {} micro-batches x GPUs per plan",
        with_thousands(micro_batches), ranks, with_thousands(kMaxMicroBatches),
        with_thousands(kMaxRankMicroBatches));
  }
  std::int64_t chunks = 0;
  std::int64_t ring_steps = 0;  // <= groups x 2^32: no overflow
  for (const auto& micro_batch : plan.micro_batches) {
    chunks += static_cast<std::int64_t>(micro_batch.linear_layout.size());
    for (const auto& group : micro_batch.groups) {
      const auto size = static_cast<std::int64_t>(group.ranks.size());
      if (group.scheme == Scheme::ring && size > 1) ring_steps += size * size;
      if (group.scheme == Scheme::usp && group.ulysses_degree >= 1) {  // u rings of r stages
        const std::int64_t stages = size / group.ulysses_degree;
        ring_steps += group.ulysses_degree * stages * stages;
      }
      for (const auto& sequence : group.sequences) {
        chunks += static_cast<std::int64_t>(sequence.chunks.size());
      }
    }
  }
  if (chunks > kMaxPlanChunks) {
    return fmt::format(
        "the plan has {} attention chunks and linear slices, over ballast's limit of {} per plan",
        with_thousands(chunks), with_thousands(kMaxPlanChunks));
  }
  if (ring_steps > kMaxRingSteps) {
    return fmt::format(
        "the plan's rings take {} simulated steps (the sum of their sizes squared), over "
        "ballast's limit of {} per plan",
        with_thousands(ring_steps), with_thousands(kMaxRingSteps));
  }
  return std::nullopt;
}

Violation check_group_ranks(const Plan& plan) {
  const int ranks = plan.cluster.ranks();
  std::vector<std::size_t> seen_in_group(static_cast<std::size_t>(std::max(ranks, 0)), 0);
  std::size_t group_serial = 0;
  return for_each_group(
      plan, [&](std::size_t m, std::size_t g, const AttentionGroup& group) -> Violation {
        ++group_serial;
        for (int rank : group.ranks) {
          if (rank < 0 || rank >= ranks) {
            return fmt::format("{}: rank {} is outside the cluster's ranks [0, {})",
                               group_label(m, g, group), rank, ranks);
          }
          if (seen_in_group[rank] == group_serial) {
            return fmt::format("{}: rank {} is listed twice", group_label(m, g, group), rank);
          }
          seen_in_group[rank] = group_serial;
        }
        return std::nullopt;
      });
}

/// A TP group splits the heads and KV heads N ways (tensor_parallel.hpp).
Violation check_tensor_parallel_heads(const Plan& plan) {
  const int tp = plan.cluster.tensor_parallel.gpus;
  if (plan.model.heads % tp == 0 && plan.model.kv_heads % tp == 0) return std::nullopt;
  return fmt::format(
      "the plan's tensor parallelism {} does not divide the model's {} heads and {} KV "
      "heads; plan with a {} that divides both",
      tp, plan.model.heads, plan.model.kv_heads, setting_name("--tp"));
}

/// A Ulysses group of `degree` ranks, each a TP group of `tp` GPUs, splits every TP GPU's
/// heads `degree` ways (plan.hpp's ulysses_degree_allowed): the message names the group,
/// the heads per TP GPU and the degrees it could use instead.
Violation check_ulysses_degree(const GroupLabel& label, int degree, const Model& model, int tp) {
  if (ulysses_degree_allowed(model, tp, degree)) return std::nullopt;
  const int heads = model.heads / tp;
  const int kv_heads = model.kv_heads / tp;
  const std::string per_gpu =
      tp == 1 ? fmt::format("the model's {} heads and {} KV heads", heads, kv_heads)
              : fmt::format("the {} heads and {} KV heads of each GPU at tensor parallelism {}",
                            heads, kv_heads, tp);
  return fmt::format(
      "{}: Ulysses degree {} cannot shard {}: the degree must divide the heads and either "
      "divide the KV heads or be a multiple of them (KV heads replicated); use one of the "
      "degrees {} (or another scheme for this group)",
      label, degree, per_gpu, fmt::join(allowed_ulysses_degrees(model, tp, heads), ", "));
}

/// A usp group: r >= 2 stages of u >= 2 consecutive ranks (u = 1 is a ring, r = 1
/// Ulysses: one spelling per layout), u shards the heads as a Ulysses group of u would, and
/// its ring hops are direct (the routing layer relays only whole-ring hops).
Violation check_usp_stages(const GroupLabel& label, const AttentionGroup& group,
                           const Model& model, int tp) {
  const auto size = static_cast<int>(group.ranks.size());
  const int degree = group.ulysses_degree;
  if (degree < 2 || degree >= size || size % degree != 0) {
    return fmt::format(
        "{}: a usp group of {} ranks needs a ulysses_degree (ranks per stage) of at least 2 that "
        "divides {} and leaves at least 2 stages, not {}; write a group of one stage as "
        "ulysses and a group with ulysses_degree 1 as ring",
        label, size, size, degree);
  }
  if (auto violation = check_ulysses_degree(label, degree, model, tp)) return violation;
  if (group.routing_proxies != 1) {
    return fmt::format(
        "{}: usp groups do not route their ring hops through proxies (routing_proxies {}); "
        "set routing_proxies to 1",
        label, group.routing_proxies);
  }
  return std::nullopt;
}

Violation check_group_shape(const GroupLabel& label, const AttentionGroup& group,
                            const Model& model, int tp) {
  if (!known_scheme(group.scheme)) return fmt::format("{}: the scheme is not one ballast knows", label);
  if (group.ranks.empty()) return fmt::format("{}: the group has no ranks", label);
  if (group.sequences.empty()) return fmt::format("{}: the group has no sequences; remove it", label);
  const auto size = static_cast<int>(group.ranks.size());
  if (group.scheme == Scheme::local && size != 1) {
    return fmt::format("{}: a local group needs exactly one rank but has {} (ranks {})", label,
                       size, rank_list(group.ranks));
  }
  if (group.scheme == Scheme::ulysses) return check_ulysses_degree(label, size, model, tp);
  if (group.scheme == Scheme::usp) return check_usp_stages(label, group, model, tp);
  if (group.ulysses_degree != 1) {
    return fmt::format(
        "{}: ulysses_degree {} is only for usp groups; remove it (or make the group usp)", label,
        group.ulysses_degree);
  }
  return std::nullopt;
}

Violation check_group_shapes(const Plan& plan) {
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    if (plan.micro_batches[m].groups.empty()) {
      return fmt::format("micro-batch {} has no groups; remove the empty micro-batch", m);
    }
  }
  return for_each_group(plan, [&](std::size_t m, std::size_t g, const AttentionGroup& group) {
    return check_group_shape(GroupLabel{m, g, &group}, group, plan.model,
                             plan.cluster.tensor_parallel.gpus);
  });
}

/// A routed ring hop relays its parts through proxy GPUs inside the same ring step, so
/// every proxy must be a member of the group (the runtime executes nothing else).
Violation check_routing_proxies(const Cluster& cluster, const AttentionGroup& group,
                                const GroupLabel& label) {
  const int size = static_cast<int>(group.ranks.size());
  if (group.scheme != Scheme::ring || size == 1 || group.routing_proxies == 1) return std::nullopt;
  std::vector<int> members = group.ranks;
  std::sort(members.begin(), members.end());
  for (int hop = 0; hop < size; ++hop) {
    const int src = group.ranks[hop];
    const int dst = group.ranks[(hop + 1) % size];
    const int parts = routing_parts(cluster, group.routing_proxies, src, dst);
    for (int part = 1; part < parts; ++part) {
      const int proxies[] = {routing_proxy(cluster, src, part), routing_proxy(cluster, dst, part)};
      for (const int proxy : proxies) {
        if (std::binary_search(members.begin(), members.end(), proxy)) continue;
        return fmt::format(
            "{}: the hop from rank {} to rank {} is routed in {} parts and part {} goes through "
            "rank {}, which is not a member of the group; set routing_proxies to 1, or use a ring "
            "over whole nodes",
            label, src, dst, parts, part, proxy);
      }
    }
  }
  return std::nullopt;
}

Violation check_routing(const Plan& plan) {
  const int gpus_per_node = plan.cluster.gpus_per_node;
  return for_each_group(
      plan, [&](std::size_t m, std::size_t g, const AttentionGroup& group) -> Violation {
        if (group.routing_proxies < 1 || group.routing_proxies > gpus_per_node) {
          return fmt::format(
              "{}: routing_proxies {} is outside [1, {}] (at least 1, at most the GPUs "
              "per node)",
              group_label(m, g, group), group.routing_proxies, gpus_per_node);
        }
        if (group.routing_chunks < 1 || group.routing_chunks > kMaxRoutingChunks) {
          return fmt::format(
              "{}: routing_chunks {} is outside [1, {}] (at least 1; beyond {} chunks the "
              "per-chunk latency dominates)",
              group_label(m, g, group), group.routing_chunks, kMaxRoutingChunks, kMaxRoutingChunks);
        }
        return check_routing_proxies(plan.cluster, group, GroupLabel{m, g, &group});
      });
}

// ---------------------------------------------------------------- sequences

Violation check_lengths(const Plan& plan) {
  const auto& lengths = plan.sequence_lengths_tokens;
  for (std::size_t id = 0; id < lengths.size(); ++id) {
    if (lengths[id] <= 0) {
      return fmt::format("sequence {} has length {} tokens; lengths must be positive", id,
                         lengths[id]);
    }
    if (lengths[id] > kMaxSequenceTokens) {
      return fmt::format("sequence {} has length {} tokens, over ballast's limit of 2^31 = {}",
                         id, lengths[id], kMaxSequenceTokens);
    }
  }
  // At most 10^6 lengths of at most 2^31 tokens (check_size, above): no overflow.
  Tokens total = 0;
  for (const Tokens length : lengths) total += length;
  if (total > kMaxBatchTokens) {
    return fmt::format("the plan's sequences hold {} tokens, over ballast's limit of 2^40 = {} "
                       "tokens per batch",
                       with_thousands(total), with_thousands(kMaxBatchTokens));
  }
  return std::nullopt;
}

/// Each sequence id in range and in exactly one group of one micro-batch.
Violation check_membership(const Plan& plan) {
  const auto count = static_cast<std::int64_t>(plan.sequence_lengths_tokens.size());
  struct Place {
    std::size_t micro_batch = 0;
    std::size_t group = 0;
    bool placed = false;
  };
  std::vector<Place> places(static_cast<std::size_t>(count));
  auto violation = for_each_sequence(
      plan,
      [&](std::size_t m, std::size_t g, const AttentionGroup& group,
          const SequenceChunks& sequence) -> Violation {
        const auto id = sequence.sequence_id;
        if (id < 0 || id >= count) {
          return fmt::format("{}: sequence id {} is out of range; the plan has {} sequences",
                             group_label(m, g, group), id, count);
        }
        auto& place = places[static_cast<std::size_t>(id)];
        if (place.placed && place.micro_batch == m && place.group == g) {
          return fmt::format("{}: sequence {} appears twice in this group",
                             group_label(m, g, group), id);
        }
        if (place.placed) {
          const auto& first = plan.micro_batches[place.micro_batch].groups[place.group];
          return fmt::format("sequence {} appears in two groups: {} and {}", id,
                             group_label(place.micro_batch, place.group, first),
                             group_label(m, g, group));
        }
        place = Place{m, g, true};
        return std::nullopt;
      });
  if (violation) return violation;
  for (std::size_t id = 0; id < places.size(); ++id) {
    if (!places[id].placed) {
      return fmt::format("sequence {} ({} tokens) appears in no group", id,
                         plan.sequence_lengths_tokens[id]);
    }
  }
  return std::nullopt;
}

Violation check_padding(const GroupLabel& label, const AttentionGroup& group,
                        const SequenceChunks& sequence, Tokens length) {
  const Tokens padded = sequence.padded_length_tokens;
  const auto id = sequence.sequence_id;
  if (padded < length) {
    return fmt::format("{}: sequence {} has padded length {} tokens, less than its length {}",
                       label, id, padded, length);
  }
  if (padded == length) return std::nullopt;
  if (group.scheme == Scheme::ring || group.scheme == Scheme::all_gather ||
      group.scheme == Scheme::usp) {
    const auto limit = 2 * static_cast<Tokens>(group.ranks.size());
    if (padded - length >= limit) {
      return fmt::format(
          "{}: sequence {} is padded from {} to {} tokens; padding must stay below "
          "2 x group size = {} tokens",
          label, id, length, padded, limit);
    }
    return std::nullopt;
  }
  if (padded - length >= kMaxPadMultipleTokens) {  // ulysses, local: a data padding
    return fmt::format(
        "{}: sequence {} is padded from {} to {} tokens; padding in {} groups must stay below "
        "{} tokens",
        label, id, length, padded, scheme_name(group.scheme), kMaxPadMultipleTokens);
  }
  return std::nullopt;
}

Violation check_chunk_cover(const GroupLabel& label, const SequenceChunks& sequence,
                            std::vector<Range>& ranges) {
  const auto id = sequence.sequence_id;
  const Tokens padded = sequence.padded_length_tokens;
  if (sequence.chunks.empty()) return fmt::format("{}: sequence {} has no chunks", label, id);
  ranges.clear();
  for (std::size_t i = 0; i < sequence.chunks.size(); ++i) {
    const auto& chunk = sequence.chunks[i];
    if (chunk.begin_tokens >= chunk.end_tokens) {
      return fmt::format("{}: chunk {} of sequence {} is empty or reversed: [{}, {})", label, i, id,
                         chunk.begin_tokens, chunk.end_tokens);
    }
    if (chunk.begin_tokens < 0 || chunk.end_tokens > padded) {
      return fmt::format(
          "{}: chunk {} of sequence {} [{}, {}) lies outside its padded length "
          "[0, {})",
          label, i, id, chunk.begin_tokens, chunk.end_tokens, padded);
    }
    ranges.push_back({chunk.begin_tokens, chunk.end_tokens});
  }
  if (auto problem = coverage_problem(ranges, padded, "chunk")) {
    return fmt::format("{}: sequence {} {}", label, id, *problem);
  }
  return std::nullopt;
}

/// Padding rules, chunk bounds and exact coverage of [0, padded length).
Violation check_chunks(const Plan& plan) {
  std::vector<Range> ranges;  // reused across sequences
  return for_each_sequence(
      plan,
      [&](std::size_t m, std::size_t g, const AttentionGroup& group,
          const SequenceChunks& sequence) -> Violation {
        const GroupLabel label{m, g, &group};
        const Tokens length =
            plan.sequence_lengths_tokens[static_cast<std::size_t>(sequence.sequence_id)];
        if (auto violation = check_padding(label, group, sequence, length)) return violation;
        return check_chunk_cover(label, sequence, ranges);
      });
}

Violation check_chunk_ranks(const Plan& plan) {
  const int ranks = plan.cluster.ranks();
  std::vector<std::size_t> in_group(static_cast<std::size_t>(std::max(ranks, 0)), 0);
  std::size_t group_serial = 0;
  return for_each_group(
      plan, [&](std::size_t m, std::size_t g, const AttentionGroup& group) -> Violation {
        ++group_serial;
        for (int rank : group.ranks) in_group[rank] = group_serial;
        for (const auto& sequence : group.sequences) {
          for (std::size_t i = 0; i < sequence.chunks.size(); ++i) {
            const int rank = sequence.chunks[i].rank;
            if (rank >= 0 && rank < ranks && in_group[rank] == group_serial) continue;
            return fmt::format(
                "{}: chunk {} of sequence {} is on rank {}, which is not in the "
                "group (ranks {})",
                group_label(m, g, group), i, sequence.sequence_id, rank, rank_list(group.ranks));
          }
        }
        return std::nullopt;
      });
}

// ---------------------------------------------------------------- linear layout

Violation check_slice(const Plan& plan, std::size_t m, std::size_t i, const LinearSlice& slice,
                      const std::vector<std::int64_t>& micro_batch_of) {
  const int ranks = plan.cluster.ranks();
  const auto count = static_cast<std::int64_t>(micro_batch_of.size());
  const auto id = slice.sequence_id;
  if (slice.rank < 0 || slice.rank >= ranks) {
    return fmt::format(
        "micro-batch {}: linear slice {} is on rank {}, outside the cluster's "
        "ranks [0, {})",
        m, i, slice.rank, ranks);
  }
  if (id < 0 || id >= count) {
    return fmt::format(
        "micro-batch {}: linear slice {} names sequence {}, but the plan has {} "
        "sequences",
        m, i, id, count);
  }
  if (micro_batch_of[static_cast<std::size_t>(id)] != static_cast<std::int64_t>(m)) {
    return fmt::format(
        "micro-batch {}: linear slice {} holds sequence {}, which is not in this "
        "micro-batch's groups",
        m, i, id);
  }
  const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
  if (slice.begin_tokens >= slice.end_tokens) {
    return fmt::format(
        "micro-batch {}: linear slice {} of sequence {} is empty or reversed: "
        "[{}, {})",
        m, i, id, slice.begin_tokens, slice.end_tokens);
  }
  if (slice.begin_tokens < 0 || slice.end_tokens > length) {
    return fmt::format(
        "micro-batch {}: linear slice {} [{}, {}) lies outside sequence {}'s {} "
        "tokens (padding is not part of the linear layout)",
        m, i, slice.begin_tokens, slice.end_tokens, id, length);
  }
  return std::nullopt;
}

/// Every sequence of the micro-batch covered exactly once over [0, length).
Violation check_linear_cover(const Plan& plan, std::size_t m) {
  const auto& micro_batch = plan.micro_batches[m];
  std::vector<std::tuple<std::int64_t, Tokens, Tokens>> slices;
  slices.reserve(micro_batch.linear_layout.size());
  for (const auto& slice : micro_batch.linear_layout) {
    slices.emplace_back(slice.sequence_id, slice.begin_tokens, slice.end_tokens);
  }
  std::sort(slices.begin(), slices.end());
  std::vector<std::int64_t> ids;
  for (const auto& group : micro_batch.groups) {
    for (const auto& sequence : group.sequences) ids.push_back(sequence.sequence_id);
  }
  std::sort(ids.begin(), ids.end());
  std::vector<Range> ranges;
  auto next = slices.begin();
  for (const auto id : ids) {
    ranges.clear();
    for (; next != slices.end() && std::get<0>(*next) == id; ++next) {
      ranges.push_back({std::get<1>(*next), std::get<2>(*next)});
    }
    const Tokens length = plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
    if (auto problem = coverage_problem(ranges, length, "slice")) {
      return fmt::format("micro-batch {}: the linear layout of sequence {} {}", m, id, *problem);
    }
  }
  return std::nullopt;
}

Violation check_linear_layouts(const Plan& plan) {
  std::vector<std::int64_t> micro_batch_of(plan.sequence_lengths_tokens.size(), -1);
  for_each_sequence(plan,
                    [&](std::size_t m, std::size_t, const AttentionGroup&,
                        const SequenceChunks& sequence) -> Violation {
                      micro_batch_of[static_cast<std::size_t>(sequence.sequence_id)] =
                          static_cast<std::int64_t>(m);
                      return std::nullopt;
                    });
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    const auto& layout = plan.micro_batches[m].linear_layout;
    if (layout.empty()) continue;
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (auto violation = check_slice(plan, m, i, layout[i], micro_batch_of)) return violation;
    }
    if (auto violation = check_linear_cover(plan, m)) return violation;
  }
  return std::nullopt;
}

// ---------------------------------------------------------------- memory

/// Bytes per GPU, as simulate reports peak memory: a rank of a TP plan is a group of
/// `gpus_per_rank` GPUs, each holding 1/N of its bytes.
std::string describe_overflow(int rank, const plan_detail::RankPeak& peak, Bytes limit,
                              Bytes model_states, int gpus_per_rank) {
  const auto per_gpu = [gpus_per_rank](Bytes bytes) { return ceil_div(bytes, Bytes{gpus_per_rank}); };
  const Bytes need = per_gpu(peak.peak_bytes);
  limit /= gpus_per_rank;
  const std::string who =
      gpus_per_rank > 1 ? fmt::format("rank {} (a TP group of {} GPUs)", rank, gpus_per_rank)
                        : fmt::format("rank {}", rank);
  const std::string unit = gpus_per_rank > 1 ? " per GPU" : "";
  // One decimal, or three when one decimal would print the need equal to the limit.
  const int decimals = gib(need) == gib(limit) ? 3 : 1;
  if (peak.micro_batch < 0) {
    return fmt::format(
        "{} needs {}{} for model states alone but the limit is {}{}; use more "
        "ranks (ZeRO-3 shards model states over all ranks)",
        who, gib(need, decimals), unit, gib(limit, decimals), unit);
  }
  std::string terms = fmt::format("model states {} + {} activation tokens", gib(per_gpu(model_states)),
                                  with_thousands(peak.activation_tokens));
  if (peak.transient_bytes > 0) {
    terms += fmt::format(" + {} attention buffers", gib(per_gpu(peak.transient_bytes), 2));
  }
  return fmt::format("{} needs {}{} in micro-batch {} but the limit is {}{} ({})", who,
                     gib(need, decimals), unit, peak.micro_batch, gib(limit, decimals), unit, terms);
}

Violation check_memory(const Plan& plan, const CostModel& cost) {
  const Bytes limit = cost.memory_limit_bytes();
  const auto peaks = plan_detail::rank_peaks(plan, cost);
  for (std::size_t rank = 0; rank < peaks.size(); ++rank) {
    if (peaks[rank].peak_bytes > limit) {
      return describe_overflow(static_cast<int>(rank), peaks[rank], limit,
                               cost.model_state_bytes_per_rank(), plan.cluster.tensor_parallel.gpus);
    }
  }
  return std::nullopt;
}

}  // namespace

ValidationResult validate(const Plan& plan, const CostModel& cost) {
  // Later checks rely on earlier ones (ids in range before coverage, group ranks in range
  // before queues), so the order is part of the contract (docs/plan-format.md).
  Violation violation = check_version(plan);
  if (!violation) violation = check_matches_cost(plan, cost);
  if (!violation) violation = check_tensor_parallel_heads(plan);
  if (!violation) violation = check_size(plan);
  if (!violation) violation = check_group_ranks(plan);
  if (!violation) violation = check_group_shapes(plan);
  if (!violation) violation = check_routing(plan);
  if (!violation) violation = check_lengths(plan);
  if (!violation) violation = check_membership(plan);
  if (!violation) violation = check_chunks(plan);
  if (!violation) violation = check_chunk_ranks(plan);
  if (!violation) violation = plan_detail::check_queues(plan);
  if (!violation) violation = check_linear_layouts(plan);
  if (!violation) violation = check_memory(plan, cost);
  if (violation) return ValidationResult{false, *violation};
  return ValidationResult{};
}

void require_valid(const Plan& plan, const CostModel& cost, const std::string& source) {
  const ValidationResult result = validate(plan, cost);
  if (!result.ok) throw InputError(fmt::format("plan {} is invalid: {}", source, result.message));
}

}  // namespace ballast
