"""The exchange's tensors and batches between a TorchRec rank and dmpcheck (harness/run/tensor_exchange.cc
and torchrec_cell.cc on the other side; the documents are contract.py's Phase and Batch).

One phase of one rank is two files in out/rank<R>/: <phase>.bin, every tensor's float32 bytes
(int64 for a managed-collision module's ids and counters: Piece.dtype) one after the other
(little-endian, row-major), and <phase>.json (a Phase), written last (so a
reader never sees a half-written phase).  A piece sits at [row_offset, row_offset + sizes[0]) x
[col_offset, col_offset + sizes[1]) of the full tensor (1-D tensors: rows only).  Replicated
pieces are whole tensors.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Dict, Iterator, List, Optional, Sequence, Tuple

from dmpcheck_torchrec import contract

if TYPE_CHECKING:
    from typing import TypedDict

    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    class _TensorPieceFields(TypedDict):
        name: str
        sharding: str
        replicated: bool
        full_sizes: List[int]
        tensor: torch.Tensor

    class TensorPiece(_TensorPieceFields, total=False):
        """A piece of a phase as the modules hand it to write_phase: its tensor, where it sits in
        the full one (row_offset, col_offset: 0 when not given)."""

        row_offset: int
        col_offset: int


def write_phase(out_dir: str, rank: int, phase: str, pieces: Sequence[TensorPiece]) -> None:
    write_phase_in(os.path.join(out_dir, f"rank{rank}"), phase, pieces)


def write_phase_in(path: str, phase: str, pieces: Sequence[TensorPiece]) -> None:
    import torch

    os.makedirs(path, exist_ok=True)
    entries: List[contract.Piece] = []
    offset = 0
    with open(os.path.join(path, f"{phase}.bin"), "wb") as f:
        for p in pieces:
            # Integer state (a managed-collision module's ids and counters) stays exact as int64.
            exact = not torch.is_floating_point(p["tensor"])
            t = p["tensor"].detach().to(torch.int64 if exact else torch.float32).contiguous().cpu()
            data = t.numpy().tobytes()
            f.write(data)
            entries.append(contract.Piece(
                name=p["name"], sharding=p["sharding"], replicated=bool(p["replicated"]),
                full_sizes=[int(x) for x in p["full_sizes"]], row_offset=int(p.get("row_offset", 0)),
                col_offset=int(p.get("col_offset", 0)), sizes=[int(x) for x in t.shape], offset=offset,
                dtype="int64" if exact else "float32"))
            offset += len(data)
    contract.save(contract.Phase(contract.SCHEMA_VERSION, phase, entries), os.path.join(path, f"{phase}.json"))


def _pieces(path_json: str) -> Iterator[Tuple[contract.Piece, torch.Tensor]]:
    """(Piece, tensor) of every piece of one phase file."""
    import torch

    manifest = contract.load(contract.Phase, path_json)
    with open(path_json[: -len(".json")] + ".bin", "rb") as f:
        blob = f.read()
    types = {"float32": torch.float32, "int64": torch.int64}
    for e in manifest.tensors:
        if e.dtype not in types:
            raise contract.ContractError(f"{path_json}: '{e.name}' has dtype '{e.dtype}'; the exchange holds float32 or int64")
        n = math.prod(e.sizes)
        width = 8 if e.dtype == "int64" else 4
        if n == 0:  # (frombuffer refuses an empty buffer)
            yield e, torch.empty(e.sizes, dtype=types[e.dtype])
            continue
        yield e, torch.frombuffer(bytearray(blob[e.offset: e.offset + width * n]), dtype=types[e.dtype]).reshape(e.sizes)


def read_full(path_json: str) -> Dict[str, torch.Tensor]:
    """Whole tensors written by dmpcheck (an initial state to start from): {name: tensor}."""
    return {e.name: t.clone() for e, t in _pieces(path_json)}


def read_assembled(out_dir: str, world: int, phase: str) -> Dict[str, torch.Tensor]:
    """Every rank's pieces of `phase` put together: {name: full tensor} (a replica from rank 0)."""
    import torch

    out: Dict[str, torch.Tensor] = {}
    for rank in range(world):
        for e, t in _pieces(os.path.join(out_dir, f"rank{rank}", f"{phase}.json")):
            if e.replicated:
                out.setdefault(e.name, t.clone())
                continue
            full = out.setdefault(e.name, torch.zeros(e.full_sizes, dtype=t.dtype))
            block(full, [e.row_offset, e.col_offset], e.sizes).copy_(t)
    return out


def block(full: torch.Tensor, offsets: Sequence[int], sizes: Sequence[int]) -> torch.Tensor:
    """The piece of `full` of `sizes` at `offsets`: its rows, and of a 2-D piece its columns."""
    rows = full[offsets[0]: offsets[0] + sizes[0]]
    return rows[:, offsets[1]: offsets[1] + sizes[1]] if len(sizes) > 1 else rows


