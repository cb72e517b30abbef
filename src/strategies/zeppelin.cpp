// zeppelin: the planner (zeppelin.hpp; docs/zeppelin.md). Candidate plans that differ in what
// the placement balances (zeppelin_placement.cpp), in routing and in whether linear modules
// are remapped are compared by the PlanEvaluator the caller hands the planner (the
// simulator), so a technique is kept only where the simulator says it pays.
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "ballast/error.hpp"
#include "builders.hpp"
#include "zeppelin.hpp"
#include "zeppelin_remap.hpp"

namespace ballast::strategies::zeppelin {

namespace {

/// Engine order: inter-node rings, intra-node rings, local; explicit queues; routing on
/// inter-node rings where it pays.
void finish_micro_batches(Plan& plan, const CostModel& cost, const PlanEvaluator& evaluator,
                          Switches::Mode routing) {
  const Cluster& cluster = cost.cluster();
  for (MicroBatch& micro_batch : plan.micro_batches) {
    auto tier_of = [&](const AttentionGroup& group) {
      if (group.ranks.size() == 1) return 2;
      return cluster.same_node(group.ranks.front(), group.ranks.back()) ? 1 : 0;
    };
    std::stable_sort(micro_batch.groups.begin(), micro_batch.groups.end(),
                     [&](const AttentionGroup& a, const AttentionGroup& b) {
                       return tier_of(a) < tier_of(b);
                     });
    micro_batch.queues.assign(static_cast<std::size_t>(cluster.ranks()), {});
    for (std::size_t g = 0; g < micro_batch.groups.size(); ++g) {
      AttentionGroup& group = micro_batch.groups[g];
      for (int rank : group.ranks) micro_batch.queues[static_cast<std::size_t>(rank)].push_back(static_cast<int>(g));
      if (tier_of(group) != 0 || routing == Switches::Mode::off) continue;
      Routing chosen = ring_routing(group, cost, evaluator);
      if (routing == Switches::Mode::on && chosen.proxies == 1 && cluster.nics_per_node > 1) {
        chosen = {cluster.nics_per_node, 4};
      }
      group.routing_proxies = chosen.proxies;
      group.routing_chunks = chosen.chunks;
    }
  }
}

/// Attaches the token-balanced layout to every micro-batch where it moves tokens and the
/// ranks' memory still fits (a rank with few attention tokens but a ring's buffers may not
/// take its full share of linear tokens).
Plan with_remap(Plan plan, const CostModel& cost) {
  for (MicroBatch& micro_batch : plan.micro_batches) {
    micro_batch.linear_layout = balanced_linear_layout(micro_batch, plan.cluster);
    if (remap_moves(micro_batch, micro_batch.linear_layout).empty()) {
      micro_batch.linear_layout.clear();
      continue;
    }
    const std::vector<Bytes> peak = peak_memory_bytes_per_rank(plan, cost);
    if (*std::max_element(peak.begin(), peak.end()) > cost.memory_limit_bytes()) {
      micro_batch.linear_layout.clear();
    }
  }
  return plan;
}

}  // namespace

namespace {

/// The unrouted twin of `plan` (every group on its own NICs), or nothing when no group of
/// `plan` is routed.
std::optional<Plan> unrouted_twin(const Plan& plan) {
  Plan direct = plan;
  bool routed = false;
  for (MicroBatch& micro_batch : direct.micro_batches) {
    for (AttentionGroup& group : micro_batch.groups) {
      routed = routed || group.routing_proxies > 1;
      group.routing_proxies = 1;
      group.routing_chunks = 1;
    }
  }
  if (!routed) return std::nullopt;
  return direct;
}

/// What plan_zeppelin already knows of each candidate it priced: the same micro-batches
/// (in one call the batch, cluster, model and cost model are the same; the micro-batches'
/// groups, chunks, routing, queues and layouts are what candidates differ in) validate and
/// simulate the same, so each distinct candidate is validated once and simulated at most as
/// far as needed, however many Fastest instances see it (stage 2 offers stage 1's winner
/// again; the placement kinds can build the same candidate).
class PricedCandidates {
 public:
  struct Price {
    bool valid = false;
    /// The step when `exact`; otherwise a lower bound of it (the simulation stopped there).
    Seconds step_s = 0;
    bool exact = false;
    std::string problem;  ///< the validation message when not valid
  };
  /// `cap_s`: every simulation stops there too (plan_zeppelin's cap; infinity: none).
  PricedCandidates(const CostModel& cost, const PlanEvaluator& evaluator, Seconds cap_s)
      : cost_(&cost), evaluator_(&evaluator), cap_s_(cap_s) {}
  /// The candidate's price: exact when its step is below `bound_s` and the cap; otherwise
  /// the step or a lower bound of it that is at least the smaller of the two (the
  /// simulation stops there: a Fastest keeps only a candidate faster than its best so far).
  const Price& price(const Plan& plan, Seconds bound_s) {
    bound_s = std::min(bound_s, cap_s_);
    Price* known = nullptr;
    for (auto& [micro_batches, price] : priced_) {
      if (micro_batches == plan.micro_batches) {
        known = &price;
        break;
      }
    }
    if (known == nullptr) {
      Price price;
      const ValidationResult validation = validate(plan, *cost_);
      price.valid = validation.ok;
      if (!validation.ok) price.problem = validation.message;
      priced_.emplace_back(plan.micro_batches, std::move(price));
      known = &priced_.back().second;
      if (!known->valid) return *known;
    } else if (!known->valid || known->exact || known->step_s >= bound_s) {
      return *known;
    }
    known->step_s = evaluator_->step_time_below_s(plan, bound_s);
    known->exact = known->step_s < bound_s;
    return *known;
  }

