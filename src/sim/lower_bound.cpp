// lower_bound(): a step time no valid plan beats, from total work spread over all ranks
// and from the micro-batches memory forces on the rank with the most tokens.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "ballast/error.hpp"
#include "ballast/simulator.hpp"

namespace ballast {

namespace {

/// The linear modules' collectives' time that grows with the tokens (TP's collectives and
/// an MoE model's expert-parallel all-to-alls; 0 without either): a rank runs them between
/// its compute tasks, never beside them, so every token's share adds to some rank's serial
/// time; their latency is paid once per rank and micro-batch. Both passes, the forward's
/// twice under full recomputation (linear_collectives_time_s). An MoE model's expert
/// load imbalance is its own term (expert_imbalance_floor_s).
Seconds tensor_parallel_bandwidth_s(Tokens tokens, const CostModel& cost) {
  if (tokens <= 0) return 0.0;
  return cost.linear_collectives_time_s(tokens) - cost.linear_collectives_latency_s();
}

/// The most tokens validate() lets a plan pad a sequence by on this cluster: 2 x group
/// size in ring and all-gather groups, under kMaxPadMultipleTokens in Ulysses and local ones.
Tokens padded_length_tokens(Tokens length, int ranks) {
  return length + std::max<Tokens>(2 * static_cast<Tokens>(ranks), kMaxPadMultipleTokens);
}

/// One sequence's attention, every pass (the forward twice under full recomputation), at
/// the document floor: what any group pays for it in all, shared by its members.
Seconds attention_floor_s(Tokens length, const CostModel& cost) {
  const Tokens padded = padded_length_tokens(length, cost.cluster().ranks());
  return cost.model().forward_passes() * cost.attention_document_floor_s(length, padded, Pass::forward) +
         cost.attention_document_floor_s(length, padded, Pass::backward);
}

/// The linear modules' time in the backward pass of `tokens` tokens, with the forward's
/// rerun under full recomputation (counted as backward time, as the simulator counts it).
Seconds linear_backward_pass_s(Tokens tokens, const CostModel& cost) {
  return (cost.model().forward_passes() - 1) * cost.linear_time_s(tokens, Pass::forward) +
         cost.linear_time_s(tokens, Pass::backward);
}

/// The batch's compute floors, summed over sequences. `total_s`: linear layers (with their
/// TP collectives' bandwidth time) plus attention at its document floor, forward (twice
/// under full recomputation) and backward. The same floors by pass, TP and expert
/// collectives left out: `forward_s` = linear layers and attention in one forward pass
/// (every plan runs all of it before its last micro-batch's backward pass); `backward_s` =
/// the backward pass plus, under full recomputation, the rerun forward (the simulator
/// counts both as backward time for the gradient buckets); `linear_backward_s` = its
/// linear modules' part (exact: linear time is proportional to the tokens).
struct ComputeFloors {
  Seconds total_s = 0;
  Seconds forward_s = 0;
  Seconds backward_s = 0;
  Seconds linear_backward_s = 0;
  /// Per sequence, the attention part of `backward_s` (the rerun forward's included).
  std::vector<Seconds> attention_backward_s;
};

ComputeFloors compute_floors(std::span<const Tokens> lengths_tokens, const CostModel& cost) {
  const int forward_passes = cost.model().forward_passes();
  const int ranks = cost.cluster().ranks();
  ComputeFloors floors;
  for (Tokens length : lengths_tokens) {
    const Tokens padded = padded_length_tokens(length, ranks);
    const Seconds linear_forward_s = cost.linear_time_s(length, Pass::forward);
    const Seconds linear_backward_s = cost.linear_time_s(length, Pass::backward);
    const Seconds attention_forward_s = cost.attention_document_floor_s(length, padded, Pass::forward);
    const Seconds attention_backward_s = cost.attention_document_floor_s(length, padded, Pass::backward);
    // attention_floor_s()'s sum, from the floors computed once.
    const Seconds attention_s = forward_passes * attention_forward_s + attention_backward_s;
    floors.total_s += tensor_parallel_bandwidth_s(length, cost) + forward_passes * linear_forward_s +
                      linear_backward_s + attention_s;
    const Seconds forward_s = linear_forward_s + attention_forward_s;
    floors.forward_s += forward_s;
    floors.backward_s += (forward_passes - 1) * forward_s + linear_backward_s + attention_backward_s;
    floors.linear_backward_s += linear_backward_pass_s(length, cost);
    floors.attention_backward_s.push_back((forward_passes - 1) * attention_forward_s + attention_backward_s);
  }
  return floors;
}

/// The most backward attention work (`attention_backward_s` per sequence) that sequences
/// of at most `tokens` tokens in all hold: the sequences by work per token, most first, the
/// last in part (the fractional knapsack, at least every whole set's).
Seconds most_attention_backward_s(std::span<const Tokens> lengths_tokens,
                                  const std::vector<Seconds>& attention_backward_s, Tokens tokens) {
  std::vector<std::size_t> order(lengths_tokens.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto per_token = [&](std::size_t i) {
    return lengths_tokens[i] > 0 ? attention_backward_s[i] / static_cast<double>(lengths_tokens[i]) : 0.0;
  };
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const double pa = per_token(a), pb = per_token(b);
    return pa != pb ? pa > pb : a < b;
  });
  Seconds most_s = 0;
  for (std::size_t i : order) {
    if (tokens <= 0) break;
    const Tokens taken = std::min(tokens, lengths_tokens[i]);
    most_s += taken == lengths_tokens[i] ? attention_backward_s[i] : per_token(i) * static_cast<double>(taken);
    tokens -= taken;
  }
  return most_s;
}

/// The fastest a GPU (a rank) can receive, over any link the simulator models: the best of
/// NVLink point-to-point and every node-local collective's bus bandwidth, plus its NIC
/// (a routed transfer arrives over both at once).
double fastest_receive_bytes_per_s(const Cluster& cluster) {
  double nvlink = std::max(cluster.intra_node_p2p_bw_bytes_per_s, cluster.intra_node_bus_bw_bytes_per_s);
  for (const auto& [op, fits] : cluster.intra_node_collectives) {
    for (const CollectiveFit& fit : fits) nvlink = std::max(nvlink, fit.bus_bw_bytes_per_s);
  }
  return nvlink + cluster.nic_bw_bytes_per_s;
}

/// Per member and pass, the Ulysses all-to-alls' bytes per token of the group: forward QKV
/// in and O out (every forward pass), backward dO in and dQKV out (replicas not counted).
double ulysses_bytes_per_token(const Model& model) {
  return model.forward_passes() *
             static_cast<double>(model.qkv_bytes_per_token() + model.hidden_bytes_per_token()) +
         static_cast<double>(model.hidden_bytes_per_token() + model.qkv_bytes_per_token());
}

/// A USP group of g = u x r ranks (u | heads/N, 2 <= u < g) running a sequence of
/// `length` whose attention floor is `attention_s`, every micro-batch's overhead
/// `overhead_s` on each member: the stage all-to-alls sit in a member's program before and
/// after its ring steps (collectives: no other op of the member runs beside them), so its
/// program takes its all-to-alls + its compute + the overheads; the ring's KV may arrive
/// while the member runs anything else (docs/simulator.md section 7), so it bounds the step
/// only on its own: max over members of program, and of ring receive time. The slowest
/// member takes at least the average of each: the stage all-to-alls' received bytes average
/// (u - 1) / u of length / g tokens' QKV + O and dO + dQKV bytes at the fastest receive
/// bandwidth B (or the cost model's all-to-all of u consecutive ranks of floor(length / g)
/// tokens each when lower: at most the average member's), the compute A / g, and the ring
/// receive (r - 1) / r x length x KV bytes / u per pass (its heads' KV of the other stages;
/// at least 1/u of the KV even with replicated heads).
Seconds usp_floor_s(Tokens length, int g, Seconds attention_s, Seconds overhead_s, const CostModel& cost) {
  const Model& model = cost.model();
  const int heads_per_rank = model.heads / std::max(1, cost.cluster().tensor_parallel.gpus);
  const double bandwidth = fastest_receive_bytes_per_s(cost.cluster());
  const double layers = model.layers;
  const double length_tokens = static_cast<double>(length);
  Seconds best_s = INFINITY;
  for (int u = 2; u < g; ++u) {
    if (g % u != 0 || heads_per_rank % u != 0) continue;
    const int r = g / u;
    Seconds all_to_all_s = layers * (u - 1.0) / u * length_tokens / g *
                           ulysses_bytes_per_token(model) / bandwidth;
    std::vector<int> members(static_cast<std::size_t>(u));
    for (int i = 0; i < u; ++i) members[i] = i;
    const auto placed_s = [&](Bytes bytes_per_token) {
      const std::vector<Bytes> bytes(static_cast<std::size_t>(u),
                                     length / static_cast<Tokens>(g) * bytes_per_token);
      return cost.all_to_all_time_s(members, bytes);
    };
    all_to_all_s = std::min(all_to_all_s, (model.forward_passes() + 1.0) *
                                              (placed_s(model.qkv_bytes_per_token()) +
                                               placed_s(model.hidden_bytes_per_token())));
    const Seconds ring_s = layers * (r - 1.0) / r * length_tokens *
                           static_cast<double>(model.kv_bytes_per_token()) / u *
                           (model.forward_passes() + 2.0) / bandwidth;
    best_s = std::min(best_s, std::max(all_to_all_s + attention_s / g + overhead_s, ring_s));
  }
  return best_s;
}

/// A time no group of any scheme or size runs the sequence in, every micro-batch's
/// overhead `overhead_s` included (docs/simulator.md section 7): the minimum over group
/// sizes g (members hold >= length / g tokens, within the token capacity) of
///   local (g = 1):         A + o
///   ring, all-gather:      max(A / g + o, (g - 1) / g x KV bytes x (forward passes + 2) / B)
///   Ulysses (g | heads/N): A / g + all-to-all floor (in: QKV / dO, out: O / dQKV, every pass) + o
///   USP (g = u x r):       usp_floor_s()
/// with A the attention floor of all passes and B the fastest receive bandwidth. What a
/// member runs in its program (compute, overheads, collectives) adds; what it receives
/// point to point (ring KV) may arrive while it runs other work, so it counts only on its
/// own. The sequence's linear work is not counted: a plan's linear layout may put its
/// tokens on any ranks (a remap), so no member is bound to run any of it.
Seconds longest_sequence_floor_s(Tokens length, Seconds overhead_s, const CostModel& cost) {
  if (length <= 0) return 0.0;
  const Model& model = cost.model();
  const Cluster& cluster = cost.cluster();
  const int ranks = cluster.ranks();
  const Tokens capacity = cost.token_capacity_per_rank();
  const Seconds attention_s = attention_floor_s(length, cost);
  const double bandwidth = fastest_receive_bytes_per_s(cluster);
  const double layers = model.layers;
  const double forward_passes = model.forward_passes();
  const double length_tokens = static_cast<double>(length);
  // Ulysses needs g to divide each TP member's heads (also with KV heads replicated).
  const int heads_per_rank = model.heads / std::max(1, cluster.tensor_parallel.gpus);
  Seconds best_s = length <= capacity ? attention_s + overhead_s : INFINITY;
  std::vector<int> members;
  std::vector<Bytes> member_bytes;
  for (int g = 2; g <= ranks; ++g) {
    if (ceil_div(length, static_cast<Tokens>(g)) > capacity) continue;
    const double share = (g - 1.0) / g;
    // Ring and all-gather: each member receives the other members' KV (the forward pass,
    // rerun under recomputation; the backward pass's KV and dKV, or gather + reduce-scatter),
    // and shares the compute; compute and transfers may overlap.
    const Seconds kv_s = layers * share * length_tokens * static_cast<double>(model.kv_bytes_per_token()) *
                         (forward_passes + 2.0) / bandwidth;
    best_s = std::min(best_s, std::max(attention_s / g + overhead_s, kv_s));
    if (heads_per_rank % g != 0) continue;
    // Ulysses: the all-to-alls come before and after the attention (no overlap). Each
    // member receives (g - 1) / g of its share of the group's bytes; the cost model's own
    // all-to-all on g consecutive ranks when that is cheaper (a cost model whose
    // all-to-all does not depend on placement, as the profiled one, charges the member
    // holding the most, at least ceil(length / g) tokens).
    const double received_bytes = layers * share * length_tokens / g * ulysses_bytes_per_token(model);
    Seconds all_to_all_s = received_bytes / bandwidth;
    members.resize(static_cast<std::size_t>(g));
    member_bytes.assign(static_cast<std::size_t>(g), 0);
    for (int i = 0; i < g; ++i) members[i] = i;
    const auto placed_s = [&](Bytes bytes_per_token) {
      for (int i = 0; i < g; ++i) member_bytes[i] = ceil_div(length, static_cast<Tokens>(g)) * bytes_per_token;
      return cost.all_to_all_time_s(members, member_bytes);
    };
    // The same two all-to-alls in each pass (QKV and O forward, dO and dQKV backward).
    const Seconds placed_total_s = (forward_passes + 1.0) * (placed_s(model.qkv_bytes_per_token()) +
                                                             placed_s(model.hidden_bytes_per_token()));
    all_to_all_s = std::min(all_to_all_s, placed_total_s);
    best_s = std::min(best_s, attention_s / g + all_to_all_s + overhead_s);
  }
  for (int g = 4; g <= ranks; ++g) {
    if (ceil_div(length, static_cast<Tokens>(g)) > capacity) continue;
    best_s = std::min(best_s, usp_floor_s(length, g, attention_s, overhead_s, cost));
  }
  return std::isfinite(best_s) ? best_s : 0.0;
}

/// Micro-batch counts the MoE term scans at most (on Zeppelin's MoE scenarios its stop
/// comes after about 3,000).
constexpr std::int64_t kMaxScannedMicroBatches = 4096;

/// min_{m <= i} Model::expert_load_factor(m) for i < `count`, kept per routing (seed,
/// layers, experts, expert-parallel degree, skew) for the process: each factor costs
/// layers x experts draws, and every simulation of a step computes the bound (a compare of
/// ten strategies over four steps, forty times). Thread-safe; grown on demand.
std::vector<double> least_load_factors(const Model& model, std::int64_t count) {
  using Key = std::tuple<std::uint64_t, int, int, int, double>;
  static std::mutex mutex;
  static std::map<Key, std::vector<double>> known;
  const Key key{model.routing_seed, model.layers, model.experts, model.expert_parallel,
                model.routing_skew_cv};
  std::vector<double> least;
  {
    const std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = known.find(key); it != known.end()) least = it->second;
  }
  if (static_cast<std::int64_t>(least.size()) >= count) {
    least.resize(static_cast<std::size_t>(count));
    return least;
  }
  for (auto m = static_cast<std::int64_t>(least.size()); m < count; ++m) {
    const double factor = model.expert_load_factor(m);
    least.push_back(least.empty() ? factor : std::min(least.back(), factor));
  }
  const std::lock_guard<std::mutex> lock(mutex);
  std::vector<double>& kept = known[key];
  if (kept.size() < least.size()) kept = least;
  return least;
}

