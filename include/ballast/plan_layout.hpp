// Per-rank token layouts of a plan: which tokens of which sequences a rank holds during
// attention and during the linear modules, and the pieces the remap moves between the
// two. The one definition of packing order shared by the MPI runtime and the Python
// module (docs/python.md), so a data loader packs exactly what the engine expects.
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

}  // namespace ballast
