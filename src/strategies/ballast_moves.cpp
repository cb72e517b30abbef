// The ballast strategy's local-search moves (ballast.hpp, docs/strategies.md "ballast"):
// each rewrites one or two micro-batches around a micro-batch's slowest rank, keeping
// explicit queues consistent and the remap's layout rebuilt (or dropped) for what it moved.
#include <algorithm>
#include <limits>
#include <numeric>
#include <optional>

#include "ballast.hpp"
#include "builders.hpp"
#include "ulysses.hpp"
#include "zeppelin.hpp"
#include "zeppelin_remap.hpp"

namespace ballast::strategies::ballast_search {

namespace {

/// Sequences of one kind a move tries per group (the longest ones, or those closest to
/// the ideal amount to shift): more screens more moves for little gain.
constexpr std::size_t kSequencesPerGroup = 3;
constexpr Seconds kInfinity = std::numeric_limits<Seconds>::infinity();
/// Sequences one level move shifts at most.
constexpr int kMaxLevelMoves = 256;
/// Least-loaded ranks a level-step swap looks at for a partner (each pair of their local
/// sequences is priced: a handful keeps it cheap).
constexpr int kSwapPartners = 8;
/// The share of a rank's token capacity a grow move deals sequences into: the rest is left
/// for the groups' attention buffers (0.21-0.36 GiB of 72 on zeppelin-a800-13b-magi, ~0.5%).
constexpr double kDealtCapacityShare = 0.98;
/// Times a grow move deals the evicted sequences again around a group that took in those
/// no rank had room for.
constexpr int kGrowDealRounds = 3;
/// A dissolve move keeps the group's 0, 1, 2, 4, ... longest sequences (by local time) in
/// it, at most this many, and deals the others locally.
constexpr std::size_t kMaxDissolveKept = 16;

Tokens length_of(const Plan& plan, std::int64_t id) {
  return plan.sequence_lengths_tokens[static_cast<std::size_t>(id)];
}

/// A group of `scheme` over `ranks` holding whole sequences `ids` (in that order): local on
/// one rank; unpadded zigzag chunks for ring and all-gather; Ulysses' contiguous ranges of
/// the concatenated sequences (ulysses_group, no padding).
AttentionGroup build_group(Scheme scheme, const std::vector<int>& ranks,
                           const std::vector<std::int64_t>& ids, const Plan& plan,
                           int ulysses_degree = 1) {
  if (ranks.size() > 1 && scheme == Scheme::ulysses) return ulysses_group(ids, ranks, plan);
  AttentionGroup group;
  group.scheme = ranks.size() == 1 ? Scheme::local : scheme;
  group.ranks = ranks;
  // USP: zigzag over all u x r members, so each stage of u consecutive members holds
  // mirrored chunks and the stages' causal work is balanced, as a ring's members' is.
  if (group.scheme == Scheme::usp) group.ulysses_degree = ulysses_degree;
  for (std::int64_t id : ids) {
    const Tokens length = length_of(plan, id);
    if (ranks.size() == 1) {
      group.sequences.push_back(whole_sequence(id, length, ranks.front()));
    } else {
      group.sequences.push_back({id, length, zigzag_chunks_unpadded(length, ranks)});
    }
  }
  return group;
}

/// `group` with the routing zeppelin would give it (zeppelin::ring_routing, priced by
/// `ring_router`) when it is a ring over several nodes; as it is without a router
/// (build_group() builds every group unrouted).
AttentionGroup routed(AttentionGroup group, const CostModel& cost, const PlanEvaluator* ring_router) {
  if (ring_router == nullptr || group.scheme != Scheme::ring) return group;
  const zeppelin::Routing routing = zeppelin::ring_routing(group, cost, *ring_router);
  group.routing_proxies = routing.proxies;
  group.routing_chunks = routing.chunks;
  return group;
}

std::vector<std::int64_t> ids_of(const AttentionGroup& group) {
  std::vector<std::int64_t> ids;
  for (const SequenceChunks& sequence : group.sequences) ids.push_back(sequence.sequence_id);
  return ids;
}

bool holds_rank(const AttentionGroup& group, int rank) {
  return std::find(group.ranks.begin(), group.ranks.end(), rank) != group.ranks.end();
}

/// One micro-batch being rewritten: groups erased, replaced or appended, with `origin`
/// tracking which groups are unchanged (kept in the plan, not copied: MicroBatchEdit) and
/// queues kept listing each rank's groups.
class EditBuilder {
 public:
  EditBuilder(const Plan& plan, int index) : plan_(plan) {
    const MicroBatch& base = plan.micro_batches[static_cast<std::size_t>(index)];
    edit_.index = index;
    edit_.base = &base;
    edit_.origin.resize(base.groups.size());
    std::iota(edit_.origin.begin(), edit_.origin.end(), 0);
    edit_.added_index.assign(base.groups.size(), -1);
    edit_.queues = base.queues;
    remapped_ = !base.linear_layout.empty();
  }
  /// A new, empty micro-batch appended after the plan's (index: their count), remapped
  /// like the plan's first one.
  static EditBuilder appended(const Plan& plan) {
    EditBuilder edit(plan);
    edit.edit_.index = static_cast<int>(plan.micro_batches.size());
    edit.remapped_ = !plan.micro_batches.empty() && !plan.micro_batches.front().linear_layout.empty();
    if (!plan.micro_batches.empty() && !plan.micro_batches.front().queues.empty()) {
      edit.edit_.queues.resize(plan.micro_batches.front().queues.size());
    }
    return edit;
  }
  std::size_t group_count() const { return edit_.group_count(); }
  /// Valid until the group is replaced, erased or grown (add_local).
  const AttentionGroup& group(std::size_t g) const { return edit_.group(g); }

  /// The index of `rank`'s first local group (-1: none).
  int local_group_of(int rank) const {
    for (std::size_t g = 0; g < group_count(); ++g) {
      const AttentionGroup& candidate = group(g);
      if (candidate.scheme == Scheme::local && candidate.ranks.front() == rank) return static_cast<int>(g);
    }
    return -1;
  }
  /// Attention tokens each of `ranks` holds in the micro-batch being built (what its
  /// memory must fit).
  std::vector<Tokens> attention_tokens_held(std::size_t ranks) const {
    std::vector<Tokens> held(ranks, 0);
    for (std::size_t g = 0; g < group_count(); ++g) {
      for (const SequenceChunks& sequence : group(g).sequences) {
        for (const Chunk& chunk : sequence.chunks) held[static_cast<std::size_t>(chunk.rank)] += chunk.size();
      }
    }
    return held;
  }

  void erase_group(int g) {
    std::vector<bool> erased(group_count(), false);
    erased[static_cast<std::size_t>(g)] = true;
    erase_groups(erased);
  }
  /// Erases every group g with erased[g] in one pass over the groups and queues (where
  /// erase_group() one by one would pass over them once per group).
  void erase_groups(const std::vector<bool>& erased) {
    local_of_rank_.clear();
    std::vector<int> index(group_count(), -1);
    std::size_t kept = 0;
    for (std::size_t g = 0; g < erased.size(); ++g) {
      if (erased[g]) continue;
      index[g] = static_cast<int>(kept);
      edit_.origin[kept] = edit_.origin[g];
      edit_.added_index[kept] = edit_.added_index[g];
      ++kept;
    }
    edit_.origin.resize(kept);
    edit_.added_index.resize(kept);
    for (std::vector<int>& queue : edit_.queues) {
      std::size_t length = 0;
      for (const int g : queue) {
        if (index[static_cast<std::size_t>(g)] >= 0) queue[length++] = index[static_cast<std::size_t>(g)];
      }
      queue.resize(length);
    }
  }
  /// Appended last in each member's queue: it waits for everything they ran before, so
  /// no queue order can deadlock on it.
  void append_group(AttentionGroup group) {
    const auto g = static_cast<int>(group_count());
    if (!edit_.queues.empty()) {
      for (int rank : group.ranks) edit_.queues[static_cast<std::size_t>(rank)].push_back(g);
    }
    if (!local_of_rank_.empty() && group.scheme == Scheme::local) {
      int& local = local_of_rank_[static_cast<std::size_t>(group.ranks.front())];
      if (local < 0) local = g;
    }
    edit_.added.push_back(std::move(group));
    edit_.origin.push_back(-1);
    edit_.added_index.push_back(static_cast<int>(edit_.added.size()) - 1);
  }
  /// A group on the same ranks (queues unchanged).
  void replace_group(int g, AttentionGroup group) {
    local_of_rank_.clear();
    owned(g, /*copy=*/false) = std::move(group);
  }
  /// Removes sequence `s` of group `g` (the group's other sequences keep their chunks,
  /// Ulysses' are re-cut over the ranks; an emptied group is erased); returns its id.
  std::int64_t take_sequence(int g, std::size_t s) {
    AttentionGroup group = this->group(static_cast<std::size_t>(g));
    const std::int64_t id = group.sequences[s].sequence_id;
    group.sequences.erase(group.sequences.begin() + static_cast<std::ptrdiff_t>(s));
    if (group.sequences.empty()) {
      erase_group(g);
    } else if (group.scheme == Scheme::ulysses) {
      AttentionGroup recut = build_group(Scheme::ulysses, group.ranks, ids_of(group), plan_);
      replace_group(g, std::move(recut));
    } else {
      replace_group(g, std::move(group));
    }
    return id;
  }
  /// The sequence whole on `rank`: into the rank's local group (the first, as
  /// local_group_of(rank) finds it), grown in place (copied from the plan first), or a new
  /// one. The re-deals add thousands of sequences to one edit at 1,024 GPUs: each rank's
  /// local group is looked up in an index built on the first call, not by a scan of the
  /// groups per sequence.
  void add_local(int rank, std::int64_t id) {
    if (local_of_rank_.empty()) {
      local_of_rank_.assign(static_cast<std::size_t>(plan_.cluster.ranks()), -1);
      for (std::size_t g = group_count(); g-- > 0;) {
        const AttentionGroup& candidate = group(g);
        if (candidate.scheme == Scheme::local) local_of_rank_[static_cast<std::size_t>(candidate.ranks.front())] = static_cast<int>(g);
      }
    }
    const int g = local_of_rank_[static_cast<std::size_t>(rank)];
    if (g < 0) {
      append_group(build_group(Scheme::local, {rank}, {id}, plan_));
      return;
    }
    owned(g, /*copy=*/true).sequences.push_back(whole_sequence(id, length_of(plan_, id), rank));
  }
  /// The edit, with a remap's linear layout built for the new chunks (zeppelin's
  /// balanced_linear_layout, which needs unpadded chunks; none when some are padded).
  MicroBatchEdit finish() {
    if (remapped_) {
      bool padded = false;
      for (std::size_t g = 0; g < group_count(); ++g) {
        for (const SequenceChunks& sequence : group(g).sequences) {
          padded = padded || sequence.padded_length_tokens != length_of(plan_, sequence.sequence_id);
        }
      }
      edit_.linear_layout.clear();
      if (!padded) edit_.linear_layout = balanced_linear_layout(edit_.micro_batch(), plan_.cluster);
    }
    return std::move(edit_);
  }

