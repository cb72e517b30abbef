// Attention schemes as tasks (local, ring as TransformerEngine runs it, all-gather,
// Ulysses all-to-alls, USP: Ulysses inside stages x ring across them) and point-to-point transfers, direct or routed over proxy GPUs in
// pipelined pieces.
#include "schemes.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "ballast/error.hpp"
#include "ballast/plan_layout.hpp"
#include "ballast/simulator.hpp"

namespace ballast::sim {

namespace {

/// A chunk of the group's sequence number `sequence` (index into group.sequences).
struct GroupChunk {
  int sequence = 0;
  Tokens begin_tokens = 0;
  Tokens end_tokens = 0;
};

/// The group's chunks seen from each member, by position in group.ranks.
struct GroupLayout {
  std::vector<Tokens> tokens;                   ///< tokens held by each position
  std::vector<std::vector<GroupChunk>> chunks;  ///< per position, ordered by sequence
};

/// Each member's position in group.ranks, found by a scan from the last one found: a
/// group's chunks mostly come in member order, so a lookup is O(1) on them and O(group)
/// at worst, with no table indexed by rank (which cost a cluster-sized vector per group
/// and pass at 1,024 GPUs).
class MemberPositions {
 public:
  explicit MemberPositions(const AttentionGroup& group) : ranks_(group.ranks) {}
  /// The position of the member holding a chunk on `rank`.
  int operator()(int rank) {
    const std::size_t size = ranks_.size();
    for (std::size_t step = 0; step < size; ++step) {
      const std::size_t position = (next_ + step) % size;
      if (ranks_[position] == rank) {
        next_ = position + 1 == size ? 0 : position + 1;
        return static_cast<int>(position);
      }
    }
    BALLAST_CHECK(false, "a validated plan has chunks on group ranks");
    return -1;
  }

 private:
  const std::vector<int>& ranks_;
  std::size_t next_ = 0;
};

GroupLayout layout_of(const AttentionGroup& group) {
  MemberPositions position_of(group);
  GroupLayout layout;
  layout.tokens.assign(group.ranks.size(), 0);
  layout.chunks.resize(group.ranks.size());
  for (std::size_t s = 0; s < group.sequences.size(); ++s) {
    for (const Chunk& chunk : group.sequences[s].chunks) {
      const int position = position_of(chunk.rank);
      layout.tokens[position] += chunk.size();
      layout.chunks[position].push_back(
          {static_cast<int>(s), chunk.begin_tokens, chunk.end_tokens});
    }
  }
  return layout;
}

/// Tokens held by each position (layout_of's tokens, summed in the same order).
std::vector<Tokens> member_tokens(const AttentionGroup& group) {
  MemberPositions position_of(group);
  std::vector<Tokens> tokens(group.ranks.size(), 0);
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) tokens[position_of(chunk.rank)] += chunk.size();
  }
  return tokens;
}

std::vector<AttentionBlock> whole_documents(const AttentionGroup& group) {
  std::vector<AttentionBlock> blocks;
  blocks.reserve(group.sequences.size());
  for (const SequenceChunks& sequence : group.sequences) {
    blocks.push_back(whole_document(sequence.padded_length_tokens));
  }
  return blocks;
}

Seconds attention_time_s(const CostModel& cost, const std::vector<AttentionBlock>& blocks,
                         int head_split, Pass pass) {
  return blocks.empty() ? 0.0 : cost.attention_time_s(blocks, head_split, pass);
}

/// Each member's tokens of the group as ballast's runtime packs them for its attention
/// calls (PlanAttentionEngine::group_tokens, members_of): its chunks in group.sequences
/// order, each sequence's in chunk order, padding dropped, a sequence's document id its
/// index in group.sequences (as the runtime numbers them for the kernel). Read on a
/// packed cluster only.
std::vector<std::vector<DocumentRange>> member_spans(const BuildContext& ctx,
                                                     const AttentionGroup& group) {
  MemberPositions position_of(group);
  std::vector<std::vector<DocumentRange>> spans(group.ranks.size());
  for (std::size_t s = 0; s < group.sequences.size(); ++s) {
    const SequenceChunks& sequence = group.sequences[s];
    const auto id = static_cast<std::size_t>(sequence.sequence_id);
    BALLAST_CHECK(id < ctx.sequence_lengths_tokens.size(),
                  "a validated plan has a length for every sequence id");
    const Tokens length = ctx.sequence_lengths_tokens[id];
    for (const Chunk& chunk : sequence.chunks) {
      const Tokens end = std::min(chunk.end_tokens, length);
      const int position = position_of(chunk.rank);
      if (chunk.begin_tokens < end) {
        spans[position].push_back({static_cast<std::int64_t>(s), chunk.begin_tokens, end});
      }
    }
  }
  return spans;
}

