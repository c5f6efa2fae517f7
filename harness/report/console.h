// The terminal view of a run: one table of replicated tensors and a verdict line.
#pragma once

#include <string>

#include "check/run_result.h"

namespace dmpcheck::report {

std::string render_run_table(const check::RunResult& result);
// "VERDICT <scenario> [<run>]: PASS|FAIL|ERROR - ..." on one line.
std::string render_verdict_line(const check::RunResult& result);

}  // namespace dmpcheck::report
