"""ballast.torch's attention schemes as planned: local, ring (zigzag chunks, K/V passed
around the ring), Ulysses (all-to-all to head sharding), USP (Ulysses inside stages around a
ring of the stages) and all-gather, each group of a
micro-batch in group-index order, forward and backward, as the C++ runtime runs them
(docs/runtime.md, "What runs"). ``attention(..., schemes="planned")`` calls it; import it
through ``ballast.torch`` (docs/python.md, "Attention schemes").

Shapes: a group's rows of this rank are q (rows, heads, head_dim), k and v
(rows, kv_heads, head_dim), in this rank's attention layout; a K/V block travels as
(rows, kv_heads, 2 head_dim), K and V side by side.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from ballast._torch_data import StepInfo
from ballast._torch_kernels import VarlenLayout, varlen_attention

SCHEMES = ("local", "ring", "ulysses", "all_gather", "usp")

# --------------------------------------------------------------------------------------
# Communication accounting
# --------------------------------------------------------------------------------------


class CommunicationStats:
    """Bytes this process sends in ``attention``, by scheme and pass.

    ``bytes_sent[(scheme, "forward" | "backward")]``: payload bytes of the messages this
    process sends to other processes (its part for itself is not counted; no headers).
    Pass the same object to every ``attention`` call to sum over layers and micro-batches,
    or a fresh one per call. The volumes per scheme are in docs/python.md
    ("Attention schemes").
    """

    def __init__(self) -> None:
        self.bytes_sent: Dict[Tuple[str, str], int] = {}

    def add(self, scheme: str, direction: str, tensor_bytes: int) -> None:
        key = (scheme, direction)
        self.bytes_sent[key] = self.bytes_sent.get(key, 0) + int(tensor_bytes)

    def total(self, scheme: Optional[str] = None, direction: Optional[str] = None) -> int:
        """Bytes sent, summed over the schemes / passes not named."""
        return sum(n for (s, d), n in self.bytes_sent.items()
                   if (scheme is None or s == scheme) and (direction is None or d == direction))

    def reset(self) -> None:
        self.bytes_sent.clear()

    def __repr__(self) -> str:
        return f"CommunicationStats({dict(sorted(self.bytes_sent.items()))})"


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


# --------------------------------------------------------------------------------------
# A group as its members hold it
# --------------------------------------------------------------------------------------

Chunk = Tuple[int, int, int, int]  # (sequence_id, begin, end, first row in the member's group rows)


@dataclasses.dataclass
class SchemeGroup:
    """One attention group of this rank, with every member's chunks (group-index order)."""

    index: int
    scheme: str
    ranks: Tuple[int, ...]            # sorted plan ranks: the process group's rank order
    process_ranks: Tuple[int, ...]    # the torch ranks that run them at my TP index
    member: int                       # my position in ranks
    rows: Tuple[int, int]             # my rows [begin, end) in my attention layout
    member_rows: List[int]            # each member's row count in this group
    member_chunks: List[List[Chunk]]  # each member's chunks, rows relative to its group rows
    ulysses_degree: int = 1           # usp: ranks per stage
    plan_order: Tuple[int, ...] = ()  # usp: the plan's rank list (stages: u consecutive ranks of it)

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def member_offsets(self) -> List[int]:
        """Where each member's rows start when the group's rows are stacked in member order."""
        offsets = [0]
        for rows in self.member_rows:
            offsets.append(offsets[-1] + rows)
        return offsets

    def stacked_positions(self) -> Dict[int, List[int]]:
        """Per sequence, the stacked row (member order) of each of its positions."""
        lengths: Dict[int, int] = {}
        for chunks in self.member_chunks:
            for s, _, e, _ in chunks:
                lengths[s] = max(lengths.get(s, 0), e)
        placed = {s: [-1] * n for s, n in lengths.items()}
        for offset, chunks in zip(self.member_offsets, self.member_chunks):
            for s, b, e, row in chunks:
                placed[s][b:e] = range(offset + row, offset + row + e - b)
        for s, rows in placed.items():
            if min(rows) < 0:
                raise RuntimeError(f"internal error (please report): sequence {s} not covered by group {self.index}")
        return placed


