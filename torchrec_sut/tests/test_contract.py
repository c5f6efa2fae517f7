"""The rank program's side of the release contract, without torch (CTest label unit).

Every document in fixtures/contract/ is what harness/run/release_contract.h writes (its C++ test,
ReleaseContract.*, holds it to the same files): read strictly here and written back, it must be
the same document, and a field known to one side only must fail with its name.
"""

import copy
import dataclasses
import json
import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "torchrec_sut"))

from dmpcheck_torchrec import contract  # noqa: E402

DOCUMENTS = {"run_spec.json": contract.RunSpec, "run_meta.json": contract.RunMeta,
             "plan_answer.json": contract.PlanAnswer, "probe_answer.json": contract.ProbeAnswer,
             "phase.json": contract.Phase,
             "batch.json": contract.Batch, "rank_error.json": contract.RankError,
             "warm_spawn.json": contract.WarmSpawn, "warm_message.json": contract.WarmMessage}


def fixture(name):
    with open(os.path.join(ROOT, "fixtures", "contract", name)) as f:
        return json.load(f)


def test_torch_is_not_imported():
    assert "torch" not in sys.modules


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_every_document_reads_and_writes_back_identical(name):
    document = fixture(name)
    assert contract.to_dict(contract.parse(DOCUMENTS[name], document, name)) == document


@pytest.mark.parametrize("name", sorted(DOCUMENTS))
def test_an_unknown_field_at_any_depth_is_an_error_naming_it(name, tmp_path):
    top = fixture(name)
    top["stride_per_key_per_rank"] = [[1]]
    with pytest.raises(contract.ContractError, match="unknown field 'stride_per_key_per_rank'"):
        contract.parse(DOCUMENTS[name], top, name)
    nested = fixture(name)
    key = {"run_spec.json": "tables", "run_meta.json": "plan", "plan_answer.json": "plan", "phase.json": "tensors",
           "batch.json": None, "rank_error.json": None, "probe_answer.json": None, "warm_spawn.json": None,
           "warm_message.json": None}[name]
    if name == "probe_answer.json":
        nested["versions"]["extra"] = 1
        with pytest.raises(contract.ContractError, match=r"unknown field 'versions\.extra'"):
            contract.parse(DOCUMENTS[name], nested, name)
    if key:
        nested[key][-1]["extra"] = 1
        with pytest.raises(contract.ContractError, match=rf"unknown field '{key}\[{len(nested[key]) - 1}\]\.extra'"):
            contract.parse(DOCUMENTS[name], nested, name)


def test_a_missing_field_is_an_error_naming_it():
    document = fixture("run_spec.json")
    del document["sparse_optimizer"]["weight_decay_mode"]
    with pytest.raises(contract.ContractError, match="missing field 'sparse_optimizer.weight_decay_mode'"):
        contract.parse(contract.RunSpec, document, "spec.json")
    document = fixture("run_spec.json")
    del document["local_world_size"]
    with pytest.raises(contract.ContractError, match="missing field 'local_world_size'"):
        contract.parse(contract.RunSpec, document, "spec.json")


def test_a_field_of_the_wrong_kind_is_an_error_naming_it():
    document = fixture("run_spec.json")
    document["seeds"] = [7, "8"]
    with pytest.raises(contract.ContractError, match=r"'seeds\[1\]' is str"):
        contract.parse(contract.RunSpec, document, "spec.json")
    document = fixture("run_meta.json")
    document["losses"] = [True]
    with pytest.raises(contract.ContractError, match=r"'losses\[0\]' is bool"):
        contract.parse(contract.RunMeta, document, "meta.json")


def test_another_schema_version_is_refused_by_name():
    document = fixture("run_spec.json")
    document["schema_version"] = contract.SCHEMA_VERSION + 1
    with pytest.raises(contract.ContractError, match=f"schema_version {contract.SCHEMA_VERSION + 1}, this rank program"):
        contract.parse(contract.RunSpec, document, "spec.json")
    del document["schema_version"]
    with pytest.raises(contract.ContractError, match="no whole-number 'schema_version'"):
        contract.parse(contract.RunSpec, document, "spec.json")


def test_save_and_load_round_trip_atomically(tmp_path):
    meta = contract.parse(contract.RunMeta, fixture("run_meta.json"))
    path = str(tmp_path / "meta.json")
    contract.save(meta, path)
    assert not os.path.exists(path + ".tmp")
    assert contract.load(contract.RunMeta, path) == meta
    assert contract.to_dict(copy.deepcopy(meta)) == fixture("run_meta.json")


def test_the_rank_programs_fallback_error_has_the_contracts_schema_version():
    """rank.py writes its error by hand when the contract module cannot be imported; that
    document must carry the same schema version, or the launcher refuses it."""
    from dmpcheck_torchrec import rank

    assert rank._SCHEMA_VERSION == contract.SCHEMA_VERSION


