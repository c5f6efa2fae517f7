#include "dmp/optim/dense_optimizer.h"

#include <algorithm>
#include <map>
#include <optional>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include "common/error.h"

namespace dmpcheck::dmp {

const char* dense_optimizer_name(DenseOptimizerType type) { return name_in(kDenseOptimizerNames, type); }

class DenseOptimizer::Impl {
 public:
  Impl(const DenseOptimizerConfig& config, const std::vector<NamedTensor>& parameters)
      : config(config), parameters(parameters) {
    std::vector<at::Tensor> tensors;
    for (const auto& p : parameters) {
      // rowwise_adagrad: the 2-D parameters are torchrec.optim.RowWiseAdagrad's (rows_ below),
      // the rest torch.optim.Adagrad's.
      if (config.type == DenseOptimizerType::kRowWiseAdagrad && p.tensor.dim() == 2) rows.push_back(p.tensor);
      else tensors.push_back(p.tensor);
    }
    // Its accumulators exist from the start, zero, as RowWiseAdagrad's constructor makes them.
    for (const auto& p : rows) row_sums[p.unsafeGetTensorImpl()] = at::zeros({p.size(0), 1}, p.options());
    DMP_CHECK(!(config.type == DenseOptimizerType::kRowWiseAdagrad && config.rowwise_mean_gradient &&
                config.weight_decay != 0),
              ErrorKind::kInvalidInput,
              "optimizers.dense: rowwise_adagrad with weight_decay under a profile with "
              "dense_rowwise_adagrad_mean_gradient: TorchRec's RowWiseAdagrad before 0.8.0 cannot apply weight decay "
              "(it adds the decay to its row gradient, which becomes the whole gradient: on 0.6.0 its step fails with "
              "\"output with shape [rows, 1] doesn't match the broadcast shape [rows, dim]\", measured)");
    switch (config.type) {
      case DenseOptimizerType::kSgd:
        optimizer = std::make_unique<torch::optim::SGD>(
            tensors,
            torch::optim::SGDOptions(config.learning_rate).momentum(config.momentum).weight_decay(config.weight_decay));
        break;
      case DenseOptimizerType::kAdagrad:
      case DenseOptimizerType::kRowWiseAdagrad:
        optimizer = std::make_unique<torch::optim::Adagrad>(
            tensors,
            torch::optim::AdagradOptions(config.learning_rate).eps(config.eps).weight_decay(config.weight_decay));
        break;
      case DenseOptimizerType::kAdam:
        optimizer = std::make_unique<torch::optim::Adam>(tensors, torch::optim::AdamOptions(config.learning_rate)
                                                                      .betas({config.beta1, config.beta2})
                                                                      .eps(config.eps)
                                                                      .weight_decay(config.weight_decay));
        break;
    }
  }

  // torch::optim keys its state by the parameter's TensorImpl address (as text in libtorch 1.x).
  static auto state_key(const at::Tensor& p) {
#if TORCH_VERSION_MAJOR >= 2
    return static_cast<void*>(p.unsafeGetTensorImpl());
#else
    return c10::guts::to_string(p.unsafeGetTensorImpl());
#endif
  }

  torch::optim::OptimizerParamState* state_of(const at::Tensor& p) const {
    auto it = optimizer->state().find(state_key(p));
    return it == optimizer->state().end() ? nullptr : it->second.get();
  }

  // torchrec.optim.RowWiseAdagrad's step over the 2-D parameters, op for op (1.9.2's
  // rowwise_adagrad.py; before 0.8.0 each row's mean gradient, PR #2015).
  void rowwise_step() {
    at::NoGradGuard no_grad;
    for (const auto& p : rows) {
      if (!p.grad().defined()) continue;
      at::Tensor grad = p.grad();
      if (config.weight_decay != 0) grad = grad.add(p, config.weight_decay);
      at::Tensor& sum = row_sums.at(p.unsafeGetTensorImpl());
      if (config.rowwise_mean_gradient) {
        const at::Tensor row_grad = grad.mean(1).view({-1, 1});
        sum.addcmul_(row_grad, row_grad, 1);
        p.addcdiv_(row_grad, sum.sqrt().add_(config.eps), -config.learning_rate);
      } else {
        sum.add_(grad.pow(2).mean(1).view({-1, 1}));
        p.addcdiv_(grad, sum.sqrt().add_(config.eps), -config.learning_rate);
      }
    }
  }

