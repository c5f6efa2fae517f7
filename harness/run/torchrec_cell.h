// A run on an installed TorchRec release: the same scenario cell, the same batches, judged by the
// same checks as the reference.  The launcher writes the run spec and every rank's local batches
// into a private exchange directory, starts `python -m dmpcheck_torchrec.rank` (torchrun's
// variables) under the release environment's interpreter, and reads back each rank's tensors
// after init and after every step (run/tensor_exchange.h).
#pragma once

#include <optional>
#include <string>

#include "check/run_result.h"
#include "dmp/planner.h"
#include "run/scenario_runner.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

struct TorchRecEnvironment {
  std::string version;                      // "0.6.0"
  std::string dir;                          // the venv
  std::string python;                       // <dir>/bin/python
  std::string torchrec, torch, fbgemm_gpu;  // as its own import reported them (dmpcheck-ready.json)
};

// $DMPCHECK_TORCHREC_ENVS, else $XDG_CACHE_HOME/dmpcheck/torchrec, else ~/.cache/dmpcheck/torchrec.
std::string torchrec_environments_root();
// The ready environment of a release, or nullopt with `why_not` saying how to install it.
std::optional<TorchRecEnvironment> find_torchrec_environment(const std::string& version, std::string* why_not);
// Where the dmpcheck_torchrec package lives: $DMPCHECK_TORCHREC_SUT, else this source tree's torchrec_sut/.
std::string torchrec_sut_dir();

// Runs cell `index` (its system is a release) and returns its RunResult; writes its JSON report
// when options.write_reports.  A missing environment is a skipped cell naming the install command.
check::RunResult run_torchrec_cell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options);

// The plan the release's own planner makes for `spec` (`python -m dmpcheck_torchrec.plan`: one
// process, no training), in the reference's terms.  `label` receives "torchrec X (torch Y)".
// Error(kInvalidInput) when the release is not installed or its planner fails, with its output.
dmp::ShardingPlan torchrec_planner_plan(const scenario::RunSpec& spec, const std::string& version, std::string* label);

}  // namespace dmpcheck::run
