"""Bad input is stopped before a rank starts, through the real CLI."""
import json
import os
import re
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

GOOD = """version: 1
name: small-good
world_size: 2
tables:
  - {name: t, rows: 8, dim: 4, features: [f], sharding: {types: [table_wise]}}
"""


def cli(dmpcheck_bin, *args, cwd=None):
    return subprocess.run([dmpcheck_bin, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_validate_reports_every_error_of_a_file(dmpcheck_bin, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\nworld_size: 0\nsteps: -1\ntables:\n  - {name: t, rows: 0, dim: 4, features: [f]}\n")
    p = cli(dmpcheck_bin, "validate", str(bad))
    assert p.returncode == 2
    assert "3 errors:" in p.stderr, p.stderr
    for line in (3, 4, 6):
        assert "%s:%d: field" % (bad, line) in p.stderr, p.stderr


def test_a_model_over_the_hosts_memory_never_starts_a_rank(dmpcheck_bin, tmp_path):
    huge = tmp_path / "huge.yaml"
    huge.write_text("version: 1\nname: huge\ntables:\n"
                    "  - {name: t, rows: 1000000000000, dim: 1024, features: [f], sharding: {types: [data_parallel]}}\n")
    for command in ("validate", "run"):
        p = cli(dmpcheck_bin, command, str(huge), cwd=str(tmp_path))
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert re.search(r"would hold about [0-9.]+ PiB at their peak .* but this host has [0-9.]+ [GMT]iB available", p.stderr), p.stderr
        assert "[rank" not in p.stdout  # no rank started
        assert "Exception raised from" not in p.stderr  # no libtorch backtrace


def test_a_plan_that_cannot_be_met_is_invalid_for_validate(dmpcheck_bin, tmp_path):
    cw = tmp_path / "cw.yaml"
    cw.write_text("version: 1\nname: cw\ntopology: {memory_per_rank: 100}\ntables:\n"
                  "  - {name: t, rows: 10, dim: 10, features: [f], sharding: {types: [column_wise], column_shards: 2}}\n")
    p = cli(dmpcheck_bin, "validate", str(cw))
    assert p.returncode == 2
    assert "table 't' (10 x 10) fits nowhere: column_wise would put 400 bytes on rank 0 (limit 100)" in p.stderr, p.stderr


def test_column_shards_are_torchrecs_min_partition(dmpcheck_bin, tmp_path):
    """dim 10 in 3: TorchRec's min_partition 3 has no multiple of 4 dividing 10, so one shard of 10."""
    cw = tmp_path / "cw.yaml"
    cw.write_text("version: 1\nname: cw\ntables:\n"
                  "  - {name: t, rows: 10, dim: 10, features: [f], sharding: {types: [column_wise], column_shards: 3}}\n"
                  "  - {name: u, rows: 10, dim: 16, features: [g], sharding: {types: [column_wise], column_shards: 8}}\n")
    p = cli(dmpcheck_bin, "explain", str(cw))
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"t +column_wise +0: 10x10 @0,0 ", p.stdout), p.stdout
    # u first (more storage: four shards' buffers), its shards alternating; then t on the tie, rank 0.
    assert re.search(r"u +column_wise +0: 10x4 @0,0; 1: 10x4 @0,4; 0: 10x4 @0,8; 1: 10x4 @0,12 ", p.stdout), p.stdout


def test_a_resumes_second_plan_is_in_explain_and_in_the_report(dmpcheck_bin, tmp_path):
    """`resume` plans the model again after its step: `explain` prints that plan after the first one,
    and the run's JSON report holds it as resumed_plan, shard by shard."""
    resumed = tmp_path / "resumed.yaml"
    resumed.write_text("version: 1\nname: resumed\nworld_size: 2\nsteps: 2\nbatch_size: 4\n"
                       "tables:\n  - {name: t, rows: 10, dim: 4, features: [f], sharding: {types: [data_parallel]}}\n"
                       "resume: {after_step: 1, sharding: {t: {types: [row_wise]}}}\n"
                       "expect:\n  - replicas: equal\n")
    p = cli(dmpcheck_bin, "explain", str(resumed))
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"t +data_parallel +every rank: 10x4 .*\n  after step 1, resumed on 2 ranks under:\n.*\n"
                     r"  t +row_wise +0: 5x4 @0,0; 1: 5x4 @5,0 ", p.stdout), p.stdout
    p = cli(dmpcheck_bin, "run", str(resumed), "--quiet", "--out", str(tmp_path / "reports"))
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.load(open(tmp_path / "reports" / "resumed" / "default.json"))
    assert [(t["table"], t["sharding"]) for t in r["plan"]] == [("t", "data_parallel")], r["plan"]
    assert [(t["table"], t["sharding"], [(s["rank"], s["rows"]) for s in t["shards"]]) for t in r["resumed_plan"]] \
        == [("t", "row_wise", [(0, 5), (1, 5)])], r["resumed_plan"]


def test_a_command_line_the_parser_refuses_is_bad_input(dmpcheck_bin):
    """Exit 2, as docs/errors.md says of bad input, not the parser's own statuses (105 and up)."""
    p = cli(dmpcheck_bin, "bench", "--backend", "mpi")
    assert p.returncode == 2 and "--backend: mpi not in {gloo,nccl}" in p.stderr, (p.returncode, p.stderr)
    p = cli(dmpcheck_bin, "run", "--ranks", "threads", "x.yaml")
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert cli(dmpcheck_bin, "bench", "--help").returncode == 0


def test_suite_filter_judges_only_what_it_selected(dmpcheck_bin, tmp_path):
    d = tmp_path / "scenarios"
    d.mkdir()
    (d / "good.yaml").write_text(GOOD)
    (d / "broken.yaml").write_text("version: 1\nname: broken\ntables: 3\n")
    selected = cli(dmpcheck_bin, "suite", str(d), "--filter", "small-good", "--out", str(tmp_path / "a"))
    assert selected.returncode == 0, selected.stdout + selected.stderr
    assert "1 of 1 run(s) met their expectations" in selected.stdout, selected.stdout
    assert "invalid scenario" not in selected.stdout
    everything = cli(dmpcheck_bin, "suite", str(d), "--out", str(tmp_path / "b"))
    assert everything.returncode == 2, everything.stdout
    assert "invalid scenario: " in everything.stdout and "broken.yaml:3" in everything.stdout
    named = cli(dmpcheck_bin, "suite", str(d), "--filter", "broken", "--out", str(tmp_path / "c"))
    assert named.returncode == 2, named.stdout


def test_a_name_cannot_write_outside_the_directories_given(dmpcheck_bin, tmp_path):
    """Issue 46, item 2: `name: ../../../x` once wrote the report, checkpoints and batches outside
    --out, --checkpoint-dir and --dump-batches; it is refused with the line, and nothing is written."""
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    bad = work / "bad.yaml"
    bad.write_text(GOOD.replace("name: small-good", "name: ../../../x"))
    p = cli(dmpcheck_bin, "run", str(bad), "--out", str(work / "out"), "--checkpoint-dir", str(work / "ck"),
            "--dump-batches", str(work / "batches"))
    assert p.returncode == 2, p.stdout + p.stderr
    assert "%s:2: field 'name': expected at most 100 letters" % bad in p.stderr, p.stderr
    assert sorted(os.listdir(tmp_path)) == ["a"] and not (tmp_path / "x").exists()
    assert sorted(os.listdir(work)) == ["bad.yaml"]


def test_numbers_that_are_not_finite_or_too_large_are_refused(dmpcheck_bin, tmp_path):
    """Issue 46, items 5 and 12: `atol: inf`, `timeout_s: 1e308` and a budget of inf, nan, 1e308, -1
    or 0 were taken (the budget became "-9223372036854776 s"); each is refused, naming the value."""
    for field, says in (("timeout_s: 1e308", "field 'timeout_s': expected a finite number > 0.01 and <= 604800"),
                        ("expect: [{global_model: {atol: inf}}]",
                         "field 'expect[0].global_model.atol': expected a finite number >= 0")):
        f = tmp_path / "f.yaml"
        f.write_text(GOOD + field + "\n")
        p = cli(dmpcheck_bin, "validate", str(f))
        assert p.returncode == 2 and says in p.stderr, (field, p.stderr)
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    for command in ("run", "suite"):
        for budget in ("inf", "nan", "1e308", "-1", "0", "ten"):
            p = cli(dmpcheck_bin, command, str(good), "--budget", budget, "--out", str(tmp_path / "out"))
            assert p.returncode == 2, (command, budget, p.stdout, p.stderr)
            assert "expected seconds > 0 and <= 604800 (a week), got '%s'" % budget in p.stderr, p.stderr
            assert not (tmp_path / "out").exists()


def test_a_full_disk_is_said_and_the_verdict_is_still_printed(dmpcheck_bin, tmp_path):
    """Issue 46, item 4: a full TMPDIR aborted `dmpcheck run` (std::system_error from c10d's FileStore,
    exit 134, a directory left); a full --out lost the PASS.  An 8 KiB tmpfs, filled (root only)."""
    if os.geteuid() != 0:
        import pytest
        pytest.skip("mounting a tmpfs needs root")
    full = tmp_path / "full"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(full)], check=True)
    try:
        subprocess.run(["dd", "if=/dev/zero", "of=%s/fill" % full, "bs=1k", "count=8"], capture_output=True)
        good = tmp_path / "good.yaml"
        good.write_text(GOOD)
        env = dict(os.environ, TMPDIR=str(full))
        p = subprocess.run([dmpcheck_bin, "run", str(good), "--out", str(tmp_path / "out")], capture_output=True,
                           text=True, timeout=120, env=env)
        assert p.returncode == 2, p.stdout + p.stderr
        assert "cannot write in the temporary directory %s" % full in p.stderr, p.stderr
        assert "No space left on device" in p.stderr and "free space there or set TMPDIR" in p.stderr
        assert sorted(os.listdir(full)) == ["fill"]
        p = cli(dmpcheck_bin, "run", str(good), "--quiet", "--out", str(full / "out"))
        assert p.returncode == 2, p.stdout + p.stderr
        assert "VERDICT small-good [default]: PASS" in p.stdout, p.stdout
        assert "the report of this run was not written: writing %s/out/small-good/default.json: No space left" % full \
            in p.stderr, p.stderr
        assert "1 report(s) NOT written" in p.stdout + p.stderr
    finally:
        subprocess.run(["umount", str(full)], check=True)


