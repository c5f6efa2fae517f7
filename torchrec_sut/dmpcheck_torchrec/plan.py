"""The plan a TorchRec release's own planner makes for a scenario run, without running it.

    python -m dmpcheck_torchrec.plan SPEC_JSON OUT_JSON

SPEC_JSON is the run as the rank program reads it (contract.RunSpec, its topology included);
OUT_JSON receives a contract.PlanAnswer: the release's versions, the plan rows of meta.json, notes.  One process and no process
group: EmbeddingShardingPlanner.plan() on the same model, constraints, sharder and topology the
rank program hands to collective_plan(), which plans on rank 0 and broadcasts that plan.
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import List


def main(argv: List[str]) -> int:
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__)
        return 0 if len(argv) == 2 else 2
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from dmpcheck_torchrec import contract, runner
    from dmpcheck_torchrec.models import build_model
    from dmpcheck_torchrec.planning import build_planner, plan_of

    spec = contract.load(contract.RunSpec, argv[1])
    planner, sharders, notes = build_planner(spec, spec.world_size, spec.local_world_size)
    rows = plan_of(planner.plan(build_model(spec), sharders), {t.name for t in spec.tables})
    contract.save(contract.PlanAnswer(versions=runner.versions(), plan=rows, notes=notes), argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
