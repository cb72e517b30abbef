// ballast: the best plan of a portfolio of the other strategies (and of seeds built from
// the winner's plan of all but the longest sequences), improved by a deterministic local
// search whose moves an incremental estimate screens and the caller's evaluator (the
// simulator) confirms (docs/strategies.md, "ballast").
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <tuple>

#include "ballast.hpp"
#include "ballast/error.hpp"
#include "builders.hpp"

namespace ballast::strategies {

namespace {

using namespace ballast_search;

constexpr const char* kName = "ballast";
constexpr Seconds kInfinity = std::numeric_limits<Seconds>::infinity();
/// Full simulations the search may spend on candidates (budget=N). Measured on the
/// scenarios of docs/strategies.md: beyond ~32 the search rarely finds more, and each
/// simulation at 64 GPUs / 512 sequences costs ~1 ms.
constexpr long long kDefaultBudgetSimulations = 32;
constexpr long long kMaxBudgetSimulations = 1'000'000;
/// Moves the estimate screens per simulation of the budget (the screening cap is this
/// times the budget): a round generates at most kMovesPerRound.
constexpr long long kScreenedMovesPerSimulation = 64;
constexpr std::size_t kMovesPerRound = 256;
/// Candidates a round simulates before it gives up on the current plan.
constexpr long long kSimulationsPerRound = 8;
/// The portfolio strategies exclude by default: flexsp solves a MILP (seconds per step).
constexpr const char* kSlowStrategies[] = {"flexsp"};

std::vector<std::string> split_portfolio(const std::string& text) {
  std::vector<std::string> names;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find('+', begin);
    names.push_back(text.substr(begin, end == std::string::npos ? end : end - begin));
    if (end == std::string::npos) return names;
    begin = end + 1;
  }
}

/// The portfolio's planners in order: the spec's portfolio=a+b+c, or every registered
/// strategy but ballast and kSlowStrategies. InputError for an unknown or repeated name.
std::vector<const Planner*> portfolio_of(const PlannerOptions& options) {
  std::vector<const Planner*> members;
  const auto given = options.parameters.find("portfolio");
  if (given == options.parameters.end()) {
    for (const auto& planner : planners()) {
      const std::string name = planner->name();
      if (name == kName || std::find(std::begin(kSlowStrategies), std::end(kSlowStrategies), name) !=
                               std::end(kSlowStrategies)) {
        continue;
      }
      members.push_back(planner.get());
    }
    return members;
  }
  for (const std::string& name : split_portfolio(given->second)) {
    if (name == kName) {
      throw InputError(fmt::format("{}:portfolio={}: {} cannot be in its own portfolio", kName,
                                   given->second, kName));
    }
    const Planner& planner = find_planner(name);  // InputError listing the known ones
    if (std::find(members.begin(), members.end(), &planner) != members.end()) {
      throw InputError(fmt::format("{}:portfolio={}: {} is named twice", kName, given->second, name));
    }
    members.push_back(&planner);
  }
  return members;
}

/// The caller's options without ballast's own parameters: each member plans by its own
/// rules (degree, context).
PlannerOptions member_options(const PlannerOptions& options) {
  PlannerOptions member = options;
  member.parameters.erase("portfolio");
  member.parameters.erase("budget");
  member.parameters.erase("ring_routing");
  return member;
}

long long budget_of(const PlannerOptions& options) {
  return integer_parameter_or(options, "budget", kDefaultBudgetSimulations, 0, kMaxBudgetSimulations);
}

/// ring_routing=auto: the rings over several nodes the seeds and moves build are routed
/// as zeppelin routes its own; off (the default) leaves them unrouted (docs/strategies.md,
/// "Routing the rings the search builds": on the 45 scenarios +0.11% for the geometric
/// mean of the steps, but every later candidate with a routed ring costs several times
/// as much to simulate, ~10x the planning time at 64 GPUs / 512 sequences).
bool ring_routing_of(const PlannerOptions& options) {
  const std::string value = parameter_or(options, "ring_routing", "off");
  if (value == "off") return false;
  if (value == "auto") return true;
  throw InputError(fmt::format("{}:ring_routing={}: use off or auto", kName, value));
}

/// The portfolio's best plan by the evaluator (ties: portfolio order); PlanningError naming
/// the batch's longest sequence and every member's reason when none plans. The members run
/// last to first (the later strategies of the registry are the more elaborate ones and
/// usually the faster), each plan simulated only as far as it can still win
/// (evaluate_below the best so far; a member listed earlier wins a tie), so the result is
/// the one of portfolio order.
Plan best_of_portfolio(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                       const PlanEvaluator& evaluator, PlanEvaluation& best_evaluation,
                       const Planner*& winner) {
  const PlannerOptions member = member_options(options);
  const std::vector<const Planner*> members = portfolio_of(options);
  // What a member simulated (zeppelin prices its candidates, the plan it returns among
  // them) is not simulated again here: the same steps and rank times, fewer simulations.
  const RememberingEvaluator remembering(evaluator, /*steps_too=*/true);
  std::optional<Plan> best;
  std::size_t best_index = 0;
  std::vector<std::string> reasons(members.size());
  // Last listed first, and those that simulate candidates (zeppelin) after the rest: each
  // plans below the best so far (Planner::plan_below), where their simulations stop.
  std::vector<std::size_t> order;
  for (const bool simulating : {false, true}) {
    for (std::size_t i = members.size(); i-- > 0;) {
      if (members[i]->simulates_candidates(member) == simulating) order.push_back(i);
    }
  }
  for (const std::size_t i : order) {
    const Planner* planner = members[i];
    // A tie goes to the member listed first: for one listed before the best, the bound lets
    // the best's own step through.
    const Seconds bound_s = !best              ? kInfinity
                            : i < best_index ? std::nextafter(best_evaluation.step_time_s, kInfinity)
                                             : best_evaluation.step_time_s;
    Plan plan;
    try {
      plan = planner->plan_below(batch, cost, member, remembering, bound_s);
    } catch (const PlanningError& error) {
      reasons[i] = fmt::format("{}: {}", planner->name(), error.what());
      continue;
    } catch (const InputError& error) {  // options this member cannot take (its degree rule)
      reasons[i] = fmt::format("{}: {}", planner->name(), error.what());
      continue;
    }
    require_valid(plan, cost, fmt::format("{} (ballast's portfolio)", planner->name()));
    PlanEvaluation evaluation = remembering.evaluate_below(plan, bound_s);
    if (evaluation.step_time_s >= bound_s) continue;
    best_evaluation = std::move(evaluation);
    best = std::move(plan);
    best_index = i;
    winner = planner;
  }
  if (!best) {
    const auto longest = std::max_element(batch.lengths_tokens.begin(), batch.lengths_tokens.end());
    throw PlanningError(fmt::format(
        "{}: no strategy of its portfolio can plan sequence {} ({} tokens) with this batch: {}",
        kName, longest - batch.lengths_tokens.begin(), with_thousands(*longest),
        fmt::join(reasons, "; ")));
  }
  best->strategy = kName;
  return std::move(*best);
}

/// Longest sequences a seed sets apart (k = 1 .. this many): up to 3 or 5 found nothing
/// more on the scenarios and cost 12% more planning (docs/strategies.md, "Seeds").
constexpr std::size_t kMaxSeedSequences = 2;

/// `rest`'s micro-batches with its sequence ids mapped to the batch's (`ids[i]` is rest's
/// sequence i).
std::vector<MicroBatch> renumbered(std::vector<MicroBatch> micro_batches, const std::vector<std::int64_t>& ids) {
  for (MicroBatch& micro_batch : micro_batches) {
    for (AttentionGroup& group : micro_batch.groups) {
      for (SequenceChunks& sequence : group.sequences) {
        sequence.sequence_id = ids[static_cast<std::size_t>(sequence.sequence_id)];
      }
    }
    for (LinearSlice& slice : micro_batch.linear_layout) {
      slice.sequence_id = ids[static_cast<std::size_t>(slice.sequence_id)];
    }
  }
  return micro_batches;
}

/// `group` added to `micro_batch` (run after its other groups; a remapped layout holds its
/// chunks where attention does).
void add_group(MicroBatch& micro_batch, AttentionGroup group) {
  const auto index = static_cast<int>(micro_batch.groups.size());
  if (!micro_batch.linear_layout.empty()) {
    for (const SequenceChunks& sequence : group.sequences) {
      for (const Chunk& chunk : sequence.chunks) {
        micro_batch.linear_layout.push_back({chunk.rank, sequence.sequence_id, chunk.begin_tokens, chunk.end_tokens});
      }
    }
  }
  if (!micro_batch.queues.empty()) {
    for (int rank : group.ranks) micro_batch.queues[static_cast<std::size_t>(rank)].push_back(index);
  }
  micro_batch.groups.push_back(std::move(group));
}

/// The seeds: for k = 1 .. kMaxSeedSequences, the batch's k longest sequences together
/// over every rank (the layout of whole_cluster_groups() the estimate finds fastest) and
/// the others planned by `winner` (the portfolio's best), the long group either in a
/// micro-batch of its own ahead of theirs or added to the one the estimate finds the
/// shortest. A long document that every strategy splits over a few ranks (FlexSP's
/// largest Ulysses group, Zeppelin's inter-node ring) can run faster on all of them while
/// the short ones pack as before. The fastest by the evaluator replaces `best` when it is
/// faster. `route_rings`: the whole-cluster ring is routed (ring_routing=auto).
bool try_seeds(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
               const PlanEvaluator& evaluator, const Planner& winner, bool route_rings, Plan& best,
               PlanEvaluation& best_evaluation) {
  const PlanEvaluator* ring_router = route_rings ? &evaluator : nullptr;
  bool found = false;
  const std::size_t count = batch.lengths_tokens.size();
  std::vector<std::int64_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return batch.lengths_tokens[static_cast<std::size_t>(a)] > batch.lengths_tokens[static_cast<std::size_t>(b)];
  });
  const PlannerOptions member = member_options(options);
  std::vector<Seconds> local_time_s;
  for (Tokens length : batch.lengths_tokens) local_time_s.push_back(local_sequence_time_s(cost, length));
  for (std::size_t k = 1; k <= kMaxSeedSequences && k < count; ++k) {
    std::vector<std::int64_t> long_ids(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
    std::vector<std::int64_t> rest_ids(order.begin() + static_cast<std::ptrdiff_t>(k), order.end());
    std::sort(long_ids.begin(), long_ids.end());
    std::sort(rest_ids.begin(), rest_ids.end());
    Plan seed = make_plan_skeleton(batch, cost, kName);
    std::optional<AttentionGroup> long_group;
    Seconds long_s = kInfinity;
    for (AttentionGroup& group : whole_cluster_groups(long_ids, seed, cost, ring_router)) {
      const GroupEstimate estimate = estimate_group(group, cost, evaluator);
      const Seconds time_s = *std::max_element(estimate.member_time_s.begin(), estimate.member_time_s.end());
      if (time_s < long_s) {
        long_s = time_s;
        long_group = std::move(group);
      }
    }
    // What the seed cannot beat by the estimate: the long group, then the rest spread
    // evenly. A seed that cannot beat the best by it is not planned (planning the rest
    // costs about what the winner's plan did).
    Seconds rest_s = 0;
    for (std::int64_t id : rest_ids) rest_s += local_time_s[static_cast<std::size_t>(id)];
    if (long_s + rest_s / cost.cluster().ranks() >= best_evaluation.step_time_s) continue;
    std::vector<Tokens> rest_lengths;
    for (std::int64_t id : rest_ids) rest_lengths.push_back(batch.lengths_tokens[static_cast<std::size_t>(id)]);
    Plan rest;
    try {
      rest = winner.plan(make_batch(std::move(rest_lengths), batch.step), cost, member, evaluator);
    } catch (const PlanningError&) {
      continue;
    } catch (const InputError&) {
      continue;
    }
    seed.micro_batches = renumbered(std::move(rest.micro_batches), rest_ids);
    const PlanEstimate rest_estimate = estimate_plan(seed, cost, evaluator);
    std::size_t shortest = 0;
    for (std::size_t m = 1; m < rest_estimate.micro_batches.size(); ++m) {
      if (rest_estimate.micro_batches[m].time_s < rest_estimate.micro_batches[shortest].time_s) shortest = m;
    }
    Plan own = seed;
    own.micro_batches.insert(own.micro_batches.begin(), MicroBatch{{*long_group}, {}, {}});
    Plan shared = std::move(seed);
    add_group(shared.micro_batches[shortest], std::move(*long_group));
    for (Plan* candidate : {&own, &shared}) {
      if (!validate(*candidate, cost).ok) continue;  // e.g. a rank out of memory
      const Seconds bound_s = best_evaluation.step_time_s;
      PlanEvaluation evaluation = evaluator.evaluate_below(*candidate, bound_s);
      if (evaluation.step_time_s >= bound_s) continue;
      best_evaluation = std::move(evaluation);
      best = std::move(*candidate);
      found = true;
    }
  }
  return found;
}

