// A run on an installed TorchRec release: the same scenario cell, the same batches, judged by the
// same checks as the reference.  The launcher writes the run spec and every rank's local batches
// into a private exchange directory, starts `python -m dmpcheck_torchrec.rank` (torchrun's
// variables) under the release environment's interpreter, and reads back each rank's tensors
// after init and after every step (run/tensor_exchange.h).
#pragma once

#include <string>

#include "check/run_result.h"
#include "dmp/planner.h"
#include "run/scenario_runner.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

// Runs cell `index` (its system is a release) and returns its RunResult; writes its JSON report
// when options.write_reports.  A missing environment is a skipped cell naming the install command.
check::RunResult run_torchrec_cell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options);

// The plan the release's own planner makes for `spec` (`python -m dmpcheck_torchrec.plan`: one
// process, no training), in the reference's terms.  `label` receives "torchrec X (torch Y)".
// Error(kInvalidInput) when the release is not installed or its planner fails, with its output.
dmp::ShardingPlan torchrec_planner_plan(const scenario::RunSpec& spec, const std::string& version, std::string* label);

}  // namespace dmpcheck::run
