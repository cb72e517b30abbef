// Shared building blocks of the strategies: plan skeletons, best-fit-decreasing and
// token-balanced packing, zigzag / contiguous chunking, per-scheme token capacities,
// degree selection and a cost-only time estimate. Internal to src/strategies (and its
// tests).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ballast/cost_model.hpp"
#include "ballast/plan.hpp"
#include "ballast/strategy.hpp"
#include "ballast/text.hpp"
#include "ballast/workload.hpp"

namespace ballast::strategies {

// ---- small helpers ----
bool is_power_of_two(std::int64_t value);
/// Smallest power of two >= value (value >= 1).
std::int64_t next_power_of_two(std::int64_t value);
/// Ranks first, first+1, ..., first+count-1.
std::vector<int> consecutive_ranks(int first_rank, int count);

/// Plan with cluster, model, cost spec, step and lengths filled and no micro-batches.
/// Throws InputError for an empty batch, a non-positive length or a batch over the limits
/// of limits.hpp (sequences, tokens, length), and PlanningError when the batch needs more
/// micro-batches than a plan may hold (kMaxMicroBatches, kMaxRankMicroBatches).
Plan make_plan_skeleton(const Batch& batch, const CostModel& cost, const std::string& strategy);

/// Throws PlanningError when a plan would hold more than kMaxPlanChunks attention chunks
/// (`chunks`, counted before the plan is built so that it never exhausts memory); `why`
/// says what makes so many, e.g. "every sequence is cut into 2 x 64 chunks".
void check_plan_chunks(std::int64_t chunks, const std::string& strategy, const std::string& why);

/// Throws PlanningError when a plan's ring groups would need more than kMaxRingSteps
/// simulated steps (`steps`: the sum of their sizes squared), before the plan is built.
void check_ring_steps(std::int64_t steps, const std::string& strategy, const std::string& why);

// ---- packing ----
struct PackItem {
  std::int64_t sequence_id = 0;
  Tokens size_tokens = 0;  ///< what the item occupies in a pack (padded length for CP)
};
/// Sequence ids of one pack, in insertion order.
using Pack = std::vector<std::int64_t>;

/// Best-fit decreasing: items sorted by size descending (ties: id ascending); each goes
/// to the open pack with the least remaining room that still fits (ties: lowest pack
/// index), or opens a new pack. Every item must fit an empty pack (checked).
std::vector<Pack> best_fit_decreasing(std::span<const PackItem> items, Tokens capacity_tokens);

/// Token-balanced packing for `groups` data-parallel groups (what the static strategies
/// use): every group gets an equal share of the batch's tokens, as real data loaders give
/// every data-parallel replica, instead of BFD's full packs that leave groups idle when a
/// batch needs fewer packs than groups.
///
/// Rounds R start at ceil(best_fit_decreasing pack count / groups). Items sorted by size
/// descending (ties: id ascending) each go to the pack (of R * groups, initially empty) with
/// the fewest tokens (ties: lowest pack index); since every pack has the same capacity that
/// is the pack with the most room, so if the item does not fit there it fits none: R += 1
/// and the packing restarts. This terminates: once R * groups >= items, every item gets an
/// empty pack of its own. Every item must fit an empty pack (checked). With one round, the
/// greedy (LPT on tokens) keeps max - min pack tokens <= the largest item.
///
/// Returns the non-empty packs (fewer items than packs leaves some empty: they are
/// dropped, so dealing them gives no group an empty pack), stably sorted by total size
/// descending, each pack's ids in insertion order (largest first); ready for
/// deal_packs_round_robin with G = groups (pack p -> micro-batch p / G, group p % G).
std::vector<Pack> balanced_packs(std::span<const PackItem> items, Tokens capacity_tokens,
                                 int groups);

/// First fit in the items' order (no sorting): each item goes to the first pack, in the
/// order packs were opened, with room for it, else opens a new pack; returns the packs in
/// that order. What a data loader that packs a batch in data order to a capacity does
/// (static-ulysses:packing=data-order, FlexSP's DeepSpeed-Ulysses baseline). O(n log n)
/// through a max-tree over the packs' room. Every item must fit an empty pack (checked).
std::vector<Pack> first_fit_in_order(std::span<const PackItem> items, Tokens capacity_tokens);

/// Sum of size_tokens over a pack, sizes indexed by sequence id.
Tokens pack_tokens(const Pack& pack, std::span<const Tokens> size_by_sequence_tokens);

/// Stable sort of packs by total size, descending.
void sort_packs_by_tokens_descending(std::vector<Pack>& packs,
                                     std::span<const Tokens> size_by_sequence_tokens);

/// Builds one attention group from a pack placed on `ranks`.
using GroupBuilder = std::function<AttentionGroup(const Pack& pack, const std::vector<int>& ranks)>;

/// Deals packs round-robin over the ranks()/degree groups of `degree` consecutive ranks:
/// pack p goes to micro-batch p / groups, group p % groups. Appends micro-batches to plan.
void deal_packs_round_robin(Plan& plan, const std::vector<Pack>& packs, int degree,
                            const GroupBuilder& build_group);

// ---- chunking ----
/// length rounded up to a multiple of 2 * ring_size (TE / Megatron CP padding).
Tokens zigzag_padded_length(Tokens length_tokens, int ring_size);
/// Zigzag over ring_ranks (g = size): [0, padded length) cut into 2g equal chunks; ring
/// member i takes chunks i and 2g-1-i. Chunks listed by member, chunk i first.
std::vector<Chunk> zigzag_chunks_padded(Tokens length_tokens, std::span<const int> ring_ranks);
/// Zigzag without padding: [0, length) cut into 2g chunks whose sizes differ by at most
/// one; the remainder tokens go to member 0, 1, ..., g-1 (first chunks), then again
/// (second chunks), so member totals also differ by at most one. Empty chunks omitted.
std::vector<Chunk> zigzag_chunks_unpadded(Tokens length_tokens, std::span<const int> ring_ranks);
/// [0, length) cut into ranks.size() contiguous ranges differing by at most one token,
/// the larger ones first. Empty chunks omitted.
std::vector<Chunk> contiguous_chunks(Tokens length_tokens, std::span<const int> ranks);
/// The group of one sequence on one rank: [0, length) on that rank.
SequenceChunks whole_sequence(std::int64_t sequence_id, Tokens length_tokens, int rank);

// ---- memory ----
/// The scheme a group of `degree` ranks really uses: degree 1 is always local.
Scheme scheme_at_degree(Scheme scheme, int degree);
/// Largest token count per rank that fits validate()'s memory check for a group of
/// `degree` ranks with this scheme (equal tokens on every member): memory limit - model
/// states >= activation * c + transient(c). 0 when nothing fits.
/// local: transient 0; ring: 2 * kv * c; all_gather: kv * degree * c; ulysses: qkv * c
/// (with KV heads replicated beyond k, ulysses_qkv_bytes_per_token() * c).
Tokens usable_tokens_per_rank(const CostModel& cost, Scheme scheme, int degree);
/// What a sequence occupies in a group: the zigzag-padded length for ring / all_gather
/// (degree > 1), else its length.
Tokens footprint_tokens(Tokens length_tokens, Scheme scheme, int degree);

// ---- degree selection ----
/// Powers of two dividing the rank count (ulysses: also dividing ulysses_kv_heads(), the KV
/// heads per GPU of a TP group), ascending. The baselines' cap as the published systems
/// run them (DeepSpeed-Ulysses, FlexSP: no KV replication); plan.hpp's
/// ulysses_degree_allowed() is the wider rule a plan may use.
std::vector<int> allowed_degrees(const CostModel& cost, Scheme scheme);
/// Whether a sequence fits one group of this degree.
bool fits_group(Tokens length_tokens, const CostModel& cost, Scheme scheme, int degree);
/// The smallest allowed degree whose groups hold the batch's longest sequence (the
/// per-step rule); throws PlanningError naming that sequence when none does.
int default_degree(const Batch& batch, const CostModel& cost, Scheme scheme,
                   const std::string& strategy);
/// The "degree" spec parameter of the static strategies (a number as --degree, or per-step).
PlannerParameter degree_parameter();
/// options.degree validated (divides the rank count; ulysses: divides ulysses_kv_heads(); else
/// InputError naming --degree and the valid values) and checked against the longest
/// sequence (PlanningError), or default_degree() (per step) without an override.
int resolve_degree(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                   Scheme scheme, const std::string& strategy);
/// The longest sequence any allowed degree can hold.
Tokens max_sequence_tokens(const CostModel& cost, Scheme scheme);
/// Planner::longest_sequence_tokens of a strategy with fixed groups of this scheme: with
/// options.degree, what one group of that degree holds (InputError naming --degree, as
/// resolve_degree, when the degree is not valid); without, max_sequence_tokens().
Tokens longest_sequence_tokens_at_degree(const CostModel& cost, const PlannerOptions& options,
                                         Scheme scheme, const std::string& strategy);

// ---- the static strategies' degree for a run ----
/// The smallest allowed degree whose groups hold a sequence of the run's context length;
/// InputError naming --max-context, why no larger degree exists and the fix when none does.
int context_degree(Tokens context_tokens, const CostModel& cost, Scheme scheme,
                   const std::string& strategy);
/// The degree static-cp, static-cp-allgather, static-ulysses and zeppelin:partition=even
/// plan `batch` at (docs/strategies.md, "Default degree"): options.degree when set, the
/// per-step rule (resolve_degree) with options.degree_per_step or without a context, else
/// context_degree(options.context_tokens), the same for every batch of the run; then a
/// batch whose longest sequence is longer than those groups hold is a PlanningError naming
/// it and --max-context.
int static_degree(const Batch& batch, const CostModel& cost, const PlannerOptions& options,
                  Scheme scheme, const std::string& strategy);
/// Planner::longest_sequence_tokens under static_degree()'s rule: what the degree the
/// options fix holds (longest_sequence_tokens_at_degree for a given degree, the per-step
/// rule or no context; what context_degree()'s groups hold otherwise, InputError as it).
Tokens static_longest_sequence_tokens(const CostModel& cost, const PlannerOptions& options,
                                      Scheme scheme, const std::string& strategy);

// ---- cost-only estimate ----
/// Step time of a plan from the cost model alone: per micro-batch per rank, overhead +
/// linear + attention + the communication it waits for (ring: overlapped with its
/// attention); micro-batch time = max over ranks; summed, plus the whole gradient sync
/// (as the simulator's GradientSync::end: the same for every plan of a batch, so
/// rankings do not depend on it).
Seconds estimate_plan_time_s(const Plan& plan, const CostModel& cost);

}  // namespace ballast::strategies
