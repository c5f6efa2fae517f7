"""The trained model quantized for inference, by the release's own path, on rank 0.

After the sharded run, rank 0 builds the scenario's EmbeddingBagCollection (and the
EmbeddingCollection of its sequence tables) unsharded on cpu with the sharded model's final
weights (every rank's last phase put together) and quantizes them with
torchrec.inference.modules.quantize_embeddings, each table to its own data type
(per_table_weight_dtype; the EmbeddingCollection mapped to torchrec.quant's as users map it).
A sequence table's output is a row per id (sequence_embeddings.<key>), its bound its own row's.  The first global batch (rank 0's first batch as handed to TorchRec
where it is a variable batch per feature) goes through the float and the quantized collection; both outputs, and the bound each element may differ by, go to out/quantized/:
float/, unsharded/ and bound/, phase outputs0, named pooled_embeddings.<key> as the model's own.
With `sharded`, the quantized collection is also sharded for inference over world_size devices
in this one process (TorchRec's inference sharding: one host, its devices) with the release's
quant sharder, loaded with the unsharded quantized state, and run on the same batch:
out/quantized/sharded/.

The bound.  TorchRec quantizes a table row by row with FBGEMM's
FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf: bias = the row's min, scale = (max - min) /
(2^bits - 1), both stored as fp16, each element rounded to the nearest step.  An element's error
is at most scale / 2, plus what fp16 rounding of the scale and bias can add ((max - min + |min|)
* 2^-11); an fp16 table's at most |x| * 2^-11 (the row's largest |x|).  A bag's bound is the sum
of its ids' row bounds, each times |weight| (divided by its length for mean pooling), plus 2^-20
of the bag's summed magnitudes for the order the two sides accumulate in.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from dmpcheck_torchrec import contract, dump
from dmpcheck_torchrec.models import build_model, output_keys, select_features, sum_bags
from dmpcheck_torchrec.optim import Unsupported
from dmpcheck_torchrec.state import dmpcheck_name

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dmpcheck_torchrec.dump import TensorPiece
    from dmpcheck_torchrec.models import Model

_BITS = {"int8": 8, "int4": 4, "int2": 2}
_FP16_ULP = 2.0 ** -11


def _dtypes() -> Dict[str, torch.dtype]:
    return {"int8": torch.qint8, "int4": torch.quint4x2, "int2": torch.quint2x4, "fp16": torch.half}


def _row_bounds(weight: torch.Tensor, quant: str) -> torch.Tensor:
    """Per row of a float table, the most an element can change when quantized as `quant`."""
    w = weight.detach().double()
    if quant == "fp16":
        return w.abs().amax(dim=1) * _FP16_ULP + 2.0 ** -24
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    scale = (hi - lo) / (2 ** _BITS[quant] - 1)
    return scale * (1 + 2 * _FP16_ULP) / 2 + (hi - lo + lo.abs()) * _FP16_ULP + 2.0 ** -24


def _keys(tables: Sequence[contract.Table]) -> Dict[Tuple[str, str], str]:
    """Each (table, feature) of `tables` to its output key (models.output_keys)."""
    readings = [(t.name, f) for t in tables for f in t.features]
    return dict(zip(readings, output_keys(readings)))


def _bounds(spec: contract.RunSpec, collection: torch.nn.Module, kjt: KeyedJaggedTensor,
            pooled: bool = True) -> Dict[str, torch.Tensor]:
    """Per output key of the collection, the bound of each element (see the module's text); of an
    EmbeddingCollection (not pooled), each id's row bound (its own row's, no sum)."""
    tables = [t for t in spec.tables if (t.pooling != "none") == pooled]
    keys, bags, out = _keys(tables), kjt.to_dict(), {}
    for t in tables:
        weight = getattr(collection, "embedding_bags" if pooled else "embeddings")[t.name].weight.detach().double()
        per_row = _row_bounds(weight, t.quant)
        for f in t.features:
            jt = bags[f]
            ids, lengths = jt.values().long(), jt.lengths().long()
            if not pooled:
                out[keys[(t.name, f)]] = (per_row[ids].unsqueeze(1).expand(-1, t.dim) +
                                          weight[ids].abs() * 2.0 ** -20).float()
                continue
            scale = (jt.weights().double().abs() if collection.is_weighted() else
                     torch.ones(ids.numel(), dtype=torch.double))
            error = sum_bags((per_row[ids] * scale).unsqueeze(1).expand(-1, t.dim), lengths)
            magnitude = sum_bags(weight[ids].abs() * scale.unsqueeze(1), lengths)
            bound = error + magnitude * 2.0 ** -20
            if t.pooling == "mean":
                bound = bound / lengths.clamp(min=1).double().unsqueeze(1)
            out[keys[(t.name, f)]] = bound.float()
    return out


def _pieces(outputs: Dict[str, torch.Tensor], prefix: str = "pooled_embeddings.") -> List[TensorPiece]:
    return [{"name": prefix + k, "sharding": "output", "replicated": False,
             "full_sizes": list(v.shape), "row_offset": 0, "col_offset": 0, "tensor": v.detach().float()}
            for k, v in sorted(outputs.items())]


def _waited(result: Any) -> Any:
    """A collection's output: a sharded one's awaitable waited for."""
    return result.wait() if hasattr(result, "wait") else result


class _Collections(torch.nn.Module):
    """The model's collections as one module (torch's quantize_dynamic and TorchRec's
    _shard_modules act on a module's children): `ebc`, `ec` where the model has them."""

    def __init__(self, ebc: Optional[torch.nn.Module], ec: Optional[torch.nn.Module]) -> None:
        super().__init__()
        if ebc is not None:
            self.ebc = ebc
        if ec is not None:
            self.ec = ec

    def lookups(self, model: Model,
                kjt: KeyedJaggedTensor) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor]]:
        """(pooled, rows): the EBC's pooled embeddings and the EC's rows per id, by output key."""
        pooled: Dict[str, torch.Tensor] = {}
        rows: Dict[str, torch.Tensor] = {}
        ebc, ec = getattr(self, "ebc", None), getattr(self, "ec", None)
        if ebc is not None:
            pooled = _waited(ebc(select_features(kjt, model.bag_features) if ec is not None else kjt)).to_dict()
        if ec is not None:  # each key's rows per id
            rows = {k: jt.values() for k, jt in _waited(ec(select_features(kjt, model.sequence_features))).items()}
        return pooled, rows


