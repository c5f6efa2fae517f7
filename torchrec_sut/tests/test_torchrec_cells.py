"""Real TorchRec releases under test, end to end through the dmpcheck CLI.

Needs the release environments (bash ci/torchrec-env.sh 0.6.0 1.9.2).  Without them these tests
skip, naming that command, unless DMPCHECK_REQUIRE_TORCHREC=1 (CI) makes a missing one a failure.
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from scenario_keys import table_index, with_keys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("DMPCHECK_BUILD_DIR", os.path.join(ROOT, "build"))
DMPCHECK = os.environ.get("DMPCHECK_BIN", os.path.join(BUILD, "harness", "dmpcheck"))
SEED = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1739-dp-tables-not-broadcast.yaml")
ENVS = os.environ.get("DMPCHECK_TORCHREC_ENVS",
                      os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dmpcheck", "torchrec"))
WORLD_SIZE = ("matrix", "world_size")  # keys of the fidelity files' matrix (scenario_keys.with_keys)
SPARSE_OPTIMIZER = ("matrix", "optimizers.sparse.type")
TABLES = ["ebc.embedding_bags.%s.weight" % t for t in ("large_table_0", "large_table_1", "small_table_0", "small_table_1")]


def need(*releases):
    missing = [r for r in releases if not os.path.exists(os.path.join(ENVS, "torchrec-" + r, "dmpcheck-ready.json"))]
    if missing:
        why = "torchrec %s not installed: bash ci/torchrec-env.sh %s" % (", ".join(missing), " ".join(missing))
        if os.environ.get("DMPCHECK_REQUIRE_TORCHREC") == "1":
            pytest.fail(why)
        pytest.skip(why)


def dmpcheck(*args, env=None, timeout=600):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([DMPCHECK, *args], capture_output=True, text=True, timeout=timeout, env=e)


def broken_sut(tmp_path, module, anchor, replacement):
    """A copy of the rank program with `anchor` in dmpcheck_torchrec/<module> replaced (it must be
    there): a fault the checks must catch.  Its directory, for DMPCHECK_TORCHREC_SUT."""
    broken = tmp_path / "broken"
    shutil.copytree(os.path.join(ROOT, "torchrec_sut"), broken, ignore=shutil.ignore_patterns("__pycache__"))
    path = broken / "dmpcheck_torchrec" / module
    text = path.read_text()
    assert anchor in text, (module, anchor)
    path.write_text(text.replace(anchor, replacement))
    return broken


def not_bitwise(result, allowed=("model_output",)):
    """(tensor, step, elements) of every comparison with the reference that is not bitwise, but
    those named in `allowed` (the Linear's forward: a BLAS of its own on each side)."""
    return [(d["name"], d["step"], d["elements_differing"]) for d in result["reference"]
            if d["elements_differing"] and d["name"] not in allowed]


def test_seed_on_real_releases(tmp_path):
    """The seed: real 0.6.0 diverges on all four tables at init and after the step; 1.9.2 is equal."""
    need("0.6.0", "1.9.2")
    exchange = tmp_path / "tmp"
    exchange.mkdir()
    p = dmpcheck("run", SEED, "--quiet", "--out", str(tmp_path / "reports"), env={"TMPDIR": str(exchange)})
    assert p.returncode == 0, p.stdout + p.stderr
    reports = tmp_path / "reports" / "torchrec-1739-dp-tables-not-broadcast"
    by_slug = {os.path.basename(f)[:-5]: json.load(open(f)) for f in glob.glob(str(reports / "*.json"))}
    # The reference's 4 and 0.6.0's and 1.9.2's 4 at least (the releases before 0.6.0 where installed).
    wanted = {"%s_torchrec%s" % (mode, system) for mode in ("seeded", "unseeded")
              for system in ("-0.6", "-1.9", "__0.6.0", "__1.9.2")}
    assert wanted <= set(by_slug), sorted(by_slug)
    bug = by_slug["unseeded_torchrec__0.6.0"]
    assert bug["system"]["simulated"] is False
    assert bug["system"]["torchrec"] == "0.6.0" and bug["system"]["torch"].startswith("2.2.0")
    assert bug["verdict"] == "pass"
    diverged = {(c["name"], c["phase"]) for c in bug["replicas"] if not c["equal"]}
    assert diverged == {(t, phase) for t in TABLES for phase in ("init", "final")}
    for slug in ("seeded_torchrec__0.6.0", "seeded_torchrec__1.9.2", "unseeded_torchrec__1.9.2"):
        r = by_slug[slug]
        assert r["verdict"] == "pass" and all(c["equal"] for c in r["replicas"]), slug
        assert r["system"]["simulated"] is False
    assert by_slug["unseeded_torchrec-0.6"]["system"]["simulated"] is True
    # The console says which verdicts are real and which are simulated.
    assert "on real torchrec 0.6.0" in p.stdout and "on reference, profile torchrec-0.6 (simulated)" in p.stdout
    # Nothing left behind (issue 46, item 7): the exchange directories are gone, and so is what torch
    # writes to TMPDIR (torchinductor's cache, tempfile's tmp* folders): the ranks' and the warm
    # interpreters' TMPDIR is inside their own private directories.
    assert list(exchange.iterdir()) == []


def test_the_regression_library_on_real_releases(tmp_path):
    """Every release cell of scenarios/regressions/ holds: what each release showed, checked again."""
    need("0.6.0", "1.9.2")
    # About 60 release cells of 10-25 s each on 2 cores: the deadline is there for a hang.
    p = dmpcheck("suite", os.path.join(ROOT, "scenarios", "regressions"), "--filter", "system=torchrec", "--out", str(tmp_path),
                 timeout=1800)
    assert p.returncode == 0, p.stdout + p.stderr
    counted = re.search(r"dmpcheck suite: (\d+) of (\d+) run\(s\) met their expectations \(0 failed, 0 errored, "
                        r"(\d+) skipped\)", p.stdout)
    assert counted, p.stdout
    met, runs, skipped = (int(g) for g in counted.groups())
    assert met + skipped == runs and met >= 45, p.stdout


def test_every_regression_says_what_each_release_showed():
    """Each scenario either has release cells or says in reproduces.releases why a release cannot run it."""
    for path in sorted(glob.glob(os.path.join(ROOT, "scenarios", "regressions", "*.yaml"))):
        text = open(path).read()
        for release in ("torchrec==0.6.0", "torchrec==1.9.2"):
            has_cell = re.search(r"^  system: \[.*%s" % re.escape(release), text, re.M)
            said = re.search(r"^    %s: " % re.escape(release), text, re.M)
            assert has_cell or said, "%s says nothing about %s" % (os.path.basename(path), release)


def test_bisect_names_the_release_that_changed(tmp_path):
    """With --no-install a release that is not installed is skipped, never the answer: without 0.8.0
    the change lies between 0.7.0 and 1.9.2 and the result says so (exit 4), with it 0.8.0."""
    need("0.6.0", "0.7.0", "1.9.2")
    p = dmpcheck("bisect", SEED, "--releases", "0.6.0,0.7.0,0.8.0,1.9.2", "--no-install", "--out", str(tmp_path))
    if os.path.exists(os.path.join(ENVS, "torchrec-0.8.0", "dmpcheck-ready.json")):
        assert p.returncode == 0, p.stdout + p.stderr
        assert "first release that behaves differently: 0.8.0" in p.stdout
    else:
        assert p.returncode == 4, p.stdout + p.stderr
        assert ("the behaviour changes between torchrec 0.7.0 and 1.9.2; not tested between them: 0.8.0 (install: "
                "bash ci/torchrec-env.sh 0.8.0)") in p.stdout
        assert "first release" not in p.stdout


def test_an_interrupted_bisect_draws_no_conclusion(tmp_path):
    """Issue 59, item 3: SIGTERM while a release's cells run is not that release's behaviour; the
    search stops with exit 130, says it was interrupted and names no change."""
    need("0.6.0", "1.9.2")
    p = subprocess.Popen([DMPCHECK, "bisect", SEED, "--releases", "0.6.0,1.9.2", "--no-install", "--out",
                          str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in p.stdout:  # the first cell of the first release has started
        lines.append(line)
        if line.startswith("[") or "rank" in line or line.startswith("bisect: 2 releases"):
            break
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    out = "".join(lines) + p.stdout.read()
    assert p.wait(timeout=60) == 130, out
    assert "bisect: interrupted (SIGINT or SIGTERM)" in out and "draws no conclusion" in out, out
    assert "behaves differently" not in out and "behave the same" not in out and "changes between" not in out, out


def test_the_release_table_and_bisect_judge_by_what_the_scenario_expects_of_each_release(tmp_path):
    """TorchRec PR #2015 shows in the comparison with the release's own unsharded model, not in the
    replicas: `dmpcheck releases` and `bisect` judge each release by the expectations the scenario
    writes for 0.6.0 (bug) and 1.9.2 (fixed), so 0.7.0 is a bug and the change is named.  A second
    table run measures nothing again; a changed scenario is measured again."""
    need("0.6.0", "0.7.0", "1.9.2")
    scenario = tmp_path / "torchrec-2015.yaml"
    shutil.copy(os.path.join(ROOT, "scenarios", "regressions", "torchrec-2015-rowwise-adagrad-mean-of-squares.yaml"),
                scenario)
    table = tmp_path / "docs" / "releases.md"
    args = ("releases", str(scenario), "--releases", "0.6.0,0.7.0,1.9.2", "--no-install", "--output", str(table),
            "--out", str(tmp_path / "reports"))
    p = dmpcheck(*args)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line for line in table.read_text().splitlines() if line.startswith("| `torchrec-2015")]
    assert rows == ["| `torchrec-2015-rowwise-adagrad-mean-of-squares` | **bug** | **bug** | fixed | 1.9.2 (bug → fixed) |"], \
        table.read_text()
    store = json.load(open(tmp_path / "docs" / "releases.json"))
    assert sorted(m["release"] for m in store["measured"]) == ["0.6.0", "0.7.0", "1.9.2"]
    assert "(as torchrec==0.6.0: bug)" in p.stdout, p.stdout
    again = dmpcheck(*args)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "3 measured before and unchanged, 0 to run" in again.stdout, again.stdout
    scenario.write_text(scenario.read_text() + "# changed\n")
    changed = dmpcheck(*args[:2], "--releases", "1.9.2", *args[4:])
    assert "0 measured before and unchanged, 1 to run" in changed.stdout, changed.stdout
    # Bisect compared the replicas alone before, and found 0.6.0 and 1.9.2 the same here.
    b = dmpcheck("bisect", str(scenario), "--releases", "0.6.0,0.7.0,1.9.2", "--no-install", "--out",
                 str(tmp_path / "bisect"))
    assert b.returncode == 0, b.stdout + b.stderr
    assert "first release that behaves differently: 1.9.2" in b.stdout, b.stdout
    assert re.search(r"\[default\] 0.7.0: replicas equal \(as torchrec==0.6.0: bug\)  ->  1.9.2: replicas equal "
                     r"\(as torchrec==1.9.2: fixed\)", b.stdout), b.stdout


def test_bisect_installs_the_releases_it_visits_and_one_that_fails_is_never_the_answer(tmp_path):
    """A range of pinned releases, 0.6.0..0.8.0, installed as the search visits them (an installer
    standing in for ci/torchrec-env.sh fails on 0.8.0 and links the real 0.7.0): the end that
    could not be installed is not tested, the next one inward takes its place."""
    need("0.6.0", "0.7.0")
    envs = tmp_path / "envs"
    envs.mkdir()
    os.symlink(os.path.join(ENVS, "torchrec-0.6.0"), envs / "torchrec-0.6.0")
    log = tmp_path / "installed.log"
    fake = tmp_path / "install.sh"
    fake.write_text("#!/bin/bash\necho \"$1\" >> %s\necho \"installing $1\"\n"
                    "[ \"$1\" = 0.7.0 ] && ln -s %s/torchrec-0.7.0 %s/torchrec-0.7.0\n"
                    "[ \"$1\" = 0.7.0 ]\n" % (log, ENVS, envs))
    scenario = tmp_path / "seed.yaml"
    scenario.write_text(seed_on(["torchrec==0.6.0"], "  - replicas: equal\n"))
    p = dmpcheck("bisect", str(scenario), "--releases", "0.6.0..0.8.0", "--out", str(tmp_path / "bisect"),
                 env={"DMPCHECK_TORCHREC_ENVS": str(envs), "DMPCHECK_TORCHREC_INSTALLER": str(fake)})
    assert p.returncode == 1, p.stdout + p.stderr
    assert "bisect: 3 releases from 0.6.0 to 0.8.0" in p.stdout
    assert log.read_text().split() == ["0.8.0", "0.7.0"]  # each once, when visited
    assert "dmpcheck: torchrec 0.7.0 is not installed: installing it" in p.stderr
    assert re.search(r"torchrec 0.7.0 \(.* s\):\n  \[init.mode=unseeded\] replicas DIVERGE", p.stdout), p.stdout
    assert ("bisect: torchrec 0.6.0 and 0.7.0 behave the same (a bisection looks for one change between its ends; "
            "run the releases between with `dmpcheck run` to see more); not tested: 0.8.0 (install: bash "
            "ci/torchrec-env.sh 0.8.0)") in p.stdout, p.stdout


def test_a_set_of_pins_that_cannot_be_made_is_the_cells_error_in_the_installers_own_words(tmp_path):
    """A set the resolver refuses (an installer standing in for ci/torchrec-env.sh prints what uv
    prints and fails): each cell on it fails before any rank starts, saying which set, which command
    and the resolver's last words, colours taken out; the installer runs once for both cells."""
    log = tmp_path / "installed.log"
    fake = tmp_path / "install.sh"
    fake.write_text("#!/bin/bash\necho \"$1\" >> %s\n"
                    "printf '  \\033[31mx\\033[0m No solution found when resolving dependencies:\\n\\n'\n"
                    "echo '  Because there is no version of fbgemm-gpu-cpu==0.0.9 and you require it, we can conclude "
                    "that your requirements are unsatisfiable.'\nexit 1\n" % log)
    scenario = tmp_path / "skew.yaml"
    scenario.write_text(seed_on(["torchrec==1.2.0 fbgemm-gpu-cpu==0.0.9 torch==2.7.0"], "  - replicas: equal\n",
                                modes=("unseeded", "seeded")))
    p = dmpcheck("run", str(scenario), "--install", "--out", str(tmp_path / "reports"),
                 env={"DMPCHECK_TORCHREC_ENVS": str(tmp_path / "envs"), "DMPCHECK_TORCHREC_INSTALLER": str(fake)})
    assert p.returncode == 3, p.stdout + p.stderr
    assert log.read_text().split("\n")[0] == "torchrec==1.2.0 fbgemm-gpu-cpu==0.0.9 torch==2.7.0"
    assert len(log.read_text().splitlines()) == 1, log.read_text()
    reports = sorted((tmp_path / "reports").rglob("*.json"))
    assert len(reports) == 2, reports
    for report in reports:
        r = json.load(open(report))
        assert r["verdict"] == "error" and r["failure"]["kind"] == "environment", r["failure"]
        assert r["failure"]["cause"] == "no rank started" and r["failure"]["rank"] == -1
        error = r["failure"]["message"]
        assert "torchrec 1.2.0, fbgemm-gpu-cpu 0.0.9, torch 2.7.0 could not be made" in error, error
        assert "exited 1; it said last:\n  x No solution found when resolving dependencies:\n  Because there is no " \
               "version of fbgemm-gpu-cpu==0.0.9" in error, error
        assert "\033" not in error


def test_side_by_side_comparison_reports_every_step(tmp_path):
    need("1.9.2")
    # Against `current` (what the user asked for), not the profile that models the release.
    scenario = with_keys(tmp_path / "side.yaml", "fidelity/sharding.yaml", {
        ("steps",): 2, WORLD_SIZE: [2], SPARSE_OPTIMIZER: ["sgd", "adagrad"],
        ("expect", 0, "reference", "profile"): "current"})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    # sgd agrees within the tolerance; adagrad does not (data-parallel tables: TorchRec trains them
    # with the dense optimizer), so the run fails its expectation and says where.
    assert p.returncode == 1, p.stdout + p.stderr
    sgd = json.load(open(tmp_path / "reports" / "fidelity-sharding" / "sgd_2.json"))
    assert sgd["verdict"] == "pass" and sgd["reference_compared"] and sgd["reference_first_break_step"] == -1
    steps = {d["step"] for d in sgd["reference"]}
    assert steps == {0, 1, 2}
    assert all(d["elements_differing"] == 0 for d in sgd["reference"] if d["step"] == 0)  # same initial weights
    adagrad = json.load(open(tmp_path / "reports" / "fidelity-sharding" / "adagrad_2.json"))
    # Already at init: the reference holds a momentum1 for data-parallel tables that TorchRec does not.
    assert adagrad["verdict"] == "fail" and adagrad["reference_first_break_step"] == 0
    failures = adagrad["expectation"]["failures"]
    assert "ebc.embedding_bags.dp_sum.momentum1 from step 0: only in the reference (TorchRec holds no tensor of that name)" in failures
    assert any(f.startswith("ebc.embedding_bags.dp_sum.weight leaves the tolerance (rtol 1e-05 / atol 1e-06) at step 1;")
               for f in failures), failures
    assert len(failures) == len(set(f.split(" ")[0] for f in failures))  # one line per tensor


REPORT_BATCHES = r"""
import sys, torch
# A report's own inputs, written with plain torch.save: 2 ranks x 2 bags, features f0 and f1.
steps = [([1, 2, 3, 9, 9, 9], [2, 1, 0, 3], [19, 4], [0, 1, 0, 1]),
         ([0, 5], [1, 0, 1, 0], [7, 7, 7], [3, 0, 0, 0])]
for step, (v0, l0, v1, l1) in enumerate(steps):
    # keys in another order than the model's: the reader puts them in model order
    torch.save({"keys": ["f1", "f0"], "values": torch.tensor(v1 + v0), "lengths": torch.tensor(l1 + l0),
                "stride": 4}, "%s/batch%d.pt" % (sys.argv[1], step))
print("ok", torch.__version__)
"""

REPLAY = """version: 1
name: replay-report
world_size: 2
batch_size: 2
steps: 2
tables:
  - {name: t0, rows: 10, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
  - {name: t1, rows: 20, dim: 4, features: [f1], sharding: {types: [row_wise]}}
optimizers: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
data: {from: batches}
matrix:
  system: [reference, torchrec==1.9.2]
expect:
  - {when: {system: reference}, replicas: equal, global_model: true, outputs: {rtol: 0, atol: 0}}
  - {when: {system: torchrec==1.9.2}, replicas: equal, reference: {profile: release, rtol: 0, atol: 0}, outputs: {rtol: 1.0e-6, atol: 0}}
"""


def test_a_reports_own_batches_replay_on_the_release_and_the_reference(tmp_path):
    """`data: {from: DIR}` reads batches torch.save wrote (torch 2.2, 0.6.0's environment); the
    reference, its unsharded oracle and torchrec 1.9.2 all train on exactly them, bitwise alike,
    and --dump-batches writes them back unchanged."""
    need("0.6.0", "1.9.2")
    (tmp_path / "batches").mkdir()
    out = subprocess.run([os.path.join(ENVS, "torchrec-0.6.0", "bin", "python"), "-c", REPORT_BATCHES,
                          str(tmp_path / "batches")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("ok 2.2."), out.stdout + out.stderr
    (tmp_path / "replay.yaml").write_text(REPLAY)
    p = dmpcheck("run", str(tmp_path / "replay.yaml"), "--quiet", "--out", str(tmp_path / "r"),
                 "--dump-batches", str(tmp_path / "dump"))
    assert p.returncode == 0, p.stdout + p.stderr
    release = json.load(open(tmp_path / "r" / "replay-report" / "torchrec__1.9.2.json"))
    assert release["verdict"] == "pass" and {d["step"] for d in release["reference"]} == {0, 1, 2}
    # The forward's outputs against the reference's at the forward of each step: the pooled
    # embeddings bitwise (the same batches); the model's output is a matmul, which torch 2.14.1 and
    # Debian's libtorch 1.13 may round apart on some CPUs (measured: 2.98e-08, one ulp, at step 0
    # on an AVX-512 machine; bitwise on the machines before it), hence rtol 1e-6 for it.
    outputs = {(d["name"], d["step"]) for d in release["reference"] if not d["name"].startswith(("ebc.", "dense."))}
    assert outputs == {(n, s) for n in ("pooled_embeddings.f0", "pooled_embeddings.f1", "model_output") for s in (0, 1)}, outputs
    pooled = [d for d in release["reference"] if d["name"].startswith("pooled_embeddings.")]
    assert all(d["max_abs_diff"] == 0 and d["elements_differing"] == 0 for d in pooled), pooled
    check = ("import sys, torch\n"
             "for step in (0, 1):\n"
             "    mine = torch.load('%s/batch%d.pt' % (sys.argv[1], step))\n"
             "    for run in sys.argv[2:]:\n"
             "        back = torch.load('%s/batch%d.pt' % (run, step))\n"
             "        assert back['keys'] == ['f0', 'f1'] and back['stride'] == 4, back\n"
             "        n1 = int(mine['lengths'][:4].sum())  # f1 comes first in the report's file\n"
             "        assert torch.equal(back['values'], torch.cat([mine['values'][n1:], mine['values'][:n1]]))\n"
             "        assert torch.equal(back['lengths'], torch.cat([mine['lengths'][4:], mine['lengths'][:4]]))\n"
             "print('ok')\n")
    runs = sorted(glob.glob(str(tmp_path / "dump" / "replay-report" / "*")))
    assert len(runs) == 2, runs
    out = subprocess.run([os.path.join(ENVS, "torchrec-1.9.2", "bin", "python"), "-c", check, str(tmp_path / "batches"), *runs],
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stdout + out.stderr
    # Zero steps: the forward alone on the first batch, on both sides, compared at step 0.
    with_keys(tmp_path / "replay.yaml", REPLAY, {("steps",): 0})
    p = dmpcheck("run", str(tmp_path / "replay.yaml"), "--quiet", "--out", str(tmp_path / "r0"))
    assert p.returncode == 0, p.stdout + p.stderr
    release = json.load(open(tmp_path / "r0" / "replay-report" / "torchrec__1.9.2.json"))
    assert {(d["name"], d["step"]) for d in release["reference"] if d["name"] == "model_output"} == {("model_output", 0)}
    # A batch the run cannot use is a clean error naming the file.
    with_keys(tmp_path / "replay.yaml", REPLAY, {("batch_size",): 3})
    p = dmpcheck("run", str(tmp_path / "replay.yaml"), "--quiet", "--out", str(tmp_path / "bad"))
    assert p.returncode != 0
    assert "batch0.pt: holds 4 bags per feature; this run needs batch_size 3 x world_size 2 = 6" in p.stdout + p.stderr


SHARED = """version: 1
name: shared-feature
world_size: 2
steps: 3
batch_size: 4
init: {mode: seeded, seed: 7}
data: {seed: 5, ids_per_bag: [0, 3]}
tables:
  - {name: a, rows: 20, dim: 4, features: [f_shared], sharding: {types: [table_wise]}}
  - {name: b, rows: 12, dim: 8, features: [f_shared, f_b], pooling: mean, sharding: {types: [row_wise]}}
  - {name: c, rows: 16, dim: 4, features: [f_shared], sharding: {types: [data_parallel]}}
dense: {layers: [1]}
optimizers: {sparse: {type: adagrad, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
system: torchrec==1.9.2
expect:
  - replicas: equal
    reference: {profile: release, start: seed, rtol: 0, atol: 0}
    outputs: {rtol: 1.0e-6, atol: 1.0e-7}
"""


def test_a_feature_several_tables_read_agrees_with_the_release(tmp_path):
    """f_shared feeds three tables: TorchRec names the lookups f_shared@a, f_shared@b, f_shared@c,
    and every weight, optimizer state and pooled embedding is bitwise the reference's under
    torchrec-1.9 (which divides the other tables' outputs beside the row_wise mean table, as
    1.9.2 does); the model output's last bit follows the BLAS."""
    need("1.9.2")
    (tmp_path / "shared.yaml").write_text(SHARED)
    p = dmpcheck("run", str(tmp_path / "shared.yaml"), "--quiet", "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.load(open(tmp_path / "r" / "shared-feature" / "default.json"))
    pooled = {d["name"]: d for d in result["reference"] if d["name"].startswith("pooled_embeddings.")}
    assert {n.split(".", 1)[1] for n in pooled} == {"f_shared@a", "f_shared@b", "f_shared@c", "f_b"}, pooled.keys()
    assert all(d["elements_differing"] == 0 for d in result["reference"] if d["name"] != "model_output"), result["reference"]


@pytest.mark.parametrize("file,world,optimizer,steps", [
    # Under `reference: {profile: release}` the reference trains as torchrec 1.9.2 does, bitwise.
    ("sharding", 2, "rowwise_adagrad", 3),
    # At world size 3 Gloo's ring adds three ranks' dense gradients in an order that depends on
    # where each element sits in DDP's bucket; DDP rebuilds its bucket in backward order after two
    # steps.  The reference lays its buckets out alike, so 10 steps of row_wise Adagrad stay
    # bitwise (they did not, in one element of dense.0.weight, before it did).
    ("row_wise", 3, "adagrad", 10),
], ids=lambda v: str(v))
def test_the_profile_of_the_release_agrees_bit_for_bit(tmp_path, file, world, optimizer, steps):
    need("1.9.2")
    scenario = with_keys(tmp_path / "bitwise.yaml", f"fidelity/{file}.yaml",
                         {("steps",): steps, WORLD_SIZE: [world], SPARSE_OPTIMIZER: [optimizer]})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / f"fidelity-{file.replace('_', '-')}" / f"{optimizer}_{world}.json"))
    assert {d["step"] for d in r["reference"]} == set(range(steps + 1))
    differing = not_bitwise(r, allowed=())
    assert differing == [], differing


def test_weight_decay_mode_reaches_fbgemm_which_ignores_it_on_cpu(tmp_path):
    """Row-wise Adagrad's weight_decay_mode reaches FBGEMM's fused kernels (it used to be dropped at
    the boundary, and nothing said so): their modules hold L2 or DECOUPLE as the scenario names.
    What that found: FBGEMM's CPU kernel (1.9.0, and 0.6.0 alike, measured on the kernel alone too)
    applies no weight decay in any mode, so the release trains exactly as with mode none, while the
    reference, which applies FBGEMM's formula for each mode, leaves it from step 1."""
    need("1.9.2")
    release = {"profile": "release", "start": "seed", "rtol": 1.0e-5, "atol": 1.0e-6}
    scenario = with_keys(tmp_path / "decay.yaml", "fidelity/sharding.yaml", {
        ("steps",): 3,
        ("optimizers", "sparse"): {"type": "rowwise_adagrad", "lr": 0.1, "weight_decay": 0.05},
        ("matrix",): {"optimizers.sparse.weight_decay_mode": ["none", "l2", "decoupled"], "world_size": [2]},
        ("expect",): [{"when": {"optimizers.sparse.weight_decay_mode": "none"}, "reference": release},
                      {"reference": dict(release, match=False)}]})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    digests = {}
    for mode, held in (("none", None), ("l2", "L2"), ("decoupled", "DECOUPLE")):
        r = json.load(open(tmp_path / "reports" / "fidelity-sharding" / f"{mode}_2.json"))
        if held:
            assert any(f"weight_decay_mode {mode} handed to FBGEMM" in n and n.endswith(f"its kernels hold {held}")
                       for n in r["system"]["notes"]), r["system"]["notes"]
            # The reference decays the model-parallel tables; the release does not.
            assert r["reference_first_break_step"] == 1, r["reference_first_break_step"]
        else:
            assert not_bitwise(r, allowed=()) == [], not_bitwise(r, allowed=())
        digests[mode] = {k: v for k, v in r["digests"].items() if ".tw_" in k or ".cw_" in k}
    assert digests["none"] == digests["l2"] == digests["decoupled"], "FBGEMM's CPU kernel now decays: update the finding"


def test_a_deeper_mlp_is_bitwise_when_the_reference_has_torchs_blas(tmp_path):
    """Three Linear layers make every embedding gradient a dot product.  Built against torch's own
    libtorch (ci/torch2.sh: MKL, as the wheels TorchRec runs on) the reference is bitwise with
    torchrec 1.9.2; built against Debian's libtorch 1.13 (generic BLAS) the dot products are added
    in another order, and Adagrad shows it in the last bits -- bounded, never more."""
    need("1.9.2")
    scenario = with_keys(tmp_path / "dense.yaml", "fidelity/dense.yaml", {WORLD_SIZE: [2], SPARSE_OPTIMIZER: ["adagrad"]})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "fidelity-dense" / "adagrad_2.json"))
    assert {d["step"] for d in r["reference"]} == set(range(6))
    differing = not_bitwise(r, allowed=())
    built = dmpcheck("--version").stdout
    assert "built against libtorch" in built, built
    if "libtorch 1." in built:
        assert differing, "Debian's libtorch 1.13 was bitwise here: the note in docs/fidelity.md is out of date"
        assert all(d["within_tolerance"] for d in r["reference"]), r["reference"]
    else:
        assert differing == [], differing


def test_sequence_tables_agree_with_the_release_bitwise(tmp_path):
    """Sequence tables (pooling: none) run in TorchRec's EmbeddingCollection on the release; the
    reference computes them as sum-pooled tables (the model sums each bag's rows).  table_wise,
    column_wise and row_wise on 1.9.2: every weight and optimizer state bitwise, from TorchRec's
    initial draw (the EBC's tables drawn before the EmbeddingCollection's) on."""
    need("1.9.2")
    example = "scenarios/examples/sequence_tables.yaml"
    scenario = with_keys(tmp_path / "seq.yaml", example, {
        WORLD_SIZE: [2], ("dense", "layers"): [1],
    }, add={("matrix", "system"): ["torchrec==1.9.2"],
            ("expect", 0, "reference"): {"profile": "release", "start": "seed", "rtol": 1.0e-5, "atol": 1.0e-6}},
        drop=[("tables", table_index(example, "dp_seq")),  # 1.9.2 fails it on CPU
              ("expect", 0, "global_model")])
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "example-sequence-tables" / "2_torchrec__1.9.2.json"))
    assert any("EmbeddingCollection" in n for n in r["system"]["notes"]), r["system"]["notes"]
    names = {d["name"] for d in r["reference"]}
    assert {"ebc.embedding_bags.tw_seq.weight", "ebc.embedding_bags.rw_seq.momentum1", "pooled_embeddings.f_cw_seq"} <= names, names
    # Not bitwise, by construction: the Linear's forward (BLAS), and a row_wise table's bag sum,
    # which the EmbeddingCollection leaves to the model (rows added in id order) while the
    # reference adds each shard's partial sum.  Both within the tolerance (the run passed).
    differing = not_bitwise(r, allowed=("model_output", "pooled_embeddings.f_rw_seq"))
    assert differing == [], differing


