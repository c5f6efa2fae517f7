// The reference cell: a scenario's run on dmpcheck's own DistributedModelParallel, one process per
// rank (`dmpcheck worker`, forked from this process or exec-ed), judged inside the ranks.
#pragma once

#include <optional>

#include "run/cell.h"
#include "run/handover.h"

namespace dmpcheck::run {

// Runs cell `index` on the reference.  `half`: as the reference half of a release cell's
// side-by-side comparison (handover.h's ReferenceHalf), whatever the cell's system.  A backend
// this machine lacks, or what the reference cannot model, is a skipped cell saying why.
check::RunResult run_reference_cell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options,
                                    const std::optional<ReferenceHalf>& half = std::nullopt);

class ReferenceCellKind : public CellKind {
 public:
  const char* name() const override { return "reference"; }
  bool takes(const scenario::RunSpec& spec) const override { return !spec.on_torchrec(); }
  check::RunResult run(const scenario::Scenario& scenario, size_t index,
                       const ScenarioRunOptions& options) const override {
    return run_reference_cell(scenario, index, options);
  }
};

}  // namespace dmpcheck::run
