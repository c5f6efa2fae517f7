"""Boot of dmpcheck's script-cell audit: put this directory first on PYTHONPATH (and the directory
holding dmpcheck_torchrec after it) and set DMPCHECK_AUDIT_DIR; Python imports this module at
start-up.  It

1. runs the sitecustomize this one shadows (Debian's python3.11 has /etc/python3.11/sitecustomize.py,
   which the release venvs load), as site.py would have, and
2. with DMPCHECK_AUDIT_DIR set, calls dmpcheck_torchrec.audit.install_lazy(), which imports nothing
   now and patches only when the script imports torchrec.distributed.model_parallel.

Nothing here raises into the script: a failure of the chained sitecustomize is printed the way
site.py prints one; a failure to install the audit goes to the rank's file in DMPCHECK_AUDIT_DIR.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain() -> None:
    import importlib.machinery
    import importlib.util

    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None or not spec.origin:
        return
    if os.path.realpath(spec.origin) == os.path.realpath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_dmpcheck_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _install() -> None:
    try:
        from dmpcheck_torchrec import audit
    except Exception:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_dmpcheck_audit", os.path.join(os.path.dirname(_HERE), "audit.py"))
        if spec is None or spec.loader is None:
            raise
        audit = importlib.util.module_from_spec(spec)
        sys.modules["_dmpcheck_audit"] = audit
        spec.loader.exec_module(audit)
    audit.install_lazy()


def _report_failure() -> None:
    """The audit could not be installed: say so in this rank's file (only a torchrun rank has one)."""
    try:
        import json
        import traceback

        rank = os.environ.get("RANK")
        directory = os.environ.get("DMPCHECK_AUDIT_DIR")
        if rank is None or not directory:
            return
        world = os.environ.get("WORLD_SIZE")
        path = os.path.join(directory, "rank%d.json" % int(rank))
        doc = {"schema": "dmpcheck-audit/1", "rank": int(rank), "world_size": int(world) if world else None,
               "pid": os.getpid(), "argv": [], "status": "audit not installed", "exception": None,
               "versions": {}, "hooks": [], "phases": [],
               "errors": ["installing the audit: " + traceback.format_exc(limit=8).rstrip()]}
        os.makedirs(directory, exist_ok=True)
        with open(path + ".tmp.%d" % os.getpid(), "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(path + ".tmp.%d" % os.getpid(), path)
    except Exception:
        pass


try:
    _chain()
except Exception as _e:
    print("Error in sitecustomize; set PYTHONVERBOSE for traceback:\n%s: %s" % (type(_e).__name__, _e), file=sys.stderr)

if os.environ.get("DMPCHECK_AUDIT_DIR"):
    try:
        _install()
    except Exception:
        _report_failure()

if os.environ.get("DMPCHECK_RENDEZVOUS_FILE"):
    try:
        from dmpcheck_torchrec import script_rendezvous

        script_rendezvous.install_lazy()
    except Exception as _e:
        print("dmpcheck: the env:// rendezvous could not be installed: %s: %s" % (type(_e).__name__, _e),
              file=sys.stderr)
