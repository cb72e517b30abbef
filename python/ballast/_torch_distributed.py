"""ballast.torch's distributed side: process groups, attention (the planned schemes of
_torch_schemes.py, or the all-gather reference), the remap
between layouts and the gradient sum. Import it through ``ballast.torch`` (docs/python.md)."""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

import ballast
from ballast._torch_data import PackedBatch, StepInfo
from ballast._torch_kernels import KernelChoice, VarlenLayout, get_attention_kernel, varlen_attention

# --------------------------------------------------------------------------------------
# Process groups
# --------------------------------------------------------------------------------------


def _process_ranks(plan_ranks: Iterable[int], tensor_parallel: int, tensor_parallel_rank: int) -> Tuple[int, ...]:
    """The torch ranks that run plan ranks ``plan_ranks`` as TP member ``tensor_parallel_rank``
    (TP groups are consecutive processes: plan rank g is processes g*N .. g*N+N-1)."""
    return tuple(int(r) * tensor_parallel + tensor_parallel_rank for r in plan_ranks)


def _tensor_parallel_of(source: Union[int, ballast.Plan, StepInfo, PackedBatch]) -> int:
    if isinstance(source, (ballast.Plan, StepInfo, PackedBatch)):
        return int(source.tensor_parallel)
    if isinstance(source, bool) or not isinstance(source, int) or source < 1:
        raise ValueError(f"tensor_parallel must be a positive int (the TP degree) or a Plan, StepInfo or "
                         f"PackedBatch; got {source!r}")
    return source


