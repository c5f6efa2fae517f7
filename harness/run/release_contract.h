// The contract between dmpcheck and the TorchRec rank program (torchrec_sut/dmpcheck_torchrec/,
// which mirrors every struct here in contract.py): what the launcher hands a release (a run, as
// spec.json), and what comes back (out/meta.json, the planner's answer, each phase's manifest).
// Each document carries kSchemaVersion and is read strictly on both sides: a field one side
// writes and the other does not know is an error naming it, never a silent drop, and so is a
// missing one.  fixtures/contract/ holds one document of each kind with every field set; the C++
// and the Python contract tests both read and write exactly those (neither needs torch).
// A release environment's marker, dmpcheck-ready.json, is the probe's answer (ci/torchrec-env.sh).
//
// A new field is added here (the struct and its macro line), in contract.py, in the fixture, and
// where it is filled or used.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dmpcheck::run::contract {

inline constexpr int kSchemaVersion = 5;

struct Constraints {
  std::vector<std::string> sharding_types;  // empty: any the planner likes
  int column_shards = 0;                    // 0: the planner's choice
};

// A table behind managed collision: TorchRec's MCHManagedCollisionModule (`module` "mch") over
// raw ids in [0, input_hash_size) (0: the table has none), evicting by `eviction` (lfu |
// distance_lfu | lru) every `interval` forwards, or its HashZchManagedCollisionModule ("hash_zch").
struct ManagedCollision {
  std::string module;
  int64_t input_hash_size = 0;
  std::string eviction;
  int64_t interval = 0;
};

struct Table {
  std::string name;
  int64_t rows = 0;
  int64_t dim = 0;
  std::vector<std::string> features;
  std::string pooling;  // sum | mean | none (an EmbeddingCollection's sequence table)
  bool weighted = false;
  std::string data_type;  // fp32 | fp16 | bf16
  std::string quant;      // how it is quantized for inference: int8 | int4 | int2 | fp16 ("": not)
  ManagedCollision managed_collision;
  Constraints constraints;
};

struct SparseOptimizer {
  std::string type;  // sgd | adagrad | rowwise_adagrad | adam
  double lr = 0, eps = 0, beta1 = 0, beta2 = 0, weight_decay = 0;
  std::string weight_decay_mode;  // none | l2 | decoupled (FBGEMM's WeightDecayMode)
};

struct DenseOptimizer {
  std::string
      type;  // sgd | adagrad | adam | rowwise_adagrad (RowWiseAdagrad over 2-D parameters, Adagrad over the rest)
  double lr = 0, eps = 0, beta1 = 0, beta2 = 0, momentum = 0, weight_decay = 0;
};

// Where a release's initial weights come from.  kind: "seed" (its own draw, after
// torch.manual_seed(seeds[rank])), "reference" (the reference DMP's initial state),
// "user_weights" (init.from's weights) or "checkpoint" (a resumed run: the model's and the
// optimizers' state as an earlier run saved it through torch.distributed.checkpoint); `state`
// names the exchange phase file of whole tensors, or the checkpoint's directory (empty for seed);
// `load`: "after_wrap" (into the sharded model) or "before_wrap" (into the unsharded one, TorchRec #1165).
struct Start {
  std::string kind = "seed";
  std::string state;
  std::string load = "after_wrap";
};

// After step `after_step` (0: never), every rank saves the sharded model's state_dict and the
// optimizers' through torch.distributed.checkpoint into `dir`, then trains on.
struct Checkpoint {
  int after_step = 0;
  std::string dir;
};