def scheme_schedule(info: StepInfo, micro_batch: int, rank: int, tensor_parallel_rank: int) -> List[SchemeGroup]:
    """Plan rank ``rank``'s groups of ``micro_batch`` in group-index order (cached)."""
    from ballast._torch_distributed import _group_rows, _member_ranges, _process_ranks

    def make() -> List[SchemeGroup]:
        groups = []
        for index, group in enumerate(info._micro_batches()[micro_batch].groups):
            if rank not in group.ranks:
                continue
            ranks = tuple(sorted(int(r) for r in group.ranks))
            member_rows, member_chunks = _member_ranges(info, micro_batch, index, ranks)
            first, last, _ = _group_rows(info._attention_layout(micro_batch, rank), index, rank)
            scheme = str(group.scheme) if len(ranks) > 1 else "local"
            if scheme not in SCHEMES:
                raise ValueError(f"group {index} of micro-batch {micro_batch} has scheme {scheme!r}; "
                                 f"ballast.torch runs {', '.join(SCHEMES)}")
            groups.append(SchemeGroup(index, scheme, ranks, _process_ranks(ranks, info.tensor_parallel,
                                                                            tensor_parallel_rank),
                                      ranks.index(rank), (first, last), member_rows, member_chunks,
                                      int(group.ulysses_degree), tuple(int(r) for r in group.ranks)))
        return groups

    return info._cached(("scheme_schedule", micro_batch, rank, tensor_parallel_rank), make)


# --------------------------------------------------------------------------------------
# Local: whole documents, no communication
# --------------------------------------------------------------------------------------


def _chunks_layout(chunks: List[Chunk]) -> VarlenLayout:
    """Each chunk over itself, causal, at its positions."""
    bounds = [0]
    for _, b, e, _ in chunks:
        bounds.append(bounds[-1] + e - b)
    offsets = [b for _, b, _, _ in chunks]
    return VarlenLayout(bounds, bounds, offsets, offsets)


def _local(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, scale: float,
           kernel: Any) -> torch.Tensor:
    chunks = group.member_chunks[group.member]
    if all(b == 0 for _, b, _, _ in chunks) and len({s for s, _, _, _ in chunks}) == len(chunks):
        return varlen_attention(q, k, v, _chunks_layout(chunks), softmax_scale=scale, kernel=kernel)
    # a sequence in several pieces on this one rank: each piece over the keys before it
    return _attend_chunks(q, torch.cat([k, v], dim=-1), group, scale, kernel)


def _attend_chunks(q: torch.Tensor, stacked: torch.Tensor, group: SchemeGroup, scale: float,
                   kernel: Any) -> torch.Tensor:
    """My chunks over the group's K/V rows stacked in member order (rows, kv_heads, 2 head_dim):
    chunk [b, e) of sequence s attends to keys [0, e) of s, one document per chunk."""
    head_dim = q.shape[-1]
    positions = group.stacked_positions()
    chunks = group.member_chunks[group.member]
    key_rows = [row for s, _, e, _ in chunks for row in positions[s][:e]]
    keys = stacked.index_select(0, torch.tensor(key_rows, dtype=torch.long, device=stacked.device))
    bounds_q, bounds_k = [0], [0]
    for _, b, e, _ in chunks:
        bounds_q.append(bounds_q[-1] + e - b)
        bounds_k.append(bounds_k[-1] + e)
    layout = VarlenLayout(bounds_q, bounds_k, [b for _, b, _, _ in chunks], [0] * len(chunks))
    return varlen_attention(q, keys[..., :head_dim], keys[..., head_dim:], layout, softmax_scale=scale,
                            kernel=kernel)


# --------------------------------------------------------------------------------------
# All-to-all with uneven splits, differentiable (the backward runs the reverse all-to-all)
# --------------------------------------------------------------------------------------


