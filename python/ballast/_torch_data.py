"""ballast.torch's data side: the balanced batch sampler, the piece dataset and collate.

Import it through ``ballast.torch`` (docs/python.md)."""

from __future__ import annotations

import collections.abc
import dataclasses
import math
import numbers
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

import ballast
from ballast import _ballast

#: The label of a token without a next token (the last token of each document), as
#: ``torch.nn.functional.cross_entropy`` ignores it by default.
IGNORE_INDEX = -100


# --------------------------------------------------------------------------------------
# Step information shared by every piece of one global batch
# --------------------------------------------------------------------------------------


class StepInfo:
    """One planned global batch, shared by all its pieces and packed micro-batches.

    Attributes:
        plan: the ``ballast.Plan`` of the global batch (sequence id = position in
            ``indices``).
        indices: the dataset indices of the global batch, in sequence-id order.
        global_targets: next-token targets in the whole global batch, ``sum(length - 1)``:
            the denominator of the mean loss.
        step: the global batch's position in the sampler's iteration (0, 1, ...).
        num_micro_batches: the plan's micro-batch count (every rank yields this many items).
        tensor_parallel: the plan's TP degree N (``plan.tensor_parallel``): N processes per
            plan rank (docs/python.md, "Tensor parallelism"); 1 without TP.

    Pickling sends the plan as its JSON (``Plan.to_json``), so a StepInfo crosses to
    DataLoader worker processes and back.
    """

    def __init__(self, plan: ballast.Plan, indices: Sequence[int], global_targets: int, step: int) -> None:
        self.plan = plan
        self.indices: Tuple[int, ...] = tuple(int(i) for i in indices)
        self.global_targets = int(global_targets)
        self.step = int(step)
        self.num_micro_batches = int(plan.num_micro_batches)
        self.tensor_parallel = int(plan.tensor_parallel)
        self._cache: Dict[Any, Any] = {}

    def __getstate__(self) -> Dict[str, Any]:
        return {"plan_json": self.plan.to_json(), "indices": self.indices,
                "global_targets": self.global_targets, "step": self.step}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(ballast.Plan.from_json(state["plan_json"], "a pickled ballast.torch.StepInfo"),  # type: ignore[misc]
                      state["indices"], state["global_targets"], state["step"])

    def __repr__(self) -> str:
        return (f"StepInfo(step={self.step}, sequences={len(self.indices)}, "
                f"global_targets={self.global_targets}, micro_batches={self.num_micro_batches})")

    def _cached(self, key: Any, make: Any) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def rank_view(self, rank: int) -> ballast.RankView:
        """``plan.rank(rank)``, computed once."""
        return self._cached(("view", rank), lambda: self.plan.rank(rank))

    def micro_batch_view(self, micro_batch: int, rank: int) -> ballast.RankMicroBatch:
        """What ``rank`` holds in ``micro_batch`` (``plan.rank(rank).micro_batches[m]``)."""
        views = self._cached(("micro_batch_views", rank), lambda: list(self.rank_view(rank).micro_batches))
        return views[micro_batch]

    def _micro_batches(self) -> List[Any]:
        return self._cached("micro_batches", lambda: list(self.plan.micro_batches))

    def _attention_layout(self, micro_batch: int, rank: int) -> List[Tuple[int, int, int, int]]:
        """(sequence_id, begin, end, group) of rank's attention layout, as plain tuples."""
        return self._cached(("attention", micro_batch, rank), lambda: [
            (int(r.sequence_id), int(r.begin), int(r.end), int(r.group))
            for r in self.plan.attention_layout(micro_batch, rank)])

    def _linear_layout(self, micro_batch: int, rank: int) -> List[Tuple[int, int, int]]:
        return self._cached(("linear", micro_batch, rank), lambda: [
            (int(r.sequence_id), int(r.begin), int(r.end))
            for r in self.plan.linear_layout(micro_batch, rank)])

    def _transfers(self, micro_batch: int) -> List[Tuple[int, int, int, int, int]]:
        return self._cached(("transfers", micro_batch), lambda: [
            (int(t.src_rank), int(t.dst_rank), int(t.sequence_id), int(t.begin), int(t.end))
            for t in self.plan.remap_transfers(micro_batch)])

    def group_rank_sets(self) -> List[Tuple[int, ...]]:
        """Every distinct multi-rank attention group of the plan, as sorted rank tuples, sorted;
        a usp group adds its stages and the rings of its stages' members (``usp_rank_sets``)."""
        def make() -> List[Tuple[int, ...]]:
            sets = set()
            for batch in self._micro_batches():
                for group in batch.groups:
                    if len(group.ranks) > 1:
                        sets.add(tuple(sorted(int(r) for r in group.ranks)))
                    if str(group.scheme) == "usp":
                        stages, rings = usp_rank_sets(group.ranks, int(group.ulysses_degree))
                        sets.update(stages + rings)
            return sorted(sets)
        return self._cached("rank_sets", make)


