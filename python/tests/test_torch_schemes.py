"""ballast.torch runs the plan's attention schemes (python/ballast/_torch_schemes.py): 4 gloo
processes run remap -> attention -> remap back on random q, k, v under each strategy (and a
hand-made plan that mixes ring, Ulysses, all-gather and local groups in one micro-batch),
and the output and dq / dk / dv of every token must equal a single process's causal
attention over whole documents within 1e-5 (norm-wise: ||x - ref|| / ||ref|| over all
tokens of all ranks). Each rank's bytes sent per scheme and pass must equal the volume the
plan implies (``_expected_bytes``; the formulas are in docs/python.md, "Attention
schemes"). Planted bugs (dK/dV not sent home in the ring, a wrong causal offset of the ring's
blocks, all-to-all gradients dropped, Ulysses members reading the wrong KV heads) must be
caught, and so must a replicated KV head's dK/dV kept from one Ulysses member only.
Hand-made plans also run Ulysses beyond the KV heads (4 members over 2 KV heads; 2 and 3
members over the one KV head of a 12-head MQA layout), rings, all-gathers and Ulysses
groups of 3, and USP groups (2 stages of 2, GQA and MQA: KV head replicated in a stage); a
USP ring whose queries skip the other stages' blocks must be caught.

Run with -s to see the measured errors and volumes (docs/python.md records them).
"""

from __future__ import annotations

import datetime
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import ballast  # noqa: E402
import ballast.torch as bt  # noqa: E402
import ballast._torch_schemes as schemes  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)
from gloo_workers import run_workers  # noqa: E402

WORLD_SIZE = 4
GPUS_PER_NODE = 2
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8   # GQA: a Ulysses member of a pair takes 2 query heads, 1 KV head
# Multi-query attention with 12 heads for the replicated-KV case: Ulysses groups of 2, 3 and 4
# members each hold the one KV head (replicated 2, 3 and 4 times), and 3 is no power of two.
MQA_HEADS, MQA_KV_HEADS = 12, 1
TOLERANCE = 1e-5
TIMEOUT_S = 120
LENGTHS = [1500, 700, 300, 200, 90, 60, 33, 20]

# case -> (strategy spec or "mixed", rank_tokens of the emulated cluster, schemes its plan must contain)
CASES = {
    "packed-dp": ("packed-dp", 4096, {"local"}),
    "static-cp": ("static-cp:degree=4", 4096, {"ring"}),
    "static-cp-allgather": ("static-cp-allgather:degree=2", 4096, {"all_gather"}),
    "static-ulysses": ("static-ulysses:degree=2", 4096, {"ulysses"}),
    "hybrid-dp": ("hybrid-dp", 1024, {"ring"}),
    "flexsp-fast": ("flexsp-fast", 4096, {"ulysses"}),
    "zeppelin:remap=on": ("zeppelin:remap=on", 1024, {"ring", "local"}),
    "mixed": ("mixed", 4096, {"ring", "ulysses", "all_gather", "local"}),
    # Ulysses beyond the KV heads (4 members over 2 KV heads: each held twice), then
    # non-power-of-two groups on an MQA model: Ulysses of 3 (KV head on all 3), an all-gather of 3
    "replicated": ("replicated", 4096, {"ulysses", "local", "all_gather", "ring"}),
    "replicated-mqa": ("replicated-mqa", 4096, {"ulysses", "local", "all_gather", "ring"}),
    # USP: stages of 2 ranks around a ring of 2 (stages [0, 1] | [2, 3], then [3, 1] | [2, 0]);
    # on the 12-head MQA layout each stage's members hold the one KV head (replicated)
    "usp": ("usp", 4096, {"usp"}),
    "usp-mqa": ("usp-mqa", 4096, {"usp"}),
    # the all-gather reference (attention(schemes="reference")) on the same plan: no bytes counted
    "mixed/reference": ("mixed", 4096, {"ring", "ulysses", "all_gather", "local"}),
}
# planted bug -> the case that must catch it
BUGS = {
    "ring_no_gradients_home": "static-cp",
    "ring_causal_offset": "mixed",
    "all_to_all_drops_gradients": "mixed",
    "ulysses_wrong_kv_heads": "static-ulysses",
    "ulysses_replicas_not_summed": "replicated",
    "usp_ring_own_stage_only": "usp",
}
# case -> (heads, KV heads) when not (HEADS, KV_HEADS)
HEAD_LAYOUTS = {"replicated-mqa": (MQA_HEADS, MQA_KV_HEADS), "usp-mqa": (MQA_HEADS, MQA_KV_HEADS)}


