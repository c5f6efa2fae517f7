#include "dmp/optim/dense_optimizer.h"

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
    for (const auto& p : parameters) tensors.push_back(p.tensor);
    switch (config.type) {
      case DenseOptimizerType::kSgd:
        optimizer = std::make_unique<torch::optim::SGD>(
            tensors,
            torch::optim::SGDOptions(config.learning_rate).momentum(config.momentum).weight_decay(config.weight_decay));
        break;
      case DenseOptimizerType::kAdagrad:
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

  DenseOptimizerConfig config;
  std::vector<NamedTensor> parameters;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

DenseOptimizer::DenseOptimizer(const DenseOptimizerConfig& config, const std::vector<NamedTensor>& parameters)
    : impl_(std::make_unique<Impl>(config, parameters)) {}
DenseOptimizer::~DenseOptimizer() = default;

void DenseOptimizer::zero_grad() { impl_->optimizer->zero_grad(); }
void DenseOptimizer::step() { impl_->optimizer->step(); }

std::vector<NamedTensor> DenseOptimizer::state() const {
  std::vector<NamedTensor> out;
  for (const auto& p : impl_->parameters) {
    auto* state = impl_->state_of(p.tensor);
    if (state == nullptr) continue;  // no step taken yet
    switch (impl_->config.type) {
      case DenseOptimizerType::kSgd: {
        auto& s = static_cast<torch::optim::SGDParamState&>(*state);
        if (s.momentum_buffer().defined()) out.push_back({p.name + ".momentum_buffer", s.momentum_buffer()});
        break;
      }
      case DenseOptimizerType::kAdagrad: {
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
    switch (impl_->config.type) {
      case DenseOptimizerType::kSgd: {
        auto buffer = get(p.name + ".momentum_buffer");
        if (!buffer) continue;
        auto s = std::make_unique<torch::optim::SGDParamState>();
        s->momentum_buffer(*buffer);
        impl_->optimizer->state()[key] = std::move(s);
        break;
      }
      case DenseOptimizerType::kAdagrad: {
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