 private:
  explicit EditBuilder(const Plan& plan) : plan_(plan) {}
  /// Group g, the edit's own from here on (its origin becomes -1): a group kept from the
  /// plan gets a place in the edit, the plan's group copied there when `copy` (to grow it)
  /// and empty otherwise (to be replaced).
  AttentionGroup& owned(int g, bool copy) {
    const auto at = static_cast<std::size_t>(g);
    if (edit_.added_index[at] < 0) {
      edit_.added.push_back(copy ? edit_.base->groups[static_cast<std::size_t>(edit_.origin[at])]
                                 : AttentionGroup{});
      edit_.added_index[at] = static_cast<int>(edit_.added.size()) - 1;
    }
    edit_.origin[at] = -1;
    return edit_.added[static_cast<std::size_t>(edit_.added_index[at])];
  }
  const Plan& plan_;
  MicroBatchEdit edit_;
  bool remapped_ = false;  ///< the micro-batch has a linear layout (rebuilt by finish())
  /// add_local()'s index: per rank, its first local group (-1: none); empty until
  /// add_local() builds it, kept by append_group(), cleared by any other change of the
  /// groups.
  std::vector<int> local_of_rank_;
};

/// Ranks in ascending estimated time (ties: lower rank).
std::vector<int> ranks_by_load(const std::vector<Seconds>& rank_time_s) {
  std::vector<int> order(rank_time_s.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return rank_time_s[static_cast<std::size_t>(a)] < rank_time_s[static_cast<std::size_t>(b)];
  });
  return order;
}

/// The `count` least-loaded ranks of the node whose count-th least-loaded rank is the
/// least loaded (ties: lower node), ascending; empty when count exceeds a node.
std::vector<int> least_loaded_on_one_node(const Cluster& cluster,
                                          const std::vector<Seconds>& rank_time_s, int count) {
  if (count > cluster.gpus_per_node) return {};
  std::vector<int> best;
  Seconds best_s = 0;
  for (int node = 0; node < cluster.nodes; ++node) {
    std::vector<Seconds> loads(rank_time_s.begin() + node * cluster.gpus_per_node,
                               rank_time_s.begin() + (node + 1) * cluster.gpus_per_node);
    std::vector<int> order = ranks_by_load(loads);
    order.resize(static_cast<std::size_t>(count));
    const Seconds score_s = loads[static_cast<std::size_t>(order.back())];
    if (!best.empty() && score_s >= best_s) continue;
    best_s = score_s;
    best.clear();
    for (int local : order) best.push_back(node * cluster.gpus_per_node + local);
  }
  std::sort(best.begin(), best.end());
  return best;
}

}  // namespace

Seconds local_sequence_time_s(const CostModel& cost, Tokens length) {
  Seconds time_s = 0;
  const AttentionBlock block = whole_document(length);
  for (Pass pass : {Pass::forward, Pass::backward}) {
    time_s += pass_count(cost.model(), pass) *
              (cost.attention_time_s({&block, 1}, 1, pass) + cost.linear_time_s(length, pass));
  }
  return time_s;
}

namespace {

/// Indices of the sequences of `group` to try: the kSequencesPerGroup whose local time is
/// closest to `ideal_s` (ties: lower index).
std::vector<std::size_t> sequences_near(const AttentionGroup& group, const Plan& plan,
                                        const CostModel& cost, Seconds ideal_s) {
  std::vector<std::pair<Seconds, std::size_t>> scored;
  for (std::size_t s = 0; s < group.sequences.size(); ++s) {
    const Seconds time_s = local_sequence_time_s(cost, length_of(plan, group.sequences[s].sequence_id));
    scored.emplace_back(std::abs(time_s - ideal_s), s);
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::size_t> picked;
  for (std::size_t i = 0; i < scored.size() && i < kSequencesPerGroup; ++i) picked.push_back(scored[i].second);
  return picked;
}

/// Indices of the kSequencesPerGroup longest sequences (ties: lower index).
std::vector<std::size_t> longest_sequences(const AttentionGroup& group, const Plan& plan) {
  std::vector<std::size_t> order(group.sequences.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return length_of(plan, group.sequences[a].sequence_id) >
           length_of(plan, group.sequences[b].sequence_id);
  });
  if (order.size() > kSequencesPerGroup) order.resize(kSequencesPerGroup);
  return order;
}

/// Group sizes a new group of one node may take: powers of two up to a node, and the node.
std::vector<int> node_group_sizes(const Cluster& cluster) {
  std::vector<int> sizes;
  for (int size = 2; size < cluster.gpus_per_node; size *= 2) sizes.push_back(size);
  if (cluster.gpus_per_node >= 2) sizes.push_back(cluster.gpus_per_node);
  return sizes;
}

/// A USP layout: the group's ranks in order and its Ulysses degree (0: none).
struct Transposed {
  std::vector<int> ranks;
  int ulysses_degree = 0;
};

/// The sorted `ranks` as a USP group whose stages cross the nodes and whose rings stay
/// inside them: stage s holds the s-th member of every node (u = the nodes),
/// so member m's ring runs on node m's NVLink and only the all-to-alls cross nodes (per
/// member (u - 1) / u of its tokens' QKV and output, against a ring's KV of every other
/// stage). None unless the ranks hold the same number (>= 2) on each of >= 2 nodes and
/// a Ulysses group of that many ranks is allowed. (usp_degrees() places stages inside
/// nodes, as USP does; this is the transposed layout.)
Transposed stages_across_nodes(const std::vector<int>& ranks, const CostModel& cost) {
  std::vector<std::vector<int>> by_node;  // sorted ranks: a node's members are adjacent
  for (int rank : ranks) {
    if (by_node.empty() || !cost.cluster().same_node(rank, by_node.back().front())) by_node.emplace_back();
    by_node.back().push_back(rank);
  }
  const auto nodes = static_cast<int>(by_node.size());
  if (nodes < 2 || !ulysses_group_allowed(cost, nodes)) return {};
  const std::size_t per_node = by_node.front().size();
  if (per_node < 2) return {};
  for (const std::vector<int>& members : by_node) {
    if (members.size() != per_node) return {};
  }
  Transposed transposed{{}, nodes};
  for (std::size_t s = 0; s < per_node; ++s) {
    for (const std::vector<int>& members : by_node) transposed.ranks.push_back(members[s]);
  }
  return transposed;
}

/// Ulysses degrees u of a USP group over `ranks` (in their order) the search tries: the
/// largest and the second largest u >= 2 with at least two stages, every stage of u
/// consecutive members on one node (the all-to-all on NVLink, the ring across nodes, as
/// USP places them) and u allowed by the heads (ulysses_group_allowed).
std::vector<int> usp_degrees(const std::vector<int>& ranks, const CostModel& cost) {
  const auto size = static_cast<int>(ranks.size());
  std::vector<int> degrees;
  for (int u = size / 2; u >= 2 && degrees.size() < 2; --u) {
    if (size % u != 0 || !ulysses_group_allowed(cost, u)) continue;
    bool on_one_node = true;
    for (int i = 0; i < size && on_one_node; ++i) {
      on_one_node = cost.cluster().same_node(ranks[static_cast<std::size_t>(i)],
                                              ranks[static_cast<std::size_t>(i - i % u)]);
    }
    if (on_one_node) degrees.push_back(u);
  }
  return degrees;
}

class MoveGenerator {
 public:
  MoveGenerator(const Plan& plan, const PlanEstimate& estimate, const CostModel& cost,
                std::size_t max_moves, Loads loads, const PlanEvaluator* ring_router)
      : plan_(plan), estimate_(estimate), cost_(cost), max_moves_(max_moves), loads_(loads),
        ring_router_(ring_router) {}