/// One packed call (queries against keys); nothing to compute is free.
Seconds call_time_s(const CostModel& cost, std::span<const DocumentRange> queries,
                    std::span<const DocumentRange> keys, int head_split, Pass pass) {
  return queries.empty() || keys.empty()
             ? 0.0
             : cost.attention_call_time_s({queries, keys}, head_split, pass);
}

bool tiles_packed(const BuildContext& ctx) { return ctx.cost.cluster().attention_tiles_packed; }

/// What a ring's (or USP's) step compute times depend on, as integers: the cost model
/// (CostModel::instance_id), the pass, the head split, the USP degree (0 for a ring),
/// whether tiles are packed and then each sequence's length (packed spans drop the
/// padding), and every position's chunks in layout order (sequence index, begin, end),
/// each list after its size. Equal keys give equal times: the step times are functions
/// of exactly these (ring_step_blocks and member_spans read nothing else).
using StepKey = std::vector<std::int64_t>;

StepKey step_key(const BuildContext& ctx, const AttentionGroup& group, const GroupLayout& layout,
                 int head_split, int ulysses_degree, Pass pass) {
  const bool packed = tiles_packed(ctx);
  std::size_t size = 5 + layout.chunks.size() + (packed ? group.sequences.size() : 0);
  for (const auto& chunks : layout.chunks) size += 3 * chunks.size();
  StepKey key;
  key.reserve(size);
  key.push_back(static_cast<std::int64_t>(ctx.cost.instance_id()));
  key.push_back(pass == Pass::forward ? 0 : 1);
  key.push_back(head_split);
  key.push_back(ulysses_degree);
  key.push_back(packed ? 1 : 0);
  if (packed) {
    for (const SequenceChunks& sequence : group.sequences) {
      const auto id = static_cast<std::size_t>(sequence.sequence_id);
      BALLAST_CHECK(id < ctx.sequence_lengths_tokens.size(),
                    "a validated plan has a length for every sequence id");
      key.push_back(ctx.sequence_lengths_tokens[id]);
    }
  }
  for (const auto& chunks : layout.chunks) {
    key.push_back(static_cast<std::int64_t>(chunks.size()));
    for (const GroupChunk& chunk : chunks) {
      key.push_back(chunk.sequence);
      key.push_back(chunk.begin_tokens);
      key.push_back(chunk.end_tokens);
    }
  }
  return key;
}

struct StepKeyHash {
  std::size_t operator()(const StepKey& key) const noexcept {
    std::uint64_t hash = 0x9E3779B97F4A7C15ULL;
    for (const std::int64_t value : key) {
      hash ^= static_cast<std::uint64_t>(value) + 0x9E3779B97F4A7C15ULL + (hash << 6) + (hash >> 2);
    }
    hash ^= hash >> 31;
    hash *= 0xBF58476D1CE4E5B9ULL;
    hash ^= hash >> 29;
    return static_cast<std::size_t>(hash);
  }
};

/// At most this many values (step times and key integers) per thread; a full cache is
/// emptied (8 bytes each: 32 MiB).
constexpr std::size_t kStepCacheMaxValues = std::size_t{1} << 22;

/// The ring and USP step compute times kept on this thread while open_simulation_cache()
/// is open on it: a planner simulates many plans that share most of their groups, and a
/// ring of g prices g x g steps of up to four blocks per pair of sequence chunks.
struct StepTimeCache {
  int open_count = 0;
  std::size_t held_values = 0;
  std::unordered_map<StepKey, std::vector<Seconds>, StepKeyHash> times;
  std::int64_t hits = 0;  ///< for tests (step_time_cache_hit_count); clear() keeps it

  void clear() {
    times = {};
    held_values = 0;
  }
};

StepTimeCache& step_time_cache() {
  thread_local StepTimeCache cache;
  return cache;
}

/// The most step times one group keeps (a ring of 256, USP of 256 stages): a larger group's
/// table would be hundreds of MB at thousands of ranks, and is priced as without a cache.
constexpr std::size_t kMaxCachedStepTimes = std::size_t{1} << 16;

