# Type hints for the C++ extension (python/src/module.cpp); the docs are in its docstrings
# and in docs/python.md.
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import numpy.typing as npt

class PlanningError(ValueError): ...

class Cluster:
    name: str
    gpu_name: str
    nodes: int
    gpus_per_node: int
    gpu_memory_bytes: int
    peak_flops_per_s: float
    matmul_efficiency: float
    attention_efficiency: float
    attention_tile_tokens: int
    attention_tiles_packed: bool
    memory_usable_fraction: float
    intra_node_bus_bw_bytes_per_s: float
    intra_node_p2p_bw_bytes_per_s: float
    intra_node_latency_s: float
    nics_per_node: int
    nic_bw_bytes_per_s: float
    inter_node_latency_s: float
    provenance: str
    def __init__(self) -> None: ...
    @staticmethod
    def load(preset_or_file: str, nodes: Optional[int] = None) -> Cluster: ...
    @staticmethod
    def emulated(model: Union[Model, str, os.PathLike, Dict[str, Any]], ranks: int, gpus_per_node: int, rank_tokens: int) -> Cluster: ...
    @staticmethod
    def from_json(text: str, source: str = "<string>") -> Cluster: ...
    def to_json(self) -> str: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def validate(self) -> None: ...
    @property
    def ranks(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def tensor_parallel(self) -> int: ...

class Model:
    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    gated_mlp: bool
    bytes_per_element: int
    activation_bytes_per_token: float
    recompute: str
    parameters: float
    provenance: str
    def __init__(self) -> None: ...
    @staticmethod
    def load(preset_or_file: str) -> Model: ...
    @staticmethod
    def from_json(text: str, source: str = "<string>") -> Model: ...
    def to_json(self) -> str: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def validate(self) -> None: ...
    @property
    def head_dim(self) -> int: ...

class Chunk:
    rank: int
    begin: int
    end: int

class SequenceChunks:
    sequence_id: int
    padded_length: int
    chunks: List[Chunk]

class Group:
    scheme: str
    ranks: List[int]
    sequences: List[SequenceChunks]
    routing_proxies: int
    routing_chunks: int

class LinearSlice:
    rank: int
    sequence_id: int
    begin: int
    end: int

class MicroBatch:
    groups: List[Group]
    linear_layout: List[LinearSlice]

class TokenRange:
    sequence_id: int
    begin: int
    end: int
    group: int
    tokens: int

class Transfer:
    src_rank: int
    dst_rank: int
    sequence_id: int
    begin: int
    end: int
    tokens: int

class RankGroup:
    index: int
    scheme: str
    ranks: List[int]
    position: int
    sequence_ids: List[int]
    chunks: List[TokenRange]
    routing_proxies: int
    routing_chunks: int

class RankMicroBatch:
    index: int
    linear: List[TokenRange]
    attention: List[TokenRange]
    groups: List[RankGroup]
    remapped: bool
    sends: List[Transfer]
    receives: List[Transfer]
    tokens: int

class RankView:
    rank: int
    micro_batches: List[RankMicroBatch]

class Plan:
    strategy: str
    step: int
    ranks: int
    gpus: int
    tensor_parallel: int
    cluster: Cluster
    model: Model
    cost_model: str
    lengths: npt.NDArray[np.int64]
    micro_batches: List[MicroBatch]
    notes: List[str]
    num_micro_batches: int
    @staticmethod
    def from_json(text: str, source: str = "<string>") -> Plan: ...
    @staticmethod
    def read(path: str) -> List[Plan]: ...
    def to_json(self) -> str: ...
    def validate(self) -> Tuple[bool, str]: ...
    def check(self) -> None: ...
    def save(self, path: str) -> None: ...
    def rank(self, rank: int) -> RankView: ...
    def attention_layout(self, micro_batch: int, rank: int) -> List[TokenRange]: ...
    def linear_layout(self, micro_batch: int, rank: int) -> List[TokenRange]: ...
    def remap_transfers(self, micro_batch: int) -> List[Transfer]: ...

class LowerBound:
    time_s: float
    compute_per_rank_s: float
    overhead_s: float
    gradient_sync_s: float
    min_micro_batches: int
    expert_imbalance_s: float
    longest_sequence_s: float
    gradient_buckets_s: float
    first_bucket_ready_s: float
    binding: str

class RankTimes:
    busy_s: float
    communication_s: float
    exposed_communication_s: float
    idle_s: float
    peak_memory_bytes: int

class Report:
    strategy: str
    step_time_s: float
    lower_bound: LowerBound
    lower_bound_s: float
    imbalance: float
    exposed_communication_fraction: float
    peak_memory_bytes: int
    gradient_sync_s: float
    gradient_sync_exposed_s: float
    micro_batches: int
    ranks: List[RankTimes]
    def to_json(self) -> str: ...
    def to_dict(self) -> Dict[str, Any]: ...
    def text(self, cluster: Cluster) -> str: ...
    def chrome_trace(self) -> str: ...

__version__: str

def cluster_presets() -> List[str]: ...
def model_presets() -> List[str]: ...
def cost_models() -> List[str]: ...
def strategies() -> List[str]: ...
def strategy_info() -> List[Dict[str, Any]]: ...
def check_strategy(spec: str) -> None: ...
def datasets() -> List[Tuple[str, str]]: ...
def data_dir() -> str: ...
def sample_batches(dataset: str, tokens_per_step: Optional[int], batch_size: Optional[int], steps: int,
                   seed: int, max_context_tokens: int, order: str,
                   over_context: str) -> List[npt.NDArray[np.int64]]: ...
def make_plan(lengths: npt.NDArray[np.int64], cluster: Cluster, model: Model, cost_model: str,
              strategy: str, step: int, max_context_tokens: Optional[int],
              tensor_parallel: int) -> Plan: ...
def tensor_parallel_units(cluster: Cluster, model: Model, tensor_parallel: int) -> Cluster: ...
def valid_tensor_parallel_degrees(cluster: Cluster, model: Model) -> List[int]: ...
def simulate(plan: Plan, trace: bool, grad_sync: str) -> Report: ...
