// The release cell: a run on a TorchRec release (or a commit, or the user's interpreter), the same
// scenario cell and the same batches as the reference's, judged by the same checks.  It writes the
// run spec and every rank's local batches into a private exchange directory, starts
// `python -m dmpcheck_torchrec.rank` (torchrun's variables) under the system's interpreter, and
// reads back each rank's tensors after init and after every step (run/tensor_exchange.h).
#pragma once

#include <string>

#include "run/cell.h"

namespace dmpcheck::run {

class ReleaseCellKind : public CellKind {
 public:
  const char* name() const override { return "release"; }
  bool takes(const scenario::RunSpec& spec) const override { return spec.on_torchrec(); }
  // A commit among them without --torchrec-repo is the command line's mistake; the installed
  // releases' warm interpreters start importing in the background.
  void before_cells(const std::vector<const scenario::RunSpec*>& specs,
                    const ScenarioRunOptions& options) const override;
  // A missing environment is a skipped cell naming the install command.
  check::RunResult run(const scenario::Scenario& scenario, size_t index,
                       const ScenarioRunOptions& options) const override;
};

}  // namespace dmpcheck::run