  std::vector<Move> run() {
    const std::vector<int> order = micro_batches_by_time();
    if (loads_ == Loads::re_deal) {
      re_deal(true);
      // A new micro-batch only where memory kept the free deal off a less-loaded rank.
      if (re_deal(false)) re_deal(false, true);
      // Dealt by the step's loads into the last micro-batch first; then each rank's own
      // sequences so (both need several micro-batches).
      if (plan_.micro_batches.size() >= 2) re_deal(false, false, true);
      fill_last();
      return std::move(moves_);
    }
    if (loads_ == Loads::whole_step) return whole_step_moves(order);
    for (int m : order) {
      if (full()) break;
      around_slowest_rank(m);
    }
    if (order.size() >= 2) between_micro_batches(order.front(), order.back());
    if (moves_.size() > max_moves_) moves_.resize(max_moves_);
    std::vector<Move> critical = std::move(moves_);
    moves_.clear();
    for (int m : order) off_critical_path(m);
    if (moves_.size() > max_moves_) moves_.resize(max_moves_);
    critical.insert(critical.end(), std::make_move_iterator(moves_.begin()), std::make_move_iterator(moves_.end()));
    return critical;
  }

 private:
  bool full() const { return moves_.size() >= max_moves_; }
  /// build_group() over the plan; with a ring router, a ring over several nodes routed as
  /// zeppelin would route it (routed()).
  AttentionGroup build(Scheme scheme, const std::vector<int>& ranks, const std::vector<std::int64_t>& ids,
                       int ulysses_degree = 1) const {
    return routed(build_group(scheme, ranks, ids, plan_, ulysses_degree), cost_, ring_router_);
  }
  /// The attention tokens a rank may be dealt: kDealtCapacityShare of its capacity (the
  /// groups' attention buffers take memory too, under 1% of it on the presets).
  Tokens dealt_capacity_tokens() const {
    return static_cast<Tokens>(kDealtCapacityShare * static_cast<double>(cost_.token_capacity_per_rank()));
  }
  const MicroBatch& micro_batch(int m) const { return plan_.micro_batches[static_cast<std::size_t>(m)]; }
  const std::vector<Seconds>& loads(int m) const {
    return estimate_.micro_batches[static_cast<std::size_t>(m)].rank_time_s;
  }
  void add(MoveKind kind, EditBuilder edit) {
    // Not {kind, {edit.finish()}}: an initializer list would copy the micro-batch.
    Move move{kind, {}};
    move.edits.push_back(edit.finish());
    moves_.push_back(std::move(move));
  }
  /// A move of two micro-batches (edits in ascending index).
  void add(MoveKind kind, EditBuilder first, EditBuilder second) {
    Move move{kind, {}};
    move.edits.push_back(first.finish());
    move.edits.push_back(second.finish());
    if (move.edits[0].index > move.edits[1].index) std::swap(move.edits[0], move.edits[1]);
    moves_.push_back(std::move(move));
  }

  /// Slowest first (ties: lower index).
  std::vector<int> micro_batches_by_time() const {
    std::vector<int> order(plan_.micro_batches.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return estimate_.micro_batches[static_cast<std::size_t>(a)].time_s >
             estimate_.micro_batches[static_cast<std::size_t>(b)].time_s;
    });
    return order;
  }

  void around_slowest_rank(int m) {
    const std::vector<int> by_load = ranks_by_load(loads(m));
    const int slowest = by_load.back();
    const int least = by_load.front();
    if (slowest == least) return;
    const Seconds gap_s = loads(m)[static_cast<std::size_t>(slowest)] - loads(m)[static_cast<std::size_t>(least)];
    const bool before_sync = loads_ == Loads::before_sync;
    if (before_sync) level(m);
    const auto& groups = micro_batch(m).groups;
    for (std::size_t g = 0; g < groups.size(); ++g) {
      const AttentionGroup& group = groups[g];
      if (!holds_rank(group, slowest)) continue;
      const bool local = group.ranks.size() == 1;
      if (local) move_local(m, static_cast<int>(g), least, gap_s);
      if (group.sequences.size() >= 2) extract(m, static_cast<int>(g), least);
      if (!local) change_scheme(m, static_cast<int>(g));
      if (!local && group.sequences.size() >= 2) split(m, static_cast<int>(g));
      if (!local) merge(m, static_cast<int>(g));
      if (!local && before_sync) grow(m, static_cast<int>(g));
      if (!local && before_sync && group.sequences.size() >= 2) dissolve(m, static_cast<int>(g));
    }
  }

  /// (h) Dissolve: a multi-sequence group's sequences local on its ranks, dealt longest
  /// local time first to the rank with the least so far (no communication at all); and the
  /// same with the longest sequence kept as the group (its scheme, its ranks), the others
  /// dealt around it. validate() rejects what a rank cannot hold.
  void dissolve(int m, int g) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    std::vector<std::pair<Seconds, std::int64_t>> by_time;
    for (const SequenceChunks& sequence : group.sequences) {
      by_time.emplace_back(local_sequence_time_s(cost_, length_of(plan_, sequence.sequence_id)), sequence.sequence_id);
    }
    std::stable_sort(by_time.begin(), by_time.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    for (std::size_t first = 0; first < by_time.size() && first <= kMaxDissolveKept;
         first = first == 0 ? 1 : 2 * first) {
      EditBuilder edit(plan_, m);
      edit.erase_group(g);
      std::vector<Seconds> dealt_s(group.ranks.size(), 0.0);
      if (first > 0) {
        const std::vector<std::int64_t> longest_ids = [&] {
          std::vector<std::int64_t> ids;
          for (std::size_t i = 0; i < first; ++i) ids.push_back(by_time[i].second);
          std::sort(ids.begin(), ids.end());
          return ids;
        }();
        AttentionGroup kept = group;
        kept.sequences.clear();
        for (const SequenceChunks& sequence : group.sequences) {
          if (std::binary_search(longest_ids.begin(), longest_ids.end(), sequence.sequence_id)) {
            kept.sequences.push_back(sequence);
          }
        }
        if (kept.scheme == Scheme::ulysses) kept = build(Scheme::ulysses, kept.ranks, ids_of(kept));
        edit.append_group(std::move(kept));
      }
      for (std::size_t i = first; i < by_time.size(); ++i) {
        const auto least = static_cast<std::size_t>(
            std::min_element(dealt_s.begin(), dealt_s.end()) - dealt_s.begin());
        edit.add_local(group.ranks[least], by_time[i].second);
        dealt_s[least] += by_time[i].first;
      }
      add(MoveKind::dissolve, std::move(edit));
    }
  }