def row_splits(out_dir: str, world: int, phase: str, name: str) -> List[Tuple[int, int]]:
    """Where every rank's pieces of `name` sit in its rows, in row order: [(row_offset, rows)]."""
    splits: List[Tuple[int, int]] = []
    for rank in range(world):
        manifest = contract.load(contract.Phase, os.path.join(out_dir, f"rank{rank}", f"{phase}.json"))
        splits += [(e.row_offset, e.sizes[0]) for e in manifest.tensors if e.name == name and not e.replicated]
    return sorted(splits)


def _read_batch(exchange: str, step: int, rank: int) -> contract.Batch:
    return contract.load(contract.Batch, os.path.join(exchange, "batches", contract.batch_file(step, rank)))


def _kjt(keys: List[str], lengths: List[int], values: List[int],
         weights: Optional[List[float]]) -> KeyedJaggedTensor:
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    return KeyedJaggedTensor(keys=keys, values=torch.tensor(values, dtype=torch.int64),
                             lengths=torch.tensor(lengths, dtype=torch.int32),
                             weights=torch.tensor(weights, dtype=torch.float32) if weights is not None else None)


def load_batch(exchange: str, step: int, rank: int) -> KeyedJaggedTensor:
    """This rank's local batch of `step` (counted from 1): exactly what the reference trains on, or
    with variable batch per feature (VBE) each key's distinct bags with TorchRec's
    stride_per_key_per_rank and inverse_indices, which expand to it."""
    b = _read_batch(exchange, step, rank)
    if not b.stride_per_key:
        return _kjt(b.keys, b.lengths, b.values, b.weights if b.weighted else None)
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    keys = len(b.keys)
    if len(b.stride_per_key) != keys or len(b.inverse_indices) % max(keys, 1) or len(b.lengths) % max(keys, 1):
        raise contract.ContractError(f"step {step} rank {rank}: {len(b.stride_per_key)} strides and "
                                     f"{len(b.inverse_indices)} inverse indices for {keys} keys")
    bags = len(b.lengths) // keys
    lengths: List[int] = []
    values: List[int] = []
    weights: List[float] = []
    start = 0
    for k in range(keys):
        inverse = b.inverse_indices[k * bags:(k + 1) * bags]
        key_lengths = b.lengths[k * bags:(k + 1) * bags]
        offsets = [start]
        for n in key_lengths:
            offsets.append(offsets[-1] + n)
        start = offsets[-1]
        for j in range(b.stride_per_key[k]):  # distinct bag j: the first bag that names it
            i = inverse.index(j)
            lengths.append(key_lengths[i])
            values.extend(b.values[offsets[i]:offsets[i + 1]])
            weights.extend(b.weights[offsets[i]:offsets[i + 1]] if b.weighted else [])
    return KeyedJaggedTensor(
        keys=b.keys, values=torch.tensor(values, dtype=torch.int64), lengths=torch.tensor(lengths, dtype=torch.int32),
        weights=torch.tensor(weights, dtype=torch.float32) if b.weighted else None,
        stride_per_key_per_rank=[[s] for s in b.stride_per_key],
        inverse_indices=(list(b.keys), torch.tensor(b.inverse_indices, dtype=torch.int64).reshape(keys, bags)))


def bags_of(kjt: KeyedJaggedTensor) -> int:
    """The batch's bags per key: the stride, or with VBE the inverse indices' (the expanded batch)."""
    inverse = kjt.inverse_indices_or_none() if hasattr(kjt, "inverse_indices_or_none") else None
    return int(inverse[1].shape[1]) if inverse is not None else kjt.stride()


def id_counts(exchange: str, step: int, world: int) -> Dict[str, List[int]]:
    """Per key, how many ids each rank's local batch of `step` holds (rank order): where a rank's
    rows of a sequence output sit among the global batch's."""
    counts: Dict[str, List[int]] = {}
    for r in range(world):
        b = _read_batch(exchange, step, r)
        bags = len(b.lengths) // max(len(b.keys), 1)
        for i, k in enumerate(b.keys):
            counts.setdefault(k, []).append(sum(b.lengths[i * bags:(i + 1) * bags]))
    return counts


def load_global_batch(exchange: str, step: int, world: int) -> KeyedJaggedTensor:
    """Every rank's local batch of `step` as one batch: per key, rank 0's bags, then rank 1's, ..."""
    batches = [_read_batch(exchange, step, r) for r in range(world)]
    keys = batches[0].keys
    # lengths, values, weights
    per_key: Dict[str, Tuple[List[int], List[int], List[float]]] = {k: ([], [], []) for k in keys}
    for r, b in enumerate(batches):
        if b.keys != keys:
            raise contract.ContractError(f"step {step}: rank {r}'s batch has keys {b.keys}, rank 0's {keys}")
        bags = len(b.lengths) // max(len(keys), 1)
        start = 0
        for i, k in enumerate(keys):
            lengths = b.lengths[i * bags:(i + 1) * bags]
            end = start + sum(lengths)
            per_key[k][0].extend(lengths)
            per_key[k][1].extend(b.values[start:end])
            per_key[k][2].extend(b.weights[start:end] if b.weighted else [])
            start = end
    weighted = batches[0].weighted
    return _kjt(keys, [x for k in keys for x in per_key[k][0]], [x for k in keys for x in per_key[k][1]],
                [x for k in keys for x in per_key[k][2]] if weighted else None)
