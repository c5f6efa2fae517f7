// Fused in-backward optimizers for embedding tables, with FBGEMM's "exact" semantics: the
// gradient of each touched row is summed first, then each touched row is updated once.  Rows
// absent from the batch are not touched at all (no decay, no state change).
//
//   SGD      (EXACT_SGD):      w -= lr * g
//   Adagrad  (EXACT_ADAGRAD):  m += g * g;  w -= lr * g / (sqrt(m) + eps)      eps default 1e-8
//
// FBGEMM's eps default (1e-8) differs from torch.optim.Adagrad's (1e-10); a scenario names it.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/pooling.h"

namespace dmpcheck::dmp {

enum class FusedOptimizerType { kSgd, kAdagrad };

struct FusedOptimizerConfig {
  FusedOptimizerType type = FusedOptimizerType::kSgd;
  double learning_rate = 0.01;  // FBGEMM's default
  double eps = 1e-8;            // FBGEMM's default
};

const char* fused_optimizer_name(FusedOptimizerType type);

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// One optimizer per table shard; its state has the shard's shape and lives beside it.
class FusedOptimizer {
 public:
  FusedOptimizer(const FusedOptimizerConfig& config, int64_t rows, int64_t dim);

  // Updates `weight` (the shard) in place; grads.rows are rows of the shard.
  void apply(at::Tensor& weight, const RowGradients& grads);
  // State tensors with their state_dict suffix, e.g. {"momentum1", m} for Adagrad.
  std::vector<NamedTensor> state() const;
  const FusedOptimizerConfig& config() const { return config_; }

 private:
  FusedOptimizerConfig config_;
  at::Tensor momentum1_;  // Adagrad's sum of squared gradients
};

}  // namespace dmpcheck::dmp
