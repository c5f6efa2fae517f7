// What a scenario's cells show when they run on a system other than the one they were written
// for: the behaviour `dmpcheck bisect` compares between points and `dmpcheck releases` tabulates.
//
// A regression scenario says, release by release, what a real TorchRec showed (reproduces.releases:
// bug, fixed, absent, not runnable ...), and its cells on those releases carry the expectations
// that check it.  Run on another release or commit, a cell is judged against each of those
// expectations in turn: meeting only the bug release's is "bug", only the fixed one's "fixed".  So
// a report that shows in a global_model comparison, not in the replicas, is still told apart.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

// A behaviour the scenario names for one of its cells: what real `system` showed, and the
// expectations that check it there.
struct NamedBehaviour {
  std::string system;  // "torchrec==0.6.0", or "profile torchrec-0.6" for a reference profile
  // "bug", "fixed", "absent", "not runnable", "not reproduced", or "as written" where the scenario
  // names no release's behaviour (its release cells' expectations are what a release should show)
  std::string status;
  scenario::Expectation expect;
  std::optional<size_t> run;  // that release's own cell in the replaced scenario (none for a profile)
};

// One distinct cell of a scenario (its matrix cell without `system` and `profile`), on the system
// that replaced the scenario's own.
struct CellOnSystem {
  std::string label;  // "init.mode=unseeded", or "default"
  size_t run = 0;     // the run of the replaced scenario that is executed first
  // That run's own expectation: a named behaviour is judged on it only where it asks for the same
  // comparisons (else on that release's own cell).
  scenario::Expectation expect;
  std::vector<NamedBehaviour> named;
  // Every release named expects the same working behaviour here (a workaround, the seeded run
  // beside the unseeded one): it tells no behaviour apart, but a release that fails it is news.
  bool control = false;
};

// `original`: the scenario as written; `replaced`: the same file loaded with `system` overridden.
// The run executed for a cell is the one written for the newest release the scenario names, so it
// asks for the comparisons that release's expectations judge.
std::vector<CellOnSystem> cells_on_system(const scenario::Scenario& original, const scenario::Scenario& replaced);

// A matrix cell's label without `system` and `profile`, as CellOnSystem::label: "init.mode=unseeded", or "default".
std::string cell_label(const std::vector<std::pair<std::string, std::string>>& cell);

struct Behaviour {
  // Compared between points: "bug", "fixed", "absent", "not runnable", "not reproduced", "as written",
  // "control" (a control cell that ran as every release named expects),
  // "undecided" (the result meets the expectations of two behaviours), or, where it meets none or
  // the scenario names none, "other: " and the observation.
  std::string key;
  std::string text;  // shown: the observation, then which named behaviour it is
  bool skipped = false;
  bool failed = false;  // a rank failed (the release's own error, unless a named behaviour expects it)
};

Behaviour behaviour_of(const CellOnSystem& cell, const check::RunResult& result);

// Whether a failure is what the environment explains rather than what the code does (an import,
// an fbgemm or torch operator, schema or attribute the environment's builds lack): for a commit over
// an environment dmpcheck chose, no behaviour of the commit.
bool environment_explains(const check::RunResult& result);

// Runs the cell (`run` executes one run of the replaced scenario) and judges it; where it meets no
// named behaviour, each named release's own cell is run too and judged by its own expectations
// (one release's cell may ask for another comparison than the newest's, or none).
Behaviour judge_cell(const CellOnSystem& cell, const std::function<check::RunResult(size_t)>& run);

// "replicas equal", "replicas DIVERGE on 2 tensor(s): a, b", "error (torchrec): ...", "skipped: ...".
std::string observation(const check::RunResult& result);

// Whether `result` meets `expect`: a failure only where it expects that failure.
bool meets(const scenario::Expectation& expect, const check::RunResult& result, std::string* why_not = nullptr);

}  // namespace dmpcheck::run
