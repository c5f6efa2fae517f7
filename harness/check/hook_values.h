// The values a release cell's hooks returned (torchrec: {hooks}), on each rank and in the unsharded
// oracle (kUnshardedRank): judged against `expect: observed` and described for the console.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "check/run_result.h"

namespace dmpcheck::check {

// `expect: observed`: every rank's last value of each name is the one expected (numbers as numbers,
// booleans in any case YAML writes them).  One line per unmet name and rank; the oracle's values are
// not held to it.
void judge_observed(const std::vector<std::pair<std::string, std::string>>& expected,
                    const std::vector<Observation>& observed, int world_size, std::vector<std::string>& failures);

// One console line for `name`: its last value on every rank, whether the ranks agree, and what the
// unsharded oracle's same hook returned at the same step (agrees, DIFFERS) where it returned it.
std::string describe_hook_value(const std::string& name, const std::vector<Observation>& observed);

}  // namespace dmpcheck::check
