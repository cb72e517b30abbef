// The flexsp and flexsp-fast planners: Sequence Blaster over M_min .. M_min+4 micro-batches,
// each micro-batch solved by FlexSP's bucketed MILP (flexsp) or the fast planner
// (flexsp-fast), materialised to concrete sequences and placed buddy-aligned.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <span>

#include <fmt/format.h>

#include "ballast/error.hpp"
#include "flexsp.hpp"
#include "ulysses.hpp"

namespace ballast::strategies::flexsp {

namespace {

/// FlexSP tries M_min .. M_min + kExtraMicroBatches micro-batches (SYSTEMS.md section 2).
constexpr std::size_t kExtraMicroBatches = 4;
/// Relative margin by which the makespans solved so far must pass the best M's step before
/// an M is given up (plan_flexsp): far above the rounding of a sum of a few thousand terms.
constexpr double kSolvedSumMargin = 1e-9;

/// How one micro-batch is solved.
struct SolverChoice {
  enum class Kind { milp, fast } kind = Kind::milp;
  MilpOptions milp;             ///< budget (warm starts are filled per micro-batch)
  std::size_t buckets = 16;     ///< FlexSP's initial Q; 0 = per-sequence (exact) items
  bool refine_with_milp = false;  ///< flexsp-fast: also run the MILP, keep the better
};

/// A micro-batch solved on concrete sequences: per group, its degree index and sequence ids.
struct ConcreteGroup {
  std::size_t degree_index = 0;
  std::vector<std::int64_t> sequence_ids;
  Seconds time_s = 0;
};
struct ConcreteMicroBatch {
  std::vector<ConcreteGroup> groups;
  Seconds makespan_s = 0;
};

/// Gives each bucket's real sequences (longest first) to the solution's slots for that
/// bucket, each to the slot whose group has the least real time so far (ties: lowest
/// group), and recomputes the true makespan. `ids` / `lengths` are the micro-batch's
/// sequences in the order `item_of_sequence` refers to.
ConcreteMicroBatch materialise(const GroupCosts& costs, const Solution& solution,
                               std::span<const std::size_t> item_of_sequence,
                               std::span<const std::int64_t> ids,
                               std::span<const Tokens> lengths) {
  ConcreteMicroBatch result;
  for (const SolvedGroup& group : solution.groups) {
    result.groups.push_back({group.degree_index, {}, costs.at(group.degree_index).fixed_s});
  }
  // slots[item] = (group, remaining sequences of that item in the group)
  std::size_t items = 0;
  for (std::size_t item : item_of_sequence) items = std::max(items, item + 1);
  std::vector<std::vector<std::pair<std::size_t, std::int64_t>>> slots(items);
  for (std::size_t g = 0; g < solution.groups.size(); ++g) {
    for (std::size_t item : solution.groups[g].items) {
      auto& item_slots = slots[item];
      if (item_slots.empty() || item_slots.back().first != g) item_slots.push_back({g, 0});
      ++item_slots.back().second;
    }
  }
  std::vector<std::size_t> order(ids.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return lengths[a] > lengths[b]; });
  for (std::size_t i : order) {
    auto& item_slots = slots[item_of_sequence[i]];
    std::size_t best = item_slots.size();
    for (std::size_t s = 0; s < item_slots.size(); ++s) {
      if (item_slots[s].second == 0) continue;
      if (best == item_slots.size() ||
          result.groups[item_slots[s].first].time_s < result.groups[item_slots[best].first].time_s) {
        best = s;
      }
    }
    BALLAST_CHECK(best < item_slots.size(), "every sequence has a slot in its bucket");
    --item_slots[best].second;
    ConcreteGroup& group = result.groups[item_slots[best].first];
    group.sequence_ids.push_back(ids[i]);
    group.time_s += costs.sequence_s(lengths[i], group.degree_index);
  }
  for (const ConcreteGroup& group : result.groups) {
    result.makespan_s = std::max(result.makespan_s, group.time_s);
  }
  return result;
}

/// FlexSP's MILP on the micro-batch's buckets (or its exact items), warm-started with the
/// greedy homogeneous plans and materialised; no groups if infeasible.
ConcreteMicroBatch solve_by_milp(const GroupCosts& costs, const SolverChoice& choice,
                                 const Buckets& exact, std::span<const std::int64_t> ids,
                                 std::span<const Tokens> lengths) {
  const Buckets buckets = choice.buckets == 0
                              ? exact
                              : bucketize(lengths, costs.cluster_capacity_tokens(), choice.buckets);
  MilpOptions options = choice.milp;
  options.warm_starts = homogeneous_solutions(costs, buckets.problem);
  const MilpResult milp = solve_milp(costs, buckets.problem, options);
  if (!milp.solution.feasible()) return {};
  return materialise(costs, milp.solution, buckets.item_of_sequence, ids, lengths);
}

/// Solves one micro-batch (sequences given ascending by length); no groups if infeasible.
ConcreteMicroBatch solve_micro_batch(const GroupCosts& costs, const SolverChoice& choice,
                                     std::span<const std::int64_t> ids,
                                     std::span<const Tokens> lengths) {
  const Buckets exact = exact_items(lengths);
  if (choice.kind == SolverChoice::Kind::milp) {
    return solve_by_milp(costs, choice, exact, ids, lengths);
  }
  const Solution fast = solve_fast(costs, exact.problem);
  if (!fast.feasible()) return {};
  ConcreteMicroBatch best = materialise(costs, fast, exact.item_of_sequence, ids, lengths);
  if (choice.refine_with_milp) {
    ConcreteMicroBatch refined = solve_by_milp(costs, choice, exact, ids, lengths);
    if (!refined.groups.empty() && refined.makespan_s < best.makespan_s) best = std::move(refined);
  }
  return best;
}

/// Groups in ascending degree on consecutive ranks (buddy-aligned: the ranks before a
/// group of degree d are a multiple of d because every degree is a power of two dividing
/// the rank count). Ties keep the solver's order.
MicroBatch place(const GroupCosts& costs, ConcreteMicroBatch solved, const Plan& plan) {
  std::stable_sort(solved.groups.begin(), solved.groups.end(),
                   [](const ConcreteGroup& a, const ConcreteGroup& b) {
                     return a.degree_index < b.degree_index;
                   });
  MicroBatch micro_batch;
  int first_rank = 0;
  for (const ConcreteGroup& group : solved.groups) {
    const int degree = costs.at(group.degree_index).degree;
    BALLAST_CHECK(first_rank % degree == 0, "ascending power-of-two groups are buddy-aligned");
    micro_batch.groups.push_back(
        ulysses_group(group.sequence_ids, consecutive_ranks(first_rank, degree), plan));
    first_rank += degree;
  }
  return micro_batch;
}

}  // namespace

