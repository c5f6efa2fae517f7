"""The rank program alone on a real release: `python -m dmpcheck_torchrec.rank` handed a spec and
batches written here (contract documents built by keyword), one rank, no dmpcheck binary.

Needs a release environment (bash ci/torchrec-env.sh 1.9.2); without it these tests skip, naming
that command, unless DMPCHECK_REQUIRE_TORCHREC=1 (CI) makes a missing one a failure.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "torchrec_sut"))

from dmpcheck_torchrec import contract  # noqa: E402
from test_torchrec_cells import broken_sut  # noqa: E402

ENVS = os.environ.get("DMPCHECK_TORCHREC_ENVS",
                      os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "dmpcheck", "torchrec"))


def python_of(release):
    env = os.path.join(ENVS, "torchrec-" + release)
    if not os.path.exists(os.path.join(env, "dmpcheck-ready.json")):
        why = "torchrec %s not installed: bash ci/torchrec-env.sh %s" % (release, release)
        if os.environ.get("DMPCHECK_REQUIRE_TORCHREC") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return os.path.join(env, "bin", "python")


def run_rank(python, exchange, spec, batches, sut=os.path.join(ROOT, "torchrec_sut")):
    """One rank (world size 1) of `spec` over `batches` (step -> contract.Batch) in `exchange`, the
    rank program taken from `sut`."""
    os.makedirs(os.path.join(exchange, "batches"))
    contract.save(spec, os.path.join(exchange, "spec.json"))
    for step, batch in batches.items():
        contract.save(batch, os.path.join(exchange, "batches", contract.batch_file(step, 0)))
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", OMP_NUM_THREADS="1",
               GLOO_SOCKET_IFNAME="lo", DMPCHECK_RENDEZVOUS_FILE=os.path.join(exchange, "rendezvous"),
               PYTHONPATH=sut)
    return subprocess.run([python, "-m", "dmpcheck_torchrec.rank", exchange], capture_output=True, text=True,
                          env=env, timeout=300)


def test_managed_collision_redraws_are_recorded_in_every_epoch(tmp_path):
    """EvictionDraws records the rows the sharded MCH module re-draws (redrawn<step>, which the
    unsharded oracle puts into the rows its own modules evict) in every epoch, not only the first:
    two epochs of two steps, every step's ids new to an 8-row table that evicts every forward."""
    python = python_of("1.9.2")
    table = contract.Table(name="t0", rows=8, dim=4, features=["f0"], pooling="sum", data_type="fp32",
                           managed_collision=contract.ManagedCollision(module="mch", input_hash_size=1000,
                                                                       eviction="lru", interval=1),
                           constraints=contract.Constraints(sharding_types=["row_wise"]))
    spec = contract.RunSpec(world_size=1, local_world_size=1, steps=4, epochs=2, batch_size=4, timeout_s=60.0,
                            sharder="extended", module="embedding_bag_collection", loop="plain",
                            data_iterator="fresh", seeds=[3], tables=[table], dense_layers=[1],
                            sparse_optimizer=contract.SparseOptimizer(type="sgd", lr=0.1, weight_decay_mode="none"),
                            dense_optimizer=contract.DenseOptimizer(type="sgd", lr=0.1))
    # Step s: four bags of two ids each, all eight unseen before (100 * s + 0..7).
    batches = {s: contract.Batch(keys=["f0"], lengths=[2, 2, 2, 2], values=[100 * s + i for i in range(8)])
               for s in range(1, 5)}

    def redrawn_steps(name, sut=os.path.join(ROOT, "torchrec_sut")):
        exchange = str(tmp_path / name)
        p = run_rank(python, exchange, spec, batches, sut)
        assert p.returncode == 0, p.stdout + p.stderr
        out = os.path.join(exchange, "out")
        meta = contract.load(contract.RunMeta, os.path.join(out, "meta.json"))
        assert [(loop.rank, loop.batches) for loop in meta.loops] == [(0, [2, 2])], meta.loops
        assert len(meta.losses) == 4 and meta.versions.torchrec == "1.9.2", meta
        steps = set()
        for step in batches:
            path = os.path.join(out, "rank0", contract.phase_redrawn(step) + ".json")
            if os.path.exists(path):
                phase = contract.load(contract.Phase, path)
                assert [t.name for t in phase.tensors] == ["mc.t0.redrawn"] and phase.tensors[0].sizes[1] == 4, phase
                steps.add(step)
        return steps

    # Epoch 1 is steps 1-2, epoch 2 steps 3-4: both re-draw, and both are recorded.
    steps = redrawn_steps("ok")
    assert steps & {1, 2} and steps & {3, 4}, steps
    # Recording switched on once, before the first epoch (the code before the fix), records the first
    # epoch's draws alone.
    once = broken_sut(tmp_path, "runner.py", "    for epoch in range(spec.epochs):\n        EvictionDraws.recording = True",
                      "    EvictionDraws.recording = True\n    for epoch in range(spec.epochs):\n        pass")
    steps = redrawn_steps("once", str(once))
    assert steps & {1, 2} and not steps & {3, 4}, steps
