"""The scenario's model as a TorchRec user writes it: an EmbeddingBagCollection (an
EmbeddingCollection for sequence tables, or one plain nn.EmbeddingBag), Linear layers, a mean."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import torch
from torch import nn

from dmpcheck_torchrec import optim
from dmpcheck_torchrec.optim import Unsupported

if TYPE_CHECKING:
    from torchrec import EmbeddingBagConfig, EmbeddingConfig
    from torchrec.datasets.utils import Batch
    from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

    from dmpcheck_torchrec import contract
    from dmpcheck_torchrec.dump import TensorPiece

LAST_OUTPUTS: Dict[str, torch.Tensor] = {}  # the last forward's outputs on this rank, by dmpcheck's names


def select_features(kjt: KeyedJaggedTensor, features: Iterable[str]) -> KeyedJaggedTensor:
    """`features` of `kjt` as a KJT of their own, a variable batch per feature (VBE: strides per
    key and inverse indices) kept as it is."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    features = list(dict.fromkeys(features))
    bags = kjt.to_dict()
    if not getattr(kjt, "variable_stride_per_key", lambda: False)():
        return KeyedJaggedTensor.from_jt_dict({f: bags[f] for f in features})
    keys = list(kjt.keys())
    index = [keys.index(f) for f in features]
    strides, inverse = kjt.stride_per_key_per_rank(), kjt.inverse_indices()[1]
    weighted = kjt.weights_or_none() is not None
    return KeyedJaggedTensor(
        keys=list(features), values=torch.cat([bags[f].values() for f in features]),
        lengths=torch.cat([bags[f].lengths() for f in features]),
        weights=torch.cat([bags[f].weights() for f in features]) if weighted else None,
        stride_per_key_per_rank=[strides[i] for i in index],
        inverse_indices=(list(features), inverse[torch.tensor(index)]))


# TorchRec's train pipelines trace the model (torch.fx) to find its sharded modules' inputs; this
# selection branches on the batch, which a trace cannot follow, so it is one opaque call to the
# tracer, as is sum_bags below (found by `dmpcheck explore`: sequence tables under train_pipeline_sparse_dist raised
# "symbolically traced variables cannot be used as inputs to control flow").
torch.fx.wrap("select_features")


