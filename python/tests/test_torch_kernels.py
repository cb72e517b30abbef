"""ballast.torch's attention kernels (python/ballast/_torch_kernels.py) against the float64
dense reference: forward out / lse and backward dq / dk / dv of the blocked kernel on random
varlen packs (one-token documents, lengths off the block size, GQA and MHA, ring-block
offsets), the merge of partial results, planted bugs the comparison must catch, the tiles a
pack of short documents costs, a memory bound for a 16K-token document, and the errors."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional, Sequence, Tuple

import pytest

torch = pytest.importorskip("torch")
import ballast.torch as bt  # noqa: E402
from ballast import _torch_kernels as kernels  # noqa: E402

FP32_TOLERANCE = 1e-5
# bfloat16 inputs keep 8 mantissa bits (relative rounding 2^-9 = 2e-3); outputs are rounded
# to bfloat16 too, and the gradients sum a few hundred rounded terms. Measured worst errors
# on this case: out 7.1e-3, lse 7.6e-7, dq/dk/dv 1.5e-2 (unit-variance inputs, head_dim 16).
BF16_OUT_TOLERANCE = 2e-2
BF16_GRAD_TOLERANCE = 5e-2


def _bounds(lengths: Sequence[int]) -> List[int]:
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + int(n))
    return bounds


def _case(query_lengths: Sequence[int], key_lengths: Sequence[int], query_offsets: Optional[Sequence[int]],
          key_offsets: Optional[Sequence[int]], heads: int, kv_heads: int, head_dim: int = 16, seed: int = 0,
          dtype: torch.dtype = torch.float32):
    generator = torch.Generator().manual_seed(seed)
    layout = bt.VarlenLayout(_bounds(query_lengths), _bounds(key_lengths), query_offsets, key_offsets)
    randn = lambda *shape: torch.randn(*shape, generator=generator).to(dtype)  # noqa: E731
    q = randn(layout.query_tokens, heads, head_dim)
    k, v = randn(layout.key_tokens, kv_heads, head_dim), randn(layout.key_tokens, kv_heads, head_dim)
    grad_out = randn(layout.query_tokens, heads, head_dim)
    return q, k, v, grad_out, layout


def _errors(kernel, q, k, v, grad_out, layout, scale: float = 0.3) -> Tuple[float, float, float, bool]:
    """Worst |kernel - reference| of out, lse (finite entries) and dq / dk / dv; whether the
    kernel's lse is -inf exactly where the reference's is (queries that see no key)."""
    out, lse = kernel.forward(q, k, v, layout, scale)
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[1], q.shape[0])
    grads = kernel.backward(q, k, v, out, lse, grad_out, layout, scale)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference_out, reference_lse = bt.dense_attention_reference(*leaves, layout, scale)
    reference_grads = torch.autograd.grad(reference_out, leaves, grad_out.double())
    finite = torch.isfinite(reference_lse)
    out_error = (out.double() - reference_out).abs().max().item() if out.numel() else 0.0
    lse_error = (lse.double()[finite] - reference_lse[finite]).abs().max().item() if finite.any() else 0.0
    grad_error = max([(g.double() - r).abs().max().item() for g, r in zip(grads, reference_grads) if g.numel()] or [0.0])
    same_empty_rows = bool(torch.equal(torch.isinf(lse), torch.isinf(reference_lse)))
    return out_error, lse_error, grad_error, same_empty_rows


# (query lengths, key lengths, query offsets, key offsets, heads, kv_heads): None offsets =
# self-attention of each document (0, 0).
SELF_ATTENTION = [
    ([1, 1, 1, 1, 1], None, 4, 4),                        # one-token documents only
    ([1, 37, 100, 1, 64, 3], None, 8, 2),                 # GQA 8/2, lengths off the block size
    ([130, 1, 77], None, 4, 4),                           # MHA
    ([300], None, 6, 3),                                  # one document over many blocks
    ([0, 5, 0, 9], None, 4, 2),                           # empty documents in the pack
]
BLOCKS = [(16, 8), (7, 5), (512, 512)]  # (block_tokens, query_block_tokens)


@pytest.mark.parametrize("block_tokens,query_block_tokens", BLOCKS)
@pytest.mark.parametrize("lengths,_unused,heads,kv_heads", SELF_ATTENTION)
def test_blocked_kernel_matches_the_dense_reference_on_packs(lengths, _unused, heads, kv_heads, block_tokens,
                                                             query_block_tokens) -> None:
    q, k, v, grad_out, layout = _case(lengths, lengths, None, None, heads, kv_heads, seed=len(lengths))
    kernel = bt.BlockedAttentionKernel(block_tokens, query_block_tokens)
    out_error, lse_error, grad_error, same_empty_rows = _errors(kernel, q, k, v, grad_out, layout)
    assert out_error <= FP32_TOLERANCE and lse_error <= FP32_TOLERANCE and grad_error <= FP32_TOLERANCE
    assert same_empty_rows


def _ring_case(seed: int, heads: int, kv_heads: int):
    """Per document: queries at positions [b, e) over keys [0, b) (an earlier ring block,
    every key visible) or over keys [b, e) (the diagonal block) or keys [0, e) (all-gather)."""
    generator = torch.Generator().manual_seed(seed)
    documents = []
    for _ in range(6):
        length = int(torch.randint(2, 90, (1,), generator=generator))
        begin = int(torch.randint(1, length, (1,), generator=generator))
        documents.append((length, begin))
    return documents


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (4, 4)])
@pytest.mark.parametrize("kind", ["earlier", "diagonal", "gathered", "future"])
def test_blocked_kernel_with_ring_block_offsets(kind: str, heads: int, kv_heads: int) -> None:
    documents = _ring_case(7, heads, kv_heads)
    query_lengths = [length - begin for length, begin in documents]
    query_offsets = [begin for _, begin in documents]
    if kind == "earlier":      # keys [0, b): every pair visible
        key_lengths, key_offsets = [begin for _, begin in documents], [0] * len(documents)
    elif kind == "diagonal":   # keys [b, e): causal
        key_lengths, key_offsets = query_lengths, query_offsets
    elif kind == "gathered":   # keys [0, e)
        key_lengths, key_offsets = [length for length, _ in documents], [0] * len(documents)
    else:                      # queries [0, b) over keys [b, e): nothing visible, lse -inf, out 0
        query_lengths, query_offsets = [begin for _, begin in documents], [0] * len(documents)
        key_lengths, key_offsets = [length - begin for length, begin in documents], [begin for _, begin in documents]
    q, k, v, grad_out, layout = _case(query_lengths, key_lengths, query_offsets, key_offsets, heads, kv_heads)
    for block_tokens, query_block_tokens in BLOCKS:
        kernel = bt.BlockedAttentionKernel(block_tokens, query_block_tokens)
        out_error, lse_error, grad_error, same_empty_rows = _errors(kernel, q, k, v, grad_out, layout)
        assert out_error <= FP32_TOLERANCE and lse_error <= FP32_TOLERANCE and grad_error <= FP32_TOLERANCE
        assert same_empty_rows
    if kind == "future":
        out, lse = bt.BlockedAttentionKernel(16, 8).forward(q, k, v, layout, 0.3)
        assert torch.isinf(lse).all() and (lse < 0).all() and not out.abs().max().item()


def test_bfloat16_inputs_accumulate_in_float32() -> None:
    q, k, v, grad_out, layout = _case([1, 37, 100, 64], [1, 37, 100, 64], None, None, 8, 2, dtype=torch.bfloat16)
    kernel = bt.BlockedAttentionKernel(16, 8)
    out, lse = kernel.forward(q, k, v, layout, 0.3)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert all(g.dtype == torch.bfloat16 for g in kernel.backward(q, k, v, out, lse, grad_out, layout, 0.3))
    out_error, lse_error, grad_error, same_empty_rows = _errors(kernel, q, k, v, grad_out, layout)
    print(f"bfloat16: out {out_error:.2e}, lse {lse_error:.2e}, gradients {grad_error:.2e}")
    assert out_error <= BF16_OUT_TOLERANCE and lse_error <= BF16_OUT_TOLERANCE and grad_error <= BF16_GRAD_TOLERANCE


def test_merging_two_key_halves_equals_the_whole() -> None:
    """Queries [b, e) of each document: keys [0, b) then keys [b, e), merged == keys [0, e)."""
    documents = _ring_case(11, 8, 2)
    query_lengths = [length - begin for length, begin in documents]
    query_offsets = [begin for _, begin in documents]
    q, k_all, v_all, _, whole = _case(query_lengths, [length for length, _ in documents], query_offsets,
                                      [0] * len(documents), 8, 2, seed=3)
    earlier_rows = torch.cat([torch.arange(start, start + begin)
                              for start, (_, begin) in zip(whole.cu_seqlens_k[:-1], documents)])
    diagonal_rows = torch.cat([torch.arange(start + begin, start + length)
                               for start, (length, begin) in zip(whole.cu_seqlens_k[:-1], documents)])
    earlier = bt.VarlenLayout(whole.cu_seqlens_q, _bounds([b for _, b in documents]), query_offsets,
                              [0] * len(documents))
    diagonal = bt.VarlenLayout(whole.cu_seqlens_q, whole.cu_seqlens_q, query_offsets, query_offsets)
    kernel = bt.BlockedAttentionKernel(16, 8)
    out_a, lse_a = kernel.forward(q, k_all[earlier_rows], v_all[earlier_rows], earlier, 0.3)
    out_b, lse_b = kernel.forward(q, k_all[diagonal_rows], v_all[diagonal_rows], diagonal, 0.3)
    out, lse = kernel.forward(q, k_all, v_all, whole, 0.3)
    merged_out, merged_lse = bt.merge_attention(out_a, lse_a, out_b, lse_b)
    assert (merged_out - out).abs().max().item() <= FP32_TOLERANCE
    assert (merged_lse - lse).abs().max().item() <= FP32_TOLERANCE
    # a side that sees nothing (lse -inf) leaves the other side's result as it is
    nothing = torch.full_like(lse_a, float("-inf"))
    kept_out, kept_lse = bt.merge_attention(out_a, lse_a, torch.zeros_like(out_a), nothing)
    assert torch.equal(kept_out, out_a) and torch.equal(kept_lse, lse_a)
    # each half alone is not the whole: the merge is doing the work
    assert (out_a - out).abs().max().item() > 1e-2 and (out_b - out).abs().max().item() > 1e-2
    with pytest.raises(ValueError, match="lse_a"):
        bt.merge_attention(out_a, lse_a.t(), out_b, lse_b)


# --------------------------------------------------------------------------------------
# Planted bugs: the comparison above must catch each of them
# --------------------------------------------------------------------------------------


def _off_by_one_mask(self, tile):  # key position < query position: the diagonal goes missing
    rows, keys = slice(tile.q_begin, tile.q_end), slice(tile.k_begin, tile.k_end)
    return (self.query_document[rows, None] == self.key_document[None, keys]) & \
        (self.key_position[None, keys] < self.query_position[rows, None])


def _ignores_documents_mask(self, tile):  # attends across document boundaries
    rows, keys = slice(tile.q_begin, tile.q_end), slice(tile.k_begin, tile.k_end)
    return self.key_position[None, keys] <= self.query_position[rows, None]


def _drop_last_key_block(tiles_of, self, layout):  # skips one key block too many
    return [blocks[:-1] if len(blocks) > 1 else blocks for blocks in tiles_of(self, layout)]


def _never_mask(tiles_of, self, layout):  # treats the diagonal tiles as fully visible
    return [[kernels._Tile(t.q_begin, t.q_end, t.k_begin, t.k_end, False) for t in blocks]
            for blocks in tiles_of(self, layout)]


@pytest.mark.parametrize("bug", ["off_by_one_mask", "ignores_documents", "drops_a_key_block", "never_masks"])
def test_planted_bugs_fail_the_comparison(monkeypatch, bug: str) -> None:
    tiles_of = kernels.BlockedAttentionKernel._tiles
    if bug == "off_by_one_mask":
        monkeypatch.setattr(kernels._TileMasks, "visible", _off_by_one_mask)
    elif bug == "ignores_documents":
        monkeypatch.setattr(kernels._TileMasks, "visible", _ignores_documents_mask)
    elif bug == "drops_a_key_block":
        monkeypatch.setattr(kernels.BlockedAttentionKernel, "_tiles",
                            lambda self, layout: _drop_last_key_block(tiles_of, self, layout))
    else:
        monkeypatch.setattr(kernels.BlockedAttentionKernel, "_tiles",
                            lambda self, layout: _never_mask(tiles_of, self, layout))
    q, k, v, grad_out, layout = _case([2, 37, 100, 3, 64], [2, 37, 100, 3, 64], None, None, 8, 2)
    out_error, lse_error, grad_error, _ = _errors(bt.BlockedAttentionKernel(16, 8), q, k, v, grad_out, layout)
    assert max(out_error, lse_error) > 1e-2 and grad_error > 1e-2, (bug, out_error, lse_error, grad_error)


def test_a_backward_without_the_delta_term_fails(monkeypatch) -> None:
    """FlashAttention-2's dS = P * (dP - delta): dropping delta must show in dq and dk."""
    q, k, v, grad_out, layout = _case([37, 100], [37, 100], None, None, 4, 2)
    kernel = bt.BlockedAttentionKernel(16, 8)
    out, lse = kernel.forward(q, k, v, layout, 0.3)
    good = kernel.backward(q, k, v, out, lse, grad_out, layout, 0.3)
    bad = kernel.backward(q, k, v, torch.zeros_like(out), lse, grad_out, layout, 0.3)  # delta = rowsum(dO * 0) = 0
    assert (good[0] - bad[0]).abs().max().item() > 1e-2 and (good[1] - bad[1]).abs().max().item() > 1e-2
    assert torch.equal(good[2], bad[2])  # dV = P^T dO does not read delta


