"""Gradients under DistributedDataParallel, as examples/train_balanced.py synchronizes them:
4 gloo processes run one global batch of the tiny transformer through the example's own
functions (``wrap_for_gradient_sync``, ``loss_scale_for``, ``gradient_sync_context``,
``train_micro_batch``, ``finish_step``) over several micro-batches, and the gradients
every rank holds at the optimizer step must equal those of a single process that packs the
whole global batch (causal attention per document, mean loss) within 1e-5 norm-wise.

The batches are built so that ballast's plans give the pitfalls: a rank without tokens in a
micro-batch under ``no_sync()`` and in the last micro-batch (the one DDP all-reduces in), and
zeppelin's remap moving rows between ranks inside DDP's backward. The test asserts that each
happened. Planted bugs: DDP with ``loss_scale`` 1 (gradients off by the world size) must
exceed the tolerance, and DDP without ``no_sync()`` (still the right gradients: DDP adds the
accumulated ones) must be caught by the ranks' gradients being equal before the last
micro-batch, i.e. communication in every micro-batch.

Run with -s to see the measured errors (docs/python.md records them).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import json
import time
from pathlib import Path
from typing import Dict, List

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ballast  # noqa: E402
import ballast.torch as bt  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)
import train_balanced as tb  # noqa: E402
from gloo_workers import run_workers  # noqa: E402

WORLD_SIZE = 4
GPUS_PER_NODE = 2
LENGTHS = [600, 500, 400, 30]  # one global batch, 1,530 tokens
GRADIENT_TOLERANCE = 1e-5      # norm-wise relative error per parameter tensor
LOSS_TOLERANCE = 1e-6
TIMEOUT_S = 120

# case -> (strategy, activation memory per rank in tokens) and what its plan must show
# (checked in the parent from the plan itself, then again from what the workers saw).
CASES = {
    "hybrid-dp, empty rank under no_sync": ("hybrid-dp", 256),          # 3 micro-batches, 2 ranks empty in the 2nd
    "hybrid-dp, empty rank in the synced backward": ("hybrid-dp", 384),  # 2 micro-batches, 2 ranks empty in the last
    "zeppelin remap": ("zeppelin:remap=on", 256),                       # 4 micro-batches, rows moved between ranks
}

# mode -> (grad_sync, loss_scale override or None for the example's, no_sync around micro-batches)
MODES = {
    "ddp": ("ddp", None, True),
    "all-reduce": ("all-reduce", None, True),
    "planted: ddp with loss_scale 1": ("ddp", 1.0, True),
    "planted: ddp without no_sync": ("ddp", None, False),
}
PLANTED_CASE = "zeppelin remap"  # the planted modes run on this case only (most micro-batches)
RUNS = [(case, mode) for case in CASES for mode in MODES if case == PLANTED_CASE or not mode.startswith("planted")]


def _planning_model():
    config = tt.TinyConfig()
    torch.manual_seed(0)
    model = tt.TinyTransformer(config)
    return model, tt.planning_model(config, tt.parameter_count(model))


def _plan(case: str, planning_model) -> ballast.Plan:
    strategy, rank_tokens = CASES[case]
    cluster = tt.emulated_cluster(WORLD_SIZE, GPUS_PER_NODE, rank_tokens, planning_model)
    return ballast.plan(LENGTHS, cluster, planning_model, strategy)


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm().clamp_min(1e-30))


def _reference_gradients(model, documents) -> tuple:
    """The unbalanced single-process step: every document packed, mean loss over targets."""
    model = copy.deepcopy(model)
    tokens = [documents[i] for i in range(len(LENGTHS))]
    labels = torch.cat([torch.cat([t[1:], torch.tensor([bt.IGNORE_INDEX])]) for t in tokens])
    positions = torch.cat([torch.arange(len(t)) for t in tokens])
    cu_seqlens = torch.tensor([0] + [len(t) for t in tokens]).cumsum(0)
    logits = model(torch.cat(tokens), positions, tt.local_attend(cu_seqlens))
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=bt.IGNORE_INDEX)
    loss.backward()
    return float(loss), [p.grad.clone() for p in model.parameters()]


class GradientRecorder:
    """Stands in for the optimizer of ``finish_step``: keeps the gradients it is stepped with."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.parameters = list(model.parameters())
        self.gradients: List[torch.Tensor] = []

    def step(self) -> None:
        self.gradients = [p.grad.clone() for p in self.parameters]

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.parameters:
            p.grad = None if set_to_none else p.grad.zero_()


def _fingerprint(model: torch.nn.Module) -> List[float]:
    """Per parameter, the sum of its gradient (float64): equal on every rank once synchronized."""
    return [float(p.grad.double().sum()) if p.grad is not None else 0.0 for p in model.parameters()]


