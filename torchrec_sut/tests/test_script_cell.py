"""Script cells on real releases (issue 43): the user's own script, unchanged, run as torchrun runs it
under a release's environment, judged by dmpcheck's audit and by each rank's exit, output and
exception; its rendezvous opens no port.  Needs the release environments (bash ci/torchrec-env.sh
0.6.0 0.7.0 1.9.2); the loader's and the judge's own cases are harness/tests/unit/script_cell_test.cc.
"""
import hashlib
import json
import os
import re

from test_release_cell_hostile import _sample_while_running
from test_torchrec_cells import ROOT, TABLES, dmpcheck, need, torchrec_repo

REPORTER = os.path.join(ROOT, "benchmarks", "reporter-1739", "debug_dp_shard.py")
REPORTER_CELL = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1739-reporter-script.yaml")
RANKS = os.path.join(ROOT, "fixtures", "scripts", "ranks.py")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def report(out, name, slug):
    with open(os.path.join(out, name, slug + ".json")) as f:
        return json.load(f)


def script_scenario(tmp_path, args, expect, timeout_s=120, name="ranks"):
    path = tmp_path / (name + ".yaml")
    path.write_text("version: 1\nname: %s\nscript: {path: %s, args: %s}\nworld_size: 2\ntimeout_s: %d\n"
                    "system: torchrec==1.9.2\nexpect:\n%s" % (name, RANKS, json.dumps(args), timeout_s, expect))
    return str(path)


