"""What the multi-host tests share: the scenarios they run and how their verdicts are read, and the
hosts themselves: network namespaces joined by a veth pair, made and removed here.

Each namespace is a host with its own address (10.77.N.1, 10.77.N.2); ranks in one cannot reach
the other's loopback.  Only these addresses and loopback are ever a target.
"""
import contextlib
import glob
import itertools
import json
import os
import shutil
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BUILD = os.environ.get("DMPCHECK_BUILD_DIR", os.path.join(ROOT, "build"))
DMPCHECK = os.environ.get("DMPCHECK_BIN", os.path.join(BUILD, "harness", "dmpcheck"))
SEED = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1739-dp-tables-not-broadcast.yaml")
TWRW = os.path.join(os.path.dirname(__file__), "table_row_wise_2x2.yaml")
ENVS = os.environ.get("DMPCHECK_TORCHREC_ENVS",
                      os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dmpcheck", "torchrec"))
TORCHRUN = os.path.join(ENVS, "torchrec-1.9.2", "bin", "torchrun")


LONG = """version: 1
name: long-reference-run
world_size: 2
steps: 100000
batch_size: 4
timeout_s: 30
tables:
  - {name: t0, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
  - {name: t1, rows: 16, dim: 4, features: [f1], sharding: {types: [table_wise]}}
"""


def reports(out, name):
    return {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(os.path.join(out, name, "*.json"))}


def assert_seed(out):
    got = {k: v for k, v in reports(out, "torchrec-1739-dp-tables-not-broadcast").items() if v["verdict"] != "skipped"}
    assert sorted(got) == ["seeded_torchrec-0.6", "seeded_torchrec-1.9", "unseeded_torchrec-0.6", "unseeded_torchrec-1.9"], sorted(got)
    for slug, r in got.items():
        assert r["verdict"] == "pass", (slug, r["expectation"], r["failure"])
        assert r["environment"]["world_size"] == 2
    assert sum(not c["equal"] for c in got["unseeded_torchrec-0.6"]["replicas"]) == 8


def assert_twrw(out):
    got = reports(out, "multihost-table-row-wise-2x2")
    assert len(got) == 2, sorted(got)
    for slug, r in got.items():
        assert r["verdict"] == "pass", (slug, r["expectation"], r["failure"])
        # Each table_row_wise table lives on one host: its shards on ranks {0,1} or {2,3}.
        for table in r["plan"]:
            if table["sharding"] == "table_row_wise":
                ranks = {s["rank"] for s in table["shards"] if s["rows"] > 0}
                assert ranks <= {0, 1} or ranks <= {2, 3}, table


_made = itertools.count()


def unavailable(why):
    if os.environ.get("DMPCHECK_REQUIRE_MULTIHOST") == "1":
        pytest.fail(why)
    pytest.skip(why)


def sh(*args, check=True):
    return subprocess.run(list(args), capture_output=True, text=True, check=check)


def pids_in(ns):
    return [int(p) for p in sh("ip", "netns", "pids", ns, check=False).stdout.split()]


@contextlib.contextmanager
def two_hosts():
    """Yields {"ns": (A, B), "addr": (a, b)}; kills whatever is left in them and deletes them."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        unavailable("needs root and iproute2 to make network namespaces")
    k = next(_made)
    n = (os.getpid() + 37 * k) % 200 + 20
    tag = "%d%s" % (os.getpid(), "" if k == 0 else "x%d" % k)
    names = ("dmpA" + tag, "dmpB" + tag)
    addrs = ("10.77.%d.1" % n, "10.77.%d.2" % n)
    veth = ("dva" + tag, "dvb" + tag)
    try:
        for ns in names:
            sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        for ns, dev, addr in zip(names, veth, addrs):
            sh("ip", "link", "set", dev, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", addr + "/24", "dev", dev)
            sh("ip", "-n", ns, "link", "set", dev, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        yield {"ns": names, "addr": addrs}
    finally:
        remove(names)
        # A veth not yet moved into a namespace when something failed stays in this one.
        sh("ip", "link", "del", veth[0], check=False)


def remove(names):
    for ns in names:
        if ns not in sh("ip", "netns", "list", check=False).stdout.split():
            continue
        for pid in pids_in(ns):
            subprocess.run(["kill", "-9", str(pid)])
        sh("ip", "netns", "del", ns, check=False)