FP16_TABLES = """version: 1
name: fp16
world_size: 2
steps: 4
batch_size: 4
init: {mode: seeded, seed: 16}
data: {seed: 5, ids_per_bag: [0, 3]}
tables:
  - {name: tw16, rows: 40, dim: 8, features: [f_tw], data_type: fp16, sharding: {types: [table_wise]}}
  - {name: cw16, rows: 30, dim: 8, features: [f_cw], data_type: fp16, pooling: mean, sharding: {types: [column_wise], column_shards: 2}}
  - {name: rw16, rows: 50, dim: 8, features: [f_rw], data_type: fp16, sharding: {types: [row_wise]}}
  - {name: dp32, rows: 20, dim: 8, features: [f_dp], sharding: {types: [data_parallel]}}
dense: {layers: [1]}
optimizers:
  sparse: {type: sgd, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
matrix:
  optimizers.sparse.type: [sgd, adagrad, rowwise_adagrad]
  system: [torchrec==1.9.2]
expect:
  - reference: {profile: release, start: seed, rtol: 1.0e-3, atol: 1.0e-4}
    outputs: {rtol: 1.0e-3, atol: 1.0e-4}
"""


def test_fp16_tables_agree_with_the_release_bitwise(tmp_path):
    """fp16 tables: drawn in fp32 and rounded, read into fp32, and updated as FBGEMM's CPU kernels
    round fp16 rows (SGD/Adagrad: w = h(w + h(step)); row-wise Adagrad: h(w + step), its mean
    square summed in order).  Every weight, state and pooled embedding bitwise with 1.9.2."""
    need("1.9.2")
    scenario = tmp_path / "fp16.yaml"
    scenario.write_text(FP16_TABLES)
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    for opt in ("sgd", "adagrad", "rowwise_adagrad"):
        r = json.load(open(tmp_path / "reports" / "fp16" / f"{opt}_torchrec__1.9.2.json"))
        assert any("weights held as torch.float16" in n for n in r["system"]["notes"]), r["system"]["notes"]
        assert {d["step"] for d in r["reference"]} == set(range(5))
        differing = not_bitwise(r)
        assert differing == [], (opt, differing)


