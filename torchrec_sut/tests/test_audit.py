"""Script cells, the audit (dmpcheck_torchrec/audit.py, booted by audit_boot/sitecustomize.py).

The acceptance: TorchRec issue #1739's reporter script, unchanged, under the real torchrun of each
release environment (2 ranks, CPU/gloo): on 0.6.0 the data-parallel tables diverge after the wrap;
on 1.9.2 every replicated tensor is equal at every phase.  Needs the release environments (bash
ci/torchrec-env.sh 0.6.0 1.9.2); without them those tests skip, naming that command, unless
DMPCHECK_REQUIRE_TORCHREC=1 makes a missing one a failure.  The comparer's and the boot's own tests
need no torch.
"""
import hashlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import textwrap

import pytest
from test_torchrec_cells import need

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SUT = os.path.join(ROOT, "torchrec_sut")
BOOT = os.path.join(SUT, "dmpcheck_torchrec", "audit_boot")
REPORTER = os.path.join(ROOT, "benchmarks", "reporter-1739", "debug_dp_shard.py")
ENVS = os.environ.get("DMPCHECK_TORCHREC_ENVS",
                      os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dmpcheck", "torchrec"))
TABLES = ["ebc.embedding_bags.%s.weight" % t for t in ("large_table_0", "large_table_1", "small_table_0", "small_table_1")]
DENSE = ["linear.weight", "linear.bias"]
SCHEMA = "dmpcheck-audit/1"

# The comparer must run without torch: this prelude makes importing it fail.
NO_TORCH = ("import sys, runpy\n"
            "class Block:\n"
            "    def find_spec(self, name, path, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'torchrec', 'numpy'):\n"
            "            raise ImportError('blocked: ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "sys.argv = ['audit'] + sys.argv[1:]\n"
            "runpy.run_module('dmpcheck_torchrec.audit', run_name='__main__')\n")


def python_of(release):
    return os.path.join(ENVS, "torchrec-" + release, "bin", "python")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compare(directory, *extra):
    return subprocess.run([sys.executable, "-c", NO_TORCH, "compare", str(directory), *extra],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, PYTHONPATH=SUT))


def audited_env(audit_dir, **extra):
    # TMPDIR beside the audit: torchrun keeps its agent's log directory (torchelastic_*) there.
    e = dict(os.environ, PYTHONPATH=BOOT + os.pathsep + SUT, DMPCHECK_AUDIT_DIR=str(audit_dir),
             TMPDIR=str(pathlib.Path(audit_dir).parent))
    e.update(extra)
    return e


# ---------------------------------------------------------------------------------------------
# the comparer, on hand-written rank files


def tensor(sha, dtype="float32", shape=(4, 2)):
    return {"sha256": sha * 64 if len(sha) == 1 else sha, "dtype": dtype, "shape": list(shape)}


def rank_file(directory, rank, phases, world_size=2, **fields):
    doc = {"schema": SCHEMA, "rank": rank, "world_size": world_size, "status": "exited", "errors": [],
           "phases": [{"phase": name, "via": "test", "tensors": tensors} for name, tensors in phases]}
    doc.update(fields)
    path = directory / ("rank%d.json" % rank)
    path.write_text(json.dumps(doc))
    return path