def _contract_classes():
    """Every contract class: the documents and the parts they are made of."""
    return [c for c in vars(contract).values() if isinstance(c, type) and dataclasses.is_dataclass(c)]


def test_every_contract_class_has_the_headers_defaults_and_builds_by_keyword():
    """Each struct of harness/run/release_contract.h default-constructs; so does each class here,
    to the same values (0, "", empty, but the few the header sets otherwise), and a document
    built from keywords alone is a valid one."""
    for cls in _contract_classes():
        document = cls()
        assert contract.parse_part(cls, contract.to_dict(document), cls.__name__) == document
    assert contract.Start() == contract.Start(kind="seed", state="", load="after_wrap")
    spec = contract.RunSpec()
    assert (spec.schema_version, spec.epochs, spec.is_weighted, spec.steps, spec.sharder) == (
        contract.SCHEMA_VERSION, 1, "tables", 0, "")
    assert spec.tables == [] and spec.start == contract.Start() and spec.checkpoint == contract.Checkpoint()
    assert contract.Piece().dtype == "float32"
    assert contract.Table(name="t0").constraints == contract.Constraints(sharding_types=[], column_shards=0)
    # Every list and object default is the instance's own.
    a, b = contract.RunSpec(), contract.RunSpec()
    a.tables.append(contract.Table())
    a.start.kind = "reference"
    assert b.tables == [] and b.start.kind == "seed"
    for name, cls in DOCUMENTS.items():
        assert contract.to_dict(cls()).keys() == fixture(name).keys(), name
        assert contract.parse(cls, contract.to_dict(cls()), name) == cls()


def test_plan_corpus_builds_every_configuration_as_a_valid_run_spec():
    """`python -m dmpcheck_torchrec.plan_corpus` (fixtures/torchrec-plans/README.md) turns each
    configuration into the RunSpec the rank program would be handed before it plans anything (it
    once failed there, building documents positionally after the contract had grown)."""
    from dmpcheck_torchrec import plan_corpus

    with open(os.path.join(ROOT, "fixtures", "torchrec-plans", "configs.json")) as f:
        configs = json.load(f)
    for c in configs:
        spec = plan_corpus.spec_of(c)
        assert contract.parse(contract.RunSpec, contract.to_dict(spec), c["id"]) == spec
        assert spec.world_size == c["world"] and len(spec.seeds) == c["world"]
        assert [t.name for t in spec.tables] == [t["name"] for t in c["tables"]]
        assert [t.constraints.sharding_types for t in spec.tables] == [t["types"] for t in c["tables"]]
        assert [t.constraints.column_shards for t in spec.tables] == [t.get("column_shards", 0) for t in c["tables"]]
        assert spec.sparse_optimizer.type == c.get("opt", "sgd") and spec.sparse_optimizer.weight_decay_mode == "none"
    first = plan_corpus.spec_of(configs[0])
    assert first.tables[0] == contract.Table(
        name="t0", rows=64, dim=8, features=["f_t0"], pooling="sum", weighted=False, data_type="fp32",
        constraints=contract.Constraints(sharding_types=["table_wise"]))
    assert "torch" not in sys.modules


def test_the_exchanges_names_are_the_layout_fixtures():
    """Each phase and batch file name as release_contract.h makes it (fixtures/contract/layout.json)."""
    for entry in fixture("layout.json")["names"]:
        assert getattr(contract, entry["call"])(*entry["args"]) == entry["name"], entry


def test_failure_kinds_are_the_fixtures_table():
    """Why a run stopped: contract.py's names are the C++ report's (fixtures/contract/failure_kinds.json),
    and the rank program says only kinds the launcher reads as themselves."""
    from dmpcheck_torchrec import rank

    table = fixture("failure_kinds.json")
    assert list(contract.FAILURE_KINDS) == table["kinds"]
    said = sorted(getattr(rank, name) for name in dir(rank) if name.startswith("_KIND_"))
    assert said == sorted(table["rank_program"])
    assert set(said) <= set(contract.FAILURE_KINDS)