def test_explain_prints_the_plan_of_the_releases_own_planner(tmp_path):
    """`explain --release` asks the release's planner (no training) and says whether it agrees: it does."""
    need("1.9.2")
    scenario = with_keys(tmp_path / "plan.yaml", "fidelity/sharding.yaml", {
        WORLD_SIZE: [3], SPARSE_OPTIMIZER: ["sgd"], ("expect",): [{"replicas": "equal"}]}, drop=[("system",)])
    p = dmpcheck("explain", str(scenario), "--release", "1.9.2")
    assert p.returncode == 0, p.stdout + p.stderr
    # dmpcheck's planner places shards as TorchRec's does (its partitioner's rule, measured).
    assert "own planner places them differently" not in p.stdout, p.stdout
    theirs = p.stdout.split("own planner places every shard as above:")[1]
    # What torchrec 1.9.2 chose when it ran this model at world size 3 (meta.json of a real run).
    assert re.search(r"tw_sum +table_wise +1: 64x8 @0,0", theirs), theirs
    assert re.search(r"tw_mean +table_wise +2: 37x8 @0,0", theirs), theirs
    assert re.search(r"cw_mean +column_wise +2: 37x4 @0,0; 0: 37x4 @0,4", theirs), theirs
    # The release plans the scenario's topology (2 hosts x 1 rank here), as the reference does: the
    # planner was once handed one host whatever the scenario said.
    hosts = with_keys(tmp_path / "hosts.yaml", scenario.read_text(), {
        WORLD_SIZE: [2], **{("tables", i, "sharding"): {"types": ["table_row_wise"]} for i in (0, 1)}},
        add={("topology",): {"local_world_size": 1}})
    p = dmpcheck("explain", str(hosts), "--release", "1.9.2")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "own planner places them differently" not in p.stdout, p.stdout
    p = dmpcheck("explain", str(scenario), "--release", "9.9.9")
    assert p.returncode != 0 and "torchrec 9.9.9 is not installed" in p.stdout + p.stderr, p.stdout + p.stderr


