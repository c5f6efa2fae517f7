// Commands across TorchRec releases: `dmpcheck bisect` (the first release whose behaviour on a
// scenario differs) and `dmpcheck fidelity` (the reference against each release, as Markdown).
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace dmpcheck::run {

struct ReleaseOptions {
  std::vector<std::string> scenario_files;
  std::vector<std::string> releases;  // "0.6.0", ...
  std::string worker_executable;
  std::string out_dir = "reports";
  std::string output;  // fidelity: the Markdown file to write
  std::ostream* out = nullptr;
};

// Runs every cell of the scenario on each release (the scenario's `system` replaced) and prints
// what each showed: replicas equal, which diverge, or the error.  Exit: 0 when the behaviour
// changes between two installed releases (the first such release is printed), 1 when it never
// does, 2 bad input, 3 when no release could run.
int bisect_releases(const ReleaseOptions& options);

// Runs the fidelity scenarios (cells with `expect: reference`) on each release and writes the
// Markdown table of per-table max abs / max rel differences, bitwise or not, to options.output.
int measure_fidelity(const ReleaseOptions& options);

// "libtorch 1.13.1 (BLAS_INFO=generic)": what the reference was built against.  The BLAS decides
// the order in which a Linear's dot products are added, so bitwise agreement with a release's
// dense layers depends on it (docs/fidelity.md).
std::string libtorch_build();

}  // namespace dmpcheck::run
