#include "dmp/sharding/model_parallel.h"

#include <algorithm>
#include <numeric>

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

ModelParallelSharding::ModelParallelSharding(comm::Communicator& comm, const std::vector<EmbeddingBagConfig>& tables,
                                             const std::vector<TablePlan>& plans, std::vector<TableShard> local_shards,
                                             const BehaviourProfile& profile)
    : comm_(comm),
      tables_(tables),
      shards_(std::move(local_shards)),
      divide_gradients_(profile.divide_model_parallel_gradients_by_world_size),
      deduplicate_(profile.deduplicate_row_gradients) {
  bool row_split_mean = false;
  DMP_INTERNAL_ASSERT(tables.size() == plans.size(), "one plan per table");
  const auto world = static_cast<size_t>(comm_.world_size());
  items_by_rank_.resize(world);
  width_by_rank_.assign(world, 0);
  int local = 0;
  for (size_t t = 0; t < tables_.size(); ++t) {
    std::vector<int> local_index(plans[t].shards.size(), -1);
    for (size_t s = 0; s < plans[t].shards.size(); ++s) {
      if (plans[t].shards[s].rank == comm_.rank()) local_index[s] = local++;
    }
    for (const auto& feature : tables_[t].feature_names) {
      if (std::find(input_features_.begin(), input_features_.end(), feature) == input_features_.end()) {
        input_features_.push_back(feature);
      }
      const size_t column = columns_.features.size();
      columns_.features.push_back(feature + "@" + tables_[t].name);
      column_feature_.push_back(feature);
      columns_.dims.push_back(tables_[t].embedding_dim);
      const bool row_split = plans[t].type == ShardingType::kRowWise || plans[t].type == ShardingType::kTableRowWise;
      const bool mean = tables_[t].pooling == PoolingType::kMean;
      const bool local_mean = profile.row_wise_mean_divides_by_local_length && row_split && mean;
      column_after_reduce_.push_back(mean && row_split && !local_mean ? AfterReduce::kLength
                                     : !mean && row_split             ? AfterReduce::kOne
                                                                      : AfterReduce::kNone);
      column_row_split_sum_.push_back(row_split && !mean);
      row_split_mean = row_split_mean || (row_split && mean);
      for (size_t s = 0; s < plans[t].shards.size(); ++s) {
        const Shard& shard = plans[t].shards[s];
        items_by_rank_[static_cast<size_t>(shard.rank)].push_back(
            {t, feature, column, shard, local_index[s], local_mean, mean && !row_split});
        width_by_rank_[static_cast<size_t>(shard.rank)] += shard.cols;
      }
    }
  }
  DMP_INTERNAL_ASSERT(local == static_cast<int>(shards_.size()), "{} local shards given, the plan has {}",
                      shards_.size(), local);
  column_offsets_.resize(columns_.dims.size());
  std::exclusive_scan(columns_.dims.begin(), columns_.dims.end(), column_offsets_.begin(), int64_t{0});
  // TorchRec builds the divisor only when some row-sharded table averages.
  mutate_sum_lengths_ = profile.mean_divisor_mutates_lengths && row_split_mean;
  mean_divisor_eps_ = profile.row_wise_mean_divisor_eps;
  // Summed row-sharded features are divided by 1 + eps only beside an averaged one, and only
  // where the divisor has an eps at all.
  for (auto& a : column_after_reduce_) {
    if (a == AfterReduce::kOne && !(row_split_mean && mean_divisor_eps_ > 0)) a = AfterReduce::kNone;
  }
}

at::Tensor ModelParallelSharding::mean_divisor(size_t column) const {
  // TorchRec (>= 0.8) divides row-sharded means by the bag length plus a small eps, in float.
  at::Tensor length = local_lengths_[column].to(at::kFloat);
  if (column_after_reduce_[column] == AfterReduce::kOne) length = at::ones_like(length);
  return (mean_divisor_eps_ > 0 ? length + mean_divisor_eps_ : length.clamp_min(1)).unsqueeze(1);
}

