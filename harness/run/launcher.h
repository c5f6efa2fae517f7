// The launcher: hosts the rendezvous store, spawns one process per rank, prefixes their output,
// watches them, and on the first failure stops and reaps all of them.
//
// Ranks run in one process group of their own (killed as a group) and die with the launcher
// (PR_SET_PDEATHSIG); what they start outside the group is followed and killed at the end
// (run/process_tree.h), so nothing outlives a run.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "common/interrupt.h"
#include "run/handover.h"

namespace dmpcheck::run {

struct LaunchRequest {
  std::string executable;              // what each rank runs (the dmpcheck binary)
  std::vector<std::string> arguments;  // argv[1..]
  int world_size = 1;
  int local_world_size = 0;  // ranks per host (LOCAL_WORLD_SIZE); 0: world_size
  int threads_per_rank = 1;  // exported as OMP_NUM_THREADS
  // Handed to the ranks through the store before any starts.
  RankTask task;
  std::chrono::milliseconds store_timeout{std::chrono::seconds(60)};
  std::chrono::milliseconds budget{std::chrono::minutes(10)};            // the whole run
  std::chrono::milliseconds kill_grace{std::chrono::milliseconds(500)};  // SIGTERM, then SIGKILL
  // After a rank fails, how long its peers may take to end by themselves before they are stopped
  // (their failures are collected meanwhile, for the root cause).  A user's script gets longer: a
  // peer that raised too is still unwinding its interpreter.
  std::chrono::milliseconds peer_grace{std::chrono::milliseconds(500)};
  size_t last_lines_kept = 20;
  // Each line a rank prints, as it arrives (stdout and stderr together).  May be empty.
  std::function<void(int rank, const std::string& line)> on_line;
  // Programs that do not speak to dmpcheck's store (a TorchRec rank under a release's Python):
  // extra environment, the MASTER_PORT they rendezvous on themselves (0: the store's port), and
  // where a failing rank leaves its reason (<error_dir>/rank<R>/error.json, {kind, message}).
  std::map<std::string, std::string> environment;
  // ... and this launch's own names (a rendezvous file, TMPDIR): the ranks get them too, but they do
  // not choose the warm interpreter that serves the launch (`environment` does).
  std::map<std::string, std::string> launch_environment;
  int master_port = 0;
  std::string error_dir;
  // The rank's program as a function of this very binary (dmpcheck's worker).  When set, ranks
  // are forked from this process, already warm (libtorch loaded and initialised), and call it
  // with the rank's environment in place of exec-ing `executable` -- unless `exec_ranks` is set,
  // DMPCHECK_RANKS=exec is in the environment, or this process already has a second thread (a
  // fork would copy a half-held lock), in which case `executable` is exec-ed as before.
  std::function<int()> in_process;
  bool exec_ranks = false;
  // Set for a Python program run as `executable -m MODULE ...` (a TorchRec rank): the modules a
  // warm interpreter of `executable` under `environment` imports once (warm_interpreter.h); the
  // ranks are then forked from it instead of each starting a fresh interpreter -- unless
  // `exec_ranks` is set or DMPCHECK_RANKS=exec, or it cannot serve (the outcome says why).
  std::vector<std::string> warm_preload;
  // The warm interpreter's own environment where it is not the ranks' (empty: `environment`): a
  // TorchRec commit's ranks fork from the interpreter of the environment it runs over, which
  // imported torch and fbgemm_gpu but no TorchRec, and each puts the commit's source first on its
  // path (its PYTHONPATH in `environment`) before importing it.
  std::map<std::string, std::string> warm_environment;
};

struct LaunchOutcome {
  bool ok = false;  // every rank exited 0
  std::optional<check::RankFailure> failure;
  std::optional<std::string> result;  // the store's "result" key, if rank 0 set it
  std::vector<int> pids;              // of the ranks, for tests that check nothing survived
  // Per rank, in rank order: its wait status (waitpid's), and whether it was still running when the
  // launcher stopped the ranks (another rank's failure, the budget, an interrupt).
  std::vector<int> wait_statuses;
  std::vector<bool> stopped;
  // Processes the ranks started outside their process group (setsid(), a daemon) that were still
  // alive when the run ended, each "pid 123 (python3)": killed, and counted in the report.
  std::vector<std::string> strays;
  double seconds = 0.0;
  bool forked = false;  // ranks forked from this warm process, not exec-ed
  // A request with warm_preload: whether its ranks were forked from a warm interpreter (and the
  // seconds its import took, once, when it started), else why they were exec-ed.
  bool warm_interpreter = false;
  double warm_import_s = 0.0;
  std::string cold_reason;
};

// Keys a rank may set: "result" (the RunResult JSON, rank 0) and "error/<rank>" (a JSON
// object {kind, message} describing why the rank is about to exit non-zero).
LaunchOutcome launch(const LaunchRequest& request);

// "killed by signal 11 (SIGSEGV)" / "exited with status 3", of a wait status.
std::string describe_wait_status(int status);

// This process's environment with `ours` in place of the same names, and without an inherited
// MASTER_PORT (never the run's), as execve takes it.
std::vector<std::string> child_environment(const std::map<std::string, std::string>& ours);

// SIGINT and SIGTERM to this process make a running launch() stop and reap every rank and
// return a failure of kind "interrupted" (the CLI then exits 130).  Call once from main().
void install_interrupt_handlers();
using dmpcheck::interrupt_requested;

// How many threads this process has now (/proc/self/task).
int thread_count();

}  // namespace dmpcheck::run