def _heads_of(case: str) -> tuple:
    return HEAD_LAYOUTS.get(case, (HEADS, KV_HEADS))


def _mixed_plan(cluster: ballast.Cluster, model: ballast.Model) -> ballast.Plan:
    """One micro-batch of six groups: rings of 4 and 3 ranks (zigzag), a Ulysses pair with
    uneven members, an all-gather pair, two local groups (one holding a document in two
    pieces); every rank is in 3 or 4 groups."""
    base = json.loads(ballast.plan(np.array(LENGTHS), cluster, model, "zeppelin").to_json())

    def sequence(i, chunks):
        return {"id": i, "padded_length_tokens": LENGTHS[i], "chunks": [list(c) for c in chunks]}

    def group(ranks, scheme, *sequences):
        return {"ranks": ranks, "routing_proxies": 1, "scheme": scheme, "sequences": list(sequences)}

    base["micro_batches"] = [{"groups": [
        group([0, 1, 2, 3], "ring", sequence(0, [[0, 0, 188], [0, 1313, 1500], [1, 188, 376], [1, 1126, 1313],
                                                 [2, 376, 564], [2, 939, 1126], [3, 564, 752], [3, 752, 939]])),
        group([0, 1], "ulysses", sequence(1, [[0, 0, 350], [1, 350, 700]]), sequence(5, [[0, 0, 20], [1, 20, 60]])),
        group([2, 3], "all_gather", sequence(2, [[2, 0, 150], [3, 150, 300]])),
        group([1, 2, 3], "ring", sequence(3, [[1, 0, 34], [1, 166, 200], [2, 34, 67], [2, 133, 166],
                                              [3, 67, 100], [3, 100, 133]])),
        group([3], "local", sequence(4, [[3, 0, 90]]), sequence(7, [[3, 0, 20]])),
        group([0], "local", sequence(6, [[0, 0, 10], [0, 10, 33]])),  # one document in two pieces
    ], "queues": [[0, 1, 5], [0, 1, 3], [0, 2, 3], [0, 2, 3, 4]]}]
    return ballast.Plan.from_json(json.dumps(base), "test_torch_schemes mixed plan")


def _replicated_plan(cluster: ballast.Cluster, model: ballast.Model) -> ballast.Plan:
    """Two micro-batches. 0: a Ulysses group of all 4 ranks (uneven members) over the
    longest documents. 1: a Ulysses group of ranks 0-2 (an all-gather where 3 does not
    divide the heads), a ring of 3 (zigzag) and an all-gather of 3 over ranks 1-3, rank 0
    local. With 4 query heads and 2 KV heads the group of 4 replicates each KV head twice;
    with 12 heads and 1 KV head (MQA) every Ulysses member holds the KV head."""
    base = json.loads(ballast.plan(np.array(LENGTHS), cluster, model, "zeppelin").to_json())
    three = "ulysses" if model.heads % 3 == 0 else "all_gather"

    def sequence(i, chunks):
        return {"id": i, "padded_length_tokens": LENGTHS[i], "chunks": [list(c) for c in chunks]}

    def group(ranks, scheme, *sequences):
        return {"ranks": ranks, "routing_proxies": 1, "scheme": scheme, "sequences": list(sequences)}

    base["micro_batches"] = [
        {"groups": [group([0, 1, 2, 3], "ulysses", sequence(0, [[0, 0, 500], [1, 500, 900], [2, 900, 1200],
                                                                [3, 1200, 1500]]),
                          sequence(1, [[0, 0, 100], [1, 100, 150], [2, 150, 400], [3, 400, 700]]))]},
        {"groups": [
            group([0, 1, 2], three, sequence(2, [[0, 0, 100], [1, 100, 220], [2, 220, 300]]),
                  sequence(6, [[1, 0, 33]])),
            group([1, 2, 3], "ring", sequence(3, [[1, 0, 34], [1, 166, 200], [2, 34, 67], [2, 133, 166],
                                                  [3, 67, 100], [3, 100, 133]])),
            group([3, 1, 2], "all_gather", sequence(4, [[3, 0, 30], [1, 30, 60], [2, 60, 90]])),
            group([0], "local", sequence(5, [[0, 0, 60]]), sequence(7, [[0, 0, 20]])),
        ], "queues": [[0, 3], [0, 1, 2], [0, 1, 2], [1, 2]]},
    ]
    return ballast.Plan.from_json(json.dumps(base), "test_torch_schemes replicated plan")