def test_the_reporters_script_unchanged_is_judged_by_the_audit_alone(tmp_path):
    """The seed's own script: the data-parallel tables diverge on 0.6.0 and 0.7.0 and are equal on
    1.9.2, from the audit's digests; the scenario reads no line of the script's output."""
    need("0.6.0", "0.7.0", "1.9.2")
    before = sha256(REPORTER)
    with open(REPORTER_CELL) as f:
        assert "output:" not in f.read()
    out = str(tmp_path / "r")
    p = dmpcheck("run", REPORTER_CELL, "--out", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert sha256(REPORTER) == before
    for release in ("0.6.0", "0.7.0"):
        r = report(out, "torchrec-1739-reporter-script", "torchrec__" + release)
        assert r["verdict"] == "pass" and r["system"]["torchrec"] == release
        diverged = sorted({c["name"] for c in r["replicas"] if not c["equal"]})
        assert diverged == sorted(TABLES), diverged
        assert {c["phase"] for c in r["replicas"] if not c["equal"]} == {"init", "final"}
        assert [d["tensors_differing"] for d in r["divergence"]] == [4]
        assert [x["ended"] for x in r["script_ranks"]] == ["exited 0", "exited 0"]
    r = report(out, "torchrec-1739-reporter-script", "torchrec__1.9.2")
    assert r["verdict"] == "pass" and all(c["equal"] for c in r["replicas"]) and len(r["replicas"]) >= 12
    # The script's own lines are kept per rank, as it printed them (its check prints True on 1.9.2).
    assert "ebc.embedding_bags.large_table_0.weight True" in r["script_ranks"][0]["output"]


def test_bisect_over_commits_on_the_reporters_script_names_the_fix(tmp_path):
    need("0.7.0")
    p = dmpcheck("bisect", REPORTER_CELL, "--commit-range", "cc482f8~3..cc482f8", "--out", str(tmp_path / "b"),
                 env={"DMPCHECK_TORCHREC_REPO": torchrec_repo()})
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'first commit that behaves differently: cc482f8a "Broadcast DP tables when init" (2024-04-10)' in p.stdout


def test_exit_output_and_exception_are_judged_per_rank(tmp_path):
    need("1.9.2")
    out = str(tmp_path / "r")
    held = script_scenario(tmp_path, ["--raise-on", "1"], """  - exit: {status: 1, rank: 1}
    exception: {type: ValueError, message: "a bad batch on rank 1", rank: 1}
    output:
      - {contains: "sum of ranks 1", rank: 0}
      - {matches: "^rank 1 of world_size: 2 \\\\(LOCAL_RANK 1, MASTER_PORT [0-9]+\\\\)$", rank: 1}
      - {contains: "a warning line"}
      - {lacks: "done", rank: 1}
""")
    p = dmpcheck("run", held, "--out", out)
    assert p.returncode == 0, p.stdout + p.stderr
    r = report(out, "ranks", "default")
    assert r["script_ranks"][1]["exception"] == "ValueError: a bad batch on rank 1"
    assert r["script_ranks"][1]["exit_status"] == 1
    # Judged wrong, each part says what it saw.
    wrong = script_scenario(tmp_path, ["--raise-on", "1"], """  - exit: {status: 1, rank: 0}
    exception: {type: KeyError, rank: 1}
    output: [{lacks: "sum of ranks"}]
""", name="wrong")
    p = dmpcheck("run", wrong, "--out", out)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "expected rank 1 to raise KeyError; seen rank 1: ValueError: a bad batch on rank 1" in p.stdout
    assert "rank 0's output contains 'sum of ranks', expected it lacking" in p.stdout


def test_a_failing_script_nothing_expects_is_the_cells_error_in_its_own_words(tmp_path):
    need("1.9.2")
    plain = script_scenario(tmp_path, ["--exit", "1", "7"], "  - replicas: equal\n")
    p = dmpcheck("run", plain, "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert "ERROR - rank 1 exited with status 7" in p.stdout, p.stdout


def test_a_hang_is_named_with_the_ranks_still_running(tmp_path):
    need("1.9.2")
    hung = script_scenario(tmp_path, ["--hang-on", "1"], "  - replicas: equal\n", timeout_s=20)
    p = dmpcheck("run", hung, "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert re.search(r"rank\(s\) [01, ]*1 still running after timeout_s = 20 s: a hang", p.stdout), p.stdout
    expected = script_scenario(tmp_path, ["--hang-on", "1"], "  - hang: true\n", timeout_s=20, name="expected")
    p = dmpcheck("run", expected, "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_a_scripts_rendezvous_opens_no_port_off_loopback(tmp_path):
    """torch's env:// rendezvous would open a TCPStore on MASTER_PORT on every interface: a script
    cell's is a FileStore in its private directory, and Gloo's pairs listen on loopback."""
    need("1.9.2")
    # Lingering 3 s with its process group up: a sample every 50 ms cannot miss Gloo's listeners.
    scenario = script_scenario(tmp_path, ["--linger", "3"], "  - exit: 0\n")
    status, out, seen = _sample_while_running(["run", scenario, "--out", str(tmp_path / "r")], {})
    assert status == 0, out
    assert seen, "no listening socket of the run was ever sampled: the sampling is broken"
    off_loopback = {a for a in seen if a[0] not in ("127.0.0.1", "::1")}
    assert not off_loopback, f"listening off loopback: {sorted(off_loopback)}"


def test_the_script_cell_example_passes(tmp_path):
    need("0.6.0", "1.9.2")
    p = dmpcheck("run", os.path.join(ROOT, "scenarios", "examples", "script_cell.yaml"), "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 of 2 run(s) met their expectations" in p.stdout


def test_bisect_names_the_commit_where_a_failing_script_starts_to_pass(tmp_path):
    """PR #1886's script exits 1 while the bug shows: the bug's expectation (exit and output) judges
    that run, not an error, so the search walks the commits and names the fix."""
    need("0.7.0")
    scenario = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1886-weighted-mean-pooling.yaml")
    p = dmpcheck("bisect", scenario, "--commit-range", "c589d380~2..c589d380", "--out", str(tmp_path / "b"),
                 env={"DMPCHECK_TORCHREC_REPO": torchrec_repo()})
    assert p.returncode == 0, p.stdout + p.stderr
    assert 'first commit that behaves differently: c589d380 "include kjt weights in mean pooling (#1886)"' in p.stdout
    assert "(as torchrec==0.7.0: bug)" in p.stdout
