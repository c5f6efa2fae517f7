"""The exchange's tensors and batches between a TorchRec rank and dmpcheck (harness/run/tensor_exchange.cc
and torchrec_cell.cc on the other side; the documents are contract.py's Phase and Batch).

One phase of one rank is two files in out/rank<R>/: <phase>.bin, every tensor's float32 bytes
one after the other (little-endian, row-major), and <phase>.json (a Phase), written last (so a
reader never sees a half-written phase).  A piece sits at [row_offset, row_offset + sizes[0]) x
[col_offset, col_offset + sizes[1]) of the full tensor (1-D tensors: rows only).  Replicated
pieces are whole tensors.
"""

import os

from dmpcheck_torchrec import contract


def write_phase(out_dir, rank, phase, pieces):
    import torch

    path = os.path.join(out_dir, f"rank{rank}")
    os.makedirs(path, exist_ok=True)
    entries = []
    offset = 0
    with open(os.path.join(path, f"{phase}.bin"), "wb") as f:
        for p in pieces:
            t = p["tensor"].detach().to(torch.float32).contiguous().cpu()
            data = t.numpy().tobytes()
            f.write(data)
            entries.append(contract.Piece(
                name=p["name"], sharding=p["sharding"], replicated=bool(p["replicated"]),
                full_sizes=[int(x) for x in p["full_sizes"]], row_offset=int(p.get("row_offset", 0)),
                col_offset=int(p.get("col_offset", 0)), sizes=[int(x) for x in t.shape], offset=offset))
            offset += len(data)
    contract.save(contract.Phase(contract.SCHEMA_VERSION, phase, entries), os.path.join(path, f"{phase}.json"))


def read_full(path_json):
    """Whole tensors written by dmpcheck (an initial state to start from): {name: tensor}."""
    import torch

    manifest = contract.load(contract.Phase, path_json)
    with open(path_json[: -len(".json")] + ".bin", "rb") as f:
        blob = f.read()
    out = {}
    for e in manifest.tensors:
        n = 1
        for s in e.sizes:
            n *= s
        t = torch.frombuffer(bytearray(blob[e.offset: e.offset + 4 * n]), dtype=torch.float32)
        out[e.name] = t.reshape(e.sizes).clone()
    return out


def load_batch(exchange, step, rank):
    """This rank's local batch of `step` (counted from 1), exactly what the reference trains on."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    b = contract.load(contract.Batch, os.path.join(exchange, "batches", f"step{step}_rank{rank}.json"))
    weights = torch.tensor(b.weights, dtype=torch.float32) if b.weighted else None
    return KeyedJaggedTensor(keys=b.keys, values=torch.tensor(b.values, dtype=torch.int64),
                             lengths=torch.tensor(b.lengths, dtype=torch.int32), weights=weights)
