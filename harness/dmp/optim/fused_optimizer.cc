#include "dmp/optim/fused_optimizer.h"

#include <cmath>
#include <functional>
#include <numeric>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/error.h"
#include "dmp/optim/fused_kernels.h"

namespace dmpcheck::dmp {

const char* fused_optimizer_name(FusedOptimizerType type) { return name_in(kFusedOptimizerNames, type); }
const char* weight_decay_mode_name(WeightDecayMode mode) { return name_in(kWeightDecayModeNames, mode); }

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
  for (const auto& spec : state_specs(config, rows, cols))
    bytes += 4 * std::accumulate(spec.sizes.begin(), spec.sizes.end(), int64_t{1}, std::multiplies<>());
  return bytes;
}

FusedOptimizer::FusedOptimizer(const FusedOptimizerConfig& config, int64_t rows, int64_t cols) : config_(config) {
  for (const auto& spec : state_specs(config, rows, cols))
    state_.push_back({spec.name, at::zeros(spec.sizes, at::kFloat)});
}

void FusedOptimizer::apply(at::Tensor& weight, const RowGradients& grads) {
  ++step_;
  update(weight, grads);
}

void FusedOptimizer::apply_in_turn(at::Tensor& weight, const std::vector<RowGradients>& groups) {
  ++step_;
  for (const auto& g : groups) update(weight, g);
}

// Rows per parallel chunk: each row is `dim` floats of independent work.
constexpr int64_t kRowGrain = 256;

// The element-wise optimizers run as one pass over each touched row, as FBGEMM's fused kernels
// do, with FBGEMM's arithmetic (fused_kernels.cc; learning rate and eps rounded to float first,
// as FBGEMM receives them).  Rows are unique (the exact optimizers' contract), so rows can be
// updated in parallel.
void FusedOptimizer::update(at::Tensor& weight, const RowGradients& grads) {
  if (grads.rows.numel() == 0) return;
  DMP_INTERNAL_ASSERT(grads.grads.size(0) == grads.rows.numel(), "one gradient per row");
  DMP_INTERNAL_ASSERT(weight.is_contiguous() && weight.scalar_type() == at::kFloat && weight.dim() == 2,
                      "fused optimizers update contiguous 2-d float tables");
  const at::Tensor rows = grads.rows.contiguous();
  const at::Tensor g = grads.grads.contiguous();
  const int64_t n = rows.numel();
  const int64_t dim = weight.size(1);
  float* w = weight.data_ptr<float>();
  const float* gp = g.data_ptr<float>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const float lr = static_cast<float>(config_.learning_rate);
  const float eps = static_cast<float>(config_.eps);
  const float wd = static_cast<float>(config_.weight_decay);
  switch (config_.type) {
    case FusedOptimizerType::kSgd:
      at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
        (fp16_ ? kernels::sgd_rows_fp16 : kernels::sgd_rows)(w, gp, rp, begin, end, dim, lr);
      });
      return;
    case FusedOptimizerType::kAdagrad: {
      float* m = state_[0].tensor.data_ptr<float>();
      at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
        (fp16_ ? kernels::adagrad_rows_fp16 : kernels::adagrad_rows)(w, m, gp, rp, begin, end, dim, lr, eps);
      });
      return;
    }
    case FusedOptimizerType::kRowWiseAdagrad: {
      // Each row's mean square in FBGEMM's summation order; everything after it is one pass per row.
      const bool l2 = config_.weight_decay_mode == WeightDecayMode::kL2;
      const at::Tensor decayed = (l2 ? g + config_.weight_decay * weight.index_select(0, rows) : g).contiguous();
      at::Tensor mean_square = at::empty({n}, at::kFloat);
      const float* dp = decayed.data_ptr<float>();
      float* msp = mean_square.data_ptr<float>();
      const auto mean_square_of = fp16_ ? kernels::sequential_mean_square : kernels::fbgemm_mean_square;
      for (int64_t i = 0; i < n; ++i) msp[i] = mean_square_of(dp + i * dim, dim);
      float* m = state_[0].tensor.data_ptr<float>();
      const int mode = l2 ? 1 : config_.weight_decay_mode == WeightDecayMode::kDecoupled ? 2 : 0;
      const float decoupled = static_cast<float>(1.0 - config_.learning_rate * config_.weight_decay);
      at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
        kernels::rowwise_adagrad_rows(w, m, gp, rp, begin, end, dim, msp, lr, eps, wd, mode, decoupled);
      });
      return;
    }
    case FusedOptimizerType::kAdam: {
      float* m1 = state_[0].tensor.data_ptr<float>();
      float* m2 = state_[1].tensor.data_ptr<float>();
      const double b1 = config_.beta1, b2 = config_.beta2;
      kernels::AdamScalars scalars;
      scalars.lr = lr;
      scalars.eps = eps;
      scalars.weight_decay = wd;
      scalars.beta1 = static_cast<float>(b1);
      scalars.beta2 = static_cast<float>(b2);
      // FBGEMM receives the betas as floats and subtracts from 1 in float (not 1 - beta in double,
      // which differs in (1 - beta2) by 1.3e-5 relative for beta2 = 0.999).
      scalars.one_minus_beta1 = 1.0f - scalars.beta1;
      scalars.one_minus_beta2 = 1.0f - scalars.beta2;
      scalars.bias_correction1 = static_cast<float>(1.0 - std::pow(b1, static_cast<double>(step_)));
      scalars.bias_correction2 = static_cast<float>(1.0 - std::pow(b2, static_cast<double>(step_)));
      at::parallel_for(0, n, kRowGrain, [&](int64_t begin, int64_t end) {
        kernels::adam_rows(w, m1, m2, gp, rp, begin, end, dim, scalars);
      });
      return;
    }
  }
}

}  // namespace dmpcheck::dmp
