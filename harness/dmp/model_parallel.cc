#include "dmp/model_parallel.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "comm/broadcast_bytes.h"
#include "comm/communicator.h"
#include "common/error.h"
#include "dmp/embedding_bag_collection.h"
#include "dmp/sharding/data_parallel.h"
#include "dmp/sharding/model_parallel.h"

namespace dmpcheck::dmp {
namespace {

// This rank's table shards drawn as TorchRec draws them (measured against torchrec 0.6.0 and
// 1.9.2 under torchrun: every local shard, data-parallel replica and dense weight bitwise equal,
// and the generator left at the same position).  The dense layers have drawn before this.
//  1. Building the kernels draws values that are then thrown away, so only how far they move
//     the generator matters: per sharding type in order of its first table, a uniform_ per local
//     shard; data-parallel tables (the dense kernel) draw one randn over each pooling group's
//     elements and then a uniform_ per table.  randn's draw count depends on how its calls are
//     grouped (a tail that is not a multiple of 16 is drawn again), so the grouping is TorchRec's.
//  2. reset_parameters then draws the values that stay: per table in model order, each local
//     shard on its own, uniform in +-sqrt(1/rows of the full table).  Every rank draws its own
//     data-parallel replicas; whether rank 0's replace them is the profile's broadcast switch.
// So equal seeds on every rank give equal data-parallel replicas only when every rank's earlier
// draws were the same size: what torchrec 0.6.0 does without the #1739 broadcast.
std::map<std::string, std::vector<at::Tensor>> draw_local_tables(const ModelConfig& model, const ShardingPlan& plan,
                                                                 int rank, at::Generator& generator) {
  auto uniform = [&](int64_t rows, int64_t cols, const EmbeddingBagConfig& t) {
    at::Tensor w = at::empty({rows, cols}, at::kFloat);
    w.uniform_(-t.init_bound(), t.init_bound(), generator);
    round_to_storage(t, w);  // an fp16 table: the fp32 draw, rounded to fp16
    return w;
  };
  // TorchRec's modules in model order: the EmbeddingBagCollection, then the EmbeddingCollection
  // of the sequence tables; DMP builds and resets each module before the next.
  std::vector<std::vector<const EmbeddingBagConfig*>> modules(2);
  for (const auto& t : model.tables) modules[t.sequence ? 1 : 0].push_back(&t);
  std::map<std::string, std::vector<at::Tensor>> kept;
  for (const auto& tables : modules) {
    std::vector<ShardingType> type_order;
    for (const auto* t : tables) {
      const ShardingType type = plan.of(t->name).type;
      if (std::find(type_order.begin(), type_order.end(), type) == type_order.end()) type_order.push_back(type);
    }
    for (const ShardingType type : type_order) {
      if (type != ShardingType::kDataParallel) {
        for (const auto* t : tables) {
          if (plan.of(t->name).type != type) continue;
          for (const Shard& shard : plan.of(t->name).shards) {
            if (shard.rank == rank) uniform(shard.rows, shard.cols, *t);
          }
        }
        continue;
      }
      std::vector<std::pair<PoolingType, std::vector<const EmbeddingBagConfig*>>> groups;
      for (const auto* t : tables) {
        if (plan.of(t->name).type != type) continue;
        auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == t->pooling; });
        if (group == groups.end()) group = groups.insert(groups.end(), {t->pooling, {}});
        group->second.push_back(t);
      }
      for (const auto& [pooling, members] : groups) {
        int64_t elements = 0;
        for (const auto* t : members) elements += t->num_embeddings * t->embedding_dim;
        if (elements > 0) at::randn({elements}, generator);
        for (const auto* t : members) uniform(t->num_embeddings, t->embedding_dim, *t);
      }
    }
    // reset_parameters of this module's tables.
    for (const auto* t : tables) {
      auto& pieces = kept[t->name];
      for (const Shard& shard : plan.of(t->name).shards) {
        if (shard.rank == rank) pieces.push_back(uniform(shard.rows, shard.cols, *t));
      }
    }
  }
  return kept;
}

}  // namespace

