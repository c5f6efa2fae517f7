"""The contract between dmpcheck and this rank program: the documents that cross the boundary.

Mirrors harness/run/release_contract.h field by field.  Each document carries SCHEMA_VERSION and
is read strictly: a field this side does not know, or one it misses, is a ContractError naming
it, never a silent drop.  fixtures/contract/ holds one document of each kind with every field
set; this module's test (tests/test_contract.py) and the C++ one read and write exactly those,
and neither needs torch.  Nothing here imports torch.
"""

import dataclasses
import json
import os
import typing
from typing import List

SCHEMA_VERSION = 4


class ContractError(ValueError):
    """A document that is not what the contract says (unknown or missing field, wrong kind)."""


@dataclasses.dataclass
class Constraints:
    sharding_types: List[str]
    column_shards: int


@dataclasses.dataclass
class ManagedCollision:
    module: str  # mch (MCHManagedCollisionModule) | hash_zch (HashZchManagedCollisionModule); "": none
    input_hash_size: int  # raw ids in [0, input_hash_size); 0: the table has no managed collision
    eviction: str  # lfu | distance_lfu | lru
    interval: int  # forwards between evictions


@dataclasses.dataclass
class Table:
    name: str
    rows: int
    dim: int
    features: List[str]
    pooling: str  # sum | mean | none (a sequence table, in an EmbeddingCollection)
    weighted: bool
    data_type: str  # fp32 | fp16 | bf16
    quant: str  # how it is quantized for inference: int8 | int4 | int2 | fp16 ("": not)
    managed_collision: ManagedCollision
    constraints: Constraints


@dataclasses.dataclass
class SparseOptimizer:
    type: str  # sgd | adagrad | rowwise_adagrad | adam
    lr: float
    eps: float
    beta1: float
    beta2: float
    weight_decay: float
    weight_decay_mode: str  # none | l2 | decoupled


@dataclasses.dataclass
class DenseOptimizer:
    type: str  # sgd | adagrad | adam | rowwise_adagrad (torchrec.optim.RowWiseAdagrad over 2-D parameters, Adagrad over the rest)
    lr: float
    eps: float
    beta1: float
    beta2: float
    momentum: float
    weight_decay: float


@dataclasses.dataclass
class Start:
    kind: str  # seed | reference | user_weights | checkpoint (a resumed run)
    state: str  # the exchange file of whole tensors to load, or the checkpoint's directory (empty for seed)
    load: str  # after_wrap | before_wrap


@dataclasses.dataclass
class Checkpoint:
    """After step after_step (0: never), save the model's and optimizers' state_dict through
    torch.distributed.checkpoint into dir, then train on."""
    after_step: int
    dir: str


@dataclasses.dataclass
class RunSpec:
    schema_version: int
    world_size: int
    local_world_size: int
    memory_per_rank: int  # bytes the planner may use on a rank (Topology's ddr_cap); 0: its default
    steps: int
    batch_size: int
    timeout_s: float
    sharder: str  # extended | stock
    module: str  # embedding_bag_collection | embedding_bag
    outputs: bool
    unsharded: bool  # rank 0 also trains the modules unsharded (out/unsharded/), after the sharded run
    quantized: bool  # rank 0 quantizes the trained tables, float vs quantized on batch 1 (out/quantized/)
    quantized_sharded: bool  # ... and shards the quantized module for inference (out/quantized/sharded/)
    loop: str  # plain | train_pipeline_sparse_dist
    epochs: int  # passes over the steps' batches (data_iterator says over which iterator)
    batches_per_rank: List[int]  # per rank, batches per epoch; empty: steps / epochs on every rank
    eval_batches: List[int]  # per rank, batches of the eval pass after every epoch; empty: no eval
    data_iterator: str  # fresh (a new iterator per pass) | persistent (one object, re-armed per pass)
    is_weighted: str  # the EBC's is_weighted: "tables" (whether they are weighted), "true", "false"
    seeds: List[int]  # per rank: torch.manual_seed before the model exists
    start: Start
    first_step: int  # steps trained before this run (a resumed run writes step<first_step> as loaded)
    checkpoint: Checkpoint
    tables: List[Table]
    dense_layers: List[int]
    sparse_optimizer: SparseOptimizer
    dense_optimizer: DenseOptimizer


@dataclasses.dataclass
class ShardRow:
    rank: int
    row_offset: int
    rows: int  # -1: the whole table (a data-parallel replica)
    col_offset: int
    cols: int


@dataclasses.dataclass
class PlanRow:
    table: str
    sharding: str
    compute_kernel: str
    ranks: List[int]
    shards: List[ShardRow]


