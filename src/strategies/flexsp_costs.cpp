// FlexSP's building blocks that need no solver: the separable group costs, the
// solution rules, greedy homogeneous warm starts, Sequence Blaster's min-max split and
// the padding-minimising buckets.
#include <algorithm>
#include <limits>
#include <numeric>
#include <span>
#include <queue>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "flexsp.hpp"

namespace ballast::strategies::flexsp {

namespace {

constexpr Pass kPasses[] = {Pass::forward, Pass::backward};

/// The 2 x 2 all-to-alls of a Ulysses group on ranks [0, d) when every member holds
/// `member_tokens` tokens (QKV and output, every pass: the forward's twice under full
/// recomputation), as estimate_plan_time_s charges.
Seconds all_to_all_s(const CostModel& cost, int degree, Tokens member_tokens) {
  if (degree == 1) return 0.0;
  const std::vector<int> ranks = consecutive_ranks(0, degree);
  const Model& model = cost.model();
  const Bytes qkv_per_token =
      ulysses_qkv_bytes_per_token(model, cost.cluster().tensor_parallel.gpus, degree);
  const std::vector<Bytes> qkv(static_cast<std::size_t>(degree), qkv_per_token * member_tokens);
  const std::vector<Bytes> hidden(static_cast<std::size_t>(degree),
                                  model.hidden_bytes_per_token() * member_tokens);
  const double passes = pass_count(model, Pass::forward) + pass_count(model, Pass::backward);
  return passes * (cost.all_to_all_time_s(ranks, qkv) + cost.all_to_all_time_s(ranks, hidden));
}

}  // namespace

GroupCosts::GroupCosts(const CostModel& cost) : cost_(&cost), ranks_(cost.cluster().ranks()) {
  cluster_capacity_tokens_ = cost.token_capacity_per_rank() * ranks_;  // throws if none fits
  const Seconds overhead_s =
      cost.micro_batch_overhead_s(Pass::forward) + cost.micro_batch_overhead_s(Pass::backward);
  // The bandwidth term is linear in the bytes (alpha-beta and FlexSP's bw[d] alike), so
  // one large probe gives the slope exactly.
  constexpr Tokens kProbeMemberTokens = Tokens{1} << 20;
  for (int degree : allowed_degrees(cost, Scheme::ulysses)) {
    DegreeCost entry;
    entry.degree = degree;
    const Seconds latency_s = all_to_all_s(cost, degree, 0);
    entry.fixed_s = overhead_s + latency_s + cost.linear_collectives_latency_s();
    // Each member's TP collectives (0 without TP) run on its s / d tokens.
    const Seconds tensor_parallel_s =
        cost.linear_collectives_time_s(kProbeMemberTokens) - cost.linear_collectives_latency_s();
    entry.comm_s_per_token =
        (all_to_all_s(cost, degree, kProbeMemberTokens) - latency_s + tensor_parallel_s) /
        static_cast<double>(kProbeMemberTokens * degree);
    entry.capacity_tokens = degree * usable_tokens_per_rank(cost, Scheme::ulysses, degree);
    degrees_.push_back(entry);
  }
}

Seconds GroupCosts::sequence_s(Tokens length_tokens, std::size_t k) const {
  const DegreeCost& entry = degrees_[k];
  const AttentionBlock document = whole_document(length_tokens);
  Seconds time_s = entry.comm_s_per_token * static_cast<double>(length_tokens);
  for (Pass pass : kPasses) {
    time_s += pass_count(cost_->model(), pass) *
              (cost_->attention_time_s({&document, 1}, entry.degree, pass) +
               cost_->linear_time_s(length_tokens, pass) / entry.degree);
  }
  return time_s;
}

double GroupCosts::rank_share(std::span<const Seconds> time_s, Seconds target_s) const {
  double share = std::numeric_limits<double>::infinity();
  for (std::size_t k = 0; k < degrees_.size(); ++k) {
    const Seconds room_s = target_s - degrees_[k].fixed_s;
    if (time_s[k] <= room_s) share = std::min(share, degrees_[k].degree * time_s[k] / room_s);
  }
  return share;
}

Seconds GroupCosts::alone_s(std::span<const Seconds> time_s) const {
  Seconds alone_s = std::numeric_limits<Seconds>::infinity();
  for (std::size_t k = 0; k < degrees_.size(); ++k) alone_s = std::min(alone_s, degrees_[k].fixed_s + time_s[k]);
  return alone_s;
}

std::size_t GroupCosts::min_degree_index(Tokens length_tokens) const {
  for (std::size_t k = 0; k < degrees_.size(); ++k) {
    if (length_tokens <= degrees_[k].capacity_tokens) return k;
  }
  return kNone;
}

std::size_t GroupCosts::index_of_degree(int degree) const {
  for (std::size_t k = 0; k < degrees_.size(); ++k) {
    if (degrees_[k].degree == degree) return k;
  }
  return kNone;
}

std::int64_t Problem::sequences() const {
  return std::accumulate(counts.begin(), counts.end(), std::int64_t{0});
}

Tokens Problem::total_tokens() const {
  Tokens total = 0;
  for (std::size_t i = 0; i < lengths_tokens.size(); ++i) total += lengths_tokens[i] * counts[i];
  return total;
}

bool every_gpu_used(const GroupCosts& costs, const Problem& problem) {
  const int largest = costs.degrees().back().degree;
  return problem.sequences() * largest >= costs.ranks();
}

Seconds makespan_s(const GroupCosts& costs, const Problem& problem,
                   std::span<const SolvedGroup> groups) {
  Seconds makespan = 0;
  for (const SolvedGroup& group : groups) {
    Seconds time_s = costs.at(group.degree_index).fixed_s;
    for (std::size_t item : group.items) {
      time_s += costs.sequence_s(problem.lengths_tokens[item], group.degree_index);
    }
    makespan = std::max(makespan, time_s);
  }
  return makespan;
}

std::string check_solution(const GroupCosts& costs, const Problem& problem,
                           const Solution& solution) {
  if (!solution.feasible()) return "no groups";
  std::vector<std::int64_t> placed(problem.lengths_tokens.size(), 0);
  int ranks_used = 0;
  for (std::size_t g = 0; g < solution.groups.size(); ++g) {
    const SolvedGroup& group = solution.groups[g];
    if (group.degree_index >= costs.degree_count()) {
      return fmt::format("group {} has degree index {} of {}", g, group.degree_index,
                         costs.degree_count());
    }
    if (group.items.empty()) return fmt::format("group {} is empty", g);
    const DegreeCost& degree = costs.at(group.degree_index);
    ranks_used += degree.degree;
    Tokens tokens = 0;
    for (std::size_t item : group.items) {
      if (item >= problem.lengths_tokens.size()) {
        return fmt::format("group {} holds item {} of {}", g, item, problem.lengths_tokens.size());
      }
      const Tokens length = problem.lengths_tokens[item];
      if (costs.min_degree_index(length) > group.degree_index) {
        return fmt::format("group {} (degree {}) holds a {}-token sequence below its minimum "
                           "degree",
                           g, degree.degree, length);
      }
      tokens += length;
      ++placed[item];
    }
    if (tokens > degree.capacity_tokens) {
      return fmt::format("group {} (degree {}) holds {} tokens, over its capacity {}", g,
                         degree.degree, tokens, degree.capacity_tokens);
    }
  }
  for (std::size_t item = 0; item < placed.size(); ++item) {
    if (placed[item] != problem.counts[item]) {
      return fmt::format("item {} ({} tokens) placed {} times, count {}", item,
                         problem.lengths_tokens[item], placed[item], problem.counts[item]);
    }
  }
  const bool all = every_gpu_used(costs, problem);
  if (all ? ranks_used != costs.ranks() : ranks_used > costs.ranks()) {
    return fmt::format("groups use {} GPUs of {}{}", ranks_used, costs.ranks(),
                       all ? " (every GPU must be used)" : "");
  }
  return "";
}

std::vector<Solution> homogeneous_solutions(const GroupCosts& costs, const Problem& problem) {
  // Sequences longest first (ties: item index), one entry per sequence.
  std::vector<std::size_t> order(problem.lengths_tokens.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return problem.lengths_tokens[a] > problem.lengths_tokens[b];
  });
  std::size_t needed = 0;  // the largest minimum degree index over the items
  for (Tokens length : problem.lengths_tokens) {
    const std::size_t k = costs.min_degree_index(length);
    if (k == GroupCosts::kNone) return {};
    needed = std::max(needed, k);
  }
  const bool all = every_gpu_used(costs, problem);
  std::vector<Solution> solutions;
  for (std::size_t k = needed; k < costs.degree_count(); ++k) {
    const DegreeCost& degree = costs.at(k);
    const auto group_count = static_cast<std::size_t>(costs.ranks() / degree.degree);
    if (all && static_cast<std::size_t>(problem.sequences()) < group_count) continue;
    std::vector<Seconds> time_s(group_count, degree.fixed_s);
    std::vector<Tokens> tokens(group_count, 0);
    std::vector<SolvedGroup> groups(group_count, SolvedGroup{k, {}});
    // Least-loaded group first (ties: lowest index); groups without room are set aside
    // for this sequence and pushed back after.
    using Entry = std::pair<Seconds, std::size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> least;
    for (std::size_t g = 0; g < group_count; ++g) least.push({degree.fixed_s, g});
    bool feasible = true;
    std::vector<Entry> full;
    for (std::size_t item : order) {
      const Tokens length = problem.lengths_tokens[item];
      const Seconds item_s = costs.sequence_s(length, k);
      for (std::int64_t copy = 0; copy < problem.counts[item] && feasible; ++copy) {
        full.clear();
        while (!least.empty() && tokens[least.top().second] + length > degree.capacity_tokens) {
          full.push_back(least.top());
          least.pop();
        }
        if (least.empty()) {
          feasible = false;
          break;
        }
        const std::size_t g = least.top().second;
        least.pop();
        time_s[g] += item_s;
        tokens[g] += length;
        groups[g].items.push_back(item);
        least.push({time_s[g], g});
        for (const Entry& entry : full) least.push(entry);
      }
      if (!feasible) break;
    }
    if (!feasible) continue;
    Solution solution;
    for (SolvedGroup& group : groups) {
      if (group.items.empty()) continue;
      std::sort(group.items.begin(), group.items.end());
      solution.groups.push_back(std::move(group));
    }
    solution.makespan_s = makespan_s(costs, problem, solution.groups);
    solutions.push_back(std::move(solution));
  }
  return solutions;
}

