"""Peak memory and time of ballast.torch's attention kernels on one causal document
(docs/python.md, "Attention kernels").

    PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/bench_attention_kernel.py \
        [--lengths 1024,4096,16384] [--heads 8] [--kv-heads 8] [--head-dim 64] [--kernel blocked|dense]
        [--block-tokens 512] [--device cpu|cuda] [--repeats 3]

Each length runs in a fresh process: forward + backward of ``varlen_attention`` (float32).
Memory: the peak resident set size above the one before the call (a thread samples
/proc/self/statm every 0.2 ms; on CUDA torch.cuda.max_memory_allocated instead); an upper
bound of the live tensors, since freed heap memory may stay resident. ``--kernel dense``
is the implementation before the kernels (the full (heads, n, n) score matrix, autograd
backward), plugged in as a custom kernel object. Figures only; nothing passes or fails.
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def _resident_bytes():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakResident:
    """The largest resident set size seen while the block runs, sampled by a thread."""

    def __enter__(self):
        self.baseline = self.peak = _resident_bytes()
        self._running = True
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while self._running:
            self.peak = max(self.peak, _resident_bytes())
            time.sleep(0.0002)

    def __exit__(self, *_):
        self._running = False
        self._thread.join()
        self.peak = max(self.peak, _resident_bytes())


def dense_kernel():
    """The attention before the kernels: the full score matrix in the input dtype."""
    import torch

    class DenseKernel:
        name = "dense"

        def _scores_and_values(self, q, k, v, layout, scale):
            group = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            qd, qp, kd, kp = layout.position_tensors(q.device)
            visible = (qd[:, None] == kd[None, :]) & (kp[None, :] <= qp[:, None])
            scores = torch.einsum("nhd,ehd->hne", q, k) * scale
            return scores.masked_fill(~visible, float("-inf")), v

        def forward(self, q, k, v, layout, scale):
            scores, v = self._scores_and_values(q, k, v, layout, scale)
            out = torch.einsum("hne,ehd->nhd", torch.softmax(scores, dim=-1), v)
            return out, torch.logsumexp(scores, dim=-1).float()

        def backward(self, q, k, v, out, lse, grad_out, layout, scale):
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]
                scores, values = self._scores_and_values(*leaves, layout, scale)
                again = torch.einsum("hne,ehd->nhd", torch.softmax(scores, dim=-1), values)
                return torch.autograd.grad(again, leaves, grad_out)

    return DenseKernel()


def run_one(args):
    import torch
    import ballast.torch as bt

    device = torch.device(args.device)
    kernel = dense_kernel() if args.kernel == "dense" else bt.BlockedAttentionKernel(args.block_tokens)
    n = args.length
    q = torch.randn(n, args.heads, args.head_dim, device=device, requires_grad=True)
    k = torch.randn(n, args.kv_heads, args.head_dim, device=device, requires_grad=True)
    v = torch.randn(n, args.kv_heads, args.head_dim, device=device, requires_grad=True)
    layout = bt.VarlenLayout.causal([0, n])
    small = bt.VarlenLayout.causal([0, 64])
    bt.varlen_attention(q[:64], k[:64], v[:64], small, kernel=kernel).sum().backward()  # warm up
    q.grad = k.grad = v.grad = None

    def step():
        out = bt.varlen_attention(q, k, v, layout, kernel=kernel)
        out.backward(torch.ones_like(out))
        if device.type == "cuda":
            torch.cuda.synchronize()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        with PeakResident() as memory:
            step()
        peak = memory.peak - memory.baseline
    times = []
    for _ in range(args.repeats):
        q.grad = k.grad = v.grad = None
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    print(json.dumps({"tokens": n, "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                      "kernel": args.kernel, "peak_bytes": peak, "seconds": sorted(times)[len(times) // 2]}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", default="1024,4096,16384")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--kernel", choices=["blocked", "dense"], default="blocked")
    parser.add_argument("--block-tokens", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--length", type=int, help=argparse.SUPPRESS)  # one length, in a child process
    args = parser.parse_args()
    if args.length:
        run_one(args)
        return
    print(f"{'tokens':>7} {'heads':>5} {'kernel':>8} {'peak MiB':>9} {'dense scores MiB':>16} {'fwd+bwd s':>9}")
    for n in [int(x) for x in args.lengths.split(",")]:
        child = subprocess.run([sys.executable] + sys.argv + ["--length", str(n)], capture_output=True, text=True)
        if child.returncode:
            print(f"{n:>7} failed: {child.stderr.strip().splitlines()[-1:]}")
            continue
        row = json.loads(child.stdout.strip().splitlines()[-1])
        dense_mib = args.heads * n * n * 4 / 2**20
        print(f"{n:>7} {args.heads:>5} {args.kernel:>8} {row['peak_bytes'] / 2**20:>9.1f} {dense_mib:>16.0f} "
              f"{row['seconds']:>9.2f}")


if __name__ == "__main__":
    main()
