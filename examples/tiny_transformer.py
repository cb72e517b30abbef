"""A tiny Llama-style transformer, byte-level documents of real text, and the planning
inputs that describe them to ballast: shared by examples/train_balanced.py and the tests
(python/tests/test_torch_distributed.py).

The model takes packed tokens (one row per token, documents back to back) and an
``attend(q, k, v)`` callable, so the same weights run single-process (``local_attend``:
causal attention inside each document) or under a ballast plan (``planned_attend``:
linear -> attention remap, the plan's attention, remap back).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import ballast
import ballast.torch as bt

#: attend(q, k, v) -> out: q (T, heads, head_dim), k and v (T, kv_heads, head_dim), rows in
#: the linear layout; out (T, heads, head_dim).
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    """The model's shape (the defaults of ``ballast run``'s runtime model)."""

    vocab: int = 256          # byte-level tokens
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2         # grouped-query attention
    ffn_hidden: int = 172     # SwiGLU
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class RMSNorm(nn.Module):
    """x / rms(x) * weight over the last dimension."""

    def __init__(self, size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, position_ids: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half form) of x (T, heads, head_dim) at each token's position
    inside its document, so a document split over ranks gets the same rotation as whole."""
    half = x.shape[-1] // 2
    inverse_frequency = theta ** (-torch.arange(0, half, dtype=torch.float32, device=x.device) / half)
    angles = position_ids.to(torch.float32)[:, None] * inverse_frequency[None, :]  # (T, half)
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


class Block(nn.Module):
    """Pre-norm attention (GQA, RoPE) and SwiGLU MLP, no biases."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        d = config.head_dim
        self.attention_norm = RMSNorm(config.hidden)
        self.wq = nn.Linear(config.hidden, config.heads * d, bias=False)
        self.wk = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.wv = nn.Linear(config.hidden, config.kv_heads * d, bias=False)
        self.wo = nn.Linear(config.heads * d, config.hidden, bias=False)
        self.mlp_norm = RMSNorm(config.hidden)
        self.w_gate = nn.Linear(config.hidden, config.ffn_hidden, bias=False)
        self.w_up = nn.Linear(config.hidden, config.ffn_hidden, bias=False)
        self.w_down = nn.Linear(config.ffn_hidden, config.hidden, bias=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        c = self.config
        tokens = x.shape[0]
        h = self.attention_norm(x)                                  # (T, hidden)
        q = self.wq(h).view(tokens, c.heads, c.head_dim)           # (T, heads, d)
        k = self.wk(h).view(tokens, c.kv_heads, c.head_dim)        # (T, kv_heads, d)
        v = self.wv(h).view(tokens, c.kv_heads, c.head_dim)
        q, k = rope(q, position_ids, c.rope_theta), rope(k, position_ids, c.rope_theta)
        x = x + self.wo(attend(q, k, v).reshape(tokens, c.heads * c.head_dim))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class TinyTransformer(nn.Module):
    """Embedding, ``layers`` blocks, final RMSNorm, LM head tied to the embedding."""

    def __init__(self, config: TinyConfig = TinyConfig()) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab, config.hidden)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = RMSNorm(config.hidden)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Logits (T, vocab) of packed tokens (T,) at document positions (T,)."""
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x, position_ids, attend)
        return self.norm(x) @ self.embed.weight.t()


def local_attend(cu_seqlens: torch.Tensor) -> Attend:
    """Single-process attention: causal inside each document of ``cu_seqlens``."""
    return lambda q, k, v: bt.local_attention(q, k, v, cu_seqlens)


def planned_attend(batch: bt.PackedBatch, groups: bt.ProcessGroups) -> Attend:
    """Attention under the plan: q, k, v to the attention layout (one remap for the three),
    the plan's attention groups, the output back to the linear layout."""

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads, kv_heads = q.shape[1], k.shape[1]
        qkv = bt.remap(torch.cat([q, k, v], dim=1), batch, groups, "to_attention")
        q, k, v = qkv.split([heads, kv_heads, kv_heads], dim=1)
        out = bt.attention(q, k, v, batch, groups)
        return bt.remap(out, batch, groups, "to_linear")

    return attend


