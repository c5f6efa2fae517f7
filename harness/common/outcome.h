// What a run came to, as types: its verdict, the kind of failure that stopped it, and the one
// policy that turns them into dmpcheck's exit status (docs/errors.md).  Reports write these as
// the names below; nothing compares their text.  Here, below every layer, because scenarios
// name the failure kind they expect (`expect: error: {kind: ...}`).
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace dmpcheck {

enum class Verdict {
  kPass,     // every expectation held (an expected failure included)
  kFail,     // an expectation did not hold
  kError,    // a rank failed or the scenario did not load: no verdict on expectations
  kSkipped,  // the cell cannot run here (no GPU for NCCL, a table type the reference lacks)
};

std::string_view verdict_name(Verdict verdict);  // "pass", "fail", "error", "skipped"
std::optional<Verdict> parse_verdict(std::string_view name);

// Why a run stopped.  The first seven are dmpcheck's ErrorKinds raised inside a rank; the others
// are what the launcher saw or what a TorchRec release's rank program reported.
enum class FailureKind {
  kInvalidScenario,
  kInvalidInput,
  kCommunication,
  kTimeout,     // a collective passed its deadline, or the run its budget
  kRankFailed,  // a rank exited non-zero without saying why
  kInternal,
  kInjected,     // the scenario injected it (a `throw` fault)
  kCrashed,      // a rank was killed by a signal
  kInterrupted,  // dmpcheck itself received SIGINT or SIGTERM
  kTorchRec,     // a release raised (its own exception, its own text)
  kUnsupported,  // the release's rank program cannot express what the scenario asks
  kImport,       // the release's environment could not import torch / torchrec
  kHook,         // a scenario's hook (torchrec: {hooks}) raised, did not import, or returned what cannot be compared
  kEnvironment,  // the system's environment could not be made (the installer failed: a set the resolver refuses)
  kOracle,       // the release's own unsharded model (global_model's oracle, on rank 0 after the sharded run) raised
};

std::string_view failure_kind_name(FailureKind kind);
std::optional<FailureKind> parse_failure_kind(std::string_view name);
FailureKind failure_kind_of(ErrorKind kind);
std::vector<std::string_view> failure_kind_names();

// dmpcheck's exit status for one run: 0 passed or skipped, 1 an expectation did not hold,
// 2 bad input found before any rank started (a scenario that did not load), 3 any other error,
// 130 interrupted.  The status of many runs is the largest of theirs.
int exit_status(Verdict verdict, std::optional<FailureKind> failure);
// The exit status of a command stopped by an error before or outside any run's verdict: 2 for bad
// input (a scenario, a flag, a file), 3 for everything else (a rank, the store, a release's
// output, dmpcheck itself).  main() and validate use it; docs/errors.md says the same.
int exit_status(ErrorKind kind);

}  // namespace dmpcheck

// fmt prints both by name ("{}" -> "pass", "crashed").
template <>
struct fmt::formatter<dmpcheck::Verdict> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(dmpcheck::Verdict v, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(dmpcheck::verdict_name(v), ctx);
  }
};
template <>
struct fmt::formatter<dmpcheck::FailureKind> : fmt::formatter<std::string_view> {
  template <typename Context>
  auto format(dmpcheck::FailureKind k, Context& ctx) const {
    return fmt::formatter<std::string_view>::format(dmpcheck::failure_kind_name(k), ctx);
  }
};