  DenseOptimizerConfig config;
  std::vector<NamedTensor> parameters;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::vector<at::Tensor> rows;                // rowwise_adagrad's 2-D parameters
  std::map<const void*, at::Tensor> row_sums;  // their accumulators, [rows, 1]
};

DenseOptimizer::DenseOptimizer(const DenseOptimizerConfig& config, const std::vector<NamedTensor>& parameters)
    : impl_(std::make_unique<Impl>(config, parameters)) {}
DenseOptimizer::~DenseOptimizer() = default;

void DenseOptimizer::zero_grad() {
  impl_->optimizer->zero_grad();
  for (auto& p : impl_->rows) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();  // as torch.optim's zero_grad(set_to_none=True)
  }
}

void DenseOptimizer::step() {
  impl_->optimizer->step();
  impl_->rowwise_step();
}

std::vector<NamedTensor> DenseOptimizer::state() const {
  std::vector<NamedTensor> out;
  for (const auto& p : impl_->parameters) {
    auto row = impl_->row_sums.find(p.tensor.unsafeGetTensorImpl());
    if (row != impl_->row_sums.end()) {
      out.push_back({p.name + ".sum", row->second});
      continue;
    }
    auto* state = impl_->state_of(p.tensor);
    if (state == nullptr) continue;  // no step taken yet
    switch (impl_->config.type) {
      case DenseOptimizerType::kSgd: {
        auto& s = static_cast<torch::optim::SGDParamState&>(*state);
        if (s.momentum_buffer().defined()) out.push_back({p.name + ".momentum_buffer", s.momentum_buffer()});
        break;
      }
      case DenseOptimizerType::kAdagrad:
      case DenseOptimizerType::kRowWiseAdagrad: {
        auto& s = static_cast<torch::optim::AdagradParamState&>(*state);
        out.push_back({p.name + ".sum", s.sum()});
        break;
      }
      case DenseOptimizerType::kAdam: {
        auto& s = static_cast<torch::optim::AdamParamState&>(*state);
        out.push_back({p.name + ".exp_avg", s.exp_avg()});
        out.push_back({p.name + ".exp_avg_sq", s.exp_avg_sq()});
        break;
      }
    }
  }
  return out;
}

void DenseOptimizer::load_state(const std::map<std::string, at::Tensor>& state, int64_t steps) {
  auto get = [&](const std::string& key) -> std::optional<at::Tensor> {
    auto it = state.find(key);
    if (it == state.end()) return std::nullopt;
    return it->second.clone();
  };
  for (const auto& p : impl_->parameters) {
    const auto key = Impl::state_key(p.tensor);
    if (std::any_of(impl_->rows.begin(), impl_->rows.end(), [&](const at::Tensor& t) { return t.is_same(p.tensor); })) {
      if (auto sum = get(p.name + ".sum")) impl_->row_sums[p.tensor.unsafeGetTensorImpl()] = *sum;
      continue;
    }
    switch (impl_->config.type) {
      case DenseOptimizerType::kSgd: {
        auto buffer = get(p.name + ".momentum_buffer");
        if (!buffer) continue;
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(*buffer);
        impl_->optimizer->state()[key] = std::move(s);
        break;
      }
      case DenseOptimizerType::kAdagrad:
      case DenseOptimizerType::kRowWiseAdagrad: {
        auto sum = get(p.name + ".sum");
        if (!sum) continue;
        auto s = std::make_unique<torch::optim::AdagradParamState>();
        s->sum(*sum);
        s->step(steps);
        impl_->optimizer->state()[key] = std::move(s);
        break;
      }
      case DenseOptimizerType::kAdam: {
        auto exp_avg = get(p.name + ".exp_avg");
        auto exp_avg_sq = get(p.name + ".exp_avg_sq");
        if (!exp_avg || !exp_avg_sq) continue;
        auto s = std::make_unique<torch::optim::AdamParamState>();
        s->exp_avg(*exp_avg);
        s->exp_avg_sq(*exp_avg_sq);
        s->step(steps);
        impl_->optimizer->state()[key] = std::move(s);
        break;
      }
    }
  }
}

}  // namespace dmpcheck::dmp