struct RunSpec {
  int schema_version = kSchemaVersion;
  int world_size = 0;
  int local_world_size = 0;     // ranks per host: the planner's topology
  int64_t memory_per_rank = 0;  // bytes the planner may use on a rank (its Topology's ddr_cap); 0: its default
  int steps = 0;
  int64_t batch_size = 0;  // per rank
  double timeout_s = 0;
  std::string sharder;   // extended | stock
  std::string module;    // embedding_bag_collection | embedding_bag
  bool outputs = false;  // dump the forward's outputs of every step
  // Rank 0 also trains the release's own modules unsharded, in one process, from the sharded
  // model's initial weights, on every step's global batch (all ranks' local batches in rank
  // order), after the sharded run: out/unsharded/step<S> (and outputs<S>), whole tensors.
  bool unsharded = false;
  // Rank 0 quantizes the trained model's tables (each table's `quant`) with the release's
  // quantize_embeddings and runs the first global batch through the float and the quantized
  // EmbeddingBagCollection: out/quantized/{float,unsharded,bound}/outputs0, whole tensors.
  bool quantized = false;
  // ... and shards the quantized one for inference over world_size devices with the release's
  // quant sharder (each table's first constraint type, table_wise without one), in one process,
  // loads the unsharded quantized state and runs the same batch: out/quantized/sharded/outputs0.
  bool quantized_sharded = false;
  std::string loop;                       // plain | train_pipeline_sparse_dist (TorchRec's TrainPipelineSparseDist)
  int epochs = 1;                         // passes over the steps' batches (data_iterator says over which iterator)
  std::vector<int64_t> batches_per_rank;  // per rank, batches per epoch; empty: steps / epochs each
  std::vector<int64_t> eval_batches;      // per rank, batches of the eval pass after every epoch; empty: none
  std::string data_iterator;              // fresh (a new iterator per pass) | persistent (one, re-armed)
  std::string is_weighted = "tables";     // the EBC's is_weighted: "tables" (whether they are), "true", "false"
  std::vector<uint64_t> seeds;            // per rank: torch.manual_seed before the model exists
  Start start;
  // The steps trained before this run (a resumed run, start.kind "checkpoint"): it writes the
  // state it loaded as phase step<first_step>, then trains steps first_step + 1 .. steps.
  int first_step = 0;
  Checkpoint checkpoint;
  std::vector<Table> tables;
  std::vector<int64_t> dense_layers;
  SparseOptimizer sparse_optimizer;
  DenseOptimizer dense_optimizer;
  std::string hooks;  // the scenario's hook file (absolute; torchrec: {hooks}); empty: none
};

struct ShardRow {
  int rank = 0;
  int64_t row_offset = 0, rows = 0, col_offset = 0, cols = 0;  // rows/cols -1: the whole table
};

struct PlanRow {
  std::string table, sharding, compute_kernel;
  std::vector<int> ranks;
  std::vector<ShardRow> shards;
};

struct Versions {
  std::string torchrec, torch, fbgemm_gpu;  // as the release's own import reported them
  std::string torchrec_source;              // the folder the imported torchrec package is in
};

struct Timings {
  double import_s = 0, init_s = 0, plan_s = 0, train_s = 0;  // plan_s: TorchRec's planner, within init_s
};

// What one rank's training loop did: the batches it executed in each epoch, and how often it
// asked its data iterator for a batch after the iterator had said it was exhausted.
struct RankLoop {
  int rank = 0;
  std::vector<int64_t> batches;
  int64_t next_after_exhausted = 0;
  std::vector<int64_t> eval_batches;  // per eval pass (one after every epoch)
};

// One value a hook returned on one rank (torchrec_sut's hooks.py): kind bool, number, string, or
// tensor (value "<sha256 prefix> <dtype>[<shape>]").
struct Observation {
  int rank = 0;       // -1: the release's unsharded oracle (check::kUnshardedRank)
  std::string point;  // build_model, after_wrap, before_step, after_step, at_end
  int step = 0;
  std::string name, kind, value;
};

// out/meta.json, written by rank 0 after the last step.
struct RunMeta {
  int schema_version = kSchemaVersion;
  Versions versions;
  std::vector<PlanRow> plan;
  std::vector<double> losses;
  std::vector<std::string> notes;
  Timings timings;
  std::vector<RankLoop> loops;        // every rank's, in rank order
  std::vector<Observation> observed;  // every rank's hooks' values, in rank order, then as returned
};