def _shard_for_inference(spec: contract.RunSpec, quantized: _Collections, model: Model, world: int,
                         batch: KeyedJaggedTensor) -> Tuple[Dict[str, torch.Tensor], Dict[str, torch.Tensor], str]:
    """The quantized collections sharded for inference over `world` devices in this process, as
    TorchRec's own CPU inference tests shard them, with the unsharded state loaded; their outputs."""
    from torchrec.distributed.quant_embeddingbag import QuantEmbeddingBagCollectionSharder
    from torchrec.distributed.shard import _shard_modules
    from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, row_wise,
                                                    table_wise)
    from torchrec.distributed.types import ShardingEnv

    try:  # TorchRec's CPU inference: the device each shard's lookup runs on follows the input's
        from torchrec.distributed.global_settings import set_propogate_device
    except ImportError:
        # Before 0.8.0 the sharded lookups are placed on cuda whatever the input's device (measured:
        # "Found no NVIDIA driver", or in a forked rank "Cannot re-initialize CUDA").
        raise Unsupported("this release shards quantized modules for inference on cuda only (no "
                          "torchrec.distributed.global_settings.set_propogate_device before 0.8.0)") from None
    set_propogate_device(True)

    # Per sharding type, how a table (by its index in the scenario) is sharded.
    shard_by: Dict[str, Callable[[int], Any]] = {"table_wise": lambda i: table_wise(rank=i % world),
                                                  "row_wise": lambda i: row_wise(),
                                                  "column_wise": lambda i: column_wise(ranks=list(range(world)))}
    per_param: Dict[str, Any] = {}
    for t in spec.tables:
        kind = t.constraints.sharding_types[0] if t.constraints.sharding_types else "table_wise"
        if kind not in shard_by:
            raise Unsupported(f"table {t.name}: inference sharding as {kind} is not offered here "
                              "(table_wise, row_wise, column_wise)")
        per_param[t.name] = shard_by[kind](spec.tables.index(t))

    from torchrec.distributed.fused_params import FUSED_PARAM_QUANT_STATE_DICT_SPLIT_SCALE_BIAS
    from torchrec.distributed.types import ShardingPlan

    fused = {FUSED_PARAM_QUANT_STATE_DICT_SPLIT_SCALE_BIAS: True}
    sharders: List[Any] = []
    plans: Dict[str, Any] = {}
    states: Dict[str, Dict[str, Any]] = {}
    for name, module in quantized.named_children():
        if name == "ebc":
            sharder = QuantEmbeddingBagCollectionSharder(fused_params=fused)
            tables = [t.name for t in spec.tables if t.pooling != "none"]
        else:
            from torchrec.distributed.quant_embedding import QuantEmbeddingCollectionSharder

            sharder = QuantEmbeddingCollectionSharder(fused_params=fused)
            tables = [t.name for t in spec.tables if t.pooling == "none"]
        sharders.append(sharder)
        plans[name] = construct_module_sharding_plan(
            module, per_param_sharding={t: per_param[t] for t in tables}, local_size=world, world_size=world,
            device_type="cpu", sharder=sharder)
        states[name] = module.state_dict()
    sharded = _shard_modules(module=quantized, env=ShardingEnv.from_local(world, 0), plan=ShardingPlan(plans),
                             device=torch.device("cpu"), sharders=sharders)
    for name, state in states.items():
        getattr(sharded, name).load_state_dict(state)
    pooled, rows = sharded.lookups(model, batch)
    types = ", ".join(f"{t} {p.sharding_type}" for plan in plans.values() for t, p in plan.items())
    return pooled, rows, f"sharded for inference over {world} cpu devices in one process ({types})"


