"""The hostile inputs that were once accepted silently (issue 46), kept as a corpus: every file under
fixtures/hostile/scenario/ names on its first line (`# expect: TEXT`) the error `dmpcheck validate`
must give; a file that validates, crashes or says something else fails here.  Add a case by adding
a file."""
import glob
import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CASES = sorted(glob.glob(os.path.join(ROOT, "fixtures", "hostile", "scenario", "*.yaml")))


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
