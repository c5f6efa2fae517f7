// The dense parameters' optimizer: libtorch's own torch::optim (SGD, Adagrad, Adam), so dense
// math is exactly PyTorch's.  The torch/optim headers stay inside dense_optimizer.cc.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/config.h"
#include "dmp/optim/fused_optimizer.h"

namespace dmpcheck::dmp {

class DenseOptimizer {
 public:
  DenseOptimizer(const DenseOptimizerConfig& config, const std::vector<NamedTensor>& parameters);
  ~DenseOptimizer();
  DenseOptimizer(const DenseOptimizer&) = delete;
  DenseOptimizer& operator=(const DenseOptimizer&) = delete;

  void zero_grad();
  void step();
  // State per parameter, named "<param>.<state>" (exp_avg, exp_avg_sq, sum, momentum_buffer).
  std::vector<NamedTensor> state() const;
  // Installs state named as state() names it, as if `steps` steps had been taken (resuming
  // from a checkpoint).  Parameters without state in `state` are left without.
  void load_state(const std::map<std::string, at::Tensor>& state, int64_t steps);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dmpcheck::dmp
