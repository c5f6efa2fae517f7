#include "common/outcome.h"

#include "common/names.h"

namespace dmpcheck {
namespace {

constexpr Named<Verdict> kVerdicts[] = {
    {Verdict::kPass, "pass"}, {Verdict::kFail, "fail"}, {Verdict::kError, "error"}, {Verdict::kSkipped, "skipped"}};
constexpr Named<FailureKind> kFailureKinds[] = {
    {FailureKind::kInvalidScenario, "invalid_scenario"},
    {FailureKind::kInvalidInput, "invalid_input"},
    {FailureKind::kCommunication, "communication"},
    {FailureKind::kTimeout, "timeout"},
    {FailureKind::kRankFailed, "rank_failed"},
    {FailureKind::kInternal, "internal"},
    {FailureKind::kInjected, "injected"},
    {FailureKind::kCrashed, "crashed"},
    {FailureKind::kInterrupted, "interrupted"},
    {FailureKind::kTorchRec, "torchrec"},
    {FailureKind::kUnsupported, "unsupported"},
    {FailureKind::kImport, "import"},
    {FailureKind::kHook, "hook"},
    {FailureKind::kEnvironment, "environment"},
    {FailureKind::kOracle, "oracle"},
};

}  // namespace

std::string_view verdict_name(Verdict verdict) { return name_in(kVerdicts, verdict); }
std::optional<Verdict> parse_verdict(std::string_view name) { return value_in(kVerdicts, name); }
std::string_view failure_kind_name(FailureKind kind) { return name_in(kFailureKinds, kind); }
std::optional<FailureKind> parse_failure_kind(std::string_view name) { return value_in(kFailureKinds, name); }
std::vector<std::string_view> failure_kind_names() {
  std::vector<std::string_view> out;
  for (const auto& entry : kFailureKinds) out.push_back(entry.name);
  return out;
}

FailureKind failure_kind_of(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidScenario: return FailureKind::kInvalidScenario;
    case ErrorKind::kInvalidInput: return FailureKind::kInvalidInput;
    case ErrorKind::kCommunication: return FailureKind::kCommunication;
    case ErrorKind::kTimeout: return FailureKind::kTimeout;
    case ErrorKind::kRankFailed: return FailureKind::kRankFailed;
    case ErrorKind::kInternal: return FailureKind::kInternal;
    case ErrorKind::kInjected: return FailureKind::kInjected;
  }
  return FailureKind::kInternal;
}

int exit_status(Verdict verdict, std::optional<FailureKind> failure) {
  switch (verdict) {
    case Verdict::kPass:
    case Verdict::kSkipped: return 0;
    case Verdict::kFail: return 1;
    case Verdict::kError: break;
  }
  if (failure == FailureKind::kInterrupted) return 130;
  // A scenario that did not load is bad input; anything else that errs is a rank's failure.
  return failure == FailureKind::kInvalidScenario ? 2 : 3;
}

int exit_status(ErrorKind kind) {
  return kind == ErrorKind::kInvalidScenario || kind == ErrorKind::kInvalidInput ? 2 : 3;
}

}  // namespace dmpcheck