def test_side_by_side_suite_plots_the_difference_in_a_real_browser(tmp_path):
    """The HTML report draws the per-step difference from the reference (headless Chromium runs its script)."""
    need("1.9.2")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (ci/setup.sh installs it)")
    scenario = with_keys(tmp_path / "side.yaml", "fidelity/sharding.yaml",
                         {("steps",): 3, WORLD_SIZE: [2], SPARSE_OPTIMIZER: ["sgd"]})
    p = dmpcheck("suite", str(scenario), "--out", str(tmp_path / "suite"))
    assert p.returncode == 0, p.stdout + p.stderr
    report_dir = re.search(r"reports: (\S+)/junit.xml", p.stdout).group(1)
    summary = open(os.path.join(report_dir, "summary.md")).read()
    assert "### TorchRec against the reference DMP" in summary
    assert "| fidelity-sharding [optimizers.sparse.type=sgd world_size=2] | real torchrec 1.9.2" in summary
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000", "--dump-dom",
                          "file://" + os.path.join(report_dir, "report.html")], capture_output=True, text=True, timeout=120)
    canvas = re.search(r'<canvas id="against-reference"[^>]*>', dom.stdout)
    assert canvas, dom.stdout[:2000]
    assert "box-sizing: border-box" in canvas.group(0), canvas.group(0)  # Chart.js drew it
    assert 'id="broadcast-cost"' not in dom.stdout  # no broadcast in this suite: no empty plot


LOAD_CHECK = r"""
import sys, torch
rank0, full, batch = sys.argv[1:4]
for path in (rank0, full, batch):
    plain = torch.load(path)  # the default: weights_only=True from torch 2.6 on
    strict = torch.load(path, weights_only=True)
    assert type(plain) is dict and sorted(plain) == sorted(strict), path
ck = torch.load(rank0)
assert ck["format"] == "dmpcheck-sharded-v1" and ck["rank"] == 0
for piece in ck["pieces"]:
    assert isinstance(piece["tensor"], torch.Tensor) and all(isinstance(n, int) for n in piece["full_sizes"])
state = torch.load(full)["state_dict"]
# A shard of rank 0, read back by torch, sits where its offsets say in the gathered tensor.
for piece in ck["pieces"]:
    if piece["sharding"] != "column_wise" or piece["tensor"].dim() != 2:
        continue
    r, c = piece["row_offset"], piece["col_offset"]
    rows, cols = piece["tensor"].shape
    assert torch.equal(state[piece["name"]][r:r + rows, c:c + cols], piece["tensor"]), piece["name"]
b = torch.load(batch)
assert int(b["lengths"].sum()) == b["values"].numel() and all(isinstance(k, str) for k in b["keys"])
print("ok", torch.__version__)
"""


