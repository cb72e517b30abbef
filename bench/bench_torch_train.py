#!/usr/bin/python3
"""Throughput of ballast.torch in a training loop: the example's tiny transformer on real
text, N gloo processes, three ways (docs/python.md, "Measured: the schemes in a training
loop"):

    packed      plain token packing: the packed-dp plan (whole documents, token-balanced,
                local attention only)
    reference   the strategy's plan with the reference attention (every split group
                all-gathers its K/V: ``attention(..., schemes="reference")``)
    planned     the strategy's plan with its real schemes (ring, Ulysses, all-gather,
                ``schemes="planned"``, the default)

    PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/bench_torch_train.py
    ... --processes 4 --strategy zeppelin:remap=on --steps 4 --tokens-per-step 8192 --length-scale 16

Per mode: tokens per second (global batch tokens / wall time of the measured steps, after
one warm-up step), each process's busy time (CPU time of its main thread over the measured
steps), imbalance (max / mean busy), and peak memory per process (the growth of its
resident-set high-water mark during the measured steps, MiB). A benchmark: it prints
figures and exits 0 unless a process fails; the machine's load is part of the figure.
"""

from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

MODES = ("packed", "reference", "planned")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def worker(rank: int, args: argparse.Namespace, mode: str, port: int, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    import ballast.torch as bt
    import tiny_transformer as tt

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=args.processes)
    dist.barrier()
    torch.manual_seed(args.seed)
    config = tt.TinyConfig()
    model = tt.TinyTransformer(config)
    planning_model = tt.planning_model(config, tt.parameter_count(model))
    cluster = tt.emulated_cluster(args.processes, args.gpus_per_node, args.rank_tokens, planning_model)
    lengths, batches = tt.sample_documents(args.steps + 1, args.tokens_per_step, dataset=args.dataset,
                                           length_scale=args.length_scale, seed=args.seed)
    documents = tt.ByteDocuments(lengths, seed=args.seed)
    strategy = "packed-dp" if mode == "packed" else args.strategy
    schemes = "reference" if mode == "reference" else "planned"
    sampler = bt.BalancedBatchSampler(lengths, batches, rank=rank, world_size=args.processes, cluster=cluster,
                                      model=planning_model, strategy=strategy)
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler, collate_fn=bt.collate)
    groups = bt.ProcessGroups()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def attend_for(batch: bt.PackedBatch):  # tiny_transformer.planned_attend with a choice of schemes
        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            heads, kv_heads = q.shape[1], k.shape[1]
            qkv = bt.remap(torch.cat([q, k, v], dim=1), batch, groups, "to_attention")
            q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
            return bt.remap(bt.attention(q, k, v, batch, groups, schemes=schemes), batch, groups, "to_linear")
        return attend

    measured_steps, tokens, schemes_used = 0, 0, set()
    busy_s, wall_s, rss_before = 0.0, 0.0, 0.0
    step_start_wall = step_start_cpu = 0.0
    for batch in loader:
        if batch.micro_batch == 0:
            dist.barrier()
            if batch.step_info.step == 1:  # step 0 warms up (caches, process groups)
                rss_before = peak_rss_mib()
            step_start_wall, step_start_cpu = time.perf_counter(), time.thread_time()
        logits = model(batch.input_ids, batch.position_ids, attend_for(batch))
        loss = (tt.token_losses(logits, batch.labels) * batch.loss_weight).sum()
        loss.backward()
        if batch.micro_batch + 1 < batch.num_micro_batches:
            continue
        bt.all_reduce_gradients(model.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        cpu = time.thread_time() - step_start_cpu
        dist.barrier()
        if batch.step_info.step >= 1:
            measured_steps += 1
            busy_s += cpu
            wall_s += time.perf_counter() - step_start_wall
            tokens += int(batch.plan.lengths.sum())
            schemes_used |= {g.scheme for mb in batch.plan.micro_batches for g in mb.groups}
    peak = peak_rss_mib() - rss_before
    with open(os.path.join(out_dir, f"{rank}.txt"), "w") as f:
        f.write(f"{busy_s} {wall_s} {tokens} {peak} {measured_steps} {'+'.join(sorted(schemes_used))}\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--strategy", default="zeppelin:remap=on")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=4, help="measured steps (after one warm-up step)")
    parser.add_argument("--tokens-per-step", type=int, default=8192)
    parser.add_argument("--length-scale", type=int, default=32)
    parser.add_argument("--dataset", default="wlbllm")
    parser.add_argument("--rank-tokens", type=int, default=4096)
    parser.add_argument("--gpus-per-node", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        sys.exit(f"--modes: unknown {', '.join(unknown)}; choose from {', '.join(MODES)}")
    if args.processes < 1 or args.steps < 1:
        sys.exit("--processes and --steps must be at least 1")
    import torch.multiprocessing as mp

    print(f"{'mode':<10} {'tokens/s':>9} {'step (s)':>9} {'busy per process (s)':>28} {'imbalance':>9} "
          f"{'peak MiB per process':>24}  schemes")
    for mode in modes:
        with tempfile.TemporaryDirectory() as out_dir:
            mp.spawn(worker, args=(args, mode, free_port(), out_dir), nprocs=args.processes, join=True)
            rows = [open(os.path.join(out_dir, f"{r}.txt")).read().split() for r in range(args.processes)]
        busy = [float(r[0]) for r in rows]
        wall = max(float(r[1]) for r in rows)
        tokens = int(rows[0][2])
        steps = int(rows[0][4])
        peak = [float(r[3]) for r in rows]
        mean_busy = sum(busy) / len(busy)
        print(f"{mode:<10} {tokens / wall:>9.0f} {wall / steps:>9.3f} {' '.join(f'{b:.2f}' for b in busy):>28} "
              f"{max(busy) / mean_busy if mean_busy > 0 else 1.0:>9.2f} {' '.join(f'{p:.0f}' for p in peak):>24}  {rows[0][5]}",
              flush=True)


if __name__ == "__main__":
    main()