def _usp_plan(cluster: ballast.Cluster, model: ballast.Model) -> ballast.Plan:
    """Two micro-batches of one usp group (ulysses_degree 2) each. 0: ranks [0, 1, 2, 3]
    (stages {0, 1} and {2, 3}; rings {0, 2} and {1, 3}), document 0 zigzag over the stages
    (stage 0 holds its first and last quarter), document 1 in rank-order quarters. 1: ranks
    [3, 1, 2, 0] (stages {3, 1} and {2, 0}), the other documents in list-order quarters."""
    base = json.loads(ballast.plan(np.array(LENGTHS), cluster, model, "zeppelin").to_json())

    def sequence(i, ranks):
        n, g = LENGTHS[i], len(ranks)
        chunks = [[r, n * j // g, n * (j + 1) // g] for j, r in enumerate(ranks) if n * j // g < n * (j + 1) // g]
        return {"id": i, "padded_length_tokens": n, "chunks": chunks}

    def group(ranks, *sequences):
        return {"ranks": ranks, "routing_proxies": 1, "scheme": "usp", "ulysses_degree": 2,
                "sequences": list(sequences)}

    zigzag = {"id": 0, "padded_length_tokens": 1500, "chunks": [
        [0, 0, 188], [1, 188, 375], [2, 375, 563], [3, 563, 750], [2, 750, 938], [3, 938, 1125],
        [0, 1125, 1313], [1, 1313, 1500]]}
    base["micro_batches"] = [
        {"groups": [group([0, 1, 2, 3], zigzag, sequence(1, [0, 1, 2, 3]))]},
        {"groups": [group([3, 1, 2, 0], *[sequence(i, [3, 1, 2, 0]) for i in range(2, 8)])]},
    ]
    return ballast.Plan.from_json(json.dumps(base), "test_torch_schemes usp plan")


HAND_PLANS = {"mixed": _mixed_plan, "replicated": _replicated_plan, "replicated-mqa": _replicated_plan,
              "usp": _usp_plan, "usp-mqa": _usp_plan}


def _expected_bytes(plan: ballast.Plan, micro_batch: int, rank: int, element_bytes: int = 4,
                    heads: int = HEADS, kv_heads: int = KV_HEADS) -> dict:
    """Bytes plan rank ``rank`` sends per (scheme, pass), from the plan alone. A group of g
    members, n_m rows of member m, N = sum n_m, me = member i, a K/V row of
    2 * KV heads * HEAD_DIM elements:
      ring        forward  sum_{s=0}^{g-2} n_{(i-s) mod g} K/V rows (the block held at step s to the successor)
                  backward the same K/V rows + N dK/dV rows (every block's dK/dV once: g-1 steps + home)
      all_gather  forward  (g-1) n_i K/V rows;  backward (N - n_i) dK/dV rows (partials to their owners)
      ulysses     forward  (g-1) n_i rows of (H/g + 2 max(KV/g, 1)) heads (q, k, v: beyond the KV heads
                           each member's one KV head, replicated) + (N - n_i) rows of H/g heads (out)
                  backward (g-1) n_i rows of H/g heads (dO) + (N - n_i) rows of (H/g + 2 max(KV/g, 1))
                           heads (dQ, dK, dV: every replica's dK, dV back to the owner)
      usp         (stages of u, each's members by rank; rings of member m of every stage, by rank)
                  the stage's all-to-alls as ulysses with g = u over the stage's rows, and the
                  ring's as ring over the stages' row totals with K/V rows of 2 max(KV/u, 1) heads
      local       nothing."""
    rows: dict = {}
    for r in range(plan.ranks):
        for piece in plan.attention_layout(micro_batch, r):
            rows.setdefault(int(piece.group), {}).setdefault(r, 0)
            rows[int(piece.group)][r] += int(piece.end) - int(piece.begin)
    expected: dict = {}

    def add(scheme, direction, count):
        expected[f"{scheme}/{direction}"] = expected.get(f"{scheme}/{direction}", 0) + count * element_bytes

    for index, group in enumerate(plan.micro_batches[micro_batch].groups):
        ranks = sorted(int(r) for r in group.ranks)
        if rank not in ranks or len(ranks) == 1:
            continue
        g, i = len(ranks), ranks.index(rank)
        n = [rows[index].get(r, 0) for r in ranks]
        total = sum(n)
        kv_row = 2 * kv_heads * HEAD_DIM
        scheme = str(group.scheme)
        if scheme == "ring":
            blocks = sum(n[(i - s) % g] for s in range(g - 1)) * kv_row
            add("ring", "forward", blocks)
            add("ring", "backward", blocks + total * kv_row)
        elif scheme == "all_gather":
            add("all_gather", "forward", (g - 1) * n[i] * kv_row)
            add("all_gather", "backward", (total - n[i]) * kv_row)
        elif scheme == "ulysses":
            qkv_row = (heads // g + 2 * max(kv_heads // g, 1)) * HEAD_DIM
            out_row = heads // g * HEAD_DIM
            add("ulysses", "forward", (g - 1) * n[i] * qkv_row + (total - n[i]) * out_row)
            add("ulysses", "backward", (g - 1) * n[i] * out_row + (total - n[i]) * qkv_row)
        elif scheme == "usp":
            u = int(group.ulysses_degree)
            held = dict(zip(ranks, n))
            stages = [sorted(int(r) for r in list(group.ranks)[j:j + u]) for j in range(0, g, u)]
            stage = next(s for s in stages if rank in s)
            m, stage_rows = stage.index(rank), [held[r] for r in stage]
            qkv_row = (heads // u + 2 * max(kv_heads // u, 1)) * HEAD_DIM
            out_row = heads // u * HEAD_DIM
            mine, stage_total = stage_rows[m], sum(stage_rows)
            add("usp", "forward", (u - 1) * mine * qkv_row + (stage_total - mine) * out_row)
            add("usp", "backward", (u - 1) * mine * out_row + (stage_total - mine) * qkv_row)
            ring = sorted(s[m] for s in stages)   # the ring's members by rank, each with its stage's rows
            totals = [sum(held[r] for r in next(s for s in stages if peer in s)) for peer in ring]
            j, r = ring.index(rank), len(ring)
            usp_kv_row = 2 * max(kv_heads // u, 1) * HEAD_DIM
            blocks = sum(totals[(j - s) % r] for s in range(r - 1)) * usp_kv_row
            add("usp", "forward", blocks)
            add("usp", "backward", blocks + sum(totals) * usp_kv_row)
    return expected


def _global_tensors(heads: int = HEADS, kv_heads: int = KV_HEADS):
    generator = torch.Generator().manual_seed(7)
    make = lambda count: [torch.randn(n, count, HEAD_DIM, generator=generator) for n in LENGTHS]  # noqa: E731
    return make(heads), make(kv_heads), make(kv_heads), make(heads)   # q, k, v, output weights


def _reference(q, k, v, w):
    """Single process: every document whole, causal; (out, dq, dk, dv) per sequence."""
    leaves = [torch.cat(x).requires_grad_() for x in (q, k, v)]
    cu_seqlens = torch.tensor([0] + LENGTHS).cumsum(0)
    out = bt.local_attention(*leaves, cu_seqlens)
    (out * torch.cat(w)).sum().backward()
    return [list(x.split(LENGTHS)) for x in (out.detach(), leaves[0].grad, leaves[1].grad, leaves[2].grad)]


def _rows(tensors, pieces, heads):
    parts = [tensors[p.sequence_id][p.begin:p.end] for p in pieces]
    return torch.cat(parts) if parts else torch.zeros(0, heads, HEAD_DIM)


def _plant(bug):
    """Monkeypatch _torch_schemes with a planted bug (in the worker process only)."""
    if bug == "ring_no_gradients_home":
        schemes._send_gradients_home = lambda finished, kv, *args: torch.zeros_like(kv)
    elif bug == "ring_causal_offset":
        correct = schemes._pair_layout

        def shifted(query_chunks, key_chunks):
            layout = correct(query_chunks, key_chunks)
            return bt.VarlenLayout(layout.cu_seqlens_q, layout.cu_seqlens_k, layout.query_offsets,
                                   [o + 1 for o in layout.key_offsets])
        schemes._pair_layout = shifted
    elif bug == "all_to_all_drops_gradients":
        correct = schemes._all_to_all

        def dropped(x, send, receive, member, process_group, stats, scheme, direction):
            if direction == "backward":
                return x.new_zeros(sum(receive))
            return correct(x, send, receive, member, process_group, stats, scheme, direction)
        schemes._all_to_all = dropped
    elif bug == "ulysses_wrong_kv_heads":
        correct = schemes.ulysses_heads

        def first_kv_heads(heads, kv_heads, members):  # every member sends and reads member 0's KV heads
            shards = correct(heads, kv_heads, members)
            return [(a, b) + shards[0][2:] for a, b, _, _ in shards]
        schemes.ulysses_heads = first_kv_heads
    elif bug == "ulysses_replicas_not_summed":
        def first_holder_only(q, k, v, shards):  # a replicated KV head gets its first holder's dK/dV only
            seen, parts = set(), []
            for a, b, c, d in shards:
                kv = (k[:, c:d], v[:, c:d]) if (c, d) not in seen else (k[:, c:d].detach(), v[:, c:d].detach())
                seen.add((c, d))
                parts.append(torch.cat([q[:, a:b], *kv], dim=1).reshape(-1))
            return parts
        schemes._ulysses_parts = first_holder_only
    elif bug == "usp_ring_own_stage_only":
        correct = schemes._usp_parts

        def own_stage_only(group):  # the blocks go around, but queries attend to their own stage only
            stage, ring = correct(group)
            ring.member_chunks = [c if i == ring.member else [] for i, c in enumerate(ring.member_chunks)]
            return stage, ring
        schemes._usp_parts = own_stage_only
    elif bug is not None:
        raise ValueError(bug)


def _run_case(rank, case, groups, tensors, reference):
    spec, rank_tokens, _ = CASES[case]
    mode = "reference" if case.endswith("/reference") else "planned"
    heads, kv_heads = _heads_of(case)
    model = tt.planning_model(tt.TinyConfig(heads=heads, kv_heads=kv_heads, hidden=heads * HEAD_DIM), 100_000)
    cluster = tt.emulated_cluster(WORLD_SIZE, GPUS_PER_NODE, rank_tokens, model)
    indices = list(range(len(LENGTHS)))
    sampler = bt.BalancedBatchSampler(np.array(LENGTHS), [indices], rank=rank, world_size=WORLD_SIZE,
                                      cluster=cluster, model=model,
                                      strategy="zeppelin" if spec in HAND_PLANS else spec)
    if spec in HAND_PLANS:
        info = bt.StepInfo(HAND_PLANS[spec](cluster, model), indices, sum(LENGTHS) - len(LENGTHS), 0)
    else:
        info = sampler.plan_batch(indices)
    dataset = bt.PieceDataset([torch.zeros(n, dtype=torch.long) for n in LENGTHS])
    q_all, k_all, v_all, w_all = tensors
    squares = torch.zeros(8, dtype=torch.float64)  # per quantity: sum (x - ref)^2, sum ref^2
    bytes_mismatch, volumes, remapped = [], {}, False
    for item in sampler.items(info):
        batch = bt.collate([dataset[x] for x in item])
        remapped |= batch.remapped
        leaves = [_rows(t, batch.pieces, h).requires_grad_() for t, h in ((q_all, heads), (k_all, kv_heads),
                                                                           (v_all, kv_heads))]
        qkv = bt.remap(torch.cat(leaves, dim=1), batch, groups, "to_attention")
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        stats = bt.CommunicationStats()
        out = bt.remap(bt.attention(q, k, v, batch, groups, stats=stats, schemes=mode), batch, groups, "to_linear")
        (out * _rows(w_all, batch.pieces, heads)).sum().backward()
        for j, (value, ref) in enumerate(zip([out.detach()] + [x.grad for x in leaves], reference)):
            expected = _rows(ref, batch.pieces, value.shape[1])
            squares[2 * j] += float((value.double() - expected.double()).pow(2).sum())
            squares[2 * j + 1] += float(expected.double().pow(2).sum())
        measured = {f"{s}/{d}": n for (s, d), n in stats.bytes_sent.items() if n}
        wanted = (_expected_bytes(info.plan, batch.micro_batch, batch.plan_rank, heads=heads, kv_heads=kv_heads)
                  if mode == "planned" else {})
        if measured != wanted:
            bytes_mismatch.append({"micro_batch": batch.micro_batch, "measured": measured, "expected": wanted})
        for key, n in measured.items():
            volumes[key] = volumes.get(key, 0) + n
    dist.all_reduce(squares)
    errors = {name: math.sqrt(squares[2 * j] / squares[2 * j + 1])
              for j, name in enumerate(("out", "dq", "dk", "dv"))}
    every = [None] * WORLD_SIZE
    dist.all_gather_object(every, {"bytes_mismatch": bytes_mismatch, "volumes": volumes})
    plan_schemes = sorted({str(g.scheme) for mb in info.plan.micro_batches for g in mb.groups})
    return {"errors": errors, "schemes": plan_schemes, "remapped": remapped,
            "micro_batches": info.num_micro_batches, "ranks": every}


def _worker(rank: int, init_file: str, out_file: str, bug) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    _plant(bug)
    inputs = {}  # (heads, KV heads) -> (tensors, reference)
    groups = bt.ProcessGroups()
    results = {}
    for case in ([BUGS[bug]] if bug else CASES):
        started = time.perf_counter()
        if _heads_of(case) not in inputs:
            tensors = _global_tensors(*_heads_of(case))
            inputs[_heads_of(case)] = (tensors, _reference(*tensors))
        results[case] = _run_case(rank, case, groups, *inputs[_heads_of(case)])
        results[case]["seconds"] = time.perf_counter() - started
    if rank == 0:
        Path(out_file).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def _run(tmp_path: Path, bug=None) -> dict:
    out_file = tmp_path / "results.json"
    run_workers(_worker, (str(tmp_path / "init"), str(out_file), bug), WORLD_SIZE, TIMEOUT_S)
    return json.loads(out_file.read_text())


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    started = time.perf_counter()
    found = _run(tmp_path_factory.mktemp("schemes"))
    print(f"\n{WORLD_SIZE} gloo processes, {len(CASES)} cases: {time.perf_counter() - started:.1f} s wall")
    print(f"{'case':22s} {'schemes':32s} {'mb':>3s} {'out':>9s} {'dq':>9s} {'dk':>9s} {'dv':>9s}  "
          "bytes sent, rank 0 (scheme/pass: bytes)")
    for case, r in found.items():
        e = r["errors"]
        print(f"{case:22s} {','.join(r['schemes']):32s} {r['micro_batches']:>3d} {e['out']:9.2e} {e['dq']:9.2e} "
              f"{e['dk']:9.2e} {e['dv']:9.2e}  {r['ranks'][0]['volumes']}  ({r['seconds']:.1f} s)")
    return found


@pytest.mark.parametrize("case", list(CASES))
def test_output_and_gradients_match_single_process(results: dict, case: str) -> None:
    errors = results[case]["errors"]
    assert max(errors.values()) < TOLERANCE, errors


@pytest.mark.parametrize("case", list(CASES))
def test_plan_has_the_claimed_schemes(results: dict, case: str) -> None:
    assert CASES[case][2] <= set(results[case]["schemes"]), results[case]["schemes"]


@pytest.mark.parametrize("case", list(CASES))
def test_bytes_sent_match_the_plan(results: dict, case: str) -> None:
    for rank, found in enumerate(results[case]["ranks"]):
        assert not found["bytes_mismatch"], (rank, found["bytes_mismatch"])
    multi_rank = CASES[case][2] - {"local"}
    if multi_rank and not case.endswith("/reference"):  # the schemes that communicate did send
        sent = {key.split("/")[0] for r in results[case]["ranks"] for key in r["volumes"]}
        assert multi_rank <= sent, sent


def test_remap_and_micro_batches_are_exercised(results: dict) -> None:
    assert results["zeppelin:remap=on"]["remapped"]
    assert results["hybrid-dp"]["micro_batches"] > 1 or results["zeppelin:remap=on"]["micro_batches"] > 1


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_is_caught(tmp_path: Path, bug: str) -> None:
    found = _run(tmp_path, bug)[BUGS[bug]]
    print(f"\nplanted {bug}: {BUGS[bug]} errors {found['errors']}")
    assert max(found["errors"].values()) > 100 * TOLERANCE, found["errors"]
