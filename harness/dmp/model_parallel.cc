#include "dmp/model_parallel.h"

#include <ATen/ATen.h>

#include "comm/communicator.h"
#include "common/error.h"
#include "dmp/embedding_bag_collection.h"
#include "dmp/sharding/data_parallel.h"
#include "dmp/sharding/table_wise.h"

namespace dmpcheck::dmp {

std::vector<std::string> ModelConfig::features() const { return features_of(tables); }

int64_t ModelConfig::pooled_width() const {
  int64_t width = 0;
  for (const auto& t : tables) width += t.embedding_dim * static_cast<int64_t>(t.feature_names.size());
  return width;
}

DistributedModelParallel::DistributedModelParallel(comm::Communicator& comm, const ModelConfig& model,
                                                   const ShardingPlan& plan, at::Generator& generator,
                                                   const DmpOptions& options)
    : comm_(comm), model_(model), plan_(plan), options_(options) {
  at::NoGradGuard no_grad;
  // The user's model: dense layers are created (and drawn) first, the tables stay on "meta"
  // until DMP materialises them.
  dense_ = std::make_unique<DenseMlp>(model_.pooled_width(), model_.dense_layers, generator);

  // reset_parameters: every table drawn in model order, each rank keeping what it holds.
  std::vector<TableShard> data_parallel, table_wise;
  std::vector<EmbeddingBagConfig> table_wise_configs;
  std::vector<int> table_wise_owners;
  EmbeddingBagCollection collection(model_.tables);
  collection.reset_parameters(generator);
  for (const auto& config : model_.tables) {
    const at::Tensor& weight = collection.weight(config.name);
    const TablePlan& placement = plan_.of(config.name);
    auto make_shard = [&] {
      return TableShard{config, weight,
                        std::make_unique<FusedOptimizer>(options_.sparse_optimizer, config.num_embeddings,
                                                         config.embedding_dim)};
    };
    switch (placement.type) {
      case ShardingType::kDataParallel:
        data_parallel.push_back(make_shard());
        break;
      case ShardingType::kTableWise:
        table_wise_configs.push_back(config);
        table_wise_owners.push_back(placement.ranks.front());
        if (placement.ranks.front() == comm_.rank()) table_wise.push_back(make_shard());
        break;
    }
  }

  // The fix for TorchRec #1739: data-parallel replicas start from rank 0's draw.
  if (options_.profile.broadcast_data_parallel_tables_at_init && !data_parallel.empty()) {
    std::vector<at::Tensor> weights;
    for (const auto& shard : data_parallel) weights.push_back(shard.weight);
    comm::CoalescedBroadcastOptions bopts;
    bopts.root = 0;
    bopts.bucket_cap_bytes = options_.profile.init_broadcast_bucket_cap_bytes;
    init_broadcast_.data_parallel_tables_broadcast = true;
    init_broadcast_.data_parallel_tables = comm::broadcast_coalesced(comm_, weights, bopts);
  }

  // Sharding groups in first-appearance order of their type in the model, as TorchRec groups them.
  for (const auto& config : model_.tables) {
    const ShardingType type = plan_.of(config.name).type;
    bool exists = false;
    for (const auto& s : shardings_) exists = exists || s->type() == type;
    if (exists) continue;
    if (type == ShardingType::kDataParallel) {
      shardings_.push_back(std::make_unique<DataParallelSharding>(comm_, std::move(data_parallel)));
    } else {
      shardings_.push_back(std::make_unique<TableWiseSharding>(
          comm_, table_wise_configs, table_wise_owners, std::move(table_wise),
          options_.profile.divide_model_parallel_gradients_by_world_size));
    }
  }

  DenseDataParallelOptions dense_options;
  dense_dp_ = std::make_unique<DenseDataParallel>(comm_, *dense_, options_.dense_optimizer, dense_options);
  init_broadcast_.dense = dense_dp_->wrap_broadcast();
}

DistributedModelParallel::~DistributedModelParallel() = default;

double DistributedModelParallel::train_step(const KeyedJaggedTensor& local_batch) {
  // Forward through each sharding; the pooled output is keyed by feature in sharding order.
  std::vector<at::Tensor> pooled;
  std::map<std::string, std::pair<int64_t, int64_t>> column_of;  // feature -> (offset, dim)
  int64_t offset = 0;
  {
    at::NoGradGuard no_grad;
    for (auto& sharding : shardings_) {
      pooled.push_back(sharding->forward(local_batch.select(sharding->input_features())));
      const auto& columns = sharding->output_columns();
      for (size_t i = 0; i < columns.features.size(); ++i) {
        column_of[columns.features[i]] = {offset, columns.dims[i]};
        offset += columns.dims[i];
      }
    }
  }
  at::Tensor keyed = at::cat(pooled, 1);
  keyed.set_requires_grad(true);
  // The dense input is regrouped by key into the model's feature order: compare by key, never
  // by column index (sharding order is not model order).
  std::vector<at::Tensor> blocks;
  for (const auto& feature : model_.features()) {
    const auto [begin, dim] = column_of.at(feature);
    blocks.push_back(keyed.narrow(1, begin, dim));
  }
  at::Tensor loss = dense_->forward(at::cat(blocks, 1)).mean();
  loss.backward();

  at::Tensor grad = keyed.grad();
  {
    at::NoGradGuard no_grad;
    int64_t column = 0;
    for (auto& sharding : shardings_) {
      const int64_t width = sharding->output_columns().total_dim();
      sharding->backward(grad.narrow(1, column, width));
      column += width;
    }
  }
  dense_dp_->step();
  return loss.item<double>();
}

std::vector<StateTensor> DistributedModelParallel::state() const {
  std::vector<StateTensor> out;
  std::vector<StateTensor> optimizer_state;
  for (const auto& sharding : shardings_) {
    const bool replicated = sharding->type() == ShardingType::kDataParallel;
    const std::string name = sharding_type_name(sharding->type());
    for (TableShard* shard : sharding->local_shards()) {
      out.push_back({table_weight_key(shard->config.name), name, replicated, shard->weight});
      for (const auto& s : shard->optimizer->state()) {
        optimizer_state.push_back({"ebc.embedding_bags." + shard->config.name + "." + s.name, name, replicated, s.tensor});
      }
    }
  }
  for (const auto& p : dense_->parameters()) out.push_back({p.name, "dense", true, p.tensor.detach()});
  for (const auto& s : dense_dp_->optimizer_state()) optimizer_state.push_back({s.name, "dense", true, s.tensor});
  out.insert(out.end(), optimizer_state.begin(), optimizer_state.end());
  return out;
}

std::map<std::string, at::Tensor> DistributedModelParallel::gather_full_weights() {
  std::map<std::string, at::Tensor> local;
  for (const auto& s : state()) local[s.name] = s.tensor;
  std::map<std::string, at::Tensor> full;
  for (const auto& config : model_.tables) {
    const std::string key = table_weight_key(config.name);
    const TablePlan& placement = plan_.of(config.name);
    const int root = placement.ranks.front();
    at::Tensor t = comm_.rank() == root ? local.at(key).clone()
                                         : at::empty({config.num_embeddings, config.embedding_dim}, at::kFloat);
    comm_.broadcast(t, root);
    full[key] = t;
  }
  for (const auto& p : dense_->parameters()) {
    at::Tensor t = p.tensor.detach().clone();
    comm_.broadcast(t, 0);
    full[p.name] = t;
  }
  return full;
}

void DistributedModelParallel::load_full_weights(const std::map<std::string, at::Tensor>& weights) {
  at::NoGradGuard no_grad;
  for (auto& sharding : shardings_) {
    for (TableShard* shard : sharding->local_shards()) {
      shard->weight.copy_(weights.at(table_weight_key(shard->config.name)));
    }
  }
  for (const auto& p : dense_->parameters()) p.tensor.copy_(weights.at(p.name));
}

}  // namespace dmpcheck::dmp