# --------------------------------------------------------------------------------------
# Cost: tiles skipped, memory bounded
# --------------------------------------------------------------------------------------


def _tile_area(kernel, layout) -> int:
    return sum((t.q_end - t.q_begin) * (t.k_end - t.k_begin) for blocks in kernel._tiles(layout) for t in blocks)


def test_short_documents_cost_about_what_varlen_costs() -> None:
    """Packs of short documents: the score entries computed (tile areas) stay within 4x the
    documents' own squares (merged tiles span at most MERGE_SPAN_TOKENS keys), far from the
    4096^2 of one matrix; one long document computes about half the square."""
    kernel = bt.BlockedAttentionKernel()
    for length in (1, 32, 100):
        lengths = [length] * (4096 // length)
        squares = sum(n * n for n in lengths)
        visible_pairs = sum(n * (n + 1) // 2 for n in lengths)
        area = _tile_area(kernel, bt.VarlenLayout.causal(_bounds(lengths)))
        assert visible_pairs <= area <= 4 * squares + 4096 * kernels.MERGE_SPAN_TOKENS, (length, area, squares)
    one_document = bt.VarlenLayout.causal([0, 4096])  # causal: about half the square plus the diagonal blocks
    assert _tile_area(kernel, one_document) <= 4096 * 4096 // 2 + 4096 * 512
    future = bt.VarlenLayout([0, 100], [0, 100], [0], [100])  # keys all after the queries: no tile at all
    assert _tile_area(kernel, future) == 0


MEMORY_SCRIPT = r"""
import os, threading, time, torch
import ballast.torch as bt

def resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

tokens, heads, head_dim = 16384, 2, 16
q, k, v = (torch.randn(tokens, heads, head_dim, requires_grad=True) for _ in range(3))
layout = bt.VarlenLayout.causal([0, tokens])
small = bt.VarlenLayout.causal([0, 600])
bt.varlen_attention(q[:600], k[:600], v[:600], small).sum().backward()  # warm up
peak = baseline = resident_bytes()
running = True
def sample():
    global peak
    while running:
        peak = max(peak, resident_bytes())
        time.sleep(0.0002)
sampler = threading.Thread(target=sample)
sampler.start()
out = bt.varlen_attention(q, k, v, layout)
out.backward(torch.ones_like(out))
running = False
sampler.join()
print(max(peak, resident_bytes()) - baseline)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc/self/statm (Linux)")
def test_a_16k_token_document_stays_far_below_the_score_matrix() -> None:
    """Peak resident memory above the start (a thread samples /proc/self/statm every 0.2 ms,
    in a fresh process) of one forward + backward over a 16,384-token document, 2 heads of
    16, float32: the dense score matrix alone would be 2 x 16384^2 x 4 B = 2 GiB (the
    softmax and its gradient as much again); the blocked kernel holds float32 copies of q,
    k, v, out and their gradients (2 MiB each) plus a few 512 x 512 tiles: measured 50-55 MiB."""
    dense_bytes = 2 * 16384 * 16384 * 4
    environment = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT], capture_output=True, text=True,
                            env=environment, timeout=300)
    assert result.returncode == 0, result.stderr
    peak_growth_bytes = int(result.stdout.split()[-1])
    print(f"16K-token forward + backward: peak RSS growth {peak_growth_bytes / 2**20:.1f} MiB, dense scores "
          f"{dense_bytes / 2**20:.0f} MiB")
    assert 0 < peak_growth_bytes < dense_bytes / 16


# --------------------------------------------------------------------------------------
# Wiring: the differentiable call, the kernel choice, the errors
# --------------------------------------------------------------------------------------


def test_varlen_attention_autograd_and_the_kernel_choice() -> None:
    q, k, v, grad_out, layout = _case([1, 37, 100], [1, 37, 100], None, None, 8, 2)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse = bt.varlen_attention(*leaves, layout, softmax_scale=0.3, return_lse=True)
    assert not lse.requires_grad
    grads = torch.autograd.grad(out, leaves, grad_out)
    reference = [t.double().requires_grad_() for t in (q, k, v)]
    reference_out, _ = bt.dense_attention_reference(*reference, layout, 0.3)
    reference_grads = torch.autograd.grad(reference_out, reference, grad_out.double())
    assert (out.double() - reference_out).abs().max().item() <= FP32_TOLERANCE
    for g, r in zip(grads, reference_grads):
        assert (g.double() - r).abs().max().item() <= FP32_TOLERANCE

    class Counting(bt.BlockedAttentionKernel):
        calls = 0

        def forward(self, *args):
            Counting.calls += 1
            return super().forward(*args)

    previous = bt.set_attention_kernel(Counting(64))
    try:
        cu_seqlens = torch.tensor(layout.cu_seqlens_q, dtype=torch.int32)
        local = bt.local_attention(q, k, v, cu_seqlens, softmax_scale=0.3)
        assert Counting.calls == 1 and (local - out.detach()).abs().max().item() <= 1e-6  # other block size
        bt.local_attention(q, k, v, cu_seqlens, kernel="blocked")
        assert Counting.calls == 1  # an explicit kernel wins over the default
    finally:
        bt.set_attention_kernel(previous)
    assert bt.get_attention_kernel() is previous


def test_bad_input_is_named() -> None:
    q, k, v, grad_out, layout = _case([5, 9], [5, 9], None, None, 4, 2)
    kernel = bt.BlockedAttentionKernel()
    with pytest.raises(ValueError, match="q must be"):
        kernel.forward(q[0], k, v, layout, 0.3)
    with pytest.raises(ValueError, match="kv_heads 3 must divide q's heads 4"):
        kernel.forward(q, torch.randn(14, 3, 16), torch.randn(14, 3, 16), layout, 0.3)
    with pytest.raises(ValueError, match="share a dtype"):
        kernel.forward(q, k.double(), v.double(), layout, 0.3)
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        kernel.forward(q[:-1], k, v, layout, 0.3)
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        bt.VarlenLayout([1, 5])
    with pytest.raises(ValueError, match="same documents"):
        bt.VarlenLayout([0, 5], [0, 2, 5])
    with pytest.raises(ValueError, match="query_offsets"):
        bt.VarlenLayout([0, 5], None, [0, 0])
    with pytest.raises(ValueError, match="block_tokens"):
        bt.BlockedAttentionKernel(0)
    with pytest.raises(ValueError, match="blocked, flash_attn, auto"):
        bt.set_attention_kernel("flash")
    with pytest.raises(ValueError, match="runs on CUDA"):
        bt.FlashAttentionKernel().forward(q, k, v, layout, 0.3)
    with pytest.raises(ValueError, match="cannot mask"):
        bt.FlashAttentionKernel.causal_flag(bt.VarlenLayout([0, 4, 8], [0, 4, 8], [4, 0], [0, 0]))
    assert bt.FlashAttentionKernel.causal_flag(layout) is True
    assert bt.FlashAttentionKernel.causal_flag(bt.VarlenLayout([0, 4], [0, 4], [4], [0])) is False
    assert isinstance(bt.AutoAttentionKernel().choose(q, layout), bt.BlockedAttentionKernel)  # CPU