std::vector<std::size_t> min_max_token_split(std::span<const Tokens> sorted_lengths,
                                             std::size_t micro_batches) {
  const std::size_t n = sorted_lengths.size();
  BALLAST_CHECK(micro_batches >= 1 && micro_batches <= n, "1 <= micro-batches <= sequences");
  // The least V such that greedy cuts (a range closes before it would exceed V) need at
  // most M ranges: binary search; this is the min-max value the DP finds.
  auto ranges_needed = [&](Tokens limit) {
    std::size_t ranges = 1;
    Tokens sum = 0;
    for (Tokens length : sorted_lengths) {
      if (sum + length > limit) {
        ++ranges;
        sum = 0;
      }
      sum += length;
    }
    return ranges;
  };
  Tokens low = *std::max_element(sorted_lengths.begin(), sorted_lengths.end());
  Tokens high = std::accumulate(sorted_lengths.begin(), sorted_lengths.end(), Tokens{0});
  while (low < high) {
    const Tokens middle = low + (high - low) / 2;
    if (ranges_needed(middle) <= micro_batches) {
      high = middle;
    } else {
      low = middle + 1;
    }
  }
  // Exactly M non-empty ranges of at most `low` tokens: fill greedily, but cut early when
  // the sequences left are only as many as the ranges still to open.
  std::vector<std::size_t> starts = {0};
  Tokens sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t ranges_to_open = micro_batches - starts.size();
    const bool must_cut = i > starts.back() && n - i == ranges_to_open;
    if (ranges_to_open > 0 && i > starts.back() && (sum + sorted_lengths[i] > low || must_cut)) {
      starts.push_back(i);
      sum = 0;
    }
    sum += sorted_lengths[i];
  }
  BALLAST_CHECK(starts.size() == micro_batches, "min-max split made every range");
  return starts;
}

