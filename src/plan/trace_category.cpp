// group_category() (plan.hpp): the trace category of a group, one naming for the
// simulator's predicted and the runtime's measured timelines.
#include <algorithm>

#include "ballast/error.hpp"
#include "ballast/plan.hpp"

namespace ballast {

const char* group_category(const AttentionGroup& group, const Cluster& cluster) {
  BALLAST_CHECK(!group.ranks.empty(), "a group has at least one rank");
  const int first_node = cluster.node_of(group.ranks.front());
  const bool inter_node = std::any_of(group.ranks.begin(), group.ranks.end(),
                                      [&](int rank) { return cluster.node_of(rank) != first_node; });
  switch (group.ranks.size() == 1 ? Scheme::local : group.scheme) {
    case Scheme::local:
      return "local";
    case Scheme::ring:
      return inter_node ? "ring inter-node" : "ring intra-node";
    case Scheme::all_gather:
      return inter_node ? "all-gather inter-node" : "all-gather intra-node";
    case Scheme::ulysses:
      return inter_node ? "ulysses inter-node" : "ulysses intra-node";
    case Scheme::usp:
      return inter_node ? "usp inter-node" : "usp intra-node";
  }
  return "";
}

}  // namespace ballast
