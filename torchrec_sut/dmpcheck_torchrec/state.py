"""This rank's tensors under dmpcheck's names (weights, optimizer state), and loading whole ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Dict, List, Optional, Tuple

import torch

from dmpcheck_torchrec import dump
from dmpcheck_torchrec.contract import InputRefused

if TYPE_CHECKING:
    from torchrec.optim.keyed import KeyedOptimizer

    from dmpcheck_torchrec.dump import TensorPiece


def table_of(key: str, tables: Collection[str]) -> Optional[str]:
    """The table a state key belongs to: the segment right after an EBC's `embedding_bags` or an
    EC's `embeddings`, when it names one of `tables` (so a table named `dense` does not claim
    `dense.0.weight`); None for everything else."""
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        if part in ("embedding_bags", "embeddings") and parts[i + 1] in tables:
            return parts[i + 1]
    return None


# Where a managed-collision EBC keeps the collection it wraps (0.6.0's name, then 1.x's), and its
# MCH modules' state (sorted raw ids, their rows, counters, output segments).
_WRAPPED = ("ebc._embedding_bag_collection.", "ebc._embedding_module.")
_WRAPPED_EC = "ec._embedding_module."  # a managed-collision EC's EmbeddingCollection
MANAGED_COLLISION_STATE = "._managed_collision_collection."
_MC_MODULES = "._managed_collision_modules."


def mc_name(key: str) -> Optional[str]:
    """dmpcheck's name of a managed-collision module's buffer, mc.<table>.<buffer> (its leading
    underscore dropped: mc.t0.mch_sorted_raw_ids); None for any other key."""
    if MANAGED_COLLISION_STATE not in key or _MC_MODULES not in key:
        return None
    table, _, buffer = key.split(_MC_MODULES, 1)[1].partition(".")
    return f"mc.{table}.{buffer.lstrip('_')}"


def dmpcheck_name(key: str) -> str:
    """dmpcheck names every table's tensors as an EBC's (ebc.embedding_bags.<table>.*), sequence
    tables in the EmbeddingCollection (ec.embeddings.<table>.*) and the tables a managed-collision
    EBC wraps too."""
    for wrapped in _WRAPPED:
        if key.startswith(wrapped):
            return "ebc." + key[len(wrapped):]
    if key.startswith(_WRAPPED_EC):
        key = "ec." + key[len(_WRAPPED_EC):]
    return "ebc.embedding_bags." + key[len("ec.embeddings."):] if key.startswith("ec.embeddings.") else key


def state_pieces(model: torch.nn.Module, dense_opt: KeyedOptimizer, types: Dict[str, str],
                 table_dims: Dict[str, Tuple[int, int]]) -> List[TensorPiece]:
    """Every tensor this rank holds, under dmpcheck's names, with where it sits in the full tensor."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    pieces: List[TensorPiece] = []

    def add(name: str, sharding: str, v: torch.Tensor) -> None:
        """A whole tensor, replicated; a ShardedTensor's local shards, each where it sits."""
        if not isinstance(v, ShardedTensor):
            pieces.append({"name": name, "sharding": sharding, "replicated": True, "full_sizes": list(v.shape),
                           "tensor": v})
            return
        for sh in v.local_shards():
            offs = list(sh.metadata.shard_offsets) + [0]
            # (A row-wise optimizer state of a column-sharded table is [shards * rows] here and in
            # dmpcheck alike: column shard k's block at k * rows.)
            pieces.append({"name": name, "sharding": sharding, "replicated": False, "full_sizes": list(v.size()),
                           "row_offset": offs[0], "col_offset": offs[1], "tensor": sh.tensor})

    table: Optional[str]
    for key, v in model.state_dict().items():
        if MANAGED_COLLISION_STATE in key:
            # A managed-collision module's state: its remapping tables and counters sharded as
            # the table's rows, its iteration counter and output segments on every rank.
            name = mc_name(key)
            if name is not None and name.split(".")[1] in types and isinstance(v, (ShardedTensor, torch.Tensor)):
                add(name, types[name.split(".")[1]], v)
            continue
        table = table_of(key, types)
        if isinstance(v, ShardedTensor):  # (always a table's: `table` is not None)
            add(dmpcheck_name(key), types[table], v)  # type: ignore[index]
        elif torch.is_floating_point(v):
            add(dmpcheck_name(key), types[table] if table else "dense", v)
    # The fused (in-backward) optimizer of the model-parallel tables.
    for key, states in model.fused_optimizer.state_dict()["state"].items():
        table = table_of(key, types)
        for sname, v in states.items():
            if isinstance(v, ShardedTensor):  # (the fused optimizer's state is a table's)
                add(f"ebc.embedding_bags.{table}.{sname.split('.')[-1]}", types[table], v)  # type: ignore[index]
    # Whatever optimizer covers the rest (dense layers, and data-parallel tables in TorchRec).
    for key, states in dense_opt.state_dict()["state"].items():
        table = table_of(key, types)
        for sname, v in states.items():
            if not isinstance(v, torch.Tensor) or not torch.is_floating_point(v) or v.dim() == 0:
                continue  # step counters
            pieces.append({"name": f"{dmpcheck_name(key)}.{sname}", "sharding": types[table] if table else "dense",
                           "replicated": True, "full_sizes": list(v.shape), "tensor": v})
    return pieces


