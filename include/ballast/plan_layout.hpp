// Per-rank token layouts of a plan: which tokens of which sequences a rank holds during
// attention and during the linear modules, and the pieces the remap moves between the
// two. The one definition of packing order shared by the MPI runtime and the Python
// module (docs/python.md), so a data loader packs exactly what the engine expects.
// Also the one routing rule (Zeppelin's routing layer) that the simulator, the MPI
// runtime and validate() share: how many parts a hop is split into, which GPU carries
// each part, and which bytes each part holds.
#pragma once

#include <cstdint>
#include <vector>

#include "ballast/plan.hpp"
#include "ballast/units.hpp"

namespace ballast {

/// Tokens [begin_tokens, end_tokens) of one sequence, never empty, never padding.
struct TokenRange {
  std::int64_t sequence_id = 0;
  Tokens begin_tokens = 0;
  Tokens end_tokens = 0;
  int group = -1;  ///< index into the micro-batch's groups (attention layout); -1 otherwise
  Tokens size() const { return end_tokens - begin_tokens; }
};

/// What `rank` holds during attention in micro-batch `micro_batch`, in packing order: its
/// groups in its queue order (effective_queues), each group's sequences in plan order, each
/// sequence's chunks on this rank in plan order. Chunks are clipped to the sequence's
/// length (static CP's padding carries no tokens) and empty ones are dropped.
std::vector<TokenRange> attention_layout(const Plan& plan, int micro_batch, int rank);

/// What `rank` holds during the linear modules (embeddings, projections, MLP, loss): the
/// micro-batch's linear_layout slices of this rank in plan order when the plan remaps, else
/// attention_layout(). This is what a data loader packs for the rank.
std::vector<TokenRange> linear_layout(const Plan& plan, int micro_batch, int rank);

/// Tokens [begin_tokens, end_tokens) of a sequence that src_rank holds in the linear layout
/// and dst_rank needs in the attention layout.
struct LayoutTransfer {
  int src_rank = 0;
  int dst_rank = 0;
  std::int64_t sequence_id = 0;
  Tokens begin_tokens = 0;
  Tokens end_tokens = 0;
  Tokens size() const { return end_tokens - begin_tokens; }
};

/// Every piece the linear -> attention remap of a micro-batch moves, src_rank == dst_rank
/// included (tokens that stay), ordered by dst_rank and then by the destination's attention
/// packing order; so the pieces one src sends one dst are in the order dst places them.
/// A piece lies inside one attention range and is a maximal run of one source there.
/// The attention -> linear direction is the same list with the roles swapped. Without a
/// remap every piece stays on its rank. O((ranges + transfers) log ranges).
std::vector<LayoutTransfer> remap_transfers(const Plan& plan, int micro_batch);

/// How many parts a transfer from src_rank to dst_rank is split into by Zeppelin's routing
/// layer for a group with `routing_proxies`: 1 (direct, through the sender's own NIC) for
/// the same rank, the same node, or when min(routing_proxies, nics_per_node) <= 1; else
/// that minimum k, part t in [0, k) leaving through the NIC of routing_proxy(src_rank, t)
/// and arriving through that of routing_proxy(dst_rank, t). Only ring hops are routed.
int routing_parts(const Cluster& cluster, int routing_proxies, int src_rank, int dst_rank);

/// The GPU of rank's node whose NIC carries part `part` of a routed transfer: local index
/// (rank's local index + part * gpus_per_nic) mod gpus_per_node, so part 0 is the rank
/// itself and parts 1 .. nics_per_node - 1 sit on the node's other NICs. `part` in
/// [0, nics_per_node).
int routing_proxy(const Cluster& cluster, int rank, int part);

/// Elements [begin, end) of a routed transfer that one part carries.
struct PartRange {
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const { return end - begin; }
};

/// The split of `total` elements (bytes in the simulator, floats in the runtime) into
/// `parts`: share = ceil(total / parts), part t = [min(total, t * share),
/// min(total, (t + 1) * share)); the last parts are shorter or empty when parts does not
/// divide total. total >= 0, parts >= 1, part in [0, parts).
PartRange routed_part_range(std::int64_t total, int parts, int part);

}  // namespace ballast