def test_artifacts_open_with_plain_torch_load(tmp_path):
    """Checkpoints, gathered checkpoints and batch dumps open with plain torch.load(path) in the
    releases' own torch (2.2 and 2.14: weights_only=True is the default from 2.6 on)."""
    need("0.6.0", "1.9.2")
    scenario = os.path.join(ROOT, "scenarios", "examples", "column_wise.yaml")
    p = dmpcheck("run", scenario, "--quiet", "--out", str(tmp_path / "r"), "--checkpoint-dir", str(tmp_path / "c"),
                 "--dump-batches", str(tmp_path / "b"))
    assert p.returncode == 0, p.stdout + p.stderr
    run_dir = sorted(glob.glob(str(tmp_path / "c" / "*" / "*")))[0]
    full = str(tmp_path / "full.pt")
    p = dmpcheck("checkpoint", "gather", run_dir, full)
    assert p.returncode == 0, p.stdout + p.stderr
    batch = sorted(glob.glob(str(tmp_path / "b" / "*" / "*" / "batch0.pt")))[0]
    for release, torch_version in (("0.6.0", "2.2."), ("1.9.2", "2.14.")):
        python = os.path.join(ENVS, "torchrec-" + release, "bin", "python")
        out = subprocess.run([python, "-c", LOAD_CHECK, run_dir + "/rank0.pt", full, batch], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.startswith("ok " + torch_version), out.stdout


def test_missing_release_is_skipped_with_the_install_command(tmp_path):
    p = dmpcheck("run", SEED, "--quiet", "--out", str(tmp_path), env={"DMPCHECK_TORCHREC_ENVS": str(tmp_path / "none")})
    assert p.returncode == 0, p.stdout + p.stderr
    # Said once, with the one command that installs every release the file names (and in each report).
    assert re.search(r"dmpcheck: \d+ cell\(s\) of torchrec-1739-dp-tables-not-broadcast skipped: torchrec .*0\.6\.0.* "
                     r"not installed here \(bash ci/torchrec-env\.sh .*0\.6\.0", p.stdout), p.stdout
    assert "SKIPPED -" not in p.stdout
    report = json.load(open(tmp_path / "torchrec-1739-dp-tables-not-broadcast" / "seeded_torchrec__0.6.0.json"))
    assert "run `bash ci/torchrec-env.sh 0.6.0`" in report["skip_reason"], report["skip_reason"]


def test_release_that_fails_to_import_is_a_failed_rank(tmp_path):
    """A broken environment (torchrec does not import) is reported like any failed rank: exit 3."""
    envs = tmp_path / "envs"
    broken = envs / "torchrec-1.9.2"
    (broken / "bin").mkdir(parents=True)
    os.symlink(sys.executable, broken / "bin" / "python")  # a real Python without torch
    # Marked ready (the probe's answer, as the installer writes it), and since broken.
    shutil.copy(os.path.join(ROOT, "fixtures", "contract", "probe_answer.json"), broken / "dmpcheck-ready.json")
    exchange = tmp_path / "tmp"
    exchange.mkdir()
    p = dmpcheck("run", SEED, "--quiet", "--out", str(tmp_path / "reports"),
                 env={"DMPCHECK_TORCHREC_ENVS": str(envs), "TMPDIR": str(exchange)})
    assert p.returncode == 3, p.stdout + p.stderr
    # Both ranks fail alike; whichever the launcher reaps first is named (rank 1 under load).
    assert re.search(r"ERROR - rank [01] exited with status 3: ModuleNotFoundError: No module named 'torch'",
                     p.stdout), p.stdout
    assert [p for p in exchange.iterdir() if p.name.startswith("dmpcheck-")] == []
    # This test's ranks (their interpreter is the broken environment's), not other runs' on the machine.
    left = subprocess.run(["pgrep", "-f", str(broken / "bin" / "python")], capture_output=True, text=True).stdout
    assert left == "", "TorchRec ranks left running: " + left


LONG = """version: 1
name: long-release-run
system: torchrec==0.6.0
world_size: 2
steps: 3000
batch_size: 4
timeout_s: 5
data: {seed: 3, ids_per_bag: [1, 2]}
tables:
  - {name: t0, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
  - {name: t1, rows: 16, dim: 4, features: [f1], sharding: {types: [table_wise]}}
dense: {layers: [1]}
optimizers: {sparse: {type: sgd, lr: 0.1}, dense: {type: sgd, lr: 0.1}}
"""


def _tagged(tag):
    """{pid: (name, environ)} of the processes whose environment carries DMPCHECK_TEST_TAG=tag."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = open("/proc/%s/environ" % entry, "rb").read().split(b"\0")
            name = open("/proc/%s/comm" % entry).read().strip()
            state = open("/proc/%s/stat" % entry).read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ("DMPCHECK_TEST_TAG=" + tag).encode() in environ and state != "Z":
            out[int(entry)] = (name, environ)
    return out


def _release_ranks(tag):
    """{rank: pid} of a tagged run's TorchRec ranks: exec-ed ones (`python -m dmpcheck_torchrec.rank`,
    RANK in their environment) or ones forked from a warm interpreter (named dmpcheck-r<rank>)."""
    ranks = {}
    for pid, (name, environ) in _tagged(tag).items():
        if name.startswith("dmpcheck-r") and name[len("dmpcheck-r"):].isdigit():
            ranks[int(name[len("dmpcheck-r"):])] = pid
        elif b"dmpcheck_torchrec.rank" in open("/proc/%d/cmdline" % pid, "rb").read():
            ranks[int([e for e in environ if e.startswith(b"RANK=")][0][5:])] = pid
    return ranks


def _start_long_run(tmp_path, env=None):
    """A long release run; returns (process, {rank: pid}) once rank 1 has finished its first step."""
    scenario = tmp_path / "long.yaml"
    scenario.write_text(LONG)
    exchange = tmp_path / "tmp"
    exchange.mkdir()
    tag = "dmpcheck-test-%d" % os.getpid()
    env = dict(os.environ, TMPDIR=str(exchange), DMPCHECK_TEST_TAG=tag, **(env or {}))
    proc = subprocess.Popen([DMPCHECK, "run", str(scenario), "--quiet", "--out", str(tmp_path / "reports")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 120
    while time.time() < deadline and not glob.glob(str(exchange / "dmpcheck-torchrec-*" / "out" / "rank1" / "step1.json")):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    ranks = _release_ranks(tag)
    assert sorted(ranks) == [0, 1], ranks
    return proc, ranks, exchange, tag


def _assert_nothing_left(exchange, tag):
    """No exchange folder, and no process of the run (a rank, a warm interpreter) is left."""
    assert [p for p in exchange.iterdir() if p.name.startswith("dmpcheck-")] == []
    deadline = time.time() + 10  # a killed dmpcheck's interpreter ends its ranks as it notices
    while _tagged(tag) and time.time() < deadline:
        time.sleep(0.05)
    assert _tagged(tag) == {}


def test_release_rank_that_crashes_is_named(tmp_path):
    """A TorchRec rank killed mid-run (a real SIGKILL to the real process): named rank, cause, exit 3, nothing left."""
    need("0.6.0")
    proc, ranks, exchange, tag = _start_long_run(tmp_path)
    os.kill(ranks[1], signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert "ERROR - rank 1 killed by signal 9 (SIGKILL)" in out, out
    _assert_nothing_left(exchange, tag)


def test_release_rank_that_hangs_is_timed_out(tmp_path):
    """A TorchRec rank stopped mid-run (SIGSTOP: it hangs): its peer's collective times out after timeout_s
    and the cell fails with exit 3, naming the stopped rank (issue 46, item 13: it named rank 0's
    timeout), rank 0's own words after it; the stopped rank is killed and reaped."""
    need("0.6.0")
    proc, ranks, exchange, tag = _start_long_run(tmp_path)
    os.kill(ranks[1], signal.SIGSTOP)
    start = time.time()
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    assert ("ERROR - rank 1 was stopped (state T: SIGSTOP or SIGTSTP) and never resumed: rank 0 gave up waiting "
            "for it: it exited with status 3: RuntimeError") in out, out
    assert "imed out" in out or "imeout" in out, out
    assert time.time() - start < 60, "the hang was not cut by timeout_s"
    _assert_nothing_left(exchange, tag)


@pytest.mark.parametrize("ranks", ["warm", "exec"])
def test_dmpcheck_stopped_or_killed_mid_release_run_leaves_nothing(tmp_path, ranks):
    """Ctrl-C (SIGINT) to dmpcheck mid-run: exit 130; SIGKILL: nothing can run in it, yet its ranks and
    its warm interpreter go too.  On both paths: ranks forked from the warm interpreter, and exec-ed."""
    need("0.6.0")
    env = {"DMPCHECK_RANKS": "exec"} if ranks == "exec" else {}
    for sig, status in ((signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)):
        run_dir = tmp_path / sig.name
        run_dir.mkdir()
        proc, _, exchange, tag = _start_long_run(run_dir, env)
        names = {name for name, _ in _tagged(tag).values()}
        if ranks == "warm":  # dmpcheck, its warm interpreter (named after the python), two ranks
            assert {"dmpcheck-r0", "dmpcheck-r1"} <= names and len(_tagged(tag)) == 4, names
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == status, out
        if sig == signal.SIGKILL:
            # Nothing ran in it to remove its private folders (issue 46, item 7): the next dmpcheck
            # does, naming each, since their maker is gone.
            left = sorted(p.name for p in exchange.iterdir() if p.name.startswith("dmpcheck-"))
            assert left, "a SIGKILLed run leaves its folders for the next dmpcheck"
            deadline = time.time() + 10  # its warm interpreter ends once it notices
            while _tagged(tag) and time.time() < deadline:
                time.sleep(0.05)
            p = dmpcheck("validate", SEED, env={"TMPDIR": str(exchange)})
            assert p.returncode == 0, p.stdout + p.stderr
            for name in left:
                assert "removed %s, left by a dmpcheck that was killed" % (exchange / name) in p.stderr, p.stderr
        _assert_nothing_left(exchange, tag)


def test_release_error_names_rank_and_cause(tmp_path):
    """row_wise on CPU/Gloo is not available in 0.6.0: the release's own error, exit 3."""
    need("0.6.0")
    scenario = with_keys(tmp_path / "rw.yaml", "fidelity/row_wise.yaml",
                         {WORLD_SIZE: [2], SPARSE_OPTIMIZER: ["sgd"], ("system",): "torchrec==0.6.0"})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert "reduce_scatter" in p.stdout, p.stdout


def test_a_release_is_held_against_its_own_unsharded_model(tmp_path):
    """global_model on a release cell: the release's modules unsharded, on the global batches.

    With SGD everywhere, every table of every sharding type (and the outputs) tracks the unsharded
    model at 2 and 3 ranks; with Adagrad as the sparse optimizer the data-parallel tables do not:
    the sharded model trains them with the dense SGD, the unsharded one with the Adagrad applied in
    backward (unfiled-dp-tables-drop-in-backward-optimizer, now seen on the release alone)."""
    need("1.9.2")
    tolerance = {"rtol": 1.0e-5, "atol": 1.0e-6}
    scenario = with_keys(tmp_path / "oracle.yaml", "fidelity/sharding.yaml", {
        ("steps",): 2, SPARSE_OPTIMIZER: ["sgd", "adagrad"],
        ("expect",): [{"global_model": tolerance, "outputs": tolerance}]})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 1, p.stdout + p.stderr
    reports = tmp_path / "reports" / "fidelity-sharding"
    for world in (2, 3):
        sgd = json.load(open(reports / ("sgd_%d.json" % world)))
        assert sgd["verdict"] == "pass" and sgd["global_model_checked"], sgd["expectation"]
        names = {g["name"] for g in sgd["global_model"]}
        assert {"ebc.embedding_bags.%s.weight" % t for t in ("tw_sum", "cw_mean", "dp_sum")} <= names
        assert {"model_output", "pooled_embeddings.f_cw_sum", "dense.0.weight"} <= names
        adagrad = json.load(open(reports / ("adagrad_%d.json" % world)))
        out = {g["name"] for g in adagrad["global_model"] if not g["within_tolerance"]}
        assert "ebc.embedding_bags.dp_sum.weight" in out and "ebc.embedding_bags.dp_mean.weight" in out, out
        assert not any(n.startswith("ebc.embedding_bags.tw_") or n.startswith("ebc.embedding_bags.cw_") for n in out), out
        assert adagrad["verdict"] == "fail"