/// The `entries` step compute times (position x owner) of the ring or USP stages laid out
/// as `layout` in this thread's cache, while open_simulation_cache() is open and the group
/// is small enough (kMaxCachedStepTimes); else null. Entries not yet priced are negative:
/// the caller prices them on first use exactly as without the cache (the same calls, so
/// the same times) and stores them. The pointer is valid until the next call on this
/// thread.
std::vector<Seconds>* cached_step_times(const BuildContext& ctx, const AttentionGroup& group,
                                        const GroupLayout& layout, int head_split,
                                        int ulysses_degree, Pass pass, std::size_t entries) {
  StepTimeCache& cache = step_time_cache();
  if (cache.open_count == 0 || entries > kMaxCachedStepTimes) return nullptr;
  StepKey key = step_key(ctx, group, layout, head_split, ulysses_degree, pass);
  const auto found = cache.times.find(key);
  if (found != cache.times.end()) {
    ++cache.hits;
    return &found->second;
  }
  const std::size_t values = entries + key.size();
  if (cache.held_values + values > kStepCacheMaxValues) cache.clear();
  cache.held_values += values;
  return &cache.times.emplace(std::move(key), std::vector<Seconds>(entries, -1.0)).first->second;
}

/// Ring step: every own chunk as queries against every chunk of the block owner as keys,
/// per sequence; blocks the causal mask empties are dropped. Written to `blocks` (a
/// buffer the caller reuses over the steps), returned.
const std::vector<AttentionBlock>& ring_step_blocks(const GroupLayout& layout, int own, int owner,
                                                    std::vector<AttentionBlock>& blocks) {
  blocks.clear();
  const auto& queries = layout.chunks[own];
  const auto& keys = layout.chunks[owner];
  std::size_t first_key = 0;
  for (const GroupChunk& q : queries) {
    while (first_key < keys.size() && keys[first_key].sequence < q.sequence) ++first_key;
    for (std::size_t k = first_key; k < keys.size() && keys[k].sequence == q.sequence; ++k) {
      const AttentionBlock block{q.begin_tokens, q.end_tokens, keys[k].begin_tokens,
                                 keys[k].end_tokens};
      if (causal_pairs(block) > 0) blocks.push_back(block);
    }
  }
  return blocks;
}

void add_local(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  const int rank = group.ranks.front();
  Seconds duration_s = 0;
  if (tiles_packed(ctx)) {  // one call over the rank's tokens (runtime: run_group_forward)
    const auto spans = member_spans(ctx, group);
    duration_s = call_time_s(ctx.cost, spans.front(), spans.front(), 1, pass);
  } else {
    duration_s = attention_time_s(ctx.cost, whole_documents(group), 1, pass);
  }
  ctx.cursor[rank] =
      ctx.graph.add_compute(rank, ctx.micro_batch, duration_s, {ctx.cursor[rank]},
                            [&] { return fmt::format("attention {} local", pass_name(pass)); });
}

std::vector<int> member_cursors(const BuildContext& ctx, const AttentionGroup& group) {
  std::vector<int> cursors;
  for (int rank : group.ranks) cursors.push_back(ctx.cursor[rank]);
  return cursors;
}

/// A collective over the group's members after `deps`; returns its task id.
int add_group_collective(BuildContext& ctx, const AttentionGroup& group, Seconds duration_s,
                         const std::vector<int>& deps, const std::string& what, Pass pass) {
  return ctx.graph.add_collective(group.ranks, ctx.micro_batch, duration_s,
                                  ctx.ports.collective_ports(group.ranks), deps,
                                  [&] { return fmt::format("{} {}", what, pass_name(pass)); });
}

std::vector<Bytes> bytes_per_member(const std::vector<Tokens>& member_tokens, Bytes bytes_per_token) {
  std::vector<Bytes> bytes;
  bytes.reserve(member_tokens.size());
  for (Tokens tokens : member_tokens) bytes.push_back(tokens * bytes_per_token);
  return bytes;
}

/// Ulysses: an all-to-all to head sharding, every member's heads over all the group's
/// tokens, an all-to-all back. Forward: Q, K, V in, O out; backward: dO in, dQ, dK, dV
/// out. Beyond the KV heads (d > k) a member receives its query heads' one KV head for
/// all the group's tokens, so K, V travel to each of their d / k holders
/// (ulysses_qkv_bytes_per_token) and the dK, dV of the replicas come back the same way,
/// summed by their owner as they arrive (an add per received element, not charged).
void add_ulysses(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  const std::vector<Tokens> tokens = member_tokens(group);
  const Model& model = ctx.cost.model();
  const bool forward = pass == Pass::forward;
  const int size = static_cast<int>(group.ranks.size());
  const Bytes qkv_per_token =
      ulysses_qkv_bytes_per_token(model, ctx.cost.cluster().tensor_parallel.gpus, size);
  const Bytes in_per_token = forward ? qkv_per_token : model.hidden_bytes_per_token();
  const Bytes out_per_token = forward ? model.hidden_bytes_per_token() : qkv_per_token;
  const int scatter = add_group_collective(
      ctx, group, ctx.cost.all_to_all_time_s(group.ranks, bytes_per_member(tokens, in_per_token)),
      member_cursors(ctx, group), forward ? "all-to-all qkv" : "all-to-all dout", pass);
  Seconds compute_s = 0;
  if (tiles_packed(ctx)) {
    // Every member computes its heads over all the group's tokens in member order.
    std::vector<DocumentRange> all;
    for (const auto& span : member_spans(ctx, group)) {
      all.insert(all.end(), span.begin(), span.end());
    }
    compute_s = call_time_s(ctx.cost, all, all, size, pass);
  } else {
    compute_s = attention_time_s(ctx.cost, whole_documents(group), size, pass);
  }
  std::vector<int> computes;
  for (int rank : group.ranks) {
    computes.push_back(ctx.graph.add_compute(rank, ctx.micro_batch, compute_s, {scatter}, [&] {
      return fmt::format("attention {} ulysses g{}", pass_name(pass), size);
    }));
  }
  const int gather = add_group_collective(
      ctx, group, ctx.cost.all_to_all_time_s(group.ranks, bytes_per_member(tokens, out_per_token)),
      computes, forward ? "all-to-all out" : "all-to-all dqkv", pass);
  for (int rank : group.ranks) ctx.cursor[rank] = gather;
}

