// data_parallel: every rank holds a full replica of each table and looks up its own batch
// locally.  Backward all-reduces the row gradients (averaged over ranks, as DDP does) so every
// replica applies the same update.  Replicas stay equal only if they start equal: that is what
// the init broadcast (BehaviourProfile) guarantees and what issue #1739 lacked.
//
// Who applies the update is a behaviour switch: the table's fused optimizer on the touched rows
// (what the scenario's optimizers say), the dense optimizer on every row (what TorchRec does: it
// drops the in-backward optimizer of data-parallel tables), or nobody.
#pragma once

#include "dmp/sharding/embedding_sharding.h"

namespace dmpcheck::dmp {

enum class DataParallelUpdate {
  kFusedOptimizer,  // each shard's FusedOptimizer steps the rows some rank touched
  kDenseOptimizer,  // backward leaves the averaged dense gradient in weight.grad() for the dense optimizer
  kNone,            // gradients are reduced, nothing steps (no optimizer attached)
};

class DataParallelSharding final : public EmbeddingSharding {
 public:
  // `shards` hold full tables (already initialised); ownership moves here.  With
  // kDenseOptimizer the shards carry no FusedOptimizer.
  DataParallelSharding(comm::Communicator& comm, std::vector<TableShard> shards,
                       DataParallelUpdate update = DataParallelUpdate::kFusedOptimizer);

  bool replicated() const override { return true; }
  const std::vector<std::string>& input_features() const override { return input_features_; }
  const PooledColumns& output_columns() const override { return columns_; }
  at::Tensor forward(const KeyedJaggedTensor& local) override;
  void backward(const at::Tensor& grad) override;
  std::vector<TableShard*> local_shards() override { return pointers_to(shards_); }

 private:
  comm::Communicator& comm_;  // outlives the sharding: owned by the worker for the whole run
  std::vector<TableShard> shards_;
  DataParallelUpdate update_;
  std::vector<at::Tensor> dense_grads_;  // kDenseOptimizer: each table's gradient, kept between steps
  std::vector<std::string> input_features_;
  PooledColumns columns_;
  std::vector<Bags> saved_bags_;  // per output column, from the last forward
  // Every table's dense gradient, then one touch count per row, flat: the buffer one all-reduce
  // averages.  Kept between steps and all zero outside backward(), so a step writes and clears
  // only the rows some rank touched instead of allocating (and page-faulting) the tables' size.
  at::Tensor flat_;
};

}  // namespace dmpcheck::dmp
