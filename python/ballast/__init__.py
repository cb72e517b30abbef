"""ballast: balanced variable-length steps for distributed LLM training.

Plan one global batch of documents for a cluster and a model, look at what each rank
must load and with whom it computes attention, and simulate the step::

    >>> import ballast
    >>> plan = ballast.plan([8192, 512, 300, 12000, 64], cluster="h100", nodes=1,
    ...                     model="llama-7b", strategy="zeppelin")
    >>> mine = plan.rank(0).micro_batches[0]
    >>> [(r.sequence_id, r.begin, r.end) for r in mine.linear]  # what rank 0 loads
    [...]
    >>> ballast.simulate(plan).step_time_s
    ...

Errors: bad input (an unknown preset, a length <= 0, a plan for another job) raises
``ValueError`` and a batch a strategy cannot run raises ``ballast.PlanningError`` (a
``ValueError``), with the message the ``ballast`` CLI prints (a setting named by its
argument here: ``max_context_tokens``, not ``--max-context``); a broken invariant inside
ballast raises ``RuntimeError``. ``ballast.torch`` holds the PyTorch glue (imported on
demand). docs/python.md has the full guide.
"""

from __future__ import annotations

import os as _os
from pathlib import Path as _Path
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

# A pip-installed package carries the bundled data (presets, length files) next to it;
# the build tree reads the source tree's data/ (compiled in). BALLAST_DATA_DIR wins.
_PACKAGED_DATA = _Path(__file__).resolve().parent / "data"
if "BALLAST_DATA_DIR" not in _os.environ and (_PACKAGED_DATA / "lengths").is_dir():
    _os.environ["BALLAST_DATA_DIR"] = str(_PACKAGED_DATA)

from . import _ballast  # noqa: E402  (after the data directory is set)
from ._ballast import (  # noqa: E402,F401  (re-exported)
    Chunk,
    Cluster,
    Group,
    LinearSlice,
    LowerBound,
    MicroBatch,
    Model,
    Plan,
    PlanningError,
    RankGroup,
    RankMicroBatch,
    RankTimes,
    RankView,
    Report,
    SequenceChunks,
    TokenRange,
    Transfer,
)

__version__: str = _ballast.__version__  # project(VERSION) in CMakeLists.txt: the one place

__all__ = [
    "Chunk", "Cluster", "Group", "LinearSlice", "LowerBound", "MicroBatch", "Model", "Plan",
    "PlanningError", "RankGroup", "RankMicroBatch", "RankTimes", "RankView", "Report",
    "SequenceChunks", "TokenRange", "Transfer",
    "cluster_presets", "model_presets", "cost_models", "strategies", "strategy_info", "datasets",
    "sample_batches", "plan", "simulate", "validate", "load_plans", "tensor_parallel_units",
    "tensor_parallel_degrees", "Lengths",
]

#: Anything ``plan()`` takes as lengths: a sequence of ints, a 1-D integer numpy array or
#: a 1-D CPU torch tensor.
Lengths = Union[Sequence[int], Any]
ClusterLike = Union[str, "_os.PathLike[str]", Cluster, Dict[str, Any]]
ModelLike = Union[str, "_os.PathLike[str]", Model, Dict[str, Any]]


def cluster_presets() -> List[str]:
    """Names of the bundled cluster presets (``ballast list clusters``)."""
    return list(_ballast.cluster_presets())


def model_presets() -> List[str]:
    """Names of the bundled model presets (``ballast list models``)."""
    return list(_ballast.model_presets())


def cost_models() -> List[str]:
    """Names of the bundled cost models (``ballast list cost-models``); a JSON file path also works."""
    return list(_ballast.cost_models())


def strategies() -> List[str]:
    """Names of the registered strategies (``ballast list strategies``).

    A strategy spec may add parameters: ``"zeppelin:remap=off"``, ``"static-cp:degree=8"``.
    """
    return list(_ballast.strategies())


def strategy_info() -> List[Dict[str, Any]]:
    """Each strategy's name, one-line description and parameters (key -> help)."""
    return [dict(row) for row in _ballast.strategy_info()]


def datasets() -> List[Tuple[str, str]]:
    """The bundled length distributions as (name, description) pairs."""
    return [tuple(row) for row in _ballast.datasets()]  # type: ignore[misc]


