"""ballast.torch in one process: the sampler's coverage, collate's tensors, empty
micro-batches, DataLoader integration, errors, lazy import of torch, and the attention
reference against a dense masked attention. The multi-process behaviour (attention
groups, remap, gradients) is in test_torch_distributed.py.
"""

from __future__ import annotations

import functools
import os
import pickle
import subprocess
import sys
from collections import defaultdict
from typing import Dict, List, Tuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ballast  # noqa: E402
import ballast.torch as bt  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)

WORLD_SIZE = 4
CONFIG = tt.TinyConfig()
PLANNING_MODEL = tt.planning_model(CONFIG, 120_000)
# strategy, activation memory per rank (tokens): 512 forces several micro-batches and, for
# hybrid-dp, ranks without tokens in a micro-batch.
CASES = [("packed-dp", 2048), ("static-cp:degree=4", 2048), ("zeppelin:remap=on", 512), ("hybrid-dp", 512),
         ("flexsp-fast", 2048)]


@pytest.fixture(scope="module")
def data() -> Tuple[np.ndarray, List[List[int]], tt.ByteDocuments]:
    lengths, batches = tt.sample_documents(3, 2048, seed=0)
    return lengths, batches, tt.ByteDocuments(lengths, seed=0)


def cluster(rank_tokens: int, world_size: int = WORLD_SIZE) -> ballast.Cluster:
    return tt.emulated_cluster(world_size, 2, rank_tokens, PLANNING_MODEL)


def samplers(lengths, batches, strategy: str, rank_tokens: int) -> List[bt.BalancedBatchSampler]:
    return [bt.BalancedBatchSampler(lengths, batches, rank=r, world_size=WORLD_SIZE, cluster=cluster(rank_tokens),
                                    model=PLANNING_MODEL, strategy=strategy) for r in range(WORLD_SIZE)]


def all_batches(data, strategy: str, rank_tokens: int) -> List[List[bt.PackedBatch]]:
    """batches[rank] = that rank's PackedBatch list, through a DataLoader (num_workers=0)."""
    lengths, batches, documents = data
    out = []
    for sampler in samplers(lengths, batches, strategy, rank_tokens):
        loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler, collate_fn=bt.collate)
        out.append(list(loader))
    return out


@pytest.mark.parametrize("strategy,rank_tokens", CASES)
def test_every_token_once_and_ranks_in_step(data, strategy: str, rank_tokens: int) -> None:
    lengths, batches, _ = data
    per_rank = [list(s) for s in samplers(lengths, batches, strategy, rank_tokens)]
    assert len({len(items) for items in per_rank}) == 1  # every rank yields as many items
    for items in zip(*per_rank):
        headers = [item[0] for item in items]
        assert all(isinstance(h, bt.MicroBatchHeader) for h in headers)
        assert len({(h.step_info.step, h.micro_batch) for h in headers}) == 1
        assert [h.rank for h in headers] == list(range(WORLD_SIZE))
    covered: Dict[Tuple[int, int], List[Tuple[int, int]]] = defaultdict(list)
    steps = set()
    for rank, items in enumerate(per_rank):
        for item in items:
            header, pieces = item[0], item[1:]
            info = header.step_info
            steps.add(info.step)
            view = info.micro_batch_view(header.micro_batch, rank)
            assert [(p.sequence_id, p.begin, p.end) for p in pieces] == [(r.sequence_id, r.begin, r.end)
                                                                         for r in view.linear]
            for p in pieces:
                assert p.dataset_index == batches[info.step][p.sequence_id]
                assert p.length == lengths[p.dataset_index] and 0 <= p.begin < p.end <= p.length
                assert p.micro_batch == header.micro_batch and p.step_info is info
                covered[(info.step, p.dataset_index)].append((p.begin, p.end))
    assert steps == set(range(len(batches)))
    for step, batch in enumerate(batches):
        for index in batch:
            ranges = sorted(covered.pop((step, index)))
            assert ranges[0][0] == 0 and ranges[-1][1] == lengths[index]
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges  # no gap, no overlap
    assert not covered