// `python -m dmpcheck_torchrec.plan`'s answer: the plan the release's planner makes, nothing run.
struct PlanAnswer {
  int schema_version = kSchemaVersion;
  Versions versions;
  std::vector<PlanRow> plan;
  std::vector<std::string> notes;
};

// `python -m dmpcheck_torchrec.probe`'s answer: what an interpreter of the user's imports.
struct ProbeAnswer {
  int schema_version = kSchemaVersion;
  Versions versions;
  std::string python;  // its version, "3.11.2"
};

// One phase of one rank's tensors: <phase>.json, beside <phase>.bin (the float32 bytes).
struct Piece {
  std::string name, sharding;
  bool replicated = false;
  std::vector<int64_t> full_sizes;
  int64_t row_offset = 0, col_offset = 0;
  std::vector<int64_t> sizes;
  uint64_t offset = 0;  // byte offset in <phase>.bin
  // The bytes' element type: "float32" (weights, optimizer state, outputs) or "int64" (a
  // managed-collision module's remapping tables and counters, exact beyond float32's 2^24).
  std::string dtype = "float32";
};

struct Phase {
  int schema_version = kSchemaVersion;
  std::string phase;
  std::vector<Piece> tensors;
};

// One rank's local batch of one step (batches/step<S>_rank<R>.json): exactly what the reference trains on.
struct Batch {
  int schema_version = kSchemaVersion;
  std::vector<std::string> keys;
  std::vector<int64_t> lengths, values;
  bool weighted = false;
  std::vector<float> weights;  // one per value when weighted
  // Variable batch per feature (TorchRec's VBE): per key, the distinct bags the rank program hands
  // TorchRec (stride_per_key_per_rank), and per key batch_size indices into them (key-major).
  // lengths and values above hold the expanded batch (bag i of a key is its distinct bag
  // inverse_indices[i]; a distinct bag is the first bag that names it).  Empty: no VBE.
  std::vector<int64_t> stride_per_key, inverse_indices;
};

// Why a rank failed: <out>/rank<R>/error.json from the rank program, or the store's error/<R> from
// dmpcheck's own ranks (the launcher reads both alike).  kind: a failure kind's name.
struct RankError {
  int schema_version = kSchemaVersion;
  std::string kind, message, traceback;
};

// The warm interpreter's protocol (run/warm_interpreter.h; torchrec_sut's warm.py serves it): one
// document per packet of its socket.  dmpcheck sends a WarmSpawn for each rank to fork; the
// interpreter sends WarmMessages: first "ready" (or "not_ready", with why), then for each spawn
// "pid" or "refused" (with why), and "exit" (pid, raw wait status) whenever a rank ends.
struct WarmSpawn {
  int schema_version = kSchemaVersion;
  std::vector<std::string> argv;  // ["-m", MODULE, ARG ...]
  std::vector<std::string> env;   // the rank's whole environment, "NAME=value"
  std::string cwd;
  int threads = 1;  // the rank's intra-op threads
  int group = 0;    // its process group (0: one of its own)
};

struct WarmMessage {
  int schema_version = kSchemaVersion;
  std::string kind;       // "ready", "not_ready", "pid", "refused", "exit"
  double import_s = 0.0;  // ready: how long the imports took
  int threads = 0;        // ready: the interpreter's threads (1, or it is not ready)
  std::string why;        // not_ready, refused
  int pid = 0;            // pid, exit
  int status = 0;         // exit: the raw wait status
};

NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(WarmSpawn, schema_version, argv, env, cwd, threads, group)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(WarmMessage, schema_version, kind, import_s, threads, why, pid, status)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Constraints, sharding_types, column_shards)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ManagedCollision, module, input_hash_size, eviction, interval)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Table, name, rows, dim, features, pooling, weighted, data_type, quant,
                                                managed_collision, constraints)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(SparseOptimizer, type, lr, eps, beta1, beta2, weight_decay,
                                                weight_decay_mode)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DenseOptimizer, type, lr, eps, beta1, beta2, momentum, weight_decay)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Start, kind, state, load)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Checkpoint, after_step, dir)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RunSpec, schema_version, world_size, local_world_size, memory_per_rank,
                                                steps, batch_size, timeout_s, sharder, module, outputs, unsharded,
                                                quantized, quantized_sharded, loop, epochs, batches_per_rank,
                                                eval_batches, data_iterator, is_weighted, seeds, start, first_step,
                                                checkpoint, tables, dense_layers, sparse_optimizer, dense_optimizer,
                                                hooks)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ShardRow, rank, row_offset, rows, col_offset, cols)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PlanRow, table, sharding, compute_kernel, ranks, shards)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Versions, torchrec, torch, fbgemm_gpu, torchrec_source)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Timings, import_s, init_s, plan_s, train_s)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankLoop, rank, batches, next_after_exhausted, eval_batches)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Observation, rank, point, step, name, kind, value)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RunMeta, schema_version, versions, plan, losses, notes, timings, loops,
                                                observed)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(PlanAnswer, schema_version, versions, plan, notes)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ProbeAnswer, schema_version, versions, python)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Piece, name, sharding, replicated, full_sizes, row_offset, col_offset,
                                                sizes, offset, dtype)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Phase, schema_version, phase, tensors)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(RankError, schema_version, kind, message, traceback)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(Batch, schema_version, keys, lengths, values, weighted, weights,
                                                stride_per_key, inverse_indices)

// Strict reading: `document` has this build's schema_version and exactly the fields of its type,
// at every depth, each of the type's kind.  Error(kRankFailed) naming `what` and the field
// otherwise (what comes back from a release is the release's output).  `parse` reads the
// document into its type and gives back what that type writes.
void read_checked(const nlohmann::json& document, const std::string& what,
                  const std::function<nlohmann::json(const nlohmann::json&)>& parse);

template <typename T>
T read_document(const nlohmann::json& document, const std::string& what) {
  T value;
  read_checked(document, what, [&value](const nlohmann::json& d) {
    value = d.get<T>();
    return nlohmann::json(value);
  });
  return value;
}

// A file's JSON; Error(kRankFailed) when it is missing or not JSON.
nlohmann::json read_json(const std::string& path);

template <typename T>
T read_document_file(const std::string& path) {
  return read_document<T>(read_json(path), path);
}

// The exchange's layout (run/tensor_exchange.h), named here and nowhere else on this side (the
// LevelDB filename.h pattern); contract.py's phase_* and batch_file make the same names, and
// fixtures/contract/layout.json holds both sides to them.  A phase is one rank's tensors at one
// point of the run, <rank dir>/<phase>.json and .bin.
inline std::string phase_init() { return "init"; }  // the model as wrapped, before any step
// After `step` steps (1 ..); phase_after(0) is phase_init().
inline std::string phase_after(int step) { return step == 0 ? phase_init() : "step" + std::to_string(step); }
// The forward's outputs of step `step` + 1 (on the weights after `step` steps).
inline std::string phase_outputs(int step) { return "outputs" + std::to_string(step); }
// A managed-collision module's rows drawn anew in step `step` (the release's oracle reads them).
inline std::string phase_redrawn(int step) { return "redrawn" + std::to_string(step); }
// The user's weights (init.from) handed to a release as whole tensors, in the exchange's own folder.
inline std::string phase_user_weights() { return "user_weights"; }
// One rank's local batch of step `step` (1 ..), under the exchange's batches/.
inline std::string batch_file(int step, int rank) {
  return "step" + std::to_string(step) + "_rank" + std::to_string(rank) + ".json";
}

}  // namespace dmpcheck::run::contract
