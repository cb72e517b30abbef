"""ballast.torch under tensor parallelism: 4 gloo processes = 2 plan ranks (TP groups) x 2
TP members. Each member runs its half of the heads of one attention layer (a column-
parallel QKV projection, a row-parallel output projection: Megatron-LM's split), with the
plan's attention groups and remap among the processes of its TP index. The attention output
of every process, the loss and the gradients assembled over the TP members (shards side by
side, replicated weights as they are) must equal a single-process reference over the whole
global batch within fp32 rounding, under plans whose attention groups span both plan ranks
(a ring, Ulysses and all-gather pair, zeppelin's remap).

Run with -s to see the measured errors (docs/python.md records them).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ballast  # noqa: E402
import ballast.torch as bt  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)
from gloo_workers import run_workers  # noqa: E402

WORLD_SIZE = 4
TENSOR_PARALLEL = 2           # 2 TP groups of 2 processes: plan ranks {0, 1} and {2, 3}
GPUS_PER_NODE = 4             # one emulated node: both TP groups on it
CONFIG = tt.TinyConfig(vocab=48, hidden=32, layers=1, heads=8, kv_heads=4, ffn_hidden=64)
LENGTHS = [37, 150, 9, 64, 201, 23, 80, 5]   # one global batch: documents 0..7
TOLERANCE = 1e-5              # norm-wise relative error (output, loss, each gradient)
TIMEOUT_S = 120

# strategy -> (activation memory per plan rank in tokens, the scheme its plan must use)
STRATEGIES = {
    "static-cp:degree=2": (1024, "ring"),            # every document a zigzag ring over both plan ranks
    "static-cp-allgather:degree=2": (1024, "all_gather"),
    "static-ulysses:degree=2": (1024, "ulysses"),    # degree 2 x TP 2 divides the 4 KV heads
    "zeppelin:remap=on": (90, "remap"),              # a ring, local groups, 3 micro-batches, remapped
}


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, gradient summed over the TP group backward (each
    member's column-parallel shard contributes part of the input's gradient)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: the row-parallel shards' partial outputs summed forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _weights():
    """The full model: embedding, wq, wk, wv, wo, lm_head (seeded, the same on every process)."""
    generator = torch.Generator().manual_seed(7)
    c, d = CONFIG, CONFIG.head_dim
    shapes = {"embedding": (c.vocab, c.hidden), "wq": (c.heads * d, c.hidden), "wk": (c.kv_heads * d, c.hidden),
              "wv": (c.kv_heads * d, c.hidden), "wo": (c.hidden, c.heads * d), "lm_head": (c.vocab, c.hidden)}
    return {name: torch.randn(shape, generator=generator) * 0.3 for name, shape in shapes.items()}


def _documents():
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, CONFIG.vocab, (n,), generator=generator) for n in LENGTHS]


def _shard(name: str, weight: torch.Tensor, member: int) -> torch.Tensor:
    """TP member `member`'s part: wq / wk / wv by output rows (its heads), wo by input columns."""
    if name in ("wq", "wk", "wv"):
        return weight.chunk(TENSOR_PARALLEL, dim=0)[member]
    if name == "wo":
        return weight.chunk(TENSOR_PARALLEL, dim=1)[member]
    return weight


def _forward(params, input_ids, position_ids, attend, tp_group=None):
    """One attention layer and the LM head; with tp_group, this member's heads only."""
    d, tokens = CONFIG.head_dim, input_ids.shape[0]
    x = params["embedding"][input_ids]                                   # (T, hidden), replicated
    h = _CopyToTensorParallel.apply(x, tp_group) if tp_group is not None else x
    q = (h @ params["wq"].t()).view(tokens, -1, d)                       # (T, heads / N, d)
    k = (h @ params["wk"].t()).view(tokens, -1, d)                       # (T, kv_heads / N, d)
    v = (h @ params["wv"].t()).view(tokens, -1, d)
    q, k = tt.rope(q, position_ids, CONFIG.rope_theta), tt.rope(k, position_ids, CONFIG.rope_theta)
    attended = attend(q, k, v)                                           # (T, heads / N, d)
    o = attended.reshape(tokens, -1) @ params["wo"].t()                  # partial sums under TP
    if tp_group is not None:
        o = _ReduceFromTensorParallel.apply(o, tp_group)
    return (x + o) @ params["lm_head"].t(), attended                     # logits (T, vocab)