/// The ranks' times summed (what a move frees where it leaves the slowest rank alone).
Seconds rank_time_sum_s(const MicroBatchEstimate& estimate) {
  Seconds sum_s = 0;
  for (Seconds time_s : estimate.rank_time_s) sum_s += time_s;
  return sum_s;
}

/// Moves that trade work between micro-batches (level_step, re_deal), which the estimated
/// step (the micro-batches' slowest ranks summed) cannot see.
bool whole_step_kind(MoveKind kind) {
  return kind == MoveKind::level_step || kind == MoveKind::re_deal || kind == MoveKind::fill_last;
}

/// Sideways candidates a round simulates after kSimulationsPerRound found nothing faster.
constexpr long long kSidewaysPerRound = 4;
/// Relative step difference the estimate cannot tell apart (its per-plan error is far
/// larger: docs/strategies.md): candidates within it of the current step are sideways.
constexpr double kEstimateResolution = 0.005;

/// What a search phase takes for a rank's load (ballast.hpp, Loads).
const std::vector<Seconds>& rank_times(const PlanEvaluation& evaluation, Loads loads) {
  return loads == Loads::with_sync ? evaluation.rank_time_s : evaluation.rank_time_before_sync_s;
}

/// What the search may still spend: simulations and screened moves.
struct SearchBudget {
  long long simulations = 0;
  long long screens = 0;
};