namespace {

/// Distinct lengths of a sorted list with their counts.
void distinct_lengths(std::span<const Tokens> sorted_lengths, std::vector<Tokens>& values,
                      std::vector<std::int64_t>& counts) {
  for (std::size_t i = 0; i < sorted_lengths.size(); ++i) {
    BALLAST_CHECK(i == 0 || sorted_lengths[i - 1] <= sorted_lengths[i], "lengths sorted");
    if (values.empty() || values.back() != sorted_lengths[i]) {
      values.push_back(sorted_lengths[i]);
      counts.push_back(0);
    }
    ++counts.back();
  }
}

/// Item of every sequence given, per distinct value, its item.
std::vector<std::size_t> items_of_sequences(std::span<const std::int64_t> counts,
                                            std::span<const std::size_t> item_of_value) {
  std::vector<std::size_t> items;
  for (std::size_t v = 0; v < counts.size(); ++v) {
    items.insert(items.end(), static_cast<std::size_t>(counts[v]), item_of_value[v]);
  }
  return items;
}

}  // namespace

Buckets exact_items(std::span<const Tokens> sorted_lengths) {
  Buckets buckets;
  distinct_lengths(sorted_lengths, buckets.problem.lengths_tokens, buckets.problem.counts);
  std::vector<std::size_t> identity(buckets.problem.counts.size());
  std::iota(identity.begin(), identity.end(), std::size_t{0});
  buckets.item_of_sequence = items_of_sequences(buckets.problem.counts, identity);
  return buckets;
}