bool& give_up_losing_micro_batch_counts() {
  thread_local bool give_up = true;
  return give_up;
}

std::int64_t& given_up_micro_batch_counts() {
  thread_local std::int64_t count = 0;
  return count;
}

SequenceTimes sequence_times(const GroupCosts& costs, std::span<const Tokens> ascending) {
  SequenceTimes times;
  const std::size_t degrees = costs.degree_count();
  for (std::size_t i = 0; i < ascending.size(); ++i) {
    if (i > 0 && ascending[i] == ascending[i - 1]) continue;
    times.first.push_back(i);
    for (std::size_t k = 0; k < degrees; ++k) {
      times.time_s.push_back(ascending[i] <= costs.at(k).capacity_tokens
                                 ? costs.sequence_s(ascending[i], k)
                                 : std::numeric_limits<Seconds>::infinity());
    }
  }
  return times;
}

Seconds makespan_floor_s(const GroupCosts& costs, const SequenceTimes& times, std::size_t begin,
                         std::size_t end) {
  const std::size_t degrees = costs.degree_count();
  // The runs of equal lengths that meet [begin, end), with how many sequences of each.
  const auto run_end = [&](std::size_t r) {
    return r + 1 < times.first.size() ? times.first[r + 1] : std::numeric_limits<std::size_t>::max();
  };
  std::size_t r = static_cast<std::size_t>(
      std::upper_bound(times.first.begin(), times.first.end(), begin) - times.first.begin() - 1);
  std::vector<std::pair<std::size_t, double>> runs;
  for (std::size_t i = begin; i < end; r++) {
    const std::size_t stop = std::min(end, run_end(r));
    runs.emplace_back(r, static_cast<double>(stop - i));
    i = stop;
  }
  const auto row = [&](std::size_t run) {
    return std::span<const Seconds>(times.time_s).subspan(run * degrees, degrees);
  };
  Seconds low_s = 0;
  for (const auto& [run, count] : runs) low_s = std::max(low_s, costs.alone_s(row(run)));
  const auto overfull = [&](Seconds target_s) {  // the fluid share of the ranks > 1
    double ranks = 0;
    for (const auto& [run, count] : runs) ranks += costs.rank_share(row(run), target_s) * count;
    return ranks > costs.ranks();
  };
  if (!std::isfinite(low_s) || !(low_s > 0) || !overfull(low_s)) return low_s;
  // A T the sequences fit by: each in its degree of least work d x t, with room of at least
  // its own t and of the mean work W (sum of d x t over the ranks), takes at most
  // d x t / W of the ranks, all of them at most the ranks. (The share only falls as T
  // grows, so doubling past a rounding also ends.)
  Seconds fixed_s = 0, work_s = 0, longest_s = 0;
  for (std::size_t k = 0; k < degrees; ++k) fixed_s = std::max(fixed_s, costs.at(k).fixed_s);
  for (const auto& [run, count] : runs) {
    std::size_t least = 0;
    for (std::size_t k = 1; k < degrees; ++k) {
      if (costs.at(k).degree * times.time_s[run * degrees + k] <
          costs.at(least).degree * times.time_s[run * degrees + least]) {
        least = k;
      }
    }
    work_s += count * costs.at(least).degree * times.time_s[run * degrees + least];
    longest_s = std::max(longest_s, times.time_s[run * degrees + least]);
  }
  Seconds high_s = std::max(2 * low_s, fixed_s + std::max(work_s / costs.ranks(), longest_s));
  while (overfull(high_s)) {
    low_s = high_s;
    high_s *= 2;
  }
  while (high_s - low_s > kMakespanFloorPrecision * high_s) {
    const Seconds middle_s = 0.5 * (low_s + high_s);
    (overfull(middle_s) ? low_s : high_s) = middle_s;
  }
  return low_s;
}