def _long(kjt: KeyedJaggedTensor) -> KeyedJaggedTensor:
    """`kjt` with int64 ids and lengths: FBGEMM's inference lookups of 0.6.0 and 0.7.0 check
    their indices as int64 only ("expected scalar type Long but found Int")."""
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    vbe: Dict[str, Any] = {}
    if getattr(kjt, "variable_stride_per_key", lambda: False)():  # strides and inverse indices kept
        vbe = {"stride_per_key_per_rank": kjt.stride_per_key_per_rank(), "inverse_indices": kjt.inverse_indices()}
    return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values().long(), lengths=kjt.lengths().long(),
                             weights=kjt.weights_or_none(), **vbe)


def quantize(spec: contract.RunSpec, collections: _Collections, split_scale_bias: bool = False) -> _Collections:
    """`collections` (a _Collections) quantized by quantize_embeddings, each table to its `quant`
    (torch's quantize_dynamic swaps a module's children: an EmbeddingBagCollection for a quant
    one, an EmbeddingCollection too).  `split_scale_bias`: their state holds each row's scale and
    bias apart from the weights, the mode TorchRec's quant sharders need for row_wise and
    column_wise."""
    from torchrec.inference.modules import quantize_embeddings

    if split_scale_bias:
        from torchrec.quant.embedding_modules import quant_prep_enable_quant_state_dict_split_scale_bias

        for module in collections.children():
            quant_prep_enable_quant_state_dict_split_scale_bias(module)
    dtypes = _dtypes()
    extra: Dict[str, Any] = {}
    if hasattr(collections, "ec"):  # as TorchRec users ask for it: the EC's quant module named
        import torchrec
        from torchrec.quant.embedding_modules import EmbeddingCollection as QuantEmbeddingCollection

        extra = {"additional_qconfig_spec_keys": [torchrec.EmbeddingCollection],
                 "additional_mapping": {torchrec.EmbeddingCollection: QuantEmbeddingCollection}}
    quantized: _Collections = quantize_embeddings(  # a copy of `collections`, its children swapped
        collections, dtype=dtypes[spec.tables[0].quant], inplace=False,
        per_table_weight_dtype={t.name: dtypes[t.quant] for t in spec.tables}, **extra)
    return quantized