/// A candidate's share of the rank time it must save to be accepted at an equal step.
constexpr double kSidewaysSavedShare = 1e-3;

/// Whether `candidate` is accepted over `current`: a faster step, or the same step with
/// its ranks' times summed lower by more than kSidewaysSavedShare (a sideways move: a
/// ring made cheaper off the critical path frees its members for the next move). The
/// order (step, then summed rank time) is strict, so the search cannot cycle.
bool better(const PlanEvaluation& candidate, const PlanEvaluation& current, Loads loads) {
  if (candidate.step_time_s != current.step_time_s) return candidate.step_time_s < current.step_time_s;
  const std::vector<Seconds>& candidate_times = rank_times(candidate, loads);
  const std::vector<Seconds>& current_times = rank_times(current, loads);
  if (candidate_times.empty() || current_times.empty()) return false;
  Seconds candidate_s = 0, current_s = 0;
  for (Seconds time_s : candidate_times) candidate_s += time_s;
  for (Seconds time_s : current_times) current_s += time_s;
  return candidate_s < (1 - kSidewaysSavedShare) * current_s;
}

/// Local search from `plan`: each round screens the moves by the incremental estimate,
/// anchored to the last simulation (rank_offsets(): what the estimate misses on a rank
/// stays missed unless a move changes the rank's work), and simulates the
/// kSimulationsPerRound the anchored estimate finds fastest (ties: generation order) until
/// one simulates faster than the current plan, then, if none did, up to kSidewaysPerRound
/// sideways ones until one is better() (accepted: the next round starts from it); a round
/// that accepts none ends the phase (the same plan would give the same moves). The
/// estimate only orders the candidates: it is too coarse (docs/strategies.md) to rule out
/// a move the simulator would accept. Each candidate is simulated only until its step
/// reaches what it must beat (evaluate_below); the rank times come with an accepted one.
/// One phase of the search: ranks' loads as `loads` says (and the moves it adds), spending
/// from `budget` (what is left goes to the next phase); `evaluation` is the plan's on entry
/// and the returned plan's on exit. `route_rings`: the moves route the rings they build
/// (ring_routing=auto).
Plan improve(Plan plan, PlanEvaluation& evaluation, const CostModel& cost, const PlanEvaluator& evaluator,
             Loads loads, SearchBudget& budget, bool route_rings) {
  long long& screens_left = budget.screens;
  long long& simulations_left = budget.simulations;
  PlanEstimate raw = estimate_plan(plan, cost, evaluator);
  RankOffsets offsets = rank_offsets(raw, rank_times(evaluation, loads));
  PlanEstimate estimate = anchored(raw, offsets);
  // A move may append a micro-batch (index == the plan's count): no offsets, no estimate.
  const auto offsets_of = [&](int m) -> const std::vector<Seconds>& {
    static const std::vector<Seconds> kNone;
    return static_cast<std::size_t>(m) >= offsets.size() ? kNone : offsets[static_cast<std::size_t>(m)];
  };
  while (simulations_left > 0 && screens_left > 0) {
    std::vector<Move> moves = generate_moves(
        plan, estimate, cost, static_cast<std::size_t>(std::min<long long>(screens_left, kMovesPerRound)),
        loads, route_rings ? &evaluator : nullptr);
    const Seconds current_s = estimate.step_time_s();
    // Per move: its anchored estimate of the step and of the summed rank time it frees.
    std::vector<Seconds> step_s(moves.size(), current_s);
    std::vector<Seconds> freed_s(moves.size(), 0);
    std::vector<std::vector<MicroBatchEstimate>> priced(moves.size());  // raw, per edit
    std::vector<std::size_t> by_step;  // the critical-path moves, by estimated step
    for (std::size_t i = 0; i < moves.size(); ++i) {
      for (const MicroBatchEdit& edit : moves[i].edits) {
        const auto m = static_cast<std::size_t>(edit.index);
        const bool appended = m >= raw.micro_batches.size();
        priced[i].push_back(estimate_edit(edit, cost, evaluator, appended ? nullptr : &raw.micro_batches[m]));
        const MicroBatchEstimate candidate = anchored(priced[i].back(), offsets_of(edit.index));
        step_s[i] += candidate.time_s - (appended ? 0.0 : estimate.micro_batches[m].time_s);
        freed_s[i] += (appended ? 0.0 : rank_time_sum_s(estimate.micro_batches[m])) - rank_time_sum_s(candidate);
      }
      if (!moves[i].off_critical_path && !whole_step_kind(moves[i].kind)) by_step.push_back(i);
    }
    screens_left -= static_cast<long long>(by_step.size());
    std::stable_sort(by_step.begin(), by_step.end(),
                     [&](std::size_t a, std::size_t b) { return step_s[a] < step_s[b]; });
    // Sideways candidates: an estimated step within kEstimateResolution of the current one,
    // freeing rank time; the most freed first.
    // Whole-step moves (whole_step_kind) trade work between micro-batches, which the
    // estimated step cannot see: first among the sideways ones, in generation order.
    std::vector<std::size_t> sideways, whole_steps;
    for (std::size_t i = 0; i < moves.size(); ++i) {
      if (whole_step_kind(moves[i].kind)) {
        whole_steps.push_back(i);
      } else if (freed_s[i] > 0 && step_s[i] <= (1 + kEstimateResolution) * current_s) {
        sideways.push_back(i);
      }
    }
    std::stable_sort(sideways.begin(), sideways.end(),
                     [&](std::size_t a, std::size_t b) { return freed_s[a] > freed_s[b]; });
    sideways.insert(sideways.begin(), whole_steps.begin(), whole_steps.end());
    std::vector<bool> tried(moves.size(), false);
    // Simulates up to `tries` of `order` not tried yet, each only until its step reaches
    // `bound_s` (no candidate that does is accepted); accepts the first that `accept`s.
    const auto try_moves = [&](const std::vector<std::size_t>& order, long long tries, Seconds bound_s,
                               const auto& accept) {
      for (const std::size_t i : order) {
        if (simulations_left == 0 || tries == 0) return false;
        if (tried[i]) continue;
        tried[i] = true;
        // The candidate: the plan with the move's micro-batches swapped in, the others not
        // copied (swapped back unless accepted); a copy when the move appends or empties
        // a micro-batch.
        std::vector<MicroBatch> swapped_out;
        std::optional<Plan> copied;
        if (!swap_in_move(plan, moves[i], swapped_out)) copied = apply_move(plan, moves[i]);
        const Plan& candidate = copied ? *copied : plan;
        const auto reject = [&] {
          if (!copied) swap_in_move_undo(plan, moves[i], swapped_out);
        };
        if (!validate(candidate, cost).ok) {  // e.g. a rank out of memory
          reject();
          continue;
        }
        --simulations_left;
        --tries;
        PlanEvaluation candidate_evaluation = evaluator.evaluate_below(candidate, bound_s);
        if (candidate_evaluation.step_time_s >= bound_s || !accept(candidate_evaluation)) {
          reject();
          continue;
        }
        if (candidate.micro_batches.size() != plan.micro_batches.size()) {
          raw = estimate_plan(candidate, cost, evaluator);  // a micro-batch emptied or appended
        } else {
          for (std::size_t e = 0; e < moves[i].edits.size(); ++e) {
            raw.micro_batches[static_cast<std::size_t>(moves[i].edits[e].index)] = std::move(priced[i][e]);
          }
        }
        if (copied) plan = std::move(*copied);
        evaluation = std::move(candidate_evaluation);
        offsets = rank_offsets(raw, rank_times(evaluation, loads));
        estimate = anchored(raw, offsets);
        return true;
      }
      return false;
    };
    // First the fastest by the estimate, accepted only when faster; only when none is, a
    // few sideways ones (so the search goes exactly as far as without them first).
    // A faster step is below the current one; a sideways move's is at most the current one.
    const Seconds current_step_s = evaluation.step_time_s;
    const bool accepted =
        try_moves(by_step, kSimulationsPerRound, current_step_s,
                  [&](const PlanEvaluation& candidate) { return candidate.step_time_s < current_step_s; }) ||
        try_moves(sideways, kSidewaysPerRound, std::nextafter(current_step_s, kInfinity),
                  [&](const PlanEvaluation& candidate) { return better(candidate, evaluation, loads); });
    if (!accepted) break;
  }
  return plan;
}