std::vector<std::string> ModelConfig::features() const { return unique_features(tables); }
std::vector<std::string> ModelConfig::embedding_names() const { return dmp::embedding_names(tables); }

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
  auto row_split = [&](const std::string& table) {
    const ShardingType type = plan_.of(table).type;
    return type == ShardingType::kRowWise || type == ShardingType::kTableRowWise;
  };
  // Profiles under which a row-sharded table cannot run on Gloo (CPU), failing as the release did.
  if (comm_.backend_name() == "gloo") {
    for (const auto& t : plan_.tables) {
      if (!row_split(t.table)) continue;
      DMP_CHECK(
          options_.profile.row_wise_offered_on_cpu, ErrorKind::kInvalidInput,
          "table '{}' is {}: RuntimeError: No available sharding type and compute kernel combination after applying "
          "user provided constraints for {} (profile {}: the EBC sharder offers data_parallel, table_wise, "
          "column_wise and table_column_wise on cpu)",
          t.table, sharding_type_name(t.type), t.table, options_.profile.name);
      DMP_CHECK(!options_.profile.row_wise_fails_on_gloo, ErrorKind::kInvalidInput,
                "table '{}' is {}: RuntimeError: Gloo reduce_scatter_base fallback not supported with async_op=True "
                "(profile {}: its row-wise output is reduce-scattered asynchronously, which Gloo refuses)",
                t.table, sharding_type_name(t.type), options_.profile.name);
    }
  }
  // The user's model: dense layers are created (and drawn) first; the tables stay unmaterialised
  // (TorchRec's meta device) until DMP draws this rank's shards.
  dense_ = std::make_unique<DenseMlp>(model_.pooled_width(), model_.dense_layers, generator);
  EmbeddingBagCollection collection(model_.tables);  // validates the tables
  auto drawn = draw_local_tables(model_, plan_, comm_.rank(), generator);

  const bool dense_trains_dp = options_.profile.data_parallel_tables_use_dense_optimizer;
  std::vector<TableShard> data_parallel, model_parallel;
  std::vector<EmbeddingBagConfig> mp_tables;
  std::vector<TablePlan> mp_plans;
  for (const auto& config : model_.tables) {
    const TablePlan& placement = plan_.of(config.name);
    size_t piece = 0;
    for (const Shard& shard : placement.shards) {
      if (shard.rank != comm_.rank()) continue;
      const bool fused = placement.type != ShardingType::kDataParallel || !dense_trains_dp;
      TableShard local{
          config, placement.type, shard, drawn.at(config.name).at(piece++),
          fused ? std::make_unique<FusedOptimizer>(options_.sparse_optimizer, shard.rows, shard.cols) : nullptr};
      if (local.optimizer) local.optimizer->set_fp16_storage(config.data_type == DataType::kFp16);
      (placement.type == ShardingType::kDataParallel ? data_parallel : model_parallel).push_back(std::move(local));
    }
    if (placement.type != ShardingType::kDataParallel) {
      mp_tables.push_back(config);
      mp_plans.push_back(placement);
    }
  }

  // The fix for TorchRec #1739: data-parallel replicas start from rank 0's draw.
  if (options_.profile.broadcast_data_parallel_tables_at_init && !data_parallel.empty()) {
    std::vector<at::Tensor> weights;
    for (const auto& shard : data_parallel) weights.push_back(shard.weight);
    const int64_t cap = options_.profile.init_broadcast_bucket_cap_bytes;
    init_broadcast_ = {true, comm::broadcast_coalesced(comm_, weights, {0, cap}), cap};
  }

  // Weights the dense optimizer also steps: data-parallel tables when TorchRec's behaviour is on.
  std::vector<NamedTensor> dense_trained_tables;
  if (dense_trains_dp && options_.profile.update_data_parallel_tables) {
    for (const auto& shard : data_parallel)
      dense_trained_tables.push_back({table_weight_key(shard.config.name), shard.weight});
  }
  const DataParallelUpdate update = !options_.profile.update_data_parallel_tables ? DataParallelUpdate::kNone
                                    : dense_trains_dp                             ? DataParallelUpdate::kDenseOptimizer
                                                                                  : DataParallelUpdate::kFusedOptimizer;
  if (!data_parallel.empty())
    shardings_.push_back(std::make_unique<DataParallelSharding>(comm_, std::move(data_parallel), update));
  if (!mp_tables.empty()) {
    shardings_.push_back(std::make_unique<ModelParallelSharding>(comm_, mp_tables, mp_plans, std::move(model_parallel),
                                                                 options_.profile));
  }
  // Two groups, in first-appearance order of their kind in the model, as TorchRec groups by type.
  if (shardings_.size() == 2 && plan_.of(model_.tables.front().name).type != ShardingType::kDataParallel)
    std::swap(shardings_[0], shardings_[1]);

  // Which lookups TorchRec's mean-pooling callback also divides (see the profile switch).
  const bool row_split_mean = std::any_of(model_.tables.begin(), model_.tables.end(), [&](const EmbeddingBagConfig& t) {
    return row_split(t.name) && t.pooling == PoolingType::kMean;
  });
  embedding_names_ = model_.embedding_names();
  for (const auto& t : model_.tables) {
    divided_by_length_.insert(
        divided_by_length_.end(), t.feature_names.size(),
        options_.profile.row_wise_mean_divides_other_features && row_split_mean && !row_split(t.name));
  }

  DenseDataParallelOptions dense_options;
  dense_options.broadcast_at_wrap = options_.profile.broadcast_dense_at_wrap;
  dense_options.first_bucket_cap_bytes = options_.profile.ddp_first_bucket_cap_bytes;
  DenseOptimizerConfig dense_optimizer = options_.dense_optimizer;
  dense_optimizer.rowwise_mean_gradient = options_.profile.dense_rowwise_adagrad_mean_gradient;
  dense_dp_ = std::make_unique<DenseDataParallel>(comm_, *dense_, dense_optimizer, dense_options,
                                                  std::move(dense_trained_tables));
}

