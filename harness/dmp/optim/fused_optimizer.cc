#include "dmp/optim/fused_optimizer.h"

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::dmp {

const char* fused_optimizer_name(FusedOptimizerType type) {
  switch (type) {
    case FusedOptimizerType::kSgd: return "sgd";
    case FusedOptimizerType::kAdagrad: return "adagrad";
  }
  return "unknown";
}

FusedOptimizer::FusedOptimizer(const FusedOptimizerConfig& config, int64_t rows, int64_t dim)
    : config_(config) {
  if (config_.type == FusedOptimizerType::kAdagrad) momentum1_ = at::zeros({rows, dim}, at::kFloat);
}

void FusedOptimizer::apply(at::Tensor& weight, const RowGradients& grads) {
  if (grads.rows.numel() == 0) return;
  DMP_INTERNAL_ASSERT(grads.grads.size(0) == grads.rows.numel(), "one gradient per row");
  const at::Tensor& g = grads.grads;
  const at::Tensor w = weight.index_select(0, grads.rows);
  switch (config_.type) {
    case FusedOptimizerType::kSgd: {
      weight.index_copy_(0, grads.rows, w - config_.learning_rate * g);
      return;
    }
    case FusedOptimizerType::kAdagrad: {
      const at::Tensor m = momentum1_.index_select(0, grads.rows) + g * g;
      momentum1_.index_copy_(0, grads.rows, m);
      weight.index_copy_(0, grads.rows, w - config_.learning_rate * g / (m.sqrt() + config_.eps));
      return;
    }
  }
}

std::vector<NamedTensor> FusedOptimizer::state() const {
  if (config_.type == FusedOptimizerType::kAdagrad) return {{"momentum1", momentum1_}};
  return {};
}

}  // namespace dmpcheck::dmp
