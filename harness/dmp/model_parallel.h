// DistributedModelParallel: the reference model (EmbeddingBagCollection -> dense MLP -> mean)
// sharded by a plan.  Embedding tables go to their sharding types; the dense MLP goes to the
// DDP-like wrapper.  Training is forward, backward with the fused embedding optimizers applied
// inside it, then the dense optimizer step.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "comm/coalesced.h"
#include "dmp/behaviour_profile.h"
#include "dmp/config.h"
#include "dmp/dense.h"
#include "dmp/dense_data_parallel.h"
#include "dmp/embedding_config.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/optim/dense_optimizer.h"
#include "dmp/optim/fused_optimizer.h"
#include "dmp/planner.h"
#include "dmp/sharding/embedding_sharding.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::dmp {

struct DmpOptions {
  BehaviourProfile profile;
  FusedOptimizerConfig sparse_optimizer;
  DenseOptimizerConfig dense_optimizer;
};

// One tensor this rank holds, as a check sees it.
struct StateTensor {
  std::string name;         // state_dict-style key of the full tensor it belongs to
  std::string sharding;     // data_parallel, table_wise, row_wise, column_wise, table_row_wise, dense
  bool replicated = false;  // must be bitwise equal on every rank
  at::Tensor tensor;
  // Where this piece sits in the full tensor (rows and columns; a row-wise optimizer state of
  // a column_wise table with k shards is [k * rows], column shard j's block at j * rows, as in
  // TorchRec).  Dense tensors are whole.
  Shard placement;
  std::vector<int64_t> full_sizes;
};

struct InitBroadcastReport {
  bool data_parallel_tables_broadcast = false;
  comm::CoalescedBroadcastStats data_parallel_tables;  // the profile's init broadcast
  int64_t data_parallel_bucket_cap_bytes = 0;          // its buckets' cap; 0: one broadcast per table
};

class DistributedModelParallel {
 public:
  // Collective.  Builds the model as user code does: the dense layers draw from `generator`,
  // then the collection's reset_parameters draws every table in model order (on every rank, as
  // if the unsharded model were materialised and then sharded) and each rank keeps its shards.
  // Then the profile's init broadcast runs and the dense part is wrapped.
  DistributedModelParallel(comm::Communicator& comm, const ModelConfig& model, const ShardingPlan& plan,
                           at::Generator& generator, const DmpOptions& options);

  // Collective.  One step on this rank's batch: forward, backward (fused optimizers inside),
  // dense step.  Returns this rank's loss (mean of the dense output over its batch).
  double train_step(const KeyedJaggedTensor& local_batch);
  // Collective.  The forward alone, on this rank's batch (no gradient, no update).
  void forward(const KeyedJaggedTensor& local_batch);
  // This rank's outputs of the last forward (train_step's or forward's): the pooled embedding of
  // each feature and the model's output, named pooled_output_key(feature) and kModelOutputKey.
  const std::map<std::string, at::Tensor>& last_outputs() const { return last_outputs_; }

  // Every tensor this rank holds: weights, then optimizer state.
  std::vector<StateTensor> state() const;
  // Collective.  Every tensor whole, keyed by name: weights and fused optimizer state of every
  // table, dense parameters and their optimizer state.  data_parallel tables and dense tensors
  // come from rank 0, sharded tables are assembled from their shards' owners.
  std::map<std::string, at::Tensor> gather_full_state();
  // Overwrites this rank's pieces from full tensors (keys as gather_full_state).  Keys absent
  // from `state` are left as they are; optimizer state is loaded when present.
  void load_full_state(const std::map<std::string, at::Tensor>& state);
  // Resuming after `steps` steps: optimizer step counters (Adam's bias correction) and the
  // dense optimizer's state from `state`.
  void resume(const std::map<std::string, at::Tensor>& state, int64_t steps);
  // Weights the user loaded into the unsharded model before this wrap: kept (as resume) where
  // the profile's wrap keeps them, else the tables' are dropped for the wrap's own draw and only
  // the dense layers' stay (TorchRec #1165, measured).  Returns whether all were kept.
  bool take_weights_loaded_before_wrap(const std::map<std::string, at::Tensor>& state, int64_t steps);

  const InitBroadcastReport& init_broadcast() const { return init_broadcast_; }
  const ShardingPlan& plan() const { return plan_; }

 private:
  comm::Communicator& comm_;  // owned by the caller for the model's whole life
  ModelConfig model_;
  ShardingPlan plan_;
  DmpOptions options_;
  std::vector<std::unique_ptr<EmbeddingSharding>> shardings_;
  std::unique_ptr<DenseMlp> dense_;
  std::unique_ptr<DenseDataParallel> dense_dp_;
  InitBroadcastReport init_broadcast_;
  std::map<std::string, at::Tensor> last_outputs_;

  std::map<std::string, std::pair<int64_t, int64_t>> column_of_;  // feature -> (offset, dim) in sharding order
  // Every sharding's lookup, concatenated in sharding order (columns in column_of_).
  at::Tensor sharded_forward(const KeyedJaggedTensor& local_batch);
  // `keyed` regrouped into the model's feature order; records the pooled outputs.  Under the
  // profile's row_wise_mean_divides_other_features, the lookups it names are divided by their
  // bag length + eps here, in the autograd graph, as TorchRec's callback divides its output.
  at::Tensor in_model_order(const at::Tensor& keyed, const KeyedJaggedTensor& local_batch);
  std::vector<bool> divided_by_length_;       // per lookup in model order
  std::vector<std::string> embedding_names_;  // per lookup in model order (ModelConfig::embedding_names)
};

// Collective.  The plan every rank runs: rank 0 plans and broadcasts, as TorchRec's
// collective_plan does; under the profile's plan_on_every_rank each rank plans with its own
// tie-breaks.  Either way every rank checks that all hold the same plan (a planner that gives
// ranks different plans is a class of bug of its own): a communication error names the rank.
ShardingPlan collective_plan(comm::Communicator& comm, PlannerInput input, const BehaviourProfile& profile);

// Under the profile's load_requires_same_sharding (TorchRec #1497): Error(kInvalidInput) naming
// the first table `now` shards another way than the checkpoint saved under `saved` holds it.
void check_same_sharding(const ShardingPlan& saved, const ShardingPlan& now, const BehaviourProfile& profile);

// Collective.  The model again under `plan` from `old`'s full state after `steps` steps, as a
// checkpoint carries it from one plan to another, with the profile's checkpoint switches:
// data_parallel_state_keys_differ (TorchRec #2394) and load_requires_same_sharding (#1497).
std::unique_ptr<DistributedModelParallel> reshard(comm::Communicator& comm, DistributedModelParallel& old,
                                                  const ModelConfig& model, const ShardingPlan& plan,
                                                  at::Generator& generator, const DmpOptions& options, int64_t steps);

// The view of `full` (a whole table's weight or state) where the piece at `placement` goes.  A
// row state (one value per row) of a table with k column shards is, as TorchRec holds it, k
// blocks of the table's rows: column shard j's at [j * rows, (j + 1) * rows).  A [rows, k] tensor
// (one column per shard: checkpoints dmpcheck wrote before it followed TorchRec) is read too.
at::Tensor piece_of(at::Tensor& full, const Shard& placement, bool row_state);

}  // namespace dmpcheck::dmp
