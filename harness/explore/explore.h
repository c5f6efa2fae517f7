// `dmpcheck explore`: a seeded differential search of a TorchRec release against its own unsharded
// model.  Configurations drawn from explore/space.h run on the release, each held to replicas equal
// and the unsharded oracle; one the release refuses (its own exception, or dmpcheck's unsupported)
// is counted as refused; one that runs and breaks a check, or crashes or hangs, is a finding.  A
// finding is minimised (C-Reduce's loop: each simplification kept only if the same failure stays),
// de-duplicated by what its minimised configuration still needs, and written as a scenario file
// with its `reproduces` block; `against` runs each on a second release too.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace dmpcheck::explore {

struct ExploreOptions {
  std::string system;        // "torchrec==1.9.2", a commit or an interpreter: what is searched
  std::string against;       // a second system each finding is run on ("" none)
  double budget_s = 1200.0;  // drawing stops when this has passed (a minimisation under way finishes)
  uint64_t seed = 1;
  int max_configs = 0;      // 0: no limit but the budget
  int minimise_tries = 60;  // runs a finding's minimisation may make
  std::string out_dir;      // findings/*.yaml, explore.json, explore.md
  std::string worker_executable;
  std::ostream* out = nullptr;  // one progress line, then the summary
};

// Exit: 0 the search ran and found nothing, 1 it wrote findings, 2 bad input, 3 the release could
// not run even the simplest configuration (not installed: the command that installs it is said).
int run_explore(const ExploreOptions& options);

}  // namespace dmpcheck::explore
