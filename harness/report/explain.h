// `dmpcheck explain`: what a run would do, without running it: the plan (per table its
// sharding, shards with ranks, shapes and bytes) and the collectives each training step issues.
#pragma once

#include <string>

#include "dmp/planner.h"
#include "scenario/scenario.h"

namespace dmpcheck::report {

std::string explain_run(const scenario::RunSpec& run);
// The table lines of a plan for `run` (the reference's, or one a TorchRec release's planner made).
std::string explain_placement(const scenario::RunSpec& run, const dmp::ShardingPlan& plan);

}  // namespace dmpcheck::report
