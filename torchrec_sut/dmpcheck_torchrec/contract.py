"""The contract between dmpcheck and this rank program: the documents that cross the boundary.

Mirrors harness/run/release_contract.h field by field.  Each document carries SCHEMA_VERSION and
is read strictly: a field this side does not know, or one it misses, is a ContractError naming
it, never a silent drop.  fixtures/contract/ holds one document of each kind with every field
set; this module's test (tests/test_contract.py) and the C++ one read and write exactly those,
and neither needs torch.  Nothing here imports torch.

Every field has the C++ side's default (a number 0, a string "", a list or an object empty, but
where the header says otherwise), and documents are built by keyword, naming what they set: built
positionally, a field added to the contract would shift every argument after it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import field
from typing import TYPE_CHECKING, Any, Dict, List, Type, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

SCHEMA_VERSION = 5

# Why a run stopped, as a report names it (common/outcome.cc's failure_kind_names(), in order;
# fixtures/contract/failure_kinds.json holds both sides to it).  A RankError's kind is one of these.
FAILURE_KINDS = ("invalid_scenario", "invalid_input", "communication", "timeout", "rank_failed", "internal",
                 "injected", "crashed", "interrupted", "torchrec", "unsupported", "import", "hook", "environment",
                 "oracle")

_D = TypeVar("_D")


class ContractError(ValueError):
    """A document that is not what the contract says (unknown or missing field, wrong kind)."""


class InputRefused(ValueError):
    """The user's input does not fit the model (init.from's weights: a name, a shape): kind invalid_input."""


@dataclasses.dataclass
class Document:
    """What every document (not a part of one) carries first: the contract's SCHEMA_VERSION."""
    schema_version: int = SCHEMA_VERSION


@dataclasses.dataclass
class Constraints:
    sharding_types: List[str] = field(default_factory=list)
    column_shards: int = 0


@dataclasses.dataclass
class ManagedCollision:
    module: str = ""  # mch (MCHManagedCollisionModule) | hash_zch (HashZchManagedCollisionModule); "": none
    input_hash_size: int = 0  # raw ids in [0, input_hash_size); 0: the table has no managed collision
    eviction: str = ""  # lfu | distance_lfu | lru
    interval: int = 0  # forwards between evictions


@dataclasses.dataclass
class Table:
    name: str = ""
    rows: int = 0
    dim: int = 0
    features: List[str] = field(default_factory=list)
    pooling: str = ""  # sum | mean | none (a sequence table, in an EmbeddingCollection)
    weighted: bool = False
    data_type: str = ""  # fp32 | fp16 | bf16
    quant: str = ""  # how it is quantized for inference: int8 | int4 | int2 | fp16 ("": not)
    managed_collision: ManagedCollision = field(default_factory=ManagedCollision)
    constraints: Constraints = field(default_factory=Constraints)


@dataclasses.dataclass
class SparseOptimizer:
    type: str = ""  # sgd | adagrad | rowwise_adagrad | adam
    lr: float = 0.0
    eps: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    weight_decay: float = 0.0
    weight_decay_mode: str = ""  # none | l2 | decoupled


@dataclasses.dataclass
class DenseOptimizer:
    type: str = ""  # sgd | adagrad | adam | rowwise_adagrad (torchrec.optim.RowWiseAdagrad over 2-D parameters, Adagrad over the rest)
    lr: float = 0.0
    eps: float = 0.0
    beta1: float = 0.0
    beta2: float = 0.0
    momentum: float = 0.0
    weight_decay: float = 0.0


@dataclasses.dataclass
class Start:
    kind: str = "seed"  # seed | reference | user_weights | checkpoint (a resumed run)
    state: str = ""  # the exchange file of whole tensors to load, or the checkpoint's directory (empty for seed)
    load: str = "after_wrap"  # after_wrap | before_wrap


@dataclasses.dataclass
class Checkpoint:
    """After step after_step (0: never), save the model's and optimizers' state_dict through
    torch.distributed.checkpoint into dir, then train on."""
    after_step: int = 0
    dir: str = ""


