"""Script cells, the audit: digests of a user's TorchRec script's replicated tensors, no edit of it.

Recorder.  With the boot directory (audit_boot/) first on PYTHONPATH and DMPCHECK_AUDIT_DIR set,
Python's start-up runs audit_boot/sitecustomize.py, which calls install_lazy() here.  Nothing is
imported then but the standard library: an import hook waits for the script to import
torchrec.distributed.model_parallel and only then patches

* DistributedModelParallel.__init__: a phase "wrap" at its end ("wrap:dmp<i>" for a later DMP);
* KeyedOptimizer.step and every subclass's own step (CombinedOptimizer, KeyedOptimizerWrapper, ...):
  a phase "step <n>" when the outermost one returns;
* torch.optim's global step post hook (register_optimizer_step_post_hook) for plain torch
  optimizers: a phase "step <n>" at once, or, for optimizers stepped inside backward (torch's
  _apply_optimizer_in_backward), one phase at the end of that backward (queued on the autograd
  engine).  Kernels that fuse the update into backward themselves (fbgemm's TBE) step no Python
  optimizer: their update shows in the next phase;
* exit (atexit): a phase "exit".

Each phase digests (sha256 of the bytes, dtype, shape) every tensor that is a plain torch.Tensor in
each live DMP's state_dict (data-parallel tables and dense parameters; ShardedTensor and DTensor
shards are left out) and the plain-tensor state of the optimizers it can reach (the DMP's
fused_optimizer, the KeyedOptimizers and torch optimizers the script stepped, the in-backward
optimizers of the DMP's parameters).  The rank's file DMPCHECK_AUDIT_DIR/rank<R>.json is rewritten
atomically (tmp + os.replace) after every phase and at exit, so what was recorded before a crash is
on disk.  A failure of the audit is recorded in the file's "errors", never raised into the script.

Comparer: audit_compare.py (`python -m dmpcheck_torchrec.audit compare DIR` runs it).
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import hashlib
import json
import os
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

SCHEMA = "dmpcheck-audit/1"
ENV_DIR = "DMPCHECK_AUDIT_DIR"
TARGET = "torchrec.distributed.model_parallel"
_MARK = "__dmpcheck_audit__"

Digest = Dict[str, Any]  # {"sha256": str, "dtype": str, "shape": [int]}


# ----------------------------------------------------------------------------------------------
# recorder


class _Noted:
    """`with _Noted(report, where):` an Exception raised in the block goes to report(where), which
    reads it from sys.exc_info(), and no further.  (A class, not contextlib.contextmanager: a
    generator's frame would stand in the traceback the audit file keeps.)"""

    def __init__(self, report: Callable[[str], None], where: str) -> None:
        self.report, self.where = report, where

    def __enter__(self) -> None:
        pass

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        if isinstance(value, Exception):
            self.report(self.where)
        return isinstance(value, Exception)


def _plain(torch: Any, value: Any) -> bool:
    """A plain tensor: torch.Tensor or nn.Parameter itself, not a subclass such as ShardedTensor
    or DTensor (a shard's bytes differ by rank by design)."""
    return type(value) in (torch.Tensor, torch.nn.Parameter)


def digest(torch: Any, tensor: Any) -> Digest:
    """sha256 of the tensor's bytes in row-major order, with its dtype and shape."""
    t = tensor.detach()
    shape = [int(s) for s in t.shape]
    out: Digest = {"dtype": str(t.dtype).replace("torch.", ""), "shape": shape}
    if t.device.type == "meta":
        out["sha256"] = "meta"
        return out
    if t.layout != torch.strided:
        t = t.to_dense()
    if t.device.type != "cpu":
        t = t.cpu()
    for resolve in ("resolve_conj", "resolve_neg"):
        if hasattr(t, resolve):
            t = getattr(t, resolve)()
    t = t.contiguous()
    h = hashlib.sha256()
    nbytes = int(t.numel()) * int(t.element_size())
    if nbytes:
        h.update((ctypes.c_char * nbytes).from_address(int(t.data_ptr())))
    out["sha256"] = h.hexdigest()
    return out


class Recorder:
    """One process's audit: the DMPs and optimizers seen, the phases recorded, the file."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self.lock = threading.RLock()
        self.local = threading.local()
        self.dmps: List["weakref.ReferenceType[Any]"] = []
        self.optimizers: List["weakref.ReferenceType[Any]"] = []
        self.phases: List[Dict[str, Any]] = []
        self.errors: List[str] = []
        self.hooks: List[str] = []
        self.versions: Dict[str, str] = {}
        self.steps = 0
        self.pending_backward: Set[int] = set()
        self.status = "running"
        self.exception: Optional[str] = None
        self.active = False
        self.keyed_base: Any = None

    # -- bookkeeping --------------------------------------------------------------------------

    def error(self, where: str) -> None:
        """Note the exception being handled; never raises."""
        with contextlib.suppress(Exception):
            text = "%s: %s" % (where, traceback.format_exc(limit=8).rstrip())
            with self.lock:
                self.errors.append(text)
            self.write()

    def depth(self) -> int:
        return int(getattr(self.local, "depth", 0))

    def rank(self) -> Tuple[int, Optional[int]]:
        rank = os.environ.get("RANK")
        world = os.environ.get("WORLD_SIZE")
        if rank is None:
            dist = sys.modules.get("torch.distributed")
            with contextlib.suppress(Exception):
                if dist is not None and dist.is_available() and dist.is_initialized():
                    return int(dist.get_rank()), int(dist.get_world_size())
        return 0 if rank is None else int(rank), int(world) if world else None

    def write(self) -> None:
        """The rank's file, atomically; only by the process that installed the audit."""
        if os.getpid() != self.pid or not self.active:
            return
        with self.lock:
            rank, world = self.rank()
            # (Written with sorted keys: the recorder's fields of these names, and the rest.)
            doc = {k: getattr(self, k) for k in ("pid", "status", "exception", "versions", "hooks", "errors", "phases")}
            doc.update(schema=SCHEMA, rank=rank, world_size=world, argv=list(sys.argv))
            path = os.path.join(self.directory, "rank%d.json" % rank)
            os.makedirs(self.directory, exist_ok=True)
            tmp = "%s.tmp.%d" % (path, self.pid)
            with open(tmp, "w") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
            os.replace(tmp, path)

    # -- what a phase digests -----------------------------------------------------------------

    def live(self, refs: List["weakref.ReferenceType[Any]"]) -> List[Any]:
        return [o for o in (r() for r in refs) if o is not None]

    def collect(self) -> Dict[str, Digest]:
        import torch

        tensors: Dict[str, Digest] = {}
        seen: Set[Tuple[int, str]] = set()  # (id(param), state name): optimizer state once
        names: Dict[int, str] = {}  # id(param) -> its name in a DMP
        dmps = self.live(self.dmps)
        with torch.no_grad():
            for i, dmp in enumerate(dmps):
                prefix = "" if i == 0 else "dmp%d/" % i
                with _Noted(self.error, "state_dict of dmp%d" % i):
                    for key, value in dmp.state_dict().items():
                        if _plain(torch, value):
                            tensors[prefix + key] = digest(torch, value)
                with _Noted(self.error, "named_parameters of dmp%d" % i):
                    for key, param in dmp.named_parameters():
                        names.setdefault(id(param), prefix + key)
            for i, dmp in enumerate(dmps):
                label = "fused_optimizer" if i == 0 else "dmp%d.fused_optimizer" % i
                with _Noted(self.error, "state of %s" % label):
                    fused = getattr(dmp, "fused_optimizer", None)
                    if fused is not None:
                        self.optimizer_state(torch, label, fused, names, seen, tensors)
            for k, opt in enumerate(self.live(self.optimizers)):
                with _Noted(self.error, "state of optimizer%d" % k):
                    self.optimizer_state(torch, "optimizer%d" % k, opt, names, seen, tensors)
            for i, dmp in enumerate(dmps):
                with _Noted(self.error, "in-backward optimizers of dmp%d" % i):
                    for param in dmp.parameters():
                        for opt in getattr(param, "_in_backward_optimizers", None) or []:
                            if self.keyed_base is not None and isinstance(opt, self.keyed_base):
                                continue  # fused: its state is the DMP's fused_optimizer's
                            self.optimizer_state(torch, "in_backward", opt, names, seen, tensors, only=param)
        return tensors

    def optimizer_state(self, torch: Any, label: str, opt: Any, names: Dict[int, str],
                        seen: Set[Tuple[int, str]], tensors: Dict[str, Digest], only: Any = None) -> None:
        """The plain tensors of opt.state, named <label>/<param name>/<state name>: a KeyedOptimizer
        names its params; a torch optimizer's are named as the DMP names them."""
        keyed = getattr(opt, "params", None)
        if self.keyed_base is not None and isinstance(opt, self.keyed_base) and keyed is not None:
            pairs = list(keyed.items())
        else:
            pairs = []
            for group in getattr(opt, "param_groups", []):
                for p in group.get("params", []):
                    if only is None or p is only:
                        pairs.append((names.get(id(p), "param%d" % len(pairs)), p))
        state = opt.state
        for key, param in pairs:
            entry = state.get(param) if hasattr(state, "get") else None
            if not isinstance(entry, dict):
                continue
            for sname, value in entry.items():
                if not _plain(torch, value) or (id(param), str(sname)) in seen:
                    continue
                seen.add((id(param), str(sname)))
                tensors["%s/%s/%s" % (label, key, sname)] = digest(torch, value)

    def record(self, phase: str, via: str) -> None:
        """One phase: the digests of every live DMP's replicated tensors, then the file."""
        if os.getpid() != self.pid:
            return
        with _Noted(self.error, "recording phase %s" % phase):
            with self.lock:
                start = time.perf_counter()
                tensors = self.collect()
                self.phases.append({"phase": phase, "via": via, "tensors": tensors,
                                    "seconds": round(time.perf_counter() - start, 6)})
            self.write()

    # -- the events ---------------------------------------------------------------------------

    def on_wrap(self, dmp: Any) -> None:
        with self.lock:
            if any(obj is dmp for obj in self.live(self.dmps)):
                return
            self.dmps.append(weakref.ref(dmp))
            index = len(self.dmps) - 1
        self.patch_keyed_subclasses()
        self.record("wrap" if index == 0 else "wrap:dmp%d" % index, type(dmp).__name__ + ".__init__")

    def on_step(self, opt: Any, via: str, keep: bool = True) -> None:
        """An outermost step returned: a phase (once a DMP exists); keep: digest that optimizer's
        state from now on (not for the per-parameter in-backward ones, found on the params)."""
        with self.lock:
            if keep and not any(o is opt for o in self.live(self.optimizers)):
                with contextlib.suppress(TypeError):
                    self.optimizers.append(weakref.ref(opt))
            if not self.live(self.dmps):
                return
            self.steps += 1
            phase = "step %d" % self.steps
        self.record(phase, via)

    def on_torch_step(self, opt: Any, _args: Any, _kwargs: Any) -> None:
        """torch's global step post hook: a plain torch optimizer stepped."""
        with _Noted(self.error, "torch optimizer step post hook"):
            if self.depth() > 0 or (self.keyed_base is not None and isinstance(opt, self.keyed_base)):
                return  # inside a KeyedOptimizer's step, or one (its own wrapper records)
            import torch

            current = getattr(torch._C, "_current_graph_task_id", None)
            task = -1 if current is None else int(current())
            if task < 0:
                self.on_step(opt, type(opt).__name__ + ".step")
                return
            with self.lock:  # stepped inside backward: once, when that backward ends
                if task in self.pending_backward:
                    return
                self.pending_backward.add(task)

            def done() -> None:
                with self.lock:
                    self.pending_backward.discard(task)
                with _Noted(self.error, "in-backward step"):
                    self.on_step(opt, "end of backward (in-backward %s)" % type(opt).__name__, keep=False)

            torch.autograd.Variable._execution_engine.queue_callback(done)

    def on_exit(self) -> None:
        with _Noted(self.error, "exit"):
            if self.status == "running":
                self.status = "exited"
            if self.live(self.dmps):
                self.record("exit", "atexit")
            else:
                self.write()

    # -- patches ------------------------------------------------------------------------------

    def wrap_step(self, cls: Any) -> None:
        orig = cls.__dict__.get("step")
        if orig is None or getattr(orig, _MARK, False):
            return
        rec = self
        via = cls.__name__ + ".step"

        @functools.wraps(orig)
        def step(opt: Any, *args: Any, **kwargs: Any) -> Any:
            rec.local.depth = rec.depth() + 1
            try:
                result = orig(opt, *args, **kwargs)
            finally:
                rec.local.depth = rec.depth() - 1
            if rec.depth() == 0:
                with _Noted(rec.error, "after %s" % via):
                    rec.on_step(opt, via)
            return result

        setattr(step, _MARK, True)
        cls.step = step
        self.hooks.append("%s.%s.step" % (cls.__module__, cls.__qualname__))

    def patch_keyed_subclasses(self) -> None:
        """KeyedOptimizer and every subclass defined so far that has a step of its own."""
        base = self.keyed_base
        if base is None:
            return
        todo = [base]
        done: Set[int] = set()
        while todo:
            cls = todo.pop()
            if id(cls) in done:
                continue
            done.add(id(cls))
            with _Noted(self.error, "patching %r" % (cls,)):
                self.wrap_step(cls)
            todo.extend(cls.__subclasses__())

    def patch(self, module: Any) -> None:
        """torchrec.distributed.model_parallel has just been imported: the patches."""
        import multiprocessing

        if multiprocessing.parent_process() is not None:
            return  # a worker the script started: not a rank
        self.active = True
        with contextlib.suppress(Exception):
            import importlib.metadata as metadata

            for dist in ("torch", "torchrec", "fbgemm_gpu"):
                with contextlib.suppress(Exception):
                    self.versions[dist] = metadata.version(dist)
        with _Noted(self.error, "patching DistributedModelParallel"):
            dmp_cls = module.DistributedModelParallel
            orig_init = dmp_cls.__init__
            rec = self

            @functools.wraps(orig_init)
            def __init__(dmp: Any, *args: Any, **kwargs: Any) -> None:
                orig_init(dmp, *args, **kwargs)
                with _Noted(rec.error, "after DistributedModelParallel.__init__"):
                    rec.on_wrap(dmp)

            setattr(__init__, _MARK, True)
            dmp_cls.__init__ = __init__
            self.hooks.append(TARGET + ".DistributedModelParallel.__init__")
        with _Noted(self.error, "patching KeyedOptimizer"):
            from torchrec.optim.keyed import KeyedOptimizer

            self.keyed_base = KeyedOptimizer
            self.patch_keyed_subclasses()
        with _Noted(self.error, "registering the torch optimizer step post hook"):
            import torch.optim.optimizer as optimizer

            register = getattr(optimizer, "register_optimizer_step_post_hook", None)
            if register is None:
                self.hooks.append("(torch has no register_optimizer_step_post_hook)")
            else:
                register(self.on_torch_step)
                self.hooks.append("torch.optim.optimizer.register_optimizer_step_post_hook")
        self.write()


_RECORDER: Optional[Recorder] = None


class Finder:
    """A meta path finder that lets the real finders find `name` and runs `then(module)` once the
    module has executed (an instance attribute on that module's own loader).  `failed(where)` is
    told when `then` raises; the import itself never fails for it."""

    def __init__(self, name: str, then: Callable[[Any], None], failed: Callable[[str], None]) -> None:
        self.name = name
        self.then = then
        self.failed = failed

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        exec_module = getattr(loader, "exec_module", None)
        if spec is None or exec_module is None:
            return spec
        finder_self = self

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            with _Noted(finder_self.failed, "after importing " + finder_self.name):
                if finder_self in sys.meta_path:
                    sys.meta_path.remove(finder_self)
                finder_self.then(module)

        with contextlib.suppress(Exception):
            setattr(loader, "exec_module", exec_and_patch)
        return spec


def install_lazy() -> None:
    """From sitecustomize: with DMPCHECK_AUDIT_DIR set, patch when the script imports
    torchrec.distributed.model_parallel.  Imports nothing else now; never raises."""
    global _RECORDER
    directory = os.environ.get(ENV_DIR)
    if not directory or _RECORDER is not None:
        return
    rec = Recorder(os.path.abspath(directory))
    _RECORDER = rec

    def patch(module: Any) -> None:
        try:
            rec.patch(module)
        except Exception:
            rec.active = True
            rec.error("patching")

    def excepthook(kind: Any, value: Any, tb: Any) -> None:
        with contextlib.suppress(Exception):
            rec.status = "raised"
            rec.exception = "".join(traceback.format_exception_only(kind, value)).strip()
        previous(kind, value, tb)

    previous = sys.excepthook
    sys.excepthook = excepthook
    atexit.register(rec.on_exit)
    module = sys.modules.get(TARGET)
    if module is not None:
        patch(module)
    else:
        sys.meta_path.insert(0, Finder(TARGET, patch, rec.error))


if __name__ == "__main__":
    from dmpcheck_torchrec import audit_compare
    sys.exit(audit_compare.main())
