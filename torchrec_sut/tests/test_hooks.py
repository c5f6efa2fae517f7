"""Hooks (torchrec: {hooks: FILE}): the check made before any rank starts (no torch needed), and a
release cell that calls them: what they return is compared across ranks and against `expect:
observed`; a hook's own failure is the cell's error of kind hook, naming it, never TorchRec's."""
import json
import os
import sys
import textwrap

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from dmpcheck_torchrec import hooks  # noqa: E402
from test_torchrec_cells import dmpcheck, need  # noqa: E402


def write(tmp_path, text, name="h.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_a_good_hook_file_passes_the_check(tmp_path):
    path = write(tmp_path, """
        import torch
        def helper(x):
            return x
        def hook_after_wrap(ctx):
            return {"n": 1}
        def hook_at_end(context):
            pass
        """)
    assert hooks.check(path) == []


def test_what_is_wrong_with_a_hook_file_is_said_with_its_line(tmp_path):
    path = write(tmp_path, """
        def hook_after_warp(ctx):
            pass
        def hook_before_step(ctx, extra):
            pass
        async def hook_at_end(ctx):
            pass
        """)
    errors = hooks.check(path)
    assert errors[0] == ("%s:2: hook_after_warp is not a hook dmpcheck calls (did you mean hook_after_wrap?); the hooks "
                         "are hook_build_model, hook_after_wrap, hook_batch, hook_before_step, hook_after_step, "
                         "hook_at_end" % path)
    assert errors[1] == "%s:4: hook_before_step must be a plain function of one argument, the hook's context (ctx)" % path
    assert errors[2].startswith("%s:6: hook_at_end must be a plain function" % path)
    assert hooks.check(write(tmp_path, "def hook_after_wrap(ctx:\n", "bad.py"))[0].startswith(
        "%s:1: not Python" % (tmp_path / "bad.py"))
    assert hooks.check(write(tmp_path, "def helper(ctx):\n    pass\n", "none.py")) == [
        "%s:1: defines no hook (functions named hook_build_model, hook_after_wrap, hook_batch, hook_before_step, "
        "hook_after_step, hook_at_end)"
        % (tmp_path / "none.py")]
    assert "cannot read the hook file" in hooks.check(str(tmp_path / "missing.py"))[0]
    assert hooks.main(["check", path]) == 2


SCENARIO = """version: 1
name: hooked
world_size: 2
steps: 2
batch_size: 4
tables:
  - {name: t0, rows: 16, dim: 4, features: [f0], sharding: {types: [data_parallel]}}
  - {name: t1, rows: 16, dim: 4, features: [f1], sharding: {types: [table_wise]}}
torchrec: {hooks: %s}
system: torchrec==1.9.2
expect:
  - replicas: equal
%s"""


def test_hook_values_are_compared_across_ranks_and_with_the_expectation(tmp_path):
    need("1.9.2")
    hook = write(tmp_path, """
        import torch
        def hook_after_wrap(ctx):
            return {"world": ctx.world_size, "tables": ",".join(sorted(ctx.tables))}
        def hook_after_step(ctx):
            dense = dict(ctx.model.named_parameters())
            weight = [v for k, v in dense.items() if k.endswith("dense.0.weight")][0]
            return {"step": ctx.step, "dense_weight": weight, "rank_is_zero": ctx.rank == 0}
        """)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO % (hook, "    observed: {world: 2, tables: 't0,t1', step: 2.0}\n"))
    out = str(tmp_path / "r")
    p = dmpcheck("run", str(scenario), "--out", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "hook value dense_weight (after_step, step 2): rank 0 " in p.stdout and "(ranks agree)" in p.stdout
    assert "hook value rank_is_zero (after_step, step 2): rank 0 true, rank 1 false (ranks DIFFER)" in p.stdout
    report = json.load(open(os.path.join(out, "hooked", "default.json")))
    assert [(o["rank"], o["point"], o["step"]) for o in report["observed"] if o["name"] == "step"] == [
        (0, "after_step", 1), (0, "after_step", 2), (1, "after_step", 1), (1, "after_step", 2)]
    scenario.write_text(SCENARIO % (hook, "    observed: {rank_is_zero: true, missing: 1}\n"))
    p = dmpcheck("run", str(scenario), "--out", out)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "rank_is_zero is false on rank 1 (after_step 2), expected true" in p.stdout
    assert "no hook returned missing on rank 0" in p.stdout


def test_a_hooks_failure_is_its_own_named_error_and_a_bad_file_stops_before_any_rank(tmp_path):
    need("1.9.2")
    raising = write(tmp_path, """
        def hook_before_step(ctx):
            if ctx.step == 2:
                raise ValueError("the user's own mistake")
        """, "raising.py")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO % (raising, ""))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("hook_before_step (%s) raised ValueError: the user's own mistake" % raising) in p.stdout
    report = json.load(open(str(tmp_path / "r" / "hooked" / "default.json")))
    assert report["failure"]["kind"] == "hook"
    returns = write(tmp_path, "def hook_at_end(ctx):\n    return {'model': ctx.model}\n", "returns.py")
    scenario.write_text(SCENARIO % (returns, ""))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3 and "returned model = " in p.stdout and "a hook returns tensors, numbers" in p.stdout
    misnamed = write(tmp_path, "def hook_after_warp(ctx):\n    pass\n", "misnamed.py")
    scenario.write_text(SCENARIO % (misnamed, ""))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout
    assert "no rank started" in p.stdout and ("%s:1: hook_after_warp is not a hook" % misnamed) in p.stdout
    assert "[rank" not in p.stdout  # said before any rank started


