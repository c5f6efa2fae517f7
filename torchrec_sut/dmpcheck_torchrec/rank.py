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

import json
import os
import sys
import time
import traceback
from typing import List, NoReturn, Tuple, Type, Union


# contract.SCHEMA_VERSION, for the error written when the contract module cannot be imported
# (tests/test_contract.py holds the two equal).
_SCHEMA_VERSION = 5

# The kinds of failure this program says (contract.FAILURE_KINDS, which it may be unable to import;
# tests/test_contract.py holds these to fixtures/contract/failure_kinds.json's `rank_program`).
_KIND_CONTRACT = "rank_failed"  # the launcher and this program disagree on a document
_KIND_UNSUPPORTED = "unsupported"  # the scenario asks what this release cannot express
_KIND_IMPORT = "import"  # torch, fbgemm or torchrec did not import
_KIND_TORCHREC = "torchrec"  # the release raised
_KIND_HOOK = "hook"  # the scenario's own hook raised, did not import, or returned what cannot be compared
_KIND_ORACLE = "oracle"  # the release's own unsharded model (global_model's oracle) raised


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
    except contract_error() as e:  # the launcher and this program disagree on a document
        _fail(out_dir, rank, _KIND_CONTRACT, str(e))
        print(f"dmpcheck_torchrec: rank {rank}: {e}", file=sys.stderr, flush=True)
        return 3
    except hook_failed() as e:  # the user's own code, never blamed on the release
        _fail(out_dir, rank, _KIND_HOOK, str(e), traceback.format_exc())
        print(f"dmpcheck_torchrec: rank {rank}: hook: {e}", file=sys.stderr, flush=True)
        return 3
    except oracle_failed() as e:  # the sharded run completed; its unsharded oracle did not
        _fail(out_dir, rank, _KIND_ORACLE, str(e), traceback.format_exc())
        print(f"dmpcheck_torchrec: rank {rank}: {e}", file=sys.stderr, flush=True)
        return 3
    except runner_unsupported() as e:  # a scenario this release cannot run: said plainly
        _fail(out_dir, rank, _KIND_UNSUPPORTED, str(e))
        print(f"dmpcheck_torchrec: rank {rank}: unsupported: {e}", file=sys.stderr, flush=True)
        return 3
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the rank exits 3
        tb = traceback.format_exc()
        kind = _KIND_IMPORT if isinstance(e, ImportError) else _KIND_TORCHREC
        _fail(out_dir, rank, kind, f"{type(e).__name__}: {e}", tb)
        sys.stderr.write(tb)
        sys.stderr.flush()
        return 3
    return 0


def contract_error() -> Union[Type[Exception], Tuple[()]]:
    try:
        from dmpcheck_torchrec.contract import ContractError
        return ContractError
    except Exception:  # noqa: BLE001 - handled as any failure
        return ()


def hook_failed() -> Union[Type[Exception], Tuple[()]]:
    try:
        from dmpcheck_torchrec.hooks import HookFailed
        return HookFailed
    except Exception:  # noqa: BLE001 - handled as any failure
        return ()


def oracle_failed() -> Union[Type[Exception], Tuple[()]]:
    try:
        from dmpcheck_torchrec.oracle import OracleFailed
        return OracleFailed
    except Exception:  # noqa: BLE001 - the oracle itself failed to import: handled as any failure
        return ()


def runner_unsupported() -> Union[Type[Exception], Tuple[()]]:
    try:
        from dmpcheck_torchrec.runner import Unsupported
        return Unsupported
    except Exception:  # noqa: BLE001 - the runner itself failed to import: handled as any failure
        return ()


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
