"""The attention kernels' exactness checks on a CUDA device (docs/python.md, "Attention kernels").

    PYTHONPATH=build/python /usr/bin/python3 python/tests/gpu_check_kernels.py

Not a ctest (the CI machines have no GPU): prints "skipped: no CUDA device" and exits 0
where CUDA is missing. On a GPU: the blocked kernel on CUDA against the float64 dense
reference (float32 within 1e-5, bfloat16 within the CPU test's bounds) on varlen packs
and ring-block offsets, GQA and MHA; then, where flash-attn imports, the flash_attn
kernel against the same reference in bfloat16 and float16. Exit 1 on any miss.
"""

from __future__ import annotations

import sys
from typing import List, Optional, Sequence

import torch

import ballast.torch as bt

FP32_TOLERANCE = 1e-5
HALF_OUT_TOLERANCE = 2e-2   # python/tests/test_torch_kernels.py's bfloat16 bounds
HALF_GRAD_TOLERANCE = 5e-2


def _bounds(lengths: Sequence[int]) -> List[int]:
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return bounds


# (name, query lengths, key lengths, query offsets, key offsets, heads, kv_heads)
CASES = [
    ("pack, GQA 8/2", [1, 37, 100, 1, 640, 3], None, None, None, 8, 2),
    ("pack, MHA", [130, 1, 1100], None, None, None, 4, 4),
    ("ring earlier block", [50, 300], [20, 700], [20, 700], [0, 0], 8, 2),
    ("ring diagonal block", [50, 300], [50, 300], [20, 700], [20, 700], 8, 2),
    ("all-gathered keys", [50, 300], [70, 1000], [20, 700], [0, 0], 8, 2),
]


def _check(kernel, dtype: torch.dtype, case, out_tolerance: float, grad_tolerance: float) -> Optional[str]:
    name, query_lengths, key_lengths, query_offsets, key_offsets, heads, kv_heads = case
    layout = bt.VarlenLayout(_bounds(query_lengths), _bounds(key_lengths or query_lengths), query_offsets, key_offsets)
    generator = torch.Generator(device="cuda").manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, device="cuda", generator=generator).to(dtype)  # noqa: E731
    q = randn(layout.query_tokens, heads, 64)
    k, v = randn(layout.key_tokens, kv_heads, 64), randn(layout.key_tokens, kv_heads, 64)
    grad_out = randn(layout.query_tokens, heads, 64)
    scale = 64 ** -0.5
    out, lse = kernel.forward(q, k, v, layout, scale)
    grads = kernel.backward(q, k, v, out, lse, grad_out, layout, scale)
    leaves = [t.double().requires_grad_() for t in (q, k, v)]
    reference_out, reference_lse = bt.dense_attention_reference(*leaves, layout, scale)
    reference_grads = torch.autograd.grad(reference_out, leaves, grad_out.double())
    finite = torch.isfinite(reference_lse)
    out_error = (out.double() - reference_out).abs().max().item()
    lse_error = (lse.double()[finite] - reference_lse[finite]).abs().max().item()
    grad_error = max((g.double() - r).abs().max().item() for g, r in zip(grads, reference_grads))
    verdict = "ok" if out_error <= out_tolerance and lse_error <= out_tolerance and grad_error <= grad_tolerance \
        else "FAIL"
    print(f"{verdict:4} {kernel.name:10} {str(dtype):15} {name:22} out {out_error:.2e} lse {lse_error:.2e} "
          f"grads {grad_error:.2e}")
    return None if verdict == "ok" else name


def main() -> int:
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products exact to 1e-5, not TF32's 1e-3
    print(f"device: {torch.cuda.get_device_name()}")
    failures = []
    blocked = bt.BlockedAttentionKernel()
    for case in CASES:
        failures.append(_check(blocked, torch.float32, case, FP32_TOLERANCE, FP32_TOLERANCE))
        failures.append(_check(blocked, torch.bfloat16, case, HALF_OUT_TOLERANCE, HALF_GRAD_TOLERANCE))
    if bt.FlashAttentionKernel.available():
        flash = bt.FlashAttentionKernel()
        for case in CASES:
            for dtype in (torch.bfloat16, torch.float16):
                failures.append(_check(flash, dtype, case, HALF_OUT_TOLERANCE, HALF_GRAD_TOLERANCE))
    else:
        print("flash_attn: skipped: flash-attn does not import")
    failures = [f for f in failures if f]
    print(f"{'FAILED: ' + ', '.join(failures) if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
