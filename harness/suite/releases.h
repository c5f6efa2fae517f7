// Commands across TorchRec releases: `dmpcheck bisect` (the first release, and commit, whose
// behaviour on a scenario differs) and `dmpcheck fidelity` (the reference against each release, as Markdown).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace dmpcheck::run {

struct ReleaseOptions {
  std::vector<std::string> scenario_files;
  std::vector<std::string> releases;  // "0.6.0", ...; bisect: empty means every pinned release
  std::string worker_executable;
  std::string out_dir = "reports";
  std::string output;  // fidelity: the Markdown file to write
  // bisect: go on from the two adjacent releases where the behaviour changes to the commits between
  // their tags, or bisect only the commits of `commit_range` ("OLD..NEW"), each commit's source over
  // the environment of `over` (default: the older release; with a range, the release OLD descends from).
  bool commits = false;
  std::string commit_range;
  std::string over;
  bool fresh = false;          // releases: measure every pair again, not only what changed
  bool table_commits = false;  // releases: name the commit of each change the repository has tags for
  std::ostream* out = nullptr;
};

// A binary search for the first release (then, with `commits`, the first commit) whose behaviour
// on the scenario differs from the oldest's: the two ends first, then the middle of what is left,
// running only what it visits (every distinct cell of the scenario, its `system` replaced).  A
// point that cannot run (a release not installed, a commit that does not import) is never the
// answer: it is skipped like `git bisect skip`, and where skipped points leave the answer wider
// than one step the result says between which two it lies and which points were not tested.
// Exit: 0 the first point that differs is named; 1 both ends behave the same; 2 bad input; 3 an
// end could not run; 4 the change lies among points that could not be tested.
int bisect_releases(const ReleaseOptions& options);

// Every scenario (files, or directories searched for *.yaml) on every release: what it shows there
// (bug, fixed, absent, the release's own error ...), judged by the expectations it writes for the
// releases it names, written as a Markdown table to options.output, and kept in the JSON store
// beside it (<output without .md>.json) so that a later run measures only new pairs and changed
// scenarios.  Exit: 0 every pair measured, 4 some could not be (a release not installed).
int release_table(const ReleaseOptions& options);

// `releases --commits`: the first commit (first parents) from the older release's branch point to
// the newer release's tag whose behaviour on options.scenario_files[0] differs, each commit's source
// over the older release's environment (bisect --commits between two releases).  Returns bisect's
// exit status (0: *found is that commit); 2 where the repository lacks either tag.
struct Commit;
int first_commit_between(const ReleaseOptions& options, const std::string& older, const std::string& newer,
                         Commit* found);

// The releases `--releases` names, oldest first: a list, a range of pinned ones ("0.6.0..1.9.2"),
// or, empty, every pinned release.  Error(kInvalidInput) on anything else.
std::vector<std::string> release_list(const std::vector<std::string>& given);

// Runs the fidelity scenarios (cells with `expect: reference`) on each release and writes the
// Markdown table of per-table max abs / max rel differences, bitwise or not, to options.output.
int measure_fidelity(const ReleaseOptions& options);

// "libtorch 1.13.1 (BLAS_INFO=generic)": what the reference was built against.  The BLAS decides
// the order in which a Linear's dot products are added, so bitwise agreement with a release's
// dense layers depends on it (docs/fidelity.md).
std::string libtorch_build();

}  // namespace dmpcheck::run
