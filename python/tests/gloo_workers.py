"""Starting the gloo worker processes of a test (shared by the torch.distributed tests)."""

from __future__ import annotations

import sys
import time

import pytest
import torch.multiprocessing as torch_mp


def run_workers(worker, args: tuple, world_size: int, timeout_s: float) -> None:
    """Runs ``worker(rank, *args)`` in ``world_size`` processes and waits for them; past
    ``timeout_s`` it kills those still alive and fails the test (a hung collective must not
    hang the suite). A worker that raises fails the test with its traceback."""
    # fork: the workers inherit the imported torch (spawn re-imports it: ~5 s on 2 cores)
    method = "fork" if sys.platform.startswith("linux") else "spawn"
    context = torch_mp.start_processes(worker, args=args, nprocs=world_size, join=False, start_method=method)
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=5):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
            pytest.fail(f"the {world_size} gloo workers did not finish in {timeout_s} s")
