// `dmpcheck explain`: what a run would do, without running it: the plan (per table its
// sharding, shards with ranks, shapes and bytes) and the collectives each training step issues.
#pragma once

#include <string>

#include "scenario/scenario.h"

namespace dmpcheck::report {

std::string explain_run(const scenario::RunSpec& run);

}  // namespace dmpcheck::report