namespace {

Plan plan_flexsp(const Batch& batch, const CostModel& cost, const SolverChoice& choice,
                 const std::string& strategy) {
  Plan plan = make_plan_skeleton(batch, cost, strategy);
  default_degree(batch, cost, Scheme::ulysses, strategy);  // PlanningError naming a too-long sequence
  const GroupCosts costs(cost);
  // Sequence Blaster: the batch sorted ascending (ties: id), cut into M contiguous
  // micro-batches with the least largest token sum, for M = M_min .. M_min + 4.
  std::vector<std::int64_t> ids(batch.lengths_tokens.size());
  std::iota(ids.begin(), ids.end(), std::int64_t{0});
  std::stable_sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) {
    return batch.lengths_tokens[static_cast<std::size_t>(a)] <
           batch.lengths_tokens[static_cast<std::size_t>(b)];
  });
  std::vector<Tokens> lengths;
  for (std::int64_t id : ids) lengths.push_back(batch.lengths_tokens[static_cast<std::size_t>(id)]);
  const std::size_t n = lengths.size();
  const SequenceTimes times = sequence_times(costs, lengths);
  const Tokens total_tokens = std::accumulate(lengths.begin(), lengths.end(), Tokens{0});
  const auto min_micro_batches = static_cast<std::size_t>(std::max<Tokens>(
      1, (total_tokens + costs.cluster_capacity_tokens() - 1) / costs.cluster_capacity_tokens()));
  std::vector<ConcreteMicroBatch> best;
  Seconds best_time_s = 0;
  // Past M_min + 4 only while nothing was feasible (bin-packing can defeat the token
  // bound); one sequence per micro-batch always is, since each fits some group.
  for (std::size_t m = std::min(min_micro_batches, n);
       m <= n && (m <= min_micro_batches + kExtraMicroBatches || best.empty()); ++m) {
    const std::vector<std::size_t> starts = min_max_token_split(lengths, m);
    const auto end_of = [&](std::size_t b) { return b + 1 < m ? starts[b + 1] : n; };
    // An M whose micro-batches cannot beat the best M's step is given up before all are
    // solved: the micro-batches are solved last first (the longest sequences, the longest
    // makespans), and once those solved plus the others' floors (makespan_floor_s) pass
    // the best step, the rest are not. The margin covers the sums' rounding (taken in
    // another order than the step's, below: n terms differ by at most n ulps).
    const bool give_up = !best.empty() && give_up_losing_micro_batch_counts();
    std::vector<Seconds> floor_s(m, 0.0);
    Seconds unsolved_floor_s = 0;
    if (give_up) {
      for (std::size_t b = 0; b < m; ++b) {
        floor_s[b] = makespan_floor_s(costs, times, starts[b], end_of(b));
        unsolved_floor_s += floor_s[b];
      }
    }
    std::vector<ConcreteMicroBatch> candidate(m);
    Seconds solved_s = 0;
    bool feasible = true;
    for (std::size_t b = m; b-- > 0 && feasible;) {
      if (give_up && solved_s + unsolved_floor_s > best_time_s * (1 + kSolvedSumMargin)) {
        ++given_up_micro_batch_counts();
        feasible = false;
        break;
      }
      const std::size_t begin = starts[b];
      candidate[b] = solve_micro_batch(costs, choice, std::span(ids).subspan(begin, end_of(b) - begin),
                                       std::span(lengths).subspan(begin, end_of(b) - begin));
      feasible = !candidate[b].groups.empty();  // else this M cannot run
      solved_s += candidate[b].makespan_s;
      unsolved_floor_s -= floor_s[b];
    }
    if (!feasible) continue;
    Seconds time_s = 0;
    for (const ConcreteMicroBatch& micro_batch : candidate) time_s += micro_batch.makespan_s;
    if (best.empty() || time_s < best_time_s) {
      best = std::move(candidate);
      best_time_s = time_s;
    }
  }
  BALLAST_CHECK(!best.empty(), "one sequence per micro-batch is always feasible");
  for (ConcreteMicroBatch& micro_batch : best) {
    plan.micro_batches.push_back(place(costs, std::move(micro_batch), plan));
  }
  return plan;
}

