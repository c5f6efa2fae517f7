#include "dmp/sharding/table_wise.h"

#include <ATen/ATen.h>

#include "comm/communicator.h"
#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

std::vector<int64_t> scaled(const std::vector<int64_t>& counts, int64_t factor) {
  std::vector<int64_t> out;
  for (int64_t c : counts) out.push_back(c * factor);
  return out;
}

}  // namespace

TableWiseSharding::TableWiseSharding(comm::Communicator& comm, const std::vector<EmbeddingBagConfig>& tables,
                                     const std::vector<int>& owners, std::vector<TableShard> local_shards,
                                     bool divide_gradients_by_world_size)
    : comm_(comm), shards_(std::move(local_shards)), divide_gradients_(divide_gradients_by_world_size) {
  DMP_INTERNAL_ASSERT(tables.size() == owners.size(), "one owner per table");
  const auto world = static_cast<size_t>(comm_.world_size());
  features_by_rank_.resize(world);
  dim_by_rank_.assign(world, 0);
  for (size_t t = 0; t < tables.size(); ++t) {
    const auto owner = static_cast<size_t>(owners[t]);
    for (const auto& f : tables[t].feature_names) {
      features_by_rank_[owner].push_back(f);
      dim_by_rank_[owner] += tables[t].embedding_dim;
      input_features_.push_back(f);
    }
  }
  for (size_t r = 0; r < world; ++r) {
    for (size_t t = 0; t < tables.size(); ++t) {
      if (static_cast<size_t>(owners[t]) != r) continue;
      for (const auto& f : tables[t].feature_names) {
        columns_.features.push_back(f);
        columns_.dims.push_back(tables[t].embedding_dim);
      }
    }
  }
}

at::Tensor TableWiseSharding::forward(const KeyedJaggedTensor& local) {
  DMP_CHECK(!local.weights(), ErrorKind::kInvalidInput, "table_wise sharding does not take weighted features yet");
  const int world = comm_.world_size();
  const int me = comm_.rank();
  const int64_t batch = local.stride();
  local_batch_ = batch;

  // Phase 1: lengths (sizes known to all ranks: batch x features of the destination).
  std::vector<KeyedJaggedTensor> parts;
  std::vector<at::Tensor> lengths, values;
  std::vector<int64_t> length_splits, value_counts;
  for (int d = 0; d < world; ++d) {
    parts.push_back(local.select(features_by_rank_[static_cast<size_t>(d)]));
    lengths.push_back(parts.back().lengths());
    values.push_back(parts.back().values());
    length_splits.push_back(parts.back().lengths().numel());
    value_counts.push_back(parts.back().values().numel());
  }
  const int64_t my_features = static_cast<int64_t>(features_by_rank_[static_cast<size_t>(me)].size());
  std::vector<int64_t> recv_length_splits(static_cast<size_t>(world), batch * my_features);
  at::Tensor recv_lengths = comm_.all_to_all(at::cat(lengths), length_splits, recv_length_splits);

  // Phase 2: how many ids each rank sends, then the ids.
  std::vector<int64_t> ones(static_cast<size_t>(world), 1);
  at::Tensor recv_counts_t = comm_.all_to_all(at::tensor(value_counts, at::kLong), ones, ones);
  std::vector<int64_t> recv_counts(recv_counts_t.data_ptr<int64_t>(), recv_counts_t.data_ptr<int64_t>() + world);
  at::Tensor recv_values = comm_.all_to_all(at::cat(values), value_counts, recv_counts);

  // Owner: the bags of the global batch for each of its features, in source-rank order.
  saved_bags_.clear();
  std::vector<at::Tensor> pooled;
  if (my_features > 0) {
    std::vector<KeyedJaggedTensor> from_sources;
    int64_t l0 = 0, v0 = 0;
    for (int s = 0; s < world; ++s) {
      from_sources.emplace_back(features_by_rank_[static_cast<size_t>(me)],
                                recv_values.narrow(0, v0, recv_counts[static_cast<size_t>(s)]),
                                recv_lengths.narrow(0, l0, batch * my_features));
      l0 += batch * my_features;
      v0 += recv_counts[static_cast<size_t>(s)];
    }
    const KeyedJaggedTensor global = KeyedJaggedTensor::concat_batches(from_sources);
    for (auto& shard : shards_) {
      for (const auto& feature : shard.config.feature_names) {
        const size_t k = global.key_index(feature);
        Bags bags{global.values_of(k), global.lengths_of(k), std::nullopt};
        check_ids_in_range(bags, shard.config.num_embeddings, shard.config.name, feature);
        pooled.push_back(pooled_forward(shard.weight, bags, shard.config.pooling));
        saved_bags_.push_back(std::move(bags));
      }
    }
  }
  // Phase 3: pooled rows back to the rank that owns each bag.  Widths differ per owner, so the
  // exchange is of flat elements.
  at::Tensor send = pooled.empty() ? at::empty({0}, at::kFloat) : at::cat(pooled, 1).reshape({-1});
  const int64_t my_dim = dim_by_rank_[static_cast<size_t>(me)];
  std::vector<int64_t> send_splits(static_cast<size_t>(world), batch * my_dim);
  at::Tensor received = comm_.all_to_all(send, send_splits, scaled(dim_by_rank_, batch));
  std::vector<at::Tensor> blocks;
  int64_t offset = 0;
  for (int d = 0; d < world; ++d) {
    const int64_t width = dim_by_rank_[static_cast<size_t>(d)];
    if (width == 0) continue;
    blocks.push_back(received.narrow(0, offset, batch * width).view({batch, width}));
    offset += batch * width;
  }
  if (blocks.empty()) return at::empty({batch, 0}, at::kFloat);
  return at::cat(blocks, 1);
}