class _AllToAll(torch.autograd.Function):
    """x: 1-D, ``send[m]`` elements for member m in member order; returns 1-D, ``receive[m]``
    elements from member m. The backward sends the gradient back with the splits swapped."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, send: List[int], receive: List[int], member: int, process_group: Any,
                stats: Optional[CommunicationStats], scheme: str) -> torch.Tensor:  # type: ignore[override]
        ctx.args = (send, receive, member, process_group, stats, scheme)
        return _all_to_all(x, send, receive, member, process_group, stats, scheme, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        send, receive, member, process_group, stats, scheme = ctx.args
        return (_all_to_all(grad.contiguous(), receive, send, member, process_group, stats, scheme, "backward"),
                None, None, None, None, None, None)


def _all_to_all(x: torch.Tensor, send: List[int], receive: List[int], member: int, process_group: Any,
                stats: Optional[CommunicationStats], scheme: str, direction: str) -> torch.Tensor:
    out = x.new_empty(sum(receive))
    dist.all_to_all_single(out, x.contiguous(), output_split_sizes=list(receive), input_split_sizes=list(send),
                           group=process_group)
    if stats is not None:
        stats.add(scheme, direction, (sum(send) - send[member]) * x.element_size())
    return out


# --------------------------------------------------------------------------------------
# All-gather: every member's K/V to every member, dK/dV partials back to their owners
# --------------------------------------------------------------------------------------


def _all_gather(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, process_group: Any,
                scale: float, kernel: Any, stats: Optional[CommunicationStats]) -> torch.Tensor:
    kv = torch.cat([k, v], dim=-1)                             # (rows, kv_heads, 2 head_dim)
    row_elements = kv.shape[1] * kv.shape[2]
    send = [kv.shape[0] * row_elements] * group.size           # my block to every member
    receive = [rows * row_elements for rows in group.member_rows]
    stacked = _AllToAll.apply(kv.reshape(-1).repeat(group.size), send, receive, group.member, process_group,
                              stats, "all_gather").view(-1, kv.shape[1], kv.shape[2])
    return _attend_chunks(q, stacked, group, scale, kernel)


# --------------------------------------------------------------------------------------
# Ulysses: sequence sharding -> head sharding, attention over whole sequences, and back
# --------------------------------------------------------------------------------------


def ulysses_heads(heads: int, kv_heads: int, members: int) -> List[Tuple[int, int, int, int]]:
    """Member m's (first query head, end, first KV head, end): query heads
    [m H/g, (m+1) H/g) and the KV heads they read (GQA: query head h reads KV head
    h // (H / KV)), as the C++ runtime shards them. The rule is the plan's
    (``ulysses_degree_allowed``, docs/plan-format.md): g divides H and either divides KV
    (KV/g KV heads each) or is a multiple of it (each member's query heads read one KV head,
    held by g/KV members: replicated, its dK/dV summed back over them)."""
    if heads % members or heads % kv_heads or (kv_heads % members and members % kv_heads):
        raise ValueError(f"ulysses: a group of {members} ranks cannot shard {heads} query heads over {kv_heads} KV "
                         "heads: the group size must divide the query heads and either divide the KV heads or be a "
                         "multiple of them; plan with a group size the heads allow")
    per_member, repeat = heads // members, heads // kv_heads
    shards = []
    for m in range(members):
        first, end = m * per_member, (m + 1) * per_member
        shards.append((first, end, first // repeat, (end - 1) // repeat + 1))
    return shards


def _ulysses_parts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   shards: List[Tuple[int, int, int, int]]) -> List[torch.Tensor]:
    """To member j my rows of its q heads and of the KV heads they read, flattened (row-major
    (rows, heads, head_dim)). A KV head held by several members is sliced once per holder, so
    autograd sums the holders' dK, dV back onto it (the replicas' gradients reduce here)."""
    return [torch.cat([q[:, a:b], k[:, c:d], v[:, c:d]], dim=1).reshape(-1) for a, b, c, d in shards]


def _ulysses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, process_group: Any,
             scale: float, kernel: Any, stats: Optional[CommunicationStats], scheme: str = "ulysses",
             attend: Any = None) -> torch.Tensor:
    """``attend(q, k, v)`` (USP: the ring over the stages) replaces the attention over the
    group's whole sequences on the head-sharded rows (member order) when given."""
    rows, heads, head_dim = q.shape
    shards = ulysses_heads(heads, k.shape[1], group.size)
    me = group.member
    # sequence -> head sharding: to member j my rows of its q, k, v heads, row-major
    parts = _ulysses_parts(q, k, v, shards)
    widths = [(b - a + 2 * (d - c)) * head_dim for a, b, c, d in shards]
    a, b, c, d = shards[me]
    received = _AllToAll.apply(torch.cat(parts), [rows * w for w in widths],
                               [n * widths[me] for n in group.member_rows], me, process_group, stats, scheme)
    received = received.view(-1, b - a + 2 * (d - c), head_dim)          # (group rows, my heads, head_dim)
    q_heads, kv_heads = b - a, d - c
    if attend is not None:
        unpacked = attend(received[:, :q_heads], received[:, q_heads:q_heads + kv_heads],
                          received[:, q_heads + kv_heads:])
    else:
        # member order -> sequence order (each sequence whole, positions 0 ..)
        positions = group.stacked_positions()
        order = [row for s in sorted(positions) for row in positions[s]]
        bounds = [0]
        for s in sorted(positions):
            bounds.append(bounds[-1] + len(positions[s]))
        index = torch.tensor(order, dtype=torch.long, device=q.device)
        packed = received.index_select(0, index)
        out = varlen_attention(packed[:, :q_heads], packed[:, q_heads:q_heads + kv_heads],
                               packed[:, q_heads + kv_heads:], VarlenLayout.causal(bounds), softmax_scale=scale,
                               kernel=kernel)
        unpacked = torch.empty_like(out).index_copy(0, index, out)      # back to member order
    # head -> sequence sharding: member m's rows of my heads back to m
    back = _AllToAll.apply(unpacked.reshape(-1), [n * q_heads * head_dim for n in group.member_rows],
                           [rows * (sb - sa) * head_dim for sa, sb, _, _ in shards], me, process_group, stats,
                           scheme)
    pieces = back.split([rows * (sb - sa) * head_dim for sa, sb, _, _ in shards])
    return torch.cat([p.view(rows, sb - sa, head_dim) for p, (sa, sb, _, _) in zip(pieces, shards)], dim=1)