def test_uneven_batches_per_rank_end_the_cell_naming_the_rank(tmp_path):
    """torchrec: {batches_per_rank}: rank 1 runs out of data a batch early. On Gloo that is no
    silent hang: rank 1's next collective meets rank 0's all-to-all, Gloo aborts the rank that
    receives the mismatched data (rank 0 or rank 1, as the messages race; both seen here), and
    the cell ends (well inside its 600 s budget) as that rank's crash, named, in Gloo's words."""
    need("1.9.2")
    scenario = tmp_path / "uneven.yaml"
    scenario.write_text("""version: 1
name: uneven
system: torchrec==1.9.2
world_size: 2
steps: 2
batch_size: 4
init: {mode: seeded, seed: 3}
data: {seed: 3, ids_per_bag: [1, 2]}
tables:
  - {name: t0, rows: 16, dim: 4, features: [f0], sharding: {types: [table_wise]}}
dense: {layers: [1]}
torchrec: {loop: train_pipeline_sparse_dist, batches_per_rank: [2, 1]}
""")
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"), timeout=300)
    assert p.returncode == 3, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "uneven" / "default.json"))
    assert r["verdict"] == "error" and r["failure"]["rank"] in (0, 1), r["failure"]
    assert r["failure"]["kind"] == "crashed" and "op.preamble.length <= op.nbytes" in r["failure"]["message"], r["failure"]


def test_a_checkpoint_resumes_on_another_world_size_under_another_plan(tmp_path):
    """resume on a release cell: saved through torch.distributed.checkpoint at world size 2 with
    both tables table_wise, loaded by three fresh ranks with table_0 row_wise, two more steps on the
    same global batches.  From the step it resumed after on, every tensor of the resumed run is
    held against the uninterrupted run and against the release's unsharded model; a resumed run
    that had not loaded the fused optimizer's state would leave both at step 3."""
    need("1.9.2")
    example = os.path.join(ROOT, "scenarios", "examples", "release_checkpoint_reshard.yaml")
    p = dmpcheck("run", example, "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "release_checkpoint_reshard" / "default.json"))
    assert r["verdict"] == "pass" and r["resumed_compared"] and r["resumed_world_size"] == 3, r["expectation"]
    names = {g["name"] for g in r["resumed"]}
    assert {"ebc.embedding_bags.table_0.weight", "ebc.embedding_bags.table_0.momentum1",
            "dense.0.weight.exp_avg"} <= names, names
    assert all(g["within_tolerance"] for g in r["resumed"] + r["global_model"])
    assert any(g["step"] == 4 for g in r["global_model"]) and len(r["losses"]) == 4, r["losses"]
    notes = "\n".join(r["system"]["notes"])
    assert "resumed on 3 ranks under the release's plan table_0 row_wise, table_1 table_wise" in notes, notes
    # The report holds both plans: the first run's, and the one it resumed under, shard by shard.
    assert [(t["table"], t["sharding"]) for t in r["plan"]] == [("table_0", "table_wise"), ("table_1", "table_wise")]
    resumed = {t["table"]: t for t in r["resumed_plan"]}
    assert resumed["table_0"]["sharding"] == "row_wise" and resumed["table_1"]["sharding"] == "table_wise", resumed
    assert sorted(s["rank"] for s in resumed["table_0"]["shards"]) == [0, 1, 2], resumed
    # The same checkpoint loaded without the fused optimizer's state: the check sees it at once.
    broken = broken_sut(tmp_path, "checkpoint.py", 'if f"optim.state.{param}.{n}" in saved',
                        'if n in ("exp_avg", "exp_avg_sq", "step")')
    p = dmpcheck("run", example, "--quiet", "--out", str(tmp_path / "broken-reports"),
                 env={"DMPCHECK_TORCHREC_SUT": str(broken)})
    assert p.returncode == 1, p.stdout + p.stderr
    r = json.load(open(tmp_path / "broken-reports" / "release_checkpoint_reshard" / "default.json"))
    out = {g["name"] for g in r["resumed"] if not g["within_tolerance"]}
    assert {"ebc.embedding_bags.table_0.momentum1", "ebc.embedding_bags.table_0.weight"} <= out, out


RESUME_WITHOUT_OPTIMIZER_STATE = """version: 1
name: resume-rank-without-optimizer-state
world_size: 2
steps: 4
batch_size: 3
init: {mode: seeded, seed: 7}
data: {seed: 3, ids_per_bag: [1, 3]}
tables:
  - {name: table_0, rows: 24, dim: 8, features: [f0], sharding: {types: [table_wise]}}
dense: {layers: [4, 1]}
optimizers:
  sparse: {type: adagrad, lr: 0.1}
  dense: {type: sgd, lr: 0.01}
resume: {after_step: 2}
matrix:
  system: [torchrec==0.6.0, torchrec==1.9.2]
expect:
  - replicas: equal
    global_model: {rtol: 1.0e-5, atol: 1.0e-6}
    resumed: {rtol: 1.0e-5, atol: 1.0e-6}
"""


def test_a_rank_that_holds_no_optimizer_state_resumes(tmp_path):
    """Issue 46, item 15: one table_wise table on two ranks and a dense optimizer without state, so
    rank 1 holds no optimizer state. Resuming failed on 1.9.2 ("Missing key in checkpoint
    state_dict: optim.") and on 0.6.0 (KeyError: 'optim'), with no plan change: the rank program's
    bug (it asked DCP for an empty {"state": {}}, which DCP reads as a value of its own), not
    TorchRec's. Both releases now resume and match the uninterrupted run."""
    need("0.6.0", "1.9.2")
    scenario = tmp_path / "resume.yaml"
    scenario.write_text(RESUME_WITHOUT_OPTIMIZER_STATE)
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    for release in ("0.6.0", "1.9.2"):
        r = json.load(open(tmp_path / "reports" / "resume-rank-without-optimizer-state" / ("torchrec__%s.json" % release)))
        assert r["verdict"] == "pass" and r["resumed_compared"], (release, r["expectation"])


EC_PER_ID = """version: 1
name: ec-per-id
world_size: 2
steps: 2
batch_size: 4
init: {mode: seeded, seed: 41}
data: {seed: 4, ids_per_bag: [0, 3]}
tables:
  - {name: tw_seq, rows: 40, dim: 8, features: [f_tw], pooling: none, sharding: {types: [table_wise]}}
  - {name: rw_seq, rows: 30, dim: 8, features: [f_rw], pooling: none, sharding: {types: [row_wise]}}
  - {name: cw_seq, rows: 20, dim: 8, features: [f_cw, f_tw], pooling: none, sharding: {types: [column_wise]}}
  - {name: bag, rows: 20, dim: 4, features: [f_bag], sharding: {types: [table_wise]}}
dense: {layers: [1]}
optimizers:
  sparse: {type: adagrad, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
system: torchrec==1.9.2
expect:
  - replicas: equal
    global_model: {rtol: 1.0e-5, atol: 1.0e-6}
    outputs: {rtol: 1.0e-5, atol: 1.0e-6}
"""


def test_sequence_outputs_are_compared_id_by_id_in_every_sharding_type(tmp_path):
    """An EmbeddingCollection's output is a row per id: each id's row (sequence_embeddings.<feature>)
    is held against the release's own unsharded model in table_wise, row_wise and column_wise, not
    only each bag's sum, with a feature two of its tables read (TorchRec names those outputs
    <feature>@<table>).  A rank program that returns each bag's rows in reverse order (every bag sum
    the same) is caught by those rows alone."""
    need("1.9.2")
    scenario = tmp_path / "ec.yaml"
    scenario.write_text(EC_PER_ID)
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "ec-per-id" / "default.json"))
    per_id = {g["name"]: g for g in r["global_model"] if g["name"].startswith("sequence_embeddings.")}
    want = ["sequence_embeddings.f_cw", "sequence_embeddings.f_rw", "sequence_embeddings.f_tw@cw_seq",
            "sequence_embeddings.f_tw@tw_seq"]
    assert sorted(per_id) == want, sorted(per_id)
    assert all(g["within_tolerance"] for g in per_id.values()), per_id
    anchor = "                pooled[f] = sum_bags(rows, sequences[f].lengths())\n"
    broken = broken_sut(tmp_path, "models.py", anchor, anchor + (
        "                if type(self.ec).__name__.startswith('Sharded'):\n"
        "                    lengths = sequences[f].lengths().long()\n"
        "                    per_id[f] = torch.cat([b.flip(0) for b in torch.split(rows, lengths.tolist())])\n"))
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "broken-reports"),
                 env={"DMPCHECK_TORCHREC_SUT": str(broken)})
    assert p.returncode == 1, p.stdout + p.stderr
    r = json.load(open(tmp_path / "broken-reports" / "ec-per-id" / "default.json"))
    out = sorted(g["name"] for g in r["global_model"] if not g["within_tolerance"])
    assert out == want, out


def test_variable_batches_reach_the_release_as_vbe_and_train_as_their_expansion(tmp_path):
    """data.features.<f>.stride_per_rank: each rank hands TorchRec fewer distinct bags than its
    batch, with stride_per_key_per_rank and inverse_indices (the note says what the KJT held), and
    the sharded model matches the unsharded one trained on the expansion, in the plain loop and the
    pipeline; 0.6.0's FBGEMM refuses them on CPU (the example's expectations).  A rank program that
    hands TorchRec the wrong inverse indices is caught.  What 1.9.2 refuses, each in its own words:
    a data_parallel table, and fused Adagrad."""
    need("0.6.0", "1.9.2")
    example = "scenarios/examples/variable_batch.yaml"
    p = dmpcheck("run", os.path.join(ROOT, example), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "example-variable-batch" / "torchrec__1.9.2_plain.json"))
    notes = r["system"]["notes"]
    assert any("variable batch per feature (VBE" in n and "f_tw 2, f_cw 1, f_full 4 of 4" in n for n in notes), notes
    anchor = "        inverse_indices=(list(b.keys), torch.tensor(b.inverse_indices, dtype=torch.int64).reshape(keys, bags)))"
    broken = broken_sut(tmp_path, "dump.py", anchor, anchor.replace(".reshape(keys, bags)", ".reshape(keys, bags).flip(1)"))
    one = with_keys(tmp_path / "one.yaml", example, {("matrix",): {"system": ["torchrec==1.9.2"]}})
    p = dmpcheck("run", str(one), "--quiet", "--out", str(tmp_path / "broken-reports"),
                 env={"DMPCHECK_TORCHREC_SUT": str(broken)})
    assert p.returncode == 1, p.stdout + p.stderr
    r = json.load(open(tmp_path / "broken-reports" / "example-variable-batch" / "torchrec__1.9.2.json"))
    assert not all(g["within_tolerance"] for g in r["global_model"]), r["global_model"]
    refused = with_keys(tmp_path / "refused.yaml", example, {
        ("matrix",): {"system": ["torchrec==1.9.2"], "optimizers.sparse.type": ["sgd", "adagrad"]},
        ("tables", table_index(example, "cw"), "sharding"): {"types": ["data_parallel"]}})
    p = dmpcheck("run", str(refused), "--quiet", "--out", str(tmp_path / "refused-reports"))
    assert p.returncode == 3, p.stdout + p.stderr  # a rank failed, in every cell
    reports = tmp_path / "refused-reports" / "example-variable-batch"
    messages = {f.name: json.load(open(f))["failure"]["message"] for f in reports.glob("*.json")}
    assert len(messages) == 2, messages
    assert any("Tensors must have same number of dimensions: got 1 and 2" in m for m in messages.values()), messages
    assert any("Variable batch size TBE support is enabled for" in m for m in messages.values()), messages


