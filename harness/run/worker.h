// A rank's entry point.  Started by `dmpcheck run` (DMPCHECK_LAUNCHED=1: the scenario and the
// run come from the launcher's store) or by an external launcher such as torchrun (the
// scenario path is given; rank 0 hosts the store on MASTER_PORT, reads and validates the file
// and hands its text to the other ranks, and every run of the matrix is run in turn).
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "comm/rendezvous.h"
#include "comm/store.h"
#include "run/handover.h"

namespace dmpcheck::run {

struct WorkerOptions {
  std::optional<std::string> scenario_path;  // external launchers only
  std::string out_dir = "reports";           // external launchers: where rank 0 writes reports
  // Runs a task of `dmpcheck bench` (bench/sweep.h, which sits above run/ and sets this).
  std::function<void(comm::Store&, const comm::RankEnvironment&, const std::string& secret, const RankTask&)> bench;
};

// Returns the process exit status: 0 pass, 1 an expectation failed, 2 bad input, 3 this rank
// failed.
int worker_main(const WorkerOptions& options);

}  // namespace dmpcheck::run