@pytest.mark.parametrize("strategy,rank_tokens", CASES)
def test_collate_tensors(data, strategy: str, rank_tokens: int) -> None:
    lengths, batches, documents = data
    per_rank = all_batches(data, strategy, rank_tokens)
    weight_sums: Dict[int, float] = defaultdict(float)
    split_labels = 0
    for rank, packed_list in enumerate(per_rank):
        for batch in packed_list:
            assert batch.rank == rank and batch.world_size == WORLD_SIZE
            assert batch.plan is batch.step_info.plan and batch.num_micro_batches == batch.plan.num_micro_batches
            tokens = batch.num_tokens
            assert batch.input_ids.dtype == torch.long and batch.labels.dtype == torch.long
            assert batch.position_ids.dtype == torch.long and batch.cu_seqlens.dtype == torch.int32
            assert batch.loss_weight.dtype == torch.float32
            assert batch.labels.shape == batch.position_ids.shape == batch.loss_weight.shape == (tokens,)
            sizes = [p.end - p.begin for p in batch.pieces]
            assert batch.cu_seqlens.tolist() == [0] + list(np.cumsum(sizes))
            assert batch.max_seqlen == max(sizes, default=0)
            assert batch.sequence_ids.tolist() == [p.sequence_id for p in batch.pieces]
            for piece, begin, end in zip(batch.pieces, batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist()):
                document = documents[piece.dataset_index]
                assert torch.equal(batch.input_ids[begin:end], document[piece.begin:piece.end])
                assert batch.position_ids[begin:end].tolist() == list(range(piece.begin, piece.end))
                expected = torch.full((end - begin,), bt.IGNORE_INDEX)
                next_tokens = document[piece.begin + 1:piece.end + 1]
                expected[:len(next_tokens)] = next_tokens
                assert torch.equal(batch.labels[begin:end], expected)
                if piece.end < piece.length:  # the next token lives in the next piece, maybe on another rank
                    assert batch.labels[end - 1] == document[piece.end]
                    split_labels += 1
            has_label = batch.labels != bt.IGNORE_INDEX
            assert torch.all((batch.loss_weight > 0) == has_label)
            assert torch.allclose(batch.loss_weight[has_label], torch.tensor(1.0 / batch.global_targets))
            weight_sums[batch.step_info.step] += float(batch.loss_weight.double().sum())
            assert batch.global_targets == int(sum(lengths[i] - 1 for i in batches[batch.step_info.step]))
    for step in range(len(batches)):  # over every rank and micro-batch: the mean loss's weights
        assert weight_sums[step] == pytest.approx(1.0, abs=1e-6)
    if strategy != "packed-dp":
        assert split_labels > 0  # these plans split documents


def test_empty_micro_batch(data) -> None:
    per_rank = all_batches(data, "hybrid-dp", 512)
    empty = [b for batches in per_rank for b in batches if b.num_tokens == 0]
    assert empty, "hybrid-dp with 512-token ranks leaves a rank without tokens on these batches"
    batch = empty[0]
    assert batch.input_ids.dtype == torch.long and batch.input_ids.shape == (0,)
    assert batch.labels.shape == batch.position_ids.shape == batch.loss_weight.shape == (0,)
    assert batch.cu_seqlens.tolist() == [0] and batch.max_seqlen == 0 and batch.pieces == ()
    assert batch.plan is not None and 0 <= batch.micro_batch < batch.num_micro_batches
    # the model runs on it (the rank must join the step's collectives) and gives no gradient
    # (all_reduce_gradients counts a missing one as zero)
    torch.manual_seed(0)
    model = tt.TinyTransformer(CONFIG)
    logits = model(batch.input_ids, batch.position_ids, tt.local_attend(batch.cu_seqlens))
    (tt.token_losses(logits, batch.labels) * batch.loss_weight).sum().backward()
    assert logits.shape == (0, CONFIG.vocab)
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0 for p in model.parameters())
    # collate of a header alone (what PieceDataset returns for an empty item)
    header = bt.MicroBatchHeader(batch.step_info, batch.micro_batch, batch.rank, WORLD_SIZE)
    alone = bt.collate([header])
    assert alone.num_tokens == 0 and alone.cu_seqlens.tolist() == [0] and alone.micro_batch == batch.micro_batch