def test_a_failure_the_environment_explains_is_not_the_releases():
    """Issue 46, item 13: a commit that calls an fbgemm operator the environment's fbgemm lacks, or
    that lacks a name only the rank program imports, read as TorchRec's error; each is now an
    import failure (a commit search skips it) saying what was lacking and where."""
    from dmpcheck_torchrec import rank

    def raised(code, filename):
        try:
            exec(compile(code, filename, "exec"), {})
        except BaseException as e:  # noqa: BLE001
            return rank.failure_of(e)
        raise AssertionError("did not raise")

    ours = os.path.join(os.path.dirname(rank.__file__), "runner.py")
    theirs = os.path.join("/envs", "torchrec", "distributed", "embedding_lookup.py")
    kind, message = raised("raise RuntimeError('No such operator fbgemm::jagged_index_add_2d_forward_v2')", theirs)
    assert kind == "import" and "needs another fbgemm-gpu or torch" in message, message
    kind, message = raised("raise AttributeError(\"'_OpNamespace' 'fbgemm' object has no attribute 'x'\")", theirs)
    assert kind == "import", message
    code = "raise ImportError(\"cannot import name 'Y' from 'torchrec.x'\", name='torchrec.x')"
    kind, message = raised(code, ours)
    assert (kind, message) == ("import", "dmpcheck's rank program (runner.py:1) imports from torchrec.x what this "
                                         "torchrec lacks: ImportError: cannot import name 'Y' from 'torchrec.x'")
    kind, message = raised(code, theirs)  # TorchRec's own import: said as it is
    assert (kind, message) == ("import", "ImportError: cannot import name 'Y' from 'torchrec.x'")
    # a48cef79 (2025-10) over 1.2.0's environment, measured: TorchRec imports a name fbgemm-gpu 1.2.0 lacks.
    code = "raise ImportError(\"cannot import name 'BackendType' from 'fbgemm_gpu.x'\", name='fbgemm_gpu.x')"
    assert raised(code, theirs) == ("import", "this torchrec imports from fbgemm_gpu.x what the environment's "
                                              "fbgemm-gpu lacks: ImportError: cannot import name 'BackendType' from "
                                              "'fbgemm_gpu.x'")
    # An fbgemm Python attribute TorchRec reads (#3099's skew) and anything else stay the release's.
    code = "raise AttributeError(\"'SplitTableBatchedEmbeddingBagsCodegen' object has no attribute 'get_learning_rate'\")"
    assert raised(code, theirs)[0] == "torchrec"


def test_the_warm_interpreter_refuses_a_request_that_is_not_a_warm_spawn():
    """warm.py reads each request strictly (contract.WarmSpawn): not JSON, an unknown field, or
    another schema version is answered with a WarmMessage of kind "refused" saying why, and
    nothing is forked."""
    import json
    import socket
    import threading

    from dmpcheck_torchrec import warm

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server = threading.Thread(target=warm.serve, args=(theirs,))
    server.start()
    try:
        good = fixture("warm_spawn.json")
        for request, why in ((b"not json", "Expecting value"),
                             (json.dumps(dict(good, stdin="/dev/tty")).encode(), "unknown field 'stdin'"),
                             (json.dumps(dict(good, schema_version=contract.SCHEMA_VERSION + 1)).encode(),
                              "schema_version")):
            out = os.open(os.devnull, os.O_WRONLY)
            try:
                socket.send_fds(ours, [request], [out])
            finally:
                os.close(out)
            ours.settimeout(10)
            reply = contract.parse(contract.WarmMessage, json.loads(ours.recv(65536)), "the reply")
            assert reply.kind == "refused" and why in reply.why, reply
    finally:
        ours.close()
        server.join(10)
        theirs.close()
    assert not server.is_alive()


def test_an_attribute_missing_from_an_fbgemm_object_says_whose_it_is():
    """Issue 59, item 1: over an environment dmpcheck chose, a commit that reads what another
    fbgemm-gpu has (0102122b's get_learning_rate over 1.1.0's) is the environment's, not the commit's;
    the rank program keeps the kind torchrec (a pinned pair's error stays the release's) and names
    the owner, which bisect reads."""
    import types

    from dmpcheck_torchrec import rank

    module = types.ModuleType("fbgemm_gpu.fake_tbe")

    class SplitTableBatchedEmbeddingBagsCodegen:
        pass

    SplitTableBatchedEmbeddingBagsCodegen.__module__ = module.__name__
    SplitTableBatchedEmbeddingBagsCodegen.__qualname__ = "SplitTableBatchedEmbeddingBagsCodegen"
    module.SplitTableBatchedEmbeddingBagsCodegen = SplitTableBatchedEmbeddingBagsCodegen
    sys.modules[module.__name__] = module
    try:
        try:
            SplitTableBatchedEmbeddingBagsCodegen().get_learning_rate()
        except AttributeError as e:
            kind, message = rank.failure_of(e)
        assert kind == "torchrec"
        assert message.endswith("(an attribute of fbgemm_gpu's fbgemm_gpu.fake_tbe.SplitTableBatchedEmbeddingBagsCodegen, "
                                "which this environment's fbgemm-gpu lacks)"), message
        try:
            types.SimpleNamespace().missing
        except AttributeError as e:
            assert "fbgemm" not in rank.failure_of(e)[1]
    finally:
        del sys.modules[module.__name__]