at::Tensor DistributedModelParallel::sharded_forward(const KeyedJaggedTensor& local_batch) {
  // Forward through each sharding; the pooled output is keyed by feature in sharding order.
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> pooled;
  column_of_.clear();
  int64_t offset = 0;
  for (auto& sharding : shardings_) {
    pooled.push_back(sharding->forward(local_batch.select(sharding->input_features())));
    const auto& columns = sharding->output_columns();
    for (size_t i = 0; i < columns.features.size(); ++i) {
      column_of_[columns.features[i]] = {offset, columns.dims[i]};
      offset += columns.dims[i];
    }
  }
  return at::cat(pooled, 1);
}

at::Tensor DistributedModelParallel::in_model_order(const at::Tensor& keyed, const KeyedJaggedTensor& local_batch) {
  // The dense input is regrouped by key into the model's feature order: compare by key, never
  // by column index (sharding order is not model order).
  // Columns are keyed "<feature>@<table>" inside the shardings; outputs take TorchRec's names.
  std::vector<at::Tensor> blocks;
  last_outputs_.clear();
  size_t lookup = 0;
  for (const auto& table : model_.tables) {
    for (const auto& feature : table.feature_names) {
      const auto [begin, dim] = column_of_.at(feature + "@" + table.name);
      blocks.push_back(keyed.narrow(1, begin, dim));
      if (divided_by_length_[lookup]) {
        // TorchRec's divisor: the bag's length (its weights' sum when weighted) + eps, in float.
        const size_t k = local_batch.key_index(feature);
        at::Tensor length = local_batch.lengths_of(k).to(at::kFloat);
        if (const auto w = local_batch.weights_of(k)) {
          length =
              at::zeros({local_batch.stride()}, at::kFloat)
                  .index_add_(
                      0, at::repeat_interleave(at::arange(local_batch.stride(), at::kLong), local_batch.lengths_of(k)),
                      *w);
        }
        blocks.back() =
            blocks.back() / (length + static_cast<float>(options_.profile.row_wise_mean_divisor_eps)).unsqueeze(1);
      }
      last_outputs_[pooled_output_key(embedding_names_[lookup++])] = blocks.back().detach().clone();
    }
  }
  return at::cat(blocks, 1);
}

void DistributedModelParallel::forward(const KeyedJaggedTensor& local_batch) {
  const at::Tensor keyed = sharded_forward(local_batch);
  at::NoGradGuard no_grad;
  last_outputs_[kModelOutputKey] = dense_->forward(in_model_order(keyed, local_batch)).detach().clone();
}