def test_dataloader_workers_and_pickling(data) -> None:
    lengths, batches, documents = data
    results = []
    for workers in (0, 2):
        sampler = bt.BalancedBatchSampler(lengths, batches, rank=1, world_size=WORLD_SIZE, cluster=cluster(512),
                                          model=PLANNING_MODEL, strategy="zeppelin:remap=on")
        loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler, num_workers=workers,
                                             collate_fn=functools.partial(bt.collate, loss_scale=WORLD_SIZE))
        results.append(list(loader))
        assert len(loader) == len(results[-1])  # batches is a list: the micro-batch count is known
    for a, b in zip(*results):
        for field in ("input_ids", "labels", "position_ids", "cu_seqlens", "loss_weight", "sequence_ids"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert a.plan == b.plan and a.micro_batch == b.micro_batch and a.pieces == b.pieces
        assert a.remapped == b.remapped
    # loss_scale multiplies the weights (world_size under DDP, which averages gradients)
    for b in results[0]:
        labelled = b.labels != bt.IGNORE_INDEX
        assert torch.allclose(b.loss_weight[labelled], torch.tensor(WORLD_SIZE / b.global_targets))
    info = results[0][0].step_info
    copy = pickle.loads(pickle.dumps(info))
    assert copy.plan == info.plan and copy.indices == info.indices and copy.global_targets == info.global_targets


def test_sampler_len_last_plan_and_random_batches(data) -> None:
    lengths, batches, _ = data
    sampler = samplers(lengths, batches, "zeppelin:remap=on", 512)[0]
    assert sampler.last_plan is None
    items = list(sampler)
    assert len(sampler) == len(items) == sum(sampler.plan_batch(b).num_micro_batches for b in batches)
    assert sampler.last_plan is not None and sampler.last_plan.num_micro_batches == items[-1][0].step_info.num_micro_batches
    # a random BatchSampler: same seed on every rank gives the same global batches
    generator = torch.Generator().manual_seed(3)
    random_batches = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(range(len(lengths)),
                                                                                    generator=generator), 16, False)
    random_sampler = bt.BalancedBatchSampler(lengths, random_batches, rank=0, world_size=WORLD_SIZE,
                                             cluster=cluster(2048), model=PLANNING_MODEL, strategy="packed-dp")
    with pytest.raises(TypeError, match="list"):
        len(random_sampler)
    assert sum(len(item) - 1 for item in random_sampler) > 0


def test_errors(data) -> None:
    lengths, batches, documents = data
    with pytest.raises(ValueError, match=r"has 16 GPUs .* world_size is 4.*nodes="):
        bt.BalancedBatchSampler(lengths, batches, rank=0, world_size=4, cluster="h100", nodes=2)
    with pytest.raises(ValueError, match="rank 4 is not in a world of 4"):
        bt.BalancedBatchSampler(lengths, batches, rank=4, world_size=4, cluster=cluster(512))
    with pytest.raises(ValueError):
        bt.BalancedBatchSampler(lengths, batches, rank=0, world_size=4, cluster=cluster(512), strategy="nope")
    with pytest.raises(ValueError, match="index 99999 is outside"):
        list(bt.BalancedBatchSampler(lengths, [[0, 99999]], rank=0, world_size=4, cluster=cluster(512),
                                     model=PLANNING_MODEL))
    with pytest.raises(ballast.PlanningError, match="global batch 0: packed-dp cannot run"):
        list(bt.BalancedBatchSampler(lengths, batches, rank=0, world_size=4, cluster=cluster(256),
                                     model=PLANNING_MODEL, strategy="packed-dp"))
    with pytest.raises(ValueError, match="collate expects"):
        bt.collate([])
    item = next(iter(bt.BalancedBatchSampler(lengths, batches, rank=0, world_size=4, cluster=cluster(2048),
                                             model=PLANNING_MODEL, strategy="packed-dp")))
    samples = [bt.PieceDataset(documents)[x] for x in item]
    assert bt.collate(samples, loss_scale=np.int64(4)).loss_weight.sum() > 0
    for wrong in (0, -4, float("nan"), float("inf"), True, "4"):
        with pytest.raises(ValueError, match=r"loss_scale must be a positive finite number \(1 when .* summed .* "
                                             r"world size under DistributedDataParallel\); got"):
            bt.collate(samples, loss_scale=wrong)
    wrong_lengths = lengths.copy()
    wrong_lengths[batches[0]] += 1  # every document of the first batch
    sampler = bt.BalancedBatchSampler(wrong_lengths, batches, rank=0, world_size=4, cluster=cluster(2048),
                                      model=PLANNING_MODEL, strategy="packed-dp")
    item = next(iter(sampler))
    with pytest.raises(ValueError, match="lengths say"):
        [bt.PieceDataset(documents)[x] for x in item]
    groups = bt.ProcessGroups()
    with pytest.raises(KeyError, match="ensure"):
        groups.get([0, 1])


