"""ballast.torch: feed a ballast plan to a PyTorch training loop.

``import ballast`` never imports torch; ``import ballast.torch`` does. The pieces, in the
order a training step uses them::

    import ballast.torch as bt

    sampler = bt.BalancedBatchSampler(lengths, batches, rank=rank, world_size=world,
                                      cluster=cluster, model=model, strategy="zeppelin")
    loader = torch.utils.data.DataLoader(bt.PieceDataset(documents), batch_sampler=sampler,
                                         collate_fn=bt.collate)
    groups = bt.ProcessGroups()
    for batch in loader:                       # one micro-batch of this rank (a PackedBatch)
        hidden = embed(batch.input_ids)        # linear layout: this rank's packed tokens
        ...                                    # q, k, v with RoPE at batch.position_ids
        qkv = bt.remap(qkv, batch, groups)     # linear -> attention layout (identity without remap)
        out = bt.attention(q, k, v, batch, groups)
        out = bt.remap(out, batch, groups, "to_linear")
        ...
        per_token = F.cross_entropy(logits, batch.labels, reduction="none")
        (per_token * batch.loss_weight).sum().backward()
        if batch.micro_batch == batch.num_micro_batches - 1:
            bt.all_reduce_gradients(model.parameters())   # SUM: the loss weights already average
            optimizer.step(); optimizer.zero_grad()

``collate`` packs on the CPU; ``batch.to(device)`` moves a PackedBatch, and ``remap`` and
``attention`` build their index tensors on the device of the data they get (gloo on the
CPU, NCCL on GPUs; examples/train_balanced.py's ``--device``).

Every rank computes the same plan from the same lengths, so ranks agree on who holds what
without communicating. Every rank must run every micro-batch (also one where it holds no
tokens: the tensors are then empty), because the attention and the remap communicate.

``attention`` runs each attention group as the plan says (``schemes="planned"``, the
default): local groups attend within their documents, rings pass K/V blocks between
members with ``batch_isend_irecv``, Ulysses groups ``all_to_all_single`` (uneven splits)
to head sharding, all-gather groups gather K/V; the backward communicates the other way
(python/ballast/_torch_schemes.py; docs/python.md, "Attention schemes").
``attention(..., schemes="reference")`` all-gathers every split group's K/V instead (the
same result, for comparison); ``CommunicationStats`` counts the bytes sent. gloo (torch
1.13) and NCCL carry all of it.
Tensor parallelism (``tensor_parallel=N`` for the sampler, a plan whose ranks are TP
groups): the world has ``plan.ranks * N`` processes, torch rank r being TP member r % N of
plan rank r // N; the members load the same tokens, pass their own heads to ``attention``
and ``remap`` (which run among the processes of the same TP index), and sum gradients over
``ProcessGroups.data_parallel_group(N)`` only (docs/python.md, "Tensor parallelism").

Attention runs through a pluggable kernel (``varlen_attention``, ``VarlenLayout``): the
default is a pure-torch blocked kernel (online softmax, memory proportional to tokens x
block); ``set_attention_kernel("flash_attn")`` or ``kernel=`` picks flash-attn's varlen
functions on CUDA or any object with the ``AttentionKernel`` methods (docs/python.md,
"Attention kernels").

docs/python.md has the full guide; examples/train_balanced.py a complete training loop.
"""

from __future__ import annotations

try:
    import torch  # noqa: F401
except ImportError as _error:  # pragma: no cover - depends on the machine
    raise ImportError(
        "ballast.torch needs PyTorch, which is not installed for this Python "
        f"({_error}); on Debian: `sudo apt-get install python3-torch`, elsewhere "
        "`pip install torch`. `import ballast` works without it.") from _error

# The data side (what each rank loads and packs) and the distributed side (process groups,
# attention, remap, gradient sum) live in two modules; this one is the public face.
from ballast._torch_data import (  # noqa: E402
    IGNORE_INDEX,
    BalancedBatchSampler,
    MicroBatchHeader,
    MicroBatchItems,  # noqa: F401  (the sampler's item type, for annotations)
    PackedBatch,
    Piece,
    PieceDataset,
    StepInfo,
    collate,
)
from ballast._torch_kernels import (  # noqa: E402
    KERNEL_NAMES,
    AttentionKernel,
    AutoAttentionKernel,
    BlockedAttentionKernel,
    FlashAttentionKernel,
    VarlenLayout,
    dense_attention_reference,
    get_attention_kernel,
    merge_attention,
    set_attention_kernel,
    varlen_attention,
)
from ballast._torch_distributed import (  # noqa: E402
    ProcessGroups,
    all_reduce_gradients,
    attention,
    local_attention,
    remap,
)
from ballast._torch_schemes import CommunicationStats  # noqa: E402

__all__ = [
    "StepInfo", "Piece", "MicroBatchHeader", "BalancedBatchSampler", "PieceDataset", "PackedBatch",
    "collate", "ProcessGroups", "local_attention", "attention", "remap", "all_reduce_gradients",
    "IGNORE_INDEX", "VarlenLayout", "AttentionKernel", "BlockedAttentionKernel", "FlashAttentionKernel",
    "AutoAttentionKernel", "KERNEL_NAMES", "varlen_attention", "merge_attention", "dense_attention_reference",
    "set_attention_kernel", "get_attention_kernel", "CommunicationStats",
]

