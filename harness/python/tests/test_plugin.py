import os
import shutil
import textwrap

PASSING = textwrap.dedent("""\
    version: 1
    name: tiny
    world_size: 2
    steps: 1
    batch_size: 4
    init: {mode: unseeded, seed: 1}
    tables:
      - {name: t, rows: 16, dim: 4, features: [f], sharding: {types: [data_parallel]}}
    matrix:
      profile: [torchrec-0.6, current]
    expect:
      - when: {profile: torchrec-0.6}
        replicas: diverge
        diverged: [t]
      - replicas: equal
    """)


def _setup(pytester, root, files):
    directory = pytester.path / "scenarios"
    directory.mkdir()
    for name, text in files.items():
        (directory / name).write_text(text)
    shutil.copy(os.path.join(root, "harness", "python", "pytest_dmpcheck.py"), pytester.path)
    return directory


def test_collects_one_item_per_matrix_cell_and_passes(pytester, root):
    _setup(pytester, root, {"tiny.yaml": PASSING})
    result = pytester.runpytest_subprocess("-p", "pytest_dmpcheck", "scenarios", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*tiny.yaml::torchrec-0.6 PASSED*", "*tiny.yaml::current PASSED*"])


def test_a_failing_cell_names_the_tensors(pytester, root):
    wrong = PASSING.replace("when: {profile: torchrec-0.6}", "when: {profile: current}")
    _setup(pytester, root, {"wrong.yaml": wrong})
    result = pytester.runpytest_subprocess("-p", "pytest_dmpcheck", "scenarios")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "ebc.embedding_bags.t.weight differs at init on rank(s) 1" in out
    assert "ebc.embedding_bags.t.weight was expected to diverge at init but is equal on every rank" in out


def test_a_yaml_error_is_a_collection_error_with_file_and_line(pytester, root):
    _setup(pytester, root, {"tiny.yaml": PASSING, "broken.yaml": PASSING.replace("rows: 16", "rows: -1")})
    # Like any collection error, it stops the session unless asked to go on.
    result = pytester.runpytest_subprocess("-p", "pytest_dmpcheck", "scenarios", "--continue-on-collection-errors")
    result.assert_outcomes(passed=2, errors=1)
    assert "broken.yaml:8: field 'tables[0].rows': expected an integer in [1, " in result.stdout.str()


def test_an_nccl_cell_without_a_gpu_is_skipped_with_the_reason(pytester, root):
    import dmpcheck
    assert dmpcheck.backend_unavailable_reason("gloo", 4) is None
    assert dmpcheck.backend_unavailable_reason("mpi") == "unknown backend 'mpi' (expected one of: gloo, nccl)"
    if dmpcheck.backend_unavailable_reason("nccl", 2) is None:
        import pytest
        pytest.skip("NCCL can run two ranks here")
    _setup(pytester, root, {"tiny.yaml": PASSING.replace("world_size: 2", "world_size: 2\nbackend: nccl")})
    result = pytester.runpytest_subprocess("-p", "pytest_dmpcheck", "scenarios", "-rs")
    result.assert_outcomes(skipped=2)
    assert "GPU" in result.stdout.str() or "without NCCL" in result.stdout.str()