at::Tensor ModelParallelSharding::forward(const KeyedJaggedTensor& local) {
  const int world = comm_.world_size();
  const auto me = static_cast<size_t>(comm_.rank());
  const int64_t batch = local.stride();
  const bool weighted = local.weights().has_value();
  local_batch_ = batch;

  local_lengths_.clear();
  std::vector<Bags> local_bags;
  for (size_t c = 0; c < columns_.features.size(); ++c) {
    const size_t k = local.key_index(column_feature_[c]);
    local_bags.push_back({local.values_of(k), local.lengths_of(k), local.weights_of(k)});
    local_lengths_.push_back(local.lengths_of(k));
  }

  // Step 1: bucketize for every owner and exchange lengths, id counts, ids and weights.
  std::vector<at::Tensor> send_lengths, send_ids, send_weights;
  std::vector<int64_t> length_splits, id_counts;
  for (int d = 0; d < world; ++d) {
    int64_t ids = 0;
    for (const Item& item : items_by_rank_[static_cast<size_t>(d)]) {
      const EmbeddingBagConfig& table = tables_[item.table];
      check_ids_in_range(local_bags[item.column], table.num_embeddings, table.name, item.feature);
      Bags part = bucketize_rows(local_bags[item.column], item.shard.row_offset, item.shard.rows);
      if (mutate_sum_lengths_ && column_row_split_sum_[item.column]) part.lengths.fill_(1);
      send_lengths.push_back(part.lengths);
      send_ids.push_back(part.ids);
      if (weighted) send_weights.push_back(*part.weights);
      ids += part.ids.numel();
    }
    length_splits.push_back(batch * static_cast<int64_t>(items_by_rank_[static_cast<size_t>(d)].size()));
    id_counts.push_back(ids);
  }
  const int64_t my_items = static_cast<int64_t>(items_by_rank_[me].size());
  const std::vector<int64_t> recv_length_splits(static_cast<size_t>(world), batch * my_items);
  const at::Tensor recv_lengths =
      comm_.all_to_all(cat_or_empty(send_lengths, at::kLong), length_splits, recv_length_splits);
  const std::vector<int64_t> ones(static_cast<size_t>(world), 1);
  const at::Tensor counts = comm_.all_to_all(at::tensor(id_counts, at::kLong), ones, ones);
  const std::vector<int64_t> recv_counts(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + world);
  const at::Tensor recv_ids = comm_.all_to_all(cat_or_empty(send_ids, at::kLong), id_counts, recv_counts);
  at::Tensor recv_weights;
  if (weighted) recv_weights = comm_.all_to_all(cat_or_empty(send_weights, at::kFloat), id_counts, recv_counts);

  // Step 2: the owner pools each item over the global batch (sources in rank order).
  owner_bags_.assign(static_cast<size_t>(my_items), Bags{});
  std::vector<at::Tensor> pooled;
  {
    std::vector<std::vector<at::Tensor>> lengths(static_cast<size_t>(my_items)), ids(lengths.size()),
        weights(lengths.size());
    int64_t l0 = 0, v0 = 0;
    for (int s = 0; s < world; ++s) {
      // The lengths a source sent must account for exactly the ids it sent.
      const int64_t declared = my_items > 0 ? recv_lengths.narrow(0, l0, batch * my_items).sum().item<int64_t>() : 0;
      DMP_CHECK_EQ(declared, recv_counts[static_cast<size_t>(s)], ErrorKind::kInvalidInput,
                   "rank {}: the ids rank {} sent do not match the lengths it sent (the KeyedJaggedTensor's lengths "
                   "no longer match its values)",
                   comm_.rank(), s);
      for (int64_t i = 0; i < my_items; ++i) {
        const at::Tensor len = recv_lengths.narrow(0, l0, batch);
        const int64_t n = len.sum().item<int64_t>();
        lengths[static_cast<size_t>(i)].push_back(len);
        ids[static_cast<size_t>(i)].push_back(recv_ids.narrow(0, v0, n));
        if (weighted) weights[static_cast<size_t>(i)].push_back(recv_weights.narrow(0, v0, n));
        l0 += batch;
        v0 += n;
      }
    }
    for (int64_t i = 0; i < my_items; ++i) {
      const Item& item = items_by_rank_[me][static_cast<size_t>(i)];
      Bags& bags = owner_bags_[static_cast<size_t>(i)];
      bags.lengths = at::cat(lengths[static_cast<size_t>(i)]);
      bags.ids = at::cat(ids[static_cast<size_t>(i)]);
      if (weighted && tables_[item.table].weighted) bags.weights = at::cat(weights[static_cast<size_t>(i)]);
      at::Tensor sum = pooled_forward(shards_[static_cast<size_t>(item.local_shard)].weight, bags,
                                      item.owner_mean ? PoolingType::kMean : PoolingType::kSum);
      if (item.local_mean) sum = sum / bags.lengths.clamp_min(1).to(at::kFloat).unsqueeze(1);
      pooled.push_back(sum);
    }
  }

  // Step 3: partials back to the bags' ranks; sum row shards, place column shards, then mean.
  const at::Tensor send = pooled.empty() ? at::empty({0}, at::kFloat) : at::cat(pooled, 1).reshape({-1});
  // pooled rows are [world * batch], source-major, so each source's block is contiguous.
  const std::vector<int64_t> send_splits(static_cast<size_t>(world), batch * width_by_rank_[me]);
  const at::Tensor received = comm_.all_to_all(send, send_splits, scaled(width_by_rank_, batch));
  at::Tensor out = at::zeros({batch, columns_.total_dim()}, at::kFloat);
  int64_t offset = 0;
  for (int d = 0; d < world; ++d) {
    const int64_t width = width_by_rank_[static_cast<size_t>(d)];
    if (width == 0) continue;
    const at::Tensor block = received.narrow(0, offset, batch * width).view({batch, width});
    offset += batch * width;
    int64_t col = 0;
    for (const Item& item : items_by_rank_[static_cast<size_t>(d)]) {
      out.narrow(1, column_offsets_[item.column] + item.shard.col_offset, item.shard.cols)
          .add_(block.narrow(1, col, item.shard.cols));
      col += item.shard.cols;
    }
  }
  for (size_t c = 0; c < columns_.features.size(); ++c) {
    if (column_after_reduce_[c] != AfterReduce::kNone)
      out.narrow(1, column_offsets_[c], columns_.dims[c]).div_(mean_divisor(c));
  }
  return out;
}

