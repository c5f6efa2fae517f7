#include "dmp/dense.h"

#include <cmath>

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::dmp {

DenseMlp::DenseMlp(int64_t in_features, const std::vector<int64_t>& layer_sizes, at::Generator& generator) {
  DMP_CHECK(!layer_sizes.empty(), ErrorKind::kInvalidScenario, "the dense MLP needs at least one layer");
  int64_t fan_in = in_features;
  for (size_t i = 0; i < layer_sizes.size(); ++i) {
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    at::Tensor weight = at::empty({layer_sizes[i], fan_in}, at::kFloat);
    weight.uniform_(-bound, bound, generator);
    at::Tensor bias = at::empty({layer_sizes[i]}, at::kFloat);
    bias.uniform_(-bound, bound, generator);
    weight.set_requires_grad(true);
    bias.set_requires_grad(true);
    parameters_.push_back({fmt::format("dense.{}.weight", i), weight});
    parameters_.push_back({fmt::format("dense.{}.bias", i), bias});
    fan_in = layer_sizes[i];
  }
}

at::Tensor DenseMlp::forward(const at::Tensor& input) const {
  at::Tensor x = input;
  for (size_t i = 0; i < parameters_.size(); i += 2) {
    x = at::linear(x, parameters_[i].tensor, parameters_[i + 1].tensor);
    if (i + 2 < parameters_.size()) x = at::relu(x);
  }
  return x;
}

std::vector<at::Tensor> DenseMlp::parameter_tensors() const {
  std::vector<at::Tensor> out;
  for (const auto& p : parameters_) out.push_back(p.tensor);
  return out;
}

}  // namespace dmpcheck::dmp
