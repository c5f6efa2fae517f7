// The dense part of the model: an MLP over the pooled embeddings (Linear layers with ReLU
// between them, none after the last), initialised as torch.nn.Linear is (uniform in
// +-1/sqrt(fan_in) for weight and bias) from the generator it is given.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "dmp/optim/fused_optimizer.h"

namespace dmpcheck::dmp {

class DenseMlp {
 public:
  DenseMlp(int64_t in_features, const std::vector<int64_t>& layer_sizes, at::Generator& generator);

  // Records autograd: parameters require grad.
  at::Tensor forward(const at::Tensor& input) const;
  // "dense.<layer>.weight" / "dense.<layer>.bias", in layer order.
  const std::vector<NamedTensor>& parameters() const { return parameters_; }
  std::vector<at::Tensor> parameter_tensors() const;

 private:
  std::vector<NamedTensor> parameters_;
};

}  // namespace dmpcheck::dmp