@dataclasses.dataclass
class Versions:
    torchrec: str
    torch: str
    fbgemm_gpu: str
    torchrec_source: str  # the folder the imported torchrec package is in


@dataclasses.dataclass
class Timings:
    import_s: float
    init_s: float
    plan_s: float  # TorchRec's planner, within init_s
    train_s: float


@dataclasses.dataclass
class RankLoop:
    """What one rank's loop did: batches executed per epoch, next() asked of an exhausted iterator."""
    rank: int
    batches: List[int]
    next_after_exhausted: int
    eval_batches: List[int]  # per eval pass (one after every epoch)


@dataclasses.dataclass
class RunMeta:
    schema_version: int
    versions: Versions
    plan: List[PlanRow]
    losses: List[float]
    notes: List[str]
    timings: Timings
    loops: List[RankLoop]


@dataclasses.dataclass
class PlanAnswer:
    schema_version: int
    versions: Versions
    plan: List[PlanRow]
    notes: List[str]


@dataclasses.dataclass
class ProbeAnswer:
    """`python -m dmpcheck_torchrec.probe`'s answer: what an interpreter of the user's imports."""
    schema_version: int
    versions: Versions
    python: str


@dataclasses.dataclass
class Piece:
    name: str
    sharding: str
    replicated: bool
    full_sizes: List[int]
    row_offset: int
    col_offset: int
    sizes: List[int]
    offset: int
    dtype: str  # "float32", or "int64" (managed-collision remapping tables and counters)


@dataclasses.dataclass
class Phase:
    schema_version: int
    phase: str
    tensors: List[Piece]


@dataclasses.dataclass
class RankError:
    """Why this rank failed (out/rank<R>/error.json); kind: a failure kind's name."""
    schema_version: int
    kind: str
    message: str
    traceback: str


@dataclasses.dataclass
class Batch:
    """One rank's local batch of one step (batches/step<S>_rank<R>.json)."""
    schema_version: int
    keys: List[str]
    lengths: List[int]
    values: List[int]
    weighted: bool
    weights: List[float]  # one per value when weighted
    # Variable batch per feature (VBE): per key, the distinct bags handed to TorchRec, and per key
    # batch_size indices into them (key-major); lengths/values hold the expanded batch (a distinct
    # bag is the first bag that names it).  Empty: no VBE.
    stride_per_key: List[int]
    inverse_indices: List[int]


def _read(kind, value, path):
    origin = typing.get_origin(kind)
    if origin in (list, List):
        if not isinstance(value, list):
            raise ContractError(f"'{path}' is {type(value).__name__}, expected a list")
        (item,) = typing.get_args(kind)
        return [_read(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ContractError(f"'{path or kind.__name__}' is {type(value).__name__}, expected an object")
        hints = typing.get_type_hints(kind)
        names = [f.name for f in dataclasses.fields(kind)]
        prefix = f"{path}." if path else ""
        for key in value:
            if key not in hints:
                raise ContractError(f"unknown field '{prefix}{key}' (this rank program's contract, schema version "
                                    f"{SCHEMA_VERSION}, has no such field: the two sides are out of step)")
        for name in names:
            if name not in value:
                raise ContractError(f"missing field '{prefix}{name}'")
        return kind(**{n: _read(hints[n], value[n], prefix + n) for n in names})
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ContractError(f"'{path}' is {type(value).__name__} {value!r}, expected {kind.__name__}")
    return float(value) if kind is float else value


def parse(kind, document, what="document"):
    """`document` (a dict) as `kind`, strictly; ContractError naming `what` and the field otherwise."""
    try:
        if not isinstance(document, dict) or not isinstance(document.get("schema_version"), int):
            raise ContractError("no whole-number 'schema_version'")
        if document["schema_version"] != SCHEMA_VERSION:
            raise ContractError(f"schema_version {document['schema_version']}, this rank program reads "
                                f"{SCHEMA_VERSION} (it is from another dmpcheck than the launcher)")
        return _read(kind, document, "")
    except ContractError as e:
        raise ContractError(f"{what}: not a valid contract document: {e}") from None


def parse_part(kind, value, what):
    """A part of a document (no schema_version of its own) as `kind`, strictly."""
    try:
        return _read(kind, value, "")
    except ContractError as e:
        raise ContractError(f"{what}: {e}") from None


def load(kind, path):
    with open(path) as f:
        return parse(kind, json.load(f), path)


def to_dict(document):
    return dataclasses.asdict(document)


def write_json_atomically(path, value):
    """`value` as JSON at `path`, whole or not at all (written aside, then renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, allow_nan=False)  # JSON has no NaN: dmpcheck's reader would refuse the file
    os.replace(tmp, path)


def save(document, path):
    write_json_atomically(path, to_dict(document))
