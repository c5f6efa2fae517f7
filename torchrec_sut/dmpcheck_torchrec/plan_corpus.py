"""The plans a TorchRec release's own planner makes for a corpus of table sets, for dmpcheck's
planner test (fixtures/torchrec-plans/, harness/tests/unit/planner_test.cc).

    <release env>/bin/python -m dmpcheck_torchrec.plan_corpus CONFIGS_JSON OUT_JSON

CONFIGS_JSON: a list of {"id", "world", "lws"?, "opt"? (sparse optimizer type), "weighted"?,
"tables": [{"name", "rows", "dim", "pooling", "types", "column_shards"?, "data_type"?}]}.
Each is planned as the rank program plans a run (planning.build_planner: CPU topology, the
scenario's constraints, the sharder extended to row_wise on CPU); OUT_JSON receives
{"torchrec": version, "plans": {id: {table: [[rank, row_offset, rows, col_offset, cols], ...]}}}
with one line per configuration.  One process, nothing trained; a few seconds per hundred.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Dict, List

if TYPE_CHECKING:
    from dmpcheck_torchrec import contract


def spec_of(c: Dict[str, Any]) -> contract.RunSpec:
    """Configuration `c` as the run the rank program would be handed (a contract.RunSpec)."""
    from dmpcheck_torchrec import contract

    tables = [contract.Table(name=t["name"], rows=t["rows"], dim=t["dim"], features=["f_" + t["name"]],
                             pooling=t.get("pooling", "sum"), weighted=bool(c.get("weighted")),
                             data_type=t.get("data_type", "fp32"),
                             constraints=contract.Constraints(sharding_types=list(t.get("types") or []),
                                                              column_shards=int(t.get("column_shards") or 0)))
              for t in c["tables"]]
    world = c["world"]
    return contract.RunSpec(
        world_size=world, local_world_size=c.get("lws", world), steps=1, batch_size=8, timeout_s=60.0,
        sharder="extended", module="embedding_bag_collection", loop="plain", data_iterator="fresh",
        seeds=[0] * world, start=contract.Start(kind="seed", state="", load="after_wrap"), tables=tables,
        dense_layers=[1],
        sparse_optimizer=contract.SparseOptimizer(type=c.get("opt", "sgd"), lr=0.1, eps=1e-8, beta1=0.9,
                                                  beta2=0.999, weight_decay=0.0, weight_decay_mode="none"),
        dense_optimizer=contract.DenseOptimizer(type="sgd", lr=0.1, eps=1e-8, beta1=0.9, beta2=0.999, momentum=0.0,
                                                weight_decay=0.0))


def main(argv: List[str]) -> int:
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from dmpcheck_torchrec import runner
    from dmpcheck_torchrec.models import build_model
    from dmpcheck_torchrec.planning import build_planner, plan_of

    with open(argv[1]) as f:
        configs = json.load(f)
    plans: Dict[str, Dict[str, List[List[int]]]] = {}
    for i, c in enumerate(configs):
        spec = spec_of(c)
        planner, sharders, _ = build_planner(spec, spec.world_size, spec.local_world_size)
        rows = plan_of(planner.plan(build_model(spec), sharders), {t.name for t in spec.tables})
        plans[c["id"]] = {r.table: [[s.rank, s.row_offset, s.rows, s.col_offset, s.cols] for s in r.shards] for r in rows}
        if (i + 1) % 100 == 0:
            print(f"{i + 1} of {len(configs)} planned", file=sys.stderr, flush=True)
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        f.write('{"torchrec": %s, "plans": {\n' % json.dumps(runner.versions().torchrec))
        f.write(",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in plans.items()))
        f.write("\n}}\n")
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