void add_all_gather(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  const GroupLayout layout = layout_of(group);
  const std::vector<Bytes> kv_bytes =
      bytes_per_member(layout.tokens, ctx.cost.model().kv_bytes_per_token());
  const Seconds gather_s = ctx.cost.all_gather_time_s(group.ranks, kv_bytes);
  const int size = static_cast<int>(group.ranks.size());
  // KV is gathered again in the backward pass (LLaMA-3 CP keeps no gathered copy).
  const int gather =
      add_group_collective(ctx, group, gather_s, member_cursors(ctx, group), "all-gather kv", pass);
  std::vector<int> computes;
  const auto spans = tiles_packed(ctx) ? member_spans(ctx, group)
                                       : std::vector<std::vector<DocumentRange>>();
  for (int i = 0; i < size; ++i) {
    Seconds compute_s = 0;
    if (tiles_packed(ctx)) {  // own tokens against each member's gathered KV, one call each
      for (const auto& holder : spans) {
        compute_s += call_time_s(ctx.cost, spans[i], holder, 1, pass);
      }
    } else {
      std::vector<AttentionBlock> blocks;
      for (const GroupChunk& c : layout.chunks[i]) {
        blocks.push_back({c.begin_tokens, c.end_tokens, 0, c.end_tokens});
      }
      compute_s = attention_time_s(ctx.cost, blocks, 1, pass);
    }
    const int rank = group.ranks[i];
    computes.push_back(ctx.graph.add_compute(
        rank, ctx.micro_batch, compute_s, {gather},
        [&] { return fmt::format("attention {} all-gather g{}", pass_name(pass), size); }));
    ctx.cursor[rank] = computes.back();
  }
  if (pass == Pass::backward) {
    // The dKV reduce-scatter moves the same bytes as the gather.
    const int scatter =
        add_group_collective(ctx, group, gather_s, computes, "reduce-scatter dkv", pass);
    for (int rank : group.ranks) ctx.cursor[rank] = scatter;
  }
}

/// A ring of the positions of `ranks` (in ring order): position i holds a KV block of
/// block_bytes[i] bytes per layer and computes step j in compute_s(i, owner) against the
/// block of owner = (i - j) mod g; it starts after reach[i]. `what` and `size` name the
/// tasks ("ring", "g4").
struct RingSteps {
  std::vector<int> ranks;
  std::vector<Bytes> block_bytes;
  std::vector<int> reach;
  int routing_proxies = 1;
  int routing_chunks = 1;
  std::string what;
  std::string size;
};