PlannerParameter max_nodes_parameter(const char* what) {
  return {"max-nodes", fmt::format("{} branch-and-bound node budget per micro-batch (deterministic; "
                                   "FlexSP stopped SCIP after 10 s) [default: {}]",
                                   what, MilpOptions{}.max_nodes)};
}

PlannerParameter buckets_parameter() {
  return {"buckets", "initial bucket count Q of the MILP, raised while padding exceeds half the "
                     "free room, or 'exact' for the per-sequence MILP [default: 16]"};
}

void read_milp_parameters(const PlannerOptions& options, SolverChoice& choice) {
  choice.milp.max_nodes = static_cast<int>(
      integer_parameter_or(options, "max-nodes", choice.milp.max_nodes, 0, 100'000'000));
  const std::string buckets = parameter_or(options, "buckets", "16");
  if (buckets == "exact") {
    choice.buckets = 0;
  } else if (buckets.find_first_not_of("0123456789") != std::string::npos) {
    throw InputError(fmt::format("strategy parameter buckets={}: use an integer from 1 to 4096 "
                                 "or exact", buckets));
  } else {
    choice.buckets = static_cast<std::size_t>(integer_parameter_or(options, "buckets", 16, 1, 4096));
  }
}

/// The two planners differ only in their parameters and how a micro-batch is solved.
class FlexSpPlannerBase : public Planner {
 public:
  void check_options(const PlannerOptions& options) const override { choice_of(options); }
  /// Ulysses groups of any allowed degree (the degree is chosen per group).
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& /*options*/) const override {
    return max_sequence_tokens(cost, Scheme::ulysses);
  }
  bool solves_milp(const PlannerOptions& options) const override {
    const SolverChoice choice = choice_of(options);
    return choice.kind == SolverChoice::Kind::milp || choice.refine_with_milp;
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& /*evaluator: not needed*/) const override {
    return plan_flexsp(batch, cost, choice_of(options), name());
  }

 protected:
  /// Throws InputError naming a parameter with a value the planner cannot take.
  virtual SolverChoice choice_of(const PlannerOptions& options) const = 0;
};

class FlexSpPlanner final : public FlexSpPlannerBase {
 public:
  std::string name() const override { return "flexsp"; }
  std::string description() const override {
    return "FlexSP (faithful): heterogeneous power-of-two Ulysses groups per micro-batch from "
           "Sequence Blaster + bucketed MILP solved by CBC";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {max_nodes_parameter("MILP"), buckets_parameter()};
  }

 private:
  SolverChoice choice_of(const PlannerOptions& options) const override {
    SolverChoice choice;
    read_milp_parameters(options, choice);
    return choice;
  }
};

class FlexSpFastPlanner final : public FlexSpPlannerBase {
 public:
  std::string name() const override { return "flexsp-fast"; }
  std::string description() const override {
    return "FlexSP's group space without a solver: Sequence Blaster + a greedy / local-search "
           "planner per micro-batch (refine=milp adds the MILP)";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {{"refine", "none, or milp: also solve FlexSP's MILP per micro-batch and keep the "
                       "faster [default: none]"},
            max_nodes_parameter("with refine=milp, the MILP's"), buckets_parameter()};
  }

 private:
  SolverChoice choice_of(const PlannerOptions& options) const override {
    SolverChoice choice;
    choice.kind = SolverChoice::Kind::fast;
    const std::string refine = parameter_or(options, "refine", "none");
    if (refine != "none" && refine != "milp") {
      throw InputError(fmt::format("strategy parameter refine={}: use none or milp", refine));
    }
    choice.refine_with_milp = refine == "milp";
    read_milp_parameters(options, choice);
    return choice;
  }
};

}  // namespace

}  // namespace ballast::strategies::flexsp

namespace ballast::strategies {

std::unique_ptr<Planner> make_flexsp_planner() {
  return std::make_unique<flexsp::FlexSpPlanner>();
}
std::unique_ptr<Planner> make_flexsp_fast_planner() {
  return std::make_unique<flexsp::FlexSpFastPlanner>();
}

}  // namespace ballast::strategies