/// The phases of the local search from `plan` (whose evaluation is `evaluation`, on exit
/// the returned plan's): `budget` simulations for the first two together, half as many
/// more for the third (whole-step moves), and half as many again for the re-deals (every
/// local sequence dealt again by the whole step's loads) and, when one made the step
/// faster, the third phase's moves once more from there. The re-deals come after the
/// third phase, not among its moves: the first one accepted there would set the path
/// (greedy), and on magi-h200-gqa step 0 it led to 3.56 s where the level-steps alone
/// reach 3.42 s; after it they only add.
Plan search(Plan plan, PlanEvaluation& evaluation, const CostModel& cost, const PlanEvaluator& evaluator,
            long long budget, bool route_rings) {
  SearchBudget left{budget, kScreenedMovesPerSimulation * budget};
  plan = improve(std::move(plan), evaluation, cost, evaluator, Loads::with_sync, left, route_rings);
  plan = improve(std::move(plan), evaluation, cost, evaluator, Loads::before_sync, left, route_rings);
  // The third phase has its own budget, half the others': where the first two spent
  // theirs it would get nothing, and it is the one that moves work across micro-batches.
  SearchBudget whole_step{budget / 2, kScreenedMovesPerSimulation * (budget / 2)};
  plan = improve(std::move(plan), evaluation, cost, evaluator, Loads::whole_step, whole_step, route_rings);
  SearchBudget re_deal{budget / 2, kScreenedMovesPerSimulation * (budget / 2)};
  const Seconds settled_s = evaluation.step_time_s;
  plan = improve(std::move(plan), evaluation, cost, evaluator, Loads::re_deal, re_deal, route_rings);
  if (evaluation.step_time_s >= settled_s) return plan;
  return improve(std::move(plan), evaluation, cost, evaluator, Loads::whole_step, re_deal, route_rings);
}