Buckets bucketize(std::span<const Tokens> sorted_lengths, Tokens capacity_tokens,
                  std::size_t initial_buckets) {
  BALLAST_CHECK(initial_buckets >= 1, "at least one bucket");
  std::vector<Tokens> values;
  std::vector<std::int64_t> counts;
  distinct_lengths(sorted_lengths, values, counts);
  const std::size_t n = values.size();
  if (n <= initial_buckets) return exact_items(sorted_lengths);
  // Prefix sums over distinct values: sequences C and tokens W. A bucket of values
  // (j, k] pads each sequence to values[k-1]: cost values[k-1] * (C_k - C_j) - (W_k - W_j).
  std::vector<std::int64_t> prefix_count(n + 1, 0);
  std::vector<Tokens> prefix_tokens(n + 1, 0);
  for (std::size_t i = 0; i < n; ++i) {
    prefix_count[i + 1] = prefix_count[i] + counts[i];
    prefix_tokens[i + 1] = prefix_tokens[i] + values[i] * counts[i];
  }
  auto padding = [&](std::size_t j, std::size_t k) {
    return values[k - 1] * (prefix_count[k] - prefix_count[j]) - (prefix_tokens[k] - prefix_tokens[j]);
  };
  const Tokens real_tokens = prefix_tokens[n];
  constexpr Tokens kInfinite = std::numeric_limits<Tokens>::max();
  // error[q][k]: least padding of the first k values in q buckets; cut[q][k] its last start.
  std::vector<std::vector<Tokens>> error = {std::vector<Tokens>(n + 1, kInfinite)};
  std::vector<std::vector<std::size_t>> cut = {std::vector<std::size_t>(n + 1, 0)};
  error[0][0] = 0;
  std::size_t q = 0;
  while (true) {
    ++q;
    error.emplace_back(n + 1, kInfinite);
    cut.emplace_back(n + 1, 0);
    for (std::size_t k = q; k <= n; ++k) {
      for (std::size_t j = q - 1; j < k; ++j) {  // ties: the earliest cut
        if (error[q - 1][j] == kInfinite) continue;
        const Tokens candidate = error[q - 1][j] + padding(j, k);
        if (candidate < error[q][k]) {
          error[q][k] = candidate;
          cut[q][k] = j;
        }
      }
    }
    // FlexSP raises Q while padded tokens exceed the midpoint of real tokens and capacity.
    const Tokens padded_tokens = real_tokens + error[q][n];
    const bool enough = 2 * padded_tokens <= real_tokens + capacity_tokens;
    if (q >= initial_buckets && (enough || q == n)) break;
  }
  // Walk the cuts back: bucket b covers values [start_b, end_b).
  std::vector<std::size_t> item_of_value(n);
  std::vector<std::pair<std::size_t, std::size_t>> ranges;
  for (std::size_t k = n, level = q; level > 0; --level) {
    ranges.emplace_back(cut[level][k], k);
    k = cut[level][k];
  }
  std::reverse(ranges.begin(), ranges.end());
  Buckets buckets;
  for (std::size_t b = 0; b < ranges.size(); ++b) {
    const auto [begin, end] = ranges[b];
    buckets.problem.lengths_tokens.push_back(values[end - 1]);
    buckets.problem.counts.push_back(prefix_count[end] - prefix_count[begin]);
    for (std::size_t v = begin; v < end; ++v) item_of_value[v] = b;
  }
  buckets.item_of_sequence = items_of_sequences(counts, item_of_value);
  return buckets;
}

}  // namespace ballast::strategies::flexsp
