// Zeppelin's remapping layer, the layout part (SYSTEMS.md section 3 item 3): attention
// places tokens to balance quadratic cost, so ranks hold unequal token counts; the linear
// modules (QKV/O projections, MLP) want equal tokens per rank. This computes a
// token-balanced linear layout reached by a minimum-cost transfer, and the per-pair
// volumes of that transfer (the all-to-allv the simulator charges, docs/simulator.md
// section 3). Internal to src/strategies (and its tests).
//
// Algorithm. Let have_r be rank r's attention tokens, T their sum, N = cluster.ranks(),
// G = gpus_per_node, q = T / N and e = T mod N. Every rank gets a target t_r in
// {q, q + 1}, exactly e of them q + 1; node targets are t_n = G q + e_n (e_n = the node's
// +1s). Cost is lexicographic: first the tokens crossing nodes, then all tokens moved.
//
// 1. Lower bounds. For any targets and any transfer, rank r sends at least
//    max(0, have_r - t_r) tokens and node n sends at least max(0, have_n - t_n) tokens
//    to other nodes, so total >= sum_r max(0, have_r - t_r) and
//    inter-node >= sum_n max(0, have_n - t_n).
// 2. Transfer (meets both bounds for any targets): inside each node, surplus ranks (rank
//    order) fill deficit ranks (rank order); after that a node has surplus ranks left or
//    deficit ranks left, never both, so the remaining surplus ranks (global rank order)
//    fill the remaining deficit ranks (global rank order) and every one of these moves
//    crosses nodes. Each token moves at most once (total = bound), and only a node's net
//    surplus have_n - t_n leaves it (inter-node = bound).
// 3. Targets (minimise the bounds lexicographically, i.e. inter * W + total with
//    W = T + 1). The objective is separable over nodes. Within a node, which ranks get
//    the node's e_n +1s does not change the inter-node term, and a +1 lowers the total
//    term by one exactly when it goes to a "useful" rank (have_r > q); so the node gives
//    them to its P_n useful ranks first. With S_n = have_n - G q, the node's k-th +1
//    then lowers the objective by W [k <= S_n] + [k <= P_n]: non-increasing in k, so the
//    node's cost is convex in e_n, and for a sum of convex separable terms under
//    sum e_n = e, taking the e largest marginal gains over all nodes is optimal (exchange
//    argument). The gains come in four tiers, taken in this order (nodes in index order,
//    ranks in rank order inside a tier; all choices within a tier are equally good):
//      A (W + 1): the first min(s_n, P_n) useful ranks, s_n = clamp(S_n, 0, G);
//      B (W):     s_n - min(s_n, P_n) of the other ranks (the node's surplus exceeds its
//                 useful ranks: the +1 keeps a token inside the node);
//      C (1):     the node's remaining useful ranks;
//      D (0):     every remaining rank.
// 4. Which tokens: a surplus rank keeps the first t_r tokens of its chunks ordered by
//    (sequence id, begin) and gives the rest away, in that order, in pieces cut at the
//    receivers' needs. A rank in no group holds 0 tokens and only receives. Everything is
//    in rank / sequence order: deterministic.
//
// Minimal volumes: total moved = sum_r max(0, have_r - t_r), inter-node moved =
// sum_n max(0, have_n - t_n). Cost: O(C log C + N) for C chunks (bucketing by rank, then
// sorting each rank's pieces).
#pragma once

#include <vector>

#include "ballast/cluster.hpp"
#include "ballast/plan.hpp"
#include "ballast/units.hpp"

namespace ballast::strategies {

/// Token-balanced layout for the linear modules of one micro-batch whose attention chunks
/// are `micro_batch.groups` (chunks cover [0, length) with no padding; assert it):
/// every rank of the cluster ends with floor(T/N) or floor(T/N)+1 tokens (T = the
/// micro-batch's tokens, N = cluster.ranks()), as a minimum-cost transfer: the fewest
/// tokens cross nodes, then the fewest tokens move at all. Returns the LinearSlice list
/// (sorted by rank, sequence, begin; adjacent slices of one rank and sequence merged).
///
/// A sequence's padded_length_tokens is taken as its length: the micro-batch must carry
/// no padding (padded_length_tokens == the plan's length). Checked (InternalError):
/// every chunk's rank in [0, N), begin < end, and each sequence's chunks cover
/// [0, padded_length_tokens) exactly once over all groups.
std::vector<LinearSlice> balanced_linear_layout(const MicroBatch& micro_batch,
                                                const Cluster& cluster);

/// Tokens each (src, dst) pair moves when switching from the attention chunks to `layout`
/// (the overlap of src's attention chunks with dst's slices, src != dst), sorted by (src, dst).
struct RemapMove {
  int src_rank;
  int dst_rank;
  Tokens tokens;
  friend bool operator==(const RemapMove&, const RemapMove&) = default;
};

/// Pairs with no overlap are omitted. Padding tokens of the attention chunks never move
/// (the layout has none). Checked (InternalError): each sequence's chunks are disjoint and
/// every slice's sequence is in the micro-batch.
std::vector<RemapMove> remap_moves(const MicroBatch& micro_batch,
                                   const std::vector<LinearSlice>& layout);

}  // namespace ballast::strategies