class BallastPlanner final : public Planner {
 public:
  std::string name() const override { return kName; }
  std::string description() const override {
    return "the best plan of the other strategies (simulated) and of seeds that set the "
           "longest sequences apart over every rank, improved by a budgeted local search over "
           "groups, schemes and micro-batches";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {{"portfolio", "strategies to start from, joined by '+', e.g. "
                          "portfolio=flexsp-fast+zeppelin [default: every other registered "
                          "strategy but flexsp]"},
            {"budget", fmt::format("simulations the local search may spend (its third phase, "
                                   "across micro-batches, and its fourth, the re-deal, half "
                                   "as many more each; as many again from a seed that starts "
                                   "faster); 0 keeps the portfolio's best [default: {}]",
                                   kDefaultBudgetSimulations)},
            {"ring_routing", "off (default: the rings over several nodes that the seeds and "
                             "moves build are unrouted; the portfolio's keep their routing) or "
                             "auto (routed as zeppelin routes its inter-node rings; every later "
                             "candidate with a routed ring simulates several times slower)"}};
  }
  void check_options(const PlannerOptions& options) const override {
    portfolio_of(options);
    budget_of(options);
    ring_routing_of(options);
  }
  bool takes_common_degree(const PlannerOptions& /*options*/) const override { return false; }
  bool solves_milp(const PlannerOptions& options) const override {
    const PlannerOptions member = member_options(options);
    const auto members = portfolio_of(options);
    return std::any_of(members.begin(), members.end(),
                       [&](const Planner* planner) { return planner->solves_milp(member); });
  }
  /// The longest any member holds; a member whose options do not fit this cost model
  /// (InputError) is left out, and only when every member is does the error surface.
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    const PlannerOptions member = member_options(options);
    std::optional<Tokens> longest;
    std::optional<InputError> first_error;
    for (const Planner* planner : portfolio_of(options)) {
      try {
        const Tokens tokens = planner->longest_sequence_tokens(cost, member);
        longest = std::max(longest.value_or(0), tokens);
      } catch (const InputError& error) {
        if (!first_error) first_error = error;
      }
    }
    if (!longest) throw *first_error;
    return *longest;
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& evaluator) const override {
    make_plan_skeleton(batch, cost, kName);  // the input checks, before any member runs
    const EvaluationSession session(evaluator);  // the candidates share most groups
    PlanEvaluation evaluation;
    const Planner* winner = nullptr;
    Plan best = best_of_portfolio(batch, cost, options, evaluator, evaluation, winner);
    const long long budget = budget_of(options);
    if (budget == 0) return best;
    // The seeds' best, when it starts faster than the portfolio's, is searched from too:
    // the search from either may end faster (each keeps its own budget).
    Plan seed = best;
    PlanEvaluation seed_evaluation = evaluation;
    const bool route_rings = ring_routing_of(options);
    const bool seeded = try_seeds(batch, cost, options, evaluator, *winner, route_rings, seed, seed_evaluation);
    // The searches' candidates only: the portfolio's members simulate many plans once.
    const RememberingEvaluator remembering(evaluator);
    best = search(std::move(best), evaluation, cost, remembering, budget, route_rings);
    if (!seeded) return best;
    seed = search(std::move(seed), seed_evaluation, cost, remembering, budget, route_rings);
    return seed_evaluation.step_time_s < evaluation.step_time_s ? seed : best;
  }
};

}  // namespace

std::unique_ptr<Planner> make_ballast_planner() { return std::make_unique<BallastPlanner>(); }

}  // namespace ballast::strategies