def test_a_commit_cell_without_torchrecs_repository_is_the_command_lines_mistake(dmpcheck_bin, tmp_path):
    """Issue 46, item 13: each commit cell once failed on its own (exit 3) for a missing
    --torchrec-repo; it is said once, before any cell runs, with the repository's URL (exit 2)."""
    commit = tmp_path / "commit.yaml"
    commit.write_text(GOOD.replace("small-good", "commit-cell") +
                      'matrix:\n  system: [reference, "torchrec@cc482f8a over 0.7.0"]\n')
    env = {k: v for k, v in os.environ.items() if k != "DMPCHECK_TORCHREC_REPO"}
    for command in ("run", "suite"):
        p = subprocess.run([dmpcheck_bin, command, str(commit), "--out", str(tmp_path / command)],
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert "give --torchrec-repo PATH|URL|BUNDLE" in p.stderr and "https://github.com/pytorch/torchrec" in p.stderr
        assert "-- run" not in p.stdout and not (tmp_path / command).exists(), p.stdout


def test_a_filter_that_is_not_a_regular_expression_is_bad_input_for_run_and_suite(dmpcheck_bin, tmp_path):
    """Issue 44's defect: `suite --filter '('` exited 3 (an internal error) where `run` exits 2."""
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    for command in ("run", "suite"):
        p = cli(dmpcheck_bin, command, str(good), "--filter", "(", "--out", str(tmp_path / command))
        assert p.returncode == 2, (command, p.stdout, p.stderr)
        assert "--filter '(' is not a regular expression" in p.stderr, p.stderr


def test_sigint_and_sigterm_stop_a_command_while_it_loads_its_cells(dmpcheck_bin, tmp_path):
    """Issue 46, item 12: SIGINT and SIGTERM did nothing while a scenario's cells were read (10^4
    cells took 90 s; a file may now hold 1024, still seconds). The command stops between two cells
    and exits 130, saying where it stopped."""
    import signal
    import time
    f = tmp_path / "many.yaml"
    f.write_text(GOOD + "matrix:\n  steps: [%s]\n  batch_size: [%s]\n" %
                 (", ".join(str(s) for s in range(1, 33)), ", ".join(str(b) for b in range(1, 33))))
    for command, sig in (("validate", signal.SIGINT), ("run", signal.SIGTERM)):
        args = [dmpcheck_bin, command, str(f)] + (["--out", str(tmp_path / "out")] if command == "run" else [])
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)  # past the handler's installation (libtorch loads first); the cells take 12 s here
        sent = time.monotonic()
        p.send_signal(sig)
        out, err = p.communicate(timeout=120)
        took = time.monotonic() - sent
        assert p.returncode == 130, (command, p.returncode, out, err)
        assert "stopped while loading its cells (SIGINT or SIGTERM)" in err, err
        assert "file(s) invalid" not in err, err  # stopped, not invalid
        # Between two cells: far less than the whole file (measured in the note), never a rank started.
        assert took < 2.0, (command, took)
        assert not (tmp_path / "out").exists()
