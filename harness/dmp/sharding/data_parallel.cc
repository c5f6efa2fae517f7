#include "dmp/sharding/data_parallel.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <ATen/ATen.h>

#include "comm/communicator.h"

namespace dmpcheck::dmp {

DataParallelSharding::DataParallelSharding(comm::Communicator& comm, std::vector<TableShard> shards,
                                           DataParallelUpdate update)
    : comm_(comm), shards_(std::move(shards)), update_(update) {
  for (const auto& shard : shards_) {
    for (const auto& f : shard.config.feature_names) {
      if (std::find(input_features_.begin(), input_features_.end(), f) == input_features_.end())
        input_features_.push_back(f);
      columns_.features.push_back(f + "@" + shard.config.name);
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
      Bags bags{local.values_of(k), local.lengths_of(k), shard.config.weighted ? local.weights_of(k) : std::nullopt};
      check_ids_in_range(bags, shard.config.num_embeddings, shard.config.name, feature);
      pooled.push_back(pooled_forward(shard.weight, bags, shard.config.pooling));
      saved_bags_.push_back(std::move(bags));
    }
  }
  if (pooled.empty()) return at::empty({local.stride(), 0}, at::kFloat);
  return at::cat(pooled, 1);
}

void DataParallelSharding::backward(const at::Tensor& grad) {
  if (shards_.empty()) return;
  int64_t grad_elements = 0;
  int64_t total = 0;
  for (const auto& shard : shards_) {
    grad_elements += shard.config.num_embeddings * shard.config.embedding_dim;
    total += shard.config.num_embeddings * (shard.config.embedding_dim + 1);
  }
  if (!flat_.defined() || flat_.numel() != total) {
    // Rows are scattered into this buffer at random: with 4 KiB pages nearly every row is a TLB
    // miss.  Ask for transparent huge pages before the first touch (a hint; ignored where THP
    // is off).
    flat_ = at::empty({total}, at::kFloat);
    const auto begin = reinterpret_cast<uintptr_t>(flat_.data_ptr<float>());
    const uintptr_t huge = uintptr_t{2} << 20;
    const uintptr_t first = (begin + huge - 1) & ~(huge - 1);
    const uintptr_t last = (begin + static_cast<uintptr_t>(total) * sizeof(float)) & ~(huge - 1);
    if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
    flat_.zero_();
  }

  // Row gradients of the local batch, written densely so that one all-reduce averages them
  // across ranks together with a count of how often each row was touched anywhere.
  size_t column = 0;
  int64_t offset = 0;
  int64_t grad_offset = 0;
  int64_t count_offset = grad_elements;
  for (const auto& shard : shards_) {
    std::vector<GradientPart> parts;
    for (size_t f = 0; f < shard.config.feature_names.size(); ++f, ++column) {
      const int64_t dim = columns_.dims[column];
      parts.push_back({grad.narrow(1, offset, dim), saved_bags_[column], shard.config.pooling});
      offset += dim;
    }
    // Plain row copies: ATen's index_copy_/index_fill_ cost more than everything else here.
    const RowGradients rows = row_gradients(parts);
    const int64_t dim = shard.config.embedding_dim;
    const at::Tensor grads = rows.grads.contiguous();
    const int64_t* row = rows.rows.data_ptr<int64_t>();
    const float* source = grads.data_ptr<float>();
    float* dense = flat_.data_ptr<float>() + grad_offset;
    float* count = flat_.data_ptr<float>() + count_offset;
    const int64_t n = rows.rows.numel();
    if (update_ == DataParallelUpdate::kDenseOptimizer) {
      // DDP scales each gradient by 1/world_size (a float) into its bucket, then sums.
      const float scale = static_cast<float>(1.0 / comm_.world_size());
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t d = 0; d < dim; ++d) dense[row[i] * dim + d] = source[i * dim + d] * scale;
        count[row[i]] = 1.0f;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(dense + row[i] * dim, source + i * dim, static_cast<size_t>(dim) * sizeof(float));
        count[row[i]] = 1.0f;
      }
    }
    grad_offset += shard.config.num_embeddings * shard.config.embedding_dim;
    count_offset += shard.config.num_embeddings;
  }
  comm_.all_reduce(flat_, comm::ReduceOp::kSum);

  if (update_ == DataParallelUpdate::kDenseOptimizer) {
    // Every row's (already averaged) gradient, zero where no rank touched it, becomes the
    // table's .grad for the dense optimizer; the buffer is cleared for the next step.
    if (dense_grads_.size() != shards_.size()) dense_grads_.assign(shards_.size(), at::Tensor());
    grad_offset = 0;
    for (size_t s = 0; s < shards_.size(); ++s) {
      auto& shard = shards_[s];
      const int64_t elements = shard.config.num_embeddings * shard.config.embedding_dim;
      if (!dense_grads_[s].defined()) dense_grads_[s] = at::empty_like(shard.weight);
      at::Tensor region = flat_.narrow(0, grad_offset, elements).view(shard.weight.sizes());
      dense_grads_[s].copy_(region);
      shard.weight.mutable_grad() = dense_grads_[s];
      grad_offset += elements;
    }
    flat_.zero_();
    return;
  }

  // Average and apply the rows touched on any rank, then clear them for the next step.
  grad_offset = 0;
  count_offset = grad_elements;
  for (auto& shard : shards_) {
    const int64_t rows = shard.config.num_embeddings;
    const int64_t dim = shard.config.embedding_dim;
    float* dense = flat_.data_ptr<float>() + grad_offset;
    float* count = flat_.data_ptr<float>() + count_offset;
    grad_offset += rows * dim;
    count_offset += rows;
    const int64_t n = std::count_if(count, count + rows, [](float c) { return c > 0; });
    at::Tensor touched_rows = at::empty({n}, at::kLong);
    at::Tensor averaged = at::empty({n, dim}, at::kFloat);
    int64_t* touched = touched_rows.data_ptr<int64_t>();
    float* target = averaged.data_ptr<float>();
    for (int64_t r = 0, i = 0; r < rows; ++r) {
      if (!(count[r] > 0)) continue;
      touched[i] = r;
      float* source = dense + r * dim;
      std::memcpy(target + i * dim, source, static_cast<size_t>(dim) * sizeof(float));
      std::memset(source, 0, static_cast<size_t>(dim) * sizeof(float));
      count[r] = 0.0f;
      ++i;
    }
    if (update_ == DataParallelUpdate::kFusedOptimizer)
      shard.optimizer->apply(shard.weight, RowGradients{touched_rows, averaged.div_(comm_.world_size())});
  }
}

}  // namespace dmpcheck::dmp