/// Ring attention as TransformerEngine schedules it (docs/simulator.md section 4). At
/// step j position i computes against the KV block of position (i - j) mod g; the block
/// for step j + 1 travels to it during that compute (a rank sends a block once it holds it
/// and has entered the ring, after its previous send). Backward also rotates the dKV
/// accumulators with the blocks: after computing step j, position i adds its part to the
/// dKV of block (i - j) (which it received from position i - 1, except for its own block
/// at step 0) and sends it on during step j + 1; the last send takes each dKV home to
/// its owner, where the ring ends (the ranks' cursors).
template <typename ComputeS>
void add_ring_steps(BuildContext& ctx, const RingSteps& ring, const ComputeS& compute_s, Pass pass) {
  const int g = static_cast<int>(ring.ranks.size());
  const bool forward = pass == Pass::forward;
  const auto& ranks = ring.ranks;
  const auto position_before = [g](int i) { return (i - 1 + g) % g; };
  std::vector<int> last_compute = ring.reach;
  std::vector<int> kv_arrived(g, -1);   // the KV block position i computes on at step j
  std::vector<int> last_kv_send(g, -1);
  std::vector<int> dkv_arrived(g, -1);  // the dKV accumulator of that block (backward)
  std::vector<int> last_dkv_send(g, -1);
  for (int j = 0; j < g; ++j) {
    std::vector<int> kv_sends(g, -1);
    std::vector<int> dkv_sends(g, -1);
    for (int i = 0; i < g; ++i) {
      const int owner = ((i - j) % g + g) % g;
      const int next = (i + 1) % g;
      const Bytes block_bytes = ring.block_bytes[owner];
      if (j < g - 1) {
        const int holds_block[] = {ring.reach[i], j == 0 ? -1 : kv_arrived[i], last_kv_send[i]};
        kv_sends[i] = add_p2p(ctx, ranks[i], ranks[next], block_bytes,
                              ctx.graph.add_join(holds_block), ring.routing_proxies,
                              ring.routing_chunks, [&] {
                                return fmt::format("{} kv {} {} step {}", ring.what,
                                                   pass_name(pass), ring.size, j);
                              });
        if (kv_sends[i] >= 0) last_kv_send[i] = kv_sends[i];
      }
      last_compute[i] = ctx.graph.add_compute(
          ranks[i], ctx.micro_batch, compute_s(i, owner),
          {last_compute[i], j == 0 ? -1 : kv_arrived[i]}, [&] {
            return fmt::format("attention {} {} {} step {}", pass_name(pass), ring.what,
                               ring.size, j);
          });
      if (!forward) {
        const int dkv_ready[] = {last_compute[i], j == 0 ? -1 : dkv_arrived[i], last_dkv_send[i]};
        const bool home = j == g - 1;  // the last send takes the dKV to its owner
        dkv_sends[i] = add_p2p(
            ctx, ranks[i], ranks[next], block_bytes, ctx.graph.add_join(dkv_ready),
            ring.routing_proxies, ring.routing_chunks, [&] {
              return home ? fmt::format("{} dkv home bwd {}", ring.what, ring.size)
                          : fmt::format("{} dkv bwd {} step {}", ring.what, ring.size, j);
            });
        if (dkv_sends[i] >= 0) last_dkv_send[i] = dkv_sends[i];
      }
    }
    for (int i = 0; i < g; ++i) {
      kv_arrived[i] = kv_sends[position_before(i)];
      dkv_arrived[i] = dkv_sends[position_before(i)];
    }
  }
  for (int i = 0; i < g; ++i) {
    const int ends[] = {last_compute[i], forward ? -1 : dkv_arrived[i]};
    ctx.cursor[ranks[i]] = ctx.graph.add_join(ends);
  }
}

void add_ring(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  const GroupLayout layout = layout_of(group);
  const int g = static_cast<int>(group.ranks.size());
  const RingSteps ring{group.ranks,
                       bytes_per_member(layout.tokens, ctx.cost.model().kv_bytes_per_token()),
                       member_cursors(ctx, group),
                       group.routing_proxies,
                       group.routing_chunks,
                       "ring",
                       fmt::format("g{}", g)};
  // Packed: own tokens against the owner's, one call (runtime: its ring loop); the spans
  // are made on the first step the cache does not hold.
  std::vector<std::vector<DocumentRange>> spans;
  std::vector<AttentionBlock> blocks;
  std::vector<Seconds>* known = cached_step_times(ctx, group, layout, 1, 0, pass,
                                                  static_cast<std::size_t>(g) * g);
  add_ring_steps(
      ctx, ring,
      [&](int i, int owner) {
        Seconds* known_s = known ? &(*known)[static_cast<std::size_t>(i) * g + owner] : nullptr;
        if (known_s && *known_s >= 0) return *known_s;
        if (tiles_packed(ctx) && spans.empty()) spans = member_spans(ctx, group);
        const Seconds time_s =
            tiles_packed(ctx)
                ? call_time_s(ctx.cost, spans[i], spans[owner], 1, pass)
                : attention_time_s(ctx.cost, ring_step_blocks(layout, i, owner, blocks), 1, pass);
        if (known_s) *known_s = time_s;
        return time_s;
      },
      pass);
}

