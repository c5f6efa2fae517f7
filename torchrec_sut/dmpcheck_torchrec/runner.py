"""Builds, shards, trains and dumps the scenario's model on the installed TorchRec release.

The pieces, each its own module: contract (the documents exchanged with dmpcheck), models (the
model as a user writes it), optim (the release's optimizer classes), planning (TorchRec's
planner and sharders), state (this rank's tensors under dmpcheck's names), dump (the exchange's
files).  This module is the loop: init, the plan, the wrap, the steps, the meta document.
"""

from __future__ import annotations

import datetime
import math
import os
import time
from typing import TYPE_CHECKING, List, Optional, Sequence

import torch
import torch.distributed as dist

from dmpcheck_torchrec import checkpoint, contract, dump, hooks, loops, optim, oracle, quant
from dmpcheck_torchrec.models import LAST_OUTPUTS, EvictionDraws, build_model, output_pieces
from dmpcheck_torchrec.optim import Unsupported as Unsupported  # (rank.py reports it by name)
from dmpcheck_torchrec.planning import build_planner, plan_of
from dmpcheck_torchrec.state import check_fits, dmpcheck_name, load_initial, local_tensors, state_pieces

if TYPE_CHECKING:
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


class NonFiniteLoss(ArithmeticError):
    """The release's training produced a NaN or infinite loss (a failure of the release's run)."""


def versions() -> contract.Versions:
    """The release's versions as its own installation reports them."""
    from importlib.metadata import PackageNotFoundError, version

    def of(dist_name: str) -> str:
        try:
            return version(dist_name)
        except PackageNotFoundError:
            return ""

    import torchrec

    # Where the imported package is: the release's site-packages, or a commit's source put first
    # on PYTHONPATH (dmpcheck checks that it is the commit it asked for).
    source = os.path.dirname(os.path.abspath(torchrec.__file__))
    return contract.Versions(torchrec=of("torchrec"), torch=torch.__version__,
                             fbgemm_gpu=of("fbgemm-gpu-cpu") or of("fbgemm-gpu"), torchrec_source=source)


def _start(spec: contract.RunSpec, rank: int, notes: List[str], user: Optional[hooks.Hooks],
           ctx: hooks.Context) -> torch.nn.Module:
    """The unsharded model (as hook_build_model leaves it), with the user's weights in it when they
    load before the wrap."""
    # The init mode as a TorchRec user applies it: one torch.manual_seed before the model exists
    # (the seed per rank comes from dmpcheck, which applies its one rule for seeded/unseeded).
    torch.manual_seed(spec.seeds[rank])
    before_wrap = spec.start.kind in ("reference", "user_weights") and spec.start.load == "before_wrap"
    model = build_model(spec, "cpu" if before_wrap else "meta")
    if user is not None and user.has("build_model"):
        ctx.model, ctx.device = model, "cpu" if before_wrap else "meta"
        user.call("build_model", ctx)
        model = ctx.model
    if before_wrap:
        # The user's weights put into the unsharded model, which is then wrapped (TorchRec #1165).
        own = {dmpcheck_name(k): k for k in model.state_dict()}
        weights = dump.read_full(spec.start.state)
        if spec.start.kind == "user_weights":
            check_fits(model, weights, "init.from")
        full = {own.get(k, k): v for k, v in weights.items()}
        with torch.no_grad():
            model.load_state_dict(full, strict=False)
        notes.append(f"init.from's weights were loaded into the unsharded model before the wrap ({len(full)} tensors)")
    return model


def _init_process_group(timeout: datetime.timedelta) -> None:
    """Gloo over the launcher's rendezvous.  Under dmpcheck's launcher the store is a file in the
    cell's private (0700) directory, DMPCHECK_RENDEZVOUS_FILE, and Gloo listens on loopback
    (GLOO_SOCKET_IFNAME=lo): torch's TCPStore would listen on every interface and take writes from
    anyone who connects.  Started by another launcher (torchrun), its env:// rendezvous is used."""
    path = os.environ.get("DMPCHECK_RENDEZVOUS_FILE")
    if not path:
        dist.init_process_group(backend="gloo", timeout=timeout)
        return
    world = int(os.environ["WORLD_SIZE"])
    store = dist.FileStore(path, world)
    dist.init_process_group(backend="gloo", store=store, rank=int(os.environ["RANK"]), world_size=world,
                            timeout=timeout)


