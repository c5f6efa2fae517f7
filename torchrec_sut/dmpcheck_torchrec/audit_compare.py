"""Script cells, the audit's comparer: every rank's file that audit.py wrote, compared.

`python -m dmpcheck_torchrec.audit compare DIR` (or `-m dmpcheck_torchrec.audit_compare compare DIR`) reads every rank's file and prints, per
phase, the tensors equal on every rank and those that diverge.  Exit 0: all equal; 1: some diverge;
2: bad or missing input.  It needs no torch.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Dict, List, Optional, Sequence, Set

from dmpcheck_torchrec.audit import SCHEMA


class BadInput(Exception):
    pass


def _load(path: str) -> Dict[str, Any]:
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise BadInput("cannot read audit file %s: %s" % (path, e))
    except ValueError as e:
        raise BadInput("malformed audit file %s: not JSON (%s)" % (path, e))
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise BadInput("malformed audit file %s: not a %s document" % (path, SCHEMA))
    phases = doc.get("phases")
    if not isinstance(doc.get("rank"), int) or not isinstance(phases, list):
        raise BadInput("malformed audit file %s: no integer rank or no phases list" % path)
    world = doc.get("world_size")
    if world is not None and not isinstance(world, int):
        raise BadInput("malformed audit file %s: world_size %r" % (path, world))
    for ph in phases:
        if not isinstance(ph, dict) or not isinstance(ph.get("phase"), str) or not isinstance(ph.get("tensors"), dict):
            raise BadInput("malformed audit file %s: a phase without a name or tensors" % path)
        for name, d in ph["tensors"].items():
            if not isinstance(d, dict) or not isinstance(d.get("sha256"), str) \
                    or not isinstance(d.get("dtype"), str) or not isinstance(d.get("shape"), list):
                raise BadInput("malformed audit file %s: tensor %s in phase %s" % (path, name, ph["phase"]))
    return doc


def load_dir(directory: str) -> Dict[int, Dict[str, Any]]:
    """Every rank's file in directory, checked: rank<R>.json for R in 0..world_size-1."""
    if not os.path.isdir(directory):
        raise BadInput("no audit directory %s" % directory)
    docs: Dict[int, Dict[str, Any]] = {}
    for name in sorted(os.listdir(directory)):
        m = re.match(r"rank(\d+)\.json$", name)
        if not m:
            continue
        path = os.path.join(directory, name)
        doc = _load(path)
        if doc["rank"] != int(m.group(1)):
            raise BadInput("malformed audit file %s: it says rank %d" % (path, doc["rank"]))
        docs[doc["rank"]] = doc
    if not docs:
        raise BadInput("no audit files (rank<R>.json) in %s" % directory)
    worlds: Set[int] = {d["world_size"] for d in docs.values() if d.get("world_size") is not None}
    if len(worlds) > 1:
        raise BadInput("audit files in %s disagree on world_size: %s" % (directory, sorted(worlds)))
    world = worlds.pop() if worlds else max(docs) + 1
    for r in range(world):
        if r not in docs:
            raise BadInput("missing audit file %s (world_size %d)" % (os.path.join(directory, "rank%d.json" % r), world))
    extra = sorted(r for r in docs if r >= world)
    if extra:
        raise BadInput("audit file %s: rank beyond world_size %d" % (os.path.join(directory, "rank%d.json" % extra[0]), world))
    return docs


def compare(docs: Dict[int, Dict[str, Any]]) -> Dict[str, Any]:
    """Per phase (in the order recorded): the tensors equal on every rank, those that diverge
    (with each rank's digest, None where a rank lacks it), and the ranks lacking the phase."""
    ranks = sorted(docs)
    by_rank: Dict[int, Dict[str, Dict[str, Any]]] = {r: {} for r in ranks}
    for r in ranks:
        for ph in docs[r]["phases"]:
            by_rank[r].setdefault(ph["phase"], ph)  # a phase recorded twice: its first
    order = list(dict.fromkeys(ph["phase"] for r in ranks for ph in docs[r]["phases"]))
    phases: List[Dict[str, Any]] = []
    for name in order:
        present = [r for r in ranks if name in by_rank[r]]
        missing = [r for r in ranks if name not in by_rank[r]]
        names = list(dict.fromkeys(t for r in present for t in by_rank[r][name]["tensors"]))
        equal: List[str] = []
        diverge: List[Dict[str, Any]] = []
        for t in names:
            seen = [by_rank[r][name]["tensors"].get(t) if r in present else None for r in ranks]
            keys = {None if d is None else (d["sha256"], d["dtype"], tuple(d["shape"])) for d in seen}
            if len(keys) == 1 and None not in keys:
                equal.append(t)
            else:
                diverge.append({"name": t, "ranks": {str(r): d for r, d in zip(ranks, seen)}})
        via = by_rank[present[0]][name].get("via", "")
        phases.append({"phase": name, "via": via, "missing_ranks": missing, "equal": equal, "diverge": diverge})
    diverged = any(p["diverge"] or p["missing_ranks"] for p in phases)
    return {"ranks": ranks, "phases": phases, "diverged": diverged}


