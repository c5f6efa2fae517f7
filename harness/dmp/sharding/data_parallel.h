// data_parallel: every rank holds a full replica of each table and looks up its own batch
// locally.  Backward all-reduces the row gradients (averaged over ranks, as DDP does) so every
// replica applies the same update.  Replicas stay equal only if they start equal: that is what
// the init broadcast (BehaviourProfile) guarantees and what issue #1739 lacked.
#pragma once

#include "dmp/sharding/embedding_sharding.h"

namespace dmpcheck::dmp {

class DataParallelSharding final : public EmbeddingSharding {
 public:
  // `shards` hold full tables (already initialised); ownership moves here.
  // `update_tables` false: gradients are reduced but no optimizer step is taken (a profile
  // switch reproducing a data-parallel table nobody attached an optimizer to).
  DataParallelSharding(comm::Communicator& comm, std::vector<TableShard> shards, bool update_tables = true);

  bool replicated() const override { return true; }
  const std::vector<std::string>& input_features() const override { return input_features_; }
  const PooledColumns& output_columns() const override { return columns_; }
  at::Tensor forward(const KeyedJaggedTensor& local) override;
  void backward(const at::Tensor& grad) override;
  std::vector<TableShard*> local_shards() override;

 private:
  comm::Communicator& comm_;  // outlives the sharding: owned by the worker for the whole run
  std::vector<TableShard> shards_;
  bool update_tables_;
  std::vector<std::string> input_features_;
  PooledColumns columns_;
  std::vector<Bags> saved_bags_;  // per output column, from the last forward
  // Every table's dense gradient, then one touch count per row, flat: the buffer one all-reduce
  // averages.  Kept between steps and all zero outside backward(), so a step writes and clears
  // only the rows some rank touched instead of allocating (and page-faulting) the tables' size.
  at::Tensor flat_;
};

}  // namespace dmpcheck::dmp