double DistributedModelParallel::train_step(const KeyedJaggedTensor& local_batch) {
  at::Tensor keyed = sharded_forward(local_batch);
  keyed.set_requires_grad(true);
  const at::Tensor output = dense_->forward(in_model_order(keyed, local_batch));
  last_outputs_[kModelOutputKey] = output.detach().clone();
  at::Tensor loss = output.mean();
  loss.backward();

  const at::Tensor& grad = keyed.grad();
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
    for (TableShard* shard : sharding->local_shards()) {
      const std::string type = sharding_type_name(shard->type);
      const int64_t rows = shard->config.num_embeddings;
      const int64_t dim = shard->config.embedding_dim;
      const int64_t column_shards = shard->placement.cols == 0 ? 1 : dim / shard->placement.cols;
      out.push_back({table_weight_key(shard->config.name),
                     type,
                     sharding->replicated(),
                     shard->weight,
                     shard->placement,
                     {rows, dim}});
      if (!shard->optimizer) continue;  // a data-parallel table the dense optimizer trains
      for (const auto& s : shard->optimizer->state()) {
        std::vector<int64_t> full =
            s.tensor.dim() == 2 ? std::vector<int64_t>{rows, dim} : std::vector<int64_t>{column_shards * rows};
        optimizer_state.push_back({table_state_key(shard->config.name, s.name), type, sharding->replicated(), s.tensor,
                                   shard->placement, full});
      }
    }
  }
  auto whole = [](const at::Tensor& t) {  // Shard{rank, row_offset, rows, col_offset, cols, bytes}: all of t
    return Shard{0, 0, t.dim() > 0 ? t.size(0) : 1, 0, t.dim() > 1 ? t.size(1) : 1, 0};
  };
  for (const auto& p : dense_->parameters()) {
    out.push_back({p.name, "dense", true, p.tensor.detach(), whole(p.tensor), p.tensor.sizes().vec()});
  }
  for (const auto& s : dense_dp_->optimizer_state()) {
    // The dense optimizer's state of a data-parallel table it trains is "ebc.embedding_bags.<table>.weight.<state>".
    const bool of_table = s.name.rfind("ebc.embedding_bags.", 0) == 0;
    optimizer_state.push_back(
        {s.name, of_table ? "data_parallel" : "dense", true, s.tensor, whole(s.tensor), s.tensor.sizes().vec()});
  }
  out.insert(out.end(), optimizer_state.begin(), optimizer_state.end());
  return out;
}

std::map<std::string, at::Tensor> DistributedModelParallel::gather_full_state() {
  at::NoGradGuard no_grad;
  // Local pieces by (name, row offset, column offset).
  std::map<std::tuple<std::string, int64_t, int64_t>, at::Tensor> local;
  for (const auto& s : state()) local[{s.name, s.placement.row_offset, s.placement.col_offset}] = s.tensor;

  std::map<std::string, at::Tensor> full;
  for (const auto& config : model_.tables) {
    const TablePlan& placement = plan_.of(config.name);
    const int64_t rows = config.num_embeddings;
    const int64_t dim = config.embedding_dim;
    int64_t column_shards = 1;
    if (placement.type == ShardingType::kColumnWise) {
      std::set<int64_t> offsets;
      for (const auto& shard : placement.shards) offsets.insert(shard.col_offset);
      column_shards = static_cast<int64_t>(offsets.size());
    }
    struct Spec {
      std::string name;
      std::vector<int64_t> sizes;
      bool row_state;
    };
    std::vector<Spec> specs = {{"weight", {rows, dim}, false}};
    const bool fused =
        placement.type != ShardingType::kDataParallel || !options_.profile.data_parallel_tables_use_dense_optimizer;
    for (const auto& spec :
         fused ? FusedOptimizer::state_specs(options_.sparse_optimizer, rows, dim) : std::vector<StateSpec>{}) {
      const bool row_state = spec.sizes.size() == 1;
      specs.push_back({spec.name, row_state ? std::vector<int64_t>{column_shards * rows} : spec.sizes, row_state});
    }
    // A data_parallel table is whole on rank 0; other types are assembled from every shard.
    std::vector<Shard> sources = placement.shards;
    if (placement.type == ShardingType::kDataParallel) sources = {placement.shards.front()};
    for (const auto& spec : specs) {
      const std::string key = table_state_key(config.name, spec.name);
      at::Tensor whole = at::zeros(spec.sizes, at::kFloat);
      for (const Shard& shard : sources) {
        if (shard.rows == 0 || shard.cols == 0) continue;  // an empty row_wise shard
        at::Tensor target = piece_of(whole, shard, spec.row_state);
        at::Tensor piece = shard.rank == comm_.rank() ? local.at({key, shard.row_offset, shard.col_offset}).clone()
                                                      : at::empty(target.sizes(), at::kFloat);
        comm_.broadcast(piece, shard.rank);
        target.copy_(piece.view(target.sizes()));
      }
      full[key] = whole;
    }
  }
  for (const auto& s : state()) {
    // Replicated tensors not assembled above (dense layers, the dense optimizer's state) are rank 0's.
    if (!s.replicated || full.count(s.name) != 0) continue;
    at::Tensor t = s.tensor.detach().clone();
    comm_.broadcast(t, 0);
    full[s.name] = t;
  }
  return full;
}

void DistributedModelParallel::load_full_state(const std::map<std::string, at::Tensor>& state_map) {
  at::NoGradGuard no_grad;
  for (const auto& s : state()) {
    auto it = state_map.find(s.name);
    if (it == state_map.end()) continue;
    at::Tensor full = it->second;
    const at::Tensor source = s.sharding == "dense" ? full : piece_of(full, s.placement, s.tensor.dim() == 1);
    DMP_CHECK_EQ(source.sizes(), s.tensor.sizes(), ErrorKind::kInvalidInput,
                 "cannot load '{}': the checkpoint's piece and this rank's differ in shape", s.name);
    s.tensor.copy_(source);
  }
}

