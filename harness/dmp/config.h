// What a model and its optimizers are, as plain values: the configuration a scenario, a planner
// input or a report names, without the tensors or the communicators that run it (no libtorch).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/names.h"

namespace dmpcheck::dmp {

enum class PoolingType { kSum, kMean };

// A table's storage type, as TorchRec's config names it (torchrec.DataType).
enum class DataType { kFp32, kFp16, kBf16 };
inline constexpr Named<DataType> kDataTypeNames[] = {
    {DataType::kFp32, "fp32"}, {DataType::kFp16, "fp16"}, {DataType::kBf16, "bf16"}};
inline const char* data_type_name(DataType type) { return name_in(kDataTypeNames, type); }

struct EmbeddingBagConfig {
  std::string name;
  int64_t num_embeddings = 0;  // rows
  int64_t embedding_dim = 0;
  std::vector<std::string> feature_names;
  PoolingType pooling = PoolingType::kSum;
  bool weighted = false;  // its features carry per-id weights (TorchRec's weighted EBC)
  // The table's storage type.  The reference DMP models fp32, and fp16 where a sharded table
  // keeps its weights in half precision; release cells run them all.
  DataType data_type = DataType::kFp32;
  // A sequence table (`pooling: none`): TorchRec keeps it in an EmbeddingCollection, which
  // returns each id's row, not a bag's pooled sum.  dmpcheck's model sums each bag's rows before
  // the dense layers, so the reference computes it as a sum-pooled table (`pooling` is kSum):
  // the same numbers, gradients and updates.
  bool sequence = false;

  // TorchRec's default init_fn: uniform in [-sqrt(1/rows), sqrt(1/rows)].
  double init_bound() const;
};

struct ModelConfig {
  std::vector<EmbeddingBagConfig> tables;
  std::vector<int64_t> dense_layers;                 // output sizes; the input is the pooled width
  std::vector<std::string> features() const;         // a batch's keys: each feature once
  std::vector<std::string> embedding_names() const;  // each lookup's output name, in order
  int64_t pooled_width() const;
};

enum class FusedOptimizerType { kSgd, kAdagrad, kRowWiseAdagrad, kAdam };
inline constexpr Named<FusedOptimizerType> kFusedOptimizerNames[] = {
    {FusedOptimizerType::kSgd, "sgd"},
    {FusedOptimizerType::kAdagrad, "adagrad"},
    {FusedOptimizerType::kRowWiseAdagrad, "rowwise_adagrad"},
    {FusedOptimizerType::kAdam, "adam"}};
enum class WeightDecayMode { kNone, kL2, kDecoupled };
inline constexpr Named<WeightDecayMode> kWeightDecayModeNames[] = {
    {WeightDecayMode::kNone, "none"}, {WeightDecayMode::kL2, "l2"}, {WeightDecayMode::kDecoupled, "decoupled"}};

struct FusedOptimizerConfig {
  FusedOptimizerType type = FusedOptimizerType::kSgd;
  double learning_rate = 0.01;
  double eps = 1e-8;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double weight_decay = 0.0;
  WeightDecayMode weight_decay_mode = WeightDecayMode::kNone;
};

const char* fused_optimizer_name(FusedOptimizerType type);
const char* weight_decay_mode_name(WeightDecayMode mode);

// kRowWiseAdagrad: torchrec.optim.RowWiseAdagrad over the 2-D parameters (data-parallel tables,
// Linear weights: one accumulator per row), torch.optim.Adagrad over the 1-D ones (biases), which
// RowWiseAdagrad cannot take.
enum class DenseOptimizerType { kSgd, kAdagrad, kAdam, kRowWiseAdagrad };
inline constexpr Named<DenseOptimizerType> kDenseOptimizerNames[] = {
    {DenseOptimizerType::kSgd, "sgd"},
    {DenseOptimizerType::kAdagrad, "adagrad"},
    {DenseOptimizerType::kAdam, "adam"},
    {DenseOptimizerType::kRowWiseAdagrad, "rowwise_adagrad"}};

struct DenseOptimizerConfig {
  DenseOptimizerType type = DenseOptimizerType::kSgd;
  double learning_rate = 0.01;
  double momentum = 0.0;  // SGD
  double eps = 1e-8;      // Adam's default; torch.optim.Adagrad's is 1e-10
  double beta1 = 0.9;     // Adam
  double beta2 = 0.999;   // Adam
  double weight_decay = 0.0;
  // kRowWiseAdagrad as torchrec.optim.RowWiseAdagrad had it before 0.8.0 (PR #2015): each row's
  // mean gradient, squared into the accumulator and applied to every element of the row (the
  // behaviour profile's dense_rowwise_adagrad_mean_gradient sets it).
  bool rowwise_mean_gradient = false;
};

const char* dense_optimizer_name(DenseOptimizerType type);

}  // namespace dmpcheck::dmp
