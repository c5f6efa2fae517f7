"""A scenario for a test, made from a file in the tree (or a test's own YAML) by key.

A test that runs a variant of fidelity/sharding.yaml names what it changes by key (a tuple of
mapping keys and list indices, so the matrix's dotted axes stay one key) instead of replacing text:
a key the file no longer has is an error here, where a `str.replace` that matches nothing passed
silently and the test ran the file's own matrix.
"""
import os
from typing import Any, Dict, Iterable, Optional, Tuple, Union

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
Key = Tuple[Union[str, int], ...]


def _load(source: str) -> Any:
    if "\n" in source:  # a test's own YAML
        return yaml.safe_load(source)
    with open(os.path.join(ROOT, source)) as f:
        return yaml.safe_load(f)


def _parent(document: Any, key: Key, source: str, create: bool) -> Any:
    node = document
    for i, part in enumerate(key[:-1]):
        if isinstance(node, dict) and part not in node and create:
            node[part] = {}
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{source}: no {'.'.join(map(str, key[:i + 1]))} (setting {key})") from None
    return node


def with_keys(path: "os.PathLike[str]", source: str, values: Optional[Dict[Key, Any]] = None,
              add: Optional[Dict[Key, Any]] = None, drop: Iterable[Key] = ()) -> "os.PathLike[str]":
    """Writes to `path` the scenario `source` (a path under the repository, or YAML text) with each
    key in `values` (which it must have) and in `add` (which it must not have) given its value, and each
    key in `drop` (which it must have) removed.  Returns `path`."""
    document = _load(source)
    name = source if "\n" not in source else "the test's scenario"
    for key, value in (values or {}).items():
        parent = _parent(document, key, name, create=False)
        if isinstance(parent, dict) and key[-1] not in parent:
            raise KeyError(f"{name}: no {'.'.join(map(str, key))} to set")
        parent[key[-1]] = value
    for key, value in (add or {}).items():
        parent = _parent(document, key, name, create=True)
        if isinstance(parent, dict) and key[-1] in parent:
            raise KeyError(f"{name}: {'.'.join(map(str, key))} is already there (set it instead)")
        if isinstance(parent, list):
            parent.insert(int(key[-1]), value)
        else:
            parent[key[-1]] = value
    for key in drop:
        parent = _parent(document, key, name, create=False)
        try:
            del parent[key[-1]]
        except (KeyError, IndexError, TypeError):
            raise KeyError(f"{name}: no {'.'.join(map(str, key))} to drop") from None
    with open(path, "w") as f:
        yaml.safe_dump(document, f, sort_keys=False, default_flow_style=None, width=200)
    return path


def table_index(source: str, name: str) -> int:
    """Where the table `name` is in `source`'s tables (for a key such as ("tables", i, "sharding"))."""
    tables = _load(source)["tables"]
    for i, table in enumerate(tables):
        if table["name"] == name:
            return i
    raise KeyError(f"{source}: no table {name}")