def sum_bags(rows: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each bag's rows summed, in id order (a bag of no ids sums to zeros)."""
    lengths = lengths.long()
    bag = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    return torch.zeros(lengths.numel(), rows.shape[1], dtype=rows.dtype).index_add_(0, bag, rows)


torch.fx.wrap("sum_bags")  # (sizes from the batch: opaque to the trace too)


def output_keys(readings: Sequence[Tuple[str, str]]) -> List[str]:
    """The output key of each (table, feature) a collection reads, in order, as TorchRec names it:
    the feature, or "<feature>@<table>" where several of the collection's tables read it."""
    readers: Dict[str, int] = {}
    for _, f in readings:
        readers[f] = readers.get(f, 0) + 1
    return [f if readers[f] == 1 else f"{f}@{table}" for table, f in readings]


def _embeddings(result: Any) -> Any:
    """A collection's embeddings: a managed-collision one returns (embeddings, remapped features or None)."""
    return result[0] if isinstance(result, tuple) else result


def _linear_layers(width: int, layers: List[int]) -> nn.ModuleList:
    """Linear layers of `layers`' widths, the first taking `width` inputs."""
    return nn.ModuleList(nn.Linear(n_in, n_out) for n_in, n_out in zip([width] + layers, layers))


def _dense_forward(model: nn.Module, x: torch.Tensor, outputs: Dict[str, torch.Tensor]) -> Any:
    """`model.dense` over `x` (ReLU between) -> mean: the loss, and with the pooled (and sequence)
    `outputs` what the forward produced kept in LAST_OUTPUTS."""
    for i, layer in enumerate(model.dense):
        x = layer(x)
        if i + 1 < len(model.dense):
            x = torch.relu(x)
    # What the forward produced, for output comparisons: this rank's rows of every feature's
    # pooled embedding and of the model's output (kept here, not returned: DMP's wrapper
    # hands back the loss as the user's model does).
    LAST_OUTPUTS.clear()
    LAST_OUTPUTS.update({name: t.detach().clone() for name, t in outputs.items()})
    LAST_OUTPUTS["model_output"] = x.detach().clone()
    loss = x.mean()
    return (loss, loss.detach()) if model.pipelined else loss


class Model(nn.Module):
    """EmbeddingBagCollection (and an EmbeddingCollection for sequence tables, each bag's rows
    summed) -> Linear layers (ReLU between) -> mean, as dmpcheck's reference."""

    def __init__(self, tables: List[EmbeddingBagConfig], layers: List[int], features: List[str], weighted: bool,
                 device: str = "meta", sequence_tables: Sequence[EmbeddingConfig] = ()) -> None:
        super().__init__()
        from torchrec import EmbeddingBagCollection, EmbeddingCollection

        # On the meta device, as TorchRec users build large models: DMP materialises the tables
        # and draws each rank's shards itself.  On cpu where the user fills the tables first.
        # (Any: the collection, None, or what build_model puts it behind: managed collision.)
        self.ebc: Any = (EmbeddingBagCollection(tables=tables, device=torch.device(device), is_weighted=weighted)
                         if tables else None)
        self.ec: Any = (EmbeddingCollection(tables=list(sequence_tables), device=torch.device(device))
                        if sequence_tables else None)
        self.bag_features = [f for t in tables for f in t.feature_names]
        self.sequence_features = list(dict.fromkeys(f for t in sequence_tables for f in t.feature_names))
        # The EmbeddingCollection's output keys: a feature several of its tables read is
        # "<feature>@<table>", as TorchRec names it.
        self.sequence_keys = output_keys([(t.name, f) for t in sequence_tables for f in t.feature_names])
        width = sum(t.embedding_dim * len(t.feature_names) for t in list(tables) + list(sequence_tables))
        self.dense = _linear_layers(width, layers)
        self.features = features
        # As TorchRec's train pipelines expect: a torchrec.datasets.utils.Batch in, (loss, output) out.
        self.pipelined = False

    def forward(self, batch: Union[KeyedJaggedTensor, Batch]) -> Any:
        kjt = batch.sparse_features if self.pipelined else batch
        pooled: Dict[str, torch.Tensor]
        per_id: Dict[str, torch.Tensor] = {}
        if self.ec is None:
            pooled = _embeddings(self.ebc(kjt)).to_dict()
        else:
            pooled = {}
            if self.ebc is not None:
                bags = _embeddings(self.ebc(select_features(kjt, self.bag_features))).to_dict()
                # By key, not by iterating the dict: TorchRec's pipeline traces this (torch.fx).
                pooled.update({f: bags[f] for f in self.features if f not in self.sequence_keys})
            # With variable batches the EmbeddingCollection returns every bag of the batch (1.9.2's
            # sharded one expands the distinct bags through the inverse indices, measured).
            sequences = _embeddings(self.ec(select_features(kjt, self.sequence_features)))
            for f in self.sequence_keys:
                # Each bag's rows summed, in id order, as the model's input; each id's row is an
                # output of its own (sequence_embeddings.<feature>), compared id by id.
                rows = sequences[f].values()
                per_id[f] = rows
                pooled[f] = sum_bags(rows, sequences[f].lengths())
        # By key, in the model's feature order: a sharded EBC may return its keys in sharding order.
        x = torch.cat([pooled[f] for f in self.features], dim=1)
        outputs = {"pooled_embeddings." + f: pooled[f] for f in self.features}
        outputs.update({"sequence_embeddings." + f: rows for f, rows in per_id.items()})
        return _dense_forward(self, x, outputs)


class BagModel(nn.Module):
    """One torch.nn.EmbeddingBag -> Linear layers (ReLU between) -> mean: the model of TorchRec #602.

    The bag sits where an EBC keeps its tables (ebc.embedding_bags.<table>), so its state_dict keys
    are the EBC's and every comparison reads it alike."""

    def __init__(self, table: contract.Table, layers: List[int], device: str = "meta") -> None:
        super().__init__()
        self.ebc = nn.Module()
        self.ebc.embedding_bags = nn.ModuleDict(
            {table.name: nn.EmbeddingBag(table.rows, table.dim, mode=table.pooling, device=torch.device(device))})
        self.table = table.name
        self.feature = table.features[0]
        self.pipelined = False
        self.dense = _linear_layers(table.dim, layers)

    def forward(self, batch: Union[KeyedJaggedTensor, Batch]) -> Any:
        kjt = batch.sparse_features if self.pipelined else batch
        bags = kjt[self.feature]
        # nn.EmbeddingBag's offsets: where each bag starts (the KJT's offsets without the last).
        pooled = self.ebc.embedding_bags[self.table](bags.values(), bags.offsets()[:-1])
        return _dense_forward(self, pooled, {"pooled_embeddings." + self.feature: pooled})


def is_embedding_bag(spec: contract.RunSpec) -> bool:
    return spec.module == "embedding_bag"




def output_pieces(rank: int, world: int, batch_size: int,
                  id_counts: Optional[Dict[str, List[int]]] = None) -> List[TensorPiece]:
    """This rank's rows of the last forward's outputs, placed in the global batch (rank order).  A
    sequence output has a row per id: `id_counts` (dump.id_counts: per feature, each rank's ids in
    the batch) places them; without it (one process) the rows are the whole."""
    pieces: List[TensorPiece] = []
    for name, t in sorted(LAST_OUTPUTS.items()):
        t = t.flatten(1) if t.dim() > 1 else t.reshape(-1, 1)  # [0, dim] stays itself (a rank without ids)
        full, offset = batch_size * world, rank * batch_size
        if name.startswith("sequence_embeddings."):
            counts = (id_counts or {}).get(name.split(".", 1)[1].split("@")[0])  # "<feature>@<table>": the feature's ids
            if counts is None and world > 1:
                raise ValueError(f"{name}: rank {rank} of {world} needs every rank's id counts to place its rows")
            counts = counts or [t.shape[0]]
            if counts[rank] != t.shape[0]:
                raise ValueError(f"{name}: rank {rank} returned {t.shape[0]} rows for {counts[rank]} ids")
            full, offset = sum(counts), sum(counts[:rank])
        pieces.append({"name": name, "sharding": "output", "replicated": False,
                       "full_sizes": [full, t.shape[1]], "row_offset": offset, "col_offset": 0, "tensor": t})
    return pieces


def managed_collision(spec: contract.RunSpec, collection: nn.Module,
                      configs: Sequence[Union[EmbeddingBagConfig, EmbeddingConfig]], device: str) -> nn.Module:
    """`collection` (an EBC, or an EC) behind TorchRec's managed collision: a
    ManagedCollisionEmbeddingBagCollection (ManagedCollisionEmbeddingCollection) with an MCH
    module per table of `configs` (zch_size: its rows) over raw ids in [0, input_hash_size)."""
    from torchrec.modules import mc_embedding_modules, mc_modules

    import inspect

    policies = {"lfu": "LFU_EvictionPolicy", "distance_lfu": "DistanceLFU_EvictionPolicy", "lru": "LRU_EvictionPolicy"}
    # From 1.x on an MCH module splits its rows into buckets, and row_wise sharding needs as many
    # as ranks (1.9.2 refuses uneven buckets per rank); the unsharded module is built alike, so
    # both remap an id into the same bucket.
    extra: Dict[str, Any] = {}
    if "buckets" in inspect.signature(mc_modules.MCHManagedCollisionModule.__init__).parameters:
        extra["buckets"] = spec.world_size
    modules: Dict[str, nn.Module] = {}
    names = {c.name for c in configs}
    for t in [t for t in spec.tables if t.name in names]:
        mc = t.managed_collision
        if mc.module == "hash_zch":
            # What replaced the MCH module in 1.x: multi-probe zero-collision hashing, a bucket per
            # rank as its row_wise sharding asks (rows must divide by them), its own eviction (none).
            try:
                from torchrec.modules.hash_mc_modules import HashZchManagedCollisionModule
            except ImportError:
                raise Unsupported(f"table {t.name}: this release has no HashZchManagedCollisionModule") from None
            modules[t.name] = HashZchManagedCollisionModule(
                zch_size=t.rows, device=torch.device(device), total_num_buckets=spec.world_size,
                input_hash_size=mc.input_hash_size, name=t.name)
            continue
        policy = getattr(mc_modules, policies[mc.eviction], None)
        if policy is None:
            raise Unsupported(f"table {t.name}: this release has no {policies[mc.eviction]} (eviction {mc.eviction})")
        modules[t.name] = mc_modules.MCHManagedCollisionModule(
            zch_size=t.rows, device=torch.device(device), eviction_policy=policy(), eviction_interval=mc.interval,
            input_hash_size=mc.input_hash_size, **extra)
    mcc = mc_modules.ManagedCollisionCollection(modules, list(configs))
    kind = "ManagedCollisionEmbeddingBagCollection" if hasattr(collection, "embedding_bags") else \
        "ManagedCollisionEmbeddingCollection"
    if not hasattr(mc_embedding_modules, kind):  # 0.6.0 has the EBC's alone
        raise Unsupported(f"this release has no {kind} (managed collision of sequence tables)")
    return getattr(mc_embedding_modules, kind)(collection, mcc, return_remapped_features=False)


class EvictionDraws:
    """A managed-collision table's init_fn, TorchRec's own, that keeps what it draws once
    `recording` is on (after the model exists): the rows the sharded model re-draws for ids
    it evicted.  The unsharded oracle puts the same draws into the rows its own modules evict."""

    recording = False
    drawn: ClassVar[Dict[str, List[torch.Tensor]]] = {}  # table -> [tensor] since the last take()

    def __init__(self, table: str, init_fn: Callable[[torch.Tensor], Optional[torch.Tensor]]) -> None:
        self.table, self.init_fn = table, init_fn

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        out = self.init_fn(t)
        out = t if out is None else out
        if EvictionDraws.recording:
            EvictionDraws.drawn.setdefault(self.table, []).append(out.detach().clone())
        return out

    @staticmethod
    def take() -> List[TensorPiece]:
        """The draws since the last call, as pieces of a phase of their own: mc.<table>.redrawn."""
        pieces: List[TensorPiece] = [{"name": f"mc.{table}.redrawn", "sharding": "redrawn", "replicated": False,
                                      "full_sizes": list(torch.cat(draws).shape), "tensor": torch.cat(draws)}
                                     for table, draws in sorted(EvictionDraws.drawn.items())]
        EvictionDraws.drawn = {}
        return pieces


class BucketedMCH(nn.Module):
    """What a row-wise sharded MCH module is, in one process: TorchRec routes a raw id to rank
    id // ceil(input_hash_size / ranks), whose own MCH module remaps it within that rank's rows
    (a miss to its last row, each with its own history and eviction).  One of TorchRec's MCH
    modules per rank's rows, rebuilt as its sharder rebuilds them, stands here for the sharded
    module; a single unsharded module with the table's rows is not its equal (a miss lands on
    the table's last row, and one history ranks every id)."""

    def __init__(self, module: nn.Module, splits: List[Tuple[int, int]], input_hash_size: int) -> None:
        super().__init__()
        bounds = [start for start, _ in splits] + [splits[-1][0] + splits[-1][1]]
        self.parts = nn.ModuleList(module.rebuild_with_output_id_range(
            output_id_range=(start, start + rows), output_segments=bounds, device=torch.device("cpu"))
            for start, rows in splits)
        self.block = (input_hash_size + len(splits) - 1) // len(splits)
        # on_evict(part, rows): what the sharded model does to the rows a part evicts (it re-draws
        # them before the lookup; TorchRec's unsharded MC-EBC leaves them: its evict does nothing).
        self.on_evict: Optional[Callable[[int, torch.Tensor], None]] = None

    def forward(self, features: Dict[str, JaggedTensor], mutate_miss_lengths: bool = True) -> Dict[str, JaggedTensor]:
        from torchrec.sparse.jagged_tensor import JaggedTensor

        out: Dict[str, JaggedTensor] = {}
        for name, jt in features.items():
            values = jt.values()
            owner = torch.div(values, self.block, rounding_mode="floor")
            if values.numel() and int(owner.max()) >= len(self.parts):
                raise Unsupported(f"{name}: id {int(values.max())} lies beyond the input hash size")
            remapped = torch.empty_like(values)
            for b, part in enumerate(self.parts):  # every rank's module runs every step, ids or none
                mine = owner == b
                got = part({name: JaggedTensor(values=values[mine], lengths=mine.sum().reshape(1).int())})
                remapped[mine] = got[name].values()
            out[name] = JaggedTensor(values=remapped, lengths=jt.lengths(), weights=jt.weights_or_none())
        if self.on_evict is not None:
            for b, part in enumerate(self.parts):
                rows = part.evict()
                if rows is not None:
                    self.on_evict(b, rows)
        return out

    def evict(self) -> Optional[torch.Tensor]:
        evicted = [e for e in (part.evict() for part in self.parts) if e is not None]
        return torch.cat(evicted) if evicted else None


def _managed_collision_module_dicts(model: Model) -> List[Any]:
    """The MCH modules' ModuleDict of each of `model`'s managed-collision collections (EBC, then EC)."""
    return [collection._managed_collision_collection._managed_collision_modules for collection in (model.ebc, model.ec)
            if collection is not None and hasattr(collection, "_managed_collision_collection")]


def managed_collision_modules(model: Model) -> Dict[str, nn.Module]:
    """Every MCH module of `model`'s managed-collision collections, by table."""
    return {table: module for modules in _managed_collision_module_dicts(model) for table, module in modules.items()}


def table_weight(model: Model, table: str) -> torch.nn.Parameter:
    """The unsharded model's weight of `table`, wherever its (managed-collision) collection keeps it."""
    for collection in (model.ebc, model.ec):
        inner = getattr(collection, "_embedding_module", getattr(collection, "_embedding_bag_collection", collection))
        tables = getattr(inner, "embedding_bags", None) or getattr(inner, "embeddings", None)
        if tables is not None and table in tables:
            return tables[table].weight
    raise KeyError(table)


def bucketed_managed_collision(model: Model, spec: contract.RunSpec,
                               splits_of: Callable[[str], List[Tuple[int, int]]]) -> None:
    """`model`'s MCH modules replaced by BucketedMCH over each table's row splits (`splits_of`:
    table -> [(row_offset, rows)] as the sharded model holds them)."""
    for modules in _managed_collision_module_dicts(model):
        for t in spec.tables:
            if t.name in modules:
                modules[t.name] = BucketedMCH(modules[t.name], splits_of(t.name), t.managed_collision.input_hash_size)


def managed_collision_state(model: Model, replicated: Set[str]) -> Dict[str, torch.Tensor]:
    """The MCH modules' state under dmpcheck's names (mc.<table>.<buffer>): a BucketedMCH's parts
    put together in row order, but for the names in `replicated` (what every rank of the sharded
    model holds whole: its iteration counter, output segments), which its first part gives."""
    out: Dict[str, torch.Tensor] = {}
    for table, module in managed_collision_modules(model).items():
        parts = list(module.parts) if isinstance(module, BucketedMCH) else [module]
        states = [part.state_dict() for part in parts]
        for buffer, first in states[0].items():
            name = f"mc.{table}.{buffer.lstrip('_')}"
            out[name] = first if name in replicated else torch.cat([s[buffer] for s in states])
    return out


def build_model(spec: contract.RunSpec, device: str = "meta") -> Union[Model, BagModel]:
    """The scenario's model as a TorchRec user writes it, with the sparse optimizer applied in backward."""
    from torchrec import EmbeddingBagConfig, PoolingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    if is_embedding_bag(spec):
        t = spec.tables[0]
        if t.weighted or t.data_type != "fp32":
            raise Unsupported("module embedding_bag: an unweighted fp32 table (what TorchRec #602's model has)")
        model = BagModel(t, spec.dense_layers, device)
        opt_cls, opt_kwargs = optim.sparse_optimizer(spec.sparse_optimizer)
        apply_optimizer_in_backward(opt_cls, model.ebc.parameters(), dict(opt_kwargs))
        return model
    weighted = [t.weighted for t in spec.tables if t.pooling != "none"]
    if any(weighted) and not all(weighted):
        raise Unsupported("weighted and unweighted tables in one EmbeddingBagCollection (TorchRec needs two)")
    from torchrec import DataType

    pooling = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    # DataType.BF16 is from 0.5.0 on: an older release takes fp32 and fp16 tables only.
    data_type = {name: getattr(DataType, name.upper()) for name in ("fp32", "fp16", "bf16")
                 if hasattr(DataType, name.upper())}
    for t in spec.tables:
        if t.data_type not in data_type:
            raise Unsupported(f"table {t.name}: data_type {t.data_type} (this TorchRec's DataType has no "
                              f"{t.data_type.upper()})")
    from torchrec import EmbeddingConfig

    bagged = [t for t in spec.tables if t.pooling != "none"]
    sequenced = [t for t in spec.tables if t.pooling == "none"]
    tables = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                 feature_names=list(t.features), pooling=pooling[t.pooling],
                                 data_type=data_type[t.data_type])
              for t in bagged]
    # Sequence tables (pooling: none) go into an EmbeddingCollection.
    sequence_tables = [EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                       feature_names=list(t.features), data_type=data_type[t.data_type])
                       for t in sequenced]
    for config, t in zip(tables + sequence_tables, bagged + sequenced):
        if t.managed_collision.input_hash_size and config.init_fn is not None:
            config.init_fn = EvictionDraws(t.name, config.init_fn)
    # The EBC's output keys: a feature several tables read is "<feature>@<table>" (TorchRec's naming).
    features = output_keys([(t.name, f) for t in spec.tables for f in t.features])
    # The EBC's is_weighted as the user passed it: by default whether the tables are; "false" with
    # weighted tables is the user who forgot it (their batches still carry the weights).
    is_weighted = {"tables": all(weighted) and bool(weighted), "true": True, "false": False}[spec.is_weighted]
    model = Model(tables, spec.dense_layers, features, is_weighted, device, sequence_tables)
    if any(t.managed_collision.input_hash_size for t in bagged):
        model.ebc = managed_collision(spec, model.ebc, tables, device)
    if any(t.managed_collision.input_hash_size for t in sequenced):
        model.ec = managed_collision(spec, model.ec, sequence_tables, device)
    opt_cls, opt_kwargs = optim.sparse_optimizer(spec.sparse_optimizer)
    for module in (model.ebc, model.ec):
        if module is not None:
            # The tables' weights: an MCH module's own parameters (its remapping) take no gradient.
            apply_optimizer_in_backward(opt_cls, [p for p in module.parameters() if p.requires_grad],
                                        dict(opt_kwargs))
    return model