def run(spec: contract.RunSpec, exchange: str, out_dir: str, rank: int, import_s: float) -> None:
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.optim.keyed import CombinedOptimizer

    t0 = time.perf_counter()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    _init_process_group(datetime.timedelta(seconds=float(spec.timeout_s)))
    world = dist.get_world_size()
    if world != spec.world_size or len(spec.seeds) != world:
        raise Unsupported(f"the scenario needs {spec.world_size} ranks ({len(spec.seeds)} seeds), WORLD_SIZE is {world}")

    notes: List[str] = []
    user = hooks.Hooks(spec.hooks, rank, float(spec.timeout_s)) if spec.hooks else None
    ctx = hooks.Context(rank, world, {t.name: {"rows": t.rows, "dim": t.dim, "features": list(t.features)}
                                      for t in spec.tables})
    planner, sharders, planner_notes = build_planner(spec, world, spec.local_world_size)
    ctx.sharders = sharders  # hook_build_model may add to them
    model = _start(spec, rank, notes, user, ctx)
    notes = planner_notes + notes
    t_plan = time.perf_counter()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    plan_s = time.perf_counter() - t_plan
    plan_rows = plan_of(plan, {t.name for t in spec.tables})
    types = {p.table: p.sharding for p in plan_rows}
    table_dims = {t.name: (t.rows, t.dim) for t in spec.tables}

    sharded = DistributedModelParallel(model, plan=plan, sharders=sharders, device=torch.device("cpu"))
    if spec.start.kind in ("reference", "user_weights") and spec.start.load == "after_wrap":
        loaded = load_initial(sharded, spec.start.state, "init.from" if spec.start.kind == "user_weights" else "")
        notes.append(f"init.from's weights were loaded into the sharded model after the wrap ({len(loaded)} tensors)"
                     if spec.start.kind == "user_weights" else
                     f"started from the reference's initial weights ({len(loaded)} tensors)")
    # What trains: the wrapped model, or what the after_wrap hook put in its place (a compiled one).
    trained: torch.nn.Module = sharded
    if user is not None:
        ctx.model = sharded
        user.call("after_wrap", ctx)
        trained = ctx.model
        if rank == 0:
            notes.append(f"hooks of {spec.hooks}: " + ", ".join(
                hooks.PREFIX + p for p in hooks.POINTS if user.has(p)))
    dense_opt = optim.dense_optimizer(optim.in_backward_optimizer_filter(sharded.named_parameters()), spec.dense_optimizer)
    optimizer = CombinedOptimizer([sharded.fused_optimizer, dense_opt])
    if spec.start.kind == "checkpoint":  # a resumed run: the state as the earlier run saved it
        notes.append(checkpoint.load(sharded, optimizer, spec.start.state))
    init_s = time.perf_counter() - t0

    # A resumed run's first phase is the state it loaded, at the step it resumes after.
    first = spec.first_step
    dump.write_phase(out_dir, rank, contract.phase_after(first),
                     state_pieces(sharded, dense_opt, types, table_dims))
    losses: List[float] = []
    t1 = time.perf_counter()
    def batch_of(step: int) -> KeyedJaggedTensor:
        """The rank's batch of `step`: dmpcheck's, or what hook_batch made of it."""
        return hooks.batch(user, ctx, step, dump.load_batch(exchange, step, rank))

    if spec.outputs and spec.steps == 0:  # the forward alone: the outputs at step 0
        with torch.no_grad():
            sharded(batch_of(1))
        dump.write_phase(out_dir, rank, contract.phase_outputs(0),
                         output_pieces(rank, world, spec.batch_size, dump.id_counts(exchange, 1, world)))
    pipeline = loops.pipeline(spec.loop, sharded, optimizer)
    per_epoch = (spec.steps - first) // spec.epochs
    executed: List[int] = []
    evaluated: List[int] = []
    after_exhausted, step = 0, first
    # the one iterator of data_iterator: persistent, re-armed for every pass
    persistent: Optional[loops.DataIterator] = None

    def iterator(steps: Sequence[int]) -> loops.DataIterator:
        nonlocal persistent
        if spec.data_iterator != "persistent":
            return loops.DataIterator(batch_of, steps, as_batch=pipeline is not None)
        if persistent is None:
            persistent = loops.DataIterator(batch_of, steps, as_batch=pipeline is not None)
            return persistent
        return persistent.rearm(steps)

    for epoch in range(spec.epochs):
        EvictionDraws.recording = True  # the rows managed collision re-draws while training, every epoch
        mine = spec.batches_per_rank[rank] if spec.batches_per_rank else per_epoch
        begin = first + epoch * per_epoch + 1
        data = iterator(range(begin, begin + mine))
        counted = data.after_exhausted
        done = 0
        while True:
            if user is not None:
                ctx.step, ctx.optimizer = step + 1, optimizer
                user.call("before_step", ctx)
            try:
                loss = loops.train_one(pipeline, trained, optimizer, data)
            except StopIteration:
                break
            step, done = step + 1, done + 1
            if user is not None:
                ctx.step = step
                user.call("after_step", ctx)
            if not math.isfinite(loss):  # said as the release's, not left to break the documents
                raise NonFiniteLoss(f"step {step}: the loss is {loss} on rank {rank}")
            if spec.outputs:  # the forward of step s runs on the weights after s - 1 steps
                dump.write_phase(out_dir, rank, contract.phase_outputs(step - 1),
                                 output_pieces(rank, world, spec.batch_size,
                                               dump.id_counts(exchange, begin + done - 1, world)))
            losses.append(loss)
            redrawn = EvictionDraws.take()
            if redrawn:  # for the unsharded oracle only (dmpcheck does not read it)
                dump.write_phase(out_dir, rank, contract.phase_redrawn(step), redrawn)
            dump.write_phase(out_dir, rank, contract.phase_after(step), state_pieces(sharded, dense_opt, types, table_dims))
            if step == spec.checkpoint.after_step:
                t_save = time.perf_counter()
                checkpoint.save(sharded, optimizer, spec.checkpoint.dir)
                if rank == 0:
                    notes.append(f"saved the model's and the optimizers' state_dict through "
                                 f"torch.distributed.checkpoint after step {step} "
                                 f"({time.perf_counter() - t_save:.2f} s), then trained on uninterrupted")
            print(f"step {step}/{spec.steps} loss {losses[-1]:.6f}", flush=True)
        executed.append(done)
        EvictionDraws.recording = False
        after_exhausted += data.after_exhausted - counted
        if spec.eval_batches:  # the eval pass after the epoch, over the epoch's first batches
            data = iterator(range(begin, begin + spec.eval_batches[rank]))
            counted = data.after_exhausted
            evaluated.append(loops.evaluate(pipeline, sharded, data))
            after_exhausted += data.after_exhausted - counted
            print(f"eval after epoch {epoch + 1}: {evaluated[-1]} batch(es)", flush=True)
    train_s = time.perf_counter() - t1
    if user is not None:
        ctx.step = step
        user.call("at_end", ctx)
    for t in spec.tables:
        if t.data_type != "fp32" and LAST_OUTPUTS:
            held = {str(v.dtype) for k, v in local_tensors(sharded).items() if f".{t.name}." in k}
            returned = {str(v.dtype) for k, v in LAST_OUTPUTS.items()
                        if k.startswith("pooled_embeddings.") and k.split(".", 1)[1].split("@")[0] in t.features}
            notes.append(f"table {t.name} ({t.data_type}): weights held as {', '.join(sorted(held))}; "
                         f"pooled embeddings returned as {', '.join(sorted(returned))}")
    first_batch = dump.load_batch(exchange, first + 1, rank) if spec.steps > first else None
    if first_batch is not None and getattr(first_batch, "variable_stride_per_key", lambda: False)():
        strides = ", ".join(f"{k} {s[0]}" for k, s in zip(first_batch.keys(), first_batch.stride_per_key_per_rank()))
        notes.append(f"batches handed to TorchRec with variable batch per feature (VBE: stride_per_key_per_rank and "
                     f"inverse_indices; rank {rank}'s distinct bags at step {first + 1}: {strides} of "
                     f"{dump.bags_of(first_batch)}); an unsharded model trains on their expansion")
    if spec.sparse_optimizer.weight_decay_mode != "none":
        notes.append(f"weight_decay_mode {spec.sparse_optimizer.weight_decay_mode} handed to FBGEMM's fused "
                     f"{spec.sparse_optimizer.type} through TorchRec's optimizer kwargs; its kernels hold "
                     f"{', '.join(optim.fused_weight_decay_modes(sharded)) or 'none'}")
    record = contract.RankLoop(rank=rank, batches=executed, next_after_exhausted=after_exhausted,
                               eval_batches=evaluated)
    records: List[object] = [None] * world
    dist.all_gather_object(records, contract.to_dict(record))  # also: every rank's phases are on disk
    observed: List[object] = [None] * world
    dist.all_gather_object(observed, user.observed if user is not None else [])
    if rank == 0:
        if spec.unsharded:
            t2 = time.perf_counter()
            notes.append(oracle.train_unsharded_or_say_so(spec, exchange, out_dir, world, user, ctx.tables) +
                         f", on rank 0 after the sharded run ({time.perf_counter() - t2:.2f} s)")
        if spec.quantized:
            t3 = time.perf_counter()
            notes.append(quant.run(spec, exchange, out_dir, world, contract.phase_after(step),
                                   spec.quantized_sharded) + f" ({time.perf_counter() - t3:.2f} s)")
        # The oracle's hook values (rank hooks.UNSHARDED, rank 0's hooks called them) after the ranks'.
        oracle_said = [o for o in (user.observed if user is not None else []) if o["rank"] == hooks.UNSHARDED]
        meta = contract.RunMeta(versions=versions(), plan=plan_rows, losses=losses, notes=notes,
                                timings=contract.Timings(import_s=import_s, init_s=init_s, plan_s=plan_s,
                                                         train_s=train_s),
                                loops=[contract.parse_part(contract.RankLoop, r, "loop") for r in records],
                                observed=[contract.parse_part(contract.Observation, o, "observed")
                                          for said in observed + [oracle_said]
                                          for o in (said if isinstance(said, list) else [])])
        contract.save(meta, os.path.join(out_dir, "meta.json"))
    # The process group is not destroyed: the rank leaves by os._exit (rank.py, warm.py) with
    # everything it hands back on disk.  Destroying it deadlocked a rank of torch 2.0.1 (TorchRec
    # 0.3.x) now and then: ProcessGroupGloo's destructor joins a worker thread, holding the GIL,
    # while that thread waits for the GIL to free a tensor (gdb, 2 runs of the seed in 2 here).