# --------------------------------------------------------------------------------------
# Ring: K/V blocks around the ring, partial results merged by log-sum-exp
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _BlockPairs:
    """My query chunks against one member's K/V block: the chunk pairs that see each other."""

    query_rows: torch.Tensor   # rows of my group rows, pair after pair
    key_rows: torch.Tensor     # rows of the block
    layout: VarlenLayout
    query_ranges: List[Tuple[int, int, int]]  # per pair: (first row in the pairs' output, my first row, rows)


def _pair_layout(query_chunks: List[Tuple[int, int]], key_chunks: List[Tuple[int, int]]) -> VarlenLayout:
    """One document per (query chunk, key chunk) pair, at their positions: query rows at
    positions [b, e) see key positions <= theirs."""
    bounds_q, bounds_k = [0], [0]
    for (bq, eq), (bk, ek) in zip(query_chunks, key_chunks):
        bounds_q.append(bounds_q[-1] + eq - bq)
        bounds_k.append(bounds_k[-1] + ek - bk)
    return VarlenLayout(bounds_q, bounds_k, [b for b, _ in query_chunks], [b for b, _ in key_chunks])


def _block_pairs(group: SchemeGroup, owner: int, device: torch.device) -> Optional[_BlockPairs]:
    query_rows: List[int] = []
    key_rows: List[int] = []
    query_chunks, key_chunks, ranges = [], [], []
    for s, bq, eq, row_q in group.member_chunks[group.member]:
        for t, bk, ek, row_k in group.member_chunks[owner]:
            if s != t or bk >= eq:  # another sequence, or every key after every query: skipped
                continue
            ranges.append((len(query_rows), row_q, eq - bq))
            query_rows += range(row_q, row_q + eq - bq)
            key_rows += range(row_k, row_k + ek - bk)
            query_chunks.append((bq, eq))
            key_chunks.append((bk, ek))
    if not ranges:
        return None
    as_index = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
    return _BlockPairs(as_index(query_rows), as_index(key_rows), _pair_layout(query_chunks, key_chunks), ranges)