def _one_step(case: str, mode: str, rank: int, base_model, planning_model, documents, groups, reference) -> Dict:
    grad_sync, planted_scale, use_no_sync = MODES[mode]
    strategy, rank_tokens = CASES[case]
    cluster = tt.emulated_cluster(WORLD_SIZE, GPUS_PER_NODE, rank_tokens, planning_model)
    model = copy.deepcopy(base_model)
    trained = tb.wrap_for_gradient_sync(model, grad_sync, torch.device("cpu"))
    loss_scale = tb.loss_scale_for(trained) if planted_scale is None else planted_scale
    sampler = bt.BalancedBatchSampler(LENGTHS, [list(range(len(LENGTHS)))], rank=rank, world_size=WORLD_SIZE,
                                      cluster=cluster, model=planning_model, strategy=strategy)
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler,
                                         collate_fn=functools.partial(bt.collate, loss_scale=loss_scale))
    recorder = GradientRecorder(model)
    # DDP launches a bucket's all-reduce once every parameter in it has its gradient: each
    # rank's backward must reach every parameter, with or without tokens.
    reached: set = set()
    for index, parameter in enumerate(model.parameters()):
        parameter.register_hook(lambda grad, index=index: reached.add(index))
    seen = {"tokens": [], "fingerprints": [], "parameters_reached": [], "remapped": 0, "num_micro_batches": 0}
    step_loss = torch.zeros(1)
    for batch in loader:
        context = tb.gradient_sync_context(trained, batch) if use_no_sync else contextlib.nullcontext()
        reached.clear()
        with context:
            step_loss += tb.train_micro_batch(trained, batch, groups, torch.device("cpu"))
        seen["parameters_reached"].append(len(reached))
        seen["tokens"].append(int(batch.input_ids.numel()))
        seen["fingerprints"].append(_fingerprint(model))
        seen["remapped"] += int(batch.remapped)
        seen["num_micro_batches"] = batch.num_micro_batches
        if batch.micro_batch + 1 == batch.num_micro_batches:
            tb.finish_step(trained, recorder, step_loss)
    reference_loss, reference_gradients = reference
    errors = [_relative_error(g, r) for g, r in zip(recorder.gradients, reference_gradients)]
    seen.update(gradient_error=max(errors), loss=float(step_loss), reference_loss=reference_loss,
                loss_error=abs(float(step_loss) - reference_loss) / reference_loss,
                ddp=isinstance(trained, torch.nn.parallel.DistributedDataParallel), loss_scale=loss_scale)
    return seen


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    base_model, planning_model = _planning_model()
    documents = tt.ByteDocuments(LENGTHS, seed=0)
    reference = _reference_gradients(base_model, documents)
    groups = bt.ProcessGroups()
    results = {}
    for case, mode in RUNS:
        started = time.perf_counter()
        results[f"{case} | {mode}"] = _one_step(case, mode, rank, base_model, planning_model, documents, groups,
                                                reference)
        results[f"{case} | {mode}"]["seconds"] = time.perf_counter() - started
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> List[Dict]:
    out_dir = tmp_path_factory.mktemp("ddp")
    started = time.perf_counter()
    run_workers(_worker, (str(out_dir / "init"), str(out_dir)), WORLD_SIZE, TIMEOUT_S)
    found = [json.loads((out_dir / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]
    print(f"\n{WORLD_SIZE} gloo processes, {len(RUNS)} runs of one step: "
          f"{time.perf_counter() - started:.1f} s wall")
    print(f"{'case | mode':60s} {'mb':>3s} {'loss rel err':>13s} {'grad rel err':>13s}  "
          "tokens per rank per micro-batch")
    for key in found[0]:
        worst = max(found, key=lambda ranks: ranks[key]["gradient_error"])[key]
        print(f"{key:60s} {worst['num_micro_batches']:>3d} {max(f[key]['loss_error'] for f in found):13.2e} "
              f"{worst['gradient_error']:13.2e}  {[f[key]['tokens'] for f in found]}")
    return found


def _synced_before_the_last_micro_batch(fingerprints: List[List[List[float]]]) -> bool:
    """fingerprints[rank][micro-batch]: after the first micro-batch every rank holds the same
    gradients (they differ while no_sync keeps them local)."""
    return all(per_rank[0] == fingerprints[0][0] for per_rank in fingerprints)


def _synced_in_the_last_micro_batch(fingerprints: List[List[List[float]]]) -> bool:
    return all(per_rank[-1] == fingerprints[0][-1] for per_rank in fingerprints)


def test_the_cases_plan_the_pitfalls() -> None:
    _, planning_model = _planning_model()
    plans = {case: _plan(case, planning_model) for case in CASES}
    empty = {case: [m for r in range(WORLD_SIZE) for m, view in enumerate(plan.rank(r).micro_batches)
                    if not view.linear] for case, plan in plans.items()}
    assert all(plan.num_micro_batches > 1 for plan in plans.values())
    last = plans["hybrid-dp, empty rank under no_sync"].num_micro_batches - 1
    assert any(m < last for m in empty["hybrid-dp, empty rank under no_sync"])
    last = plans["hybrid-dp, empty rank in the synced backward"].num_micro_batches - 1
    assert last in empty["hybrid-dp, empty rank in the synced backward"]
    zeppelin = plans["zeppelin remap"]
    assert any(t.src_rank != t.dst_rank for m in range(zeppelin.num_micro_batches)
               for t in zeppelin.remap_transfers(m))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("mode", ["ddp", "all-reduce"])
def test_gradients_match_single_process(results: List[Dict], case: str, mode: str) -> None:
    key = f"{case} | {mode}"
    assert all(ranks[key]["ddp"] == (mode == "ddp") for ranks in results)
    assert results[0][key]["loss_scale"] == (WORLD_SIZE if mode == "ddp" else 1.0)
    for rank, ranks in enumerate(results):
        seen = ranks[key]
        assert seen["gradient_error"] < GRADIENT_TOLERANCE, (rank, seen)
        assert seen["loss_error"] < LOSS_TOLERANCE, (rank, seen)
        assert len(seen["tokens"]) == seen["num_micro_batches"] > 1


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_communicates_only_in_the_last_micro_batch(results: List[Dict], case: str) -> None:
    """Under no_sync the ranks' gradients differ until the last backward, then are identical."""
    fingerprints = [ranks[f"{case} | ddp"]["fingerprints"] for ranks in results]
    assert not _synced_before_the_last_micro_batch(fingerprints)
    assert _synced_in_the_last_micro_batch(fingerprints)


def test_the_workers_met_the_pitfalls(results: List[Dict]) -> None:
    def tokens(case: str) -> List[List[int]]:  # [rank][micro-batch]
        return [ranks[f"{case} | ddp"]["tokens"] for ranks in results]

    under_no_sync = tokens("hybrid-dp, empty rank under no_sync")
    assert any(0 in per_rank[:-1] for per_rank in under_no_sync), under_no_sync
    synced = tokens("hybrid-dp, empty rank in the synced backward")
    assert any(per_rank[-1] == 0 for per_rank in synced), synced
    assert all(ranks["zeppelin remap | ddp"]["remapped"] > 0 for ranks in results)
    parameters = len(list(tt.TinyTransformer(tt.TinyConfig()).parameters()))
    for key in results[0]:
        assert all(ranks[key]["parameters_reached"] == [parameters] * len(ranks[key]["tokens"]) for ranks in results)


def test_wrap_for_gradient_sync_without_torch_distributed_and_bad_names() -> None:
    model = tt.TinyTransformer(tt.TinyConfig())
    assert not dist.is_initialized()
    for grad_sync in tb.GRADIENT_SYNCS:  # one process: nothing to synchronize, the model itself
        assert tb.wrap_for_gradient_sync(model, grad_sync, torch.device("cpu")) is model
    assert tb.loss_scale_for(model) == 1.0
    with pytest.raises(ValueError, match="grad_sync must be one of ddp, all-reduce; got 'sum'"):
        tb.wrap_for_gradient_sync(model, "sum", torch.device("cpu"))


def test_planted_wrong_loss_scale_is_detected(results: List[Dict]) -> None:
    """DDP averages: with loss_scale 1 every gradient is 1 / world_size of the right one."""
    errors = [ranks[f"{PLANTED_CASE} | planted: ddp with loss_scale 1"]["gradient_error"] for ranks in results]
    assert min(errors) > 100 * GRADIENT_TOLERANCE, errors
    assert abs(min(errors) - (1 - 1 / WORLD_SIZE)) < 1e-3, errors


def test_planted_missing_no_sync_is_detected(results: List[Dict]) -> None:
    """Without no_sync DDP all-reduces in every micro-batch: the same gradients (it adds the
    accumulated ones), more communication; the check of the ddp mode catches it."""
    key = f"{PLANTED_CASE} | planted: ddp without no_sync"
    assert all(ranks[key]["gradient_error"] < GRADIENT_TOLERANCE for ranks in results)
    assert _synced_before_the_last_micro_batch([ranks[key]["fingerprints"] for ranks in results])