/// USP (Fang & Zhao 2024, arXiv 2405.07719): stage s holds ranks [s u, (s + 1) u). Each
/// stage's members run the Ulysses all-to-all among themselves (the cost rule of a Ulysses
/// group of u, KV heads replicated as there); then for each m the members m of the r
/// stages run a ring (add_ring_steps) whose blocks are a stage's KV for the member's heads
/// (usp_kv_bytes_per_token per stage token) and whose steps compute a stage's tokens
/// against a stage's tokens with the heads split u ways; then each stage's all-to-all
/// back. The stages are positions of a ring, so the ring's causal step blocks and packed
/// calls are the same functions over the stages' tokens (each stage's in member order).
void add_usp(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  const GroupLayout layout = layout_of(group);
  const Model& model = ctx.cost.model();
  const int tensor_parallel = ctx.cost.cluster().tensor_parallel.gpus;
  const bool forward = pass == Pass::forward;
  const int u = group.ulysses_degree;
  const int size = static_cast<int>(group.ranks.size());
  BALLAST_CHECK(u >= 1 && size % u == 0, "a validated usp group is whole stages");
  const int r = size / u;
  const auto stage_of = [u](int position) { return position / u; };
  // The stages as positions of a ring: tokens and chunks (in sequence order: members'
  // chunks of one sequence stay in member order).
  GroupLayout stages;
  stages.tokens.assign(static_cast<std::size_t>(r), 0);
  stages.chunks.resize(static_cast<std::size_t>(r));
  {
    MemberPositions position_of(group);
    for (std::size_t s = 0; s < group.sequences.size(); ++s) {
      for (const Chunk& chunk : group.sequences[s].chunks) {
        const int stage = stage_of(position_of(chunk.rank));
        stages.tokens[stage] += chunk.size();
        stages.chunks[stage].push_back({static_cast<int>(s), chunk.begin_tokens, chunk.end_tokens});
      }
    }
  }
  // Packed: each stage's members' spans in member order, made on the first step the cache
  // does not hold.
  std::vector<std::vector<DocumentRange>> stage_spans;
  const auto make_stage_spans = [&] {
    stage_spans.resize(static_cast<std::size_t>(r));
    const auto spans = member_spans(ctx, group);
    for (int i = 0; i < size; ++i) {
      auto& stage = stage_spans[stage_of(i)];
      stage.insert(stage.end(), spans[i].begin(), spans[i].end());
    }
  };
  const Bytes qkv_per_token = ulysses_qkv_bytes_per_token(model, tensor_parallel, u);
  const Bytes in_per_token = forward ? qkv_per_token : model.hidden_bytes_per_token();
  const Bytes out_per_token = forward ? model.hidden_bytes_per_token() : qkv_per_token;
  const auto stage_ranks = [&](int stage) {
    return std::vector<int>(group.ranks.begin() + stage * u, group.ranks.begin() + (stage + 1) * u);
  };
  const auto stage_bytes = [&](int stage, Bytes per_token) {
    std::vector<Bytes> bytes;
    for (int i = stage * u; i < (stage + 1) * u; ++i) bytes.push_back(layout.tokens[i] * per_token);
    return bytes;
  };
  const auto add_stage_all_to_all = [&](int stage, Bytes per_token, std::vector<int> deps,
                                        const char* what) {
    const std::vector<int> members = stage_ranks(stage);
    return ctx.graph.add_collective(
        members, ctx.micro_batch, ctx.cost.all_to_all_time_s(members, stage_bytes(stage, per_token)),
        ctx.ports.collective_ports(members), deps,
        [&] { return fmt::format("usp {} {}", what, pass_name(pass)); });
  };
  for (int stage = 0; stage < r; ++stage) {
    std::vector<int> deps;
    for (int rank : stage_ranks(stage)) deps.push_back(ctx.cursor[rank]);
    const int scatter =
        add_stage_all_to_all(stage, in_per_token, deps, forward ? "all-to-all qkv" : "all-to-all dout");
    for (int rank : stage_ranks(stage)) ctx.cursor[rank] = scatter;
  }
  const Bytes kv_per_token = usp_kv_bytes_per_token(model, tensor_parallel, u);
  const std::vector<Bytes> block_bytes = bytes_per_member(stages.tokens, kv_per_token);
  // Every member m of a stage computes the same stage-against-stage steps: each (stage,
  // owner) is priced once, on first use, for the u rings (and kept for later simulations:
  // the key is the members' layout, which fixes the stages' chunks and packed spans).
  std::vector<Seconds> own_step_s;
  std::vector<Seconds>* known =
      cached_step_times(ctx, group, layout, u, u, pass, static_cast<std::size_t>(r) * r);
  if (!known) own_step_s.assign(static_cast<std::size_t>(r) * r, -1.0);
  std::vector<Seconds>& step_s = known ? *known : own_step_s;
  std::vector<AttentionBlock> blocks;
  const auto compute_s = [&](int stage, int owner) {
    Seconds& known_s = step_s[static_cast<std::size_t>(stage) * r + owner];
    if (known_s < 0) {
      if (tiles_packed(ctx) && stage_spans.empty()) make_stage_spans();
      known_s = tiles_packed(ctx)
                    ? call_time_s(ctx.cost, stage_spans[stage], stage_spans[owner], u, pass)
                    : attention_time_s(ctx.cost, ring_step_blocks(stages, stage, owner, blocks),
                                       u, pass);
    }
    return known_s;
  };
  for (int m = 0; m < u; ++m) {
    RingSteps ring{{}, block_bytes, {}, 1, 1, "usp", fmt::format("u{} r{}", u, r)};
    for (int stage = 0; stage < r; ++stage) {
      ring.ranks.push_back(group.ranks[stage * u + m]);
      ring.reach.push_back(ctx.cursor[ring.ranks.back()]);
    }
    if (r == 1) {  // no ring, whole documents: Ulysses' compute (validate() admits r >= 2)
      const int rank = ring.ranks.front();
      const Seconds duration_s =
          tiles_packed(ctx) ? compute_s(0, 0)
                            : attention_time_s(ctx.cost, whole_documents(group), u, pass);
      ctx.cursor[rank] = ctx.graph.add_compute(rank, ctx.micro_batch, duration_s,
                                               {ctx.cursor[rank]}, [&] {
                                                 return fmt::format("attention {} usp {}",
                                                                    pass_name(pass), ring.size);
                                               });
      continue;
    }
    add_ring_steps(ctx, ring, compute_s, pass);
  }
  for (int stage = 0; stage < r; ++stage) {
    std::vector<int> deps;
    for (int rank : stage_ranks(stage)) deps.push_back(ctx.cursor[rank]);
    const int gather =
        add_stage_all_to_all(stage, out_per_token, deps, forward ? "all-to-all out" : "all-to-all dqkv");
    for (int rank : stage_ranks(stage)) ctx.cursor[rank] = gather;
  }
}

