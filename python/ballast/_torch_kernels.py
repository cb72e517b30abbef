"""ballast.torch's attention kernels: causal attention of one block of queries over one block
of keys / values on a packed (varlen) batch, returning the output and its log-sum-exp so
that partial results over several key blocks merge exactly (ring, all-gather and Ulysses
schemes call it per KV block). Import it through ``ballast.torch`` (docs/python.md,
"Attention kernels").

Shapes (T_q query rows, T_k key rows, packed document after document)::

    q            (T_q, heads, head_dim)
    k, v         (T_k, kv_heads, head_dim)   heads a multiple of kv_heads (GQA: query head
                                             h reads KV head h // (heads / kv_heads))
    out          (T_q, heads, head_dim)      q's dtype
    lse          (heads, T_q)                float32 (float64 for float64 inputs), natural
                                             log of the softmax denominator (scaled scores);
                                             -inf for a query that sees no key (out is 0)

The mask (``VarlenLayout``): query row i of document d sits at position
``query_offsets[d] + (i - cu_seqlens_q[d])`` of its document, key row j at
``key_offsets[d] + (j - cu_seqlens_k[d])``; query i sees key j iff both belong to the same
document d and key position <= query position.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, List, Optional, Sequence, Tuple, Union

import torch

# --------------------------------------------------------------------------------------
# The mask: documents as varlen boundaries plus positions
# --------------------------------------------------------------------------------------


def _int_list(name: str, values: Union[Sequence[int], torch.Tensor]) -> List[int]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.is_floating_point():
            raise ValueError(f"{name} must be a 1-D integer tensor or a list of ints; got shape "
                             f"{tuple(values.shape)}, dtype {values.dtype}")
        return [int(x) for x in values.tolist()]
    return [int(x) for x in values]


@dataclasses.dataclass(frozen=True)
class VarlenLayout:
    """Which query row sees which key row: documents packed in the same order on both sides.

    Attributes (token counts and positions, host ints):
        cu_seqlens_q: query row boundaries, documents + 1 entries, 0 ... T_q (FlashAttention
            varlen style; ``PackedBatch.cu_seqlens`` for self-attention).
        cu_seqlens_k: key row boundaries, documents + 1 entries, 0 ... T_k.
        query_offsets: per document, the position in its document of its first query row.
        key_offsets: per document, the position in its document of its first key row.

    Query i of document d sees key j of document d iff ``key position <= query position``.
    A ring step that holds queries at positions [b, e) of a document and keys [0, b) uses
    ``query_offsets=[b]``, ``key_offsets=[0]`` (every key visible); the diagonal block,
    queries and keys [b, e), uses ``[b]`` and ``[b]``.
    """

    cu_seqlens_q: Tuple[int, ...]
    cu_seqlens_k: Tuple[int, ...]
    query_offsets: Tuple[int, ...]
    key_offsets: Tuple[int, ...]

    def __init__(self, cu_seqlens_q: Union[Sequence[int], torch.Tensor],
                 cu_seqlens_k: Union[Sequence[int], torch.Tensor, None] = None,
                 query_offsets: Union[Sequence[int], torch.Tensor, None] = None,
                 key_offsets: Union[Sequence[int], torch.Tensor, None] = None) -> None:
        bounds_q = _int_list("cu_seqlens_q", cu_seqlens_q)
        bounds_k = bounds_q if cu_seqlens_k is None else _int_list("cu_seqlens_k", cu_seqlens_k)
        documents = len(bounds_q) - 1
        zeros = [0] * max(documents, 0)
        offsets_q = zeros if query_offsets is None else _int_list("query_offsets", query_offsets)
        offsets_k = zeros if key_offsets is None else _int_list("key_offsets", key_offsets)
        for name, bounds in (("cu_seqlens_q", bounds_q), ("cu_seqlens_k", bounds_k)):
            if not bounds or bounds[0] != 0 or any(b > e for b, e in zip(bounds[:-1], bounds[1:])):
                raise ValueError(f"{name} must start at 0 and never decrease (document boundaries in rows); "
                                 f"got {bounds[:8]}{'...' if len(bounds) > 8 else ''}")
        if len(bounds_k) != len(bounds_q):
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must list the same documents: {len(bounds_q)} vs "
                             f"{len(bounds_k)} entries")
        for name, offsets in (("query_offsets", offsets_q), ("key_offsets", offsets_k)):
            if len(offsets) != documents or any(o < 0 for o in offsets):
                raise ValueError(f"{name} must hold one position >= 0 per document ({documents}); got "
                                 f"{len(offsets)} entries")
        object.__setattr__(self, "cu_seqlens_q", tuple(bounds_q))
        object.__setattr__(self, "cu_seqlens_k", tuple(bounds_k))
        object.__setattr__(self, "query_offsets", tuple(offsets_q))
        object.__setattr__(self, "key_offsets", tuple(offsets_k))

    @classmethod
    def causal(cls, cu_seqlens: Union[Sequence[int], torch.Tensor]) -> "VarlenLayout":
        """Self-attention of a packed batch: each document over itself, causal."""
        return cls(cu_seqlens)

    @classmethod
    def single(cls, query_tokens: int, key_tokens: int, query_offset: int = 0,
               key_offset: int = 0) -> "VarlenLayout":
        """One document: queries at positions query_offset + [0, query_tokens) over keys at
        key_offset + [0, key_tokens)."""
        return cls([0, query_tokens], [0, key_tokens], [query_offset], [key_offset])

    @property
    def documents(self) -> int:
        return len(self.cu_seqlens_q) - 1

    @property
    def query_tokens(self) -> int:
        return self.cu_seqlens_q[-1]

    @property
    def key_tokens(self) -> int:
        return self.cu_seqlens_k[-1]

    def position_tensors(self, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(query document, query position, key document, key position) per row, int64 on ``device``."""
        def expand(bounds: Tuple[int, ...], offsets: Tuple[int, ...]) -> Tuple[torch.Tensor, torch.Tensor]:
            # Built on ``device`` directly (no host tensor moved over: the meta device works too).
            long = dict(dtype=torch.long, device=device)
            lengths = torch.tensor([e - b for b, e in zip(bounds[:-1], bounds[1:])], **long)
            document = torch.repeat_interleave(torch.arange(len(offsets), **long), lengths, output_size=bounds[-1])
            shift = torch.tensor([o - b for o, b in zip(offsets, bounds[:-1])], **long)  # position - row
            return document, torch.arange(bounds[-1], **long) + shift[document]
        query_document, query_position = expand(self.cu_seqlens_q, self.query_offsets)
        key_document, key_position = expand(self.cu_seqlens_k, self.key_offsets)
        return query_document, query_position, key_document, key_position