 private:
  const CostModel* cost_;
  const PlanEvaluator* evaluator_;
  Seconds cap_s_;
  std::vector<std::pair<std::vector<MicroBatch>, Price>> priced_;
};

/// Keeps the fastest valid plan by the evaluator; ties keep the one offered first.
class Fastest {
 public:
  explicit Fastest(PricedCandidates& priced) : priced_(&priced) {}
  /// Validates and prices `plan` (once per distinct candidate: see PricedCandidates);
  /// returns true when it became the fastest. A plan offered again loses: its step is the
  /// best's (a tie keeps the first) or was already no faster than a best that can only
  /// have improved since.
  bool offer(Plan plan) {
    const Seconds bound_s = best_ ? best_s_ : std::numeric_limits<Seconds>::infinity();
    const PricedCandidates::Price& price = priced_->price(plan, bound_s);
    if (!price.valid) {
      if (first_problem_.empty()) first_problem_ = price.problem;
      return false;
    }
    if (best_ && price.step_s >= best_s_) return false;
    best_s_ = price.step_s;
    best_ = std::move(plan);
    return true;
  }
  const std::optional<Plan>& best() const { return best_; }
  Seconds best_s() const { return best_s_; }
  const std::string& first_problem() const { return first_problem_; }

 private:
  PricedCandidates* priced_;
  std::optional<Plan> best_;
  Seconds best_s_ = 0;
  std::string first_problem_;
};

/// "3, 8-15, 20": ascending ranks with consecutive runs collapsed.
std::string rank_ranges(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

/// Issue 22: a GPU without attention work in a micro-batch is named in the plan's notes
/// with the reason, which is one of the placement's rules (docs/zeppelin.md, "Per-GPU
/// placement"): loads carry over between micro-batches, so the micro-batch's sequences went
/// to the GPUs with the least work so far, and doubling a ring or local sequence onto the
/// idle GPUs did not lower the larger load of the two blocks by the cost model; or the node-totals placement, which
/// leaves such GPUs, simulated faster on this batch.
void note_idle_gpus(Plan& plan, const std::string& reason) {
  const int ranks = plan.cluster.ranks();
  for (std::size_t m = 0; m < plan.micro_batches.size(); ++m) {
    std::vector<bool> busy(static_cast<std::size_t>(ranks), false);
    for (const AttentionGroup& group : plan.micro_batches[m].groups) {
      for (const SequenceChunks& sequence : group.sequences) {
        for (const Chunk& chunk : sequence.chunks) {
          if (chunk.size() > 0) busy[static_cast<std::size_t>(chunk.rank)] = true;
        }
      }
    }
    std::vector<int> idle;
    for (int r = 0; r < ranks; ++r) {
      if (!busy[static_cast<std::size_t>(r)]) idle.push_back(r);
    }
    if (idle.empty()) continue;
    plan.notes.push_back(fmt::format(
        "micro-batch {}: GPUs {} hold no attention work: {}", m, rank_ranges(idle), reason));
  }
}

}  // namespace

Routing ring_routing(const AttentionGroup& group, const CostModel& cost, const PlanEvaluator& evaluator) {
  const Cluster& cluster = cost.cluster();
  const std::size_t size = group.ranks.size();
  const auto off_node = [&](int rank) { return !cluster.same_node(rank, group.ranks.front()); };
  if (std::none_of(group.ranks.begin(), group.ranks.end(), off_node)) return {};
  // The first hop between nodes in ring order (zeppelin's rings are node-major and
  // consecutive, so theirs is the first crossing of a node boundary).
  std::size_t hop = 0;
  while (cluster.same_node(group.ranks[hop], group.ranks[(hop + 1) % size])) ++hop;
  Tokens most = 0;
  std::map<int, Tokens> held;
  for (const SequenceChunks& sequence : group.sequences) {
    for (const Chunk& chunk : sequence.chunks) most = std::max(most, held[chunk.rank] += chunk.size());
  }
  return choose_routing(cost, evaluator, cost.model().kv_bytes_per_token() * most, group.ranks[hop],
                        group.ranks[(hop + 1) % size]);
}

std::int64_t& uncapped_replan_count() {
  thread_local std::int64_t count = 0;
  return count;
}

Plan plan_zeppelin(const Batch& batch, const CostModel& cost, const PlanEvaluator& evaluator,
                   const Switches& switches, std::optional<int> even_degree,
                   const std::string& label, Seconds cap_s) {
  if (batch.lengths_tokens.empty()) return make_plan_skeleton(batch, cost, label);  // throws
  const EvaluationSession session(evaluator);  // the candidates share most groups
  // Placements (docs/zeppelin.md, "Choosing among candidates"): what the placement balances
  // (attention + linear, or attention only for a remapped plan) and the straggler rule.
  // Each placement kind's candidates (the per-GPU default also runs the node-totals
  // ones, so that it is never slower than the previous placement on any batch).
  std::vector<std::vector<Plan>> placements;
  if (switches.hierarchical) {
    TierContext context = make_tier_context(cost, evaluator, switches);
    const bool remap_allowed = switches.remap != Switches::Mode::off;
    std::vector<Switches::Placement> kinds = {switches.placement};
    if (switches.placement == Switches::Placement::per_gpu) {
      kinds.push_back(Switches::Placement::node_totals);
    }
    for (const Switches::Placement kind : kinds) {
      std::vector<Plan>& of_kind = placements.emplace_back();
      const auto add = [&](bool spread, bool balance_linear) {
        context.spread_stragglers = spread;
        of_kind.push_back(hierarchical_plan(batch, cost, context, balance_linear, kind, label));
      };
      add(false, true);
      add(true, true);
      if (remap_allowed) add(true, false);
    }
  } else {
    placements.emplace_back().push_back(even_plan(batch, cost, even_degree, label));
  }
  // Per placement kind, stage 1: each placement with the routing chosen per ring (remapped
  // first when the remap is forced on). Stage 2: the fastest one's unrouted twin (routing
  // is priced per isolated transfer; in a busy ring the proxies' NVLink ports also carry
  // their own ring hops), kept when not slower. Stage 3: the fastest with the remap, kept
  // when faster. The fastest over the kinds wins (ties: the kind listed first).
  const bool remap_only = switches.remap == Switches::Mode::on;
  std::optional<Plan> best;
  Seconds best_s = 0;
  std::size_t best_kind = 0;
  std::string first_problem;
  PricedCandidates priced(cost, evaluator, cap_s);
  const bool capped = cap_s < std::numeric_limits<Seconds>::infinity();
  for (std::size_t kind = 0; kind < placements.size(); ++kind) {
    std::vector<Plan>& of_kind = placements[kind];
    Fastest fastest(priced);
    for (Plan& plan : of_kind) {
      finish_micro_batches(plan, cost, evaluator, switches.routing);
      if (remap_only) plan = with_remap(std::move(plan), cost);
      fastest.offer(capped ? plan : std::move(plan));  // capped: kept for the check below
    }
    // Under a cap, a stage-1 winner at or past it was picked among stopped simulations, so
    // it need not be the one stages 2 and 3 would start from without the cap. Those stages
    // only derive plans from a stage-1 candidate (its unrouted twin, its remap, the twin's
    // remap): when none of every candidate's is below the cap either, this kind ends at or
    // past the cap with or without it (stages 2 and 3 are skipped); when one is, the plan
    // is made again without the cap.
    if (capped && fastest.best() && fastest.best_s() >= cap_s) {
      const auto below_cap = [&](const Plan& derived) {
        const PricedCandidates::Price& price = priced.price(derived, cap_s);
        return price.valid && price.step_s < cap_s;
      };
      const bool remap = switches.remap == Switches::Mode::auto_;
      for (const Plan& candidate : of_kind) {
        std::optional<Plan> twin;
        if (switches.routing == Switches::Mode::auto_) twin = unrouted_twin(candidate);
        if ((twin && below_cap(*twin)) || (remap && below_cap(with_remap(candidate, cost))) ||
            (twin && remap && below_cap(with_remap(*twin, cost)))) {
          ++uncapped_replan_count();
          return plan_zeppelin(batch, cost, evaluator, switches, even_degree, label);
        }
      }
      if (first_problem.empty()) first_problem = fastest.first_problem();
      if (!best) {
        best = fastest.best();
        best_s = fastest.best_s();
        best_kind = kind;
      }
      continue;
    }
    if (fastest.best() && switches.routing == Switches::Mode::auto_) {
      if (std::optional<Plan> direct = unrouted_twin(*fastest.best())) {
        Fastest twin_first(priced);
        twin_first.offer(std::move(*direct));
        twin_first.offer(*fastest.best());
        fastest = std::move(twin_first);
      }
    }
    if (fastest.best() && switches.remap == Switches::Mode::auto_) {
      fastest.offer(with_remap(*fastest.best(), cost));
    }
    if (first_problem.empty()) first_problem = fastest.first_problem();
    if (fastest.best() && (!best || fastest.best_s() < best_s)) {
      best = fastest.best();
      best_s = fastest.best_s();
      best_kind = kind;
    }
  }
  if (!best) throw InternalError(fmt::format("{} made no valid plan: {}", label, first_problem));
  if (switches.hierarchical) {
    const char* node_totals =
        "node totals are balanced first (a ring's work counted as its nodes'), then GPUs inside "
        "a node";
    note_idle_gpus(
        *best,
        switches.placement == Switches::Placement::node_totals
            ? fmt::format("placement=node-totals: {}", node_totals)
        : best_kind > 0
            ? fmt::format("the node-totals placement ({}) simulated faster than the per-GPU one "
                          "on this batch", node_totals)
            : std::string("loads carry over between micro-batches, so this micro-batch's "
                          "sequences went to the GPUs with the least work so far, and doubling "
                          "a neighbouring ring or local sequence onto these did not lower the "
                          "larger load of the two blocks by the cost model"));
  }
  return *std::move(best);
}

namespace {

Switches::Mode mode_of(const PlannerOptions& options, const std::string& key) {
  const std::string value = parameter_or(options, key, "auto");
  if (value == "auto") return Switches::Mode::auto_;
  if (value == "off") return Switches::Mode::off;
  if (value == "on") return Switches::Mode::on;
  throw InputError(fmt::format("strategy parameter {}={}: use auto, on or off", key, value));
}

Switches switches_of(const PlannerOptions& options) {
  Switches switches;
  const std::string partition = parameter_or(options, "partition", "hierarchical");
  if (partition != "hierarchical" && partition != "even") {
    throw InputError(fmt::format(
        "strategy parameter partition={}: use hierarchical (Zeppelin's tiers) or even (every "
        "sequence split over static rings, the ablation)",
        partition));
  }
  switches.hierarchical = partition == "hierarchical";
  switches.routing = mode_of(options, "routing");
  switches.remap = mode_of(options, "remap");
  const std::string placement = parameter_or(options, "placement", "per-gpu");
  if (placement != "per-gpu" && placement != "node-totals") {
    throw InputError(fmt::format(
        "strategy parameter placement={}: use per-gpu (balance each GPU's time) or node-totals "
        "(the previous approximation: node totals, then GPUs inside a node)",
        placement));
  }
  switches.placement = placement == "per-gpu" ? Switches::Placement::per_gpu
                                              : Switches::Placement::node_totals;
  if ((options.degree || options.degree_per_step) && switches.hierarchical) {
    throw InputError(fmt::format(
        "zeppelin takes a degree only with partition=even (the hierarchical partition picks "
        "each sequence's ring); drop {} / degree= or add partition=even",
        setting_name("--degree")));
  }
  return switches;
}

class ZeppelinPlanner final : public Planner {
 public:
  std::string name() const override { return "zeppelin"; }
  std::string description() const override {
    return "Zeppelin: sequences in the cheapest tier that hides their traffic (local / "
           "intra-node ring / inter-node ring), NIC routing, token-balanced remap";
  }
  std::vector<PlannerParameter> parameters() const override {
    return {{"partition", "hierarchical (default) or even: every sequence zigzag-split over "
                          "static rings of d GPUs (the ablation of the partitioning)"},
            {"routing", "auto (default: inter-node ring transfers over proxy GPUs' NICs where "
                        "it pays), on (always all NICs) or off"},
            {"remap", "auto (default: token-balanced linear layout where it pays), on or off"},
            {"placement", "per-gpu (default: balance each GPU's time, rings charging exactly "
                          "their members) or node-totals (the previous approximation: node "
                          "totals, then GPUs inside a node; for the ablation)"},
            {"degree", "ring size with partition=even, as static-cp's degree: a number or "
                       "per-step [default: the smallest power of two holding the run's "
                       "context, static-cp's]"}};
  }
  void check_options(const PlannerOptions& options) const override { switches_of(options); }
  /// --degree fixes the static rings of partition=even; the hierarchical partition picks
  /// each sequence's ring, so it ignores a degree given to every strategy.
  bool takes_common_degree(const PlannerOptions& options) const override {
    return parameter_or(options, "partition", "hierarchical") == "even";
  }
  /// Hierarchical: a ring over every GPU of the cluster, the ring budget per rank, no
  /// padding. Even: the static rings static-cp's degree rule gives (static-cp's limit).
  Tokens longest_sequence_tokens(const CostModel& cost,
                                 const PlannerOptions& options) const override {
    if (!switches_of(options).hierarchical) {
      return static_longest_sequence_tokens(cost, options, Scheme::ring, name());
    }
    return usable_tokens_per_rank(cost, Scheme::ring, 2) * cost.cluster().ranks();
  }
  Plan plan(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
            const PlanEvaluator& evaluator) const override {
    return plan_below(batch, cost, options, evaluator, std::numeric_limits<Seconds>::infinity());
  }
  /// Each candidate's simulation stops at the cap (plan_zeppelin).
  Plan plan_below(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                  const PlanEvaluator& evaluator, Seconds cap_s) const override {
    const Switches switches = switches_of(options);
    std::optional<int> even_degree;
    if (!switches.hierarchical) {  // TE CP's rings: static-cp's degree, fixed for the run
      make_plan_skeleton(batch, cost, name());  // input checks before degree selection
      even_degree = static_degree(batch, cost, options, Scheme::ring, name());
    }
    return plan_zeppelin(batch, cost, evaluator, switches, even_degree, name(), cap_s);
  }
  bool simulates_candidates(const PlannerOptions& /*options*/) const override { return true; }
};

}  // namespace

}  // namespace ballast::strategies::zeppelin

namespace ballast::strategies {
std::unique_ptr<Planner> make_zeppelin_planner() {
  return std::make_unique<zeppelin::ZeppelinPlanner>();
}
}  // namespace ballast::strategies