def usp_rank_sets(ranks: Sequence[int], ulysses_degree: int) -> Tuple[List[Tuple[int, ...]], List[Tuple[int, ...]]]:
    """A usp group's stages (u consecutive ranks of its list, each sorted: a stage's members
    are numbered by rank, as a Ulysses group's are) and its rings (member m of every stage,
    sorted), both as tuples of plan ranks."""
    u = ulysses_degree
    stages = [tuple(sorted(int(r) for r in ranks[j:j + u])) for j in range(0, len(ranks), u)]
    rings = [tuple(sorted(stage[m] for stage in stages)) for m in range(u)]
    return stages, rings


# --------------------------------------------------------------------------------------
# Sampler and dataset: what each rank loads
# --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Piece:
    """Tokens ``[begin, end)`` of one dataset item that this rank packs in one micro-batch.

    Attributes:
        dataset_index: index of the item in the wrapped dataset.
        sequence_id: the item's position in its global batch (the plan's sequence id).
        begin, end: the token range inside the item (document positions).
        length: the item's full token count.
        micro_batch: the micro-batch of the plan the piece belongs to.
        step_info: the global batch's ``StepInfo`` (plan, targets, micro-batch count).
    """

    dataset_index: int
    sequence_id: int
    begin: int
    end: int
    length: int
    micro_batch: int
    step_info: StepInfo = dataclasses.field(compare=False, repr=False)

    @property
    def tokens(self) -> int:
        """``end - begin``."""
        return self.end - self.begin


@dataclasses.dataclass(frozen=True)
class MicroBatchHeader:
    """First element of every item the sampler yields: which micro-batch of which step.

    It lets ``collate`` build a micro-batch in which this rank holds no token (the ranks
    must stay in step for the collectives), and passes through ``PieceDataset`` unchanged.
    ``rank`` and ``world_size`` are the torch process's (under tensor parallelism N
    processes share a plan rank: ``rank // N``).
    """

    step_info: StepInfo = dataclasses.field(repr=False)
    micro_batch: int
    rank: int
    world_size: int


#: One item of a ``BalancedBatchSampler``: a ``MicroBatchHeader`` then this rank's pieces.
MicroBatchItems = List[Union[MicroBatchHeader, Piece]]


def _resolve_cluster(cluster: Any, nodes: Optional[int]) -> ballast.Cluster:
    return ballast._cluster(cluster, nodes)  # the same coercion as ballast.plan


def _resolve_model(model: Any) -> ballast.Model:
    return ballast._model(model)


