"""ballast.torch under torch.distributed: 4 gloo processes train the tiny transformer of
examples/tiny_transformer.py on real text with the balanced sampler, under every registered
strategy (ballast.strategies()), some with parameters that force sequence splitting
(all-gather, ring, Ulysses groups, zeppelin's remap).
After every step the summed gradients must equal a single-process reference (the whole
global batch packed on one process, causal attention per document, mean loss) within fp32
rounding, and so must the parameters after the last step.

Run with -s to see the measured errors (docs/python.md records them).
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ballast  # noqa: E402
import ballast.torch as bt  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)
from gloo_workers import run_workers  # noqa: E402

WORLD_SIZE = 4
GPUS_PER_NODE = 2           # 2 emulated nodes of 2: intra- and inter-node groups
TOKENS_PER_STEP = 2048      # scaled tokens per global batch (wlbllm lengths / 64)
STEPS = 3
LEARNING_RATE = 0.05
GRADIENT_TOLERANCE = 1e-5   # norm-wise relative error per parameter tensor
LOSS_TOLERANCE = 1e-6
TIMEOUT_S = 240

# strategy -> (whether its plans must put some sequence on several ranks, activation
# memory per rank in tokens: 512 forces several micro-batches on these batches). Specs that
# pin down a scheme; every registered strategy not named here is added below with its
# default options.
STRATEGIES = {
    "packed-dp": (False, 2048),                     # ballast's token-balanced packing, local attention
    "static-cp-allgather:degree=2": (True, 2048),   # every sequence split over a fixed pair (all_gather)
    "static-cp:degree=4": (True, 2048),             # zigzag ring chunks over all 4 ranks
    "zeppelin:remap=on": (True, 512),               # rings of 4 and 2 ranks + linear-layout remap, 2 micro-batches
    "flexsp-fast": (True, 2048),                    # Ulysses groups of 2 + local
    "hybrid-dp": (True, 512),                       # 2 micro-batches, ranks without tokens in one of them
    "static-ulysses:degree=2": (True, 2048),        # Ulysses pairs (the default degree 1 is local)
}
for _name in ballast.strategies():
    if not any(spec.split(":")[0] == _name for spec in STRATEGIES):
        STRATEGIES[_name] = (False, 2048)


def _setup():
    config = tt.TinyConfig()
    torch.manual_seed(0)
    model = tt.TinyTransformer(config)
    planning_model = tt.planning_model(config, tt.parameter_count(model))
    lengths, batches = tt.sample_documents(STEPS, TOKENS_PER_STEP, seed=0)
    documents = tt.ByteDocuments(lengths, seed=0)
    return model, planning_model, lengths, batches, documents


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return float((value - reference).norm() / reference.norm().clamp_min(1e-30))


def _reference_step(model, documents, indices):
    """The unbalanced single-process step: every document packed, mean loss over targets."""
    tokens = [documents[i] for i in indices]
    input_ids = torch.cat(tokens)
    labels = torch.cat([torch.cat([t[1:], torch.tensor([bt.IGNORE_INDEX])]) for t in tokens])
    positions = torch.cat([torch.arange(len(t)) for t in tokens])
    cu_seqlens = torch.tensor([0] + [len(t) for t in tokens]).cumsum(0)
    logits = model(input_ids, positions, tt.local_attend(cu_seqlens))
    loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=bt.IGNORE_INDEX)
    loss.backward()
    return float(loss)


def _train(rank, strategy, base_model, planning_model, lengths, batches, documents, groups):
    cluster = tt.emulated_cluster(WORLD_SIZE, GPUS_PER_NODE, STRATEGIES[strategy][1], planning_model)
    model = copy.deepcopy(base_model)
    reference = copy.deepcopy(base_model) if rank == 0 else None
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=LEARNING_RATE) if reference else None
    sampler = bt.BalancedBatchSampler(lengths, batches, rank=rank, world_size=WORLD_SIZE, cluster=cluster,
                                      model=planning_model, strategy=strategy)
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler, collate_fn=bt.collate)
    result = {"steps": [], "schemes": set(), "split_groups": 0, "remapped": 0, "micro_batches": 0,
              "empty_rank_micro_batches": 0, "moved_pieces": 0}
    step_loss = torch.zeros(1)
    for batch in loader:
        plan_groups = [g for mb in batch.plan.micro_batches for g in mb.groups]
        if batch.micro_batch == 0:
            result["schemes"].update(g.scheme for g in plan_groups)
            result["split_groups"] += sum(len(g.ranks) > 1 for g in plan_groups)
            result["moved_pieces"] += sum(t.src_rank != t.dst_rank for m in range(batch.num_micro_batches)
                                          for t in batch.plan.remap_transfers(m))
            result["empty_rank_micro_batches"] += sum(not mb.linear for r in range(WORLD_SIZE)
                                                      for mb in batch.plan.rank(r).micro_batches)
        result["remapped"] += int(batch.remapped)
        result["micro_batches"] += 1
        logits = model(batch.input_ids, batch.position_ids, tt.planned_attend(batch, groups))
        loss = (tt.token_losses(logits, batch.labels) * batch.loss_weight).sum()
        loss.backward()
        step_loss += loss.detach()
        if batch.micro_batch + 1 < batch.num_micro_batches:
            continue
        bt.all_reduce_gradients(model.parameters())
        dist.all_reduce(step_loss)
        if reference is not None:
            reference_loss = _reference_step(reference, documents, batch.step_info.indices)
            errors = {name: _relative_error(p.grad, r.grad) for (name, p), r in
                      zip(model.named_parameters(), reference.parameters())}
            result["steps"].append({"loss": float(step_loss), "reference_loss": reference_loss,
                                    "loss_error": abs(float(step_loss) - reference_loss) / abs(reference_loss),
                                    "gradient_error": max(errors.values()),
                                    "worst_tensor": max(errors, key=errors.get)})
            reference_optimizer.step()
            reference_optimizer.zero_grad(set_to_none=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        step_loss.zero_()
    if reference is not None:
        result["parameter_error"] = max(_relative_error(p.detach(), r.detach())
                                        for p, r in zip(model.parameters(), reference.parameters()))
    result["schemes"] = sorted(result["schemes"])
    return result


def _worker(rank: int, init_file: str, out_file: str) -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    base_model, planning_model, lengths, batches, documents = _setup()
    groups = bt.ProcessGroups()  # shared by every strategy: groups are cached across plans
    results = {}
    for strategy in STRATEGIES:
        started = time.perf_counter()
        results[strategy] = _train(rank, strategy, base_model, planning_model, lengths, batches, documents,
                                   groups)
        results[strategy]["seconds"] = time.perf_counter() - started
    if rank == 0:
        results["process_groups"] = [list(r) for r in sorted(groups._groups)]
        Path(out_file).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _run_workers(tmp_path: Path) -> dict:
    out_file = tmp_path / "results.json"
    run_workers(_worker, (str(tmp_path / "init"), str(out_file)), WORLD_SIZE, TIMEOUT_S)
    return json.loads(out_file.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    started = time.perf_counter()
    found = _run_workers(tmp_path_factory.mktemp("gloo"))
    print(f"\n{WORLD_SIZE} gloo processes, {len(STRATEGIES)} strategies x {STEPS} steps: "
          f"{time.perf_counter() - started:.1f} s wall")
    print(f"{'strategy':28s} {'schemes':14s} {'mb':>3s} {'loss rel err':>13s} {'grad rel err':>13s} "
          f"{'param rel err':>13s}  worst tensor")
    for strategy in STRATEGIES:
        r = found[strategy]
        print(f"{strategy:28s} {','.join(r['schemes']):14s} {r['micro_batches']:>3d} "
              f"{max(s['loss_error'] for s in r['steps']):13.2e} {max(s['gradient_error'] for s in r['steps']):13.2e} "
              f"{r['parameter_error']:13.2e}  {max(r['steps'], key=lambda s: s['gradient_error'])['worst_tensor']}"
              f"  ({r['seconds']:.1f} s)")
    print("losses:", [round(s["loss"], 5) for s in found["packed-dp"]["steps"]])
    return found


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_summed_gradients_match_single_process(results: dict, strategy: str) -> None:
    r = results[strategy]
    assert len(r["steps"]) == STEPS
    for step in r["steps"]:
        assert step["loss_error"] < LOSS_TOLERANCE, step
        assert step["gradient_error"] < GRADIENT_TOLERANCE, step
    assert r["parameter_error"] < GRADIENT_TOLERANCE


@pytest.mark.parametrize("strategy", [s for s, (split, _) in STRATEGIES.items() if split])
def test_split_strategies_use_multi_rank_groups(results: dict, strategy: str) -> None:
    assert results[strategy]["split_groups"] > 0, results[strategy]
    assert set(results[strategy]["schemes"]) - {"local"}


def test_schemes_and_remap_are_exercised(results: dict) -> None:
    assert results["packed-dp"]["split_groups"] == 0
    assert "all_gather" in results["static-cp-allgather:degree=2"]["schemes"]
    assert "ring" in results["static-cp:degree=4"]["schemes"]
    assert "ulysses" in results["flexsp-fast"]["schemes"]
    assert "ring" in results["zeppelin:remap=on"]["schemes"]
    assert results["zeppelin:remap=on"]["remapped"] > 0
    assert results["zeppelin:remap=on"]["moved_pieces"] > 0  # the remap moves tokens between ranks
    # several micro-batches per step, and ranks that hold nothing in one of them
    assert results["zeppelin:remap=on"]["micro_batches"] > STEPS
    assert results["hybrid-dp"]["micro_batches"] > STEPS
    assert results["hybrid-dp"]["empty_rank_micro_batches"] > 0
    # groups are created once and reused across plans and strategies
    assert results["process_groups"], results["process_groups"]
    assert all(len(r) > 1 for r in results["process_groups"])


def test_every_registered_strategy_is_exercised(results: dict) -> None:
    ran = {spec.split(":")[0] for spec in STRATEGIES if spec in results and len(results[spec]["steps"]) == STEPS}
    assert ran == set(ballast.strategies())


def test_training_makes_progress(results: dict) -> None:
    losses = [s["loss"] for s in results["packed-dp"]["steps"]]
    assert all(0 < loss < 6.0 for loss in losses), losses  # ln(256) = 5.55 at initialisation
