#include "check/unsharded_model.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "common/error.h"

namespace dmpcheck::check {
namespace {

at::Tensor leaf(const at::Tensor& t) {
  at::Tensor out = t.detach().clone().to(at::kFloat);
  out.set_requires_grad(true);
  return out;
}

}  // namespace

UnshardedModel::UnshardedModel(const dmp::ModelConfig& model, const dmp::FusedOptimizerConfig& sparse,
                               const dmp::DenseOptimizerConfig& dense, const std::map<std::string, at::Tensor>& state,
                               int64_t steps_done)
    : model_(model), sparse_(sparse), dense_(dense), steps_(steps_done) {
  auto get = [&](const std::string& key) -> const at::Tensor& {
    auto it = state.find(key);
    DMP_CHECK(it != state.end(), ErrorKind::kInternal, "the unsharded model needs '{}' from the sharded model's state",
              key);
    return it->second;
  };
  auto optional_state = [&](const std::string& key, const std::vector<int64_t>& sizes) {
    auto it = state.find(key);
    if (it == state.end()) return at::zeros(sizes, at::kFloat);
    at::Tensor t = it->second.detach().clone().to(at::kFloat);
    // A row-wise state of a column-sharded table is a block of rows per shard; the unsharded table has one.
    if (sizes.size() == 1 && t.dim() == 1 && t.size(0) > sizes[0]) t = t.narrow(0, 0, sizes[0]).contiguous();
    if (sizes.size() == 1 && t.dim() == 2) t = t.select(1, 0).contiguous();
    return t;
  };
  for (const auto& config : model_.tables) {
    Table table{config, leaf(get(dmp::table_weight_key(config.name))), {}};
    // The fused optimizer's state, named and shaped as FBGEMM's.
    for (const auto& s : dmp::FusedOptimizer::state_specs(sparse_, config.num_embeddings, config.embedding_dim))
      table.state[s.name] = optional_state(dmp::table_state_key(config.name, s.name), s.sizes);
    tables_.push_back(std::move(table));
  }
  for (size_t i = 0; i < model_.dense_layers.size(); ++i) {
    for (const char* what : {"weight", "bias"}) {
      Parameter p{fmt::format("dense.{}.{}", i, what), leaf(get(fmt::format("dense.{}.{}", i, what))), {}};
      for (const char* s : {"momentum_buffer", "sum", "exp_avg", "exp_avg_sq"}) {
        auto it = state.find(p.name + "." + s);
        if (it != state.end()) p.state[s] = it->second.detach().clone().to(at::kFloat);
      }
      layers_.push_back(std::move(p));
    }
  }
}

at::Tensor UnshardedModel::forward_impl(const dmp::KeyedJaggedTensor& batch, std::vector<at::Tensor>* touched) {
  std::vector<at::Tensor> pooled;
  last_outputs_.clear();
  const std::vector<std::string> names = dmp::embedding_names(model_.tables);
  for (const auto& table : tables_) {
    std::vector<at::Tensor> ids;
    for (const auto& feature : table.config.feature_names) {
      const size_t k = batch.key_index(feature);
      const at::Tensor values = batch.values_of(k).to(at::kLong);
      const at::Tensor lengths = batch.lengths_of(k).to(at::kLong);
      at::Tensor offsets = at::zeros({lengths.numel()}, at::kLong);
      if (lengths.numel() > 1)
        offsets.narrow(0, 1, lengths.numel() - 1).copy_(lengths.cumsum(0).narrow(0, 0, lengths.numel() - 1));
      at::Tensor per_sample;
      if (table.config.weighted && batch.weights_of(k)) per_sample = batch.weights_of(k)->to(at::kFloat);
      const int64_t mode = table.config.pooling == dmp::PoolingType::kMean ? 1 : 0;
      pooled.push_back(
          std::get<0>(at::embedding_bag(table.weight, values, offsets, false, mode, false, per_sample, false)));
      last_outputs_[dmp::pooled_output_key(names[pooled.size() - 1])] = pooled.back().detach().clone();
      ids.push_back(values);
    }
    if (touched) touched->push_back(std::get<0>(at::_unique(at::cat(ids), /*sorted=*/true)));
  }
  at::Tensor x = at::cat(pooled, 1);
  for (size_t i = 0; i < layers_.size(); i += 2) {
    x = at::linear(x, layers_[i].tensor, layers_[i + 1].tensor);
    if (i + 2 < layers_.size()) x = at::relu(x);
  }
  last_outputs_[dmp::kModelOutputKey] = x.detach().clone();
  return x;
}

std::map<std::string, at::Tensor> UnshardedModel::forward(const dmp::KeyedJaggedTensor& batch) {
  at::NoGradGuard no_grad;
  forward_impl(batch, nullptr);
  return last_outputs_;
}

double UnshardedModel::train_step(const dmp::KeyedJaggedTensor& batch) {
  at::AutoGradMode grad_mode(true);
  ++steps_;
  std::vector<at::Tensor> touched;  // per table, the rows the batch reads
  at::Tensor loss = forward_impl(batch, &touched).mean();
  loss.backward();

  at::NoGradGuard no_grad;
  for (size_t t = 0; t < tables_.size(); ++t) sparse_step(tables_[t], touched[t]);
  for (auto& p : layers_) dense_step(p);
  for (auto& t : tables_) t.weight.mutable_grad().reset();
  for (auto& p : layers_) p.tensor.mutable_grad().reset();
  return loss.item<double>();
}

// The sparse optimizers' formulas (dmp/optim/fused_optimizer.h gives them too), on the touched rows.
void UnshardedModel::sparse_step(Table& table, const at::Tensor& rows) {
  if (rows.numel() == 0 || !table.weight.grad().defined()) return;
  const at::Tensor g = table.weight.grad().index_select(0, rows);
  const at::Tensor w = table.weight.detach().index_select(0, rows);
  const double lr = sparse_.learning_rate, eps = sparse_.eps, wd = sparse_.weight_decay;
  at::Tensor updated;
  // An fp16 table's SGD and Adagrad add their step rounded to fp16, then round the sum (FBGEMM's
  // CPU kernels); the other optimizers' results are rounded once, below.
  const bool fp16 = table.config.data_type == dmp::DataType::kFp16;
  auto plus_fp16_step = [&](const at::Tensor& step) {
    return (w + step.to(at::kHalf).to(at::kFloat)).to(at::kHalf).to(at::kFloat);
  };
  switch (sparse_.type) {
    case dmp::FusedOptimizerType::kSgd: updated = fp16 ? plus_fp16_step(-lr * g) : w - lr * g; break;
    case dmp::FusedOptimizerType::kAdagrad: {
      at::Tensor& sum = table.state["momentum1"];
      const at::Tensor m = sum.index_select(0, rows) + g * g;
      sum.index_copy_(0, rows, m);
      updated = fp16 ? plus_fp16_step(-lr * g / (m.sqrt() + eps)) : w - lr * g / (m.sqrt() + eps);
      break;
    }
    case dmp::FusedOptimizerType::kRowWiseAdagrad: {
      const bool l2 = sparse_.weight_decay_mode == dmp::WeightDecayMode::kL2;
      const bool decoupled = sparse_.weight_decay_mode == dmp::WeightDecayMode::kDecoupled;
      const at::Tensor decayed = l2 ? g + wd * w : g;
      at::Tensor& sum = table.state["momentum1"];
      const at::Tensor m = sum.index_select(0, rows) + (decayed * decayed).mean(1);
      sum.index_copy_(0, rows, m);
      const at::Tensor multiplier = (lr / (m.sqrt() + eps)).unsqueeze(1);
      updated = (decoupled ? (1.0 - lr * wd) * w : w) - multiplier * decayed;
      break;
    }
    case dmp::FusedOptimizerType::kAdam: {
      at::Tensor& m1 = table.state["exp_avg"];
      at::Tensor& m2 = table.state["exp_avg_sq"];
      // FBGEMM's Adam takes its betas as floats: 1 - beta is 1 - float(beta) (for beta2 0.999,
      // 1.3e-5 away from 0.001 in relative terms, beyond the check's tolerance over a few steps).
      const double b1 = static_cast<float>(sparse_.beta1), b2 = static_cast<float>(sparse_.beta2);
      const at::Tensor a = b1 * m1.index_select(0, rows) + (1.0 - b1) * g;
      const at::Tensor s = b2 * m2.index_select(0, rows) + (1.0 - b2) * g * g;
      m1.index_copy_(0, rows, a);
      m2.index_copy_(0, rows, s);
      const double c1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
      const double c2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
      updated = w - lr * ((a / c1) / ((s / c2).sqrt() + eps) + wd * w);
      break;
    }
  }
  table.weight.detach().index_copy_(0, rows, updated);
  at::Tensor stored = table.weight.detach();
  dmp::round_to_storage(table.config, stored);  // an fp16 table keeps fp16 values
}

// torch.optim's SGD, Adagrad and Adam (defaults: no dampening, no Nesterov, no lr decay, no amsgrad).
void UnshardedModel::dense_step(Parameter& p) {
  at::Tensor grad = p.tensor.grad();
  if (!grad.defined()) grad = at::zeros_like(p.tensor);
  at::Tensor w = p.tensor.detach();
  const double lr = dense_.learning_rate, eps = dense_.eps, wd = dense_.weight_decay;
  if (wd != 0) grad = grad + wd * w;
  switch (dense_.type) {
    case dmp::DenseOptimizerType::kSgd:
      if (dense_.momentum != 0) {
        auto it = p.state.find("momentum_buffer");
        at::Tensor buffer = it == p.state.end() ? grad.clone() : it->second * dense_.momentum + grad;
        p.state["momentum_buffer"] = buffer;
        grad = buffer;
      }
      w.sub_(lr * grad);
      break;
    case dmp::DenseOptimizerType::kRowWiseAdagrad:
      if (w.dim() == 2) {  // torchrec.optim.RowWiseAdagrad: one accumulator per row (a bias: Adagrad, below)
        auto it = p.state.find("sum");
        at::Tensor sum = it == p.state.end() ? at::zeros({w.size(0), 1}, w.options()) : it->second;
        const at::Tensor step = dense_.rowwise_mean_gradient ? grad.mean(1).view({-1, 1}) : grad;
        sum = sum + (dense_.rowwise_mean_gradient ? step * step : grad.pow(2).mean(1).view({-1, 1}));
        p.state["sum"] = sum;
        w.sub_(lr * step / (sum.sqrt() + eps));
        break;
      }
      [[fallthrough]];
    case dmp::DenseOptimizerType::kAdagrad: {
      auto it = p.state.find("sum");
      at::Tensor sum = (it == p.state.end() ? at::zeros_like(w) : it->second) + grad * grad;
      p.state["sum"] = sum;
      w.sub_(lr * grad / (sum.sqrt() + eps));
      break;
    }
    case dmp::DenseOptimizerType::kAdam: {
      auto m_it = p.state.find("exp_avg");
      auto v_it = p.state.find("exp_avg_sq");
      const double b1 = dense_.beta1, b2 = dense_.beta2;
      at::Tensor m = b1 * (m_it == p.state.end() ? at::zeros_like(w) : m_it->second) + (1.0 - b1) * grad;
      at::Tensor v = b2 * (v_it == p.state.end() ? at::zeros_like(w) : v_it->second) + (1.0 - b2) * grad * grad;
      p.state["exp_avg"] = m;
      p.state["exp_avg_sq"] = v;
      const double c1 = 1.0 - std::pow(b1, static_cast<double>(steps_));
      const double c2 = 1.0 - std::pow(b2, static_cast<double>(steps_));
      w.sub_((lr / c1) * m / (v.sqrt() / std::sqrt(c2) + eps));
      break;
    }
  }
}

std::map<std::string, at::Tensor> UnshardedModel::state() const {
  std::map<std::string, at::Tensor> out;
  for (const auto& t : tables_) {
    out[dmp::table_weight_key(t.config.name)] = t.weight.detach();
    for (const auto& [name, tensor] : t.state) out[dmp::table_state_key(t.config.name, name)] = tensor;
  }
  for (const auto& p : layers_) {
    out[p.name] = p.tensor.detach();
    for (const auto& [name, tensor] : p.state) out[p.name + "." + name] = tensor;
  }
  return out;
}

}  // namespace dmpcheck::check