@dataclasses.dataclass
class RunSpec(Document):
    world_size: int = 0
    local_world_size: int = 0
    memory_per_rank: int = 0  # bytes the planner may use on a rank (Topology's ddr_cap); 0: its default
    steps: int = 0
    batch_size: int = 0
    timeout_s: float = 0.0
    sharder: str = ""  # extended | stock
    module: str = ""  # embedding_bag_collection | embedding_bag
    outputs: bool = False
    unsharded: bool = False  # rank 0 also trains the modules unsharded (out/unsharded/), after the sharded run
    quantized: bool = False  # rank 0 quantizes the trained tables, float vs quantized on batch 1 (out/quantized/)
    quantized_sharded: bool = False  # ... and shards the quantized module for inference (out/quantized/sharded/)
    loop: str = ""  # plain | train_pipeline_sparse_dist
    epochs: int = 1  # passes over the steps' batches (data_iterator says over which iterator)
    # per rank, batches per epoch; empty: steps / epochs on every rank
    batches_per_rank: List[int] = field(default_factory=list)
    # per rank, batches of the eval pass after every epoch; empty: no eval
    eval_batches: List[int] = field(default_factory=list)
    data_iterator: str = ""  # fresh (a new iterator per pass) | persistent (one object, re-armed per pass)
    is_weighted: str = "tables"  # the EBC's is_weighted: "tables" (whether they are weighted), "true", "false"
    seeds: List[int] = field(default_factory=list)  # per rank: torch.manual_seed before the model exists
    start: Start = field(default_factory=Start)
    first_step: int = 0  # steps trained before this run (a resumed run writes step<first_step> as loaded)
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    tables: List[Table] = field(default_factory=list)
    dense_layers: List[int] = field(default_factory=list)
    sparse_optimizer: SparseOptimizer = field(default_factory=SparseOptimizer)
    dense_optimizer: DenseOptimizer = field(default_factory=DenseOptimizer)
    hooks: str = ""  # the scenario's hook file (hooks.py); empty: none


@dataclasses.dataclass
class ShardRow:
    rank: int = 0
    row_offset: int = 0
    rows: int = 0  # -1: the whole table (a data-parallel replica)
    col_offset: int = 0
    cols: int = 0


@dataclasses.dataclass
class PlanRow:
    table: str = ""
    sharding: str = ""
    compute_kernel: str = ""
    ranks: List[int] = field(default_factory=list)
    shards: List[ShardRow] = field(default_factory=list)


@dataclasses.dataclass
class Versions:
    torchrec: str = ""
    torch: str = ""
    fbgemm_gpu: str = ""
    torchrec_source: str = ""  # the folder the imported torchrec package is in


@dataclasses.dataclass
class Timings:
    import_s: float = 0.0
    init_s: float = 0.0
    plan_s: float = 0.0  # TorchRec's planner, within init_s
    train_s: float = 0.0


@dataclasses.dataclass
class RankLoop:
    """What one rank's loop did: batches executed per epoch, next() asked of an exhausted iterator."""
    rank: int = 0
    batches: List[int] = field(default_factory=list)
    next_after_exhausted: int = 0
    eval_batches: List[int] = field(default_factory=list)  # per eval pass (one after every epoch)


@dataclasses.dataclass
class Observation:
    """One value a hook returned on one rank, or in the unsharded oracle (rank -1, hooks.UNSHARDED)
    (hooks.py): kind bool, number, string or tensor."""
    rank: int = 0
    point: str = ""
    step: int = 0
    name: str = ""
    kind: str = ""
    value: str = ""


@dataclasses.dataclass
class RunMeta(Document):
    versions: Versions = field(default_factory=Versions)
    plan: List[PlanRow] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)
    timings: Timings = field(default_factory=Timings)
    loops: List[RankLoop] = field(default_factory=list)
    observed: List[Observation] = field(default_factory=list)  # every rank's hooks' values, in rank order


@dataclasses.dataclass
class PlanAnswer(Document):
    versions: Versions = field(default_factory=Versions)
    plan: List[PlanRow] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)


@dataclasses.dataclass
class ProbeAnswer(Document):
    """`python -m dmpcheck_torchrec.probe`'s answer: what an interpreter of the user's imports."""
    versions: Versions = field(default_factory=Versions)
    python: str = ""


@dataclasses.dataclass
class Piece:
    name: str = ""
    sharding: str = ""
    replicated: bool = False
    full_sizes: List[int] = field(default_factory=list)
    row_offset: int = 0
    col_offset: int = 0
    sizes: List[int] = field(default_factory=list)
    offset: int = 0
    dtype: str = "float32"  # "float32", or "int64" (managed-collision remapping tables and counters)


@dataclasses.dataclass
class Phase(Document):
    phase: str = ""
    tensors: List[Piece] = field(default_factory=list)


@dataclasses.dataclass
class RankError(Document):
    """Why this rank failed (out/rank<R>/error.json); kind: a failure kind's name."""
    kind: str = ""
    message: str = ""
    traceback: str = ""


@dataclasses.dataclass
class WarmSpawn(Document):
    """dmpcheck to the warm interpreter (warm.py): fork a rank that runs `python ARGV` in ENV."""
    argv: List[str] = field(default_factory=list)
    env: List[str] = field(default_factory=list)  # the rank's whole environment, "NAME=value"
    cwd: str = ""
    threads: int = 1
    group: int = 0