# --------------------------------------------------------------------------------------
# Checks, the interface, the merge and the dense reference
# --------------------------------------------------------------------------------------


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout) -> None:
    """ValueError naming the argument when shapes, dtypes or the layout do not fit."""
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.dim() != 3:
            raise ValueError(f"{name} must be (tokens, heads, head_dim); got shape {tuple(tensor.shape)}")
        if not tensor.is_floating_point():
            raise ValueError(f"{name} must be floating point (float32, bfloat16, float16 or float64); got {tensor.dtype}")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if q.dtype != k.dtype or q.dtype != v.dtype:
        raise ValueError(f"q, k, v must share a dtype; got {q.dtype}, {k.dtype}, {v.dtype}: cast them first")
    if q.device != k.device or q.device != v.device:
        raise ValueError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q's head_dim {q.shape[2]} differs from k's {k.shape[2]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"k's kv_heads {k.shape[1]} must divide q's heads {q.shape[1]} (GQA: query head h reads KV "
                         f"head h // (heads / kv_heads)); pass kv_heads among the divisors of {q.shape[1]}")
    if layout.query_tokens != q.shape[0] or layout.key_tokens != k.shape[0]:
        raise ValueError(f"layout covers {layout.query_tokens} query and {layout.key_tokens} key rows but q has "
                         f"{q.shape[0]} and k {k.shape[0]}: cu_seqlens_q[-1] and cu_seqlens_k[-1] must be the row counts")


