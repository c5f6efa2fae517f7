"""A warm interpreter: a release's torch, fbgemm_gpu and torchrec imported once, ranks forked from it.

Started by dmpcheck (harness/run/warm_interpreter.cc) under an environment's Python, with
OMP_NUM_THREADS=1 so that importing torch starts no OpenMP thread:

    python -m dmpcheck_torchrec.warm FD [MODULE ...]

MODULE: what to import before serving (the rank program's stack).  FD: a SOCK_SEQPACKET unix
socket to dmpcheck; one contract document per packet (contract.py's WarmSpawn and WarmMessage,
read strictly on both sides):

  -> WarmMessage kind "ready" (import_s, threads 1)         or kind "not_ready" (why)
  <- WarmSpawn (argv ["-m", MODULE, ARG ...], env ["NAME=value" ...], cwd, threads, group)
     with one file descriptor attached: the rank's stdout and stderr
  -> WarmMessage kind "pid" (pid)                           or kind "refused" (why)
  -> WarmMessage kind "exit" (pid, status: the raw wait status)   whenever a rank ends

A rank is a fork of this process that becomes what `python -m MODULE ARG ...` would have been: its
environment replaced by `env` (the launcher's, as an exec-ed rank would get it), intra-op threads
set to N, in process group PGID (0: a group of its own), killed if this interpreter dies.  When the
socket closes (dmpcheck ended, however it ended), every rank's group is killed and this exits.

Forking is refused, and dmpcheck falls back to exec-ed ranks, if this process has more than one
thread: a fork copies only the calling thread, and a lock another thread held would stay held.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import sys
import time
from typing import Dict, List, NoReturn

from dmpcheck_torchrec import contract

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_MAX_PACKET = 1 << 20


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _send(sock: socket.socket, message: contract.WarmMessage) -> None:
    sock.send(json.dumps(contract.to_dict(message)).encode())


def _become_rank(sock: socket.socket, request: contract.WarmSpawn, out_fd: int, parent: int) -> NoReturn:
    """In the fork: set up as an exec-ed rank would be, run the module, never return."""
    code = 3
    try:
        sock.close()
        os.setpgid(0, request.group)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the interpreter died before prctl
            os._exit(127)
        # Its command line is the interpreter's: the name says which rank it is (ps, pgrep -x).
        env = dict(entry.split("=", 1) for entry in request.env if "=" in entry)
        libc.prctl(_PR_SET_NAME, ctypes.c_char_p(f"dmpcheck-r{env.get('RANK', '')}".encode()), 0, 0, 0)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request.cwd)
        # A rank's PYTHONPATH that this interpreter did not start with (a TorchRec commit's source
        # over an interpreter that imported torch and fbgemm_gpu but no TorchRec) goes first on its
        # path, as it would in a fresh interpreter.
        for entry in reversed([e for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        # What differs from a fresh process: the random state Python drew at start-up.
        import random
        random.seed()
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(request.threads)
        argv = request.argv
        if len(argv) < 2 or argv[0] != "-m":
            raise ValueError(f"a warm rank runs `-m MODULE ...`, not {argv}")
        import runpy
        sys.argv = [argv[1]] + list(argv[2:])
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as `python -m` would: the traceback, then status 1
        import traceback
        traceback.print_exc()
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve(sock: socket.socket) -> None:
    parent = os.getpid()
    children: Dict[int, int] = {}  # pid -> process group
    try:
        while True:
            # Every ended rank is reported first, then one request is served (or 20 ms pass).
            while children:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                children.pop(pid, None)
                _send(sock, contract.WarmMessage(kind="exit", pid=pid, status=status))
            readable, _, _ = select.select([sock], [], [], 0.02)
            if not readable:
                continue
            # socket.recv_fds is Python 3.9's: under 3.8 the first request ends this interpreter
            # (AttributeError), the one place the package needs more than 3.8.
            data, fds, _, _ = socket.recv_fds(sock, _MAX_PACKET, 4)  # type: ignore[attr-defined]
            if not data:
                return  # dmpcheck closed its end, or is gone
            refused = ""
            try:
                request = contract.parse(contract.WarmSpawn, json.loads(data), "a spawn request")
            except (ValueError, contract.ContractError) as e:  # not JSON, or not a WarmSpawn
                refused = str(e)
            if not refused and len(fds) != 1:
                refused = f"a spawn request carries one descriptor, not {len(fds)}"
            if not refused and _threads() != 1:
                refused = f"this interpreter has {_threads()} threads: forking it is unsafe"
            if refused:
                for fd in fds:
                    os.close(fd)
                _send(sock, contract.WarmMessage(kind="refused", why=refused))
                continue
            pid = os.fork()
            if pid == 0:
                _become_rank(sock, request, fds[0], parent)
            os.close(fds[0])
            group = request.group or pid
            # Also here: no race with a kill of the group.  (OSError: the child already exec-ed its
            # way out or ended: its own call decided.)
            with contextlib.suppress(OSError):
                os.setpgid(pid, group)
            children[pid] = group
            _send(sock, contract.WarmMessage(kind="pid", pid=pid))
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        for group in set(children.values()):
            with contextlib.suppress(OSError):
                os.killpg(group, signal.SIGKILL)
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def main(argv: List[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    sock = socket.socket(fileno=int(argv[1]))
    # Ctrl-C at a terminal is dmpcheck's to handle: it stops the ranks and closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    start = time.perf_counter()
    try:
        import importlib
        import logging
        import warnings
        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        for module in argv[2:]:
            importlib.import_module(module)
    except BaseException as e:  # noqa: BLE001 - said to dmpcheck, which runs the ranks cold instead
        _send(sock, contract.WarmMessage(kind="not_ready", why=f"import {module} failed: {type(e).__name__}: {e}"))
        return 1
    # The rank sets these itself (rank.py); here they were only for the import.
    logging.disable(logging.NOTSET)
    threads = _threads()
    if threads != 1:
        _send(sock, contract.WarmMessage(kind="not_ready", why=f"after importing {' '.join(argv[2:])} this "
                                                                f"interpreter has {threads} threads: forking it is unsafe"))
        return 1
    _send(sock, contract.WarmMessage(kind="ready", import_s=time.perf_counter() - start, threads=threads))
    serve(sock)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
