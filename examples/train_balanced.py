"""Train a small Llama-style model on balanced batches: ballast's PyTorch glue in a
complete training loop you can copy into yours.

Run (4 processes on one machine, gloo on CPU; PYTHONPATH holds the built `ballast`):

    export PYTHONPATH=build/python OMP_NUM_THREADS=1
    torchrun --nproc_per_node 4 examples/train_balanced.py
    torchrun --nproc_per_node 4 examples/train_balanced.py --strategy zeppelin:remap=on --rank-tokens 512
    torchrun --nproc_per_node 4 examples/train_balanced.py --grad-sync all-reduce   # no DDP: one sum per parameter
    python3 examples/train_balanced.py --strategy packed-dp      # one process, no torch.distributed
    torchrun --nproc_per_node 8 examples/train_balanced.py --device cuda   # one GPU per process, NCCL

`--device` picks the device and the backend together: `cpu` runs on gloo, `cuda` puts
each process on the GPU of its LOCAL_RANK (torch.cuda.set_device) and runs on NCCL; the
model and every batch live on that device, and so does every index tensor ballast.torch
builds from the plan.

On Debian 12 (python3-torch 1.13 under Python 3.11) torchrun fails at start with
"AttributeError: 'NoneType' object has no attribute 'get'" (its default `--redirects 0`
no longer parses there); add `--redirects 1 --tee 1`, which keeps the output on the console:

    /usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 --redirects 1 --tee 1 examples/train_balanced.py

What happens per step: every rank draws the same global batch of documents, plans it with
ballast (the same plan everywhere, no communication), and loads only its share: packed
pieces of documents, in the plan's linear layout, one micro-batch at a time. The model
moves q, k, v to the plan's attention layout (`remap`), runs the plan's attention groups
(`attention`) and moves the output back. The loss weights make the sum over ranks and
micro-batches the mean loss of the whole global batch. Gradients are synchronized by
torch's DistributedDataParallel (`--grad-sync ddp`, the default): bucketed all-reduces
overlapped with the backward of the step's last micro-batch (the others accumulate
locally under `no_sync()`), averaging over the ranks, so the loss weights are multiplied
by the world size (`collate(..., loss_scale=world_size)`) and the average is the gradient
of the global batch's mean loss. `--grad-sync all-reduce` sums them instead after the last
micro-batch (`ballast.torch.all_reduce_gradients`, one all-reduce per parameter, loss
scale 1). The parts to keep in your loop are marked (*).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import ballast.torch as bt
import tiny_transformer as tt  # the model and data of this example (examples/tiny_transformer.py)


#: --grad-sync: how gradients are combined over ranks at the end of a global batch.
GRADIENT_SYNCS = ("ddp", "all-reduce")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--strategy", default="zeppelin", help="ballast strategy spec (ballast.strategies())")
    parser.add_argument("--steps", type=int, default=4, help="global batches (optimizer steps)")
    parser.add_argument("--tokens-per-step", type=int, default=2048, help="tokens per global batch (after scaling)")
    parser.add_argument("--length-scale", type=int, default=64,
                        help="divide the dataset's document lengths by this (128K -> 2K at 64)")
    parser.add_argument("--dataset", default="wlbllm", help="length distribution (ballast.datasets())")
    parser.add_argument("--rank-tokens", type=int, default=2048,
                        help="activation memory of one rank, in tokens (the emulated GPU's memory)")
    parser.add_argument("--gpus-per-node", type=int, default=2, help="ranks per emulated node")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (torch.distributed backend gloo) or cuda (one GPU per process, backend nccl)")
    parser.add_argument("--grad-sync", choices=GRADIENT_SYNCS, default="ddp",
                        help="ddp: DistributedDataParallel (bucketed all-reduce during the last micro-batch's "
                             "backward, averaging; loss weights x world size); all-reduce: "
                             "ballast.torch.all_reduce_gradients after it (one sum per parameter)")
    return parser.parse_args()


def select_device(name: str, rank: int) -> torch.device:
    """(*) This process's device: the CPU, or the GPU of its local rank (LOCAL_RANK, set by
    torchrun; without it rank % GPUs of the machine), made current before the process group
    exists so that NCCL and every `.cuda()` use it."""
    if name == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: this process sees no CUDA device; use --device cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def backend_for(device: torch.device) -> str:
    """The torch.distributed backend for tensors on ``device``: NCCL for GPUs, gloo for the CPU."""
    return "nccl" if device.type == "cuda" else "gloo"


def wrap_for_gradient_sync(model: torch.nn.Module, grad_sync: str, device: torch.device) -> torch.nn.Module:
    """(*) The module the loop trains: ``model`` inside DistributedDataParallel (``grad_sync``
    "ddp" and torch.distributed running), else ``model`` itself (gradients summed by
    ``finish_step``). DDP's default process group is the world: every rank is one data-parallel
    rank of the plan. (Under tensor parallelism pass
    ``process_group=groups.data_parallel_group(N)``; docs/python.md.) Every parameter gets a
    gradient on every rank in every micro-batch, also on a rank without tokens (its empty
    tensors still run through every layer, and its gradients are zero), so DDP needs no
    ``find_unused_parameters``."""
    if grad_sync not in GRADIENT_SYNCS:
        raise ValueError(f"grad_sync must be one of {', '.join(GRADIENT_SYNCS)}; got {grad_sync!r}")
    if grad_sync != "ddp" or not dist.is_initialized():
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def loss_scale_for(model: torch.nn.Module) -> float:
    """(*) ``collate``'s ``loss_scale`` for the module the loop trains: DDP averages gradients
    over the ranks of its process group, so the loss weights are multiplied by that group's
    size; a sum (``all_reduce_gradients``) needs 1."""
    if isinstance(model, DistributedDataParallel):
        return float(dist.get_world_size(model.process_group))
    return 1.0


def gradient_sync_context(model: torch.nn.Module, batch: bt.PackedBatch) -> contextlib.AbstractContextManager:
    """(*) Around a micro-batch's forward and backward: under DDP, ``no_sync()`` for all but
    the step's last micro-batch (their gradients accumulate locally), so DDP all-reduces once
    per global batch, during the last backward. Every rank has the same micro-batch count
    (the sampler yields one item per micro-batch of the plan, empty ones included), so every
    rank syncs in the same backward."""
    if isinstance(model, DistributedDataParallel) and batch.micro_batch + 1 < batch.num_micro_batches:
        return model.no_sync()
    return contextlib.nullcontext()


def train_micro_batch(model: torch.nn.Module, batch: bt.PackedBatch, groups: bt.ProcessGroups,
                      device: torch.device) -> torch.Tensor:
    """(*) Forward and backward of one micro-batch of this rank on ``device``; returns the loss
    (detached). Gradients accumulate in the model over the micro-batches of a step. ``model``
    may be the DDP wrapper (call it inside ``gradient_sync_context``)."""
    # The loader packs on the CPU (also in worker processes); the step runs on the device.
    batch = batch.to(device, non_blocking=True)
    # Forward on this rank's tokens: embeddings, projections and loss in the linear layout;
    # planned_attend remaps q, k, v, runs bt.attention and remaps back (see
    # tiny_transformer.planned_attend). RoPE uses batch.position_ids: positions inside each
    # document, continuing across a split. Run it even when the rank holds no token in this
    # micro-batch (the tensors are empty): the others wait for it.
    logits = model(batch.input_ids, batch.position_ids, tt.planned_attend(batch, groups))
    # Weighted sum: over all ranks and micro-batches, the mean over the global batch.
    loss = (tt.token_losses(logits, batch.labels) * batch.loss_weight).sum()
    loss.backward()
    return loss.detach()


def finish_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step_loss: torch.Tensor) -> None:
    """(*) End of the global batch: without DDP sum the gradients over ranks (not average: the
    loss weights already divide by the global target count; DDP has averaged them during the
    last backward), then step. ``step_loss`` (on the device, as NCCL needs) becomes the global
    batch's loss: the sum over ranks, divided by the loss scale."""
    if dist.is_initialized():
        if not isinstance(model, DistributedDataParallel):
            bt.all_reduce_gradients(model.parameters())
        dist.all_reduce(step_loss)
        step_loss /= loss_scale_for(model)
    optimizer.step()
    optimizer.zero_grad(set_to_none=False)