def local_tensors(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """This rank's tensors of the model's state_dict, local shards included, by key."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    out: Dict[str, torch.Tensor] = {}
    for key, v in model.state_dict().items():
        if isinstance(v, ShardedTensor):
            for i, sh in enumerate(v.local_shards()):
                out[f"{key}#{i}"] = sh.tensor
        elif isinstance(v, torch.Tensor):
            out[key] = v
    return out


def check_fits(model: torch.nn.Module, full: Dict[str, torch.Tensor], source: str) -> None:
    """contract.InputRefused unless `full` (the user's weights, under dmpcheck's names) holds every
    weight of the scenario's tables and dense layers at its full shape, and nothing the model does not
    hold (a 50-row table loaded into 37 rows its first 37; a misspelt name was ignored); names and
    shapes said in the words of the reference's check.  What hook_build_model adds may be absent."""
    shapes = {dmpcheck_name(k): tuple(v.size()) for k, v in model.state_dict().items()}
    for name, tensor in sorted(full.items()):
        if name not in shapes:
            raise InputRefused(f"{source} holds '{name}', which this model does not (it holds {', '.join(sorted(shapes))})")
        if tuple(tensor.shape) != shapes[name]:
            raise InputRefused(f"{source}: '{name}' is {list(tensor.shape)} but the model's is {list(shapes[name])}")
    for name in sorted(set(shapes) - set(full)):
        if name.startswith(("ebc.", "dense.")) and name.endswith((".weight", ".bias")):
            raise InputRefused(f"{source} has no '{name}', which the model holds ({list(shapes[name])})")


def load_initial(model: torch.nn.Module, path: str, source: str = "") -> List[str]:
    """Overwrites the live weights with whole tensors from dmpcheck (the reference's initial state,
    or the user's weights, `source`, checked to fit first)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    full = dump.read_full(path)
    if source:
        check_fits(model, full, source)
    loaded: List[str] = []
    with torch.no_grad():
        params = dict(model.named_parameters())
        for key, v in model.state_dict().items():
            if dmpcheck_name(key) not in full:
                continue
            src = full[dmpcheck_name(key)]
            if isinstance(v, ShardedTensor):
                for sh in v.local_shards():
                    sh.tensor.copy_(dump.block(src, sh.metadata.shard_offsets, sh.metadata.shard_sizes))
            elif key in params:
                params[key].copy_(src)
            else:
                v.copy_(src)
            loaded.append(key)
    return loaded