  /// (d) Grow: the group over its ranks and the least-loaded ranks of one node outside it
  /// (as many as it has, up to a node), under its scheme where the heads allow (else as a
  /// ring) and as USP of each degree usp_degrees() offers; each twice: the added ranks keep
  /// their own groups (a level move can then take their local sequences elsewhere), or
  /// their local groups' sequences are dealt over the micro-batch (deal_locally), for when
  /// a rank full of them could not also hold its share of the group. The least-loaded
  /// ranks are often another group's members, which would then run both groups, so grow
  /// also (i) takes them from the groups that hold them (displacing(): those shrink to
  /// their other ranks and their longest sequence, their other sequences are dealt), and
  /// (ii) grows onto the least-loaded ranks of one node that are in no other multi-rank
  /// group, where those differ (zeppelin-h800-moe-wlbllm-128k step 0: a 107,561-token USP
  /// group of 24 GPUs grows onto a node of local sequences, 0.245 -> 0.205 s).
  void grow(int m, int g) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    const Cluster& cluster = cost_.cluster();
    std::vector<Seconds> load_s = loads(m);
    for (int rank : group.ranks) load_s[static_cast<std::size_t>(rank)] = kInfinity;
    const int count = std::min(static_cast<int>(group.ranks.size()), cluster.gpus_per_node);
    const std::vector<int> added = least_loaded_on_one_node(cluster, load_s, count);
    if (!reachable(added, load_s)) return;
    GrowBase without{EditBuilder(plan_, m), {}, std::vector<Seconds>(load_s.size(), 0.0)};
    without.edit.erase_group(g);
    grow_onto(m, g, added, without);
    if (std::optional<GrowBase> displaced = displacing(m, g, added)) grow_onto(m, g, added, *displaced);
    std::vector<Seconds> free_load_s = load_s;
    for (const AttentionGroup& other : micro_batch(m).groups) {
      if (other.ranks.size() < 2) continue;
      for (int rank : other.ranks) free_load_s[static_cast<std::size_t>(rank)] = kInfinity;
    }
    const std::vector<int> free_added = least_loaded_on_one_node(cluster, free_load_s, count);
    if (free_added != added && reachable(free_added, free_load_s)) grow_onto(m, g, free_added, without);
  }

  /// Whether `ranks` is a node's set least_loaded_on_one_node found (non-empty, none of
  /// them excluded by an infinite load).
  static bool reachable(const std::vector<int>& ranks, const std::vector<Seconds>& load_s) {
    return !ranks.empty() && std::none_of(ranks.begin(), ranks.end(), [&](int rank) {
      return load_s[static_cast<std::size_t>(rank)] == kInfinity;
    });
  }

  /// What grow starts from: the micro-batch without the grown group (and with the groups
  /// it displaces shrunk), the sequences those gave up (dealt with the added ranks' local
  /// ones) and what that did to each rank's estimated load.
  struct GrowBase {
    EditBuilder edit;
    std::vector<std::int64_t> spilled;
    std::vector<Seconds> load_delta_s;
  };

  /// Micro-batch m without group g, and every other multi-rank group that holds one of
  /// `taken` over its other ranks with its longest sequence only (its scheme; the others
  /// spilled): what grow needs to take another group's members for itself. Each rank's
  /// load moves by the groups' shares (group_share_s) before and after, the longest
  /// sequence's part of it (by local time) over the ranks left.
  /// nullopt when no group holds one of them, or one cannot shrink under its scheme
  /// (Ulysses beyond what the heads allow, USP whose Ulysses degree does not divide what
  /// is left).
  std::optional<GrowBase> displacing(int m, int g, const std::vector<int>& taken) const {
    const auto& groups = micro_batch(m).groups;
    std::vector<int> shrunk;
    std::vector<AttentionGroup> rebuilt;
    GrowBase base{EditBuilder(plan_, m), {}, std::vector<Seconds>(loads(m).size(), 0.0)};
    for (std::size_t other = 0; other < groups.size(); ++other) {
      const AttentionGroup& group = groups[other];
      if (static_cast<int>(other) == g || group.ranks.size() < 2) continue;
      std::vector<int> left;
      for (int rank : group.ranks) {
        if (!std::binary_search(taken.begin(), taken.end(), rank)) left.push_back(rank);
      }
      if (left.size() == group.ranks.size()) continue;
      if (left.empty()) return std::nullopt;
      const auto size = static_cast<int>(left.size());
      if (size > 1 && group.scheme == Scheme::ulysses && !ulysses_group_allowed(cost_, size)) return std::nullopt;
      if (size > 1 && group.scheme == Scheme::usp && size % group.ulysses_degree != 0) return std::nullopt;
      std::int64_t longest = group.sequences.front().sequence_id;
      Seconds local_s = 0;
      for (const SequenceChunks& sequence : group.sequences) {
        local_s += local_sequence_time_s(cost_, length_of(plan_, sequence.sequence_id));
        if (length_of(plan_, sequence.sequence_id) > length_of(plan_, longest)) longest = sequence.sequence_id;
      }
      const Seconds all_s = group_share_s(m, group) * static_cast<double>(group.ranks.size());
      for (const SequenceChunks& sequence : group.sequences) {
        if (sequence.sequence_id != longest) base.spilled.push_back(sequence.sequence_id);
      }
      shrunk.push_back(static_cast<int>(other));
      rebuilt.push_back(build(group.scheme, left, {longest}, group.ulysses_degree));
      for (int rank : group.ranks) base.load_delta_s[static_cast<std::size_t>(rank)] -= all_s / static_cast<double>(group.ranks.size());
      const Seconds kept_s = all_s * local_sequence_time_s(cost_, length_of(plan_, longest)) / local_s;
      for (int rank : left) base.load_delta_s[static_cast<std::size_t>(rank)] += kept_s / static_cast<double>(left.size());
    }
    if (shrunk.empty()) return std::nullopt;
    shrunk.push_back(g);
    std::sort(shrunk.begin(), shrunk.end());
    for (auto it = shrunk.rbegin(); it != shrunk.rend(); ++it) base.edit.erase_group(*it);
    for (AttentionGroup& group : rebuilt) base.edit.append_group(std::move(group));
    return base;
  }

  /// Grow's candidates for group g of micro-batch m onto ranks `added`, from `base`.
  void grow_onto(int m, int g, const std::vector<int>& added, const GrowBase& base) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    std::vector<int> ranks = group.ranks;
    ranks.insert(ranks.end(), added.begin(), added.end());
    std::sort(ranks.begin(), ranks.end());
    const std::vector<std::int64_t> ids = ids_of(group);
    const auto size = static_cast<int>(ranks.size());
    const Seconds group_s = group_share_s(m, group) * static_cast<double>(group.ranks.size());
    // `order`: the grown group's ranks in group order (its members, sorted, by default).
    const auto add_grown = [&](Scheme scheme, int degree, const std::vector<int>& order) {
      EditBuilder evicting = base.edit;
      if (base.spilled.empty()) {  // else the spilled sequences must be dealt
        EditBuilder kept = base.edit;
        kept.append_group(build(scheme, order, ids, degree));
        add(MoveKind::grow, std::move(kept));
      }
      std::vector<std::int64_t> evicted = take_local_sequences(evicting, added);
      evicted.insert(evicted.end(), base.spilled.begin(), base.spilled.end());
      if (evicted.empty()) return;
      // What no rank has room for joins the grown group, and the rest is dealt again
      // around the group that holds it (a few rounds: each only adds to the group; no
      // move when some still find no room after the last, as it would leave them out).
      std::vector<std::int64_t> joined = ids;
      for (int round = 0; round < kGrowDealRounds; ++round) {
        EditBuilder dealt = evicting;
        dealt.append_group(build(scheme, order, joined, degree));
        const std::vector<std::int64_t> unplaced =
            deal_locally(dealt, m, group, group_s, ranks, added, evicted, base.load_delta_s);
        if (unplaced.empty()) {
          add(MoveKind::grow, std::move(dealt));
          return;
        }
        for (std::int64_t id : unplaced) {
          joined.push_back(id);
          evicted.erase(std::find(evicted.begin(), evicted.end(), id));
        }
      }
    };
    if (group.scheme == Scheme::ring || group.scheme == Scheme::all_gather ||
        (group.scheme == Scheme::ulysses && ulysses_group_allowed(cost_, size))) {
      add_grown(group.scheme, 1, ranks);
    } else {
      add_grown(Scheme::ring, 1, ranks);
    }
    for (int degree : usp_degrees(ranks, cost_)) add_grown(Scheme::usp, degree, ranks);
    if (const Transposed transposed = stages_across_nodes(ranks, cost_); transposed.ulysses_degree > 0) {
      add_grown(Scheme::usp, transposed.ulysses_degree, transposed.ranks);
    }
  }

  /// Removes the local groups of `ranks` from the edit; returns their sequences' ids.
  static std::vector<std::int64_t> take_local_sequences(EditBuilder& edit, const std::vector<int>& ranks) {
    std::vector<std::int64_t> ids;
    std::vector<bool> taken(edit.group_count(), false);
    for (std::size_t g = edit.group_count(); g-- > 0;) {
      const AttentionGroup& group = edit.group(g);
      if (group.scheme != Scheme::local || !std::binary_search(ranks.begin(), ranks.end(), group.ranks.front())) continue;
      for (const SequenceChunks& sequence : group.sequences) ids.push_back(sequence.sequence_id);
      taken[g] = true;
    }
    edit.erase_groups(taken);
    return ids;
  }

  /// A multi-rank group's share of its members' loads in micro-batch m, the mean over its
  /// members of what their loads hold beyond their other groups (those at their
  /// sequences' local time shared over their ranks), and at least the group's own local
  /// time shared over its ranks: a group's communication and scheme overheads stay with
  /// it when it is resized, which its sequences' local time alone leaves out (a USP
  /// group of 24 GPUs dealt 6K tokens of local sequences onto each of its members on
  /// zeppelin-h800-moe-wlbllm-128k step 2).
  Seconds group_share_s(int m, const AttentionGroup& group) const {
    const auto share_s = [&](const AttentionGroup& other) {
      Seconds time_s = 0;
      for (const SequenceChunks& sequence : other.sequences) {
        time_s += local_sequence_time_s(cost_, length_of(plan_, sequence.sequence_id));
      }
      return time_s / static_cast<double>(other.ranks.size());
    };
    const std::vector<Seconds>& load_s = loads(m);
    Seconds measured_s = 0;
    for (int rank : group.ranks) {
      Seconds rest_s = load_s[static_cast<std::size_t>(rank)];
      for (const AttentionGroup& other : micro_batch(m).groups) {
        if (&other != &group && holds_rank(other, rank)) rest_s -= share_s(other);
      }
      measured_s += std::max(0.0, rest_s);
    }
    return std::max(share_s(group), measured_s / static_cast<double>(group.ranks.size()));
  }

  /// Sequences `ids` local on the ranks with room for them, the longest local time first,
  /// each to the rank whose estimated load is least so far: micro-batch m's loads, without
  /// the local groups taken from the `added` ranks, with `group`'s share `group_s`
  /// (group_share_s times its ranks) shared by the grown group's `ranks` instead of its
  /// own, plus `load_delta_s` (what displaced groups changed).
  /// Room: the rank's attention tokens with the grown group within kDealtCapacityShare of
  /// the token capacity. Returns the ids no rank has room for (not placed).
  std::vector<std::int64_t> deal_locally(EditBuilder& edit, int m, const AttentionGroup& group, Seconds group_s,
                                         const std::vector<int>& ranks, const std::vector<int>& added,
                                         const std::vector<std::int64_t>& ids,
                                         const std::vector<Seconds>& load_delta_s) {
    const auto local_time_s = [&](std::int64_t id) { return local_sequence_time_s(cost_, length_of(plan_, id)); };
    std::vector<Seconds> load_s = loads(m);
    for (std::size_t r = 0; r < load_s.size(); ++r) load_s[r] += load_delta_s[r];
    for (int rank : group.ranks) load_s[static_cast<std::size_t>(rank)] -= group_s / static_cast<double>(group.ranks.size());
    for (int rank : ranks) load_s[static_cast<std::size_t>(rank)] += group_s / static_cast<double>(ranks.size());
    for (const AttentionGroup& local : micro_batch(m).groups) {
      if (local.scheme != Scheme::local || !std::binary_search(added.begin(), added.end(), local.ranks.front())) continue;
      for (const SequenceChunks& sequence : local.sequences) {
        load_s[static_cast<std::size_t>(local.ranks.front())] -= local_time_s(sequence.sequence_id);
      }
    }
    // Attention tokens each rank holds with the grown group.
    std::vector<Tokens> held = edit.attention_tokens_held(load_s.size());
    const Tokens capacity = dealt_capacity_tokens();
    std::vector<std::pair<Seconds, std::int64_t>> by_time;
    for (std::int64_t id : ids) by_time.emplace_back(local_time_s(id), id);
    std::stable_sort(by_time.begin(), by_time.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<std::int64_t> unplaced;
    for (const auto& [time_s, id] : by_time) {
      const Tokens length = length_of(plan_, id);
      std::size_t least = load_s.size();
      for (std::size_t r = 0; r < load_s.size(); ++r) {
        if (held[r] + length <= capacity && (least == load_s.size() || load_s[r] < load_s[least])) least = r;
      }
      if (least == load_s.size()) {
        unplaced.push_back(id);
        continue;
      }
      edit.add_local(static_cast<int>(least), id);
      load_s[least] += time_s;
      held[least] += length;
    }
    return unplaced;
  }

  /// Every multi-rank group of micro-batch m without its slowest rank under another scheme
  /// (off the critical path a cheaper scheme leaves the step but frees its members, which
  /// the next round's moves can fill), marked off_critical_path.
  void off_critical_path(int m) {
    const std::vector<int> by_load = ranks_by_load(loads(m));
    const int slowest = by_load.back();
    const auto& groups = micro_batch(m).groups;
    for (std::size_t g = 0; g < groups.size() && !full(); ++g) {
      if (groups[g].ranks.size() < 2 || holds_rank(groups[g], slowest)) continue;
      const std::size_t first = moves_.size();
      change_scheme(m, static_cast<int>(g));
      if (loads_ == Loads::before_sync && groups[g].sequences.size() >= 2) dissolve(m, static_cast<int>(g));
      for (std::size_t i = first; i < moves_.size(); ++i) moves_[i].off_critical_path = true;
    }
  }

  /// Level: local sequences from the slowest rank to the least-loaded one, again and again
  /// on the loads as the moves leave them (each sequence's local time, local_sequence_time_s),
  /// while the slowest rank has a local sequence whose move lowers the larger of the two
  /// ranks' loads: one move where the step is set by many ranks of about the same load, which
  /// no single move_local can lower.
  void level(int m) {
    std::vector<Seconds> load_s = loads(m);
    EditBuilder edit(plan_, m);
    int moved = 0;
    for (int round = 0; round < kMaxLevelMoves; ++round) {
      const std::vector<int> by_load = ranks_by_load(load_s);
      const int slowest = by_load.back();
      const int least = by_load.front();
      const Seconds gap_s = load_s[static_cast<std::size_t>(slowest)] - load_s[static_cast<std::size_t>(least)];
      const int local = edit.local_group_of(slowest);
      if (local < 0) break;
      const AttentionGroup& group = edit.group(static_cast<std::size_t>(local));
      std::size_t best = group.sequences.size();
      Seconds best_s = 0, best_miss_s = 0;
      for (std::size_t s = 0; s < group.sequences.size(); ++s) {
        const Seconds time_s = local_sequence_time_s(cost_, length_of(plan_, group.sequences[s].sequence_id));
        if (time_s >= gap_s) continue;  // would leave the least-loaded rank at least as slow
        const Seconds miss_s = std::abs(time_s - gap_s / 2);
        if (best == group.sequences.size() || miss_s < best_miss_s) {
          best = s;
          best_s = time_s;
          best_miss_s = miss_s;
        }
      }
      if (best == group.sequences.size()) break;
      const std::int64_t id = edit.take_sequence(local, best);
      edit.add_local(least, id);
      load_s[static_cast<std::size_t>(slowest)] -= best_s;
      load_s[static_cast<std::size_t>(least)] += best_s;
      ++moved;
    }
    if (moved >= 2) add(MoveKind::level, std::move(edit));
  }

  /// The whole-step phase's moves: per micro-batch (slowest first) a level_step, then,
  /// marked off_critical_path, every multi-sequence group without the micro-batch's
  /// slowest rank split in two (two halves that each fit in a node free their members of
  /// cross-node communication, which the next level_step can fill).
  std::vector<Move> whole_step_moves(const std::vector<int>& order) {
    for (int m : order) {
      if (full()) break;
      level_step(m, m);
    }
    for (int m : order) {
      for (int to : order) {
        if (full()) break;
        if (to != m) level_step(m, to);
      }
    }
    for (int m : order) {
      const auto& groups = micro_batch(m).groups;
      for (std::size_t g = 0; g < groups.size() && !full(); ++g) transpose_stages(m, static_cast<int>(g));
    }
    for (int m : order) {
      const std::vector<int> by_load = ranks_by_load(loads(m));
      const int slowest = by_load.back();
      const auto& groups = micro_batch(m).groups;
      for (std::size_t g = 0; g < groups.size() && !full(); ++g) {
        if (groups[g].ranks.size() < 2 || groups[g].sequences.size() < 2 || holds_rank(groups[g], slowest)) continue;
        const std::size_t first = moves_.size();
        split(m, static_cast<int>(g));
        for (std::size_t i = first; i < moves_.size(); ++i) moves_[i].off_critical_path = true;
      }
    }
    return std::move(moves_);
  }

  /// A local sequence of the plan (take_out_local_sequences).
  struct LocalSequence {
    Tokens length;
    std::int64_t id;
    int micro_batch;
    int rank;
  };
  /// Every local sequence of the plan taken out: `edits` gets one EditBuilder per
  /// micro-batch of the plan, its local groups erased; the sequences come micro-batch by
  /// micro-batch, each one's local groups last to first (the order the re-deal's sums and
  /// ties were measured with).
  std::vector<LocalSequence> take_out_local_sequences(std::vector<EditBuilder>& edits) const {
    std::vector<LocalSequence> sequences;
    for (std::size_t m = 0; m < plan_.micro_batches.size(); ++m) {
      edits.emplace_back(plan_, static_cast<int>(m));
      const auto& groups = micro_batch(static_cast<int>(m)).groups;
      std::vector<bool> local(groups.size(), false);
      for (std::size_t g = groups.size(); g-- > 0;) {
        if (groups[g].scheme != Scheme::local) continue;
        local[g] = true;
        for (const SequenceChunks& sequence : groups[g].sequences) {
          sequences.push_back({length_of(plan_, sequence.sequence_id), sequence.sequence_id, static_cast<int>(m),
                               groups[g].ranks.front()});
        }
      }
      edits.back().erase_groups(local);
    }
    return sequences;
  }

  /// Re-deal (the fourth phase): every local sequence of the plan taken out and dealt
  /// again, longest local time first (local_sequence_time_s; ties: the order they were
  /// held in), each to the rank with the least whole-step load so far (its micro-batches'
  /// estimated times summed, less its local sequences, plus what it was dealt; ties: lower
  /// rank) that has room for it (attention tokens within kDealtCapacityShare of the token
  /// capacity): `keep_micro_batch`, in the micro-batch the sequence was in; otherwise in
  /// the micro-batch where that rank has the most room (ties: the earlier). The new local
  /// groups run last in each rank's queue, so a multi-rank group no longer waits for its
  /// members' local work. Where level_step shifts a few sequences off the slowest rank,
  /// this levels every rank at once. `append` (with !keep_micro_batch): an empty
  /// micro-batch is added after the plan's last, so ranks whose micro-batches are all
  /// full get room (the search's one move that adds a micro-batch). `last_first` (with
  /// !keep_micro_batch): into the plan's last micro-batch where the rank has room there,
  /// as fill_last() fills it, and only otherwise where it has the most. None when a
  /// sequence finds no room or the deal leaves every sequence where it was. Returns
  /// whether memory constrained the deal: a sequence found no room, or went to a rank more
  /// loaded than the least-loaded one, which had none.
  bool re_deal(bool keep_micro_batch, bool append = false, bool last_first = false) {
    if (full()) return false;
    const std::size_t existing = plan_.micro_batches.size();
    const std::size_t count = existing + (append ? 1 : 0);
    const std::size_t ranks = loads(0).size();
    std::vector<Seconds> load_s(ranks, 0.0);
    for (const MicroBatchEstimate& estimate : estimate_.micro_batches) {
      for (std::size_t r = 0; r < ranks; ++r) load_s[r] += estimate.rank_time_s[r];
    }
    struct Held {
      Seconds time_s;
      Tokens length;
      std::int64_t id;
      int micro_batch;
      int rank;
    };
    std::vector<Held> sequences;
    std::vector<EditBuilder> edits;
    edits.reserve(count);
    for (const LocalSequence& local : take_out_local_sequences(edits)) {
      const Seconds time_s = local_sequence_time_s(cost_, local.length);
      sequences.push_back({time_s, local.length, local.id, local.micro_batch, local.rank});
      load_s[static_cast<std::size_t>(local.rank)] -= time_s;
    }
    if (append) edits.push_back(EditBuilder::appended(plan_));
    if (sequences.size() < 2) return false;
    std::stable_sort(sequences.begin(), sequences.end(),
                     [](const Held& a, const Held& b) { return a.time_s > b.time_s; });
    std::vector<std::vector<Tokens>> held;
    for (const EditBuilder& edit : edits) held.push_back(edit.attention_tokens_held(ranks));
    const Tokens capacity = dealt_capacity_tokens();
    // Per rank, the micro-batch where it holds the least (ties: the earlier): where it has
    // the most room.
    std::vector<std::size_t> roomiest(ranks, 0);
    const auto update_roomiest = [&](std::size_t r) {
      for (std::size_t m = 1; m < count; ++m) {
        if (held[m][r] < held[roomiest[r]][r]) roomiest[r] = m;
      }
    };
    for (std::size_t r = 0; r < ranks; ++r) update_roomiest(r);
    bool changed = false, constrained = false;
    for (const Held& sequence : sequences) {
      const auto kept = static_cast<std::size_t>(sequence.micro_batch);
      std::size_t best_rank = ranks;
      Seconds least_s = kInfinity;  // the least load, room or not
      for (std::size_t r = 0; r < ranks; ++r) {
        least_s = std::min(least_s, load_s[r]);
        if (best_rank < ranks && load_s[r] >= load_s[best_rank]) continue;
        if (held[keep_micro_batch ? kept : roomiest[r]][r] + sequence.length > capacity) continue;
        best_rank = r;
      }
      if (best_rank == ranks) return true;
      constrained = constrained || load_s[best_rank] > least_s;
      std::size_t m = keep_micro_batch ? kept : roomiest[best_rank];
      if (last_first && held[count - 1][best_rank] + sequence.length <= capacity) m = count - 1;
      edits[m].add_local(static_cast<int>(best_rank), sequence.id);
      load_s[best_rank] += sequence.time_s;
      held[m][best_rank] += sequence.length;
      roomiest[best_rank] = 0;
      update_roomiest(best_rank);
      changed = changed || static_cast<int>(best_rank) != sequence.rank || m != kept;
    }
    if (changed) {
      Move move{MoveKind::re_deal, {}};
      for (EditBuilder& edit : edits) move.edits.push_back(edit.finish());
      moves_.push_back(std::move(move));
    }
    return constrained;
  }

  /// Fill the last micro-batch: every rank keeps its local sequences (so its work over
  /// the step), dealt longest first into the plan's last micro-batch while it has room
  /// (attention tokens within kDealtCapacityShare of the capacity; of equal lengths, those
  /// already there first), the others back into their own micro-batch or, where that has
  /// no room, the earlier one with the most.
  /// Under GradientSync::overlap only the last micro-batch's backward pass hides the
  /// gradient buckets, and the first bucket waits until every rank is 1 / B into it, so
  /// a rank with little work in the last micro-batch starts the sync late
  /// (docs/simulator.md section 3). None with one micro-batch, when a sequence finds no
  /// room, or when no sequence changes micro-batch.
  void fill_last() {
    const std::size_t count = plan_.micro_batches.size();
    if (count < 2 || full()) return;
    const std::size_t ranks = loads(0).size();
    const std::size_t last = count - 1;
    struct Held {
      Tokens length;
      std::int64_t id;
      std::size_t micro_batch;
    };
    std::vector<std::vector<Held>> by_rank(ranks);
    std::vector<EditBuilder> edits;
    edits.reserve(count);
    for (const LocalSequence& local : take_out_local_sequences(edits)) {
      by_rank[static_cast<std::size_t>(local.rank)].push_back(
          {local.length, local.id, static_cast<std::size_t>(local.micro_batch)});
    }
    std::vector<std::vector<Tokens>> held;
    for (const EditBuilder& edit : edits) held.push_back(edit.attention_tokens_held(ranks));
    const Tokens capacity = dealt_capacity_tokens();
    bool changed = false;
    for (std::size_t r = 0; r < ranks; ++r) {
      std::vector<Held>& sequences = by_rank[r];
      // Ties: those already in the last micro-batch first (they stay).
      std::stable_sort(sequences.begin(), sequences.end(), [&](const Held& a, const Held& b) {
        return a.length != b.length ? a.length > b.length : (a.micro_batch == last && b.micro_batch != last);
      });
      for (const Held& sequence : sequences) {
        std::size_t m = last;
        if (held[last][r] + sequence.length > capacity) {
          m = sequence.micro_batch;
          if (m == last || held[m][r] + sequence.length > capacity) {
            m = 0;
            for (std::size_t k = 1; k < last; ++k) {
              if (held[k][r] < held[m][r]) m = k;
            }
            if (held[m][r] + sequence.length > capacity) return;
          }
        }
        edits[m].add_local(static_cast<int>(r), sequence.id);
        held[m][r] += sequence.length;
        changed = changed || m != sequence.micro_batch;
      }
    }
    if (!changed) return;
    Move move{MoveKind::fill_last, {}};
    for (EditBuilder& edit : edits) move.edits.push_back(edit.finish());
    moves_.push_back(std::move(move));
  }

  /// Level by the step: like level(), local sequences of micro-batch m from the rank
  /// slowest over the whole step (its loads summed over the micro-batches) to the least
  /// loaded one with room for them in micro-batch `to` (attention tokens within
  /// kDealtCapacityShare of the token capacity; `to` is m itself, or another micro-batch:
  /// a rank's step is its micro-batches' times summed, so where m is full on the ranks
  /// with slack, another micro-batch of theirs may still have room). Micro-batches are no
  /// barriers, so where one micro-batch's group sets the step (a long document on a
  /// cross-node group), its members' local work in another micro-batch can go to ranks
  /// that are idle in neither by m's loads alone.
  void level_step(int m, int to) {
    const std::size_t ranks = loads(m).size();
    std::vector<Seconds> load_s(ranks, 0.0);
    for (const MicroBatchEstimate& estimate : estimate_.micro_batches) {
      for (std::size_t r = 0; r < ranks; ++r) load_s[r] += estimate.rank_time_s[r];
    }
    EditBuilder edit(plan_, m);
    EditBuilder target(plan_, to);
    EditBuilder& receiving = to == m ? edit : target;
    std::vector<Tokens> held = receiving.attention_tokens_held(ranks);
    const Tokens capacity = dealt_capacity_tokens();
    int moved = 0;
    for (int round = 0; round < kMaxLevelMoves; ++round) {
      const std::vector<int> by_load = ranks_by_load(load_s);
      const int slowest = by_load.back();
      const int local = edit.local_group_of(slowest);
      if (local < 0) break;
      // The sequence whose local time is closest to half the gap to the least-loaded rank
      // with room for it, below that gap.
      const AttentionGroup& group = edit.group(static_cast<std::size_t>(local));
      std::size_t best = group.sequences.size();
      int best_rank = -1;
      Seconds best_s = 0, best_miss_s = 0;
      for (std::size_t s = 0; s < group.sequences.size(); ++s) {
        const Tokens length = length_of(plan_, group.sequences[s].sequence_id);
        int least = -1;
        for (int rank : by_load) {
          if (rank == slowest) break;
          if (held[static_cast<std::size_t>(rank)] + length <= capacity) {
            least = rank;
            break;
          }
        }
        if (least < 0) continue;
        const Seconds gap_s = load_s[static_cast<std::size_t>(slowest)] - load_s[static_cast<std::size_t>(least)];
        const Seconds time_s = local_sequence_time_s(cost_, length);
        if (time_s >= gap_s) continue;
        const Seconds miss_s = std::abs(time_s - gap_s / 2);
        if (best == group.sequences.size() || miss_s < best_miss_s) {
          best = s;
          best_rank = least;
          best_s = time_s;
          best_miss_s = miss_s;
        }
      }
      if (best == group.sequences.size()) {
        if (swap_step(edit, receiving, m == to, slowest, by_load, load_s, held)) {
          ++moved;
          continue;
        }
        break;
      }
      const Tokens length = length_of(plan_, group.sequences[best].sequence_id);
      const std::int64_t id = edit.take_sequence(local, best);
      receiving.add_local(best_rank, id);
      load_s[static_cast<std::size_t>(slowest)] -= best_s;
      load_s[static_cast<std::size_t>(best_rank)] += best_s;
      if (to == m) held[static_cast<std::size_t>(slowest)] -= length;
      held[static_cast<std::size_t>(best_rank)] += length;
      ++moved;
    }
    if (moved == 0) return;
    if (to == m) {
      add(MoveKind::level_step, std::move(edit));
    } else {
      add(MoveKind::level_step, std::move(edit), std::move(target));
    }
  }

  /// level_step's move where no rank has room for any of the slowest rank's local
  /// sequences (a rank's micro-batch holding most of the token capacity, as where a long
  /// document's ring takes its share of every member): a swap of a sequence d of the
  /// slowest rank's local group in `edit` with a shorter one e of one of the
  /// kSwapPartners least-loaded ranks' local groups in `receiving` (d fits there once e
  /// has left; e fits where d was), the pair whose shift of local time is closest to half
  /// the gap between the two ranks, below it. `same`: edit and receiving are one
  /// micro-batch (held then counts the slowest rank's tokens too). Whether one was made.
  bool swap_step(EditBuilder& edit, EditBuilder& receiving, bool same, int slowest,
                 const std::vector<int>& by_load, std::vector<Seconds>& load_s, std::vector<Tokens>& held) {
    const Tokens capacity = dealt_capacity_tokens();
    const int source = edit.local_group_of(slowest);
    if (source < 0) return false;
    const AttentionGroup& given = edit.group(static_cast<std::size_t>(source));
    std::int64_t best_d = -1, best_e = -1;
    int best_rank = -1;
    Seconds best_shift_s = 0, best_miss_s = 0;
    int partners = 0;
    for (int rank : by_load) {
      if (rank == slowest || partners == kSwapPartners) break;
      const int target = receiving.local_group_of(rank);
      if (target < 0) continue;
      ++partners;
      const Seconds gap_s = load_s[static_cast<std::size_t>(slowest)] - load_s[static_cast<std::size_t>(rank)];
      for (const SequenceChunks& d : given.sequences) {
        const Tokens d_tokens = length_of(plan_, d.sequence_id);
        const Seconds d_s = local_sequence_time_s(cost_, d_tokens);
        for (const SequenceChunks& e : receiving.group(static_cast<std::size_t>(target)).sequences) {
          const Tokens e_tokens = length_of(plan_, e.sequence_id);
          if (e_tokens >= d_tokens || held[static_cast<std::size_t>(rank)] - e_tokens + d_tokens > capacity) continue;
          const Seconds shift_s = d_s - local_sequence_time_s(cost_, e_tokens);
          if (shift_s <= 0 || shift_s >= gap_s) continue;
          const Seconds miss_s = std::abs(shift_s - gap_s / 2);
          if (best_d < 0 || miss_s < best_miss_s) {
            best_d = d.sequence_id;
            best_e = e.sequence_id;
            best_rank = rank;
            best_shift_s = shift_s;
            best_miss_s = miss_s;
          }
        }
      }
    }
    if (best_d < 0) return false;
    const auto index_of = [](const AttentionGroup& group, std::int64_t id) {
      std::size_t s = 0;
      while (group.sequences[s].sequence_id != id) ++s;
      return s;
    };
    edit.take_sequence(source, index_of(given, best_d));
    const int target = receiving.local_group_of(best_rank);
    receiving.take_sequence(target, index_of(receiving.group(static_cast<std::size_t>(target)), best_e));
    edit.add_local(slowest, best_e);
    receiving.add_local(best_rank, best_d);
    const Tokens shift_tokens = length_of(plan_, best_d) - length_of(plan_, best_e);
    held[static_cast<std::size_t>(best_rank)] += shift_tokens;
    if (same) held[static_cast<std::size_t>(slowest)] -= shift_tokens;
    load_s[static_cast<std::size_t>(slowest)] -= best_shift_s;
    load_s[static_cast<std::size_t>(best_rank)] += best_shift_s;
    return true;
  }

  /// (a) A sequence of the slowest rank's local group to the least-loaded rank, the ones
  /// whose time is closest to half the gap between them first.
  void move_local(int m, int g, int least, Seconds gap_s) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    for (std::size_t s : sequences_near(group, plan_, cost_, gap_s / 2)) {
      EditBuilder edit(plan_, m);
      const std::int64_t id = edit.take_sequence(g, s);
      edit.add_local(least, id);
      add(MoveKind::move_local, std::move(edit));
    }
  }

  /// (b) One of a multi-sequence group's longest sequences out: local on the least-loaded
  /// rank (from a group of several ranks), or a new ring / Ulysses group on the
  /// least-loaded ranks of one node.
  void extract(int m, int g, int least) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    for (std::size_t s : longest_sequences(group, plan_)) {
      if (group.ranks.size() > 1) {
        EditBuilder edit(plan_, m);
        const std::int64_t id = edit.take_sequence(g, s);
        edit.add_local(least, id);
        add(MoveKind::extract, std::move(edit));
      }
      for (int size : node_group_sizes(cost_.cluster())) {
        for (Scheme scheme : {Scheme::ring, Scheme::ulysses}) {
          if (scheme == Scheme::ulysses && !ulysses_group_allowed(cost_, size)) continue;
          EditBuilder edit(plan_, m);
          const std::int64_t id = edit.take_sequence(g, s);
          // Loads as the move leaves them would need a re-estimate; the current ones
          // pick the node (the slowest rank's share of it is small next to the node's).
          const std::vector<int> ranks = least_loaded_on_one_node(cost_.cluster(), loads(m), size);
          if (ranks.empty()) continue;
          edit.append_group(build(scheme, ranks, {id}));
          add(MoveKind::extract, std::move(edit));
        }
      }
    }
  }

  /// (c) The group's sequences under another scheme on the same ranks: ring, Ulysses,
  /// all-gather, and USP with each Ulysses degree usp_degrees() offers.
  void change_scheme(int m, int g) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    for (Scheme scheme : {Scheme::ring, Scheme::ulysses, Scheme::all_gather}) {
      if (scheme == group.scheme) continue;
      if (scheme == Scheme::ulysses && !ulysses_group_allowed(cost_, static_cast<int>(group.ranks.size()))) continue;
      EditBuilder edit(plan_, m);
      edit.replace_group(g, build(scheme, group.ranks, ids_of(group)));
      add(MoveKind::change_scheme, std::move(edit));
    }
    for (int degree : usp_degrees(group.ranks, cost_)) {
      if (group.scheme == Scheme::usp && degree == group.ulysses_degree) continue;
      EditBuilder edit(plan_, m);
      edit.replace_group(g, build(Scheme::usp, group.ranks, ids_of(group), degree));
      add(MoveKind::change_scheme, std::move(edit));
    }
  }

  /// (c) in the third phase: group g of micro-batch m as USP with its stages across its
  /// nodes and its rings inside them (stages_across_nodes()), where it spans several.
  void transpose_stages(int m, int g) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    std::vector<int> members = group.ranks;
    std::sort(members.begin(), members.end());
    const Transposed transposed = stages_across_nodes(members, cost_);
    if (transposed.ulysses_degree == 0 || (group.scheme == Scheme::usp && group.ranks == transposed.ranks)) return;
    EditBuilder edit(plan_, m);
    edit.replace_group(g, build(Scheme::usp, transposed.ranks, ids_of(group), transposed.ulysses_degree));
    add(MoveKind::change_scheme, std::move(edit));
  }

  /// The scheme a group of `ranks` may keep when split or merged: Ulysses where allowed,
  /// else ring (a USP group becomes a ring: its stages change with its size).
  Scheme scheme_for(Scheme wanted, std::size_t ranks) const {
    if (wanted == Scheme::ulysses && !ulysses_group_allowed(cost_, static_cast<int>(ranks))) return Scheme::ring;
    if (wanted == Scheme::usp) return Scheme::ring;
    return wanted;
  }

  /// (d) Split: the group's ranks halved, its sequences dealt longest first to the half
  /// with the least attention work per rank (s^2 / ranks), or to the other half where only
  /// that one has room for them (its members' usable tokens).
  void split(int m, int g) {
    const AttentionGroup& group = micro_batch(m).groups[static_cast<std::size_t>(g)];
    const std::size_t half = group.ranks.size() / 2;
    const std::vector<int> first(group.ranks.begin(), group.ranks.begin() + static_cast<std::ptrdiff_t>(half));
    const std::vector<int> second(group.ranks.begin() + static_cast<std::ptrdiff_t>(half), group.ranks.end());
    std::vector<std::int64_t> ids = ids_of(group);
    std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) {
      return length_of(plan_, a) > length_of(plan_, b);
    });
    const Scheme first_scheme = scheme_for(group.scheme, first.size());
    const Scheme second_scheme = scheme_for(group.scheme, second.size());
    // Each half's room: its members' usable tokens (validate() still has the last word).
    const auto room = [&](Scheme scheme, const std::vector<int>& half_ranks) {
      const int size = static_cast<int>(half_ranks.size());
      return static_cast<Tokens>(size) * usable_tokens_per_rank(cost_, scheme, size);
    };
    const Tokens first_room = room(first_scheme, first);
    const Tokens second_room = room(second_scheme, second);
    std::vector<std::int64_t> first_ids, second_ids;
    double first_work = 0, second_work = 0;
    Tokens first_tokens = 0, second_tokens = 0;
    for (std::int64_t id : ids) {
      const Tokens tokens = length_of(plan_, id);
      const auto length = static_cast<double>(tokens);
      bool to_first = first_work / static_cast<double>(first.size()) <=
                      second_work / static_cast<double>(second.size());
      // The half with less work per rank, unless only the other has room for it.
      const bool first_fits = first_tokens + tokens <= first_room;
      const bool second_fits = second_tokens + tokens <= second_room;
      if (to_first && !first_fits && second_fits) to_first = false;
      if (!to_first && !second_fits && first_fits) to_first = true;
      if (to_first) {
        first_ids.push_back(id);
        first_work += length * length;
        first_tokens += tokens;
      } else {
        second_ids.push_back(id);
        second_work += length * length;
        second_tokens += tokens;
      }
    }
    EditBuilder edit(plan_, m);
    edit.erase_group(g);
    edit.append_group(build(first_scheme, first, first_ids));
    if (!second_ids.empty()) edit.append_group(build(second_scheme, second, second_ids));
    add(MoveKind::split, std::move(edit));
  }

  /// (d) Merge: the group and the least-loaded other group of the same scheme and size on
  /// other ranks become one group over both (ranks ascending).
  void merge(int m, int g) {
    const auto& groups = micro_batch(m).groups;
    const AttentionGroup& group = groups[static_cast<std::size_t>(g)];
    if (group.scheme == Scheme::usp) return;  // stages of two groups do not line up
    int partner = -1;
    Seconds partner_s = 0;
    for (std::size_t h = 0; h < groups.size(); ++h) {
      const AttentionGroup& other = groups[h];
      if (static_cast<int>(h) == g || other.scheme != group.scheme || other.ranks.size() != group.ranks.size()) continue;
      const bool disjoint = std::none_of(other.ranks.begin(), other.ranks.end(),
                                         [&](int rank) { return holds_rank(group, rank); });
      if (!disjoint) continue;
      Seconds load_s = 0;
      for (int rank : other.ranks) load_s = std::max(load_s, loads(m)[static_cast<std::size_t>(rank)]);
      if (partner < 0 || load_s < partner_s) {
        partner = static_cast<int>(h);
        partner_s = load_s;
      }
    }
    if (partner < 0) return;
    const AttentionGroup& other = groups[static_cast<std::size_t>(partner)];
    std::vector<int> ranks = group.ranks;
    ranks.insert(ranks.end(), other.ranks.begin(), other.ranks.end());
    std::sort(ranks.begin(), ranks.end());
    if (group.scheme == Scheme::ulysses && !ulysses_group_allowed(cost_, static_cast<int>(ranks.size()))) return;
    std::vector<std::int64_t> ids = ids_of(group);
    const std::vector<std::int64_t> other_ids = ids_of(other);
    ids.insert(ids.end(), other_ids.begin(), other_ids.end());
    EditBuilder edit(plan_, m);
    edit.erase_group(std::max(g, partner));
    edit.erase_group(std::min(g, partner));
    edit.append_group(build(group.scheme, ranks, ids));
    add(MoveKind::merge, std::move(edit));
  }

  /// (e) From the slowest micro-batch's slowest rank to the fastest micro-batch: a group
  /// of one sequence moves whole (same ranks and scheme), a sequence of a larger group
  /// goes local on that micro-batch's least-loaded rank.
  void between_micro_batches(int from, int to) {
    const std::vector<int> by_load = ranks_by_load(loads(from));
    const int slowest = by_load.back();
    const int least = ranks_by_load(loads(to)).front();
    const Seconds gap_s = estimate_.micro_batches[static_cast<std::size_t>(from)].time_s -
                          estimate_.micro_batches[static_cast<std::size_t>(to)].time_s;
    const auto& groups = micro_batch(from).groups;
    for (std::size_t g = 0; g < groups.size() && !full(); ++g) {
      const AttentionGroup& group = groups[g];
      if (!holds_rank(group, slowest)) continue;
      for (std::size_t s : sequences_near(group, plan_, cost_, gap_s / 2)) {
        EditBuilder source(plan_, from);
        EditBuilder target(plan_, to);
        if (group.sequences.size() == 1) {
          source.erase_group(static_cast<int>(g));
          AttentionGroup moved = group;
          target.append_group(std::move(moved));
        } else {
          const std::int64_t id = source.take_sequence(static_cast<int>(g), s);
          target.add_local(least, id);
        }
        add(MoveKind::to_micro_batch, std::move(source), std::move(target));
      }
    }
  }

  const Plan& plan_;
  const PlanEstimate& estimate_;
  const CostModel& cost_;
  std::size_t max_moves_;
  Loads loads_;
  const PlanEvaluator* ring_router_;  ///< prices the routing of the rings build() makes (null: none)
  std::vector<Move> moves_;
};

}  // namespace

