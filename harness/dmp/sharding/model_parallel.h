// The model-parallel sharding types (table_wise, row_wise, column_wise, table_row_wise) share
// one exchange: they differ only in where the plan puts each table's shards (see planner.h).
//
// Forward, for every (table, feature, shard) "item" in plan order:
//   1. each rank bucketizes its bags of the feature by the shard's row range (ids outside it are
//      dropped, the rest shifted to shard-local rows) and sends them to the shard's owner:
//      an all-to-all of lengths, of id counts, of ids (and of per-id weights when weighted);
//   2. the owner sum-pools the bags of the whole global batch on its shard;
//   3. pooled partials go back to the rank that owns each bag (all-to-all), which adds the row
//      shards of a column range together and places column shards side by side; mean pooling
//      then divides by the bag's full length (never by a shard's part of it: TorchRec #2362).
// Backward reverses step 3 (the mean's 1/length applied first), the owner sums row gradients
// per unique row over the global batch, divides by world size when the profile says so
// (TorchRec's GRADIENT_DIVISION, #2251) and applies the fused optimizer to its shard.
//
// One exchange for all types keeps the numerics of every type identical by construction, so a
// difference between types in a report is a difference in placement, never in arithmetic.
#pragma once

#include "dmp/behaviour_profile.h"
#include "dmp/planner.h"
#include "dmp/sharding/embedding_sharding.h"

namespace dmpcheck::dmp {

class ModelParallelSharding final : public EmbeddingSharding {
 public:
  // `tables`: every model-parallel table of the model, in model order, with its plan.
  // `local_shards`: this rank's shards, in the order of the plan's shards (table, then shard).
  ModelParallelSharding(comm::Communicator& comm, const std::vector<EmbeddingBagConfig>& tables,
                        const std::vector<TablePlan>& plans, std::vector<TableShard> local_shards,
                        const BehaviourProfile& profile);

  bool replicated() const override { return false; }
  const std::vector<std::string>& input_features() const override { return input_features_; }
  const PooledColumns& output_columns() const override { return columns_; }
  at::Tensor forward(const KeyedJaggedTensor& local) override;
  void backward(const at::Tensor& grad) override;
  std::vector<TableShard*> local_shards() override { return pointers_to(shards_); }

 private:
  // The divisor of a row-sharded mean column, [batch, 1].
  at::Tensor mean_divisor(size_t column) const;
  struct Item {
    size_t table = 0;  // index into tables_
    std::string feature;
    size_t column = 0;  // index of the feature in columns_
    Shard shard;
    int local_shard = -1;     // index into shards_ on the owner
    bool local_mean = false;  // TorchRec #2362: the owner divides by its share of the bag
    bool owner_mean = false;  // the owner holds whole bags and pools them by their mean (table/column-wise)
  };

  comm::Communicator& comm_;  // owned by the worker, outlives the sharding
  std::vector<EmbeddingBagConfig> tables_;
  std::vector<TableShard> shards_;
  bool divide_gradients_;
  bool deduplicate_;
  bool mutate_sum_lengths_;  // TorchRec #2808
  std::vector<std::string> input_features_;
  PooledColumns columns_;  // model order
  std::vector<int64_t> column_offsets_;
  std::vector<std::string> column_feature_;  // the batch key each column reads
  // Per column of a row-sharded table, what the summed partials are divided by here: nothing, L + eps
  // (mean pooling), or 1 + eps (sum pooling, when some row-sharded table averages: TorchRec >= 0.8
  // builds one divisor for every reduce-scattered feature, with length 1 for the summed ones).
  enum class AfterReduce { kNone, kLength, kOne };
  std::vector<AfterReduce> column_after_reduce_;
  double mean_divisor_eps_ = 0.0;
  std::vector<bool> column_row_split_sum_;  // per column: a sum-pooled row_wise/table_row_wise table
  std::vector<std::vector<Item>> items_by_rank_;
  std::vector<int64_t> width_by_rank_;  // pooled columns each owner returns per bag

  // From the last forward.
  int64_t local_batch_ = 0;
  std::vector<at::Tensor> local_lengths_;  // per column: this rank's bag lengths
  std::vector<Bags> owner_bags_;           // per item of this rank: global-batch bags
};

}  // namespace dmpcheck::dmp