def token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy; 0 where the label is ``IGNORE_INDEX``."""
    return F.cross_entropy(logits, labels, ignore_index=bt.IGNORE_INDEX, reduction="none")


# ---------------------------------------------------------------------------------------
# Describing the job to ballast
# ---------------------------------------------------------------------------------------


def activation_bytes_per_token(config: TinyConfig) -> float:
    """fp32 activations kept per token (inputs of both norms, q, k, v, attention output,
    MLP gate/up/activation, residuals; as ballast's runtime estimates its model)."""
    per_layer = 6.0 * config.hidden + 2.0 * config.kv_heads * config.head_dim + 3.0 * config.ffn_hidden
    return 4.0 * (per_layer * config.layers + 2.0 * config.hidden + config.vocab)


def planning_model(config: TinyConfig, parameters: int) -> ballast.Model:
    """The model as ballast's planner sees it (fp32; heads and KV heads for Ulysses checks)."""
    model = ballast.Model()
    model.name = "tiny-transformer"
    model.layers = config.layers
    model.hidden = config.hidden
    model.heads = config.heads
    model.kv_heads = config.kv_heads
    model.ffn_hidden = config.ffn_hidden
    model.vocab = config.vocab
    model.gated_mlp = True
    model.bytes_per_element = 4
    model.activation_bytes_per_token = activation_bytes_per_token(config)
    model.parameters = float(parameters)
    model.provenance = "examples/tiny_transformer.py, fp32"
    model.validate()
    return model


def emulated_cluster(world_size: int, gpus_per_node: int, rank_tokens: int, model: ballast.Model) -> ballast.Cluster:
    """One CPU process per emulated GPU, ``gpus_per_node`` per emulated node, memory for
    ``rank_tokens`` tokens of activations plus the ZeRO-3 share of the model states: the
    cluster ``ballast run`` plans for (``ballast.Cluster.emulated``, calibrated to the
    runtime's CPU kernels)."""
    cluster = ballast.Cluster.emulated(model, world_size, gpus_per_node, rank_tokens)
    cluster.validate()
    return cluster


# ---------------------------------------------------------------------------------------
# Real text, cut into documents with a real length distribution
# ---------------------------------------------------------------------------------------

DEFAULT_CORPUS = "/usr/share/common-licenses"


def load_corpus(path: str = DEFAULT_CORPUS) -> np.ndarray:
    """The bytes of a text file, or of a folder's files sorted by name (links only when they
    add a file), joined by blank lines: ``ballast run``'s default corpus."""
    root = Path(path)
    if root.is_file():
        return np.frombuffer(root.read_bytes(), dtype=np.uint8)
    if not root.is_dir():
        raise FileNotFoundError(f"corpus: {path} is neither a file nor a folder of text files")
    files = sorted((p for p in root.iterdir() if p.is_file() and not p.is_symlink()), key=lambda p: p.name)
    seen = {os.path.realpath(p) for p in files}
    for link in sorted((p for p in root.iterdir() if p.is_file() and p.is_symlink()), key=lambda p: p.name):
        if os.path.realpath(link) not in seen:
            seen.add(os.path.realpath(link))
            files.append(link)
    files.sort(key=lambda p: p.name)
    texts = [p.read_bytes() for p in files]
    text = b"\n\n".join(t for t in texts if t)
    if not text:
        raise FileNotFoundError(f"corpus: no readable, non-empty file in {path}")
    return np.frombuffer(text, dtype=np.uint8)


class ByteDocuments(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Documents of the given lengths, consecutive bytes of the corpus from seeded offsets.

    ``documents[i]`` is a LongTensor of ``lengths[i]`` byte values (vocabulary 256).
    """

    def __init__(self, lengths: Sequence[int], corpus: Optional[np.ndarray] = None, seed: int = 0) -> None:
        self.corpus = load_corpus() if corpus is None else corpus
        self.lengths = np.asarray(lengths, dtype=np.int64)
        rng = np.random.default_rng(seed)
        self.offsets = rng.integers(0, len(self.corpus), size=len(self.lengths))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        positions = (self.offsets[index] + np.arange(self.lengths[index])) % len(self.corpus)
        return torch.from_numpy(self.corpus[positions].astype(np.int64))


def sample_documents(steps: int, tokens_per_step: int, *, dataset: str = "wlbllm", length_scale: int = 64,
                     seed: int = 0) -> Tuple[np.ndarray, List[List[int]]]:
    """Document lengths of ``steps`` global batches and the batches as index lists.

    Lengths come from ballast's sampler (``dataset``, e.g. WLB-LLM's 128K pre-training
    lengths) with ``tokens_per_step * length_scale`` tokens per step, divided by
    ``length_scale`` (rounded up) so the distribution keeps its shape at CPU size: what
    ``ballast run --length-scale`` does. Returns (lengths of every document, batches).
    """
    drawn = ballast.sample_batches(dataset, tokens_per_step=tokens_per_step * length_scale, steps=steps, seed=seed)
    lengths: List[int] = []
    batches: List[List[int]] = []
    for batch in drawn:
        scaled = [int(-(-int(length) // length_scale)) for length in batch]
        batches.append(list(range(len(lengths), len(lengths) + len(scaled))))
        lengths += scaled
    return np.asarray(lengths, dtype=np.int64), batches


def parameter_count(model: nn.Module) -> int:
    """Number of parameters (the planner's model size)."""
    return sum(p.numel() for p in model.parameters())
