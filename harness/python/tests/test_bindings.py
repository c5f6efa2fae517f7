import json
import os
import threading
import time

import dmpcheck
import pytest


def test_load_scenario_lists_every_matrix_cell(seed):
    scenario = dmpcheck.load_scenario(seed)
    assert scenario["name"] == "torchrec-1739-dp-tables-not-broadcast"
    releases = ["0.3.1", "0.3.2", "0.4.0", "0.5.0", "0.6.0", "1.9.2"]
    assert [r["slug"] for r in scenario["runs"]] == [
        slug for mode in ("seeded", "unseeded")
        for slug in [f"{mode}_torchrec-0.6"] + [f"{mode}_torchrec__{r}" for r in releases] + [f"{mode}_torchrec-1.9"]]
    assert scenario["runs"][8]["cell"] == {"init.mode": "unseeded", "profile": "torchrec-0.6", "system": "reference"}
    assert scenario["runs"][13]["cell"] == {"init.mode": "unseeded", "system": "torchrec==0.6.0"}


def test_validation_errors_are_typed_and_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nname: bad\ntables:\n  - {name: t, rows: 0, dim: 4, features: [f]}\n")
    with pytest.raises(dmpcheck.InvalidScenarioError) as error:
        dmpcheck.validate(str(bad))
    assert f"{bad}:4: field 'tables[0].rows': expected an integer" in str(error.value)
    assert issubclass(dmpcheck.InvalidScenarioError, dmpcheck.DmpcheckError)


def test_overrides_are_validated_like_the_file(seed):
    assert dmpcheck.load_scenario(seed, overrides={"world_size": 3})["runs"][0]["world_size"] == 3
    with pytest.raises(dmpcheck.InvalidScenarioError, match="not a run field"):
        dmpcheck.load_scenario(seed, overrides={"nonsense.key": 1})


def test_run_returns_the_fields_of_the_json_report(seed, tmp_path):
    (result,) = dmpcheck.run(seed, run="unseeded_torchrec-0.6", out_dir=str(tmp_path))
    with open(tmp_path / "torchrec-1739-dp-tables-not-broadcast" / "unseeded_torchrec-0.6.json") as f:
        report = json.load(f)
    assert set(result) == set(report)
    assert result["verdict"] == "pass"
    diverged = {c["name"] for c in result["replicas"] if not c["equal"]}
    assert "ebc.embedding_bags.large_table_0.weight" in diverged
    assert result["environment"]["threads_per_rank"] >= 1


def test_a_run_the_scenario_lacks_is_an_error_that_lists_its_runs(seed, tmp_path):
    with pytest.raises(dmpcheck.InvalidInputError, match="has no run 'seeded_nothing'; its runs: seeded_torchrec-0.6, "):
        dmpcheck.run(seed, run="seeded_nothing", out_dir=str(tmp_path))


def test_the_gil_is_released_while_ranks_run(seed, tmp_path):
    ticks = 0
    done = threading.Event()

    def count():
        nonlocal ticks
        while not done.is_set():
            ticks += 1
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    try:
        dmpcheck.run(seed, run="seeded_torchrec-1.9", out_dir=str(tmp_path))
    finally:
        done.set()
        counter.join()
    assert ticks > 50  # the counter thread ran while the ranks did (the run takes ~0.5 s)