class ProcessGroups:
    """The ``torch.distributed`` process groups of a plan's multi-rank attention groups, cached.

    ``new_group`` is collective over the whole world: every rank must call ``ensure`` with
    the same plans in the same order (every rank plans the same batches, so this holds when
    each rank calls it once per global batch, or lets ``attention`` call it). Groups are
    keyed by their sorted tuple of torch ranks and kept across plans (every group made is
    kept): strategies whose groups are aligned power-of-two blocks of ranks (static CP,
    Ulysses, flexsp, hybrid-dp) use fewer than world_size distinct groups in all.

    Under tensor parallelism (a plan with ``tensor_parallel`` N > 1; docs/python.md) an
    attention group of plan ranks G runs as N process groups, one per TP index t, of the
    torch ranks ``g * N + t`` for g in G: ``ensure`` makes all N. ``tensor_parallel_group``
    and ``data_parallel_group`` give the groups a Megatron-style model and the gradient
    sum need.

    Args:
        backend: the backend of new groups (default: the world's).
    """

    def __init__(self, backend: Optional[str] = None) -> None:
        self.backend = backend
        self._groups: Dict[Tuple[int, ...], Any] = {}

    def ensure(self, plan: Union[ballast.Plan, StepInfo]) -> None:
        """Create (collectively, in sorted order) the groups of ``plan`` not created yet."""
        info = plan if isinstance(plan, StepInfo) else StepInfo(plan, [], 0, 0)
        tensor_parallel = info.tensor_parallel
        wanted = [_process_ranks(ranks, tensor_parallel, t)
                  for ranks in info.group_rank_sets() for t in range(tensor_parallel)]
        missing = [ranks for ranks in wanted if ranks not in self._groups]
        if not missing:
            return
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError(f"the plan has attention groups over several ranks {missing}: call "
                               "torch.distributed.init_process_group first")
        _check_world(info.plan)
        for ranks in missing:
            self._groups[ranks] = dist.new_group(list(ranks), backend=self.backend)

    def _ensure_partition(self, blocks: List[Tuple[int, ...]]) -> Any:
        """Create (collectively, in order) the groups of ``blocks`` not created yet; return the
        one holding this process."""
        for ranks in blocks:
            if ranks not in self._groups:
                self._groups[ranks] = dist.new_group(list(ranks), backend=self.backend)
        me = dist.get_rank()
        return next(self._groups[ranks] for ranks in blocks if me in ranks)

    def tensor_parallel_group(self, tensor_parallel: Union[int, ballast.Plan, StepInfo, PackedBatch]) -> Any:
        """This process's TP group: the N consecutive ranks ``g * N .. g * N + N - 1`` that
        run plan rank g = rank // N (for a Megatron-style model's all-gather / reduce-scatter
        / all-reduce over its TP group). Collective the first time: every rank calls it with
        the same N (an int, or a Plan, StepInfo or PackedBatch whose ``tensor_parallel`` it
        reads); it makes every TP group of the world."""
        n = _tensor_parallel_of(tensor_parallel)
        world = _world_size_for(n)
        return self._ensure_partition([tuple(range(g * n, g * n + n)) for g in range(world // n)])

    def data_parallel_group(self, tensor_parallel: Union[int, ballast.Plan, StepInfo, PackedBatch]) -> Any:
        """The group over which gradients are summed under tensor parallelism: the ranks
        with this process's TP index t = rank % N, one per plan rank (``g * N + t``). None
        (the default group, the whole world) for N = 1, which ``all_reduce_gradients`` and
        ``torch.distributed`` collectives take as the world. Collective the first time, as
        ``tensor_parallel_group``."""
        n = _tensor_parallel_of(tensor_parallel)
        world = _world_size_for(n)
        if n == 1:
            return None
        return self._ensure_partition([tuple(range(t, world, n)) for t in range(n)])

    def get(self, ranks: Sequence[int]) -> Any:
        """The process group of these torch ranks (any order); ``ensure`` must have created it.
        Under tensor parallelism the torch ranks of plan ranks G for TP index t are
        ``g * N + t`` (``plan_group``)."""
        key = tuple(sorted(int(r) for r in ranks))
        try:
            return self._groups[key]
        except KeyError:
            raise KeyError(f"no process group for ranks {list(key)}: call groups.ensure(plan) on every rank "
                           "before using the plan") from None

    def plan_group(self, plan_ranks: Sequence[int], batch: PackedBatch) -> Any:
        """The process group that runs plan ranks ``plan_ranks`` for ``batch``'s TP index:
        torch ranks ``g * N + batch.tensor_parallel_rank`` (``get`` of those)."""
        return self.get(_process_ranks(plan_ranks, batch.tensor_parallel, batch.tensor_parallel_rank))

    def __contains__(self, ranks: Sequence[int]) -> bool:
        return tuple(sorted(int(r) for r in ranks)) in self._groups

    def __len__(self) -> int:
        return len(self._groups)

    def __repr__(self) -> str:
        return f"ProcessGroups({sorted(self._groups)})"


def _world_size_for(tensor_parallel: int) -> int:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("tensor-parallel process groups: call torch.distributed.init_process_group first")
    world = dist.get_world_size()
    if world % tensor_parallel:
        raise ValueError(f"tensor_parallel {tensor_parallel} does not divide the world of {world} processes: "
                         "launch N processes per plan rank (plan.gpus in all)")
    return world


def _check_world(plan: ballast.Plan) -> None:
    """The world must have plan.gpus processes: one per GPU, N = plan.tensor_parallel per plan rank."""
    world = dist.get_world_size()
    if world != plan.gpus:
        tensor_parallel = (f" ({plan.ranks} plan ranks x tensor_parallel {plan.tensor_parallel})"
                           if plan.tensor_parallel > 1 else "")
        raise ValueError(f"the plan is for {plan.gpus} processes{tensor_parallel} but the process group has "
                         f"{world}: launch {plan.gpus} processes, or plan for the {world} you run")


# --------------------------------------------------------------------------------------
# Attention (reference) in the attention layout
# --------------------------------------------------------------------------------------


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3:
        raise ValueError(f"q, k, v must be [tokens, heads, head_dim]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: k and v must match, share "
                         "q's tokens and head_dim, and q's heads must be a multiple of k's (GQA)")


def local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, *,
                    softmax_scale: Optional[float] = None, kernel: Optional[KernelChoice] = None) -> torch.Tensor:
    """Causal attention inside each document of a packed batch (single process).

    Args:
        q: (T, heads, head_dim); k, v: (T, kv_heads, head_dim), heads a multiple of kv_heads.
        cu_seqlens: document boundaries (T_0 = 0 ... T), as ``PackedBatch.cu_seqlens``.
        softmax_scale: default ``head_dim ** -0.5``.
        kernel: the attention kernel (None: ``set_attention_kernel``'s, the blocked one by
            default; docs/python.md, "Attention kernels").

    Returns:
        (T, heads, head_dim). The reference the distributed ``attention`` matches.
    """
    _check_qkv(q, k, v)
    return varlen_attention(q, k, v, VarlenLayout.causal(cu_seqlens), softmax_scale=softmax_scale, kernel=kernel)


@dataclasses.dataclass
class _GroupWork:
    """One attention group of this rank, in the order every member agrees on (group index)."""

    index: int
    ranks: Tuple[int, ...]           # sorted plan ranks: the process group's rank order
    process_ranks: Tuple[int, ...]   # the torch ranks that run them at my TP index
    member: int                      # my position in ranks
    rows: Tuple[int, int]            # my rows [begin, end) in my attention layout
    member_rows: List[int]           # each member's row count in this group
    # per sequence: (length, full-sequence index into the gathered rows (member * max_rows + row))
    sequences: Dict[int, Tuple[int, torch.Tensor]]
    # my chunks: (sequence_id, begin, end, row in my attention layout)
    chunks: List[Tuple[int, int, int, int]]


def _group_rows(layout: List[Tuple[int, int, int, int]], group: int, rank: int) -> Tuple[int, int, List[Tuple[int, int, int, int]]]:
    """Rows [first, last) of a group's ranges in a rank's attention layout (contiguous) and the ranges."""
    row = 0
    first, last, ranges = -1, -1, []
    for sequence, begin, end, g in layout:
        if g == group:
            if first < 0:
                first = row
            elif last != row:
                raise RuntimeError(f"internal error (please report): group {group}'s ranges are not contiguous "
                                   f"in rank {rank}'s attention layout")
            ranges.append((sequence, begin, end, row))
            last = row + end - begin
        row += end - begin
    return (max(first, 0), max(last, 0), ranges)


def _member_ranges(info: StepInfo, micro_batch: int, group: int,
                   ranks: Tuple[int, ...]) -> Tuple[List[int], List[List[Tuple[int, int, int, int]]]]:
    """Each member's row count in group ``group`` and its ranges (sequence, begin, end, row
    from the member's first row of the group), members in ``ranks`` order."""
    member_rows, member_ranges = [], []
    for r in ranks:
        first, last, ranges = _group_rows(info._attention_layout(micro_batch, r), group, r)
        member_rows.append(last - first)
        member_ranges.append([(s, b, e, row - first) for s, b, e, row in ranges])
    return member_rows, member_ranges


def _attention_schedule(info: StepInfo, micro_batch: int, rank: int, tensor_parallel_rank: int,
                        device: torch.device) -> List[_GroupWork]:
    """Plan rank's groups in index order, their gather indices on ``device`` (the data's),
    with the torch ranks of TP index ``tensor_parallel_rank``."""
    def make() -> List[_GroupWork]:
        lengths = info.plan.lengths
        works = []
        for index, group in enumerate(info._micro_batches()[micro_batch].groups):
            if rank not in group.ranks:
                continue
            ranks = tuple(sorted(int(r) for r in group.ranks))
            member_rows, member_ranges = _member_ranges(info, micro_batch, index, ranks)
            max_rows = max(member_rows)
            placed: Dict[int, np.ndarray] = {}
            for m, ranges in enumerate(member_ranges):
                for s, b, e, row in ranges:
                    full = placed.setdefault(s, np.full(int(lengths[s]), -1, dtype=np.int64))
                    if (full[b:e] >= 0).any():
                        raise RuntimeError(f"internal error (please report): tokens of sequence {s} held twice in group {index}")
                    full[b:e] = m * max_rows + row + np.arange(e - b)
            sequences = {}
            for s, full in placed.items():
                if (full < 0).any():
                    raise RuntimeError(f"internal error (please report): sequence {s} not covered by group {index}")
                sequences[s] = (len(full), torch.as_tensor(full, dtype=torch.long, device=device))
            first, last, mine = _group_rows(info._attention_layout(micro_batch, rank), index, rank)
            process_ranks = _process_ranks(ranks, info.tensor_parallel, tensor_parallel_rank)
            works.append(_GroupWork(index, ranks, process_ranks, ranks.index(rank), (first, last), member_rows,
                                    sequences, mine))
        return works

    return info._cached(("attention_schedule", micro_batch, rank, tensor_parallel_rank, str(device)), make)


def _group_outputs(q: torch.Tensor, gathered: List[torch.Tensor], works: List[_GroupWork], head_dim: int,
                   scale: float, kernel: Any) -> List[Tuple[int, torch.Tensor]]:
    """Attention of my chunks: (row, output) pairs. gathered[i]: (members, max_rows, kv_heads, 2 head_dim)."""
    outputs = []
    for work, kv in zip(works, gathered):
        flat = kv.reshape(-1, kv.shape[-2], kv.shape[-1])
        full_kv: Dict[int, torch.Tensor] = {}
        for sequence, begin, end, row in work.chunks:
            if sequence not in full_kv:
                full_kv[sequence] = flat.index_select(0, work.sequences[sequence][1])
            keys = full_kv[sequence][:end]  # positions [0, end); my queries sit at [begin, end)
            layout = VarlenLayout.single(end - begin, end, query_offset=begin, key_offset=0)
            outputs.append((row, varlen_attention(q[row:row + end - begin], keys[..., :head_dim],
                                                  keys[..., head_dim:], layout, softmax_scale=scale, kernel=kernel)))
    return outputs


def _gather(kv: torch.Tensor, works: List[_GroupWork], groups: Optional[ProcessGroups]) -> List[torch.Tensor]:
    """Each group's K|V rows of every member, padded to the largest member: (members, max_rows, kv_heads, 2d)."""
    gathered = []
    for work in works:
        mine = kv[work.rows[0]:work.rows[1]]
        max_rows = max(work.member_rows)
        if len(work.ranks) == 1:
            gathered.append(mine.unsqueeze(0))
            continue
        padded = kv.new_zeros((max_rows,) + tuple(kv.shape[1:]))
        padded[:mine.shape[0]] = mine
        parts = [torch.empty_like(padded) for _ in work.ranks]
        dist.all_gather(parts, padded, group=groups.get(work.process_ranks))  # type: ignore[union-attr]
        gathered.append(torch.stack(parts))
    return gathered


class _PlannedAttention(torch.autograd.Function):
    """Forward: gather each split group's K/V, causal attention of my chunks. Backward: the
    local gradient, then the gathered K/V gradients all-reduced (sum) over each group, of
    which my rows are mine: the adjoint of the all-gather. Communication runs in group-index
    order on every rank, so ranks sharing several groups never wait on each other in a cycle."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, works: List[_GroupWork],
                groups: Optional[ProcessGroups], scale: float, kernel: Any) -> torch.Tensor:  # type: ignore[override]
        head_dim = q.shape[-1]
        gathered = _gather(torch.cat([k, v], dim=-1), works, groups)
        needs_grad = any(ctx.needs_input_grad[:3])
        with torch.enable_grad() if needs_grad else torch.no_grad():
            q_leaf = q.detach().requires_grad_(needs_grad)
            kv_leaves = [g.detach().requires_grad_(needs_grad) for g in gathered]
            pieces = _group_outputs(q_leaf, kv_leaves, works, head_dim, scale, kernel)
            pieces.sort(key=lambda p: p[0])
            out = torch.cat([p[1] for p in pieces]) if pieces else q.new_zeros(q.shape)
        if out.shape != q.shape:
            raise RuntimeError(f"internal error (please report): attention produced {tuple(out.shape)} for q {tuple(q.shape)}")
        ctx.works, ctx.groups, ctx.kv_shape = works, groups, k.shape
        ctx.graph = (out, q_leaf, kv_leaves) if needs_grad else None
        return out.detach()

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:  # type: ignore[override]
        out, q_leaf, kv_leaves = ctx.graph
        ctx.graph = None
        if out.requires_grad:
            grads = torch.autograd.grad(out, [q_leaf] + kv_leaves, grad_out, allow_unused=True)
        else:  # no token of mine in any group
            grads = [None] * (1 + len(kv_leaves))
        grad_q = grads[0] if grads[0] is not None else torch.zeros_like(q_leaf)
        head_dim = ctx.kv_shape[-1]
        grad_kv = grad_out.new_zeros(ctx.kv_shape[:-1] + (2 * head_dim,))
        for work, leaf, grad in zip(ctx.works, kv_leaves, grads[1:]):
            grad = torch.zeros_like(leaf) if grad is None else grad.contiguous()
            if len(work.ranks) > 1:
                dist.all_reduce(grad, group=ctx.groups.get(work.process_ranks))
            first, last = work.rows
            grad_kv[first:last] = grad[work.member, :last - first]
        return grad_q, grad_kv[..., :head_dim], grad_kv[..., head_dim:], None, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: PackedBatch,
              groups: Optional[ProcessGroups], *, softmax_scale: Optional[float] = None,
              kernel: Optional[KernelChoice] = None, schemes: str = "planned",
              stats: Optional[Any] = None) -> torch.Tensor:
    """Causal attention of this rank's tokens in the plan's ATTENTION layout.

    ``schemes="planned"`` (the default) runs each attention group of the rank as the plan
    says, in group-index order, forward and backward (python/ballast/_torch_schemes.py;
    docs/python.md, "Attention schemes"): ``local`` attends within each of its documents;
    ``ring`` passes K/V blocks around the group's members (zigzag chunks, partial results
    merged by log-sum-exp; the backward passes them again with their dK/dV and returns
    dK/dV to the owners); ``ulysses`` all-to-alls from sequence to head sharding, attends
    over the group's whole sequences and all-to-alls back; ``all_gather`` gathers every
    member's K/V and returns the dK/dV partials to their owners.

    ``schemes="reference"`` runs every group over several ranks the same way, whatever
    its scheme: it all-gathers the group's keys and values (padded to the largest member),
    rebuilds each sequence's keys in position order, and each of my chunks ``[b, e)``
    attends to keys ``[0, e)`` causally; the backward all-reduces the gathered keys' and
    values' gradients over the group. Both give the same result up to rounding.
    Every rank must call it for every micro-batch (also with 0 tokens).

    Under tensor parallelism (``batch.tensor_parallel`` N > 1) each process passes the
    heads of its TP index (heads / N query heads, kv_heads / N KV heads, as a
    column-parallel QKV projection makes them) and a group's communication runs among the
    processes of the same TP index (``ProcessGroups``).

    Args:
        q: (T_attention, heads, head_dim), rows in this rank's attention layout
            (``remap(x, batch, groups)`` of the linear-layout rows); under TP this
            process's heads.
        k, v: (T_attention, kv_heads, head_dim); heads a multiple of kv_heads (GQA).
        batch: the rank's ``PackedBatch``.
        groups: the cached process groups (created here on first use, collectively); may be
            None when the plan has no multi-rank group (e.g. packed-dp).
        softmax_scale: default ``head_dim ** -0.5``.
        kernel: the attention kernel each chunk runs (None: ``set_attention_kernel``'s, the
            blocked one by default; docs/python.md, "Attention kernels").
        schemes: ``"planned"`` (each group's scheme) or ``"reference"`` (all-gather for
            every group over several ranks, for comparison).
        stats: a ``CommunicationStats`` that counts the bytes this process sends, by scheme
            and pass (``"planned"`` only); None: not counted.

    Returns:
        (T_attention, heads, head_dim).
    """
    if schemes not in ("planned", "reference"):
        raise ValueError(f"attention: schemes must be 'planned' or 'reference'; got {schemes!r}")
    _check_qkv(q, k, v)
    expected = batch.attention_tokens
    if q.shape[0] != expected:
        raise ValueError(f"attention: q has {q.shape[0]} rows but rank {batch.rank} (plan rank {batch.plan_rank}) "
                         f"holds {expected} tokens in the attention layout of micro-batch {batch.micro_batch}"
                         + (" (remap the linear-layout rows first: remap(x, batch, groups))" if batch.remapped else ""))
    if batch.step_info.group_rank_sets():
        # On every rank, member or not: creating a group is collective over the world.
        if groups is None:
            raise ValueError("attention: the plan splits sequences over several ranks; pass a ProcessGroups "
                             "(the same object on every call)")
        groups.ensure(batch.step_info)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if schemes == "planned":
        from ballast._torch_schemes import ScheduledAttention, scheme_schedule
        scheduled = scheme_schedule(batch.step_info, batch.micro_batch, batch.plan_rank, batch.tensor_parallel_rank)
        return ScheduledAttention.apply(q, k, v, scheduled, groups, scale, get_attention_kernel(kernel), stats)
    works = _attention_schedule(batch.step_info, batch.micro_batch, batch.plan_rank, batch.tensor_parallel_rank,
                                q.device)
    return _PlannedAttention.apply(q, k, v, works, groups, scale, get_attention_kernel(kernel))


# --------------------------------------------------------------------------------------
# Remap between the linear and attention layouts
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Move:
    """Rows of x moved into a new tensor: kept rows, rows sent to and received from peers."""

    rows_out: int
    keep_from: torch.Tensor
    keep_to: torch.Tensor
    sends: Dict[int, torch.Tensor]      # peer (torch rank) -> my rows to send, in order
    receives: Dict[int, torch.Tensor]   # peer (torch rank) -> my output rows to fill, in order

    def reversed(self, rows_in: int) -> "_Move":
        return _Move(rows_in, self.keep_to, self.keep_from, dict(self.receives), dict(self.sends))


def _row_lookup(layout: List[Tuple[int, int, int]]) -> Dict[int, List[Tuple[int, int, int]]]:
    by_sequence: Dict[int, List[Tuple[int, int, int]]] = {}
    row = 0
    for sequence, begin, end in layout:
        by_sequence.setdefault(sequence, []).append((begin, end, row))
        row += end - begin
    for ranges in by_sequence.values():
        ranges.sort()
    return by_sequence


def _linear_row(lookup: Dict[int, List[Tuple[int, int, int]]], sequence: int, begin: int, end: int) -> int:
    ranges = lookup.get(sequence, [])
    i = bisect.bisect_right(ranges, (begin, math.inf, math.inf)) - 1
    if i < 0 or not ranges[i][0] <= begin < end <= ranges[i][1]:
        raise RuntimeError(f"internal error (please report): tokens [{begin}, {end}) of sequence {sequence} "
                           "are not in the sender's linear layout")
    return ranges[i][2] + begin - ranges[i][0]


def _remap_move(info: StepInfo, micro_batch: int, rank: int, tensor_parallel_rank: int,
                device: torch.device) -> Tuple[_Move, int]:
    """The linear -> attention move of plan rank ``rank`` (row indices on ``device``, the
    data's; peers as the torch ranks of TP index ``tensor_parallel_rank``), and its linear
    row count."""
    def make() -> Tuple[_Move, int]:
        linear = info._linear_layout(micro_batch, rank)
        lookup = _row_lookup(linear)
        keep_from: List[int] = []
        keep_to: List[int] = []
        sends: Dict[int, List[int]] = {}
        receives: Dict[int, List[int]] = {}
        attention_row = 0
        for src, dst, sequence, begin, end in info._transfers(micro_batch):
            if src == rank:
                start = _linear_row(lookup, sequence, begin, end)
                source_rows = list(range(start, start + end - begin))
                if dst == rank:
                    keep_from += source_rows
                else:
                    sends.setdefault(dst, []).extend(source_rows)
            if dst == rank:
                target_rows = list(range(attention_row, attention_row + end - begin))
                attention_row += end - begin
                if src == rank:
                    keep_to += target_rows
                else:
                    receives.setdefault(src, []).extend(target_rows)
        as_index = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
        peer = lambda p: p * info.tensor_parallel + tensor_parallel_rank  # noqa: E731
        move = _Move(attention_row, as_index(keep_from), as_index(keep_to),
                     {peer(p): as_index(r) for p, r in sorted(sends.items())},
                     {peer(p): as_index(r) for p, r in sorted(receives.items())})
        return move, sum(e - b for _, b, e in linear)

    return info._cached(("remap", micro_batch, rank, tensor_parallel_rank, str(device)), make)


def _apply_move(x: torch.Tensor, move: _Move) -> torch.Tensor:
    out = x.new_empty((move.rows_out,) + tuple(x.shape[1:]))
    out[move.keep_to] = x[move.keep_from]
    # All sends and receives posted as one batch before any wait: no rank blocks another's
    # sends (NCCL runs the batch as one group; gloo posts them one by one). One message per
    # (src, dst) pair, its rows in the order the receiver places them; buffers on x's device.
    outgoing = {peer: x[rows].contiguous() for peer, rows in move.sends.items()}  # alive until waited
    buffers = {peer: x.new_empty((len(rows),) + tuple(x.shape[1:])) for peer, rows in move.receives.items()}
    operations = [dist.P2POp(dist.isend, tensor, peer) for peer, tensor in outgoing.items()]
    operations += [dist.P2POp(dist.irecv, buffer, peer) for peer, buffer in buffers.items()]
    for request in dist.batch_isend_irecv(operations) if operations else []:
        request.wait()
    for peer, rows in move.receives.items():
        out[rows] = buffers[peer]
    return out


class _Remap(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, move: _Move, rows_in: int) -> torch.Tensor:  # type: ignore[override]
        ctx.move, ctx.rows_in = move, rows_in
        return _apply_move(x, move)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:  # type: ignore[override]
        return _apply_move(grad.contiguous(), ctx.move.reversed(ctx.rows_in)), None, None


def remap(x: torch.Tensor, batch: PackedBatch, groups: Optional[ProcessGroups] = None,
          direction: str = "to_attention") -> torch.Tensor:
    """Move rows of ``x`` between this rank's linear and attention layouts.

    With the plan's ``remap_transfers`` (point-to-point ``isend`` / ``irecv`` between ranks
    in one ``batch_isend_irecv``, which gloo, NCCL and MPI support); the backward moves the
    gradient the other way. The row indices live on ``x``'s device (built once per
    micro-batch, rank and device). The identity (no communication, ``x`` itself) when the
    micro-batch is not remapped. Every rank must call it at the same point (it
    communicates). Under tensor parallelism a piece moves between the processes of the
    same TP index of the two plan ranks (each moves its own heads' rows). With NCCL, run one collective over the world first (e.g.
    ``dist.barrier()``): a rank without transfers skips the batch, which NCCL allows only
    once the group has run a collective.

    Args:
        x: (T, ...) rows in the source layout: the linear layout for ``"to_attention"``, the
            attention layout for ``"to_linear"``.
        batch: the rank's ``PackedBatch``.
        groups: unused (point-to-point runs on the default group); accepted for symmetry.
        direction: ``"to_attention"`` or ``"to_linear"``.

    Returns:
        (T', ...) rows in the other layout.
    """
    del groups
    if direction not in ("to_attention", "to_linear"):
        raise ValueError(f"remap: direction must be 'to_attention' or 'to_linear'; got {direction!r}")
    if not batch.remapped:
        return x
    move, linear_rows = _remap_move(batch.step_info, batch.micro_batch, batch.plan_rank, batch.tensor_parallel_rank,
                                    x.device)
    if direction == "to_linear":
        move, rows_in = move.reversed(linear_rows), move.rows_out
    else:
        rows_in = linear_rows
    if x.shape[0] != rows_in:
        layout = "linear" if direction == "to_attention" else "attention"
        raise ValueError(f"remap {direction}: x has {x.shape[0]} rows but rank {batch.rank} (plan rank "
                         f"{batch.plan_rank}) holds {rows_in} tokens in the {layout} layout of micro-batch "
                         f"{batch.micro_batch}")
    if (move.sends or move.receives) and not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("remap moves tokens between ranks: call torch.distributed.init_process_group first")
    return _Remap.apply(x, move, rows_in)


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter], group: Any = None) -> None:
    """Sum every parameter's gradient over ``group``'s ranks (default: the world; a missing
    gradient counts as zero).

    With ``PackedBatch.loss_weight`` the summed gradient is the gradient of the global
    batch's mean loss: no division by the world size (unlike DistributedDataParallel).
    One all-reduce per parameter, in the parameters' order (the same on every rank).

    Under tensor parallelism pass ``group=groups.data_parallel_group(batch)``: the N
    members of a TP group compute the same loss over the same tokens, so a gradient is
    summed over the plan ranks only (the processes of the same TP index), never over the
    TP group: a TP-sharded weight's shards differ, and a replicated weight's gradient is
    already complete on each member (docs/python.md, "Tensor parallelism").
    """
    for parameter in parameters:
        if parameter.grad is None:
            parameter.grad = torch.zeros_like(parameter)
        dist.all_reduce(parameter.grad, op=dist.ReduceOp.SUM, group=group)