def test_a_failure_of_the_unsharded_oracle_is_its_own_kind_not_the_sharded_runs(tmp_path):
    """Issue 46, item 13: the release's own unsharded model (global_model's oracle, on rank 0 after
    the sharded run) raising was reported as the release's error, kind torchrec, as if the sharded
    run had failed. Here a module that raises in the oracle only (built by hook_build_model, which
    is not the hook raising): kind `oracle`, the message saying whose failure it is."""
    need("1.9.2")
    hook = write(tmp_path, """
        def hook_build_model(ctx):
            if ctx.unsharded:
                def fails(*args, **kwargs):
                    raise RuntimeError("a module of the oracle only")
                ctx.model.forward = fails
        """)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO % (hook, "    global_model: {rtol: 1.0e-5, atol: 1.0e-6}\n"))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    report = json.load(open(str(tmp_path / "r" / "hooked" / "default.json")))
    assert report["failure"]["kind"] == "oracle", report["failure"]
    assert ("the unsharded model (the release's own modules in one process, on rank 0 after the sharded run "
            "completed) raised RuntimeError: a module of the oracle only") in report["failure"]["message"]


def test_the_hooks_example_passes(tmp_path):
    need("1.9.2")
    from test_torchrec_cells import ROOT
    p = dmpcheck("run", os.path.join(ROOT, "scenarios", "examples", "hooks.yaml"), "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "2 of 2 run(s) met their expectations" in p.stdout
    assert "torchrec.hooks run on release cells only: this reference cell called none" in p.stdout


def test_a_module_built_by_a_hook_is_sharded_and_the_oracle_builds_it_too(tmp_path):
    """hook_build_model (scenarios/examples/feature_processed.yaml): a FeatureProcessedEBC around
    the scenario's EBC; its position weights are replicas compared across ranks, and the unsharded
    oracle, built through the same hook, holds them and every table to compare against."""
    need("1.9.2")
    from test_torchrec_cells import ROOT
    p = dmpcheck("run", os.path.join(ROOT, "scenarios", "examples", "feature_processed.yaml"), "--out", str(tmp_path))
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.load(open(str(tmp_path / "feature-processed" / "default.json")))
    compared = {c["name"] for c in report["global_model"] if c["comparable"] and c["within_tolerance"]}
    assert {"ebc._feature_processors.position_weights.f0", "ebc._feature_processors.position_weights.f1",
            "ebc.embedding_bags.sharded.weight", "ebc.embedding_bags.replicated.weight"} <= compared, compared
    replicas = {(d["name"], d["phase"]) for d in report["replicas"] if d["equal"]}
    assert ("ebc._feature_processors.position_weights.f0", "final") in replicas, replicas
    assert ("ebc.embedding_bags.replicated.weight", "final") in replicas, replicas
    assert "hooks of" in p.stdout and "hook_build_model" in p.stdout


def test_a_batch_built_by_a_hook_trains_and_the_oracle_is_given_the_same(tmp_path):
    """hook_batch: every id folded onto the tables' first 4 rows, on each rank's batch and on the
    oracle's global batch: the release still matches its unsharded model.  Folded on the ranks
    alone, it no longer does (the oracle is handed what the hook leaves it, nothing else)."""
    need("1.9.2")
    hook = write(tmp_path, """
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
        FOLD_ORACLE = True
        def hook_batch(ctx):
            b = ctx.batch
            if ctx.unsharded and not FOLD_ORACLE:
                return
            ctx.batch = KeyedJaggedTensor(keys=b.keys(), values=b.values() % 4, lengths=b.lengths(),
                                          weights=b.weights_or_none())
            return {"largest_id": int(b.values().max()) if not ctx.unsharded else -1}
        """)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO % (hook, "    global_model: true\n"))
    out = str(tmp_path / "r")
    p = dmpcheck("run", str(scenario), "--out", out)
    assert p.returncode == 0, p.stdout + p.stderr
    report = json.load(open(os.path.join(out, "hooked", "default.json")))
    assert report["global_model_checked"] and all(c["within_tolerance"] for c in report["global_model"])
    # The hook saw each step's batch on each rank, and the oracle's global batch (rank -1).
    assert sorted((o["rank"], o["step"]) for o in report["observed"] if o["name"] == "largest_id") == [
        (-1, 1), (-1, 2), (0, 1), (0, 2), (1, 1), (1, 2)]
    assert "the unsharded model's hook_batch (batch, step 2) returned -1: it DIFFERS from rank(s) 0,1" in p.stdout, \
        p.stdout
    with open(hook) as f:
        text = f.read()
    with open(hook, "w") as f:
        f.write(text.replace("FOLD_ORACLE = True", "FOLD_ORACLE = False"))
    p = dmpcheck("run", str(scenario), "--out", out)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "unsharded model" in p.stdout
    # A batch hook that leaves no batch is its own error.
    scenario.write_text(SCENARIO % (write(tmp_path, "def hook_batch(ctx):\n    ctx.batch = [1, 2]\n", "bad.py"), ""))
    p = dmpcheck("run", str(scenario), "--out", out)
    assert p.returncode == 3 and "left ctx.batch = list at step 1; it must be a KeyedJaggedTensor" in p.stdout, p.stdout