EC_VBE = """version: 1
name: ec-vbe
world_size: 2
steps: 3
batch_size: 4
init: {mode: seeded, seed: 12}
data:
  seed: 6
  ids_per_bag: [0, 3]
  features: {f_seq: {stride_per_rank: 4}}
tables:
  - {name: tw_seq, rows: 30, dim: 8, features: [f_seq], pooling: none, sharding: {types: [table_wise]}}
dense: {layers: [4, 1]}
optimizers:
  sparse: {type: sgd, lr: 0.1}
  dense: {type: sgd, lr: 0.1}
system: torchrec==1.9.2
expect:
  - global_model: {rtol: 1.0e-5, atol: 1.0e-6}
    outputs: {rtol: 1.0e-5, atol: 1.0e-6}
"""


def test_a_sequence_table_given_the_batch_as_vbe_leaves_its_unsharded_model_on_1_9_2(tmp_path):
    """scenarios/regressions/unfiled-ec-variable-batch-does-not-train-on-cpu.yaml at its plainest:
    1.9.2's sharded EmbeddingCollection handed the very batch the plain EC trains exactly, only as
    VBE (every key its full stride, inverse indices 0..3), re-indexes its rows through
    fbgemm::permute_1D_sparse_data, which has no autograd kernel on CPU: every output of every step
    here matches the unsharded model, yet the table's weights leave it within three steps.  The
    same cell with the batch as a plain KJT matches."""
    need("1.9.2")
    for name, drop in (("vbe", []), ("plain", [("data", "features")])):
        scenario = with_keys(tmp_path / f"{name}.yaml", EC_VBE, drop=drop)
        p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / name))
        r = json.load(open(tmp_path / name / "ec-vbe" / "default.json"))
        out = sorted({g["name"] for g in r["global_model"] if not g["within_tolerance"]})
        if name == "plain":
            assert p.returncode == 0 and out == [], p.stdout + p.stderr
            continue
        assert any("variable batch per feature" in n for n in r["system"]["notes"]), r["system"]["notes"]
        assert p.returncode == 1 and "ebc.embedding_bags.tw_seq.weight" in out, (out, p.stdout + p.stderr)
        assert out == ["ebc.embedding_bags.tw_seq.weight"], out  # every output of every step matches


def test_the_dense_sides_rowwise_adagrad_is_each_releases_own_arithmetic(tmp_path):
    """optimizers.dense.type rowwise_adagrad: torchrec.optim.RowWiseAdagrad over the data-parallel
    table and the Linear's weight, Adagrad over the bias, on 0.6.0 and 1.9.2, each held against the
    reference under its release's profile; 0.6.0 only matches because the profile's
    dense_rowwise_adagrad_mean_gradient models its row mean gradient (turned off, it differs)."""
    need("0.6.0", "1.9.2")
    example = "scenarios/examples/dense_rowwise_adagrad.yaml"
    p = dmpcheck("run", os.path.join(ROOT, example), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    for release in ("0.6.0", "1.9.2"):
        r = json.load(open(tmp_path / "reports" / "example-dense-rowwise-adagrad" / f"torchrec__{release}.json"))
        names = {d["name"] for d in r["reference"]}
        assert {"dense.0.weight.sum", "dense.0.bias.sum", "ebc.embedding_bags.dp.weight.sum"} <= names, names
    off = with_keys(tmp_path / "off.yaml", example, {("matrix", "system"): ["torchrec==0.6.0"]},
                    add={("profile",): {"base": "torchrec-0.6", "dense_rowwise_adagrad_mean_gradient": False}},
                    drop=[("expect", 1, "reference", "profile")])
    p = dmpcheck("run", str(off), "--quiet", "--out", str(tmp_path / "off-reports"))
    assert p.returncode == 1, p.stdout + p.stderr
    r = json.load(open(tmp_path / "off-reports" / "example-dense-rowwise-adagrad" / "torchrec__0.6.0.json"))
    assert any(d["name"] == "dense.0.weight" and d["max_abs_diff"] > 0.1 for d in r["reference"]), r["reference"]


def test_eval_passes_between_epochs_train_nothing_and_uneven_ones_end_naming_the_rank(tmp_path):
    """torchrec: {eval_batches}: after every epoch an eval pass over the same pipeline (model.eval(),
    progress() under no_grad until StopIteration, then model.train()), as users validate between
    epochs (TorchRec #2670's loop).  Both epochs and both eval passes execute every batch, and the
    training still equals the unsharded model's (an eval pass that trained would leave it).  With
    uneven eval counts per rank the cell ends at once as a named rank's crash, not a hang."""
    need("1.9.2")
    text = """version: 1
name: evalpass
system: torchrec==1.9.2
world_size: 2
steps: 4
timeout_s: 60
batch_size: 4
init: {mode: seeded, seed: 26}
data: {seed: 2670, ids_per_bag: [1, 3]}
tables:
  - {name: t0, rows: 24, dim: 8, features: [f0], sharding: {types: [table_wise]}}
  - {name: t1, rows: 16, dim: 8, features: [f1], sharding: {types: [column_wise]}}
dense: {layers: [1]}
torchrec: {loop: train_pipeline_sparse_dist, epochs: 2, eval_batches: EVAL}
expect:
  - global_model: {rtol: 1.0e-5, atol: 1.0e-6}
    loop: {batches: 2, eval_batches: 2, next_after_exhausted: 0}
"""
    scenario = with_keys(tmp_path / "eval.yaml", text, {("torchrec", "eval_batches"): 2})
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "evalpass" / "default.json"))
    assert [l["eval_batches"] for l in r["loops"]] == [[2, 2], [2, 2]], r["loops"]
    assert any(g["step"] == 4 for g in r["global_model"]), r["global_model"]
    with_keys(scenario, text, {("torchrec", "eval_batches"): [2, 1]})
    started = time.monotonic()
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "uneven"), timeout=300)
    assert p.returncode == 3 and time.monotonic() - started < 60, p.stdout + p.stderr
    r = json.load(open(tmp_path / "uneven" / "evalpass" / "default.json"))
    assert r["failure"]["rank"] in (0, 1) and "collective mismatch" in r["failure"]["message"], r["failure"]


def seed_on(systems, expect, modes=("unseeded",)):
    """The seed scenario's text with its matrix replaced: `systems` x init `modes`, and `expect`."""
    text = open(SEED).read()
    text = re.sub(r"(?ms)^reproduces:.*?\n\n", "", text)
    text = re.sub(r"(?ms)^matrix:.*", "", text)
    return text + "matrix:\n  init.mode: [%s]\n  system: [%s]\nexpect:\n%s" % (
        ", ".join(modes), ", ".join(json.dumps(s) for s in systems), expect)


def test_a_users_interpreter_is_a_system_and_one_that_cannot_import_torchrec_is_named(tmp_path):
    """`system: python:/path`: a venv made here whose site-packages reach 1.9.2's runs the seed like
    the release; a bare venv is an error naming the import that failed, before any rank starts."""
    need("1.9.2")
    good, bad = tmp_path / "good", tmp_path / "bad"
    for venv in (good, bad):
        subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    release_site = glob.glob(os.path.join(ENVS, "torchrec-1.9.2", "lib", "python3*", "site-packages"))[0]
    good_site = glob.glob(str(good / "lib" / "python3*" / "site-packages"))[0]
    with open(os.path.join(good_site, "release.pth"), "w") as f:
        f.write(release_site + "\n")
    scenario = tmp_path / "seed.yaml"
    scenario.write_text(seed_on(["python:%s/bin/python" % good, "python:%s/bin/python" % bad], "  - replicas: equal\n"))
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 3, p.stdout + p.stderr
    good_line = [l for l in p.stdout.splitlines() if l.startswith("VERDICT") and str(good) in l][0]
    assert "PASS - all replicated tensors equal" in good_line and "on real torchrec 1.9.2 (torch 2.14.1" in good_line
    bad_line = [l for l in p.stdout.splitlines() if l.startswith("VERDICT") and str(bad) in l][0]
    assert ("ERROR - no rank started: python:%s/bin/python cannot run TorchRec cells, which need torch, fbgemm_gpu "
            "and torchrec to import there: import torch failed: ModuleNotFoundError: No module named 'torch'" % bad
            in bad_line), bad_line
    report = json.load(open(glob.glob(str(tmp_path / "reports" / "*" / "*good*.json"))[0]))
    assert report["system"]["name"] == "python:%s/bin/python" % good
    assert report["system"]["torchrec"] == "1.9.2" and report["system"]["simulated"] is False


