"""Shared set-up of the Python tests: examples/ on sys.path, for the tiny transformer of
examples/tiny_transformer.py (the torch tests skip themselves where PyTorch is missing)."""

import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))
