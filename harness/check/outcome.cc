#include <algorithm>

#include "check/run_result.h"

namespace dmpcheck::check {

int exit_status(const std::vector<RunResult>& results) {
  int code = 0;
  for (const auto& r : results) {
    code =
        std::max(code, exit_status(r.verdict, r.failure ? std::optional<FailureKind>(r.failure->kind) : std::nullopt));
  }
  return code;
}

}  // namespace dmpcheck::check