class BalancedBatchSampler(torch.utils.data.Sampler):  # type: ignore[type-arg]
    """A batch sampler that plans each global batch with ballast and yields this rank's share.

    For each global batch of ``batches`` (a list of dataset indices; the same sequence on
    every rank, e.g. a ``BatchSampler`` over a ``RandomSampler`` with an identically seeded
    generator), the sampler plans the batch (sequence id = position in the list) and yields
    one item per micro-batch of the plan: ``[MicroBatchHeader, Piece, Piece, ...]``, the
    pieces in this rank's linear packing order (``plan.rank(r).micro_batches[m].linear``).
    Every rank yields the same number of items per global batch, possibly with no pieces.

    Use it as a DataLoader's ``batch_sampler`` with ``PieceDataset`` and ``collate``::

        loader = DataLoader(PieceDataset(documents), batch_sampler=sampler, collate_fn=collate)

    Args:
        lengths: token count of every dataset item (a sequence, numpy array or tensor).
        batches: an iterable of global batches, each a list of dataset indices.
        rank: this process's rank (``torch.distributed.get_rank()``); under tensor
            parallelism it loads the tokens of plan rank ``rank // tensor_parallel``.
        world_size: the number of processes; must equal the cluster's GPUs (its ranks x
            ``tensor_parallel``).
        cluster: a preset name, JSON path, ``ballast.Cluster`` or dict (as ``ballast.plan``).
        model: a preset name, JSON path, ``ballast.Model`` or dict.
        strategy: a strategy spec, e.g. ``"zeppelin"``, ``"packed-dp"``, ``"flexsp-fast"``.
        nodes: overrides the cluster's node count.
        cost_model: ``"analytical"``, a profiled preset or a JSON path.
        max_context_tokens: the run's context length, from which the static strategies
            fix their degree for every batch (``ballast.plan``); default: the longest
            item of ``lengths``.
        tensor_parallel: GPUs (processes) per TP group, N: the plans' ranks are TP groups
            of N consecutive processes, and the N members of a group load the same tokens
            (``ballast.plan``'s ``tensor_parallel``; docs/python.md, "Tensor parallelism").
            A cluster that already is one of TP groups (``plan.cluster``) keeps its own.

    Raises:
        ValueError: the cluster's GPU count is not ``world_size``, ``rank`` is out of range,
            an index is out of range, a length is not positive, or the strategy is unknown;
            ``ballast.PlanningError`` (a ValueError) when a batch cannot be planned.
    """

    def __init__(self, lengths: ballast.Lengths, batches: Iterable[Sequence[int]], *, rank: int,
                 world_size: int, cluster: Any, model: Any = "llama-7b", strategy: str = "zeppelin",
                 nodes: Optional[int] = None, cost_model: str = "analytical",
                 max_context_tokens: Optional[int] = None, tensor_parallel: int = 1) -> None:
        super().__init__(None)
        self.lengths = ballast._lengths_array(lengths)
        if self.lengths.size and int(self.lengths.min()) < 1:
            bad = int(np.argmin(self.lengths))
            raise ValueError(f"lengths[{bad}] = {int(self.lengths[bad])}: every dataset item needs at least one token")
        self.batches = batches
        self.rank = int(rank)
        self.world_size = int(world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size} ranks (0..{int(world_size) - 1})")
        self.model = _resolve_model(model)
        # The cluster of TP groups every batch plans on (the cluster itself without TP).
        self.cluster = ballast.tensor_parallel_units(_resolve_cluster(cluster, nodes), self.model,
                                                     int(tensor_parallel))
        self.tensor_parallel = int(self.cluster.tensor_parallel)
        self.plan_rank = self.rank // self.tensor_parallel
        self.strategy = str(strategy)
        self.cost_model = str(cost_model)
        # The run's context: every batch of the run plans with the same static degree.
        longest = int(self.lengths.max()) if self.lengths.size else 1
        self.max_context_tokens = longest if max_context_tokens is None else int(max_context_tokens)
        _ballast.check_strategy(self.strategy)
        gpus = self.cluster.gpus
        if gpus != self.world_size:
            per_node = self.cluster.gpus_per_node * self.tensor_parallel
            tensor_parallel = (f" in {self.cluster.ranks} TP groups of {self.tensor_parallel}"
                               if self.tensor_parallel > 1 else "")
            raise ValueError(
                f"the cluster '{self.cluster.name}' has {gpus} GPUs ({self.cluster.nodes} nodes x "
                f"{per_node} GPUs{tensor_parallel}) but world_size is {self.world_size}: plan for the job "
                f"you run, e.g. cluster=ballast.Cluster.load('{self.cluster.name}', nodes=N) with "
                f"N x gpus_per_node == {self.world_size} (set cluster.gpus_per_node and nics_per_node "
                f"for a partial node), or launch {gpus} processes (one per GPU)")
        self._last: Optional[StepInfo] = None
        self._plans: Dict[Tuple[int, ...], ballast.Plan] = {}

    @property
    def last_plan(self) -> Optional[ballast.Plan]:
        """The plan of the latest global batch the sampler planned (None before the first).

        With DataLoader workers the sampler runs ahead of the training loop: use
        ``batch.plan`` of the PackedBatch at hand there.
        """
        return None if self._last is None else self._last.plan

    @property
    def last_step_info(self) -> Optional[StepInfo]:
        """The ``StepInfo`` of the latest planned global batch."""
        return self._last

    def plan_batch(self, indices: Sequence[int], step: int = 0) -> StepInfo:
        """Plan one global batch (dataset indices) and return its ``StepInfo``."""
        indices = [int(i) for i in indices]
        if not indices:
            raise ValueError(f"global batch {step} is empty: every global batch needs at least one index")
        for i in indices:
            if not 0 <= i < len(self.lengths):
                raise ValueError(f"global batch {step}: index {i} is outside the {len(self.lengths)} lengths")
        lengths = self.lengths[indices]
        key = tuple(indices)
        plan = self._plans.get(key)
        if plan is None:
            try:
                plan = ballast.plan(lengths, self.cluster, self.model, self.strategy,  # TP as is
                                    cost_model=self.cost_model, step=step,
                                    max_context_tokens=self.max_context_tokens)
            except ballast.PlanningError as error:
                raise ballast.PlanningError(f"global batch {step}: {error}") from error
            if isinstance(self.batches, collections.abc.Sequence):
                self._plans[key] = plan  # re-iterable batches: plan once (also for __len__)
        info = StepInfo(plan, indices, int((lengths - 1).sum()), step)
        self._last = info
        return info

    def items(self, info: StepInfo) -> Iterator[MicroBatchItems]:
        """This rank's items of one planned global batch, one per micro-batch (those of its
        plan rank: every member of a TP group gets the same pieces)."""
        view = info.rank_view(self.plan_rank)
        for m, micro in enumerate(view.micro_batches):
            item: MicroBatchItems = [MicroBatchHeader(info, m, self.rank, self.world_size)]
            for r in micro.linear:
                sequence = int(r.sequence_id)
                item.append(Piece(info.indices[sequence], sequence, int(r.begin), int(r.end),
                                  int(self.lengths[info.indices[sequence]]), m, info))
            yield item

    def __iter__(self) -> Iterator[MicroBatchItems]:
        for step, indices in enumerate(self.batches):
            yield from self.items(self.plan_batch(indices, step))

    def __len__(self) -> int:
        """Items per pass: the micro-batches of every global batch.

        Known only after planning, so only when ``batches`` is a list or tuple (planned
        once here and cached); for a one-shot or random iterable (a ``BatchSampler`` over a
        ``RandomSampler``), planning ahead would consume its random state: TypeError.
        """
        if not isinstance(self.batches, collections.abc.Sequence):
            raise TypeError(
                "len(BalancedBatchSampler) is the number of micro-batches, known only once each "
                "global batch is planned; pass batches as a list (or tuple) of index lists to get "
                "it, or count global batches with len(sampler.batches)")
        last, total = self._last, 0
        for step, indices in enumerate(self.batches):
            total += self.plan_batch(indices, step).num_micro_batches
        self._last = last
        return total


