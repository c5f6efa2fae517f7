// The script cell: the user's own Python program (`script:`), unchanged, started on every rank as
// torchrun starts it (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) under
// the run's TorchRec system (a release, a commit over its release, an interpreter).  Every rank
// starts with torchrec_sut's audit_boot first on PYTHONPATH: its env:// rendezvous is a FileStore
// in the cell's private directory (no port opened), and, unless `script.audit: false`, the audit
// digests every replicated tensor of every DistributedModelParallel the script builds, compared
// across ranks afterwards (dmpcheck_torchrec.audit_compare).  Judged by the replicas and by each
// rank's exit, output and exception (check/script_checks.h).
#pragma once

#include "run/cell.h"

namespace dmpcheck::run {

class ScriptCellKind : public CellKind {
 public:
  const char* name() const override { return "script"; }
  bool takes(const scenario::RunSpec& spec) const override { return spec.script.has_value(); }
  // A commit among them without --torchrec-repo is the command line's mistake.
  void before_cells(const std::vector<const scenario::RunSpec*>& specs,
                    const ScenarioRunOptions& options) const override;
  // A missing environment is a skipped cell naming the install command; a script that fails where
  // no expectation judges a failure is the cell's error, with the failing rank's own lines.
  check::RunResult run(const scenario::Scenario& scenario, size_t index,
                       const ScenarioRunOptions& options) const override;
};

}  // namespace dmpcheck::run