void TableWiseSharding::backward(const at::Tensor& grad) {
  const int world = comm_.world_size();
  const int me = comm_.rank();
  const int64_t batch = local_batch_;
  // Reverse of phase 3: each owner gets the gradient of every bag it pooled.
  std::vector<at::Tensor> sends;
  int64_t column = 0;
  for (int d = 0; d < world; ++d) {
    const int64_t width = dim_by_rank_[static_cast<size_t>(d)];
    sends.push_back(grad.narrow(1, column, width).contiguous().reshape({-1}));
    column += width;
  }
  const int64_t my_dim = dim_by_rank_[static_cast<size_t>(me)];
  std::vector<int64_t> recv_splits(static_cast<size_t>(world), batch * my_dim);
  at::Tensor received = comm_.all_to_all(at::cat(sends), scaled(dim_by_rank_, batch), recv_splits);
  if (my_dim == 0) return;

  std::vector<at::Tensor> per_source;
  for (int s = 0; s < world; ++s) {
    per_source.push_back(received.narrow(0, s * batch * my_dim, batch * my_dim).view({batch, my_dim}));
  }
  const at::Tensor global_grad = at::cat(per_source, 0);  // [world * batch, my_dim]
  const double scale = divide_gradients_ ? 1.0 / world : 1.0;
  size_t feature = 0;
  int64_t offset = 0;
  for (auto& shard : shards_) {
    std::vector<RowGradients> parts;
    for (size_t f = 0; f < shard.config.feature_names.size(); ++f, ++feature) {
      const int64_t dim = shard.config.embedding_dim;
      parts.push_back(pooled_backward(global_grad.narrow(1, offset, dim), saved_bags_[feature], shard.config.pooling));
      offset += dim;
    }
    RowGradients rows = merge_row_gradients(parts);
    if (scale != 1.0) rows.grads = rows.grads * scale;
    shard.optimizer->apply(shard.weight, rows);
  }
}

std::vector<TableShard*> TableWiseSharding::local_shards() {
  std::vector<TableShard*> out;
  for (auto& s : shards_) out.push_back(&s);
  return out;
}

}  // namespace dmpcheck::dmp
