// Fused in-backward optimizers for embedding tables, with FBGEMM's "exact" semantics: the
// gradient of each touched row is summed first, then each touched row is updated once.  Rows
// absent from the batch are not touched at all (no decay, no state change).  g is a row's
// summed gradient; D the shard's width.  Defaults are FBGEMM's: lr 0.01, eps 1e-8 (torch.optim's
// Adagrad uses 1e-10), beta1 0.9, beta2 0.999, no weight decay.
//
//   sgd              w -= lr * g                                       (no weight decay)
//   adagrad          m += g^2;  w -= lr * g / (sqrt(m) + eps)          (no weight decay)
//   rowwise_adagrad  g' = g + wd*w (l2) else g;  m_row += mean_d(g'^2);
//                    mult = lr / (sqrt(m_row) + eps);  w = c*w - mult*g
//                    c = 1 - mult*wd (l2), 1 - lr*wd (decoupled), 1 (none)
//   adam             t += 1 every step (one counter per optimizer, like FBGEMM's iter);
//                    m1 = b1*m1 + (1-b1)*g;  m2 = b2*m2 + (1-b2)*g^2  (touched rows only)
//                    w -= lr * (m1/(1-b1^t) / (sqrt(m2/(1-b2^t)) + eps) + wd*w)
//
// Source: fbgemm_gpu/codegen/genscript/optimizers.py.  FBGEMM's CPU fast path for fp32 row-wise
// Adagrad passes weight_decay=0 to its kernel; this reference follows the GPU (and the
// documented) math.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/config.h"
#include "dmp/pooling.h"

namespace dmpcheck::dmp {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

// The name and shape of one state tensor of a shard of rows x cols.
struct StateSpec {
  std::string name;
  std::vector<int64_t> sizes;
};

// One optimizer per table shard; its state has the shard's rows and lives beside it.
class FusedOptimizer {
 public:
  FusedOptimizer(const FusedOptimizerConfig& config, int64_t rows, int64_t cols);

  // One step: updates `weight` (the shard) in place for the rows in `grads` (shard-local,
  // unique).  Called once per training step even when no row was touched (Adam counts steps).
  void apply(at::Tensor& weight, const RowGradients& grads);
  // One step applied as several updates in turn, one per group of unique rows (per-occurrence
  // updates, see BehaviourProfile::deduplicate_row_gradients).
  void apply_in_turn(at::Tensor& weight, const std::vector<RowGradients>& groups);
  // State tensors with their state_dict suffix, e.g. {"momentum1", m} for Adagrad.
  std::vector<NamedTensor> state() const { return state_; }
  int64_t step() const { return step_; }
  // Resuming from a checkpoint taken after `step` steps.
  void set_step(int64_t step) { step_ = step; }
  // The table is stored in fp16 (the reference keeps fp16 values in fp32 tensors): updates are
  // rounded as FBGEMM's CPU kernels round fp16 rows (measured on fbgemm-gpu-cpu 1.9.0):
  // SGD and Adagrad add the update rounded to fp16 and round the sum, w = h(w + h(d));
  // row-wise Adagrad rounds its fp32 result, w = h(w + d), its mean square summed in order.
  void set_fp16_storage(bool fp16) { fp16_ = fp16; }

  static std::vector<StateSpec> state_specs(const FusedOptimizerConfig& config, int64_t rows, int64_t cols);
  // Bytes of state for a shard of rows x cols (what the planner balances).
  static int64_t state_bytes(const FusedOptimizerConfig& config, int64_t rows, int64_t cols);

 private:
  void update(at::Tensor& weight, const RowGradients& grads);

  FusedOptimizerConfig config_;
  std::vector<NamedTensor> state_;
  int64_t step_ = 0;
  bool fp16_ = false;
};

}  // namespace dmpcheck::dmp
