"""What balancing buys: per-rank attention work of ballast's plans against plain token
packing on long-tailed batches (WLB-LLM's 128K pre-training lengths, 64 Ki tokens per
step) on 4, 8 and 16 H100s with a small model, so that no plan is memory-bound.

Work per rank and step, summed over micro-batches:
- attention: causal (query, key) pairs of the rank's attention ranges; a chunk [b, e) of
  a document costs sum_{p=b}^{e-1} (p + 1) pairs (all_gather and ring chunks attend to
  every earlier key); a Ulysses group computes its documents whole, head-sharded, so each
  member does 1/g of the group's pairs;
- linear: tokens of the rank's linear layout.
Imbalance = max / mean over ranks. Baselines: plain token packing (a DistributedSampler
with greedy token packing: documents in batch order, each rank filled up to total / world
tokens) and ballast's packed-dp (token-balanced packing).

No torch needed. Run with -s to see the table (docs/python.md records it).
"""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import pytest

import ballast

RANK_COUNTS = (4, 8, 16)
SEEDS = range(6)
TOKENS_PER_STEP = 65536
BALANCED = ("zeppelin", "flexsp-fast")        # split sequences to balance attention
REPORTED = ("packed-dp", "hybrid-dp") + BALANCED
# A small Llama-like model: attention dominates long documents, memory never binds.
SMALL_MODEL = dict(name="small-test", layers=4, hidden=256, heads=8, kv_heads=8, ffn_hidden=688, vocab=32000,
                   gated_mlp=True, bytes_per_element=2, activation_bytes_per_token=34 * 256 * 4,
                   parameters=4 * 12 * 256 * 256 + 2 * 32000 * 256, provenance="python/tests/test_balance.py")


def causal_pairs(begin: int, end: int) -> int:
    """(query, key) pairs of queries [begin, end) of a document under the causal mask."""
    return (end * (end + 1) - begin * (begin + 1)) // 2


def plan_work(plan: ballast.Plan) -> Dict[str, np.ndarray]:
    """Per-rank attention pairs and linear tokens of a plan, summed over micro-batches."""
    attention = np.zeros(plan.ranks)
    linear = np.zeros(plan.ranks)
    lengths = plan.lengths
    for m, micro_batch in enumerate(plan.micro_batches):
        schemes = [group.scheme for group in micro_batch.groups]
        for group in micro_batch.groups:
            if group.scheme == "ulysses":
                pairs = sum(causal_pairs(0, int(lengths[s.sequence_id])) for s in group.sequences)
                for rank in group.ranks:
                    attention[rank] += pairs / len(group.ranks)
        for rank in range(plan.ranks):
            for r in plan.attention_layout(m, rank):
                if schemes[r.group] != "ulysses":
                    attention[rank] += causal_pairs(r.begin, r.end)
            linear[rank] += sum(r.end - r.begin for r in plan.linear_layout(m, rank))
    return {"attention": attention, "linear": linear}


def plain_packing_work(lengths: np.ndarray, ranks: int) -> Dict[str, np.ndarray]:
    """Documents in batch order, each rank filled until it holds total / ranks tokens."""
    target = lengths.sum() / ranks
    attention = np.zeros(ranks)
    linear = np.zeros(ranks)
    rank = 0
    for length in lengths:
        if linear[rank] >= target and rank < ranks - 1:
            rank += 1
        linear[rank] += length
        attention[rank] += causal_pairs(0, int(length))
    return {"attention": attention, "linear": linear}


def imbalance(work: np.ndarray) -> float:
    return float(work.max() / work.mean())


def cluster_of(ranks: int) -> ballast.Cluster:
    per_node = min(ranks, 8)
    cluster = ballast.Cluster.load("h100", nodes=ranks // per_node)
    cluster.gpus_per_node = per_node
    cluster.nics_per_node = per_node
    return cluster


@pytest.fixture(scope="module")
def figures() -> Dict[int, Dict[str, List[Dict[str, float]]]]:
    """figures[ranks][strategy][seed] = {"attention": imbalance, "linear": imbalance}."""
    table: Dict[int, Dict[str, List[Dict[str, float]]]] = {}
    for ranks in RANK_COUNTS:
        cluster = cluster_of(ranks)
        rows: Dict[str, List[Dict[str, float]]] = {name: [] for name in ("plain",) + REPORTED}
        for seed in SEEDS:
            [lengths] = ballast.sample_batches("wlbllm", tokens_per_step=TOKENS_PER_STEP, seed=seed)
            works = {"plain": plain_packing_work(lengths, ranks)}
            for strategy in REPORTED:
                works[strategy] = plan_work(ballast.plan(lengths, cluster, SMALL_MODEL, strategy))
            for name, work in works.items():
                assert work["linear"].sum() == lengths.sum(), name  # every token exactly once
                rows[name].append({kind: imbalance(w) for kind, w in work.items()})
        table[ranks] = rows
    print(f"\nmax/mean per-rank attention work (linear tokens), wlbllm, {TOKENS_PER_STEP} tokens per step, "
          f"mean over {len(SEEDS)} seeds [worst seed]")
    print(f"{'ranks':>5s} " + " ".join(f"{name:>22s}" for name in ("plain",) + REPORTED))
    for ranks, rows in table.items():
        cells = []
        for name in ("plain",) + REPORTED:
            attention = [r["attention"] for r in rows[name]]
            linear = np.mean([r["linear"] for r in rows[name]])
            cells.append(f"{np.mean(attention):5.2f} [{max(attention):5.2f}] ({linear:4.2f})")
        print(f"{ranks:>5d} " + " ".join(f"{c:>22s}" for c in cells))
    return table


@pytest.mark.parametrize("ranks", RANK_COUNTS)
@pytest.mark.parametrize("strategy", BALANCED)
def test_balanced_plans_cut_attention_imbalance(figures, ranks: int, strategy: str) -> None:
    plain = [r["attention"] for r in figures[ranks]["plain"]]
    balanced = [r["attention"] for r in figures[ranks][strategy]]
    ratios = [b / p for b, p in zip(balanced, plain)]
    assert all(ratio <= 1.0 + 1e-9 for ratio in ratios), ratios  # never worse than plain packing
    assert np.mean(ratios) < 0.8, ratios                          # clearly better on average
    token_balanced = [r["attention"] for r in figures[ranks]["packed-dp"]]
    assert np.mean(balanced) < np.mean(token_balanced), (balanced, token_balanced)


@pytest.mark.parametrize("ranks", RANK_COUNTS)
def test_no_strategy_is_worse_than_plain_packing(figures, ranks: int) -> None:
    plain = [r["attention"] for r in figures[ranks]["plain"]]
    for strategy in REPORTED:
        mine = [r["attention"] for r in figures[ranks][strategy]]
        assert all(m <= p + 1e-9 for m, p in zip(mine, plain)), (strategy, mine, plain)


def test_plain_packing_baseline_is_token_balanced() -> None:
    lengths = np.array([10, 10, 10, 10, 40])
    work = plain_packing_work(lengths, 2)
    assert list(work["linear"]) == [40, 40]
    assert list(work["attention"]) == [4 * causal_pairs(0, 10), causal_pairs(0, 40)]
    assert causal_pairs(0, 4) == 1 + 2 + 3 + 4 and causal_pairs(2, 4) == 3 + 4