def test_import_ballast_does_not_import_torch(tmp_path) -> None:
    code = "import sys, ballast; ballast.plan([100, 200], cluster='h100', nodes=1); assert 'torch' not in sys.modules"
    # cwd outside the source tree: `python -c` puts the cwd first on sys.path
    subprocess.run([sys.executable, "-c", code], check=True, env=dict(os.environ), cwd=tmp_path)


def _dense_reference(q, k, v, cu_seqlens):
    """softmax(q k^T / sqrt(d) + mask) v with one block-diagonal causal mask over all tokens."""
    tokens, heads, dim = q.shape
    document = torch.zeros(tokens, dtype=torch.long)
    for i, (b, e) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist())):
        document[b:e] = i
    k = k.repeat_interleave(heads // k.shape[1], dim=1)
    v = v.repeat_interleave(heads // v.shape[1], dim=1)
    allowed = (document[:, None] == document[None, :]) & (torch.arange(tokens)[None, :] <= torch.arange(tokens)[:, None])
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / dim ** 0.5
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.double())


def test_local_attention_matches_dense_reference() -> None:
    torch.manual_seed(0)
    cu_seqlens = torch.tensor([0, 1, 17, 60, 61, 100], dtype=torch.int32)
    q = torch.randn(100, 4, 16)
    k, v = torch.randn(100, 2, 16), torch.randn(100, 2, 16)
    out = bt.local_attention(q, k, v, cu_seqlens)
    assert torch.allclose(out.double(), _dense_reference(q, k, v, cu_seqlens), atol=1e-5)
    with pytest.raises(ValueError, match="multiple"):
        bt.local_attention(q, torch.randn(100, 3, 16), torch.randn(100, 3, 16), cu_seqlens)


def test_planned_attention_single_rank_equals_local(data) -> None:
    """A one-rank plan: attention() over its local groups equals local_attention, values and
    gradients; remap is the identity (no process group needed)."""
    lengths, batches, documents = data
    one_rank = tt.emulated_cluster(1, 1, 4096, PLANNING_MODEL)
    sampler = bt.BalancedBatchSampler(lengths, batches[:1], rank=0, world_size=1, cluster=one_rank,
                                      model=PLANNING_MODEL, strategy="packed-dp")
    [batch] = list(torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler,
                                               collate_fn=bt.collate))
    assert not batch.remapped and batch.attention_tokens == batch.num_tokens
    torch.manual_seed(1)
    q = torch.randn(batch.num_tokens, 4, 16, requires_grad=True)
    k = torch.randn(batch.num_tokens, 2, 16, requires_grad=True)
    v = torch.randn(batch.num_tokens, 2, 16, requires_grad=True)
    assert bt.remap(q, batch, None) is q
    planned = bt.attention(q, k, v, batch, None)
    grads = torch.autograd.grad(planned.square().sum(), [q, k, v])
    local = bt.local_attention(q, k, v, batch.cu_seqlens)
    local_grads = torch.autograd.grad(local.square().sum(), [q, k, v])
    assert torch.allclose(planned, local, atol=1e-6)
    for a, b in zip(grads, local_grads):
        assert torch.allclose(a, b, atol=1e-5)
    with pytest.raises(ValueError, match="rows"):
        bt.attention(q[:-1], k[:-1], v[:-1], batch, None)
