"""One rank of a scenario run on a real TorchRec release.

Started by dmpcheck's launcher under the release environment's interpreter, with torchrun's
variables (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE) and, in place of MASTER_ADDR and
MASTER_PORT, DMPCHECK_RENDEZVOUS_FILE: torch's FileStore in the cell's private directory (no
port anyone could connect to), with GLOO_SOCKET_IFNAME=lo; under torchrun, its env:// rendezvous:

    python -m dmpcheck_torchrec.rank EXCHANGE_DIR

EXCHANGE_DIR (private to the user, made by the launcher) holds spec.json (contract.RunSpec: the
fully resolved run, tables, constraints, optimizers, each rank's seed, where the weights start,
steps) and batches/step<S>_rank<R>.json (contract.Batch: exactly the local batches the reference
DMP trains on).  This rank writes its tensors after init and
after every step under out/rank<R>/ (see dump.py), rank 0 writes out/meta.json (contract.RunMeta: versions,
the plan TorchRec chose, losses), and a rank that fails writes out/rank<R>/error.json before it
exits with status 3.

The model is driven the way TorchRec users drive it (the reporter's script of #1739):
EmbeddingBagCollection on the meta device, Linear layers, loss = mean of the dense output;
TorchRec's own planner under the scenario's constraints; DistributedModelParallel;
apply_optimizer_in_backward for the tables; a KeyedOptimizerWrapper over what is left for the
dense optimizer.  Nothing here imports dmpcheck or the Debian libtorch: the two torches never
share a process.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from typing import List, NoReturn, Optional, Tuple


# contract.SCHEMA_VERSION, for the error written when the contract module cannot be imported
# (tests/test_contract.py holds the two equal).
_SCHEMA_VERSION = 5

# The kinds of failure this program says (contract.FAILURE_KINDS, which it may be unable to import;
# tests/test_contract.py holds these to fixtures/contract/failure_kinds.json's `rank_program`).
_KIND_CONTRACT = "rank_failed"  # the launcher and this program disagree on a document
_KIND_UNSUPPORTED = "unsupported"  # the scenario asks what this release cannot express
_KIND_IMPORT = "import"  # torch, fbgemm or torchrec did not import, or lacks what the code calls
_KIND_TORCHREC = "torchrec"  # the release raised
_KIND_HOOK = "hook"  # the scenario's own hook raised, did not import, or returned what cannot be compared
_KIND_ORACLE = "oracle"  # the release's own unsharded model (global_model's oracle) raised
_KIND_INPUT = "invalid_input"  # the user's input (init.from's weights) does not fit the model


def _fail(out_dir: str, rank: int, kind: str, message: str, tb: str = "") -> None:
    # contract.RankError, read alike from dmpcheck's own ranks.  When the contract module itself
    # cannot be imported (it may be what failed), the same fields are written by hand.
    path = os.path.join(out_dir, f"rank{rank}")
    os.makedirs(path, exist_ok=True)
    try:
        from dmpcheck_torchrec import contract
        contract.save(contract.RankError(kind=kind, message=message, traceback=tb), os.path.join(path, "error.json"))
        return
    except Exception:  # noqa: BLE001 - the launcher shows a document it cannot read as text
        pass
    tmp = os.path.join(path, "error.json.tmp")
    with open(tmp, "w") as f:
        json.dump({"schema_version": _SCHEMA_VERSION, "kind": kind, "message": message, "traceback": tb}, f)
    os.replace(tmp, os.path.join(path, "error.json"))


def main(argv: List[str]) -> int:
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    exchange = argv[1]
    rank = int(os.environ["RANK"])
    # TorchRec and torch warn at length about deprecations and planner heuristics on every run;
    # what matters reaches dmpcheck through the dumps, and real errors still raise.
    import logging
    import warnings
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    out_dir = os.path.join(exchange, "out")
    try:
        t0 = time.perf_counter()
        import torch  # noqa: F401  (timed: the import is most of a cell's cost)
        import torchrec  # noqa: F401
        import_s = time.perf_counter() - t0
        from dmpcheck_torchrec import contract, runner
        spec = contract.load(contract.RunSpec, os.path.join(exchange, "spec.json"))
        runner.run(spec, exchange, out_dir, rank, import_s)
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the rank exits 3
        named = _named(e)
        if named is not None:
            kind, prefix, with_traceback = named
            _fail(out_dir, rank, kind, str(e), traceback.format_exc() if with_traceback else "")
            print(f"dmpcheck_torchrec: rank {rank}: {prefix}{e}", file=sys.stderr, flush=True)
            return 3
        tb = traceback.format_exc()
        kind, message = failure_of(e)
        _fail(out_dir, rank, kind, message, tb)
        sys.stderr.write(tb)
        sys.stderr.flush()
        return 3
    return 0


# What an environment lacks, said by torch or the loader: the code at hand calls an fbgemm operator
# or links a symbol of another fbgemm-gpu or torch than the environment's (a commit newer than the
# release it is visited over).  No TorchRec behaviour: a search takes it as a commit that does not
# import.  (An fbgemm *Python* attribute TorchRec reads, as #3099's, stays the release's error.)
_ENVIRONMENT_LACKS = ("No such operator fbgemm::", "'_OpNamespace' 'fbgemm' object has no attribute",
                      "undefined symbol")
_OURS = os.path.dirname(os.path.abspath(__file__))


def _fbgemm_owner(e: BaseException) -> str:
    """Where an AttributeError was raised on an object of fbgemm_gpu's, that class's module and name:
    the code at hand reads what another fbgemm-gpu has.  Empty otherwise."""
    if not isinstance(e, AttributeError):
        return ""
    obj = getattr(e, "obj", None)  # Python 3.10 and later
    if obj is not None:
        cls = type(obj)
        return f"{cls.__module__}.{cls.__qualname__}" if cls.__module__.startswith("fbgemm_gpu") else ""
    said = str(e)
    if not said.startswith("'") or "' object has no attribute" not in said:
        return ""
    name = said[1:said.index("'", 1)]
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("fbgemm_gpu") and isinstance(getattr(module, name, None), type):
            return f"{module_name}.{name}"
    return ""


def failure_of(e: BaseException) -> Tuple[str, str]:
    """The kind and message of a failure no narrower handler took.  An attribute missing from an
    fbgemm_gpu object stays TorchRec's error (a release paired with the fbgemm-gpu it pins, #3099), and
    says whose it is: a search over commits, where dmpcheck chose the environment, reads that as the
    environment's."""
    text = f"{type(e).__name__}: {e}"
    owner = _fbgemm_owner(e)
    if owner:
        text += f" (an attribute of fbgemm_gpu's {owner}, which this environment's fbgemm-gpu lacks)"
    if any(lacked in str(e) for lacked in _ENVIRONMENT_LACKS):
        return _KIND_IMPORT, f"the environment lacks what this torchrec calls (it needs another fbgemm-gpu or torch): {text}"
    if not isinstance(e, ImportError):
        return _KIND_TORCHREC, text
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith("<")]
    module = e.name or ""
    if frames and os.path.dirname(os.path.abspath(frames[-1].filename)) == _OURS and module.startswith("torchrec."):
        # This program's own import of a name or module TorchRec had at another commit.
        where = f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}"
        return _KIND_IMPORT, f"dmpcheck's rank program ({where}) imports from {module} what this torchrec lacks: {text}"
    if module.startswith("fbgemm_gpu"):  # TorchRec's import of an fbgemm-gpu newer than the environment's
        return _KIND_IMPORT, f"this torchrec imports from {module} what the environment's fbgemm-gpu lacks: {text}"
    return _KIND_IMPORT, text