def main() -> None:
    args = parse_arguments()
    torch.set_num_threads(1)

    # (*) The process group, from the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR,
    # MASTER_PORT). Without a launcher: one process, no torch.distributed.
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    device = select_device(args.device, rank)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend_for(device), rank=rank, world_size=world_size)
        # One collective over the world before the first remap: NCCL's batched point-to-point
        # (batch_isend_irecv) lets a subset of ranks take part only once the group has run one.
        dist.barrier()

    # The model: same seed, same initial weights on every rank (drawn on the CPU, then moved).
    torch.manual_seed(args.seed)
    config = tt.TinyConfig()
    model = tt.TinyTransformer(config).to(device)
    trained = wrap_for_gradient_sync(model, args.grad_sync, device)  # (*) DDP by default

    # (*) Describe the job to ballast: the cluster it runs on (here: one emulated GPU per
    # process, memory for --rank-tokens tokens) and the model. With real GPUs use a preset,
    # e.g. ballast.Cluster.load("h100", nodes=world_size // 8) and model="llama-7b".
    planning_model = tt.planning_model(config, tt.parameter_count(model))
    cluster = tt.emulated_cluster(world_size, args.gpus_per_node, args.rank_tokens, planning_model)

    # Data: documents of real text with a real length distribution; `lengths[i]` is the
    # token count of document i, `batches` the global batches as index lists (the same on
    # every rank; a BatchSampler over a RandomSampler with a seeded generator also works).
    lengths, batches = tt.sample_documents(args.steps, args.tokens_per_step, dataset=args.dataset,
                                           length_scale=args.length_scale, seed=args.seed)
    documents = tt.ByteDocuments(lengths, seed=args.seed)

    # (*) The balanced loader: one PackedBatch (this rank's packed tokens) per micro-batch.
    sampler = bt.BalancedBatchSampler(lengths, batches, rank=rank, world_size=world_size, cluster=cluster,
                                      model=planning_model, strategy=args.strategy)
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler,
                                         collate_fn=functools.partial(bt.collate, loss_scale=loss_scale_for(trained)),
                                         num_workers=args.workers,
                                         pin_memory=device.type == "cuda")
    groups = bt.ProcessGroups()  # (*) the plans' attention process groups, made once each
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    step_loss = torch.zeros(1, device=device)
    started = time.perf_counter()
    for batch in loader:
        with gradient_sync_context(trained, batch):
            step_loss += train_micro_batch(trained, batch, groups, device)
        if batch.micro_batch + 1 < batch.num_micro_batches:
            continue
        finish_step(trained, optimizer, step_loss)
        if rank == 0:
            plan = batch.plan
            schemes = sorted({g.scheme for mb in plan.micro_batches for g in mb.groups})
            print(f"step {batch.step_info.step}: loss {step_loss.item():.4f}  documents {len(plan.lengths)}  "
                  f"tokens {int(plan.lengths.sum())}  micro-batches {plan.num_micro_batches}  "
                  f"schemes {','.join(schemes)}  {time.perf_counter() - started:.2f} s", flush=True)
        step_loss.zero_()
        started = time.perf_counter()

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