def test_an_environment_another_dmpcheck_marked_ready_is_asked_again(tmp_path):
    """dmpcheck-ready.json is the probe's answer, a contract document.  One an older installer wrote
    (plain versions) is not trusted: the environment is probed again and marked anew, and one that
    no longer imports is skipped naming the import and the command that rebuilds it."""
    need("1.9.2")
    envs = tmp_path / "envs"
    release_site = glob.glob(os.path.join(ENVS, "torchrec-1.9.2", "lib", "python3*", "site-packages"))[0]
    old_marker = '{"torchrec": "1.9.2", "torch": "2.14.1+cu130", "fbgemm_gpu": "1.9.0", "python": "3.11.2"}'
    venv = envs / "torchrec-1.9.2"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    site = glob.glob(str(venv / "lib" / "python3*" / "site-packages"))[0]
    with open(os.path.join(site, "release.pth"), "w") as f:
        f.write(release_site + "\n")
    (venv / "dmpcheck-ready.json").write_text(old_marker)
    scenario = tmp_path / "seed.yaml"
    scenario.write_text(seed_on(["torchrec==1.9.2"], "  - replicas: equal\n"))
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"), env={"DMPCHECK_TORCHREC_ENVS": str(envs)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert "dmpcheck-ready.json is not this dmpcheck's probe answer" in p.stderr, p.stderr
    assert "PASS - all replicated tensors equal" in p.stdout, p.stdout
    marker = json.loads((venv / "dmpcheck-ready.json").read_text())
    assert marker["schema_version"] >= 2 and marker["versions"]["torchrec"] == "1.9.2", marker
    # Probed once: the next run reads the new marker as it is.
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"), env={"DMPCHECK_TORCHREC_ENVS": str(envs)})
    assert p.returncode == 0 and "probe answer" not in p.stderr, p.stdout + p.stderr
    # Without the release's packages the probe fails: the cell is skipped, saying why and what to type.
    os.remove(os.path.join(site, "release.pth"))
    (venv / "dmpcheck-ready.json").write_text(old_marker)
    p = dmpcheck("run", str(scenario), "--quiet", "--out", str(tmp_path / "reports"), env={"DMPCHECK_TORCHREC_ENVS": str(envs)})
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("SKIPPED - torchrec 1.9.2's environment %s cannot run TorchRec cells, which need torch, fbgemm_gpu and "
            "torchrec to import there: import torch failed: ModuleNotFoundError: No module named 'torch': run "
            "`bash ci/torchrec-env.sh 1.9.2` again" % venv) in p.stdout, p.stdout


def torchrec_repo():
    """TorchRec's repository for commit systems: $DMPCHECK_TORCHREC_REPO, else the clone beside the checkout."""
    given = os.environ.get("DMPCHECK_TORCHREC_REPO")
    bundle = os.path.join(ROOT, "..", "shared", "torchrec.bundle")
    if given:
        return given
    if os.path.exists(bundle):
        return os.path.abspath(bundle)
    pytest.skip("no TorchRec repository: set DMPCHECK_TORCHREC_REPO (a clone, a URL or a bundle)")


def test_bisect_over_commits_names_the_fix_and_runs_each_commits_own_source(tmp_path):
    """The seed's fix, cc482f8 "Broadcast DP tables when init", found among the commits just before
    it, each commit's source over a release's environment; the report of a commit cell says which
    commit it ran, and a commit the repository lacks is named."""
    need("0.7.0")
    repo = torchrec_repo()
    envs = {"DMPCHECK_TORCHREC_REPO": repo}
    scenario = tmp_path / "seed.yaml"
    scenario.write_text(seed_on(["torchrec==0.7.0"], "  - replicas: equal\n"))
    p = dmpcheck("bisect", str(scenario), "--commit-range", "cc482f8~3..cc482f8", "--out", str(tmp_path / "bisect"),
                 env=envs)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "each its source over the torchrec 0.7.0 environment" in p.stdout
    assert 'first commit that behaves differently: cc482f8a "Broadcast DP tables when init" (2024-04-10)' in p.stdout
    assert re.search(r"\[init.mode=unseeded\] 9b1f395b: replicas DIVERGE on 4 tensor\(s\).*->  cc482f8a: replicas "
                     r"equal", p.stdout), p.stdout
    report = json.load(open(glob.glob(str(tmp_path / "bisect" / "bisect-commits" / "*" / "*.json"))[0]))
    assert re.match(r"[0-9a-f]{8} \(.*; its source over the torchrec 0.7.0 environment\)", report["system"]["torchrec"])
    # Forked from the environment's warm interpreter, which imported no TorchRec (the rank program
    # checks that the torchrec it imported is the commit's source, else the cell fails).
    assert any(re.match(r"ranks forked from a warm interpreter of this environment that imported torch and "
                        r"fbgemm_gpu once for the command \(in [0-9.]+ s\) and no TorchRec: each rank imports this "
                        r"commit's source$", n) for n in report["system"]["notes"]), report["system"]["notes"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(seed_on(["torchrec@0000000"], "  - replicas: equal\n"))
    p = dmpcheck("run", str(bad), "--quiet", "--out", str(tmp_path / "run"), env=envs)
    assert "TorchRec's repository" in p.stdout and "has no commit '0000000'" in p.stdout, p.stdout + p.stderr


def test_the_references_quantized_lookup_is_the_releases_bitwise(tmp_path):
    """The reference's quantized lookup (check/quantized_lookup.h: FBGEMM's row-wise quantization
    and its CPU inference kernels' arithmetic, written anew) on the release's trained weights is
    bitwise the release's own, for int8, int4, int2 and fp16 tables with weighted features, and
    with mixed sum and mean pooling; 0.6.0's mislabelled keys (PR #1646) are not."""
    need("0.6.0", "0.7.0", "1.9.2")
    runs = []
    for scenario in (os.path.join(ROOT, "scenarios", "examples", "quantized_lookup.yaml"),
                     os.path.join(ROOT, "scenarios", "regressions", "torchrec-1646-quantized-ebc-mixed-pooling.yaml")):
        p = dmpcheck("run", scenario, "--quiet", "--out", str(tmp_path / "r"),
                     "--filter", r"torchrec==(0\.6\.0|0\.7\.0|1\.9\.2)")
        assert p.returncode == 0, p.stdout + p.stderr
    for path in sorted(glob.glob(str(tmp_path / "r" / "*" / "*.json"))):
        report = json.load(open(path))
        if "quantized_reference" not in report:
            continue
        runs.append(report["run"])
        assert report["quantized_reference_compared"], path
        checks = report["quantized_reference"]
        assert {c["name"] for c in checks} == {"pooled_embeddings.f0", "pooled_embeddings.f1", "pooled_embeddings.f2"}
        if report["system"]["torchrec"] == "0.6.0":
            assert not any(c["within_tolerance"] for c in checks), checks
        else:
            assert all(c["within_tolerance"] and c["max_abs_diff"] == 0 for c in checks), (path, checks)
    assert len(runs) == 7, runs


def test_managed_collision_state_is_held_to_the_release_s_own_unsharded_modules(tmp_path):
    """MC-EBC and MC-EC tables, evicting inside the run, rows uneven over 2 ranks: every MCH
    module's state (sorted raw ids, their rows, counters) equals TorchRec's own modules unsharded,
    exactly, and the replicated state (iteration counter, output segments) is equal across ranks.
    Two faults in the oracle's stand-in for the sharded MCH module show: ids routed to another
    rank's rows change the MCH state; rows evicted but not re-drawn change the weights only."""
    need("1.9.2")
    example = os.path.join(ROOT, "scenarios", "examples", "managed_collision.yaml")
    args = ("run", example, "--quiet", "--filter", r"torchrec==1\.9\.2")
    p = dmpcheck(*args, "--out", str(tmp_path / "ok"))
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.load(open(tmp_path / "ok" / "managed_collision" / "torchrec__1.9.2.json"))
    checks = {c["name"]: c for c in report["global_model"]}
    tables = ("bag_lfu", "bag_dlfu", "seq_lru", "seq_dlfu")
    for table in tables:
        for buffer in ("mch_sorted_raw_ids", "mch_remapped_ids_mapping", "current_iter_tensor", "output_segments_tensor"):
            assert checks[f"mc.{table}.{buffer}"]["max_abs_diff"] == 0, (table, buffer, checks)
    assert all(c["within_tolerance"] for c in checks.values()), checks
    replicated = {c["name"] for c in report["replicas"]}
    assert {f"mc.{t}.current_iter_tensor" for t in tables} <= replicated, replicated

    def failing(anchor, replacement, name):
        broken = broken_sut(tmp_path / name, "models.py", anchor, replacement)
        q = dmpcheck(*args, "--out", str(tmp_path / name / "r"), env={"DMPCHECK_TORCHREC_SUT": str(broken)})
        assert q.returncode != 0, q.stdout
        got = json.load(open(tmp_path / name / "r" / "managed_collision" / "torchrec__1.9.2.json"))
        return {c["name"] for c in got["global_model"] if not c["within_tolerance"]}

    rerouted = failing('owner = torch.div(values, self.block, rounding_mode="floor")', "owner = values % len(self.parts)",
                       "rerouted")
    assert any(n.startswith("mc.") and n.endswith(".mch_sorted_raw_ids") for n in rerouted), rerouted
    kept = failing("                if rows is not None:\n                    self.on_evict(b, rows)",
                   "                pass", "kept")
    assert kept and not any(n.startswith("mc.") for n in kept), kept


def test_quantized_sequence_tables_are_the_references_lookup_bitwise(tmp_path):
    """Sequence tables quantized for inference (torchrec.quant's EmbeddingCollection, by
    quantize_embeddings as users map it): each id's row within its own row's bound of the float
    model, bitwise the reference's dequantized row, and sharded for inference bitwise with
    unsharded, beside a quantized pooled table."""
    need("1.9.2")
    p = dmpcheck("run", os.path.join(ROOT, "scenarios", "examples", "quantized_sequence.yaml"), "--quiet",
                 "--out", str(tmp_path), "--filter", r"torchrec==1\.9\.2")
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.load(open(tmp_path / "quantized_sequence" / "torchrec__1.9.2.json"))
    names = {"sequence_embeddings.g0", "sequence_embeddings.g1", "sequence_embeddings.g2", "pooled_embeddings.f0"}
    for key in ("quantized", "quantized_reference", "quantized_sharded"):
        assert report[key + "_compared"], key
        assert {c["name"] for c in report[key]} == names, (key, report[key])
    assert all(c["within_tolerance"] for c in report["quantized"]), report["quantized"]
    # The quantization shows (no row is exact), and stays within its bound.
    assert all(c["max_abs_diff"] > 0 for c in report["quantized"]), report["quantized"]
    for key in ("quantized_reference", "quantized_sharded"):
        assert all(c["max_abs_diff"] == 0 for c in report[key]), (key, report[key])
