// One sharding type's share of an EmbeddingBagCollection: the tables the plan gave that type,
// the collectives that move ids and pooled embeddings, and the backward that feeds the fused
// optimizer.  Every type has the same small file set under dmp/sharding/.
#pragma once

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/embedding_config.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/optim/fused_optimizer.h"
#include "dmp/planner.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::dmp {

struct BehaviourProfile;

// A table's part held on this rank.  Owned by its sharding.
struct TableShard {
  EmbeddingBagConfig config;
  ShardingType type = ShardingType::kTableWise;
  Shard placement;    // rows and columns of the full table this shard holds
  at::Tensor weight;  // [placement.rows, placement.cols]
  std::unique_ptr<FusedOptimizer> optimizer;
};

// The pooled features a sharding produces, in the column order of forward()'s output.
struct PooledColumns {
  std::vector<std::string> features;  // "<feature>@<table>": one per lookup, unique
  std::vector<int64_t> dims;
  int64_t total_dim() const { return std::accumulate(dims.begin(), dims.end(), int64_t{0}); }
};

class EmbeddingSharding {
 public:
  virtual ~EmbeddingSharding() = default;

  // Whether every rank holds every table of this sharding (data_parallel).
  virtual bool replicated() const = 0;
  // Features this sharding reads from the batch.
  virtual const std::vector<std::string>& input_features() const = 0;
  virtual const PooledColumns& output_columns() const = 0;

  // Collective.  `local` is this rank's batch of input_features(); returns
  // [local batch, output_columns().total_dim()].
  virtual at::Tensor forward(const KeyedJaggedTensor& local) = 0;
  // Collective.  `grad` has forward()'s shape.  Computes each table's row gradients (averaged
  // over ranks) and applies the fused optimizer.  Must follow the forward() it differentiates.
  virtual void backward(const at::Tensor& grad) = 0;

  // The table shards this rank holds (none for a rank that owns no table of this type).
  virtual std::vector<TableShard*> local_shards() = 0;
};

// Pointers to `shards`: what local_shards() returns.
inline std::vector<TableShard*> pointers_to(std::vector<TableShard>& shards) {
  std::vector<TableShard*> out;
  for (auto& s : shards) out.push_back(&s);
  return out;
}

}  // namespace dmpcheck::dmp
