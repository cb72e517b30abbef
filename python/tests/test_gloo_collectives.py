"""What torch.distributed's gloo backend runs, checked rather than assumed (docs/python.md):
2 gloo processes exchange uneven splits with all_to_all_single and batch_isend_irecv, the
collectives a Ulysses or remap implementation on CPU would need. The test asserts those two;
it only reports (-s) the collectives this torch's gloo lacks (Debian's 1.13: the list form
all_to_all and reduce_scatter), since newer torch versions may add them.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
from gloo_workers import run_workers  # noqa: E402

WORLD_SIZE = 2
TIMEOUT_S = 120


def _rows(splits: list[int], value_of) -> torch.Tensor:
    return torch.cat([torch.full((rows, 3), float(value_of(peer))) for peer, rows in enumerate(splits)])


def _all_to_all_single(rank: int) -> str:
    # Rank r sends (r + 1) * (p + 1) rows to rank p: every split differs from the others.
    sent = [(rank + 1) * (peer + 1) for peer in range(WORLD_SIZE)]
    received = [(peer + 1) * (rank + 1) for peer in range(WORLD_SIZE)]
    out = torch.empty(sum(received), 3)
    dist.all_to_all_single(out, _rows(sent, lambda peer: 100 * rank + peer),
                           output_split_sizes=received, input_split_sizes=sent)
    return "ok" if torch.equal(out, _rows(received, lambda peer: 100 * peer + rank)) else "wrong"


def _batch_isend_irecv(rank: int) -> str:
    peer = 1 - rank
    sent = torch.arange((rank + 1) * 5, dtype=torch.float32) + 1000 * rank
    received = torch.empty((peer + 1) * 5)
    ops = [dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, received, peer)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    expected = torch.arange((peer + 1) * 5, dtype=torch.float32) + 1000 * peer
    return "ok" if torch.equal(received, expected) else "wrong"


def _all_to_all_list(rank: int) -> str:
    outs = [torch.empty(peer + 1) for peer in range(WORLD_SIZE)]
    dist.all_to_all(outs, [torch.full((rank + 1,), float(rank)) for _ in range(WORLD_SIZE)])
    return "ok" if all(torch.equal(o, torch.full((p + 1,), float(p))) for p, o in enumerate(outs)) else "wrong"


def _reduce_scatter(rank: int) -> str:
    out = torch.empty(4)
    dist.reduce_scatter(out, [torch.full((4,), float(rank)) for _ in range(WORLD_SIZE)])
    return "ok" if torch.equal(out, torch.full((4,), float(sum(range(WORLD_SIZE))))) else "wrong"


CHECKS = {"all_to_all_single uneven": _all_to_all_single, "batch_isend_irecv": _batch_isend_irecv,
          "all_to_all (list)": _all_to_all_list, "reduce_scatter": _reduce_scatter}


def _worker(rank: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    verdicts = {}
    for name, check in CHECKS.items():
        try:  # an unsupported collective raises on every rank before communicating
            verdicts[name] = check(rank)
        except RuntimeError as error:
            verdicts[name] = "unsupported: " + str(error).splitlines()[0]
    Path(f"{out_file}.{rank}").write_text(json.dumps(verdicts))
    dist.destroy_process_group()


def test_gloo_runs_uneven_all_to_all_and_batched_point_to_point(tmp_path: Path) -> None:
    out_file = str(tmp_path / "verdicts")
    run_workers(_worker, (str(tmp_path / "init"), out_file), WORLD_SIZE, TIMEOUT_S)
    verdicts = [json.loads(Path(f"{out_file}.{rank}").read_text()) for rank in range(WORLD_SIZE)]
    print(f"\ntorch {torch.__version__}, gloo, {WORLD_SIZE} processes:")
    for name in CHECKS:
        print(f"  {name}: {verdicts[0][name]}")
    for rank, found in enumerate(verdicts):
        assert found["all_to_all_single uneven"] == "ok", (rank, found)
        assert found["batch_isend_irecv"] == "ok", (rank, found)