def _exchange(sends: List[Tuple[torch.Tensor, int]], receives: List[Tuple[torch.Tensor, int]],
              process_group: Any) -> List[Any]:
    """Post sends then receives (each side posts its messages to a peer in the order the peer
    posts the matching ones); empty tensors are not sent (both sides know the sizes)."""
    operations = [dist.P2POp(dist.isend, t, peer, process_group) for t, peer in sends if t.numel()]
    operations += [dist.P2POp(dist.irecv, t, peer, process_group) for t, peer in receives if t.numel()]
    return dist.batch_isend_irecv(operations) if operations else []


def _wait(requests: List[Any]) -> None:
    for request in requests:
        request.wait()


class _RingAttention(torch.autograd.Function):
    """Forward: g steps; at step s this member holds member (me - s)'s K/V block, posts its
    send to the successor and the next block's receive from the predecessor, then computes
    its chunks against the block and merges (log-sum-exp). Backward: the blocks go around
    again; a block's dK/dV, summed by the members it visited, travel one step behind it
    and the last send takes them home (docs/runtime.md, "What runs")."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup,
                process_group: Any, scale: float, kernel: Any,
                stats: Optional[CommunicationStats], scheme: str) -> torch.Tensor:  # type: ignore[override]
        kv = torch.cat([k, v], dim=-1).contiguous()
        accumulation = torch.float64 if q.dtype == torch.float64 else torch.float32
        out = torch.zeros(q.shape, dtype=accumulation, device=q.device)
        lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=accumulation, device=q.device)
        head_dim = q.shape[-1]
        block = kv
        pairs_by_owner = [_block_pairs(group, owner, q.device) for owner in range(group.size)]
        for step, owner in _ring_steps(group):
            requests, incoming = [], None
            if step < group.size - 1:
                incoming = kv.new_empty((group.member_rows[(owner - 1) % group.size],) + tuple(kv.shape[1:]))
                requests = _exchange([(block, _successor(group))], [(incoming, _predecessor(group))], process_group)
                if stats is not None:
                    stats.add(scheme, "forward", _nbytes(block))
            pairs = pairs_by_owner[owner]
            if pairs is not None:
                keys = block.index_select(0, pairs.key_rows)
                part_out, part_lse = kernel.forward(q.index_select(0, pairs.query_rows), keys[..., :head_dim],
                                                    keys[..., head_dim:], pairs.layout, scale)
                for first, row, count in pairs.query_ranges:
                    merged_out, merged_lse = merge_attention_into(out[row:row + count], lse[:, row:row + count],
                                                                  part_out[first:first + count],
                                                                  part_lse[:, first:first + count])
                    out[row:row + count], lse[:, row:row + count] = merged_out, merged_lse
            _wait(requests)
            block = incoming
        out = out.to(q.dtype)
        lse = lse.float() if accumulation == torch.float32 else lse
        ctx.save_for_backward(q, kv, out, lse)
        ctx.args = (group, process_group, scale, kernel, stats, pairs_by_owner, scheme)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:  # type: ignore[override]
        q, kv, out, lse = ctx.saved_tensors
        group, process_group, scale, kernel, stats, pairs_by_owner, scheme = ctx.args
        grad_out = grad_out.contiguous()
        head_dim = q.shape[-1]
        accumulation = torch.float64 if q.dtype == torch.float64 else torch.float32
        grad_q = torch.zeros(q.shape, dtype=accumulation, device=q.device)
        block, finished = kv, None  # finished: the previous block's dK/dV, summed with mine
        for step, owner in _ring_steps(group):
            sends, receives, incoming, arriving = [], [], None, None
            if step < group.size - 1:
                incoming = kv.new_empty((group.member_rows[(owner - 1) % group.size],) + tuple(kv.shape[1:]))
                sends.append((block, _successor(group)))
                receives.append((incoming, _predecessor(group)))
            if step > 0:
                arriving = kv.new_empty(block.shape)  # this block's dK/dV from the members before me
                sends.append((finished, _successor(group)))
                receives.append((arriving, _predecessor(group)))
            requests = _exchange(sends, receives, process_group)
            if stats is not None:
                stats.add(scheme, "backward", sum(_nbytes(t) for t, _ in sends))
            mine = torch.zeros(block.shape, dtype=accumulation, device=kv.device)
            pairs = pairs_by_owner[owner]
            if pairs is not None:
                keys = block.index_select(0, pairs.key_rows)
                rows = pairs.query_rows
                dq, dk, dv = kernel.backward(q.index_select(0, rows), keys[..., :head_dim], keys[..., head_dim:],
                                             out.index_select(0, rows), lse.index_select(1, rows),
                                             grad_out.index_select(0, rows), pairs.layout, scale)
                grad_q.index_add_(0, rows, dq.to(accumulation))
                mine.index_add_(0, pairs.key_rows, torch.cat([dk, dv], dim=-1).to(accumulation))
            _wait(requests)
            finished = (mine if arriving is None else mine + arriving.to(accumulation)).to(kv.dtype)
            block = incoming
        grad_kv = _send_gradients_home(finished, kv, group, process_group, stats, scheme)
        return (grad_q.to(q.dtype), grad_kv[..., :head_dim], grad_kv[..., head_dim:], None, None, None, None, None,
                None)


def _send_gradients_home(finished: torch.Tensor, kv: torch.Tensor, group: SchemeGroup, process_group: Any,
                         stats: Optional[CommunicationStats], scheme: str) -> torch.Tensor:
    """The last backward step: my last block's dK/dV (of my successor's block, summed by every
    member) to its owner, mine from my predecessor."""
    home = kv.new_empty(kv.shape)
    _wait(_exchange([(finished, _successor(group))], [(home, _predecessor(group))], process_group))
    if stats is not None:
        stats.add(scheme, "backward", _nbytes(finished))
    return home


def merge_attention_into(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                         lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``merge_attention`` with b cast to a's dtypes (the accumulators')."""
    from ballast._torch_kernels import merge_attention
    return merge_attention(out_a, lse_a, out_b.to(out_a.dtype), lse_b.to(lse_a.dtype))