@dataclasses.dataclass
class WarmMessage(Document):
    """The warm interpreter to dmpcheck: ready / not_ready, then pid / refused per spawn, exit per rank."""
    kind: str = ""
    import_s: float = 0.0
    threads: int = 0
    why: str = ""
    pid: int = 0
    status: int = 0


@dataclasses.dataclass
class Batch(Document):
    """One rank's local batch of one step (batches/step<S>_rank<R>.json)."""
    keys: List[str] = field(default_factory=list)
    lengths: List[int] = field(default_factory=list)
    values: List[int] = field(default_factory=list)
    weighted: bool = False
    weights: List[float] = field(default_factory=list)  # one per value when weighted
    # Variable batch per feature (VBE): per key, the distinct bags handed to TorchRec, and per key
    # batch_size indices into them (key-major); lengths/values hold the expanded batch (a distinct
    # bag is the first bag that names it).  Empty: no VBE.
    stride_per_key: List[int] = field(default_factory=list)
    inverse_indices: List[int] = field(default_factory=list)


# The exchange's layout, named here and nowhere else on this side (release_contract.h's phase_*
# and batch_file make the same names; fixtures/contract/layout.json holds both sides to them).
def phase_init() -> str:
    """The model as wrapped, before any step."""
    return "init"


def phase_after(step: int) -> str:
    """After `step` steps; phase_after(0) is phase_init()."""
    return f"step{step}" if step else phase_init()


def phase_outputs(step: int) -> str:
    """The forward's outputs of step `step` + 1 (on the weights after `step` steps)."""
    return f"outputs{step}"


def phase_redrawn(step: int) -> str:
    """A managed-collision module's rows drawn anew in step `step`."""
    return f"redrawn{step}"


def phase_user_weights() -> str:
    """The user's weights (init.from), whole tensors in the exchange's own folder."""
    return "user_weights"


def batch_file(step: int, rank: int) -> str:
    """One rank's local batch of step `step` (1 ..), under the exchange's batches/."""
    return f"step{step}_rank{rank}.json"


def _read(kind: Any, value: Any, path: str) -> Any:
    """`value` as `kind` (a contract type, a List of one, or a plain one), strictly."""
    origin = typing.get_origin(kind)
    if origin in (list, List):
        if not isinstance(value, list):
            raise ContractError(f"'{path}' is {type(value).__name__}, expected a list")
        (item,) = typing.get_args(kind)
        return [_read(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(kind):
        document: Any = kind  # one of the classes above (is_dataclass would also take an instance)
        if not isinstance(value, dict):
            raise ContractError(f"'{path or document.__name__}' is {type(value).__name__}, expected an object")
        hints = typing.get_type_hints(document)
        names = [f.name for f in dataclasses.fields(document)]
        prefix = f"{path}." if path else ""
        for key in value:
            if key not in hints:
                raise ContractError(f"unknown field '{prefix}{key}' (this rank program's contract, schema version "
                                    f"{SCHEMA_VERSION}, has no such field: the two sides are out of step)")
        for name in names:
            if name not in value:
                raise ContractError(f"missing field '{prefix}{name}'")
        return document(**{n: _read(hints[n], value[n], prefix + n) for n in names})
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise ContractError(f"'{path}' is {type(value).__name__} {value!r}, expected {kind.__name__}")
    return float(value) if kind is float else value


def parse(kind: Type[_D], document: object, what: str = "document") -> _D:
    """`document` (a dict) as `kind`, strictly; ContractError naming `what` and the field otherwise."""
    try:
        if not isinstance(document, dict) or not isinstance(document.get("schema_version"), int):
            raise ContractError("no whole-number 'schema_version'")
        if document["schema_version"] != SCHEMA_VERSION:
            raise ContractError(f"schema_version {document['schema_version']}, this rank program reads "
                                f"{SCHEMA_VERSION} (it is from another dmpcheck than the launcher)")
        return typing.cast(_D, _read(kind, document, ""))
    except ContractError as e:
        raise ContractError(f"{what}: not a valid contract document: {e}") from None


def parse_part(kind: Type[_D], value: object, what: str) -> _D:
    """A part of a document (no schema_version of its own) as `kind`, strictly."""
    try:
        return typing.cast(_D, _read(kind, value, ""))
    except ContractError as e:
        raise ContractError(f"{what}: {e}") from None


def load(kind: Type[_D], path: str) -> _D:
    with open(path) as f:
        return parse(kind, json.load(f), path)


def to_dict(document: DataclassInstance) -> Dict[str, Any]:
    return dataclasses.asdict(document)


def write_json_atomically(path: str, value: object) -> None:
    """`value` as JSON at `path`, whole or not at all (written aside, then renamed)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, allow_nan=False)  # JSON has no NaN: dmpcheck's reader would refuse the file
    os.replace(tmp, path)


def save(document: DataclassInstance, path: str) -> None:
    write_json_atomically(path, to_dict(document))
