"""The oracle on the release itself: the same release's modules, unsharded, in one process.

After the sharded run, rank 0 builds the scenario's model again on cpu, unsharded, with the same
optimizers applied the same way (the sparse one in backward over the tables, the dense one over
the rest), loads the sharded model's initial weights (every rank's init phase put together), and
trains it on every step's global batch (all ranks' local batches in rank order; the mean of the
global batch's output equals the mean over ranks of each rank's mean, which DMP's averaging of
gradients trains on).  Its tensors go to out/unsharded/step<S> (outputs<S> for the forward),
under the names the sharded model's dump uses, so dmpcheck compares them as it compares the
reference's.  Whatever the reference does not model is judged all the same.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set

import torch

from dmpcheck_torchrec import contract, dump, hooks
from dmpcheck_torchrec.models import (LAST_OUTPUTS, bucketed_managed_collision, build_model,
                                      managed_collision_modules, managed_collision_state, output_pieces,
                                      table_weight)
from dmpcheck_torchrec.optim import Unsupported, dense_optimizer, in_backward_optimizer_filter
from dmpcheck_torchrec.state import MANAGED_COLLISION_STATE, dmpcheck_name, table_of

if TYPE_CHECKING:
    from torchrec.optim.keyed import KeyedOptimizer
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from dmpcheck_torchrec.dump import TensorPiece
    from dmpcheck_torchrec.models import Model


class OracleFailed(Exception):
    """The release's own unsharded model raised after the sharded run completed: the failure kind
    `oracle`, not `torchrec`, so that it is never read as the sharded run's (the user's hooks and
    what the rank program cannot express keep their own kinds)."""


def train_unsharded_or_say_so(spec: contract.RunSpec, exchange: str, out_dir: str, world: int,
                              user: Optional[hooks.Hooks] = None,
                              tables_seen: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """train_unsharded, whose own failures are OracleFailed."""
    try:
        return train_unsharded(spec, exchange, out_dir, world, user, tables_seen)
    except (hooks.HookFailed, Unsupported, contract.ContractError):
        raise
    except Exception as e:  # noqa: BLE001 - re-raised, named as the oracle's
        raise OracleFailed("the unsharded model (the release's own modules in one process, on rank 0 after the "
                           f"sharded run completed) raised {type(e).__name__}: {e}") from e


# An in-backward optimizer's state as FBGEMM's fused kernels name it in the sharded model.
_FUSED_STATE_NAMES = {"sum": "momentum1", "momentum1": "momentum1", "exp_avg": "exp_avg",
                      "exp_avg_sq": "exp_avg_sq"}


def _state(model: torch.nn.Module, dense_opt: KeyedOptimizer, tables: Set[str],
           mc_replicated: Optional[Set[str]]) -> List[TensorPiece]:
    """The unsharded model's tensors under the names the sharded model's dump gives them."""
    pieces: Dict[str, torch.Tensor] = {}
    if mc_replicated is not None:
        pieces.update(managed_collision_state(model, mc_replicated))
    for key, v in model.state_dict().items():
        if torch.is_floating_point(v) and MANAGED_COLLISION_STATE not in key:
            pieces[dmpcheck_name(key)] = v
    for key, p in model.named_parameters():
        table = table_of(key, tables)
        for opt in getattr(p, "_in_backward_optimizers", []):
            for sname, v in opt.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and torch.is_floating_point(v) and v.dim() > 0:
                    if type(opt).__name__ == "RowWiseAdagrad" and v.dim() == 2 and v.shape[1] == 1:
                        v = v.reshape(-1)  # RowWiseAdagrad's [rows, 1] sum: FBGEMM's momentum1 is [rows]
                    pieces[f"ebc.embedding_bags.{table}.{_FUSED_STATE_NAMES.get(sname, sname)}"] = v
    for key, states in dense_opt.state_dict()["state"].items():
        for sname, v in states.items():
            if isinstance(v, torch.Tensor) and torch.is_floating_point(v) and v.dim() > 0:
                pieces[f"{dmpcheck_name(key)}.{sname}"] = v
    return [{"name": n, "sharding": "unsharded", "replicated": False, "full_sizes": list(v.shape), "tensor": v}
            for n, v in sorted(pieces.items())]


def _redraw(model: Model, table: str, out_dir: str, current: Dict[str, int],
            mismatches: List[str]) -> Callable[[int, torch.Tensor], None]:
    """What the sharded MC-EBC does to the rows rank `part`'s MCH module evicts, before the lookup
    (TorchRec's unsharded one leaves them): their optimizer state zeroed and their weights drawn
    again by the table's init_fn.  The draws are random, so the sharded rank's own (its
    redrawn<step> phase) go into the rows this model's own modules chose."""
    weight = table_weight(model, table)

    def on_evict(part: int, rows: torch.Tensor) -> None:
        path = os.path.join(out_dir, f"rank{part}", contract.phase_redrawn(current['step']) + ".json")
        drawn = dump.read_full(path).get(f"mc.{table}.redrawn") if os.path.exists(path) else None
        if drawn is None or drawn.shape[0] != rows.numel():
            # The two MCH modules disagree (their state comparison shows where): these rows stay.
            mismatches.append(f"table {table} at step {current['step']}: the MCH module for rank {part}'s rows "
                              f"evicted {rows.numel()} row(s) unsharded, {0 if drawn is None else drawn.shape[0]} "
                              f"sharded, so none was re-drawn")
            return
        with torch.no_grad():
            weight[rows] = drawn
            for opt in getattr(weight, "_in_backward_optimizers", []):
                for v in opt.state.get(weight, {}).values():
                    if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == weight.shape[0]:
                        v[rows] = 0
    return on_evict


def train_unsharded(spec: contract.RunSpec, exchange: str, out_dir: str, world: int,
                    user: Optional[hooks.Hooks] = None, tables_seen: Optional[Dict[str, Dict[str, Any]]] = None) -> str:
    """Trains the unsharded model as above; returns a note saying what it did.  `user`: the
    scenario's hooks, whose hook_build_model builds this model as it built the sharded ranks'."""

    ctx = hooks.Context(0, 1, dict(tables_seen or {}))
    ctx.unsharded = True

    def batch_for(step: int) -> KeyedJaggedTensor:
        return hooks.batch(user, ctx, step, dump.load_global_batch(exchange, step, world), ", for the unsharded model")

    with torch.random.fork_rng():  # its own draw is overwritten; the sharded ranks' generators stay put
        model = build_model(spec, "cpu")
        if user is not None and user.has("build_model"):
            ctx.model, ctx.device = model, "cpu"
            user.call("build_model", ctx)
            model = ctx.model
    ctx.model = model
    initial = dump.read_assembled(out_dir, world, contract.phase_init())
    mc_replicated: Optional[Set[str]] = None
    current = {"step": 0}
    mismatches: List[str] = []
    if any(t.managed_collision.module == "hash_zch" for t in spec.tables):
        raise Unsupported("the unsharded model stands for sharded MCH modules only; one for hash_zch's "
                          "(HashZchManagedCollisionModule) is not built")
    if any(t.managed_collision.input_hash_size for t in spec.tables):
        # Managed collision: one MCH module per rank's rows, as the sharded model holds them.
        bucketed_managed_collision(model, spec, lambda table: dump.row_splits(
            out_dir, world, contract.phase_init(), f"mc.{table}.mch_sorted_raw_ids"))
        manifest = contract.load(contract.Phase, os.path.join(out_dir, "rank0", "init.json"))
        mc_replicated = {e.name for e in manifest.tensors if e.replicated and e.name.startswith("mc.")}
        for table, module in managed_collision_modules(model).items():
            module.on_evict = _redraw(model, table, out_dir, current, mismatches)
    with torch.no_grad():
        for key, v in model.state_dict().items():
            name = dmpcheck_name(key)
            if not torch.is_floating_point(v) or MANAGED_COLLISION_STATE in key:
                continue
            if name not in initial:
                raise Unsupported(f"the unsharded model holds {name}, which the sharded model's initial state lacks")
            if list(initial[name].shape) != list(v.shape):
                raise Unsupported(f"{name} is {list(v.shape)} unsharded but {list(initial[name].shape)} sharded")
            v.copy_(initial[name])
    dense_opt = dense_optimizer(in_backward_optimizer_filter(model.named_parameters()), spec.dense_optimizer)
    tables = {t.name for t in spec.tables}
    where = os.path.join(out_dir, "unsharded")
    global_batch = spec.batch_size * world
    if spec.outputs and spec.steps == 0:
        with torch.no_grad():
            model(batch_for(1))
        dump.write_phase_in(where, contract.phase_outputs(0), output_pieces(0, 1, global_batch))
    for step in range(1, spec.steps + 1):
        current["step"] = step
        loss = model(batch_for(step))
        if spec.outputs:
            dump.write_phase_in(where, contract.phase_outputs(step - 1), output_pieces(0, 1, global_batch))
        loss.backward()  # the tables' optimizer steps in backward, as applied
        dense_opt.step()
        dense_opt.zero_grad()
        dump.write_phase_in(where, contract.phase_after(step), _state(model, dense_opt, tables, mc_replicated))
    LAST_OUTPUTS.clear()
    note = (f"the unsharded model (the release's own modules in one process, {spec.steps} step(s) on the global "
            f"batch of {global_batch}) started from the sharded model's initial weights")
    if mc_replicated is not None:
        note += ("; its managed collision is one of the release's MCH modules per rank's rows, and the rows they "
                 "evict take the sharded ranks' re-drawn values")
    if mismatches:
        note += f"; evictions differ: {'; '.join(mismatches[:3])}" + (
            f" (and {len(mismatches) - 3} more)" if len(mismatches) > 3 else "")
    return note
