// table_wise: each table lives whole on one rank (its owner).  Forward sends every rank's ids
// of a table's features to the owner (all-to-all of lengths, then of ids), the owner pools the
// bags of the whole global batch, and the pooled rows go back by a second all-to-all.
// Backward reverses the pooled all-to-all; the owner sums row gradients over the global batch,
// divides by world size (the model-parallel convention) and applies the fused optimizer.
#pragma once

#include "dmp/sharding/embedding_sharding.h"

namespace dmpcheck::dmp {

class TableWiseSharding final : public EmbeddingSharding {
 public:
  // `tables`: every table_wise table of the model, in model order, with its owner in `owners`.
  // `local_shards`: this rank's tables (initialised), in the same relative order.
  TableWiseSharding(comm::Communicator& comm, const std::vector<EmbeddingBagConfig>& tables,
                    const std::vector<int>& owners, std::vector<TableShard> local_shards,
                    bool divide_gradients_by_world_size);

  ShardingType type() const override { return ShardingType::kTableWise; }
  const std::vector<std::string>& input_features() const override { return input_features_; }
  const PooledColumns& output_columns() const override { return columns_; }
  at::Tensor forward(const KeyedJaggedTensor& local) override;
  void backward(const at::Tensor& grad) override;
  std::vector<TableShard*> local_shards() override;

 private:
  comm::Communicator& comm_;  // outlives the sharding: owned by the worker for the whole run
  std::vector<TableShard> shards_;
  bool divide_gradients_;
  std::vector<std::string> input_features_;
  PooledColumns columns_;                          // rank 0's features, then rank 1's, ...
  std::vector<std::vector<std::string>> features_by_rank_;
  std::vector<int64_t> dim_by_rank_;              // pooled width each owner produces
  int64_t local_batch_ = 0;
  std::vector<Bags> saved_bags_;                   // owner: global-batch bags per local feature
};

}  // namespace dmpcheck::dmp