def test_a_hook_that_ends_the_rank_or_hangs_is_the_hooks_failure_named(tmp_path):
    """Issue 63, item 5: sys.exit, os._exit and a hang in a hook (or at its file's import) are the
    hook's failure, named with its file; a hang is stopped at timeout_s with where it hung."""
    def failure(text, point="at_end", timeout_s=0.0):
        path = write(tmp_path, text, "h%d.py" % len(os.listdir(str(tmp_path))))
        try:
            user = hooks.Hooks(path, 0, timeout_s)
            user.call(point, hooks.Context(0, 1, {}))
        except hooks.HookFailed as e:
            return path, str(e)
        return path, "no failure"

    path, said = failure("import sys\ndef hook_at_end(ctx):\n    sys.exit(0)\n")
    assert said == "hook_at_end (%s) called sys.exit(0): a hook may not end the rank" % path
    path, said = failure("import os\ndef hook_at_end(ctx):\n    os._exit(0)\n")
    assert said == "hook_at_end (%s) called os._exit(0): a hook may not end the rank" % path
    assert os._exit.__name__ == "_exit"  # put back after the hook
    path, said = failure("import time\ndef hook_at_end(ctx):\n    while True:\n        time.sleep(0.05)\n",
                         timeout_s=0.5)
    assert said.startswith("hook_at_end (%s) still running after timeout_s = 0.5 s, in " % path), said
    assert os.path.basename(path) + ":4 in hook_at_end" in said
    path, said = failure("import time\nwhile True:\n    time.sleep(0.05)\n", timeout_s=0.5)
    assert said.startswith("the hook file %s (its import) still running after timeout_s = 0.5 s" % path), said
    path, said = failure("def hook_at_end(ctx):\n    raise KeyError('k')\n", timeout_s=5)
    assert said == "hook_at_end (%s) raised KeyError: 'k'" % path


def test_a_hook_that_breaks_the_model_or_hangs_in_a_release_cell_is_named_at_timeout_s(tmp_path):
    need("1.9.2")
    broken = write(tmp_path, "def hook_after_wrap(ctx):\n    ctx.model = None\n", "broken.py")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(SCENARIO % (broken, ""))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"))
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("hook_after_wrap (%s) left ctx.model = NoneType; it must be a torch.nn.Module" % broken) in p.stdout
    assert json.load(open(str(tmp_path / "r" / "hooked" / "default.json")))["failure"]["kind"] == "hook"
    hanging = write(tmp_path, "import time\ndef hook_before_step(ctx):\n    time.sleep(3600)\n", "hanging.py")
    scenario.write_text((SCENARIO % (hanging, "")).replace("steps: 2\n", "steps: 2\ntimeout_s: 20\n"))
    p = dmpcheck("run", str(scenario), "--out", str(tmp_path / "r"), timeout=120)
    assert p.returncode == 3, p.stdout + p.stderr
    assert ("hook_before_step (%s) still running after timeout_s = 20 s, in hanging.py:3 in hook_before_step"
            % hanging) in p.stdout, p.stdout
