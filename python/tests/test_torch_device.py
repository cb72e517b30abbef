"""Device placement without a GPU: examples/train_balanced.py's micro-batch step, with
ballast.torch's remap and attention, runs on PyTorch's ``meta`` device (shapes, no data)
for every rank of a 4-rank plan, under a stand-in for torch.distributed that communicates
nothing and records the device of every tensor handed to it. Every tensor made during the
step (index tensors included), every tensor given to a collective, the loss and the
gradients must be on ``meta``: an index tensor built on the CPU, as a CUDA run would
get it, is caught here. Also: --device picks the GPU of LOCAL_RANK and NCCL, and the
example trains end to end on CPU/gloo with 2 processes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator, List

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.overrides  # noqa: E402

import ballast._torch_distributed as btd  # noqa: E402
import ballast._torch_schemes as bts  # noqa: E402
import ballast.torch as bt  # noqa: E402
import tiny_transformer as tt  # noqa: E402  (examples/, put on sys.path by conftest.py)
import train_balanced as tb  # noqa: E402

META = torch.device("meta")
WORLD_SIZE = 4
CONFIG = tt.TinyConfig()
PLANNING_MODEL = tt.planning_model(CONFIG, 120_000)
# strategy, activation memory per rank (tokens): local groups, rings, ring + remap,
# Ulysses (GQA), ranks without tokens in a micro-batch.
CASES = [("packed-dp", 2048), ("static-cp:degree=4", 2048), ("zeppelin:remap=on", 512), ("flexsp-fast", 2048),
         ("hybrid-dp", 512)]


def tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


class DeviceRecorder(torch.overrides.TorchFunctionMode):
    """Records each torch call (factories included) whose tensor arguments span several
    devices or whose result lies off ``device``. Indexing (``x[index]``) does not reach a
    mode in torch 1.13, but the index tensors are made inside the step, so their factory
    call is caught."""

    def __init__(self, device: torch.device) -> None:
        super().__init__()
        self.device = device
        self.wrong: List[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        name = getattr(func, "__name__", repr(func))
        inputs = {str(t.device) for t in tensors_in((args, kwargs))}
        if len(inputs) > 1:
            self.wrong.append(f"{name}: arguments on {sorted(inputs)}")
        result = func(*args, **kwargs)
        outputs = {str(t.device) for t in tensors_in(result)}
        if outputs - {str(self.device)}:
            self.wrong.append(f"{name}: result on {sorted(outputs)}")
        return result


class _Done:
    def wait(self) -> None:
        pass


class RecordingDistributed:
    """torch.distributed as one rank of ``world_size`` sees it, moving no data: records
    (call, device) of every tensor handed to a collective or a point-to-point call."""

    ReduceOp = dist.ReduceOp

    class P2POp:
        def __init__(self, op: Any, tensor: torch.Tensor, peer: int, group: Any = None, tag: int = 0) -> None:
            self.op, self.tensor, self.peer = op, tensor, peer

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.calls: List[tuple] = []

    def _record(self, name: str, *tensors: torch.Tensor) -> _Done:
        self.calls += [(name, t.device) for t in tensors]
        return _Done()

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def get_world_size(self, group: Any = None) -> int:
        return self.world_size

    def new_group(self, ranks: List[int], backend: Any = None) -> tuple:
        return tuple(ranks)

    def all_gather(self, parts: List[torch.Tensor], tensor: torch.Tensor, group: Any = None) -> _Done:
        return self._record("all_gather", tensor, *parts)

    def all_reduce(self, tensor: torch.Tensor, op: Any = None, group: Any = None) -> _Done:
        return self._record("all_reduce", tensor)

    def all_to_all_single(self, output: torch.Tensor, tensor: torch.Tensor, output_split_sizes: Any = None,
                          input_split_sizes: Any = None, group: Any = None) -> _Done:
        return self._record("all_to_all_single", output, tensor)

    def isend(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> _Done:
        return self._record("isend", tensor)

    def irecv(self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> _Done:
        return self._record("irecv", tensor)

    def batch_isend_irecv(self, ops: List[Any]) -> List[_Done]:
        return [op.op(op.tensor, op.peer) for op in ops]


@pytest.fixture(scope="module")
def data():
    lengths, batches = tt.sample_documents(2, 2048, seed=0)
    return lengths, batches, tt.ByteDocuments(lengths, seed=0)


@pytest.mark.parametrize("strategy,rank_tokens", CASES)
def test_the_example_step_keeps_every_tensor_on_the_data_device(data, monkeypatch, strategy, rank_tokens):
    lengths, batches, documents = data
    cluster = tt.emulated_cluster(WORLD_SIZE, 2, rank_tokens, PLANNING_MODEL)
    seen = {"remapped": False, "split": False}
    every_call = set()
    for rank in range(WORLD_SIZE):
        fake = RecordingDistributed(WORLD_SIZE)
        monkeypatch.setattr(btd, "dist", fake)
        monkeypatch.setattr(bts, "dist", fake)
        monkeypatch.setattr(tb, "dist", fake)
        sampler = bt.BalancedBatchSampler(lengths, batches, rank=rank, world_size=WORLD_SIZE, cluster=cluster,
                                          model=PLANNING_MODEL, strategy=strategy)
        loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler,
                                             collate_fn=bt.collate)
        model = tt.TinyTransformer(CONFIG).to(META)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        groups = bt.ProcessGroups()
        for batch in loader:  # packed on the CPU, as a DataLoader does
            seen["remapped"] |= batch.remapped
            seen["split"] |= bool(batch.step_info.group_rank_sets())
            step_loss = torch.zeros(1, device=META)
            with DeviceRecorder(META) as recorder:
                step_loss += tb.train_micro_batch(model, batch, groups, META)
            where = f"{strategy}, rank {rank}, step {batch.step_info.step}, micro-batch {batch.micro_batch}"
            assert recorder.wrong == [], f"{where}: tensors off the meta device: {recorder.wrong}"
            assert step_loss.device == META, where
            assert all(p.grad is not None and p.grad.device == META for p in model.parameters()), where
            if batch.micro_batch + 1 == batch.num_micro_batches:
                # Outside the recorder: AdamW keeps its step counts on the CPU by design.
                tb.finish_step(model, optimizer, step_loss)
        assert fake.calls and {device for _, device in fake.calls} == {META}, fake.calls
        names = {name for name, _ in fake.calls}
        every_call |= names
        assert "all_reduce" in names  # the gradient sum and the step loss
        if seen["split"]:  # the schemes communicate: K/V blocks (ring) or all-to-alls
            assert names & {"all_to_all_single", "isend"}, names
    if strategy.startswith("zeppelin"):
        assert seen["remapped"] and {"isend", "irecv"} <= every_call, "the remap was not exercised"
    if strategy != "packed-dp":
        assert seen["split"], "no attention group over several ranks"


def test_select_device_takes_the_gpu_of_the_local_rank(monkeypatch):
    assert tb.select_device("cpu", 3) == torch.device("cpu")
    assert tb.backend_for(torch.device("cpu")) == "gloo"
    current: List[int] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert tb.select_device("cuda", 7) == torch.device("cuda", 3)
    monkeypatch.delenv("LOCAL_RANK")
    assert tb.select_device("cuda", 6) == torch.device("cuda", 2)  # rank % GPUs without a launcher
    assert current == [3, 2]
    assert tb.backend_for(torch.device("cuda", 2)) == "nccl"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_example_trains_on_cpu_with_gloo():
    """4 processes as torchrun would start them (docs/python.md's command), 2 steps."""
    example = Path(tb.__file__)
    port = str(free_port())
    processes = []
    for rank in range(WORLD_SIZE):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=port, OMP_NUM_THREADS="1")
        command = [sys.executable, str(example), "--device", "cpu", "--strategy", "zeppelin:remap=on",
                   "--rank-tokens", "512", "--steps", "2"]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=300)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    assert all(p.returncode == 0 for p in processes), "\n".join(outputs)
    steps = [line for line in outputs[0].splitlines() if line.startswith("step ")]
    assert len(steps) == 2 and "loss" in steps[0], outputs[0]