def _ring_steps(group: SchemeGroup) -> List[Tuple[int, int]]:
    """(step, owner of the block held at that step): my own block first, then my predecessor's..."""
    return [(step, (group.member - step) % group.size) for step in range(group.size)]


def _successor(group: SchemeGroup) -> int:
    return group.process_ranks[(group.member + 1) % group.size]


def _predecessor(group: SchemeGroup) -> int:
    return group.process_ranks[(group.member - 1) % group.size]


def _ring(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, process_group: Any,
          scale: float, kernel: Any, stats: Optional[CommunicationStats]) -> torch.Tensor:
    return _RingAttention.apply(q, k, v, group, process_group, scale, kernel, stats, "ring")


# --------------------------------------------------------------------------------------
# USP: Ulysses inside each stage, ring attention between the stages' members of the same heads
# --------------------------------------------------------------------------------------


def _usp_parts(group: SchemeGroup) -> Tuple[SchemeGroup, SchemeGroup]:
    """My stage as a Ulysses group (members by rank) and the ring of the stages' member m
    (my position in my stage): a ring member's rows are its whole stage's, stacked in the
    stage's member order as the all-to-all leaves them."""
    from ballast._torch_data import usp_rank_sets
    me = group.ranks[group.member]
    stages, rings = usp_rank_sets(group.plan_order, group.ulysses_degree)
    process_of = dict(zip(group.ranks, group.process_ranks))
    position = {r: i for i, r in enumerate(group.ranks)}

    def part(scheme: str, ranks: Tuple[int, ...], member_rows: List[int], member_chunks: List[List[Chunk]],
             member: int) -> SchemeGroup:
        return SchemeGroup(group.index, scheme, ranks, tuple(process_of[r] for r in ranks), member, group.rows,
                           member_rows, member_chunks)

    stage = next(s for s in stages if me in s)
    m = stage.index(me)
    stage_group = part("ulysses", stage, [group.member_rows[position[r]] for r in stage],
                       [group.member_chunks[position[r]] for r in stage], m)
    ring = rings[m]
    ring_rows, ring_chunks = [], []
    for peer in ring:
        peer_stage = next(s for s in stages if peer in s)
        offset, chunks = 0, []
        for r in peer_stage:
            chunks += [(sid, b, e, offset + row) for sid, b, e, row in group.member_chunks[position[r]]]
            offset += group.member_rows[position[r]]
        ring_rows.append(offset)
        ring_chunks.append(chunks)
    return stage_group, part("usp", ring, ring_rows, ring_chunks, ring.index(me))