const char* move_name(MoveKind kind) {
  switch (kind) {
    case MoveKind::move_local:
      return "move-local";
    case MoveKind::extract:
      return "extract";
    case MoveKind::change_scheme:
      return "change-scheme";
    case MoveKind::split:
      return "split";
    case MoveKind::merge:
      return "merge";
    case MoveKind::to_micro_batch:
      return "to-micro-batch";
    case MoveKind::level:
      return "level";
    case MoveKind::grow:
      return "grow";
    case MoveKind::dissolve:
      return "dissolve";
    case MoveKind::level_step:
      return "level-step";
    case MoveKind::re_deal:
      return "re-deal";
    case MoveKind::fill_last:
      return "fill-last";
    case MoveKind::count:
      break;
  }
  return "?";
}

std::vector<Move> generate_moves(const Plan& plan, const PlanEstimate& estimate, const CostModel& cost,
                                 std::size_t max_moves, Loads loads, const PlanEvaluator* ring_router) {
  return MoveGenerator(plan, estimate, cost, max_moves, loads, ring_router).run();
}

MicroBatch MicroBatchEdit::micro_batch() const {
  MicroBatch result;
  result.groups.reserve(group_count());
  for (std::size_t g = 0; g < group_count(); ++g) result.groups.push_back(group(g));
  result.queues = queues;
  result.linear_layout = linear_layout;
  return result;
}

