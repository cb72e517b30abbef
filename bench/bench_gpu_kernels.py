"""What a CUDA GPU achieves on the two kernels the cost model prices by efficiency: causal
attention (docs/fidelity.md, "Curve points of the presets") and the linear modules' GEMMs
(`matmul_efficiency`, docs/cost-model.md). Figures only; nothing passes or fails.

    python3 bench/bench_gpu_kernels.py [--lengths 512,1024,...] [--peak-tflops 989]
                                       [--repeats 20] [--out FILE.json]

Needs PyTorch 2.x with CUDA (not Debian's CPU-only 1.13): run it on the GPU machine.

Attention: FlashAttention's benchmark shape (BF16, head dim 128, 16 heads = hidden 2048,
batch x length = 16K tokens, causal), through torch's scaled_dot_product_attention with
each backend it has (flash: FlashAttention-2's kernels; cudnn; efficient), forward and
backward timed apart with CUDA events (median of --repeats after 3 warm-ups). FLOPs by
FlashAttention's convention: forward 4 * batch * heads * length^2 * head_dim / 2 (causal),
backward 2.5x forward.

GEMMs: LLaMA-2-7B's linear modules at 16,384 tokens (QKV, output, gate+up, down; BF16),
forward (tokens x in) @ (in x out), and the backward's two products (input gradient,
weight gradient); FLOPs 2 * m * n * k each.
"""

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def cuda_time_ms(fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def backends():
    from torch.nn.attention import SDPBackend
    names = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION"}
    return {name: getattr(SDPBackend, attr) for name, attr in names.items() if hasattr(SDPBackend, attr)}


def attention(lengths, repeats, peak):
    from torch.nn.attention import sdpa_kernel
    rows = []
    heads, head_dim, total = 16, 128, 16384
    for name, backend in backends().items():
        for length in lengths:
            batch = max(1, total // length)
            shape = (batch, heads, length, head_dim)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
            flops = 4 * batch * heads * length * length * head_dim / 2
            row = {"kernel": "attention", "backend": name, "length": length, "batch": batch}
            try:
                with sdpa_kernel([backend]):
                    forward_ms = cuda_time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                              repeats)
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    backward_ms = cuda_time_ms(lambda: out.backward(grad, retain_graph=True), repeats)
                row.update(forward_ms=forward_ms, backward_ms=backward_ms,
                           forward_tflops=flops / forward_ms / 1e9,
                           backward_tflops=2.5 * flops / backward_ms / 1e9)
                row["forward_efficiency"] = row["forward_tflops"] / peak
                row["backward_efficiency"] = row["backward_tflops"] / peak
            except Exception as error:  # a backend this GPU or build lacks
                row["error"] = f"{type(error).__name__}: {error}"[:200]
            rows.append(row)
            print(json.dumps(row), flush=True)
            del q, k, v, grad
    return rows


def gemms(repeats, peak):
    tokens, hidden, ffn = 16384, 4096, 11008
    modules = {"qkv": (hidden, 3 * hidden), "output": (hidden, hidden),
               "gate_up": (hidden, 2 * ffn), "down": (ffn, hidden)}
    rows = []
    for name, (n_in, n_out) in modules.items():
        x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n_in, n_out, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
        flops = 2 * tokens * n_in * n_out
        forward_ms = cuda_time_ms(lambda: x @ w, repeats)
        input_grad_ms = cuda_time_ms(lambda: dy @ w.t(), repeats)
        weight_grad_ms = cuda_time_ms(lambda: x.t() @ dy, repeats)
        row = {"kernel": "gemm", "module": name, "tokens": tokens, "in": n_in, "out": n_out,
               "forward_ms": forward_ms, "input_grad_ms": input_grad_ms, "weight_grad_ms": weight_grad_ms,
               "forward_tflops": flops / forward_ms / 1e9,
               "backward_tflops": 2 * flops / (input_grad_ms + weight_grad_ms) / 1e9}
        row["forward_efficiency"] = row["forward_tflops"] / peak
        row["backward_efficiency"] = row["backward_tflops"] / peak
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="512,1024,2048,4096,8192,16384")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="dense BF16 peak (H100/H200: 989)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu_kernels: no CUDA device (run it on the GPU machine)")
    torch.manual_seed(0)
    lengths = [int(x) for x in args.lengths.split(",")]
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "peak_tflops": args.peak_tflops,
              "attention": attention(lengths, args.repeats, args.peak_tflops),
              "gemm": gemms(args.repeats, args.peak_tflops)}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
