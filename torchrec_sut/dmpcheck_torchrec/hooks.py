"""Hooks: a scenario's own Python, called at fixed points of a release cell (`torchrec: {hooks: FILE}`).

A hook file defines functions named `hook_<point>(ctx)`; the points are

    hook_build_model   after dmpcheck built the scenario's unsharded model (ctx.model, on ctx.device:
                       "meta" as TorchRec users build large models, "cpu" where weights load before
                       the wrap), before the planner sees it: a hook may replace a module of it or
                       the whole model (a FusedEBC, a FeatureProcessedEBC around ctx.model.ebc, an
                       MC module with any argument, the user's own) and add what shards it to
                       ctx.sharders.  The unsharded oracle calls it too, with ctx.unsharded True,
                       so it trains the same modules
    hook_after_wrap    after DistributedModelParallel wrapped the model (and the start's weights are
                       in it), before the optimizers exist: a hook may change the model in place
                       (cast it, reshard it) or set ctx.model to what trains instead (a compiled one)
    hook_batch         as the loop takes each step's batch (ctx.step: the step it is for; a
                       pipeline takes it ahead of the step): ctx.batch is the rank's KeyedJaggedTensor
                       as dmpcheck made it, and what the hook leaves in ctx.batch is what trains
                       (a variable-batch one built from it, a plain one after a variable one, ...).
                       The unsharded oracle calls it for each step with the global batch (every
                       rank's bags in rank order, ctx.unsharded True): leave there the same data
                       as one batch, so both train alike
    hook_before_step   before each training step (ctx.step: the step about to run, from 1)
    hook_after_step    after each training step (ctx.step: the step just run)
    hook_at_end        after the last step

A hook may return a dict of named values (tensors, numbers, strings, booleans): every rank's are
recorded (a tensor by its digest, dtype and shape) and handed back in meta.json; dmpcheck compares
them across ranks, with the unsharded oracle's same hook at the same step (its values are recorded
as rank UNSHARDED, -1), and against `expect: observed` (the ranks' values).  Other functions of the file are the user's own.
A hook that raises, or returns what cannot be compared, is the cell's error naming the hook (kind
`hook`), never TorchRec's.

`python -m dmpcheck_torchrec.hooks check FILE` (no torch needed) says, before any rank starts, what
is wrong with a hook file: a syntax error, a hook_ function of a point that does not exist, a hook
that does not take one argument; each with FILE:LINE.  Exit 0, or 2 with one line per error.
"""
from __future__ import annotations

import ast
import difflib
import hashlib
import importlib.util
import os
import signal
import sys
import threading
import traceback
from types import FrameType, TracebackType
from typing import Any, Callable, Dict, List, NoReturn, Optional, Sequence, Type

UNSHARDED = -1  # the rank an unsharded oracle's hook value is recorded under (contract.Observation)
POINTS = ("build_model", "after_wrap", "batch", "before_step", "after_step", "at_end")
PREFIX = "hook_"


class HookFailed(Exception):
    """A hook raised, did not import, or returned what cannot be compared."""


def check(path: str) -> List[str]:
    """What is wrong with the hook file at `path`, one "FILE:LINE: ..." line each."""
    try:
        with open(path) as f:
            source = f.read()
    except OSError as e:
        return ["%s: cannot read the hook file: %s" % (path, e.strerror)]
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as e:
        return ["%s:%s: not Python: %s" % (path, e.lineno, e.msg)]
    errors: List[str] = []
    found = 0
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.name.startswith(PREFIX):
            continue
        point = node.name[len(PREFIX):]
        if point not in POINTS:
            near = difflib.get_close_matches(point, POINTS, n=1)
            errors.append("%s:%d: %s is not a hook dmpcheck calls%s; the hooks are %s" % (
                path, node.lineno, node.name, " (did you mean %s%s?)" % (PREFIX, near[0]) if near else "",
                ", ".join(PREFIX + p for p in POINTS)))
            continue
        found += 1
        args = node.args
        positional = len(args.posonlyargs) + len(args.args)
        if isinstance(node, ast.AsyncFunctionDef) or positional != 1 or args.vararg or args.kwonlyargs:
            errors.append("%s:%d: %s must be a plain function of one argument, the hook's context (ctx)"
                          % (path, node.lineno, node.name))
    if not errors and found == 0:
        errors.append("%s:1: defines no hook (functions named %s)" % (path, ", ".join(PREFIX + p for p in POINTS)))
    return errors


class Context:
    """What a hook sees: the rank, the world, the step, the model (settable in build_model and
    after_wrap), the optimizer (None up to after_wrap, before it exists; after_step runs after its
    step and zero_grad), the scenario's tables (name -> rows, dim, features), in build_model the
    device the model is built on and the sharders DistributedModelParallel will be given (a list
    the hook may add to), in batch the step's batch, and whether this is the unsharded oracle's
    call."""

    def __init__(self, rank: int, world_size: int, tables: Dict[str, Dict[str, Any]]) -> None:
        self.rank = rank
        self.world_size = world_size
        self.tables = tables
        self.step = 0
        self.model: Any = None
        self.optimizer: Any = None
        self.device = "meta"
        self.sharders: List[Any] = []
        self.unsharded = False
        self.batch: Any = None


