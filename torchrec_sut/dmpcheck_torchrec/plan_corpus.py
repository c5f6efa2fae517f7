"""The plans a TorchRec release's own planner makes for a corpus of table sets, for dmpcheck's
planner test (fixtures/torchrec-plans/, harness/tests/unit/planner_test.cc).

    <release env>/bin/python -m dmpcheck_torchrec.plan_corpus CONFIGS_JSON OUT_JSON

CONFIGS_JSON: a list of {"id", "world", "lws"?, "opt"? (sparse optimizer type), "weighted"?,
"tables": [{"name", "rows", "dim", "pooling", "types", "column_shards"?, "data_type"?}]}.
Each is planned as the rank program plans a run (runner.build_planner: CPU topology, the
scenario's constraints, the sharder extended to row_wise on CPU); OUT_JSON receives
{"torchrec": version, "plans": {id: {table: [[rank, row_offset, rows, col_offset, cols], ...]}}}
with one line per configuration.  One process, nothing trained; a few seconds per hundred.
"""

import json
import logging
import os
import sys
import warnings


def spec_of(c):
    tables = []
    for t in c["tables"]:
        constraints = {}
        if t.get("types"):
            constraints["sharding_types"] = t["types"]
        if t.get("column_shards"):
            constraints["column_shards"] = t["column_shards"]
        tables.append({"name": t["name"], "rows": t["rows"], "dim": t["dim"], "features": ["f_" + t["name"]],
                       "pooling": t.get("pooling", "sum"), "weighted": bool(c.get("weighted")),
                       "data_type": t.get("data_type", "fp32"), "constraints": constraints})
    return {"world_size": c["world"], "local_world_size": c.get("lws", c["world"]), "tables": tables,
            "dense_layers": [1],
            "sparse_optimizer": {"type": c.get("opt", "sgd"), "lr": 0.1, "eps": 1e-8, "beta1": 0.9, "beta2": 0.999}}


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from dmpcheck_torchrec import runner

    with open(argv[1]) as f:
        configs = json.load(f)
    plans = {}
    for i, c in enumerate(configs):
        spec = spec_of(c)
        planner, sharders, _ = runner.build_planner(spec, c["world"], spec["local_world_size"])
        rows = runner._plan_of(planner.plan(runner.build_model(spec), sharders), {t["name"] for t in spec["tables"]})
        plans[c["id"]] = {r["table"]: [[s["rank"], s["row_offset"], s["rows"], s["col_offset"], s["cols"]] for s in r["shards"]]
                          for r in rows}
        if (i + 1) % 100 == 0:
            print(f"{i + 1} of {len(configs)} planned", file=sys.stderr, flush=True)
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        f.write('{"torchrec": %s, "plans": {\n' % json.dumps(runner._version("torchrec")))
        f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in plans.items()))
        f.write("\n}}\n")
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
