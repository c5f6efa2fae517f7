"""Checkpoints as TorchRec users write and read them: the sharded model's state_dict and the
optimizers' (the fused one's ShardedTensors included) through torch.distributed.checkpoint, which
reshards on load, so a checkpoint written under one plan and world size loads under another."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from torch import nn
    from torchrec.optim.keyed import KeyedOptimizer


def save(model: nn.Module, optimizer: KeyedOptimizer, directory: str) -> None:
    """Every rank's part of the model's and the optimizer's state_dict, into `directory`."""
    import torch.distributed.checkpoint as dcp

    state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
    # torch 2.2 has save(); its checkpoint_id argument came later, storage_writer works in both.
    (dcp.save if hasattr(dcp, "save") else dcp.save_state_dict)(state, storage_writer=dcp.FileSystemWriter(directory))


def load(model: nn.Module, optimizer: KeyedOptimizer, directory: str) -> str:
    """The checkpoint in `directory` loaded into this model and optimizer (under their own plan);
    returns a note naming what was loaded and any optimizer state the checkpoint does not hold
    (such state stays as the new optimizer made it: a table that was data-parallel when saved has
    the dense optimizer's state, not the fused one's)."""
    import torch.distributed.checkpoint as dcp

    if hasattr(optimizer, "init_state"):
        optimizer.init_state()  # lazily made state (Adam's moments) must exist to be loaded into
    saved = set(dcp.FileSystemReader(directory).read_metadata().state_dict_metadata)
    model_state = model.state_dict()
    optim_state = optimizer.state_dict()
    held: Dict[str, Dict[str, Any]] = {}
    fresh: List[str] = []
    for param, states in optim_state["state"].items():
        mine = {n: v for n, v in states.items() if f"optim.state.{param}.{n}" in saved}
        fresh += [f"{param}.{n}" for n in states if n not in mine]
        if mine:  # (DCP would take an empty mapping for a value of its own, and miss it)
            held[param] = mine
    # A rank that holds no optimizer state to load (its tables' optimizer keeps none, or it holds
    # no table) asks for none: DCP reads an empty {"state": {}} as one value of its own, "optim.",
    # which no checkpoint holds (issue 46, item 15: "Missing key in checkpoint state_dict: optim.").
    target: Dict[str, Any] = {"model": model_state}
    if held:
        target["optim"] = {"state": held}
    (dcp.load if hasattr(dcp, "load") else dcp.load_state_dict)(target, storage_reader=dcp.FileSystemReader(directory))
    # DCP loads into the state_dicts' tensors in place; handing them back is what its docs ask.
    model.load_state_dict(target["model"])
    optimizer.load_state_dict(optim_state)
    note = (f"loaded the checkpoint through torch.distributed.checkpoint: {len(model_state)} model tensor(s), "
            f"{sum(len(v) for v in held.values())} optimizer state tensor(s)")
    if fresh:
        note += f"; not in the checkpoint, left as the new optimizer made them: {', '.join(sorted(fresh))}"
    return note