def _usp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, process_groups: Any,
         scale: float, kernel: Any, stats: Optional[CommunicationStats]) -> torch.Tensor:
    stage, ring = _usp_parts(group)
    ring_group = process_groups.get(ring.process_ranks)
    attend = lambda q_, k_, v_: _RingAttention.apply(q_, k_, v_, ring, ring_group, scale, kernel,  # noqa: E731
                                                     stats, "usp")
    return _ulysses(q, k, v, stage, process_groups.get(stage.process_ranks), scale, kernel, stats, "usp", attend)


# --------------------------------------------------------------------------------------
# The micro-batch: every group in index order, forward and backward
# --------------------------------------------------------------------------------------


def _run_group(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: SchemeGroup, process_groups: Any,
               scale: float, kernel: Any, stats: Optional[CommunicationStats]) -> torch.Tensor:
    if group.scheme == "local":
        return _local(q, k, v, group, scale, kernel)
    if group.scheme == "usp":
        return _usp(q, k, v, group, process_groups, scale, kernel, stats)
    process_group = process_groups.get(group.process_ranks)
    run = {"ring": _ring, "ulysses": _ulysses, "all_gather": _all_gather}[group.scheme]
    return run(q, k, v, group, process_group, scale, kernel, stats)


class ScheduledAttention(torch.autograd.Function):
    """Each group's scheme in group-index order. The backward runs the groups' backward
    passes in the same order, one group at a time (torch.autograd.grad on the group's own
    graph): every member of two shared groups communicates in the same order, whatever
    order autograd would pick for independent branches."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: List[SchemeGroup],
                process_groups: Any, scale: float, kernel: Any,
                stats: Optional[CommunicationStats]) -> torch.Tensor:  # type: ignore[override]
        needs_grad = any(ctx.needs_input_grad[:3])
        graphs = []
        out = q.new_zeros(q.shape)
        covered = 0
        with torch.enable_grad() if needs_grad else torch.no_grad():
            for group in groups:
                first, last = group.rows
                leaves = [x[first:last].detach().requires_grad_(needs_grad) for x in (q, k, v)]
                group_out = _run_group(*leaves, group, process_groups, scale, kernel, stats)
                out[first:last] = group_out.detach()
                covered += last - first
                graphs.append((group_out, leaves))
        if covered != q.shape[0]:
            raise RuntimeError(f"internal error (please report): the groups cover {covered} of {q.shape[0]} rows")
        ctx.groups, ctx.graphs = groups, graphs if needs_grad else None
        ctx.shapes = (q.shape, k.shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:  # type: ignore[override]
        graphs, ctx.graphs = ctx.graphs, None
        q_shape, kv_shape = ctx.shapes
        grads = [grad_out.new_zeros(q_shape), grad_out.new_zeros(kv_shape), grad_out.new_zeros(kv_shape)]
        for group, (group_out, leaves) in zip(ctx.groups, graphs):
            first, last = group.rows
            if not group_out.requires_grad:
                continue
            found = torch.autograd.grad(group_out, leaves, grad_out[first:last], allow_unused=True)
            for grad, part in zip(grads, found):
                if part is not None:
                    grad[first:last] = part
        return grads[0], grads[1], grads[2], None, None, None, None, None