def sample_batches(dataset: str = "wlbllm", *, tokens_per_step: Optional[int] = 1 << 20,
                   batch_size: Optional[int] = None, steps: int = 1, seed: int = 0,
                   max_context_tokens: int = 131072, order: str = "random",
                   over_context: str = "split") -> List[Any]:
    """Draw global batches of document lengths from a bundled dataset or a length file.

    Exactly one of ``tokens_per_step`` and ``batch_size`` is used (``batch_size`` wins when
    given). Same arguments, same batches, on every platform (the CLI's sampler).
    Returns one int64 numpy array of lengths per step.

    >>> [batch] = ballast.sample_batches("wlbllm", tokens_per_step=65536, seed=1)
    >>> int(batch.sum()) <= 65536
    True
    """
    if batch_size is not None:
        tokens_per_step = None
    return list(_ballast.sample_batches(str(dataset), tokens_per_step, batch_size, steps, seed,
                                        max_context_tokens, order, over_context))


def _lengths_array(lengths: Lengths) -> Any:
    """A 1-D int64 view of the lengths: no copy for int64 numpy arrays and CPU tensors."""
    import numpy as np

    if type(lengths).__module__.startswith("torch"):
        if getattr(lengths, "is_cuda", False) or str(getattr(lengths, "device", "cpu")) != "cpu":
            raise ValueError("lengths: pass a CPU tensor (lengths.cpu()); ballast plans on the host")
        lengths = lengths.detach().numpy()  # shares memory
    array = np.asarray(lengths)
    if array.dtype.kind not in "iu":
        if array.dtype.kind == "f" and array.size and not np.all(np.mod(array, 1) == 0):
            raise ValueError("lengths must be whole token counts; got fractional values")
        if array.dtype.kind not in "fiu" and array.size:
            raise ValueError(f"lengths must be integers; got an array of {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional (one length per sequence); got shape {array.shape}")
    return array.astype(np.int64, copy=False)


def _cluster(cluster: ClusterLike, nodes: Optional[int]) -> Cluster:
    if isinstance(cluster, Cluster):
        if nodes is None:
            return cluster
        text = cluster.to_json()
        resized = Cluster.from_json(text, f"cluster {cluster.name}")
        resized.nodes = nodes
        return resized
    if isinstance(cluster, dict):
        import json

        made = Cluster.from_json(json.dumps(cluster), "cluster dict")
        if nodes is not None:
            made.nodes = nodes
        return made
    return Cluster.load(_os.fspath(cluster), nodes)


def _model(model: ModelLike) -> Model:
    if isinstance(model, Model):
        return model
    if isinstance(model, dict):
        import json

        return Model.from_json(json.dumps(model), "model dict")
    return Model.load(_os.fspath(model))


def tensor_parallel_units(cluster: ClusterLike, model: ModelLike, tensor_parallel: int, *,
                          nodes: Optional[int] = None) -> Cluster:
    """The cluster ``plan(..., tensor_parallel=N)`` plans on: its ranks are TP groups of N
    consecutive GPUs of a node (Megatron-LM with sequence parallelism), each with N GPUs'
    compute, memory and NVLink bandwidth; ``cluster.tensor_parallel`` is N and
    ``cluster.gpus`` the GPUs. A cluster that already is one of TP groups (``plan.cluster``)
    is returned as it is for N = 1 or its own degree.

    Raises ``ValueError`` naming the valid degrees when N does not divide the GPUs per
    node, the heads and the KV heads (``tensor_parallel_degrees``).

    >>> groups = ballast.tensor_parallel_units("h100", "llama-7b", 2, nodes=1)
    >>> groups.ranks, groups.gpus, groups.tensor_parallel
    (4, 8, 2)
    """
    return _ballast.tensor_parallel_units(_cluster(cluster, nodes), _model(model), int(tensor_parallel))


def tensor_parallel_degrees(cluster: ClusterLike, model: ModelLike, *, nodes: Optional[int] = None) -> List[int]:
    """The TP degrees a cluster of GPUs and a model allow, ascending (1 always): each
    divides the GPUs per node, the heads and the KV heads, and a TP group spans whole NICs
    or shares one.

    >>> ballast.tensor_parallel_degrees("h100", "llama-7b")
    [1, 2, 4, 8]
    """
    return list(_ballast.valid_tensor_parallel_degrees(_cluster(cluster, nodes), _model(model)))