class AttentionKernel:
    """The kernel interface: one block of queries over one block of keys, forward and backward.

    A kernel is any object with these two methods (subclassing is optional); pass it to
    ``set_attention_kernel`` or as ``kernel=`` to ``varlen_attention``, ``local_attention``
    and ``attention``. ``softmax_scale`` multiplies the scores q . k.
    """

    name = "abstract"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        """(out (T_q, heads, head_dim) in q's dtype, lse (heads, T_q) float32)."""
        raise NotImplementedError

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, layout: VarlenLayout,
                 softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dq, dk, dv) in the shapes and dtypes of q, k, v, from forward's out and lse."""
        raise NotImplementedError


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Combine two partial results of the same queries over disjoint key sets.

    out_*: (T_q, heads, head_dim); lse_*: (heads, T_q). Returns (out, lse) as if the kernel had
    run over both key sets: lse = log(exp(lse_a) + exp(lse_b)), out = the lse-weighted sum,
    computed in lse's dtype; out in out_a's dtype. A query that sees no key on one side
    (lse -inf) takes the other side's result.
    """
    if out_a.shape != out_b.shape or lse_a.shape != lse_b.shape or lse_a.shape != (out_a.shape[1], out_a.shape[0]):
        raise ValueError(f"merge_attention: out_a {tuple(out_a.shape)}, out_b {tuple(out_b.shape)} must be "
                         f"(T_q, heads, head_dim) and lse_a {tuple(lse_a.shape)}, lse_b {tuple(lse_b.shape)} "
                         "(heads, T_q), the same on both sides")
    lse = torch.logaddexp(lse_a, lse_b)
    finite = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
    weight_a = torch.exp(lse_a - finite).t().unsqueeze(-1)  # (T_q, heads, 1); 0 where lse_a = -inf
    weight_b = torch.exp(lse_b - finite).t().unsqueeze(-1)
    out = out_a.to(lse.dtype) * weight_a + out_b.to(lse.dtype) * weight_b
    return out.to(out_a.dtype), lse


def dense_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                              softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The slow reference: the full (heads, T_q, T_k) score matrix in float64, masked.
    Returns (out (T_q, heads, head_dim), lse (heads, T_q)), float64; differentiable."""
    check_inputs(q, k, v, layout)
    groups = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(groups, dim=1)
    v64 = v.double().repeat_interleave(groups, dim=1)
    query_document, query_position, key_document, key_position = layout.position_tensors(q.device)
    visible = (query_document[:, None] == key_document[None, :]) & (key_position[None, :] <= query_position[:, None])
    scores = torch.einsum("nhd,ehd->hne", q.double(), k64) * softmax_scale
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (heads, T_q)
    probabilities = torch.exp(scores - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    return torch.einsum("hne,ehd->nhd", probabilities, v64), lse


# --------------------------------------------------------------------------------------
# The default kernel: pure torch, blocked (online softmax), FlashAttention-2's backward
# --------------------------------------------------------------------------------------


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclasses.dataclass(frozen=True)
class _Tile:
    """Query rows [q_begin, q_end) against key rows [k_begin, k_end), and the tile's mask
    (None: every pair visible)."""

    q_begin: int
    q_end: int
    k_begin: int
    k_end: int
    needs_mask: bool


class BlockedAttentionKernel(AttentionKernel):
    """Pure-torch FlashAttention-2 style kernel, CPU or CUDA, any float dtype.

    Queries are cut into blocks of ``query_block_tokens`` rows and keys into blocks of
    ``block_tokens`` rows; each query block runs an online softmax over the key blocks it
    can see, so the largest intermediate is one (heads, query_block_tokens, block_tokens)
    score tile (8 MiB in float32 for 8 heads and the 512 x 512 default) and memory grows
    with tokens x block, never tokens^2. Key blocks wholly in other documents or wholly in
    the future are skipped, so a pack of short documents costs about what varlen costs.
    Accumulates in float32 (float64 for float64 inputs); out in the input dtype.
    """

    name = "blocked"

    def __init__(self, block_tokens: int = 512, query_block_tokens: int = 512) -> None:
        for name, value in (("block_tokens", block_tokens), ("query_block_tokens", query_block_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int (rows per block); got {value!r}")
        self.block_tokens = block_tokens
        self.query_block_tokens = query_block_tokens

    def __repr__(self) -> str:
        return f"BlockedAttentionKernel(block_tokens={self.block_tokens}, query_block_tokens={self.query_block_tokens})"

    # The tiles: per query block, the key rows it may see (its documents' keys up to its last
    # query position), in blocks; documents are contiguous and in the same order on both sides.
    def _tiles(self, layout: VarlenLayout) -> List[List[_Tile]]:
        bq, bk = layout.cu_seqlens_q, layout.cu_seqlens_k
        documents = layout.documents
        per_query_block: List[List[_Tile]] = []
        document = 0
        for q_begin in range(0, layout.query_tokens, self.query_block_tokens):
            q_end = min(q_begin + self.query_block_tokens, layout.query_tokens)
            while bq[document + 1] <= q_begin:
                document += 1
            tiles: List[_Tile] = []
            d = document
            while d < documents and bq[d] < q_end:
                rows_begin, rows_end = max(q_begin, bq[d]), min(q_end, bq[d + 1])
                if rows_end > rows_begin:
                    first_position = layout.query_offsets[d] + rows_begin - bq[d]
                    last_position = layout.query_offsets[d] + rows_end - 1 - bq[d]
                    # keys of d at positions <= last_position: rows [bk[d], bk[d] + visible)
                    visible = min(bk[d + 1] - bk[d], max(0, last_position - layout.key_offsets[d] + 1))
                    for k_begin in range(bk[d], bk[d] + visible, self.block_tokens):
                        k_end = min(k_begin + self.block_tokens, bk[d] + visible)
                        last_key_position = layout.key_offsets[d] + k_end - 1 - bk[d]
                        tiles.append(_Tile(rows_begin, rows_end, k_begin, k_end, last_key_position > first_position))
                d += 1
            per_query_block.append(_merge_tiles(tiles, min(self.block_tokens, MERGE_SPAN_TOKENS)))
        return per_query_block

    @staticmethod
    def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q as (heads, T_q, d), k and v as (kv_heads, T_k, d), in the accumulation dtype."""
        dtype = _accumulation_dtype(q.dtype)
        return (q.permute(1, 0, 2).to(dtype).contiguous(), k.permute(1, 0, 2).to(dtype).contiguous(),
                v.permute(1, 0, 2).to(dtype).contiguous())

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        check_inputs(q, k, v, layout)
        heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
        group = heads // kv_heads
        qh, kh, vh = self._prepare(q, k, v)
        dtype = qh.dtype
        out = torch.zeros_like(qh)                                              # (heads, T_q, d)
        lse = torch.full((heads, q.shape[0]), float("-inf"), dtype=dtype, device=q.device)
        masks = _TileMasks(layout, q.device)
        for tiles in self._tiles(layout):
            for tile in tiles:
                n, e = tile.q_end - tile.q_begin, tile.k_end - tile.k_begin
                rows = slice(tile.q_begin, tile.q_end)
                # (kv_heads, group * n, d) @ (kv_heads, d, e): query head h = kv * group + g
                query = qh[:, rows].reshape(kv_heads, group * n, head_dim)
                scores = torch.matmul(query, kh[:, tile.k_begin:tile.k_end].transpose(1, 2)) * softmax_scale
                scores = scores.view(heads, n, e)
                if tile.needs_mask:
                    scores = scores.masked_fill(~masks.visible(tile), float("-inf"))
                old_lse = lse[:, rows]
                new_max = torch.maximum(old_lse, scores.amax(dim=-1))             # (heads, n)
                safe_max = torch.where(torch.isinf(new_max), torch.zeros_like(new_max), new_max)
                probabilities = torch.exp(scores - safe_max[..., None])          # (heads, n, e); 0 where masked
                old_weight = torch.exp(old_lse - safe_max)                       # 0 where old_lse = -inf
                partial = torch.matmul(probabilities.view(kv_heads, group * n, e), vh[:, tile.k_begin:tile.k_end])
                # out holds the normalised output of the keys seen so far: rescale and add
                total = old_weight + probabilities.sum(dim=-1)                   # (heads, n), softmax mass / exp(max)
                safe_total = torch.where(total > 0, total, torch.ones_like(total))
                out[:, rows] = (out[:, rows] * old_weight[..., None] + partial.view(heads, n, head_dim)) \
                    / safe_total[..., None]
                lse[:, rows] = torch.where(total > 0, safe_max + torch.log(safe_total), old_lse)
        return out.permute(1, 0, 2).to(q.dtype).contiguous(), lse

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, layout: VarlenLayout,
                 softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_inputs(q, k, v, layout)
        if out.shape != q.shape or grad_out.shape != q.shape or lse.shape != (q.shape[1], q.shape[0]):
            raise ValueError(f"backward: out {tuple(out.shape)} and grad_out {tuple(grad_out.shape)} must be q's shape "
                             f"{tuple(q.shape)} and lse {tuple(lse.shape)} (heads, T_q) = {(q.shape[1], q.shape[0])}")
        heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
        group = heads // kv_heads
        qh, kh, vh = self._prepare(q, k, v)
        dtype = qh.dtype
        grad_outh = grad_out.permute(1, 0, 2).to(dtype).contiguous()               # (heads, T_q, d)
        delta = (grad_outh * out.permute(1, 0, 2).to(dtype)).sum(dim=-1)            # (heads, T_q)
        lse = lse.to(dtype)
        safe_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        dq, dk, dv = torch.zeros_like(qh), torch.zeros_like(kh), torch.zeros_like(vh)
        masks = _TileMasks(layout, q.device)
        for tiles in self._tiles(layout):
            for tile in tiles:
                n, e = tile.q_end - tile.q_begin, tile.k_end - tile.k_begin
                rows, keys = slice(tile.q_begin, tile.q_end), slice(tile.k_begin, tile.k_end)
                query = qh[:, rows].reshape(kv_heads, group * n, head_dim)
                grad = grad_outh[:, rows].reshape(kv_heads, group * n, head_dim)
                scores = torch.matmul(query, kh[:, keys].transpose(1, 2)).view(heads, n, e) * softmax_scale
                probabilities = torch.exp(scores - safe_lse[:, rows, None])      # P = exp(S - lse)
                if tile.needs_mask:
                    probabilities = probabilities.masked_fill(~masks.visible(tile), 0.0)
                flat_p = probabilities.view(kv_heads, group * n, e)
                dv[:, keys] += torch.matmul(flat_p.transpose(1, 2), grad)          # dV = P^T dO (summed over group)
                grad_p = torch.matmul(grad, vh[:, keys].transpose(1, 2)).view(heads, n, e)  # dP = dO V^T
                grad_s = (probabilities * (grad_p - delta[:, rows, None])).view(kv_heads, group * n, e)
                dq[:, rows] += torch.matmul(grad_s, kh[:, keys]).view(heads, n, head_dim) * softmax_scale
                dk[:, keys] += torch.matmul(grad_s.transpose(1, 2), query) * softmax_scale
        as_input = lambda x, like: x.permute(1, 0, 2).to(like.dtype).contiguous()  # noqa: E731
        return as_input(dq, q), as_input(dk, k), as_input(dv, v)


# Consecutive short documents of a query block share one masked tile while their keys span
# at most this many rows. Measured (4,096 tokens, 8 heads of 64, CPU, forward + backward):
# 1-token documents 1.14 s unmerged, 0.16 / 0.19 / 0.26 / 0.54 s merged up to 64 / 128 / 256
# / 512 keys; 32-token documents 0.10 s unmerged, 0.09 / 0.12 / 0.20 / 0.48 s: 128 keeps
# the wasted (cross-document) entries within 4x a pack's own squares, and few tiles.
MERGE_SPAN_TOKENS = 128


def _merge_tiles(tiles: List[_Tile], span_tokens: int) -> List[_Tile]:
    """Tiles of consecutive documents in one query block share a key range when their keys
    span at most ``span_tokens`` rows: a pack of one-token documents then runs a few matrix
    products, not one per document. The merged tile is masked; the pairs it adds cross
    documents and stay masked."""
    merged: List[_Tile] = []
    for tile in tiles:
        if merged:
            last = merged[-1]
            if tile.q_begin >= last.q_end and tile.k_end - last.k_begin <= span_tokens:
                merged[-1] = _Tile(last.q_begin, tile.q_end, last.k_begin, tile.k_end, True)
                continue
        merged.append(tile)
    return merged


class _TileMasks:
    """The visible-pair mask of a tile, from per-row document ids and positions."""

    def __init__(self, layout: VarlenLayout, device: torch.device) -> None:
        self.query_document, self.query_position, self.key_document, self.key_position = layout.position_tensors(device)

    def visible(self, tile: _Tile) -> torch.Tensor:
        """(n, e) bool: same document and key position <= query position."""
        rows, keys = slice(tile.q_begin, tile.q_end), slice(tile.k_begin, tile.k_end)
        return (self.query_document[rows, None] == self.key_document[None, keys]) & \
            (self.key_position[None, keys] <= self.query_position[rows, None])


# --------------------------------------------------------------------------------------
# flash-attn's varlen functions (CUDA, float16 / bfloat16), imported lazily
# --------------------------------------------------------------------------------------


class FlashAttentionKernel(AttentionKernel):
    """A thin adapter to flash-attn 2's varlen functions; CUDA tensors in float16 / bfloat16.

    flash-attn masks one of two ways per call, so a layout must be, for every document,
    either fully visible (its last key position <= its first query position: a ring step's
    earlier block) or causal aligned at the end (last query position == last key position:
    self-attention, the diagonal block, a chunk over keys [0, e)); anything else raises
    ValueError (use the blocked kernel). Needs a flash-attn whose varlen lse is (heads, T_q)
    (2.x since 2.4). Not exercised by the CPU tests: python/tests/gpu_check_kernels.py
    compares it with the blocked kernel where a GPU and flash-attn exist.
    """

    name = "flash_attn"

    def __init__(self) -> None:
        self._interface: Any = None

    def __repr__(self) -> str:
        return "FlashAttentionKernel()"

    @staticmethod
    def available() -> bool:
        try:
            import flash_attn.flash_attn_interface  # noqa: F401
        except ImportError:
            return False
        return torch.cuda.is_available()

    def _module(self) -> Any:
        if self._interface is None:
            try:
                import flash_attn.flash_attn_interface as interface
            except ImportError as error:
                raise ValueError(f"attention kernel 'flash_attn' needs the flash-attn package ({error}); use "
                                 "set_attention_kernel('blocked') or install flash-attn") from error
            self._interface = interface
        return self._interface

    @staticmethod
    def causal_flag(layout: VarlenLayout) -> bool:
        """True (causal, end-aligned) or False (fully visible) for the whole layout."""
        full, aligned = True, True
        for d in range(layout.documents):
            rows_q = layout.cu_seqlens_q[d + 1] - layout.cu_seqlens_q[d]
            rows_k = layout.cu_seqlens_k[d + 1] - layout.cu_seqlens_k[d]
            if rows_q == 0 or rows_k == 0:
                continue
            full = full and layout.key_offsets[d] + rows_k - 1 <= layout.query_offsets[d]
            aligned = aligned and layout.query_offsets[d] + rows_q == layout.key_offsets[d] + rows_k
        if full:
            return False
        if aligned:
            return True
        raise ValueError("attention kernel 'flash_attn': the layout mixes documents flash-attn cannot mask in one "
                         "call (each must be fully visible or causal with query and key positions ending together); "
                         "split the call per kind or use the 'blocked' kernel")

    def _check(self, q: torch.Tensor) -> None:
        if not q.is_cuda:
            raise ValueError(f"attention kernel 'flash_attn' runs on CUDA tensors; q is on {q.device}: "
                             "use the 'blocked' kernel (or 'auto') there")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"attention kernel 'flash_attn' takes float16 or bfloat16; q is {q.dtype}: cast it or "
                             "use the 'blocked' kernel")

    @staticmethod
    def _varlen_arguments(layout: VarlenLayout, device: torch.device) -> Tuple[torch.Tensor, torch.Tensor, int, int]:
        as_int32 = lambda xs: torch.tensor(xs, dtype=torch.int32, device=device)  # noqa: E731
        longest = lambda xs: max([e - b for b, e in zip(xs[:-1], xs[1:])] or [0])  # noqa: E731
        return (as_int32(layout.cu_seqlens_q), as_int32(layout.cu_seqlens_k), longest(layout.cu_seqlens_q),
                longest(layout.cu_seqlens_k))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        check_inputs(q, k, v, layout)
        self._check(q)
        causal = self.causal_flag(layout)
        cu_q, cu_k, max_q, max_k = self._varlen_arguments(layout, q.device)
        out, lse, _ = self._module().flash_attn_varlen_func(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p=0.0, softmax_scale=softmax_scale, causal=causal,
            return_attn_probs=True)
        if tuple(lse.shape) != (q.shape[1], q.shape[0]):
            raise RuntimeError(f"this flash-attn returns a varlen lse of shape {tuple(lse.shape)}, not (heads, T_q) = "
                               f"{(q.shape[1], q.shape[0])}: use flash-attn >= 2.4 or the 'blocked' kernel")
        return out, lse.float()

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, layout: VarlenLayout,
                 softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        check_inputs(q, k, v, layout)
        self._check(q)
        causal = self.causal_flag(layout)
        cu_q, cu_k, max_q, max_k = self._varlen_arguments(layout, q.device)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        backward = self._module()._flash_attn_varlen_backward
        # Its signature moved between flash-attn releases: pass what this one takes, by name.
        values = dict(dout=grad_out.contiguous(), q=q, k=k, v=v, out=out, softmax_lse=lse.float().contiguous(),
                      dq=dq, dk=dk, dv=dv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                      max_seqlen_k=max_k, dropout_p=0.0, softmax_scale=softmax_scale, causal=causal,
                      window_size=(-1, -1), window_size_left=-1, window_size_right=-1, softcap=0.0,
                      alibi_slopes=None, deterministic=False, rng_state=None)
        parameters = inspect.signature(backward).parameters
        backward(**{name: values[name] for name in parameters if name in values})
        return dq, dk, dv


class AutoAttentionKernel(AttentionKernel):
    """flash-attn where it applies (importable, CUDA, float16 / bfloat16, a layout it can
    mask), the blocked kernel everywhere else."""

    name = "auto"

    def __init__(self, block_tokens: int = 512) -> None:
        self.blocked = BlockedAttentionKernel(block_tokens)
        self.flash = FlashAttentionKernel()
        self._flash_available: Optional[bool] = None

    def __repr__(self) -> str:
        return f"AutoAttentionKernel(block_tokens={self.blocked.block_tokens})"

    def choose(self, q: torch.Tensor, layout: VarlenLayout) -> AttentionKernel:
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            return self.blocked
        if self._flash_available is None:
            self._flash_available = FlashAttentionKernel.available()
        if not self._flash_available:
            return self.blocked
        try:
            FlashAttentionKernel.causal_flag(layout)
        except ValueError:
            return self.blocked
        return self.flash

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        return self.choose(q, layout).forward(q, k, v, layout, softmax_scale)

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, layout: VarlenLayout,
                 softmax_scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.choose(q, layout).backward(q, k, v, out, lse, grad_out, layout, softmax_scale)


# --------------------------------------------------------------------------------------
# Choosing the kernel, and the differentiable call
# --------------------------------------------------------------------------------------

KERNEL_NAMES = ("blocked", "flash_attn", "auto")
KernelChoice = Union[str, AttentionKernel, Any]
_default_kernel: Any = BlockedAttentionKernel()


def get_attention_kernel(kernel: Optional[KernelChoice] = None) -> Any:
    """The kernel object for ``kernel``: None -> the default (``set_attention_kernel``), a
    name in KERNEL_NAMES -> a new kernel of that kind, an object with ``forward`` and
    ``backward`` -> itself."""
    if kernel is None:
        return _default_kernel
    if isinstance(kernel, str):
        if kernel == "blocked":
            return BlockedAttentionKernel()
        if kernel == "flash_attn":
            return FlashAttentionKernel()
        if kernel == "auto":
            return AutoAttentionKernel()
        raise ValueError(f"kernel must be one of {', '.join(KERNEL_NAMES)} or an object with forward and backward "
                         f"methods (AttentionKernel); got {kernel!r}")
    if callable(getattr(kernel, "forward", None)) and callable(getattr(kernel, "backward", None)):
        return kernel
    raise ValueError(f"kernel must be one of {', '.join(KERNEL_NAMES)} or an object with forward and backward "
                     f"methods (AttentionKernel); got {type(kernel).__name__}")


def set_attention_kernel(kernel: KernelChoice) -> Any:
    """Make ``kernel`` (a name in KERNEL_NAMES or a kernel object) the default of
    ``varlen_attention``, ``local_attention`` and ``attention``; returns the previous default
    (to restore it). Process-wide: set it once at start-up, the same on every rank."""
    global _default_kernel
    previous, _default_kernel = _default_kernel, get_attention_kernel(kernel)
    return previous


class _VarlenAttention(torch.autograd.Function):
    """Differentiable in q, k, v through the kernel's own backward (lse is not differentiable)."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout,
                softmax_scale: float, kernel: Any) -> Tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        out, lse = kernel.forward(q, k, v, layout, softmax_scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.layout, ctx.softmax_scale, ctx.kernel = layout, softmax_scale, kernel
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Optional[torch.Tensor]) -> Any:  # type: ignore[override]
        del grad_lse
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.kernel.backward(q, k, v, out, lse, grad_out.contiguous(), ctx.layout, ctx.softmax_scale)
        return dq, dk, dv, None, None, None


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: VarlenLayout, *,
                     softmax_scale: Optional[float] = None, kernel: Optional[KernelChoice] = None,
                     return_lse: bool = False) -> Any:
    """Masked attention of q over k, v as ``layout`` says, differentiable in q, k, v.

    Args:
        q: (T_q, heads, head_dim); k, v: (T_k, kv_heads, head_dim), kv_heads dividing heads.
        layout: the documents and positions (``VarlenLayout``).
        softmax_scale: default ``head_dim ** -0.5``.
        kernel: None (the default, ``set_attention_kernel``), a name or a kernel object.
        return_lse: also return lse (heads, T_q), float32; it carries no gradient.

    Returns:
        out (T_q, heads, head_dim) in q's dtype, or (out, lse) with ``return_lse``.
    """
    check_inputs(q, k, v, layout)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    out, lse = _VarlenAttention.apply(q, k, v, layout, scale, get_attention_kernel(kernel))
    return (out, lse) if return_lse else out
