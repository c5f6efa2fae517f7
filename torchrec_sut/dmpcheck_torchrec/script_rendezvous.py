"""Script cells, the rendezvous: torch's env:// rendezvous (the one `init_process_group()` uses by
default, and torchrun's) as a FileStore at DMPCHECK_RENDEZVOUS_FILE, in the cell's private
directory, where torch would open a TCPStore on MASTER_PORT listening on every interface.

Installed from audit_boot's sitecustomize before the script runs; it imports nothing then and
replaces the handler once the script's `import torch` has imported torch.distributed.rendezvous.
RANK and WORLD_SIZE are read as torch reads them (the URL's query first, then the environment).  A
script that names its own store or a tcp:// init_method gets what it names.
"""
from __future__ import annotations

import os
import sys
import traceback
from datetime import timedelta
from typing import Any, Iterator, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from dmpcheck_torchrec.audit import Finder

ENV_FILE = "DMPCHECK_RENDEZVOUS_FILE"
MODULE = "torch.distributed.rendezvous"


def _number(url: str, name: str) -> int:
    query = parse_qs(urlparse(url).query)
    if name.lower() in query:
        return int(query[name.lower()][0])
    value = os.environ.get(name)
    if value is None:
        raise ValueError("env:// rendezvous: %s is neither in the URL nor in the environment" % name)
    return int(value)


def _handler(path: str) -> Any:
    def file_rendezvous(url: str, timeout: Optional[timedelta] = None, **_kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
        import torch.distributed as dist

        rank = _number(url, "RANK")
        world_size = _number(url, "WORLD_SIZE")
        store = dist.FileStore(path, world_size)
        if timeout is not None:
            store.set_timeout(timeout)
        yield (store, rank, world_size)
        raise RuntimeError("env:// rendezvous: the store was asked for twice")

    return file_rendezvous


def _replace(module: Any) -> None:
    path = os.environ[ENV_FILE]
    handlers = getattr(module, "_rendezvous_handlers")
    handlers["env"] = _handler(path)


def _said(where: str) -> None:
    print("dmpcheck: the env:// rendezvous was not replaced (%s): %s" % (where, traceback.format_exc(limit=4)),
          file=sys.stderr)


def install_lazy() -> None:
    """With DMPCHECK_RENDEZVOUS_FILE set: replace the env:// handler now or once torch imports it."""
    if not os.environ.get(ENV_FILE):
        return
    module = sys.modules.get(MODULE)
    if module is not None:
        _replace(module)
    else:
        sys.meta_path.insert(0, Finder(MODULE, _replace, _said))
