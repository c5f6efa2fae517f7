#include "dmp/sharding/data_parallel.h"

#include <ATen/ATen.h>

#include "comm/communicator.h"
#include "common/error.h"

namespace dmpcheck::dmp {

int64_t PooledColumns::total_dim() const {
  int64_t total = 0;
  for (int64_t d : dims) total += d;
  return total;
}

std::vector<std::string> features_of(const std::vector<EmbeddingBagConfig>& tables) {
  std::vector<std::string> features;
  for (const auto& t : tables) features.insert(features.end(), t.feature_names.begin(), t.feature_names.end());
  return features;
}

DataParallelSharding::DataParallelSharding(comm::Communicator& comm, std::vector<TableShard> shards, bool update_tables)
    : comm_(comm), shards_(std::move(shards)), update_tables_(update_tables) {
  for (const auto& shard : shards_) {
    for (const auto& f : shard.config.feature_names) {
      input_features_.push_back(f);
      columns_.features.push_back(f);
      columns_.dims.push_back(shard.config.embedding_dim);
    }
  }
}

at::Tensor DataParallelSharding::forward(const KeyedJaggedTensor& local) {
  saved_bags_.clear();
  std::vector<at::Tensor> pooled;
  for (const auto& shard : shards_) {
    for (const auto& feature : shard.config.feature_names) {
      const size_t k = local.key_index(feature);
      Bags bags{local.values_of(k), local.lengths_of(k),
                shard.config.weighted ? local.weights_of(k) : std::nullopt};
      check_ids_in_range(bags, shard.config.num_embeddings, shard.config.name, feature);
      pooled.push_back(pooled_forward(shard.weight, bags, shard.config.pooling));
      saved_bags_.push_back(std::move(bags));
    }
  }
  if (pooled.empty()) return at::empty({local.stride(), 0}, at::kFloat);
  return at::cat(pooled, 1);
}

void DataParallelSharding::backward(const at::Tensor& grad) {
  // Row gradients of the local batch, written densely so that one all-reduce averages them
  // across ranks together with a count of how often each row was touched anywhere.
  std::vector<at::Tensor> dense_grads, touched;
  int64_t grad_elements = 0;
  size_t column = 0;
  int64_t offset = 0;
  for (auto& shard : shards_) {
    std::vector<RowGradients> parts;
    for (size_t f = 0; f < shard.config.feature_names.size(); ++f, ++column) {
      const int64_t dim = columns_.dims[column];
      parts.push_back(pooled_backward(grad.narrow(1, offset, dim), saved_bags_[column], shard.config.pooling));
      offset += dim;
    }
    RowGradients rows = merge_row_gradients(parts);
    at::Tensor dense = at::zeros_like(shard.weight);
    at::Tensor count = at::zeros({shard.config.num_embeddings}, at::kFloat);
    if (rows.rows.numel() > 0) {
      dense.index_copy_(0, rows.rows, rows.grads);
      count.index_fill_(0, rows.rows, 1.0);
    }
    grad_elements += dense.numel();
    dense_grads.push_back(dense.reshape({-1}));
    touched.push_back(count);
  }
  if (shards_.empty()) return;
  at::Tensor flat = at::cat({at::cat(dense_grads), at::cat(touched)});
  comm_.all_reduce(flat, comm::ReduceOp::kSum);
  flat.div_(comm_.world_size());

  int64_t grad_offset = 0;
  int64_t count_offset = grad_elements;
  for (auto& shard : shards_) {
    const int64_t rows = shard.config.num_embeddings;
    const int64_t dim = shard.config.embedding_dim;
    at::Tensor dense = flat.narrow(0, grad_offset, rows * dim).view({rows, dim});
    at::Tensor count = flat.narrow(0, count_offset, rows);
    grad_offset += rows * dim;
    count_offset += rows;
    if (!update_tables_) continue;
    at::Tensor touched_rows = count.gt(0).nonzero().reshape({-1});
    shard.optimizer->apply(shard.weight, RowGradients{touched_rows, dense.index_select(0, touched_rows)});
  }
}

std::vector<TableShard*> DataParallelSharding::local_shards() {
  std::vector<TableShard*> out;
  for (auto& s : shards_) out.push_back(&s);
  return out;
}

}  // namespace dmpcheck::dmp
