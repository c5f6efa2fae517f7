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

    from dmpcheck_torchrec import runner

    with open(argv[1]) as f:
        spec = json.load(f)
    world = int(spec["world_size"])
    planner, sharders, notes = runner.build_planner(spec, world, int(spec.get("local_world_size") or world))
    plan = planner.plan(runner.build_model(spec), sharders)
    rows = runner._plan_of(plan, {t["name"] for t in spec["tables"]})
    tmp = argv[2] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"plan": rows, "notes": notes, "torchrec": runner._version("torchrec"),
                   "torch": torch.__version__}, f)
    os.replace(tmp, argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