Plan apply_move(const Plan& plan, const Move& move) {
  Plan moved = plan;
  for (const MicroBatchEdit& edit : move.edits) {
    if (static_cast<std::size_t>(edit.index) == moved.micro_batches.size()) {
      moved.micro_batches.push_back(edit.micro_batch());  // appended (the last edit)
    } else {
      moved.micro_batches[static_cast<std::size_t>(edit.index)] = edit.micro_batch();
    }
  }
  // A micro-batch the move emptied runs nothing: drop it (highest index first).
  for (auto it = move.edits.rbegin(); it != move.edits.rend(); ++it) {
    if (moved.micro_batches[static_cast<std::size_t>(it->index)].groups.empty()) {
      moved.micro_batches.erase(moved.micro_batches.begin() + it->index);
    }
  }
  return moved;
}

bool swap_in_move(Plan& plan, const Move& move, std::vector<MicroBatch>& swapped_out) {
  std::vector<MicroBatch> built;
  built.reserve(move.edits.size());
  for (const MicroBatchEdit& edit : move.edits) {
    if (static_cast<std::size_t>(edit.index) >= plan.micro_batches.size()) return false;  // appended
    if (edit.group_count() == 0) return false;  // emptied: apply_move() drops it
    built.push_back(edit.micro_batch());
  }
  // Every edit built from the plan as it is before any swap (an edit reads its base).
  swapped_out = std::move(built);
  for (std::size_t e = 0; e < move.edits.size(); ++e) {
    std::swap(plan.micro_batches[static_cast<std::size_t>(move.edits[e].index)], swapped_out[e]);
  }
  return true;
}