def test_compare_all_equal_exits_0_and_names_the_tensors(tmp_path):
    for r in range(2):
        rank_file(tmp_path, r, [("wrap", {"t.weight": tensor("a"), "linear.bias": tensor("b", shape=(2,))}),
                                ("step 1", {"t.weight": tensor("c"), "linear.bias": tensor("d", shape=(2,))})])
    p = compare(tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "phase wrap (after test): 2 equal, 0 diverge" in p.stdout
    assert "phase step 1 (after test): 2 equal, 0 diverge" in p.stdout
    assert "  equal   t.weight" in p.stdout and "  equal   linear.bias" in p.stdout
    assert "DIVERGE" not in p.stdout
    assert "result: EQUAL" in p.stdout


def test_compare_names_what_diverges_where(tmp_path):
    rank_file(tmp_path, 0, [("wrap", {"t.weight": tensor("a"), "u": tensor("e"), "v": tensor("f")}),
                            ("step 1", {"t.weight": tensor("c"), "u": tensor("e"), "v": tensor("f")})])
    rank_file(tmp_path, 1, [("wrap", {"t.weight": tensor("b"), "u": tensor("e"), "v": tensor("f", dtype="float64")}),
                            ("step 1", {"t.weight": tensor("c"), "u": tensor("e", shape=(8,)), "v": tensor("f")})])
    p = compare(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    wrap = lines.index("phase wrap (after test): 1 equal, 2 diverge")
    step = lines.index("phase step 1 (after test): 2 equal, 1 diverge")
    in_wrap, in_step = lines[wrap + 1:step], lines[step + 1:]
    assert any(l.startswith("  DIVERGE t.weight ") and "rank0=aaaaaaaaaaaa" in l and "rank1=bbbbbbbbbbbb" in l for l in in_wrap), in_wrap
    assert any(l.startswith("  DIVERGE v ") for l in in_wrap), in_wrap  # same bytes, other dtype
    assert "  equal   u" in in_wrap
    assert any(l.startswith("  DIVERGE u ") for l in in_step), in_step  # same bytes, other shape
    assert "  equal   t.weight" in in_step and "  equal   v" in in_step
    j = json.loads(compare(tmp_path, "--json").stdout)
    assert [(ph["phase"], sorted(d["name"] for d in ph["diverge"])) for ph in j["phases"]] == \
        [("wrap", ["t.weight", "v"]), ("step 1", ["u"])]


def test_compare_a_tensor_only_some_ranks_have_diverges(tmp_path):
    rank_file(tmp_path, 0, [("wrap", {"t": tensor("a"), "only0": tensor("b")})])
    rank_file(tmp_path, 1, [("wrap", {"t": tensor("a")})])
    p = compare(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert any(l.startswith("  DIVERGE only0 ") and "rank1=absent" in l for l in p.stdout.splitlines()), p.stdout


def test_compare_a_phase_only_some_ranks_have_diverges(tmp_path):
    # the phase's tensors are absent on rank 1 anyway: its own absence must count, even with none
    rank_file(tmp_path, 0, [("wrap", {"t": tensor("a")}), ("step 1", {})])
    rank_file(tmp_path, 1, [("wrap", {"t": tensor("a")})])
    p = compare(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "  PHASE MISSING on ranks 1" in p.stdout
    assert "result: DIVERGE" in p.stdout


def test_compare_a_missing_rank_file_exits_2_naming_it(tmp_path):
    rank_file(tmp_path, 0, [("wrap", {"t": tensor("a")})], world_size=3)
    rank_file(tmp_path, 2, [("wrap", {"t": tensor("a")})], world_size=3)
    p = compare(tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "missing audit file %s" % (tmp_path / "rank1.json") in p.stderr, p.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    p = compare(empty)
    assert p.returncode == 2 and "no audit files (rank<R>.json) in %s" % empty in p.stderr, p.stderr


@pytest.mark.parametrize("text", ["{not json", json.dumps({"schema": "other", "rank": 1, "world_size": 2, "phases": []}),
                                  json.dumps([1, 2]), json.dumps({"schema": SCHEMA, "rank": "1", "phases": []}),
                                  json.dumps({"schema": SCHEMA, "rank": 1, "world_size": 2,
                                              "phases": [{"phase": "wrap", "tensors": {"t": {"sha256": 1}}}]})])
def test_compare_a_malformed_file_exits_2_naming_it(tmp_path, text):
    rank_file(tmp_path, 0, [("wrap", {"t": tensor("a")})])
    (tmp_path / "rank1.json").write_text(text)
    p = compare(tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "malformed audit file %s" % (tmp_path / "rank1.json") in p.stderr, p.stderr
    assert p.stdout == ""


def test_compare_without_phases_exits_2_with_the_ranks_errors(tmp_path):
    for r in range(2):
        rank_file(tmp_path, r, [], errors=["installing the audit: boom %d" % r], status="audit not installed")
    p = compare(tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "no phases recorded in %s" % tmp_path in p.stderr
    assert "audit error: installing the audit: boom 1" in p.stderr, p.stderr


# ---------------------------------------------------------------------------------------------
# the boot, without torch


def test_boot_chains_to_the_sitecustomize_it_shadows_and_imports_nothing(tmp_path):
    """Debian's python has /etc/python3.11/sitecustomize.py (the release venvs load it): ours must
    run it still, and must import neither torch nor the audit's torch-side code at start-up."""
    shadowed = tmp_path / "shadowed"
    shadowed.mkdir()
    (shadowed / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    probe = ("import os, sys; print(os.environ.get('SHADOWED_RAN'), 'torch' in sys.modules, "
             "'torchrec' in sys.modules, sys.modules['sitecustomize'].__file__)")
    e = audited_env(tmp_path / "audit", PYTHONPATH=os.pathsep.join([BOOT, SUT, str(shadowed)]))
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, env=e)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["yes", "False", "False", os.path.join(BOOT, "sitecustomize.py")], p.stdout
    assert p.stderr == ""
    assert not (tmp_path / "audit").exists()  # nothing written by a process that built no DMP


FAKE_MP = """
class DistributedModelParallel:
    def __init__(self, module):
        self.module = module
    def state_dict(self):
        return {}
"""


def test_an_audit_failure_is_recorded_not_raised(tmp_path):
    """No torch here: recording fails.  The script's output and exit status are its own; the rank's
    file says what failed."""
    fake = tmp_path / "fake"
    (fake / "torchrec" / "distributed").mkdir(parents=True)
    (fake / "torchrec" / "__init__.py").write_text("")
    (fake / "torchrec" / "distributed" / "__init__.py").write_text("")
    (fake / "torchrec" / "distributed" / "model_parallel.py").write_text(FAKE_MP)
    script = tmp_path / "script.py"
    script.write_text("from torchrec.distributed.model_parallel import DistributedModelParallel\n"
                      "d = DistributedModelParallel(object())\nprint('script done', type(d).__name__)\n")
    e = audited_env(tmp_path / "audit", PYTHONPATH=os.pathsep.join([BOOT, SUT, str(fake)]), RANK="0", WORLD_SIZE="1")
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=e)
    assert p.returncode == 0 and p.stdout == "script done DistributedModelParallel\n", p.stdout + p.stderr
    doc = json.loads((tmp_path / "audit" / "rank0.json").read_text())
    assert doc["status"] == "exited"
    assert "torchrec.distributed.model_parallel.DistributedModelParallel.__init__" in doc["hooks"]
    assert any("recording phase wrap" in e and "torch" in e for e in doc["errors"]), doc["errors"]


# ---------------------------------------------------------------------------------------------
# the real releases


def run_reporter(release, audit_dir):
    """The reporter's script, unchanged, under the release's torchrun, 2 ranks on CPU/gloo."""
    need(release)
    with open(REPORTER, "rb") as f:
        before = hashlib.sha256(f.read()).hexdigest()
    cmd = [python_of(release), "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(free_port()), REPORTER]
    e = audited_env(audit_dir, CUDA_VISIBLE_DEVICES="")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=e, cwd=ROOT)
    with open(REPORTER, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == before, "the reporter's script changed"
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for r in range(2):
        doc = json.loads((audit_dir / ("rank%d.json" % r)).read_text())
        assert doc["errors"] == [] and doc["status"] == "exited", doc
        assert doc["versions"]["torchrec"] == release
    return p


def diverged(comparison):
    return {ph["phase"]: sorted(d["name"] for d in ph["diverge"]) for ph in comparison["phases"]}


def test_reporter_on_0_6_0_data_parallel_tables_diverge_after_the_wrap(tmp_path):
    run = run_reporter("0.6.0", tmp_path / "audit")
    assert "ebc.embedding_bags.large_table_0.weight False" in run.stdout  # the script's own finding
    p = compare(tmp_path / "audit")
    assert p.returncode == 1, p.stdout + p.stderr
    j = json.loads(compare(tmp_path / "audit", "--json").stdout)
    assert [ph["phase"] for ph in j["phases"]] == ["wrap", "step 1", "exit"]
    assert all(not ph["missing_ranks"] for ph in j["phases"])
    assert diverged(j) == {"wrap": TABLES, "step 1": TABLES, "exit": TABLES}
    wrap = j["phases"][0]
    assert sorted(wrap["equal"]) == sorted(DENSE)  # dense parameters: broadcast by DDP
    for t in TABLES:
        assert any(l.startswith("  DIVERGE %s " % t) for l in p.stdout.splitlines()), p.stdout


def test_reporter_on_1_9_2_every_replicated_tensor_is_equal_at_every_phase(tmp_path):
    run = run_reporter("1.9.2", tmp_path / "audit")
    assert "ebc.embedding_bags.large_table_0.weight True" in run.stdout
    p = compare(tmp_path / "audit")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "result: EQUAL" in p.stdout
    j = json.loads(compare(tmp_path / "audit", "--json").stdout)
    assert [ph["phase"] for ph in j["phases"]] == ["wrap", "step 1", "exit"]
    assert diverged(j) == {"wrap": [], "step 1": [], "exit": []}
    for ph in j["phases"]:
        assert set(TABLES + DENSE) <= set(ph["equal"]), ph  # not equal by having nothing to compare
    assert any(n.startswith("optimizer0/") and n.endswith("/exp_avg") for n in j["phases"][1]["equal"])


IN_BACKWARD = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.distributed.optim import _apply_optimizer_in_backward
    from torchrec.distributed.model_parallel import DistributedModelParallel
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    dmp = DistributedModelParallel(torch.nn.Linear(4, 2), device=torch.device("cpu"))
    params = list(dmp.parameters())
    dmp(torch.ones(3, 4)).sum().backward()   # DDP set up before the in-backward optimizers: no stream
    _apply_optimizer_in_backward(torch.optim.SGD, params, {"lr": 0.5, "momentum": 0.9})
    dmp(torch.ones(3, 4)).sum().backward()   # two in-backward SGD steps: one phase, at its end
    plain = torch.optim.Adam(params, lr=0.1)
    for p in params:
        p.grad = torch.ones_like(p)
    plain.step()                             # a plain torch optimizer: a phase
    raise RuntimeError("the script fails here")
""")


@pytest.mark.parametrize("release", ["0.6.0", "1.9.2"])
def test_in_backward_and_plain_torch_steps_and_a_raising_script(tmp_path, release):
    """A script of our own on a real release (1 rank): the phases of torch optimizers stepped in
    backward and outside, and the file of a script that raises."""
    need(release)
    script = tmp_path / "script.py"
    script.write_text(IN_BACKWARD)
    e = audited_env(tmp_path / "audit", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(free_port()), CUDA_VISIBLE_DEVICES="")
    p = subprocess.run([python_of(release), str(script)], capture_output=True, text=True, timeout=300, env=e)
    assert p.returncode == 1 and "RuntimeError: the script fails here" in p.stderr, p.stderr[-3000:]
    doc = json.loads((tmp_path / "audit" / "rank0.json").read_text())
    assert doc["status"] == "raised" and doc["exception"] == "RuntimeError: the script fails here"
    assert doc["errors"] == []
    assert [(ph["phase"], ph["via"]) for ph in doc["phases"]] == [
        ("wrap", "DistributedModelParallel.__init__"),
        ("step 1", "end of backward (in-backward SGD)"),
        ("step 2", "Adam.step"),
        ("exit", "atexit")]
    wrap, in_bwd, adam, _ = [ph["tensors"] for ph in doc["phases"]]
    weight = [n for n in wrap if n.endswith("weight")]
    assert len(weight) == 1 and wrap[weight[0]] != in_bwd[weight[0]] != adam[weight[0]]  # each step moved it
    assert any(n.startswith("optimizer0/") and n.endswith("/exp_avg") for n in adam), sorted(adam)
    assert {"in_backward/weight/momentum_buffer", "in_backward/bias/momentum_buffer"} <= set(in_bwd), sorted(in_bwd)
