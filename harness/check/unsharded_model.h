// The oracle of the global-model check: the model a user means, written independently of the
// reference DMP.  Plain libtorch with autograd -- at::embedding_bag for the tables, at::linear
// and ReLU for the MLP, the loss as the mean of the output over the global batch -- and every
// optimizer written out from its formula with whole-tensor ATen operations.  It shares no code
// with dmp/ beyond the configuration structs, so a bug in the DMP's pooling, gradients or
// optimizer kernels shows as a difference instead of being repeated on both sides.
//
// What the user asked for, not what a TorchRec release does: every table is trained by the
// sparse optimizer (exact: each row the batch touched is updated once, from its summed
// gradient; other rows and their state are left alone), the dense layers by the dense one with
// torch.optim's semantics.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/model_parallel.h"

namespace dmpcheck::check {

class UnshardedModel {
 public:
  // The weights and optimizer state come from `state` (full tensors named as the DMP's
  // gather_full_state() names them), as after `steps_done` steps.
  UnshardedModel(const dmp::ModelConfig& model, const dmp::FusedOptimizerConfig& sparse,
                 const dmp::DenseOptimizerConfig& dense, const std::map<std::string, at::Tensor>& state,
                 int64_t steps_done);

  // One training step on the global batch; returns the loss.  Its forward's outputs are kept
  // (last_outputs).
  double train_step(const dmp::KeyedJaggedTensor& global_batch);
  // The forward alone: pooled embeddings per feature and the model's output, named
  // dmp::pooled_output_key(feature) and dmp::kModelOutputKey.
  std::map<std::string, at::Tensor> forward(const dmp::KeyedJaggedTensor& global_batch);
  const std::map<std::string, at::Tensor>& last_outputs() const { return last_outputs_; }
  // Every tensor, named as the DMP names it.
  std::map<std::string, at::Tensor> state() const;

 private:
  struct Table {
    dmp::EmbeddingBagConfig config;
    at::Tensor weight;                        // [rows, dim], requires grad
    std::map<std::string, at::Tensor> state;  // momentum1 / exp_avg / exp_avg_sq
  };
  struct Parameter {
    std::string name;
    at::Tensor tensor;                        // requires grad
    std::map<std::string, at::Tensor> state;  // momentum_buffer / sum / exp_avg / exp_avg_sq
  };

  // The forward with autograd as the mode allows; fills last_outputs_ and the rows each table read.
  at::Tensor forward_impl(const dmp::KeyedJaggedTensor& batch, std::vector<at::Tensor>* touched);
  void sparse_step(Table& table, const at::Tensor& touched_rows);
  void dense_step(Parameter& p);

  dmp::ModelConfig model_;
  dmp::FusedOptimizerConfig sparse_;
  dmp::DenseOptimizerConfig dense_;
  std::vector<Table> tables_;
  std::vector<Parameter> layers_;  // weight, bias, weight, bias, ...
  int64_t steps_ = 0;
  std::map<std::string, at::Tensor> last_outputs_;
};

}  // namespace dmpcheck::check