# The failures this program names itself, each from its module (which may be what failed to import):
# (module, class, kind, the stderr line's prefix, whether the traceback is kept).
_NAMED = (
    ("contract", "ContractError", _KIND_CONTRACT, "", False),  # the launcher and this program disagree on a document
    ("contract", "InputRefused", _KIND_INPUT, "", False),  # the user's own input does not fit the model
    ("hooks", "HookFailed", _KIND_HOOK, "hook: ", True),  # the user's own code, never blamed on the release
    ("oracle", "OracleFailed", _KIND_ORACLE, "", True),  # the sharded run completed; its unsharded oracle did not
    ("runner", "Unsupported", _KIND_UNSUPPORTED, "unsupported: ", False),  # what this release cannot run
)


def _named(e: BaseException) -> Optional[Tuple[str, str, bool]]:
    for module, name, kind, prefix, with_traceback in _NAMED:
        try:
            named = getattr(importlib.import_module("dmpcheck_torchrec." + module), name)
        except Exception:  # noqa: BLE001 - that module failed to import: handled as any failure
            continue
        if isinstance(e, named):
            return kind, prefix, with_traceback
    return None


def _exit(code: int) -> NoReturn:
    # Everything this rank hands back is already on disk (written atomically).  Leave without
    # running interpreter and static teardown: with torch 2.14 a rank aborted there now and then
    # ("terminate called without an active exception", SIGABRT after its last step was written),
    # 1 run in 3 of unfiled-dense-not-broadcast on 1.9.2 here.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main(sys.argv))
