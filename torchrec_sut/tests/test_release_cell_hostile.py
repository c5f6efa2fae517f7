"""What a release cell lets in and what it hides (issue 46).

Item 1, its sockets, sampled from outside while it runs: the release's ranks rendezvous through a file in the cell's private (0700) directory, as dmpcheck's
own ranks do, and Gloo's pairs listen on loopback: nothing of the run listens off loopback, and
there is no store port for anyone to write into.  Sampled the same way for a reference cell.
"""
import os
import re
import socket
import struct
import subprocess
import time

from scenario_keys import with_keys
from test_torchrec_cells import DMPCHECK, dmpcheck, need

SCENARIO = """version: 1
name: sockets-of-a-cell
world_size: 4
steps: 3
batch_size: 8
timeout_s: 120
init: {mode: seeded, seed: 0}
tables:
  - {name: t0, rows: 64, dim: 8, features: [f0], sharding: {types: [table_wise]}}
  - {name: t1, rows: 64, dim: 8, features: [f1], sharding: {types: [table_wise]}}
optimizers:
  sparse: {type: sgd, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
matrix:
  system: [reference, torchrec==0.6.0]
"""


def _descendants(root):
    """root and every process below it, from /proc."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def _socket_inodes(pids):
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(int(link[len("socket:["):-1]))
        except OSError:  # gone between the listing and the look
            continue
    return inodes


def _address(hex_address, family):
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if family == socket.AF_INET:
        return socket.inet_ntop(family, struct.pack("<I", struct.unpack(">I", raw)[0])), int(port, 16)
    words = struct.unpack("<4I", raw)  # /proc/net/tcp6: four host-order 32-bit words
    return socket.inet_ntop(family, struct.pack(">4I", *words)), int(port, 16)


def _listening(pids):
    """(address, port) of every TCP socket in LISTEN that one of `pids` holds."""
    inodes = _socket_inodes(pids)
    out = set()
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[9]) in inodes:
                    out.add(_address(fields[1], family))
    return out


def _sample_while_running(args, env):
    proc = subprocess.Popen([DMPCHECK, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    seen = set()
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        seen |= _listening(_descendants(proc.pid))
        time.sleep(0.05)
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out, seen


def test_a_release_cell_listens_on_loopback_only_and_has_no_store_port(tmp_path):
    need("0.6.0")
    scenario = tmp_path / "sockets.yaml"
    scenario.write_text(SCENARIO)
    status, out, seen = _sample_while_running(
        ["run", str(scenario), "--filter", "torchrec", "--out", str(tmp_path / "r")], {})
    assert status == 0, out
    assert "on real torchrec 0.6.0" in out, out
    # Sampling works (Gloo's pairs were seen), and every listener is on loopback.
    assert seen, "no listening socket of the run was ever sampled: the sampling is broken"
    off_loopback = {a for a in seen if a[0] not in ("127.0.0.1", "::1")}
    assert not off_loopback, f"listening off loopback: {sorted(off_loopback)}"


def test_a_reference_cell_listens_on_loopback_only(tmp_path):
    scenario = tmp_path / "sockets.yaml"
    scenario.write_text(SCENARIO)
    status, out, seen = _sample_while_running(
        ["run", str(scenario), "--filter", r"\[default\]", "--out", str(tmp_path / "r")], {})
    assert status == 0, out
    # A reference cell can end between two samples under load (CI saw none once): held to loopback when seen.
    off_loopback = {a for a in seen if a[0] not in ("127.0.0.1", "::1")}
    assert not off_loopback, f"listening off loopback: {sorted(off_loopback)}"


def test_a_non_finite_loss_on_a_release_is_named_as_the_releases(tmp_path):
    """Item 6: a NaN or infinite loss was written into JSON as NaN and read back as "output is
    incomplete: not JSON"; the cell now fails naming the step and the loss."""
    need("0.6.0")
    scenario = with_keys(tmp_path / "overflow.yaml", SCENARIO, {
        ("name",): "overflow", ("optimizers", "sparse", "lr"): 1.0e+15, ("optimizers", "dense", "lr"): 1.0e+15,
        ("matrix", "system"): ["torchrec==0.6.0"], ("world_size",): 2})
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert re.search(r"NonFiniteLoss: step \d: the loss is (nan|inf|-inf) on rank \d", p.stdout), p.stdout
    assert "not JSON" not in p.stdout


def _environment_seen_through(root, name, real, versions):
    """root/name: every entry of the real environment `real` linked, but a ready marker of its own
    that claims `versions` (torchrec, fbgemm_gpu) for it."""
    import json
    env = root / name
    env.mkdir(parents=True)
    for entry in os.listdir(real):
        if entry not in ("dmpcheck-ready.json", "dmpcheck-in-use.lock", "dmpcheck-last-used"):
            os.symlink(os.path.join(real, entry), env / entry)
    with open(os.path.join(real, "dmpcheck-ready.json")) as f:
        marker = json.load(f)
    marker["versions"].update(versions)
    (env / "dmpcheck-ready.json").write_text(json.dumps(marker))
    return env


