"""The hostile inputs that were once accepted silently (issues 46 and 63), kept as a corpus: every
file under fixtures/hostile/scenario/ names on its first line (`# expect: TEXT`) the error `dmpcheck
validate` must give; a file that validates, crashes or says something else fails here.  Add a case by
adding a file.  fixtures/hostile/commands.tsv holds command lines refused the same way, before
anything runs (a repository git would read as an option, a duration or seed out of bounds)."""
import glob
import os
import shlex
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CASES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hostile", "scenario", "*.yaml")))
SEED = os.path.join(ROOT, "scenarios", "regressions", "torchrec-1739-dp-tables-not-broadcast.yaml")


def _commands():
    with open(os.path.join(ROOT, "fixtures", "hostile", "commands.tsv")) as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip() and not line.startswith("#")]
    return [(expected, [SEED if a == "SEED" else a.replace("%20", " ") for a in shlex.split(args)])
            for expected, args in rows]


COMMANDS = _commands()


def test_the_corpus_is_there():
    assert len(CASES) >= 10, CASES


@pytest.mark.parametrize("path", CASES, ids=[os.path.basename(c) for c in CASES])
def test_each_hostile_scenario_is_refused_with_its_error(dmpcheck_bin, path):
    with open(path, "rb") as f:
        first = f.readline().decode()
    assert first.startswith("# expect: "), f"{path}: the first line names the expected error"
    expected = first[len("# expect: "):].strip()
    p = subprocess.run([dmpcheck_bin, "validate", path], capture_output=True, text=True, errors="replace",
                       timeout=60)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert expected in p.stderr, p.stderr
    assert "terminate called" not in p.stderr and "Exception raised from" not in p.stderr


@pytest.mark.parametrize("expected,args", COMMANDS, ids=[" ".join(a[:1] + a[2:])[:60] for _, a in COMMANDS])
def test_each_hostile_command_line_is_refused_before_anything_runs(dmpcheck_bin, tmp_path, expected, args):
    env = dict(os.environ, DMPCHECK_TORCHREC_ENVS=str(tmp_path / "envs"))
    env.pop("DMPCHECK_TORCHREC_REPO", None)
    argv = [dmpcheck_bin]
    for a in args:
        if a.startswith("ENV:"):
            name, value = a[4:].split("=", 1)
            env[name] = value
        else:
            argv.append(a)
    p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=60, env=env, cwd=str(tmp_path))
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert expected in p.stderr + p.stdout, p.stderr + p.stdout
    assert "usage: git" not in p.stderr + p.stdout and "cloning" not in p.stderr  # git never ran
    assert not os.path.exists("/tmp/dmpcheck-planted")
    assert not (tmp_path / "envs").exists()  # nothing was staged