int add_direct_transfer(BuildContext& ctx, int src_rank, int dst_rank, Bytes bytes_per_layer,
                        std::initializer_list<int> deps, NameRef name) {
  return ctx.graph.add_transfer(src_rank, dst_rank, ctx.micro_batch,
                                ctx.cost.p2p_time_s(bytes_per_layer, src_rank, dst_rank),
                                ctx.cost.p2p_latency_s(src_rank, dst_rank),
                                ctx.ports.transfer_ports(src_rank, dst_rank), deps, name);
}

/// Bytes of piece `piece` of a routed part of part_bytes cut in `chunks` pieces of
/// ceil(part / chunks) bytes (the last one shorter; 0 past the part's end).
Bytes routed_piece_bytes(Bytes part_bytes, int chunks, int piece) {
  const Bytes piece_bytes = ceil_div(part_bytes, static_cast<Bytes>(chunks));
  const Bytes begin = piece * piece_bytes;
  return begin >= part_bytes ? 0 : std::min(piece_bytes, part_bytes - begin);
}

/// Zeppelin routing: part t of k carries routed_part_range(B, k, t). Part 0 leaves through
/// the sender's own NIC; part t >= 1 is dispatched to routing_proxy(src, t) over NVLink,
/// crosses on that proxy's NIC to routing_proxy(dst, t) and is combined into dst over
/// NVLink, in pieces of ceil(part / chunks) bytes so that one piece's NIC transfer overlaps
/// the next one's dispatch and the previous one's combine. Empty parts send nothing.
int add_routed_transfer(BuildContext& ctx, int src_rank, int dst_rank, Bytes bytes_per_layer,
                        int dep, int parts, int chunks,
                        NameRef name) {
  BALLAST_CHECK(chunks >= 1, "a validated plan has routing_chunks >= 1");
  const Cluster& cluster = ctx.cost.cluster();
  std::vector<int> arrivals;
  arrivals.push_back(add_direct_transfer(ctx, src_rank, dst_rank,
                                         routed_part_range(bytes_per_layer, parts, 0).size(),
                                         {dep}, [&] { return name() + " (nic)"; }));
  // Each stage of a part sends its pieces one after another (the routing layer streams
  // them), so one piece's NIC crossing overlaps the next one's dispatch and the previous
  // one's combine; the parts' dispatches share the sender's NVLink port and their
  // combines the receiver's.
  // Per part: its bytes, proxies and the last task of each stage (one vector, not one per
  // field: a step of routed rings calls this ~12,000 times).
  struct Part {
    Bytes bytes = 0;
    int from = 0, to = 0;
    int last_dispatch = -1, last_crossing = -1, last_piece = -1;
  };
  std::vector<Part> part(static_cast<std::size_t>(parts));
  for (int t = 1; t < parts; ++t) {
    part[t].bytes = routed_part_range(bytes_per_layer, parts, t).size();
    part[t].from = routing_proxy(cluster, src_rank, t);
    part[t].to = routing_proxy(cluster, dst_rank, t);
  }
  for (int piece = 0; piece < chunks; ++piece) {
    for (int t = 1; t < parts; ++t) {
      Part& p = part[t];
      const Bytes bytes = routed_piece_bytes(p.bytes, chunks, piece);
      if (bytes <= 0) continue;
      p.last_dispatch = add_direct_transfer(ctx, src_rank, p.from, bytes, {dep, p.last_dispatch},
                                            [&] { return name() + " (dispatch)"; });
      p.last_crossing = add_direct_transfer(ctx, p.from, p.to, bytes, {p.last_dispatch, p.last_crossing},
                                            [&] { return name() + " (nic)"; });
      p.last_piece = add_direct_transfer(ctx, p.to, dst_rank, bytes, {p.last_crossing, p.last_piece},
                                         [&] { return name() + " (combine)"; });
    }
  }
  for (int t = 1; t < parts; ++t) {
    if (part[t].last_piece >= 0) arrivals.push_back(part[t].last_piece);
  }
  return ctx.graph.add_join(arrivals);
}

}  // namespace

