// Judges a run against its scenario's `expect:` entry.
#pragma once

#include "check/run_result.h"
#include "scenario/scenario.h"

namespace dmpcheck::check {

// Reads result.replicas, result.global_model and result.init_broadcast.
ExpectationResult evaluate_expectation(const scenario::Expectation& expect, const RunResult& result);

}  // namespace dmpcheck::check