void ModelParallelSharding::backward(const at::Tensor& grad) {
  const int world = comm_.world_size();
  const auto me = static_cast<size_t>(comm_.rank());
  const int64_t batch = local_batch_;

  // A row-sharded mean's divisor first, so owners see the gradient of their sum-pooled partials
  // (whole-bag owners apply the mean's 1/L themselves, in their backward).
  at::Tensor g = grad.contiguous().clone();
  for (size_t c = 0; c < columns_.features.size(); ++c) {
    if (column_after_reduce_[c] != AfterReduce::kNone)
      g.narrow(1, column_offsets_[c], columns_.dims[c]).div_(mean_divisor(c));
  }

  std::vector<at::Tensor> sends;
  for (int d = 0; d < world; ++d) {
    std::vector<at::Tensor> blocks;
    for (const Item& item : items_by_rank_[static_cast<size_t>(d)]) {
      blocks.push_back(g.narrow(1, column_offsets_[item.column] + item.shard.col_offset, item.shard.cols));
    }
    if (!blocks.empty()) sends.push_back(at::cat(blocks, 1).reshape({-1}));
  }
  const std::vector<int64_t> recv_splits(static_cast<size_t>(world), batch * width_by_rank_[me]);
  const at::Tensor received =
      comm_.all_to_all(cat_or_empty(sends, at::kFloat), scaled(width_by_rank_, batch), recv_splits);
  const int64_t width = width_by_rank_[me];

  std::vector<std::vector<GradientPart>> per_shard(shards_.size());
  if (width > 0) {
    std::vector<at::Tensor> per_source;
    for (int s = 0; s < world; ++s) {
      per_source.push_back(received.narrow(0, s * batch * width, batch * width).view({batch, width}));
    }
    const at::Tensor global = at::cat(per_source, 0);  // [world * batch, width]
    int64_t col = 0;
    for (size_t i = 0; i < items_by_rank_[me].size(); ++i) {
      const Item& item = items_by_rank_[me][i];
      at::Tensor item_grad = global.narrow(1, col, item.shard.cols);
      // TorchRec divides the gradient the owner receives by the world size (GRADIENT_DIVISION).
      if (divide_gradients_) item_grad = item_grad / world;
      if (item.local_mean) item_grad = item_grad / owner_bags_[i].lengths.clamp_min(1).to(at::kFloat).unsqueeze(1);
      per_shard[static_cast<size_t>(item.local_shard)].push_back(
          {item_grad, owner_bags_[i], item.owner_mean ? PoolingType::kMean : PoolingType::kSum});
      col += item.shard.cols;
    }
  }
  for (size_t s = 0; s < shards_.size(); ++s) {
    const RowGradients none{at::empty({0}, at::kLong), at::empty({0, shards_[s].weight.size(1)}, at::kFloat)};
    if (deduplicate_) {
      shards_[s].optimizer->apply(shards_[s].weight, per_shard[s].empty() ? none : row_gradients(per_shard[s]));
    } else {
      RowGradients occurrences = none;
      if (!per_shard[s].empty()) {
        std::vector<at::Tensor> rows, grads;
        for (const auto& part : per_shard[s]) {
          const RowGradients p = per_occurrence_gradients(part.grad_pooled, part.bags, part.pooling);
          rows.push_back(p.rows);
          grads.push_back(p.grads);
        }
        occurrences = {at::cat(rows), at::cat(grads)};
      }
      shards_[s].optimizer->apply_in_turn(shards_[s].weight, occurrence_groups(occurrences));
    }
    round_to_storage(shards_[s].config, shards_[s].weight);
  }
}

}  // namespace dmpcheck::dmp
