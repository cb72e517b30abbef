"""Helpers shared by the Python tests that read a plan's per-rank views or compare a plan
with the CLI's."""

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI = Path(os.environ.get("BALLAST_BUILD_DIR", ROOT / "build")) / "tools" / "ballast"


def covered_tokens(plan, layout):
    """Every (sequence, position) held in `layout` ('linear' or 'attention') over all ranks."""
    tokens = []
    for r in range(plan.ranks):
        for view in plan.rank(r).micro_batches:
            for piece in getattr(view, layout):
                tokens.extend((piece.sequence_id, p) for p in range(piece.begin, piece.end))
    return sorted(tokens)


def cli_plan_json(tmp_path, lengths, *flags):
    """`ballast plan` of one batch of `lengths` (a lengths file read in order) with `flags`:
    the plan JSON the CLI prints."""
    lengths_file = tmp_path / "lengths.txt"
    lengths_file.write_text("\n".join(map(str, lengths)) + "\n")
    return subprocess.run([str(CLI), "plan", "--dataset", str(lengths_file), "--sampling", "sequential",
                           "--batch-size", str(len(lengths)), *flags],
                          capture_output=True, text=True, check=True).stdout