def _short(d: Optional[Dict[str, Any]]) -> str:
    if d is None:
        return "absent"
    return "%s %s%s" % (d["sha256"][:12], d["dtype"], list(d["shape"]))


def report(docs: Dict[int, Dict[str, Any]], result: Dict[str, Any], directory: str) -> str:
    lines = ["dmpcheck audit of %s: %d ranks" % (directory, len(result["ranks"]))]
    for r in result["ranks"]:
        doc = docs[r]
        lines.append("rank %d: status %s%s, %d phases%s" % (
            r, doc.get("status"), " (%s)" % doc["exception"] if doc.get("exception") else "",
            len(doc["phases"]), ", %d audit errors" % len(doc.get("errors") or []) if doc.get("errors") else ""))
        for e in doc.get("errors") or []:
            lines.append("  audit error: " + str(e).splitlines()[0])
    for p in result["phases"]:
        lines.append("phase %s (after %s): %d equal, %d diverge" % (p["phase"], p["via"], len(p["equal"]), len(p["diverge"])))
        if p["missing_ranks"]:
            lines.append("  PHASE MISSING on ranks %s" % ", ".join(str(r) for r in p["missing_ranks"]))
        for d in p["diverge"]:
            lines.append("  DIVERGE %s  %s" % (d["name"], "  ".join("rank%s=%s" % (r, _short(x)) for r, x in d["ranks"].items())))
        for t in p["equal"]:
            lines.append("  equal   %s" % t)
    n = sum(len(p["diverge"]) for p in result["phases"])
    if result["diverged"]:
        names = sorted({d["name"] for p in result["phases"] for d in p["diverge"]})
        lines.append("result: DIVERGE: %d tensor digests differ across ranks (%s)" % (n, ", ".join(names)))
    else:
        lines.append("result: EQUAL: every replicated tensor is equal on every rank at every phase")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dmpcheck_torchrec.audit",
                                     description="Compare the ranks' audit files of a script cell.")
    sub = parser.add_subparsers(dest="command")
    cmp = sub.add_parser("compare", help="per phase, the replicated tensors equal on every rank and those that diverge")
    cmp.add_argument("directory")
    cmp.add_argument("--json", action="store_true", help="the comparison as JSON on stdout")
    cmp.add_argument("--json-file", metavar="PATH",
                     help="also write {comparison, ranks: {R: {status, exception, errors}}} to PATH (dmpcheck reads it)")
    args = parser.parse_args(argv)
    if args.command != "compare":
        parser.print_usage(sys.stderr)
        return 2
    try:
        docs = load_dir(args.directory)
    except BadInput as e:
        print("dmpcheck audit: %s" % e, file=sys.stderr)
        return 2
    result = compare(docs)
    if not result["phases"]:
        print("dmpcheck audit: no phases recorded in %s: did the script build a DistributedModelParallel?"
              % args.directory, file=sys.stderr)
        print("\n".join(report(docs, result, args.directory).splitlines()[1:1 + len(docs) + sum(
            len(d.get("errors") or []) for d in docs.values())]), file=sys.stderr)
        return 2
    if args.json_file:
        ranks = {str(r): {"status": d.get("status"), "exception": d.get("exception"),
                          "errors": [str(e) for e in d.get("errors") or []]} for r, d in docs.items()}
        with open(args.json_file, "w") as f:
            json.dump({"comparison": result, "ranks": ranks}, f, indent=1, sort_keys=True)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print(report(docs, result, args.directory))
    return 1 if result["diverged"] else 0


if __name__ == "__main__":
    sys.exit(main())
