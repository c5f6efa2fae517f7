#include <algorithm>

#include "check/run_result.h"

namespace dmpcheck::check {

int exit_status(const std::vector<RunResult>& results) {
  int code = 0;
  for (const auto& r : results) {
    code =
        std::max(code, exit_status(r.verdict, r.failure ? std::optional<FailureKind>(r.failure->kind) : std::nullopt));
    if (!r.report_error.empty()) code = std::max(code, 2);  // a result not kept is not a pass
  }
  return code;
}

}  // namespace dmpcheck::check