def plan(lengths: Lengths, cluster: ClusterLike = "h100", model: ModelLike = "llama-7b",
         strategy: str = "ballast", *, nodes: Optional[int] = None,
         cost_model: str = "analytical", step: int = 0,
         max_context_tokens: Optional[int] = None, tensor_parallel: int = 1) -> Plan:
    """Plan one global batch: which rank holds which tokens, in which attention group.

    Args:
        lengths: token count of each sequence (document) of the global batch; sequence id
            = index. A list, a 1-D integer numpy array or a 1-D CPU torch tensor (int64
            arrays and tensors are read in place).
        cluster: a preset name (``cluster_presets()``), a JSON file path, a ``Cluster`` or a
            dict with the cluster JSON's fields.
        model: a preset name (``model_presets()``), a JSON file path, a ``Model`` or a dict.
        strategy: a strategy spec (``strategies()``), e.g. ``"flexsp-fast"``,
            ``"zeppelin:remap=off"``, ``"static-cp:degree=8"``; default ``"ballast"``,
            the best of the other strategies' plans improved by a local search.
        nodes: overrides the cluster's node count.
        cost_model: ``"analytical"``, a profiled preset or a JSON file path.
        step: the step number recorded in the plan.
        max_context_tokens: the run's context length (no sequence of the run is longer;
            the CLI's ``--max-context``). ``static-cp``, ``static-cp-allgather`` and
            ``static-ulysses`` fix their default degree from it, the same for every step
            of the run, as training runs set their CP / SP size; None: the batch's
            longest sequence stands in for it (the degree may then change from batch to
            batch).

    Returns:
        A validated ``Plan``. ``plan.rank(r)`` is rank r's view; ``plan.to_json()`` is the
        text ``ballast plan`` writes; ``simulate(plan)`` predicts the step.

    Raises:
        ValueError: bad input (unknown preset or strategy, a length <= 0, ...).
        PlanningError: the strategy cannot run this batch (e.g. a sequence too long for
            the cluster's memory); a ``ValueError``.

    Example::

        >>> import ballast
        >>> p = ballast.plan([4096, 1024, 1024, 512, 100], cluster="h100", nodes=1,
        ...                  model="llama-7b", strategy="packed-dp")
        >>> p.ranks, p.num_micro_batches
        (8, 1)
        >>> view = p.rank(0).micro_batches[0]
        >>> [(r.sequence_id, r.begin, r.end) for r in view.linear]
        [(0, 0, 4096)]
        >>> ballast.simulate(p).step_time_s > 0
        True
    """
    array = _lengths_array(lengths)
    return _ballast.make_plan(array, _cluster(cluster, nodes), _model(model), str(cost_model),
                              str(strategy), int(step),
                              None if max_context_tokens is None else int(max_context_tokens),
                              int(tensor_parallel))


def simulate(plan: Plan, *, trace: bool = False, grad_sync: str = "overlap") -> Report:
    """Predict the step of a plan with ballast's discrete-event simulator.

    ``grad_sync`` is ``"overlap"`` (the gradient sync in per-layer buckets during the last
    backward pass, as DDP / FSDP / ZeRO-3 run it) or ``"end"`` (all of it afterwards).
    Returns a ``Report``: ``step_time_s``, ``lower_bound_s``, ``imbalance`` (max / mean busy),
    ``exposed_communication_fraction``, ``peak_memory_bytes``, ``gradient_sync_s`` (the whole
    sync) and ``gradient_sync_exposed_s`` (what the step pays for it), per-rank ``ranks``;
    ``report.to_json()`` is ``ballast simulate --format json``'s output; with
    ``trace=True``, ``report.chrome_trace()`` is the Perfetto / chrome://tracing JSON.

    >>> r = ballast.simulate(ballast.plan([2048, 512], cluster="h100", nodes=1))
    >>> r.step_time_s >= r.lower_bound_s
    True
    """
    return _ballast.simulate(plan, bool(trace), str(grad_sync))


def validate(plan: Plan) -> Tuple[bool, str]:
    """Check a plan's invariants (docs/plan-format.md): ``(True, "")`` or ``(False, why)``."""
    ok, message = plan.validate()
    return bool(ok), str(message)


def load_plans(path: Union[str, "_os.PathLike[str]"]) -> List[Plan]:
    """Read the plans of a file written by ``ballast plan`` (one plan or a JSON array)."""
    return list(Plan.read(_os.fspath(path)))


