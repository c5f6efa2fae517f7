// What `run` would reject, found before any rank starts: every run's plan (the planner's own
// errors, e.g. a column_wise split that does not divide the dim) and the memory the ranks on
// this host would hold against what the host has.  `validate`, `run` and `suite` call it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario/scenario.h"

namespace dmpcheck::run {

struct RunMemory {
  int ranks_on_host = 0;
  int64_t host_bytes = 0;    // what the ranks on this host hold at their peak, together
  int64_t largest_rank = 0;  // the peak of the fullest rank
  std::string breakdown;     // that rank's peak, by kind
};

// The memory of one run's ranks, all on this host as dmpcheck's launcher starts them (planned as
// they will plan it).  Error(kInvalidScenario) naming the run when its plan fails.
RunMemory estimate_run_memory(const scenario::RunSpec& spec);

// Every run's plan and memory; Error(kInvalidScenario) listing each run that fails, with the
// numbers.  `available`: 0 = what this host can give now, MemAvailable from /proc/meminfo (or
// $DMPCHECK_MEMORY_AVAILABLE, bytes, to plan for another host).
void preflight(const scenario::Scenario& scenario, int64_t available = 0);

// MemAvailable from /proc/meminfo, in bytes; 0 where it does not say.
int64_t meminfo_available_bytes();

// "1.5 GiB", "3.6 PiB".
std::string human_bytes(double bytes);

}  // namespace dmpcheck::run