def _reference(weights, documents):
    """The whole global batch on one process: per-document causal attention, mean loss."""
    params = {name: w.clone().requires_grad_(True) for name, w in weights.items()}
    input_ids = torch.cat(documents)
    labels = torch.cat([torch.cat([t[1:], torch.tensor([bt.IGNORE_INDEX])]) for t in documents])
    positions = torch.cat([torch.arange(len(t)) for t in documents])
    cu_seqlens = torch.tensor([0] + [len(t) for t in documents]).cumsum(0)
    logits, attended = _forward(params, input_ids, positions, tt.local_attend(cu_seqlens))
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=bt.IGNORE_INDEX)
    loss.backward()
    return float(loss), attended.detach(), {name: p.grad for name, p in params.items()}


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm().clamp_min(1e-30))


def _run_strategy(rank, strategy, planning_model, weights, documents, reference, groups):
    rank_tokens, scheme = STRATEGIES[strategy]
    cluster = ballast.Cluster.emulated(planning_model, WORLD_SIZE, GPUS_PER_NODE, rank_tokens)
    sampler = bt.BalancedBatchSampler(LENGTHS, [list(range(len(LENGTHS)))], rank=rank, world_size=WORLD_SIZE,
                                      cluster=cluster, model=planning_model, strategy=strategy,
                                      tensor_parallel=TENSOR_PARALLEL)
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler, collate_fn=bt.collate)
    tp_group = groups.tensor_parallel_group(TENSOR_PARALLEL)
    member = rank % TENSOR_PARALLEL
    params = {name: _shard(name, w, member).clone().requires_grad_(True) for name, w in weights.items()}
    reference_loss, reference_attended, reference_grads = reference
    starts = torch.tensor([0] + LENGTHS).cumsum(0)
    heads = CONFIG.heads // TENSOR_PARALLEL
    result = {"attention_error": 0.0, "schemes": set(), "remapped": 0, "split_groups": 0, "micro_batches": 0,
              "moved_pieces": 0, "plan_group_sums_ok": True}
    step_loss = torch.zeros(1)
    for batch in loader:
        assert (batch.plan_rank, batch.tensor_parallel_rank) == divmod(rank, TENSOR_PARALLEL)
        result["micro_batches"] += 1
        result["remapped"] += int(batch.remapped)
        groups_of_batch = batch.plan.micro_batches[batch.micro_batch].groups
        result["schemes"].update(g.scheme for g in groups_of_batch)
        result["split_groups"] += sum(len(g.ranks) > 1 for g in groups_of_batch)
        result["moved_pieces"] += len(batch.view.sends) + len(batch.view.receives)
        logits, attended = _forward(params, batch.input_ids, batch.position_ids,
                                    tt.planned_attend(batch, groups), tp_group)
        loss = (tt.token_losses(logits, batch.labels) * batch.loss_weight).sum()
        # plan_group (made by attention's ensure): the processes of my TP index, by their rank sum
        for group in batch.view.groups:
            if len(group.ranks) > 1:
                total = torch.tensor([float(rank)])
                dist.all_reduce(total, group=groups.plan_group(group.ranks, batch))
                result["plan_group_sums_ok"] &= float(total) == sum(g * TENSOR_PARALLEL + member for g in group.ranks)
        loss.backward()
        step_loss += loss.detach()
        if batch.pieces:  # my rows and heads of the reference attention output, piece by piece
            expected = torch.cat([reference_attended[starts[p.sequence_id] + p.begin:starts[p.sequence_id] + p.end,
                                                     member * heads:(member + 1) * heads] for p in batch.pieces])
            result["attention_error"] = max(result["attention_error"],
                                            _relative_error(attended.detach(), expected))
    data_parallel = groups.data_parallel_group(TENSOR_PARALLEL)
    bt.all_reduce_gradients(params.values(), group=data_parallel)
    dist.all_reduce(step_loss, group=data_parallel)       # the loss, counted once per plan rank
    result["loss_error"] = abs(float(step_loss) - reference_loss) / reference_loss
    result["gradient_errors"] = {name: _relative_error(p.grad, _shard(name, reference_grads[name], member))
                                 for name, p in params.items()}
    result["schemes"] = sorted(result["schemes"] | ({"remap"} if result["remapped"] else set()))
    result["plan_ranks"] = batch.plan.ranks
    result["plan_gpus"] = batch.plan.gpus
    return result


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    weights, documents = _weights(), _documents()
    planning_model = tt.planning_model(CONFIG, sum(w.numel() for w in weights.values()))
    reference = _reference(weights, documents)
    groups = bt.ProcessGroups()
    results = {strategy: _run_strategy(rank, strategy, planning_model, weights, documents, reference, groups)
               for strategy in STRATEGIES}
    results["process_groups"] = [list(r) for r in sorted(groups._groups)]
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list:
    out_dir = tmp_path_factory.mktemp("gloo_tp")
    run_workers(_worker, (str(out_dir / "init"), str(out_dir)), WORLD_SIZE, TIMEOUT_S)
    found = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    print(f"\n{WORLD_SIZE} gloo processes = 2 TP groups of {TENSOR_PARALLEL}; worst over the processes:")
    print(f"{'strategy':30s} {'schemes':24s} {'attention':>10s} {'loss':>10s} {'gradient':>10s}")
    for strategy in STRATEGIES:
        rows = [r[strategy] for r in found]
        print(f"{strategy:30s} {','.join(rows[0]['schemes']):24s} {max(r['attention_error'] for r in rows):10.2e} "
              f"{max(r['loss_error'] for r in rows):10.2e} "
              f"{max(max(r['gradient_errors'].values()) for r in rows):10.2e}")
    return found


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_tensor_parallel_step_matches_single_process(results: list, strategy: str) -> None:
    for rank, found in enumerate(results):
        r = found[strategy]
        assert (r["plan_ranks"], r["plan_gpus"]) == (WORLD_SIZE // TENSOR_PARALLEL, WORLD_SIZE)
        assert r["attention_error"] < TOLERANCE, (rank, r)
        assert r["loss_error"] < TOLERANCE, (rank, r)
        assert max(r["gradient_errors"].values()) < TOLERANCE, (rank, r)
        assert r["plan_group_sums_ok"], (rank, r)


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_plans_span_both_plan_ranks(results: list, strategy: str) -> None:
    r = results[0][strategy]
    assert r["split_groups"] > 0, r
    assert STRATEGIES[strategy][1] in r["schemes"], r


def test_the_remap_moves_tokens_between_plan_ranks(results: list) -> None:
    assert all(found["zeppelin:remap=on"]["moved_pieces"] > 0 for found in results)
    assert all(found["zeppelin:remap=on"]["micro_batches"] > 1 for found in results)


def test_process_groups_follow_the_tensor_parallel_index(results: list) -> None:
    # Attention groups of plan ranks {0, 1} run on processes {0, 2} (TP index 0) and {1, 3}
    # (TP index 1); the TP groups are {0, 1} and {2, 3}; the data-parallel groups are the
    # attention groups' processes here.
    assert results[0]["process_groups"] == [[0, 1], [0, 2], [1, 3], [2, 3]]


def _sampler_items(rank: int, world_size: int = WORLD_SIZE, tensor_parallel: int = TENSOR_PARALLEL):
    model = tt.planning_model(CONFIG, 10_000)
    cluster = ballast.Cluster.emulated(model, WORLD_SIZE, GPUS_PER_NODE, 90)
    sampler = bt.BalancedBatchSampler(LENGTHS, [list(range(len(LENGTHS)))], rank=rank, world_size=world_size,
                                      cluster=cluster, model=model, strategy="zeppelin:remap=on",
                                      tensor_parallel=tensor_parallel)
    return [[(p.sequence_id, p.begin, p.end) for p in item[1:]] for item in sampler], sampler


def test_the_members_of_a_tp_group_load_the_same_tokens() -> None:
    items = [_sampler_items(rank)[0] for rank in range(WORLD_SIZE)]
    assert items[0] == items[1] and items[2] == items[3] and items[0] != items[2]
    _, sampler = _sampler_items(3)
    assert (sampler.plan_rank, sampler.tensor_parallel, sampler.cluster.ranks) == (1, 2, 2)
    plan = sampler.last_plan
    # ... exactly plan rank g's linear layout, every token once over the plan ranks
    assert items[2] == [[(r.sequence_id, r.begin, r.end) for r in mb.linear] for mb in plan.rank(1).micro_batches]
    held = sorted((s, t) for rank in (0, 2) for item in items[rank] for s, b, e in item for t in range(b, e))
    assert held == sorted((s, t) for s, n in enumerate(LENGTHS) for t in range(n))


def test_the_sampler_names_the_world_a_tp_plan_needs() -> None:
    with pytest.raises(ValueError, match=r"has 4 GPUs \(1 nodes x 4 GPUs in 2 TP groups of 2\) but world_size "
                                         r"is 2.*launch 4 processes"):
        _sampler_items(0, world_size=2)
    with pytest.raises(ValueError, match=r"tensor_parallel 3 is not valid .*valid values: 1, 2, 4"):
        _sampler_items(0, tensor_parallel=3)
