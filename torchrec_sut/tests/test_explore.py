"""dmpcheck explore on a real release: a short seeded search writes minimised findings whose files
load and meet their own expectations, and its report adds up; a system that cannot run is said."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from test_torchrec_cells import dmpcheck, need  # noqa: E402


def test_a_short_search_writes_confirmed_minimised_findings(tmp_path):
    need("1.9.2")
    out = str(tmp_path / "explore")
    p = dmpcheck("explore", "--system", "torchrec==1.9.2", "--seed", "1", "--max-configs", "12", "--out", out)
    assert p.returncode == 1, p.stdout + p.stderr  # 1: findings written
    report = json.load(open(os.path.join(out, "explore.json")))
    counts = report["configurations"]
    assert counts["tried"] == 12
    assert counts["passed"] + counts["refused"] + counts["failing"] + counts["invalid"] == 12
    assert counts["invalid"] == 0, report["refusals"]
    assert report["findings"], report
    for f in report["findings"]:
        assert f["confirmed"], f
        assert os.path.exists(f["file"])
        v = subprocess.run([os.environ.get("DMPCHECK_BIN", "dmpcheck"), "validate", f["file"]],
                           capture_output=True, text=True)
        assert v.returncode == 0, v.stdout + v.stderr
    # The row-wise mean that divides the other tables (a bug of the library, found by hand once):
    needs = [set(f["traits"]) for f in report["findings"]]
    assert {"table row_wise mean", "table table_wise sum"} in [n & {"table row_wise mean", "table table_wise sum"}
                                                              for n in needs], needs
    assert "explore.md" in p.stdout
    # Grouped by what broke: every finding under its signature once, in the report and its page.
    groups = report["signatures"]
    assert sorted(f for g in groups for f in g["files"]) == sorted(f["file"] for f in report["findings"])
    assert len({g["signature"] for g in groups}) == len(groups)
    page = open(os.path.join(out, "explore.md")).read()
    for g in groups:
        assert "### %s (%d finding(s))" % (g["signature"], len(g["files"])) in page, page


def test_a_release_that_is_not_installed_is_said_before_any_search(tmp_path):
    p = dmpcheck("explore", "--system", "torchrec==0.6.1", "--max-configs", "3", "--out", str(tmp_path / "x"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert "cannot run the simplest configuration" in p.stdout
    p = dmpcheck("explore", "--system", "torchrec==1.9.2", "--budget", "soon", "--out", str(tmp_path / "x"))
    assert p.returncode == 2 and "--budget soon: expected a duration" in p.stderr, p.stdout + p.stderr


def test_sequence_tables_train_under_torchrecs_pipeline(tmp_path):
    """What a search found in dmpcheck's own driver: TorchRec's pipeline traces the model, and the
    model's handling of sequence tables branched on the batch (TraceError on 1.9.2, a Proxy given
    to arange on 0.8.0). Now opaque to the trace, the pipelined cell matches its unsharded model."""
    need("1.9.2")
    scenario = tmp_path / "seq.yaml"
    scenario.write_text("""version: 1
name: sequence-pipelined
world_size: 2
steps: 3
batch_size: 2
system: torchrec==1.9.2
data: {seed: 5, ids_per_bag: [1, 3]}
tables:
  - {name: t0, rows: 8, dim: 4, features: [f0], pooling: none, sharding: {types: [table_wise]}}
  - {name: t1, rows: 8, dim: 4, features: [f1], sharding: {types: [data_parallel]}}
torchrec: {loop: train_pipeline_sparse_dist}
expect:
  - replicas: equal
    global_model: {rtol: 1.0e-5, atol: 1.0e-6}
""")
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stdout + p.stderr


def test_an_interrupted_search_says_so_and_keeps_each_findings_own_verdict(tmp_path):
    """Issue 63, item 6: after SIGINT, explore's findings were labelled 'stopped while loading its cells'
    and 'does not meet its own expectations', and nothing said the search had been interrupted."""
    import glob
    import signal
    import time

    need("1.9.2")
    out = str(tmp_path / "explore")
    p = subprocess.Popen([os.environ.get("DMPCHECK_BIN", "dmpcheck"), "explore", "--system", "torchrec==1.9.2",
                          "--seed", "1", "--budget", "10m", "--out", out],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while not glob.glob(os.path.join(out, "findings", "*.yaml")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.5)
    assert glob.glob(os.path.join(out, "findings", "*.yaml")), "no finding within 300 s"
    p.send_signal(signal.SIGINT)
    text = p.communicate(timeout=120)[0]
    assert p.returncode == 130, text
    report = json.load(open(os.path.join(out, "explore.json")))
    assert report["interrupted"] is True
    assert report["findings"] and all(f["confirmed"] is None for f in report["findings"]), report["findings"]
    page = open(os.path.join(out, "explore.md")).read()
    assert "**Interrupted** (SIGINT or SIGTERM)" in page, page
    assert "its file was not run: the search was interrupted" in page
    assert "stopped while loading" not in page + text and "does NOT meet" not in page, page
    assert "explore: interrupted; what was found so far is written" in text