def run(spec: contract.RunSpec, exchange: str, out_dir: str, world: int, final_phase: str, sharded: bool) -> str:
    """Quantizes the trained model and writes out/quantized/ as above; returns a note."""
    with torch.random.fork_rng():  # the model's own draw is overwritten
        model = build_model(spec, "cpu")
    collections = _Collections(model.ebc, model.ec)
    final = dump.read_assembled(out_dir, world, final_phase)
    with torch.no_grad():
        for key, v in collections.state_dict().items():
            name = dmpcheck_name(key)
            if name not in final:
                raise Unsupported(f"the sharded model's {final_phase} holds no {name} to quantize")
            v.copy_(final[name])
    # Sharded, the collections are made with scale and bias apart (split mode), as TorchRec's CPU
    # inference tests make them: its quant sharders ask for it for row_wise and column_wise, and
    # without it a table_wise shard fails to load the unsharded state (measured on 0.8.0, 1.9.2).
    quantized = quantize(spec, collections, split_scale_bias=sharded)
    batch = _long(dump.load_global_batch(exchange, 1, world))
    # A variable batch per feature (VBE) goes in as a user hands it: rank 0's local batch, with its
    # strides per key and inverse indices (the global batch is its expansion); the bound of each
    # of its bags is that of the expanded bag it stands for.  (dmpcheck refuses sequence tables
    # with it at load.)
    local = _long(dump.load_batch(exchange, 1, 0))
    vbe = getattr(local, "variable_stride_per_key", lambda: False)()
    given = local if vbe else batch
    with torch.no_grad():
        floats, float_rows = collections.lookups(model, given)
        pooled, rows = quantized.lookups(model, given)
        bounds = _bounds(spec, model.ebc, select_features(batch, model.bag_features)) if model.ebc is not None else {}
        row_bounds = (_bounds(spec, model.ec, select_features(batch, model.sequence_features), pooled=False)
                      if model.ec is not None else {})
        if vbe:
            bounds = {k: v[:spec.batch_size] for k, v in bounds.items()}
    where = os.path.join(out_dir, "quantized")
    seq = "sequence_embeddings."
    dump.write_phase_in(os.path.join(where, "float"), contract.phase_outputs(0), _pieces(floats) + _pieces(float_rows, seq))
    dump.write_phase_in(os.path.join(where, "unsharded"), contract.phase_outputs(0), _pieces(pooled) + _pieces(rows, seq))
    dump.write_phase_in(os.path.join(where, "bound"), contract.phase_outputs(0), _pieces(bounds) + _pieces(row_bounds, seq))
    kinds = ", ".join(f"{t.name} {t.quant}" for t in spec.tables)
    what = ("rank 0's first batch as a variable batch per feature (VBE, as handed to TorchRec)" if vbe else
            "the first global batch")
    names = [n for n, _ in quantized.named_children()]
    which = " and ".join({"ebc": "EmbeddingBagCollection", "ec": "EmbeddingCollection"}[n] for n in names)
    note = (f"the trained tables quantized by quantize_embeddings ({kinds}; output keys in the quantized "
            f"collection's order: {', '.join(list(pooled) + list(rows))}), {what} run through the float and the "
            f"quantized {which}; bound per element: half the row's step plus fp16 rounding of its "
            "scale and bias ((max - min + |min|) * 2^-11; fp16 tables |x| * 2^-11), summed over the bag's ids "
            "(a sequence table's row per id: its own row's)")
    if sharded:
        with torch.no_grad():
            outputs, sharded_rows, how = _shard_for_inference(spec, quantized, model, world, given)
        dump.write_phase_in(os.path.join(where, "sharded"), contract.phase_outputs(0),
                            _pieces(outputs) + _pieces(sharded_rows, seq))
        note += f"; the quantized collection {how}, both with scale and bias apart (split mode)"
    return note
