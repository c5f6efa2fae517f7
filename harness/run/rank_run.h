// One run on one rank: plan, build the DMP, check replicas at init, train, check again,
// compare with the unsharded model, and (rank 0) assemble the RunResult.
#pragma once

#include <functional>

#include <ATen/core/Tensor.h>
#include <string>

#include "check/broadcast_probe.h"
#include "check/run_result.h"
#include "scenario/scenario.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::run {

struct RankRunOptions {
  int local_world_size = 0;      // LOCAL_WORLD_SIZE of this rank; 0: the scenario's (or one host)
  std::string checkpoint_dir;    // save a sharded checkpoint after the last step under <dir>/<scenario>/<run>/
  std::string dump_batches_dir;  // rank 0 writes every global batch under <dir>/<scenario>/<run>/
  // Rank 0 writes every tensor whole at init and after every step, in the TorchRec exchange
  // format (run/tensor_exchange.h): the reference half of a side-by-side comparison.
  std::string full_state_dir;
  // Called with progress lines ("step 3/10 loss=..."); may be empty.
  std::function<void(const std::string&)> progress;
};

// Collective over `comm`.  The returned RunResult is complete on rank 0 (verdict included);
// other ranks return what they computed, which callers ignore.
check::RunResult run_on_rank(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                             comm::Communicator& comm, const RankRunOptions& options);

// `dmpcheck bench --scenario`, on one rank (collective): plans and builds the run's model as
// run_on_rank does, then probes the broadcast of its replicated parameters, whether or not the
// run's profile broadcasts them ("what would the fix cost for this model?").
check::BroadcastProbe probe_scenario_on_rank(const scenario::Scenario& scenario, const scenario::RunSpec& spec,
                                             comm::Communicator& comm, const check::ProbeOptions& options,
                                             const RankRunOptions& run_options);

// A RunResult with the run's identity filled in (scenario, run, cell, profile, init mode,
// world size, backend, expectation's description) and nothing measured yet.
check::RunResult result_header(const scenario::Scenario& scenario, const scenario::RunSpec& spec);

// FNV-1a 64 of a tensor's bytes, as 16 hex digits (RunResult::digests).
std::string tensor_digest(const at::Tensor& tensor);

// Cores available to this process (its CPU affinity), at least 1.
int available_cores();
// This host's name, or "unknown".
std::string hostname();
// Intra-op threads per rank: spec.threads_per_rank, or cores / world_size (at least 1), as
// torchrun sets OMP_NUM_THREADS so that ranks x threads <= cores.
int threads_per_rank(const scenario::RunSpec& spec, int cores);

}  // namespace dmpcheck::run
