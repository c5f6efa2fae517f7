// A scenario: one YAML file, validated, its matrix expanded into runs.  A RunSpec is fully
// resolved and immutable; the launcher hands the scenario text and a run index to every rank,
// so every rank provably runs the same thing.
#pragma once

#include <algorithm>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/backend_names.h"
#include "common/outcome.h"
#include "dmp/behaviour_profile.h"
#include "dmp/config.h"
#include "dmp/planner.h"
#include "scenario/phase.h"
#include "scenario/system.h"

namespace dmpcheck::scenario {

inline constexpr int kFormatVersion = 1;

enum class InitMode {
  kSeeded,    // every rank seeds its generator with init.seed (as TorchRec's tests did)
  kUnseeded,  // rank r seeds with init.seed + r: what happens when nobody seeds on purpose
};
inline constexpr Named<InitMode> kInitModeNames[] = {{InitMode::kSeeded, "seeded"}, {InitMode::kUnseeded, "unseeded"}};
inline const char* init_mode_name(InitMode mode) { return name_in(kInitModeNames, mode); }

struct InitSpec {
  InitMode mode = InitMode::kSeeded;
  uint64_t seed = 0;
  // A checkpoint to start from (a sharded directory or an unsharded file), resolved against
  // the scenario file's directory; empty: start from the seeded draw.
  std::string from;
  // When the user's weights reach the model: after DMP wraps it (load_state_dict on the sharded
  // model, as TorchRec documents), or before (into the unsharded EBC the user then wraps,
  // TorchRec #1165: the wrap draws the tables again).
  bool load_before_wrap = false;
  // The seed rank `rank` gives its generator before the model exists (the one place the rule is).
  uint64_t seed_of_rank(int rank) const {
    return seed + (mode == InitMode::kUnseeded ? static_cast<uint64_t>(rank) : 0);
  }
};

struct DataSpec {
  uint64_t seed = 0;
  std::vector<std::string> weighted_features;  // features of tables marked weighted
  int64_t min_ids_per_bag = 1;
  int64_t max_ids_per_bag = 1;
  // Per-feature overrides of (min, max) ids per bag.
  std::map<std::string, std::pair<int64_t, int64_t>> per_feature;
  std::pair<int64_t, int64_t> ids_per_bag(const std::string& feature) const;
  // Variable batch per feature (TorchRec's VBE), generated: feature -> per rank, the distinct bags
  // the rank's batch holds of it (`data.features.<f>.stride_per_rank`, 1..batch_size).  The
  // rank's batch_size bags index them through inverse indices (the first `stride` bags are the
  // distinct ones in order, the rest drawn among them).
  std::map<std::string, std::vector<int64_t>> stride_per_rank;
  // The report's own batches instead of generated ones (the two forms exclude each other and
  // the generator's keys).
  // `data.from`: a directory of global batches batch<S>.pt, as --dump-batches writes them (or
  // torch.save of a dict with keys, values, lengths, stride and optionally weights); resolved
  // against the scenario file's directory.  Step S (counted from 0, after init.from's steps)
  // reads batch<S>.pt.
  std::string from;
  // `data.batches`: inline, [step][rank] -> feature -> that rank's bags of the feature.  A
  // feature a rank leaves out has empty bags.
  struct Bags {
    std::vector<int64_t> ids;
    std::vector<int64_t> lengths;  // batch_size entries
    std::vector<float> weights;    // empty: 1 for every id
    // VBE: batch_size entries, bag i of the rank's batch is bag inverse_indices[i] of `lengths`
    // (which then holds the distinct bags, each used).  Empty: lengths holds batch_size bags.
    std::vector<int64_t> inverse_indices;
  };
  std::vector<std::vector<std::map<std::string, Bags>>> batches;
  // Whether the batches are handed to a release as variable batch per feature (stride_per_key_per_rank
  // and inverse_indices); the reference and every unsharded model train on their expansion.
  bool variable_batch() const;
  // Said in a release cell's report when inline batches mix the two forms: once one step's feature
  // has inverse_indices, every step and feature is handed over as a variable batch.
  std::optional<std::string> variable_batch_note() const;
};

struct Tolerance {
  double rtol = 1e-5;
  double atol = 1e-6;
  // false: the sharded model is expected to differ from the unsharded one (a known divergence,
  // e.g. row-wise Adagrad state under column_wise sharding).
  bool match = true;
};

enum class ReplicaExpectation { kEqual, kDiverge };

// A table's weights as TorchRec's quantization for inference stores them (`tables[i].quant`):
// row-wise 8, 4 or 2 bit integers with a scale and a bias per row, or fp16.
enum class QuantType { kInt8, kInt4, kInt2, kFp16 };
inline constexpr Named<QuantType> kQuantTypeNames[] = {
    {QuantType::kInt8, "int8"}, {QuantType::kInt4, "int4"}, {QuantType::kInt2, "int2"}, {QuantType::kFp16, "fp16"}};
inline const char* quant_type_name(QuantType type) { return name_in(kQuantTypeNames, type); }

// A table behind TorchRec's managed collision (`tables[i].managed_collision`): an MCH module
// (MCHManagedCollisionModule) remaps raw ids in [0, input_hash_size) onto the table's rows
// (zch_size = rows), admitting and evicting ids every `interval` forwards by its policy.
enum class McEviction { kLfu, kDistanceLfu, kLru };
inline constexpr Named<McEviction> kMcEvictionNames[] = {
    {McEviction::kLfu, "lfu"}, {McEviction::kDistanceLfu, "distance_lfu"}, {McEviction::kLru, "lru"}};
inline const char* mc_eviction_name(McEviction eviction) { return name_in(kMcEvictionNames, eviction); }
// The remapper: TorchRec's MCHManagedCollisionModule, or the module that replaced it in 1.x,
// HashZchManagedCollisionModule (multi-probe zero-collision hashing, its own eviction).
enum class McModule { kMch, kHashZch };
inline constexpr Named<McModule> kMcModuleNames[] = {{McModule::kMch, "mch"}, {McModule::kHashZch, "hash_zch"}};
inline const char* mc_module_name(McModule module) { return name_in(kMcModuleNames, module); }
struct ManagedCollision {
  McModule module = McModule::kMch;
  int64_t input_hash_size = 0;
  McEviction eviction = McEviction::kDistanceLfu;
  int64_t interval = 1;
};

// What a script cell's ranks are expected to do (`expect: {exit, output, exception, hang}`): judged
// from every rank's exit, its output (stdout and stderr together, as it printed them) and the last
// traceback it printed.
struct ScriptExpectation {
  // `exit: 0 | N | nonzero | any`, or `exit: {status: ..., rank: R}`: every rank (else rank R) ended
  // with that status.  kNonzero: any status but 0, a signal included; kAny: whatever status, a
  // signal included (the cell is judged on its output, exception and audit alone), but the rank
  // ended by itself: one dmpcheck stopped did not.
  static constexpr int kNonzero = -1;
  static constexpr int kAny = -2;
  std::optional<int> exit_status;
  std::optional<int> exit_rank;
  // `output: [{contains | lacks | matches: TEXT, rank: R}]`: some rank's output (else rank R's)
  // contains TEXT, no rank's (else rank R's) does, or a line matches the ECMAScript regex TEXT.
  struct Output {
    std::string test;  // contains, lacks, matches
    std::string text;
    std::optional<int> rank;
  };
  std::vector<Output> output;
  // `exception: {type, message}`: some rank (else rank R) ended with a traceback whose exception is
  // of this type (its name, or the last part of a dotted name) and whose message contains this text.
  struct Exception {
    std::string type;
    std::string message;
    std::optional<int> rank;
  };
  std::optional<Exception> exception;
  // `hang: true`: some rank was still running when timeout_s ran out (the cell names which).
  bool hang = false;
  // Whether a rank's failure is what is judged (exit, exception, hang), not the cell's error.
  bool judges_failure() const { return (exit_status && *exit_status != 0) || exception || hang; }
  bool empty() const { return !exit_status && output.empty() && !exception && !hang; }
  std::string describe() const;
};

struct Expectation {
  ReplicaExpectation replicas = ReplicaExpectation::kEqual;
  // kDiverge: exactly these tensors differ across ranks (a bare table name means its weight);
  // every other replicated tensor is equal.
  std::vector<std::string> diverged;
  std::vector<Phase> at = {Phase::kInit, Phase::kFinal};  // where the divergence must show
  // Compare against the unsharded model when set: the reference's (check::UnshardedModel) on a
  // reference cell, the release's own modules unsharded in one process on a release cell.
  std::optional<Tolerance> global_model;
  // Compare the forward's outputs too (each feature's pooled embedding and the model's output,
  // at every step from 0), within this tolerance, wherever global_model or reference compares.
  std::optional<Tolerance> outputs;
  // `initial_state: from`: before any step, every tensor init.from holds is bitwise what the
  // model holds (true); `not_from`: some tensor is not (false: the user's weights were lost).
  std::optional<bool> initial_state;
  // Release cells with `resume`: the resumed run, from the state it loaded (the step it resumes
  // after) to the last step, against the run that was never interrupted, every tensor within
  // this tolerance (match) or not.
  std::optional<Tolerance> resumed;
  // Release cells with quantized tables: the trained model's tables quantized by the release's own
  // path (quantize_embeddings), its pooled embeddings on the first batch against the float
  // model's, every element within the bound each row's quantization allows (match), or some not.
  std::optional<Tolerance> quantized;
  // ... and the quantized module sharded for inference by the release's quant sharders (each
  // table as its sharding's first type says), against the unsharded quantized module.
  std::optional<Tolerance> quantized_sharded;
  // TorchRec cells: run the reference DMP on the same work, start TorchRec from its initial
  // weights, and compare every tensor after every step within this tolerance.
  std::optional<Tolerance> reference;
  std::string reference_profile;  // the profile the reference half runs under; empty: the run's own
  // `reference: {profile: {base: torchrec-0.6, <switch>: value}}`: switches turned on that profile.
  std::vector<std::pair<std::string, std::string>> reference_switches;
  // `reference: {start: seed}`: the release draws its own initial weights from the scenario's
  // init seed instead of starting from the reference's, so step 0 compares the two draws.
  bool reference_draws_own_init = false;
  std::optional<double> max_broadcast_seconds;
  // The run is expected to fail: with one of these failure kinds (a release that dies of heap
  // corruption in some runs and raises in others has two), and (when set) a message containing
  // this text (a release's own message, which is all that tells its errors apart).
  struct ExpectedError {
    std::vector<FailureKind> kinds{FailureKind::kTorchRec};
    std::string message;
    bool matches(FailureKind seen, const std::string& seen_message) const {
      return std::find(kinds.begin(), kinds.end(), seen) != kinds.end() &&
             seen_message.find(message) != std::string::npos;
    }
    std::string describe() const;
  };
  std::optional<ExpectedError> error;
  // Release cells, `loop: {batches, next_after_exhausted}`: every rank executed exactly `batches`
  // batches in each epoch, and asked its data iterator for a batch exactly `next_after_exhausted`
  // times after the iterator had said it was exhausted (TorchRec #1778: a DataLoader may hang there).
  std::optional<int64_t> loop_batches;
  // `loop: {batches: [N1, N2, ...]}`: every rank executed exactly these per epoch (one per epoch).
  std::vector<int64_t> loop_batches_per_epoch;
  std::optional<int64_t> next_after_exhausted;
  // `loop: {eval_batches}`: every rank executed exactly this many batches in each eval pass.
  std::optional<int64_t> loop_eval_batches;
  ScriptExpectation script;  // script cells
  // `observed: {name: value}`: release cells with hooks: every rank's last value of each name a
  // hook returned is this one (a boolean, number or string; numbers compared as numbers).
  std::vector<std::pair<std::string, std::string>> observed;
  std::string describe() const;
  // reference_switches as a profile's name carries them: "+plan_on_every_rank=true...".
  std::string switches_text() const;
};

struct Reproduces {
  std::string url;
  std::string affected;
  std::string fixed_in;
  // The behaviour profiles that show the bug and its fix in the reference; both empty for a
  // report confirmed on real releases only (then `releases` has at least one "bug").
  std::string bug_profile;
  std::string fix_profile;
  // What real TorchRec showed, by release ("torchrec==0.6.0"): "bug" (it shows), "fixed", "absent"
  // (the release never had it), "not runnable: <why>" (the scenario cannot express it there), or
  // "not reproduced: <why>" (it ran and the report's behaviour did not show, with why).  Releases marked bug, fixed or
  // absent have cells in the scenario whose expectations check it on every run.
  std::vector<std::pair<std::string, std::string>> releases;
};

// Mid-run checkpoint and resume: after `after_step` steps the full state is taken (as a
// checkpoint would hold it), the model is rebuilt under `constraints` (another plan) and
// training continues from the state.
//
// On a release cell the state is saved through torch.distributed.checkpoint (the model's and the
// optimizers' state_dict) and loaded by a fresh set of `world_size` ranks under the new plan,
// which train the remaining steps on the same global batches; the reference resumes in place, on
// the run's own ranks (world_size is the run's).
struct ResumeSpec {
  int after_step = 0;
  int world_size = 0;
  std::map<std::string, dmp::ShardingConstraints> constraints;  // replace the tables' own
};

// A fault injected on purpose, to test the harness itself and to ask "what if".
enum class FaultKind { kCrash, kAbort, kKill, kExit, kThrow, kHang, kCorrupt, kNan, kDesync };
inline constexpr Named<FaultKind> kFaultKindNames[] = {
    {FaultKind::kCrash, "crash"},     {FaultKind::kAbort, "abort"}, {FaultKind::kKill, "kill"},
    {FaultKind::kExit, "exit"},       {FaultKind::kThrow, "throw"}, {FaultKind::kHang, "hang"},
    {FaultKind::kCorrupt, "corrupt"}, {FaultKind::kNan, "nan"},     {FaultKind::kDesync, "desync"}};
inline const char* fault_kind_name(FaultKind kind) { return name_in(kFaultKindNames, kind); }

struct FaultSpec {
  FaultKind kind = FaultKind::kCrash;
  int rank = 0;
  int step = 0;        // 0: right after the model is built; s: right after training step s
  int exit_code = 7;   // kExit
  std::string tensor;  // kCorrupt / kNan: the tensor (state name); empty: the first replicated one
};

// The broadcast-cost probe run after init where the profile broadcasts (check/broadcast_probe.h).
struct ProbeSpec {
  bool enabled = true;
  int warmup = 1;
  int iterations = 3;
};

// A script cell (`script:`): the user's own Python program, unchanged, started on every rank as
// torchrun starts it, under the run's TorchRec system, with dmpcheck's audit loaded first.
struct ScriptSpec {
  std::string path;  // resolved against the scenario file's folder
  std::vector<std::string> args;
  std::map<std::string, std::string> env;
  bool audit = true;  // digest every replicated tensor of every DistributedModelParallel it builds
};

struct RunSpec {
  // A plan to use instead of planning (ShardingPlan::serialize's text); empty: plan.  Set for the
  // reference half of a `start: seed` release cell: the release's own placement, so both sides
  // draw the same shards on the same ranks.
  std::string given_plan;
  std::string name;  // "init.mode=seeded profile=current", or "default" without a matrix
  std::string slug;  // file-safe: "seeded_current"
  std::vector<std::pair<std::string, std::string>> cell;  // the matrix assignments
  // The reference (the default) or a release from torchrec_sut/pins.tsv, run from its
  // environment (ci/torchrec-env.sh).
  System system;
  // Release cells: "extended" (the default) offers row_wise and table_row_wise on CPU by
  // extending TorchRec's EBC sharder, as dmpcheck's comparisons need; "stock": the sharder as a
  // user has it (TorchRec #1252).  `torchrec: {sharder: ...}` in the file.
  std::string torchrec_sharder = "extended";
  // The module a release cell shards: "embedding_bag_collection" (the EBC, as everywhere), or
  // "embedding_bag": the one table as a plain torch.nn.EmbeddingBag, sharded by TorchRec's
  // EmbeddingBagSharder (TorchRec #602).  Reference cells model either as an EBC (the same
  // arithmetic).  `torchrec: {module: ...}` in the file.
  std::string torchrec_module = "embedding_bag_collection";
  // How a release cell drives its steps: "plain" (forward, backward, optimizer step per batch) or
  // "train_pipeline_sparse_dist" (TorchRec's TrainPipelineSparseDist: progress() over a dataloader
  // iterator until StopIteration); `epochs` splits the steps into that many passes, each over a
  // fresh iterator.  The reference runs the plain loop's arithmetic for every loop.
  // `torchrec: {loop: ..., epochs: N}` in the file.
  std::string torchrec_loop = "plain";
  int torchrec_epochs = 1;
  // Per rank, the batches its data iterator hands out in each epoch (empty: steps / epochs on
  // every rank).  Uneven counts send the rank that ran out into its next collective while its
  // peer is still in an all-to-all: on Gloo one of the two is aborted at once on the collective
  // mismatch, and the cell fails naming it.  `torchrec: {batches_per_rank: [...]}`.
  std::vector<int64_t> torchrec_batches_per_rank;
  // After every epoch an eval pass: the model in eval mode (model.eval()), the same loop (the
  // pipeline's progress() or a forward under no_grad) over this many of the epoch's batches, then
  // back to training; one count for every rank or one per rank (empty: no eval).  A pass that
  // trained would leave the unsharded model (global_model), which trains on train steps only.
  // `torchrec: {eval_batches: N | [N0, N1, ...]}`.
  std::vector<int64_t> torchrec_eval_batches;
  // The data iterator of each pass: "fresh" (a new one, as iter(DataLoader) gives by default) or
  // "persistent" (one object re-armed for every pass, as iter(DataLoader) gives with
  // persistent_workers=True; TorchRec #2327).  `torchrec: {data_iterator: ...}`.
  std::string torchrec_data_iterator = "fresh";
  // The EmbeddingBagCollection's is_weighted as the user passes it, where it disagrees with the
  // data: false with weighted tables (their batches carry weights) builds the EBC unweighted, as
  // a user who forgets the flag does (TorchEasyRec #648: the sharded lookup applies the weights,
  // the unsharded EBC drops them).  Unset: whether the tables are weighted.
  // `torchrec: {is_weighted: false}`.
  std::optional<bool> torchrec_is_weighted;
  // The scenario's hook file (`torchrec: {hooks: FILE}`, relative to the scenario file): Python
  // functions a release cell's ranks call at fixed points (torchrec_sut's hooks.py); reference
  // cells do not run them.  Empty: none.
  std::string torchrec_hooks;
  bool on_torchrec() const { return system.runs_torchrec(); }
  std::optional<ScriptSpec> script;  // a script cell: the fields of a scenario cell are not read
  int world_size = 2;
  comm::Backend backend = comm::Backend::kGloo;
  int steps = 1;
  int64_t batch_size = 8;  // per rank
  double timeout_s = 60.0;
  int threads_per_rank = 0;  // 0: cores / world_size, at least 1
  bool fingerprint = false;  // check every collective's fingerprint across ranks first (debug)
  ProbeSpec broadcast_probe;
  int local_world_size = 0;  // ranks per host (LOCAL_WORLD_SIZE); 0: all ranks on one host
  int ranks_per_host() const { return local_world_size > 0 ? local_world_size : world_size; }
  int64_t memory_per_rank = 0;  // planner limit in bytes; 0: none
  InitSpec init;
  dmp::BehaviourProfile profile;
  dmp::ModelConfig model;
  std::map<std::string, dmp::ShardingConstraints> constraints;
  std::map<std::string, QuantType> quant;                     // table -> how its weights are quantized for inference
  std::map<std::string, ManagedCollision> managed_collision;  // table -> its MCH module
  // The ids a table's feature takes: [0, rows), or a managed-collision table's raw ids.
  int64_t id_range(const dmp::EmbeddingBagConfig& table) const {
    const auto mc = managed_collision.find(table.name);
    return mc == managed_collision.end() ? table.num_embeddings : mc->second.input_hash_size;
  }
  dmp::FusedOptimizerConfig sparse_optimizer;
  dmp::DenseOptimizerConfig dense_optimizer;
  DataSpec data;
  std::optional<ResumeSpec> resume;
  std::vector<FaultSpec> faults;
  Expectation expect;
};

struct Scenario {
  int version = kFormatVersion;
  std::string name;
  std::string description;
  std::string file;                                            // as given
  std::string source_text;                                     // the file's bytes
  std::vector<std::pair<std::string, std::string>> overrides;  // applied to every run (see load_scenario_text)
  std::optional<Reproduces> reproduces;
  std::vector<RunSpec> runs;
};

// Error(kInvalidScenario) with "file:line: field 'x.y': expected ..., got ..." on bad input.
// `overrides`: (dotted path, YAML value) pairs set in every run after the matrix, e.g.
// {"world_size", "3"} or {"optimizers.sparse.lr", "0.5"}; validated like the file's own fields.
using Overrides = std::vector<std::pair<std::string, std::string>>;
Scenario load_scenario_file(const std::string& path, const Overrides& overrides = {});
Scenario load_scenario_text(const std::string& text, const std::string& file_label, const Overrides& overrides = {});

// Why the reference DMP cannot model `run` (a bf16 table, or a data-parallel fp16 one), or nullopt:
// such a reference cell is skipped with these words, and no release cell is compared with it.
std::optional<std::string> reference_cannot_model(const RunSpec& run);

// What the planner is asked for a run, with the hosts' size (0: the scenario's
// topology.local_world_size, or one host).
dmp::PlannerInput planner_input(const RunSpec& run, int local_world_size = 0);

// The run a `resume` continues as: resume.world_size ranks on one host, each with its share of the
// same global batch, the tables' constraints with resume.sharding's in their place.
RunSpec resumed_run(const RunSpec& run);

}  // namespace dmpcheck::scenario