bool DistributedModelParallel::take_weights_loaded_before_wrap(const std::map<std::string, at::Tensor>& state,
                                                               int64_t steps) {
  if (options_.profile.wrap_keeps_weights_loaded_before_it) {
    resume(state, steps);
    return true;
  }
  // The tables are built anew and drawn by the sharding; the dense layers are not resharded, so
  // the user's dense weights stay (and the DDP-like wrapper holds rank 0's, the same file's).
  std::map<std::string, at::Tensor> dense;
  for (const auto& [name, t] : state) {
    if (name.rfind("dense.", 0) == 0) dense[name] = t;
  }
  load_full_state(dense);
  return false;
}

void DistributedModelParallel::resume(const std::map<std::string, at::Tensor>& state_map, int64_t steps) {
  load_full_state(state_map);
  for (auto& sharding : shardings_) {
    for (TableShard* shard : sharding->local_shards()) {
      if (shard->optimizer) shard->optimizer->set_step(steps);
    }
  }
  dense_dp_->load_optimizer_state(state_map, steps);
}

ShardingPlan collective_plan(comm::Communicator& comm, PlannerInput input, const BehaviourProfile& profile) {
  ShardingPlan plan;
  if (profile.plan_on_every_rank) {
    input.tie_break_rank = comm.rank();
    plan = plan_sharding(input, profile);
  } else {
    const std::string text = comm.rank() == 0 ? plan_sharding(input, profile).serialize() : std::string();
    plan = ShardingPlan::deserialize(comm::broadcast_bytes(comm, text, 0));
  }
  const std::string held = plan.serialize();
  const int differs = comm::first_rank_disagreeing(comm, held);
  DMP_CHECK(differs < 0, ErrorKind::kCommunication,
            "rank {} holds a different sharding plan from rank 0; rank {} has:\n{}", differs, comm.rank(), held);
  return plan;
}

void check_same_sharding(const ShardingPlan& saved, const ShardingPlan& now, const BehaviourProfile& profile) {
  if (!profile.load_requires_same_sharding) return;
  for (const auto& t : now.tables) {
    const auto before =
        std::find_if(saved.tables.begin(), saved.tables.end(), [&](const TablePlan& s) { return s.table == t.table; });
    if (before == saved.tables.end() || before->type == t.type) continue;
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("cannot load table '{}': the checkpoint holds it {} ({}), the model now shards it {} "
                            "('Tensor' object has no attribute 'local_shards', TorchRec #1497)",
                            t.table, sharding_type_name(before->type),
                            before->type == ShardingType::kDataParallel ? "a plain tensor" : "a sharded tensor",
                            sharding_type_name(t.type)));
  }
}

std::unique_ptr<DistributedModelParallel> reshard(comm::Communicator& comm, DistributedModelParallel& old,
                                                  const ModelConfig& model, const ShardingPlan& plan,
                                                  at::Generator& generator, const DmpOptions& options, int64_t steps) {
  std::map<std::string, at::Tensor> state = old.gather_full_state();
  if (options.profile.data_parallel_state_keys_differ) {
    // torch.optim names for data-parallel tables' state: "<table>.weight.<state>".
    for (const auto& t : old.plan().tables) {
      if (t.type != ShardingType::kDataParallel) continue;
      for (const auto& s : FusedOptimizer::state_specs(options.sparse_optimizer, 1, 1)) {
        auto node = state.extract(table_state_key(t.table, s.name));
        if (node.empty()) continue;
        node.key() = table_state_key(t.table, "weight." + s.name);
        state.insert(std::move(node));
      }
    }
  }
  check_same_sharding(old.plan(), plan, options.profile);
  auto resharded = std::make_unique<DistributedModelParallel>(comm, model, plan, generator, options);
  resharded->resume(state, steps);
  return resharded;
}

at::Tensor piece_of(at::Tensor& full, const Shard& placement, bool row_state) {
  if (!row_state)
    return full.narrow(0, placement.row_offset, placement.rows).narrow(1, placement.col_offset, placement.cols);
  const int64_t column_shard = placement.cols > 0 ? placement.col_offset / placement.cols : 0;
  if (full.dim() == 2) return full.narrow(0, placement.row_offset, placement.rows).select(1, column_shard);
  return full.narrow(0, column_shard * placement.rows + placement.row_offset, placement.rows);
}

}  // namespace dmpcheck::dmp
