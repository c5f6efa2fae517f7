#include "common/error.h"

namespace dmpcheck {

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidScenario: return "invalid_scenario";
    case ErrorKind::kInvalidInput: return "invalid_input";
    case ErrorKind::kCommunication: return "communication";
    case ErrorKind::kTimeout: return "timeout";
    case ErrorKind::kRankFailed: return "rank_failed";
    case ErrorKind::kInternal: return "internal";
    case ErrorKind::kInjected: return "injected";
  }
  return "unknown";
}

void throw_error(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

void throw_internal(const char* file, int line, const char* condition, std::string message) {
  throw Error(ErrorKind::kInternal,
              fmt::format("internal error at {}:{}: {} ({}); this is a dmpcheck bug", file, line, message, condition));
}

}  // namespace dmpcheck
