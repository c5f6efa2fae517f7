"""The tensor exchange format between a TorchRec rank and dmpcheck (read by harness/run/torchrec_exchange.cc).

One phase of one rank is two files in out/rank<R>/: <phase>.bin, every tensor's float32 bytes
one after the other (little-endian, row-major), and <phase>.json, written last (so a reader never
sees a half-written phase):

    {"phase": "init", "tensors": [
       {"name": "ebc.embedding_bags.t0.weight", "sharding": "column_wise", "replicated": false,
        "full_sizes": [64, 8], "row_offset": 0, "col_offset": 4, "sizes": [64, 4], "offset": 0}, ...]}

A piece sits at [row_offset, row_offset + sizes[0]) x [col_offset, col_offset + sizes[1]) of the
full tensor (1-D tensors: rows only).  Replicated pieces are whole tensors.
"""

import json
import os


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
            entries.append({
                "name": p["name"], "sharding": p["sharding"], "replicated": bool(p["replicated"]),
                "full_sizes": [int(x) for x in p["full_sizes"]],
                "row_offset": int(p.get("row_offset", 0)), "col_offset": int(p.get("col_offset", 0)),
                "sizes": [int(x) for x in t.shape], "offset": offset,
            })
            offset += len(data)
    tmp = os.path.join(path, f"{phase}.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"phase": phase, "tensors": entries}, f)
    os.replace(tmp, os.path.join(path, f"{phase}.json"))


def read_full(path_json):
    """Whole tensors written by dmpcheck (an initial state to start from): {name: tensor}."""
    import torch

    with open(path_json) as f:
        manifest = json.load(f)
    with open(path_json[: -len(".json")] + ".bin", "rb") as f:
        blob = f.read()
    out = {}
    for e in manifest["tensors"]:
        n = 1
        for s in e["sizes"]:
            n *= s
        t = torch.frombuffer(bytearray(blob[e["offset"]: e["offset"] + 4 * n]), dtype=torch.float32)
        out[e["name"]] = t.reshape(e["sizes"]).clone()
    return out
