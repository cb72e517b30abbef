// An adversary of the lower bound (docs/simulator.md section 7): every strategy's plans on
// random custom clusters, models and cost models, mutated (sequences moved, groups'
// schemes and sizes changed, sequences re-chunked, random linear layouts, micro-batches
// split, merged and reordered, routing and queues changed) by a search that keeps the
// mutations that bring the step closer to its bound. Every valid plan it simulates must
// take at least its bound; simulate() reports one that does not as an InternalError,
// which is a finding here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ballast::testing {

struct AdversaryOptions {
  std::uint64_t seed = 1;
  /// Valid plans to simulate in all (the starting plans included).
  std::int64_t simulations = 1000;
  /// Mutations tried from each starting plan before the next start.
  int mutations_per_start = 40;
  /// Findings' plans are written here as JSON (plan-<n>.json) when not empty.
  std::string findings_folder;
};

struct AdversaryResult {
  std::int64_t simulated = 0;         ///< valid plans simulated
  std::int64_t invalid = 0;           ///< mutated plans validate() rejected
  std::int64_t starts = 0;            ///< strategies' plans the searches began from
  std::int64_t starts_rejected = 0;   ///< settings or batches no plan came from
  double closest_ratio = 0;           ///< the least step / bound seen (>= 1 when sound)
  std::string closest;                ///< the setting of that plan, in words
  std::vector<std::string> findings;  ///< each plan below its bound, in words
};

AdversaryResult search_below_bounds(const AdversaryOptions& options);

}  // namespace ballast::testing