/// An MoE model's expert load imbalance that no plan avoids, with what a plan of more
/// micro-batches pays for a smaller one, per rank, beyond the spread's terms for
/// `min_micro_batches` micro-batches (docs/simulator.md section 7). Micro-batch m adds
/// (f_m - 1) x the experts' share s of the linear time of every linear token in it on
/// the token's rank (CostModel::expert_imbalance_time_s, f_m =
/// Model::expert_load_factor(m) >= 1; the forward's twice under full recomputation). A
/// valid plan of M micro-batches has a linear token in each (validate(): no empty
/// micro-batch, group, sequence or chunk, and every sequence here is at least 1 token
/// long), so its ranks add at least (min_{m<M} f_m - 1) s W in all (W: the linear time of
/// every token, each pass; proportional to the tokens, so shared out it sums the same),
/// and pay M overheads o and at least max(M, slots) linear-collective latencies c. Per
/// rank, over M >= min_micro_batches:
///   min_M  M o + max(M, slots) c / ranks + (min_{m<M} f_m - 1) s W / ranks
/// less its value without the imbalance at min_micro_batches (what the spread has). The
/// scan stops once M o + max(M, slots) c / ranks alone reaches the best (f >= 1), or after
/// kMaxScannedMicroBatches, counting any larger M at that part alone (valid, weaker). 0 for
/// a dense model, an expert-parallel degree of 1, no routing skew, an empty batch or a
/// zero-length sequence (a micro-batch of zero-length sequences holds no linear token).
Seconds expert_imbalance_floor_s(Tokens shortest_tokens, Tokens total_tokens,
                                 std::int64_t min_micro_batches, Tokens slots, const CostModel& cost) {
  const Model& model = cost.model();
  if (!model.is_moe() || model.expert_parallel <= 1 || !(model.routing_skew_cv > 0)) return 0.0;
  if (total_tokens <= 0 || shortest_tokens <= 0) return 0.0;
  const double ranks = cost.cluster().ranks();
  const Seconds overhead_s =
      cost.micro_batch_overhead_s(Pass::forward) + cost.micro_batch_overhead_s(Pass::backward);
  const Seconds latency_s = cost.linear_collectives_latency_s();
  const double share = model.expert_flops_per_token() / model.linear_flops_per_token();
  const Seconds imbalance_per_excess_s =
      share *
      (model.forward_passes() * cost.linear_time_s(total_tokens, Pass::forward) +
       cost.linear_time_s(total_tokens, Pass::backward)) /
      ranks;
  const auto paid_s = [&](std::int64_t micro_batches) {
    return static_cast<double>(micro_batches) * overhead_s +
           static_cast<double>(std::max<std::int64_t>(micro_batches, slots)) * latency_s / ranks;
  };
  const std::int64_t first = std::max<std::int64_t>(1, min_micro_batches);
  std::vector<double> least;  // least_load_factors, fetched in growing blocks
  Seconds best_s = INFINITY;
  std::int64_t micro_batches = first;
  for (std::int64_t scanned = 0;; ++scanned, ++micro_batches) {
    if (paid_s(micro_batches) >= best_s) break;
    if (scanned == kMaxScannedMicroBatches) {
      best_s = std::min(best_s, paid_s(micro_batches));  // larger counts: no imbalance counted
      break;
    }
    if (static_cast<std::int64_t>(least.size()) < micro_batches) {
      least = least_load_factors(
          model, std::min(first + kMaxScannedMicroBatches,
                          std::max<std::int64_t>(micro_batches, 2 * static_cast<std::int64_t>(least.size()) + 64)));
    }
    const double least_factor = least[static_cast<std::size_t>(micro_batches - 1)];
    best_s = std::min(best_s, paid_s(micro_batches) +
                                  std::max(0.0, least_factor - 1.0) * imbalance_per_excess_s);
  }
  return std::max(0.0, best_s - paid_s(first));
}

}  // namespace

