#include "dmp/optim/fused_optimizer.h"

#include <cmath>

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::dmp {

const char* fused_optimizer_name(FusedOptimizerType type) {
  switch (type) {
    case FusedOptimizerType::kSgd: return "sgd";
    case FusedOptimizerType::kAdagrad: return "adagrad";
    case FusedOptimizerType::kRowWiseAdagrad: return "rowwise_adagrad";
    case FusedOptimizerType::kAdam: return "adam";
  }
  return "unknown";
}

std::vector<std::string> fused_optimizer_names() { return {"sgd", "adagrad", "rowwise_adagrad", "adam"}; }

const char* weight_decay_mode_name(WeightDecayMode mode) {
  switch (mode) {
    case WeightDecayMode::kNone: return "none";
    case WeightDecayMode::kL2: return "l2";
    case WeightDecayMode::kDecoupled: return "decoupled";
  }
  return "unknown";
}

std::vector<StateSpec> FusedOptimizer::state_specs(const FusedOptimizerConfig& config, int64_t rows, int64_t cols) {
  switch (config.type) {
    case FusedOptimizerType::kSgd: return {};
    case FusedOptimizerType::kAdagrad: return {{"momentum1", {rows, cols}}};
    case FusedOptimizerType::kRowWiseAdagrad: return {{"momentum1", {rows}}};
    case FusedOptimizerType::kAdam: return {{"exp_avg", {rows, cols}}, {"exp_avg_sq", {rows, cols}}};
  }
  return {};
}

int64_t FusedOptimizer::state_bytes(const FusedOptimizerConfig& config, int64_t rows, int64_t cols) {
  int64_t bytes = 0;
  for (const auto& spec : state_specs(config, rows, cols)) {
    int64_t n = 4;
    for (int64_t s : spec.sizes) n *= s;
    bytes += n;
  }
  return bytes;
}

FusedOptimizer::FusedOptimizer(const FusedOptimizerConfig& config, int64_t rows, int64_t cols) : config_(config) {
  for (const auto& spec : state_specs(config, rows, cols)) state_.push_back({spec.name, at::zeros(spec.sizes, at::kFloat)});
}

void FusedOptimizer::apply(at::Tensor& weight, const RowGradients& grads) {
  ++step_;
  update(weight, grads);
}

void FusedOptimizer::apply_in_turn(at::Tensor& weight, const std::vector<RowGradients>& groups) {
  ++step_;
  for (const auto& g : groups) update(weight, g);
}

void FusedOptimizer::update(at::Tensor& weight, const RowGradients& grads) {
  if (grads.rows.numel() == 0) return;
  DMP_INTERNAL_ASSERT(grads.grads.size(0) == grads.rows.numel(), "one gradient per row");
  const at::Tensor& rows = grads.rows;
  const at::Tensor& g = grads.grads;
  const at::Tensor w = weight.index_select(0, rows);
  const double lr = config_.learning_rate;
  const double eps = config_.eps;
  const double wd = config_.weight_decay;
  switch (config_.type) {
    case FusedOptimizerType::kSgd:
      weight.index_copy_(0, rows, w - lr * g);
      return;
    case FusedOptimizerType::kAdagrad: {
      at::Tensor& momentum = state_[0].tensor;
      const at::Tensor m = momentum.index_select(0, rows) + g * g;
      momentum.index_copy_(0, rows, m);
      weight.index_copy_(0, rows, w - lr * g / (m.sqrt() + eps));
      return;
    }
    case FusedOptimizerType::kRowWiseAdagrad: {
      at::Tensor& momentum = state_[0].tensor;
      const bool l2 = config_.weight_decay_mode == WeightDecayMode::kL2;
      const at::Tensor decayed = l2 ? g + wd * w : g;
      const at::Tensor m = momentum.index_select(0, rows) + (decayed * decayed).mean(1);
      momentum.index_copy_(0, rows, m);
      const at::Tensor mult = (lr / (m.sqrt() + eps)).unsqueeze(1);
      at::Tensor corrected = w;
      if (l2) corrected = w * (1.0 - mult * wd);
      if (config_.weight_decay_mode == WeightDecayMode::kDecoupled) corrected = w * (1.0 - lr * wd);
      weight.index_copy_(0, rows, corrected - mult * g);
      return;
    }
    case FusedOptimizerType::kAdam: {
      at::Tensor& exp_avg = state_[0].tensor;
      at::Tensor& exp_avg_sq = state_[1].tensor;
      const double b1 = config_.beta1, b2 = config_.beta2;
      const at::Tensor m1 = exp_avg.index_select(0, rows) * b1 + g * (1.0 - b1);
      const at::Tensor m2 = exp_avg_sq.index_select(0, rows) * b2 + g * g * (1.0 - b2);
      exp_avg.index_copy_(0, rows, m1);
      exp_avg_sq.index_copy_(0, rows, m2);
      const double c1 = 1.0 - std::pow(b1, static_cast<double>(step_));
      const double c2 = 1.0 - std::pow(b2, static_cast<double>(step_));
      weight.index_copy_(0, rows, w - lr * ((m1 / c1) / ((m2 / c2).sqrt() + eps) + wd * w));
      return;
    }
  }
}

std::vector<NamedTensor> FusedOptimizer::state() const { return state_; }

}  // namespace dmpcheck::dmp