def test_a_ready_marker_that_names_other_versions_never_names_the_reports_environment(tmp_path):
    """Item 13: a ready marker edited to say another torchrec reached the report's `environment`.
    The versions it names are held against the system's: where they differ the environment is asked
    again and marked anew; where the environment itself imports another release, its cells are
    skipped saying so."""
    import json
    from test_torchrec_cells import ENVS
    need("1.9.2")
    real = os.path.join(ENVS, "torchrec-1.9.2")
    root = tmp_path / "envs"
    _environment_seen_through(root, "torchrec-1.9.2", real, {"torchrec": "1.9.1"})
    _environment_seen_through(root, "torchrec-1.9.1", real, {"torchrec": "1.9.1"})
    scenario = with_keys(tmp_path / "marker.yaml", SCENARIO, {
        ("name",): "marker", ("steps",): 1, ("world_size",): 2,
        ("matrix", "system"): ["torchrec==1.9.2", "torchrec==1.9.1"]})
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"), env={"DMPCHECK_TORCHREC_ENVS": str(root)})
    said = p.stdout + p.stderr
    assert "dmpcheck-ready.json says torchrec 1.9.1, not 1.9.2: asking the environment again" in said, said
    report = json.load(open(tmp_path / "r" / "marker" / "torchrec__1.9.2.json"))
    assert report["verdict"] == "pass" and report["system"]["torchrec"] == "1.9.2", report["system"]
    assert json.loads((root / "torchrec-1.9.2" / "dmpcheck-ready.json").read_text())["versions"]["torchrec"] == "1.9.2"
    # The environment named 1.9.1 imports 1.9.2 (its marker agrees with its name): the cell's error,
    # never a verdict on 1.9.1.
    wrong = json.load(open(tmp_path / "r" / "marker" / "torchrec__1.9.1.json"))
    assert wrong["verdict"] == "error" and wrong["failure"]["kind"] == "environment", wrong["failure"]
    assert "imports torchrec 1.9.2, not 1.9.1" in wrong["failure"]["message"], wrong["failure"]
    # A marker's torch is not what the report's environment says: the ranks' own import is.
    marker = root / "torchrec-1.9.2" / "dmpcheck-ready.json"
    said = json.loads(marker.read_text())
    said["versions"]["torch"] = "9.9.9"
    marker.write_text(json.dumps(said))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r2"), env={"DMPCHECK_TORCHREC_ENVS": str(root)})
    report = json.load(open(tmp_path / "r2" / "marker" / "torchrec__1.9.2.json"))
    assert report["environment"]["libtorch_version"].startswith("torch 2.14"), report["environment"]


INIT_FROM = """version: 1
name: init-from-misfit
world_size: 2
steps: 1
batch_size: 4
init: {mode: seeded, seed: 1, from: weights.pt}
tables:
  - {name: dp_table, rows: 12, dim: 4, features: [f_dp], sharding: {types: [data_parallel]}}
  - {name: tw_table, rows: 16, dim: 4, features: [f_tw], sharding: {types: [table_wise]}}
dense: {layers: [1]}
optimizers:
  sparse: {type: sgd, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
system: torchrec==1.9.2
matrix:
  init.load: [before_wrap, after_wrap]
"""


def test_init_from_weights_that_do_not_fit_the_model_are_refused_on_a_release(tmp_path):
    """Item 8 on a release cell: a 20-row table loaded into a 16-row one took its first 16 rows, a
    misspelt name was ignored and a missing one left the wrap's draw, whichever side of the wrap the
    weights load; each is now the cell's error of kind invalid_input, in the reference's words."""
    need("1.9.2")
    from test_rank_program import python_of
    scenario = tmp_path / "init-from.yaml"
    scenario.write_text(INIT_FROM)
    shapes = {"ebc.embedding_bags.dp_table.weight": (12, 4), "ebc.embedding_bags.tw_table.weight": (16, 4),
              "dense.0.weight": (1, 8), "dense.0.bias": (1,)}
    cases = [({"ebc.embedding_bags.tw_table.weight": (20, 4)},
              "init.from: 'ebc.embedding_bags.tw_table.weight' is [20, 4] but the model's is [16, 4]"),
             ({"ebc.embedding_bags.tw_tabel.weight": (16, 4)},
              "init.from holds 'ebc.embedding_bags.tw_tabel.weight', which this model does not")]
    for changed, said in cases:
        weights = {k: v for k, v in shapes.items() if k not in ("ebc.embedding_bags.tw_table.weight",)}
        weights.update(changed)
        code = "import sys, torch; torch.save({k: torch.zeros(*v) for k, v in %r.items()}, sys.argv[1])" % weights
        subprocess.run([python_of("1.9.2"), "-c", code, str(tmp_path / "weights.pt")], check=True)
        p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
        assert p.returncode == 3, p.stdout + p.stderr
        verdicts = [line for line in p.stdout.splitlines() if line.startswith("VERDICT")]
        assert len(verdicts) == 2 and all(said in v and "ERROR" in v for v in verdicts), p.stdout
        reports = list((tmp_path / "r" / "init-from-misfit").glob("*.json"))
        assert len(reports) == 2 and all('"kind": "invalid_input"' in r.read_text() for r in reports), p.stdout
