// What one run produced: plain structs that every report renders from (report/), so the JSON,
// the console table and later reports can never disagree.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "check/outcome.h"
#include "dmp/planner.h"
#include "scenario/phase.h"

namespace dmpcheck::check {

// What the rank-0 broadcast of replicated state cost (check/broadcast_probe.h measures it).
struct LatencyStats {
  double min_s = 0.0;
  double p50_s = 0.0;
  double p99_s = 0.0;  // nearest rank
  double max_s = 0.0;
  double mean_s = 0.0;
};

struct BroadcastMethodCost {
  std::string method;            // per_tensor, coalesced, framework, raw
  int64_t bucket_cap_bytes = 0;  // coalesced and framework; 0 otherwise
  int64_t collectives = 0;       // broadcasts per iteration (buckets)
  LatencyStats end_to_end;       // flatten, broadcast, copy back
  double algbw_gbps = 0.0;
  double busbw_gbps = 0.0;
  std::optional<LatencyStats> device;  // NCCL only: the collectives' CUDA-event time
  std::optional<double> device_algbw_gbps;
};

struct BroadcastProbe {
  bool performed = false;
  std::string backend;
  int world_size = 0;
  int64_t bytes = 0;
  int64_t tensors = 0;
  int warmup = 0;
  int iterations = 0;
  std::vector<BroadcastMethodCost> methods;
  std::string note;  // e.g. why the framework baseline is missing
};

// One replicated tensor compared across ranks at one phase.  Agreed by all ranks.
struct TensorCheck {
  std::string name;
  std::string sharding;  // data_parallel, dense
  scenario::Phase phase = scenario::Phase::kInit;
  bool equal = true;               // bitwise identical on every rank
  double max_abs_diff = 0.0;       // largest |x_r - x_0| over ranks r and elements
  int64_t elements_differing = 0;  // elements where some rank differs from rank 0
  int64_t numel = 0;
  std::vector<int> differing_ranks;  // ranks whose copy differs from rank 0's
};

// One full tensor of the sharded model compared with the unsharded model's; the worst step.
struct GlobalModelCheck {
  std::string name;
  int step = 0;  // 1-based step where the excess was largest
  double max_abs_diff = 0.0;
  double max_allowed_excess = -1e300;  // max(|a-b| - (atol + rtol*|b|)); <= 0 within tolerance
  bool within_tolerance = true;
  bool comparable = true;  // false when shapes differ (a note says why), or only one side holds it
  bool one_sided = false;  // only one side holds it (not in reports): no difference of values
  std::string note;
  int64_t numel = 0;
};

struct BroadcastCost {
  bool performed = false;
  int64_t bytes = 0;
  int64_t tensors = 0;
  int64_t collectives = 0;
  int64_t bucket_cap_bytes = 0;
  double seconds = 0.0;  // max over ranks
  double gbps = 0.0;     // bytes / seconds / 1e9 (algbw = busbw for broadcast)
};

struct TablePlacement {
  std::string table;
  std::string sharding;
  std::vector<dmp::Shard> shards;  // the plan's own shards, as a report records them
};

struct Environment {
  std::string libtorch_version;
  std::string backend;
  std::string host;
  std::string git_revision;
  int world_size = 0;
  int cores = 0;
  int threads_per_rank = 0;
};

struct ExpectationResult {
  std::string description;
  bool held = false;
  std::vector<std::string> failures;  // one line each, naming tensors and ranks
};

struct RankFailure {
  int rank = -1;
  FailureKind kind = FailureKind::kRankFailed;
  std::string cause;  // e.g. "exited with status 3", "killed by signal 11 (SIGSEGV)"
  std::string message;
  std::vector<std::string> last_lines;
};

struct Timings {
  double init_s = 0.0;
  double train_s = 0.0;
  double check_s = 0.0;
  double total_s = 0.0;  // as the launcher saw it, spawn to reap
};

// Replicas compared after one training step (0 = at init): how many replicated tensors differ
// across ranks and the largest |diff|.
struct StepDivergence {
  int step = 0;
  int tensors_differing = 0;
  double max_abs_diff = 0.0;
};

// One tensor of a TorchRec run compared with the reference DMP's after one step (0: at init).
struct ReferenceDiff {
  std::string name;
  int step = 0;
  double max_abs_diff = 0.0;
  double max_rel_diff = 0.0;       // over elements whose reference value is not 0
  int64_t elements_differing = 0;  // not bitwise equal
  int64_t numel = 0;
  bool within_tolerance = true;  // every |a - b| <= atol + rtol * |b|
  std::string note;              // "only in TorchRec", "only in the reference", "shapes differ: ..."
  bool one_sided = false;        // only one side holds it (the note says which): no difference of values
};

// What ran: the reference DMP (under a behaviour profile) or an installed TorchRec release.
struct SystemUnderTest {
  std::string name = "reference";  // "reference" or "torchrec==0.6.0"
  // Versions the release's own import reported (TorchRec cells); empty for the reference.
  std::string torchrec;
  std::string torch;
  std::string fbgemm_gpu;
  // True where a verdict about TorchRec comes from a behaviour profile of the reference (a
  // simulation), false where a real release ran.
  bool simulated = true;
  std::vector<std::string> notes;  // how the release was driven where it matters
};

// What one rank's training loop did on a release (`torchrec: {loop, epochs}`).
struct RankLoop {
  int rank = 0;
  std::vector<int64_t> batches;       // executed, per epoch
  int64_t next_after_exhausted = 0;   // next() asked of its data iterator after it was exhausted
  std::vector<int64_t> eval_batches;  // executed, per eval pass (one after every epoch)
};

// One rank of a script cell: how it ended, the exception its last traceback named, every line it
// printed (stdout and stderr together, in the order it printed them).
struct ScriptRank {
  int rank = 0;
  std::string ended;      // "exited 0", "exited with status 1", "killed by signal 9 (SIGKILL)"
  int exit_status = -1;   // -1: it did not exit by itself (a signal, or stopped by dmpcheck)
  bool stopped = false;   // still running when dmpcheck stopped the ranks (another failed, or the timeout)
  std::string exception;  // "RuntimeError: message", from the last traceback it printed; empty: none
  std::vector<std::string> output;
};

// One value a release cell's hook returned on one rank or in its unsharded oracle (torchrec: {hooks}): kind bool,
// number, string, or tensor ("<sha256 prefix> <dtype>[<shape>]").
inline constexpr int kUnshardedRank = -1;  // an Observation of the unsharded oracle's hook

struct Observation {
  int rank = 0;       // or kUnshardedRank
  std::string point;  // build_model, after_wrap, before_step, after_step, at_end
  int step = 0;
  std::string name, kind, value;
};

struct RunResult {
  std::string scenario;
  std::string scenario_file;
  std::string run;
  std::string slug;
  std::vector<std::pair<std::string, std::string>> cell;
  std::string profile;
  std::map<std::string, std::string> switches;  // the profile's switch values, by name (the reference's runs)
  std::string init_mode;
  SystemUnderTest system;
  Environment environment;
  std::vector<TablePlacement> plan;
  std::vector<TablePlacement> resumed_plan;  // `resume`: the plan the run resumed under
  std::vector<TensorCheck> replicas;         // every replicated tensor at init and at the end
  std::vector<StepDivergence> divergence;    // per step, from init on
  bool global_model_checked = false;
  std::vector<GlobalModelCheck> global_model;
  // TorchRec cells with `expect: reference`: every tensor after every step against the
  // reference DMP started from the same initial weights and fed the same batches.
  bool reference_compared = false;
  std::vector<ReferenceDiff> reference;
  int reference_first_break_step = -1;  // first step where a tensor leaves the tolerance; -1: none
  // `expect: initial_state`: every tensor of init.from against the model's before any step.
  bool init_from_compared = false;
  std::vector<ReferenceDiff> init_from;
  // Release cells with `resume`: the resumed run (resumed_world_size ranks under resume's plan,
  // from its checkpoint) against the run that was never interrupted, every full tensor from the
  // state it loaded (the step it resumed after) to the last step, each at its worst step.
  bool resumed_compared = false;
  int resumed_world_size = 0;
  std::vector<GlobalModelCheck> resumed;
  // Release cells with quantized tables (expect.quantized): the quantized model's pooled
  // embeddings on the first batch against the float model's, each feature's elements against the
  // bound its rows' quantization allows (max_allowed_excess: max(|diff| - bound); the note: the
  // worst |diff| / bound and how the bound is made); and (expect.quantized_sharded) the quantized
  // module sharded for inference against it unsharded.
  bool quantized_compared = false;
  std::vector<GlobalModelCheck> quantized;
  bool quantized_sharded_compared = false;
  std::vector<GlobalModelCheck> quantized_sharded;
  // ... and the release's quantized lookup against the reference's (check/quantized_lookup.h) on the
  // same trained weights and batch: reported, and held bitwise where a test says so.
  bool quantized_reference_compared = false;
  std::vector<ReferenceDiff> quantized_reference;
  BroadcastCost init_broadcast;
  // Set where the profile broadcasts and the scenario does not turn it off: every method of
  // broadcasting the same replicated parameters, timed side by side.
  BroadcastProbe broadcast_probe;
  std::vector<double> losses;   // rank 0's loss per step
  std::string loop;             // release cells: plain | train_pipeline_sparse_dist
  std::vector<RankLoop> loops;  // release cells: every rank's loop, in rank order
  // FNV-1a 64 of every full tensor's bytes after the last step (hex), by name: two runs of the
  // same scenario must agree on every one (`dmpcheck run --repeat`).
  std::map<std::string, std::string> digests;
  // Script cells: every rank (in rank order); whether a rank was still running at timeout_s; the
  // audit's phases in the order recorded, each "<phase>: N equal, M diverge".
  std::vector<ScriptRank> script_ranks;
  bool script_hung = false;
  // Processes the ranks started outside their process group (setsid(), a daemon) that outlived the
  // run's ranks, each "pid 123 (python3)": dmpcheck killed them when the run ended.
  std::vector<std::string> stray_processes;
  std::vector<std::string> audit_phases;
  std::vector<std::string> audit_gaps;  // "phase exit: not recorded on rank(s) 1"
  std::vector<Observation> observed;    // release cells with hooks: every rank's, in the order returned
  Timings timings;
  std::optional<RankFailure> failure;  // set when a rank failed: no verdict on expectations
  ExpectationResult expectation;
  Verdict verdict = Verdict::kError;
  std::string skip_reason;  // why a kSkipped cell could not run here
  // Not in the report: why the report itself could not be written (a full disk).  The verdict is
  // still printed, and the command exits 2.
  std::string report_error;
};

// dmpcheck's exit status for these runs: the largest of check::exit_status over them.
int exit_status(const std::vector<RunResult>& results);

}  // namespace dmpcheck::check