def _plan_eq(self: Plan, other: object) -> bool:
    return isinstance(other, Plan) and self.to_json() == other.to_json()


def _plan_repr(self: Plan) -> str:
    tensor_parallel = f", tensor_parallel={self.tensor_parallel}" if self.tensor_parallel > 1 else ""
    return (f"Plan(strategy='{self.strategy}', ranks={self.ranks}{tensor_parallel}, "
            f"sequences={len(self.lengths)}, micro_batches={self.num_micro_batches})")


def _plan_save(self: Plan, path: Union[str, "_os.PathLike[str]"]) -> None:
    """Write the plan's canonical JSON (what ``ballast plan`` writes) to ``path``."""
    _Path(path).write_text(self.to_json())


def _plan_check(self: Plan) -> None:
    """Raise ``ValueError("plan is invalid: ...")`` if the plan breaks an invariant."""
    ok, message = self.validate()
    if not ok:
        raise ValueError(f"plan is invalid: {message}")


def _plan_from_pickle(text: str) -> Plan:
    return Plan.from_json(text, "a pickled ballast.Plan")


def _plan_reduce(self: Plan) -> Tuple[Any, Tuple[str]]:
    # Pickled as its canonical JSON (DataLoader workers, multiprocessing).
    return (_plan_from_pickle, (self.to_json(),))


Plan.__reduce__ = _plan_reduce  # type: ignore[assignment]
Plan.__eq__ = _plan_eq  # type: ignore[assignment]
Plan.__hash__ = None  # type: ignore[assignment]
Plan.__repr__ = _plan_repr  # type: ignore[assignment]
Plan.save = _plan_save  # type: ignore[attr-defined]
Plan.check = _plan_check  # type: ignore[attr-defined]


def _cluster_to_dict(self: Cluster) -> Dict[str, Any]:
    import json

    return json.loads(self.to_json())


def _model_to_dict(self: Model) -> Dict[str, Any]:
    import json

    return json.loads(self.to_json())


def _report_to_dict(self: Report) -> Dict[str, Any]:
    import json

    return json.loads(self.to_json())


Cluster.to_dict = _cluster_to_dict  # type: ignore[attr-defined]
Cluster.__repr__ = lambda self: (  # type: ignore[assignment]
    f"Cluster(name='{self.name}', nodes={self.nodes}, gpus_per_node={self.gpus_per_node}"
    + (f", tensor_parallel={self.tensor_parallel})" if self.tensor_parallel > 1 else ")"))
Cluster.__eq__ = lambda self, other: isinstance(other, Cluster) and self.to_json() == other.to_json()  # type: ignore[assignment]
Cluster.__hash__ = None  # type: ignore[assignment]
_emulated_cluster = Cluster.emulated


def _emulated(model: ModelLike, ranks: int, gpus_per_node: int, rank_tokens: int) -> Cluster:
    """The cluster CPU processes emulate, one per GPU (gloo processes of ballast.torch; its
    compute and link figures are fixed estimates, while ``ballast run`` plans on ``ballast
    calibrate --host``'s measurements): ranks GPUs in nodes of gpus_per_node, memory for
    rank_tokens tokens of the model's activations next to its ZeRO-3 model states. ``model``
    is what ``plan()`` takes: a preset name, a JSON file path, a ``Model`` or a dict.

    >>> ballast.Cluster.emulated("llama-7b", 4, 2, 2048).ranks
    4
    """
    return _emulated_cluster(_model(model), int(ranks), int(gpus_per_node), int(rank_tokens))


Cluster.emulated = staticmethod(_emulated)  # type: ignore[assignment]
Model.to_dict = _model_to_dict  # type: ignore[attr-defined]
Model.__repr__ = lambda self: f"Model(name='{self.name}', layers={self.layers}, hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads})"  # type: ignore[assignment]
Model.__eq__ = lambda self, other: isinstance(other, Model) and self.to_json() == other.to_json()  # type: ignore[assignment]
Model.__hash__ = None  # type: ignore[assignment]
Report.to_dict = _report_to_dict  # type: ignore[attr-defined]
Report.__repr__ = lambda self: f"Report(strategy='{self.strategy}', step_time_s={self.step_time_s:.6g}, imbalance={self.imbalance:.3f})"  # type: ignore[assignment]
