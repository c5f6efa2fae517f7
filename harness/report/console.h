// The terminal view of a run: one table of replicated tensors and a verdict line.
#pragma once

#include <string>

#include "check/run_result.h"

namespace dmpcheck::report {

// "real torchrec 0.6.0 (torch 2.2.0, fbgemm-gpu-cpu 0.6.0)" or "reference, profile current (simulated)".
std::string system_label(const check::RunResult& r);

std::string render_run_table(const check::RunResult& result);
// "VERDICT <scenario> [<run>]: PASS|FAIL|ERROR - ..." on one line.
std::string render_verdict_line(const check::RunResult& result);

}  // namespace dmpcheck::report