class PieceDataset(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Wraps a map-style dataset of token sequences so that it serves ``Piece`` s.

    ``dataset[i]`` must be a 1-D sequence of token ids (a LongTensor or anything
    ``torch.as_tensor`` accepts) with ``lengths[i]`` tokens. ``PieceDataset(ds)[piece]``
    returns ``(piece, tokens[begin : min(end + 1, length)])``: one token past the piece so
    that its last token gets its label even when the next token lives on another rank.
    A ``MicroBatchHeader`` is returned unchanged.
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: Union[Piece, MicroBatchHeader]) -> Any:
        if isinstance(item, MicroBatchHeader):
            return item
        if not isinstance(item, Piece):
            raise TypeError(f"PieceDataset serves the items of a BalancedBatchSampler (Piece); got {type(item).__name__}")
        tokens = torch.as_tensor(self.dataset[item.dataset_index])
        if tokens.dim() != 1 or tokens.numel() != item.length:
            raise ValueError(f"dataset item {item.dataset_index} has shape {tuple(tokens.shape)} but the sampler's "
                             f"lengths say {item.length} tokens: lengths[i] must be len(dataset[i])")
        return item, tokens[item.begin:min(item.end + 1, item.length)].long()


# --------------------------------------------------------------------------------------
# Collate: the packed micro-batch of this rank
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class PackedBatch:
    """This rank's packed tokens of one micro-batch (what ``collate`` returns).

    Tensors are in the rank's linear layout (embeddings, linear layers, loss); T = its tokens.

    Attributes:
        input_ids: LongTensor[T], the pieces' tokens back to back.
        labels: LongTensor[T], the next token of the same document; ``IGNORE_INDEX`` (-100)
            on the last token of each document.
        position_ids: LongTensor[T], the position inside the document (``begin + arange``):
            restarts at 0 per document and continues across a split (for RoPE).
        cu_seqlens: int32[pieces + 1], piece boundaries in the packed tensors
            (FlashAttention varlen style).
        max_seqlen: the longest piece.
        loss_weight: float32[T], ``loss_scale / global_targets`` on tokens with a label and 0
            elsewhere: summing ``(per_token_loss * loss_weight).sum()`` over every plan rank
            and micro-batch gives the mean loss of the global batch (the unbalanced one). Sum
            the gradients over plan ranks (``all_reduce_gradients``); DistributedDataParallel
            averages them instead, so with DDP pass ``loss_scale`` = its world size to
            ``collate``. Under tensor parallelism every member of a TP group computes the
            same loss with these weights: count it once per TP group and sum gradients over
            the data-parallel group only (docs/python.md, "Tensor parallelism").
        sequence_ids: LongTensor[pieces], each piece's sequence id in the global batch.
        pieces: the pieces, in packing order.
        step_info: the global batch's ``StepInfo``.
        micro_batch: the micro-batch index in the plan.
        rank, world_size: whose batch this is: the torch process's rank and world size.
            Under tensor parallelism (N = ``tensor_parallel`` > 1) it holds the tokens of
            plan rank ``plan_rank = rank // N``, as TP member ``rank % N``.
    """

    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    loss_weight: torch.Tensor
    sequence_ids: torch.Tensor
    pieces: Tuple[Piece, ...]
    step_info: StepInfo
    micro_batch: int
    rank: int
    world_size: int

    @property
    def plan(self) -> ballast.Plan:
        """The plan of the global batch."""
        return self.step_info.plan

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches in the global batch (step the optimizer after the last one)."""
        return self.step_info.num_micro_batches

    @property
    def global_targets(self) -> int:
        """Next-token targets in the whole global batch."""
        return self.step_info.global_targets

    @property
    def tensor_parallel(self) -> int:
        """N, the processes per plan rank (the plan's TP degree; 1 without TP)."""
        return self.step_info.tensor_parallel

    @property
    def plan_rank(self) -> int:
        """The plan rank whose tokens this process holds: ``rank // tensor_parallel``."""
        return self.rank // self.step_info.tensor_parallel

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index in its TP group: ``rank % tensor_parallel`` (0 without TP)."""
        return self.rank % self.step_info.tensor_parallel

    @property
    def view(self) -> ballast.RankMicroBatch:
        """The plan rank's view of the micro-batch: ``linear``, ``attention``, ``groups``, ``sends``..."""
        return self.step_info.micro_batch_view(self.micro_batch, self.plan_rank)

    @property
    def remapped(self) -> bool:
        """Whether the linear layout differs from the attention layout (``remap`` moves tokens)."""
        return bool(self.step_info._micro_batches()[self.micro_batch].linear_layout)

    @property
    def num_tokens(self) -> int:
        """T, this rank's tokens in the linear layout."""
        return int(self.input_ids.numel())

    @property
    def attention_tokens(self) -> int:
        """This rank's tokens in the attention layout (rows of ``attention``'s q, k, v)."""
        return sum(e - b for _, b, e, _ in self.step_info._attention_layout(self.micro_batch, self.plan_rank))

    def to(self, device: Union[str, torch.device], non_blocking: bool = False) -> "PackedBatch":
        """A copy with the tensors on ``device`` (``cu_seqlens`` too, as FlashAttention wants)."""
        move = {f: getattr(self, f).to(device, non_blocking=non_blocking) for f in _TENSOR_FIELDS}
        return dataclasses.replace(self, **move)

    def pin_memory(self) -> "PackedBatch":
        """A copy with pinned tensors (called by ``DataLoader(pin_memory=True)``)."""
        return dataclasses.replace(self, **{f: getattr(self, f).pin_memory() for f in _TENSOR_FIELDS})


_TENSOR_FIELDS = ("input_ids", "labels", "position_ids", "cu_seqlens", "loss_weight", "sequence_ids")


def collate(samples: Sequence[Any], *, loss_scale: float = 1.0) -> PackedBatch:
    """Pack one micro-batch of this rank: ``DataLoader(..., collate_fn=collate)``.

    Args:
        samples: what ``PieceDataset`` returns for one item of a ``BalancedBatchSampler``:
            the ``MicroBatchHeader`` then ``(piece, tokens)`` pairs.
        loss_scale: multiplies ``loss_weight``; 1 when gradients are summed over ranks,
            ``world_size`` under DistributedDataParallel (which averages). Bind it with
            ``functools.partial(collate, loss_scale=world_size)``.

    Returns:
        A ``PackedBatch``; with no pieces its tensors have 0 tokens (and ``cu_seqlens = [0]``).
    """
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real) or not math.isfinite(loss_scale) \
            or loss_scale <= 0:
        raise ValueError(f"collate: loss_scale must be a positive finite number (1 when gradients are summed over "
                         f"ranks, the data-parallel world size under DistributedDataParallel); got {loss_scale!r}")
    if not samples or not isinstance(samples[0], MicroBatchHeader):
        raise ValueError("collate expects the items of a BalancedBatchSampler served by a PieceDataset: "
                         "DataLoader(PieceDataset(dataset), batch_sampler=sampler, collate_fn=collate)")
    header: MicroBatchHeader = samples[0]
    info = header.step_info
    inputs: List[torch.Tensor] = []
    labels: List[torch.Tensor] = []
    positions: List[torch.Tensor] = []
    pieces: List[Piece] = []
    for piece, tokens in samples[1:]:
        count = piece.end - piece.begin
        if tokens.numel() not in (count, count + 1) or (tokens.numel() == count) != (piece.end == piece.length):
            raise ValueError(f"collate: piece {piece} came with {tokens.numel()} tokens; PieceDataset serves "
                             f"tokens[begin : min(end + 1, length)]")
        inputs.append(tokens[:count])
        label = torch.full((count,), IGNORE_INDEX, dtype=torch.long)
        label[:tokens.numel() - 1] = tokens[1:]
        labels.append(label)
        positions.append(torch.arange(piece.begin, piece.end, dtype=torch.long))
        pieces.append(piece)
    sizes = [p.end - p.begin for p in pieces]
    cu_seqlens = torch.zeros(len(pieces) + 1, dtype=torch.int32)
    if sizes:
        cu_seqlens[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0).to(torch.int32)
    label_tensor = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)
    weight = float(loss_scale) / info.global_targets if info.global_targets > 0 else 0.0
    return PackedBatch(
        input_ids=torch.cat(inputs).long() if inputs else torch.zeros(0, dtype=torch.long),
        labels=label_tensor,
        position_ids=torch.cat(positions) if positions else torch.zeros(0, dtype=torch.long),
        cu_seqlens=cu_seqlens,
        max_seqlen=max(sizes, default=0),
        loss_weight=(label_tensor != IGNORE_INDEX).to(torch.float32) * weight,
        sequence_ids=torch.tensor([p.sequence_id for p in pieces], dtype=torch.long),
        pieces=tuple(pieces),
        step_info=info,
        micro_batch=header.micro_batch,
        rank=header.rank,
        world_size=header.world_size,
    )