const char* pass_name(Pass pass) { return pass == Pass::forward ? "fwd" : "bwd"; }

std::int64_t& step_time_cache_hit_count() { return step_time_cache().hits; }

void add_attention_group(BuildContext& ctx, const AttentionGroup& group, Pass pass) {
  BALLAST_CHECK(!group.ranks.empty(), "a validated plan has no empty group");
  ctx.graph.set_category(group_category(group, ctx.cost.cluster()));
  switch (group.scheme) {
    case Scheme::local:
      return add_local(ctx, group, pass);
    case Scheme::ring:
      return group.ranks.size() == 1 ? add_local(ctx, group, pass) : add_ring(ctx, group, pass);
    case Scheme::all_gather:
      return add_all_gather(ctx, group, pass);
    case Scheme::ulysses:
      return add_ulysses(ctx, group, pass);
    case Scheme::usp:
      return add_usp(ctx, group, pass);
  }
  BALLAST_CHECK(false, "unknown scheme");
}

int add_p2p(BuildContext& ctx, int src_rank, int dst_rank, Bytes bytes_per_layer, int dep,
            int routing_proxies, int routing_chunks, NameRef name) {
  if (src_rank == dst_rank || bytes_per_layer <= 0) return dep;
  const int parts = routing_parts(ctx.cost.cluster(), routing_proxies, src_rank, dst_rank);
  if (parts == 1) {
    return add_direct_transfer(ctx, src_rank, dst_rank, bytes_per_layer, {dep}, name);
  }
  return add_routed_transfer(ctx, src_rank, dst_rank, bytes_per_layer, dep, parts, routing_chunks,
                             name);
}

Seconds p2p_floor_s(const CostModel& cost, int src_rank, int dst_rank, Bytes bytes_per_layer,
                    int routing_proxies, int routing_chunks) {
  if (src_rank == dst_rank || bytes_per_layer <= 0) return 0.0;
  const int parts = routing_parts(cost.cluster(), routing_proxies, src_rank, dst_rank);
  if (parts == 1) return cost.p2p_time_s(bytes_per_layer, src_rank, dst_rank);
  Seconds floor_s =
      cost.p2p_time_s(routed_part_range(bytes_per_layer, parts, 0).size(), src_rank, dst_rank);
  for (int t = 1; t < parts; ++t) {
    const Bytes part_bytes = routed_part_range(bytes_per_layer, parts, t).size();
    if (part_bytes <= 0) continue;
    const int from = routing_proxy(cost.cluster(), src_rank, t);
    const int to = routing_proxy(cost.cluster(), dst_rank, t);
    Seconds chain_s = cost.p2p_time_s(routed_piece_bytes(part_bytes, routing_chunks, 0), src_rank, from);
    Bytes last_piece = 0;
    for (int piece = 0; piece < routing_chunks; ++piece) {
      const Bytes bytes = routed_piece_bytes(part_bytes, routing_chunks, piece);
      if (bytes <= 0) break;
      chain_s += cost.p2p_time_s(bytes, from, to);
      last_piece = bytes;
    }
    floor_s = std::max(floor_s, chain_s + cost.p2p_time_s(last_piece, to, dst_rank));
  }
  return floor_s;
}

}  // namespace ballast::sim

namespace ballast {

void open_simulation_cache() { ++sim::step_time_cache().open_count; }

void close_simulation_cache() {
  sim::StepTimeCache& cache = sim::step_time_cache();
  if (cache.open_count == 0) return;  // unmatched: nothing is open (called from destructors)
  if (--cache.open_count == 0) cache.clear();
}

}  // namespace ballast
