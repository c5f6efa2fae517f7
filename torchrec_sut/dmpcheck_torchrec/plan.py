"""The plan a TorchRec release's own planner makes for a scenario run, without running it.

    python -m dmpcheck_torchrec.plan SPEC_JSON OUT_JSON

SPEC_JSON is the run as the rank program reads it (spec.json); OUT_JSON receives
{"plan": [...], "notes": [...]} with the plan rows of meta.json.  One process and no process
group: EmbeddingShardingPlanner.plan() on the same model, constraints, sharder and topology the
rank program hands to collective_plan(), which plans on rank 0 and broadcasts that plan.
"""

import json
import logging
import os
import sys
import warnings


def main(argv):
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import torch
    from torchrec import EmbeddingBagConfig, PoolingType
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    from dmpcheck_torchrec import runner

    with open(argv[1]) as f:
        spec = json.load(f)
    pooling = {"sum": PoolingType.SUM, "mean": PoolingType.MEAN}
    tables = [EmbeddingBagConfig(name=t["name"], embedding_dim=t["dim"], num_embeddings=t["rows"],
                                 feature_names=list(t["features"]), pooling=pooling[t["pooling"]])
              for t in spec["tables"]]
    features = [f for t in spec["tables"] for f in t["features"]]
    weighted = [t["weighted"] for t in spec["tables"]]
    model = runner.Model(tables, spec["dense_layers"], features, all(weighted) and bool(weighted))
    opt_cls, opt_kwargs = runner._sparse_optimizer(spec["sparse_optimizer"])
    apply_optimizer_in_backward(opt_cls, model.ebc.parameters(), dict(opt_kwargs))
    constraints, notes = runner._constraints(spec)
    sharder, sharder_notes = runner._sharder(spec)
    world = int(spec["world_size"])
    local = int(spec.get("local_world_size") or world)
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=local)
    plan = EmbeddingShardingPlanner(topology=topology, constraints=constraints).plan(model, [sharder])
    rows = runner._plan_of(plan, {t["name"] for t in spec["tables"]})
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"plan": rows, "notes": notes + sharder_notes, "torchrec": runner._version("torchrec"),
                   "torch": torch.__version__}, f)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