LowerBound lower_bound(std::span<const Tokens> lengths_tokens, const CostModel& cost,
                       GradientSync gradient_sync) {
  const int ranks = cost.cluster().ranks();
  BALLAST_CHECK(ranks > 0, "a validated cluster has ranks");
  if (static_cast<std::int64_t>(lengths_tokens.size()) > kMaxBatchSequences) {
    throw InputError(fmt::format("sequence lengths: {} sequences, over ballast's limit of {}",
                                 lengths_tokens.size(), kMaxBatchSequences));
  }
  Tokens total_tokens = 0;  // at most 10^6 x 2^31 < 2^51
  Tokens shortest_tokens = kMaxSequenceTokens;
  for (Tokens length : lengths_tokens) {
    if (length < 0) {
      throw InputError(
          fmt::format("sequence lengths: {} is negative; lengths are token counts >= 0", length));
    }
    if (length > kMaxSequenceTokens) {
      throw InputError(fmt::format(
          "sequence lengths: {} is over ballast's limit of 2^31 = {} tokens", length,
          kMaxSequenceTokens));
    }
    total_tokens += length;
    shortest_tokens = std::min(shortest_tokens, length);
  }
  const Tokens capacity_tokens = cost.token_capacity_per_rank();
  const Seconds overhead_s =
      cost.micro_batch_overhead_s(Pass::forward) + cost.micro_batch_overhead_s(Pass::backward);
  // Paid by every rank-micro-batch holding tokens.
  const Seconds per_slot_s = cost.linear_collectives_latency_s();

  LowerBound bound;
  // An empty batch needs no micro-batch (and pays no overhead).
  // Saturating: a cluster with absurd memory has a capacity near 2^63 tokens per rank.
  bound.min_micro_batches = ceil_div(total_tokens, saturating_multiply(ranks, capacity_tokens));
  const ComputeFloors floors = compute_floors(lengths_tokens, cost);
  bound.compute_per_rank_s = floors.total_s / ranks;
  bound.overhead_s = static_cast<double>(bound.min_micro_batches) * overhead_s;
  // Overlapped, the last bucket still waits for the end of the last backward pass.
  bound.gradient_sync_s =
      gradient_sync == GradientSync::end
          ? cost.gradient_sync_time_s()
          : cost.gradient_bucket_sync_time_s(gradient_sync_buckets(cost.model()));
  // Every rank pays the overhead of every micro-batch (sim/program.cpp). Every
  // rank-micro-batch holding tokens holds at most `capacity` of them and pays the linear
  // collectives' latency: at least ceil(total / capacity) such slots exist, shared by all
  // ranks.
  const Tokens slots = ceil_div(total_tokens, capacity_tokens);
  bound.expert_imbalance_s =
      expert_imbalance_floor_s(shortest_tokens, total_tokens, bound.min_micro_batches, slots, cost);
  const Seconds spread_s = bound.compute_per_rank_s + bound.overhead_s +
                           static_cast<double>(slots) * per_slot_s / ranks + bound.expert_imbalance_s;
  // The rank with the most linear tokens holds >= ceil(total / ranks) of them, at most
  // `capacity` per micro-batch, so it runs >= min_micro_batches micro-batches.
  const Tokens fullest_tokens = ceil_div(total_tokens, ranks);
  const Seconds fullest_s =
      bound.overhead_s +
      cost.model().forward_passes() * cost.linear_time_s(fullest_tokens, Pass::forward) +
      cost.linear_time_s(fullest_tokens, Pass::backward) +
      tensor_parallel_bandwidth_s(fullest_tokens, cost) +
      static_cast<double>(bound.min_micro_batches) * cost.linear_collectives_latency_s();
  Tokens longest = 0;
  for (Tokens length : lengths_tokens) longest = std::max(longest, length);
  // Monotone in the length, so the longest sequence's floor is the largest.
  // Its busiest member pays every micro-batch's overhead too.
  bound.longest_sequence_s = longest_sequence_floor_s(longest, bound.overhead_s, cost);
  if (bound.longest_sequence_s > std::max(spread_s, fullest_s)) {
    bound.binding = fmt::format("the longest sequence ({} tokens) on its best group", longest);
  } else if (spread_s >= fullest_s) {
    bound.binding = fmt::format("compute spread over {} ranks", ranks);
  } else {
    bound.binding = "memory-forced micro-batches";
  }
  bound.time_s = std::max({spread_s, fullest_s, bound.longest_sequence_s}) + bound.gradient_sync_s;
  // Overlapped, the buckets still run one after another (each waits for the previous), and
  // the first waits until every rank has run its whole forward work and 1 / B of its last
  // backward pass (docs/simulator.md section 7): what binds when the backward pass is too
  // short to hide the sync.
  if (gradient_sync == GradientSync::overlap && total_tokens > 0) {
    const int buckets = gradient_sync_buckets(cost.model());
    bound.gradient_buckets_s = buckets * cost.gradient_bucket_sync_time_s(buckets);
    // Only the last micro-batch's backward pass can hide buckets, and a rank runs at most
    // `capacity` linear tokens in it: the linear backward work beyond that comes before;
    // its sequences hold at most ranks x capacity tokens, so the attention backward work
    // beyond the most such sequences hold comes before too. None when every sequence fits
    // one micro-batch (exactly 0: no rounding of a sum taken in another order).
    Seconds attention_excess_s = 0;
    if (bound.min_micro_batches > 1) {
      Seconds attention_backward_s = 0;
      for (Seconds work_s : floors.attention_backward_s) attention_backward_s += work_s;
      attention_excess_s = std::max(
          0.0, attention_backward_s - most_attention_backward_s(lengths_tokens, floors.attention_backward_s,
                                                                saturating_multiply(ranks, capacity_tokens)));
    }
    bound.first_bucket_ready_s =
        (floors.forward_s + floors.backward_s / buckets) / ranks +
        (1.0 - 1.0 / buckets) * (std::max(0.0, floors.linear_backward_s / ranks -
                                                    linear_backward_pass_s(capacity_tokens, cost)) +
                                 attention_excess_s / ranks);
    const Seconds sync_bound_s = bound.first_bucket_ready_s + bound.gradient_buckets_s;
    // One bucket is the last, after every rank's program: the spread's term has it.
    if (buckets > 1 && sync_bound_s > bound.time_s) {
      bound.time_s = sync_bound_s;
      bound.binding = fmt::format("the gradient sync's {} buckets after the forward pass", buckets);
    }
  }
  return bound;
}

}  // namespace ballast