void swap_in_move_undo(Plan& plan, const Move& move, std::vector<MicroBatch>& swapped_out) {
  for (std::size_t e = move.edits.size(); e-- > 0;) {
    std::swap(plan.micro_batches[static_cast<std::size_t>(move.edits[e].index)], swapped_out[e]);
  }
}

std::vector<AttentionGroup> whole_cluster_groups(const std::vector<std::int64_t>& ids, const Plan& plan,
                                                const CostModel& cost, const PlanEvaluator* ring_router) {
  std::vector<int> ranks(static_cast<std::size_t>(cost.cluster().ranks()));
  std::iota(ranks.begin(), ranks.end(), 0);
  if (ranks.size() == 1) return {build_group(Scheme::local, ranks, ids, plan)};
  std::vector<AttentionGroup> groups{routed(build_group(Scheme::ring, ranks, ids, plan), cost, ring_router)};
  if (ulysses_group_allowed(cost, static_cast<int>(ranks.size()))) {
    groups.push_back(build_group(Scheme::ulysses, ranks, ids, plan));
  }
  for (int degree : usp_degrees(ranks, cost)) groups.push_back(build_group(Scheme::usp, ranks, ids, plan, degree));
  if (const Transposed transposed = stages_across_nodes(ranks, cost); transposed.ulysses_degree > 0) {
    groups.push_back(build_group(Scheme::usp, transposed.ranks, ids, plan, transposed.ulysses_degree));
  }
  return groups;
}

}  // namespace ballast::strategies::ballast_search