def _encode(name: str, value: Any, where: str) -> Dict[str, str]:
    import torch

    if isinstance(value, bool):
        return {"kind": "bool", "value": "true" if value else "false"}
    if isinstance(value, (int, float)):
        return {"kind": "number", "value": repr(value)}
    if isinstance(value, str):
        return {"kind": "string", "value": value}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: its bytes, as int16
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        return {"kind": "tensor",
                "value": "%s %s%s" % (hashlib.sha256(raw).hexdigest()[:16], str(t.dtype).replace("torch.", ""),
                                      list(t.shape))}
    raise HookFailed("%s returned %s = %r (%s): a hook returns tensors, numbers, strings or booleans"
                     % (where, name, value, type(value).__name__))


def _where_stopped(frame: Optional[FrameType]) -> str:
    """The innermost frames of a stack, innermost first, on one line."""
    frames = traceback.extract_stack(frame)[-3:] if frame is not None else []
    return " <- ".join("%s:%d in %s" % (os.path.basename(f.filename), f.lineno or 0, f.name) for f in reversed(frames))


class _Contained:
    """The user's code, run inside: bounded by timeout_s (SIGALRM, on the main thread; the hang is
    named with the frames it hung in), its os._exit refused, and its sys.exit, like any exception
    it raises, the hook's failure (`what` names it)."""

    def __init__(self, what: str, timeout_s: float) -> None:
        self.what = what
        self.timeout_s = timeout_s
        self._exit: Callable[[int], NoReturn] = os._exit
        self._alarm: Any = None

    def __enter__(self) -> "_Contained":
        what = self.what

        def refused(status: int) -> NoReturn:
            raise HookFailed("%s called os._exit(%d): a hook may not end the rank" % (what, status))

        setattr(os, "_exit", refused)
        if self.timeout_s > 0 and threading.current_thread() is threading.main_thread():
            timeout_s = self.timeout_s

            def expired(_signum: int, frame: Optional[FrameType]) -> None:
                raise HookFailed("%s still running after timeout_s = %g s, in %s"
                                 % (what, timeout_s, _where_stopped(frame) or "(no Python frame)"))

            self._alarm = signal.signal(signal.SIGALRM, expired)
            signal.setitimer(signal.ITIMER_REAL, timeout_s)
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], value: Optional[BaseException],
                 tb: Optional[TracebackType]) -> None:
        if self._alarm is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._alarm)
        setattr(os, "_exit", self._exit)
        if value is None or isinstance(value, (HookFailed, KeyboardInterrupt)):
            return
        if isinstance(value, SystemExit):
            raise HookFailed("%s called sys.exit(%r): a hook may not end the rank" % (self.what, value.code)) from value
        raise HookFailed("%s raised %s: %s" % (self.what, type(value).__name__, value)) from value


class Hooks:
    """The hook file, imported once per rank, and what its hooks returned (`observed`).  Its import
    and every call run under the cell's timeout_s (0: unbounded)."""

    def __init__(self, path: str, rank: int, timeout_s: float = 0.0) -> None:
        self.path = path
        self.rank = rank
        self.timeout_s = timeout_s
        self.observed: List[Dict[str, Any]] = []
        spec = importlib.util.spec_from_file_location("dmpcheck_user_hooks", path)
        if spec is None or spec.loader is None:
            raise HookFailed("the hook file %s did not import: not a Python file" % path)
        module = importlib.util.module_from_spec(spec)
        sys.modules["dmpcheck_user_hooks"] = module
        with _Contained("the hook file %s (its import)" % path, timeout_s):
            spec.loader.exec_module(module)
        self.module = module

    def has(self, point: str) -> bool:
        return callable(getattr(self.module, PREFIX + point, None))

    def call(self, point: str, ctx: Context) -> None:
        fn = getattr(self.module, PREFIX + point, None)
        if not callable(fn):
            return
        where = "%s%s (%s)" % (PREFIX, point, self.path)
        with _Contained(where, self.timeout_s):
            returned = fn(ctx)
        if point in ("build_model", "after_wrap"):
            import torch

            if not isinstance(ctx.model, torch.nn.Module):
                raise HookFailed("%s left ctx.model = %s; it must be a torch.nn.Module"
                                 % (where, type(ctx.model).__name__))
        if returned is None:
            return
        if not isinstance(returned, dict):
            raise HookFailed("%s returned a %s; a hook returns None or a dict of named values"
                             % (where, type(returned).__name__))
        for name, value in returned.items():
            if not isinstance(name, str) or not name:
                raise HookFailed("%s returned a value named %r; names are non-empty strings" % (where, name))
            # The oracle's values (ctx.unsharded) are shown beside the ranks' as rank UNSHARDED.
            self.observed.append({"rank": UNSHARDED if ctx.unsharded else self.rank, "point": point, "step": ctx.step,
                                  "name": name, **_encode(name, value, where)})


def batch(user: Optional[Hooks], ctx: Context, step: int, kjt: Any, where: str = "") -> Any:
    """The batch of `step`: `kjt`, or what hook_batch left in ctx.batch, if the model can take it."""
    if user is None or not user.has("batch"):
        return kjt
    ctx.step, ctx.batch = step, kjt
    user.call("batch", ctx)
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    if not isinstance(ctx.batch, KeyedJaggedTensor):
        raise HookFailed("hook_batch (%s)%s left ctx.batch = %s at step %d; it must be a KeyedJaggedTensor"
                         % (user.path, where, type(ctx.batch).__name__, ctx.step))
    return ctx.batch


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "check":
        print("usage: python -m dmpcheck_torchrec.hooks check FILE", file=sys.stderr)
        return 2
    errors = check(args[1])
    for e in errors:
        print(e)
    return 2 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
