// What a table is, independent of where it lives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dmpcheck::dmp {

enum class PoolingType { kSum, kMean };

struct EmbeddingBagConfig {
  std::string name;
  int64_t num_embeddings = 0;  // rows
  int64_t embedding_dim = 0;
  std::vector<std::string> feature_names;
  PoolingType pooling = PoolingType::kSum;
  bool weighted = false;  // its features carry per-id weights (TorchRec's weighted EBC)
  // The table's storage type as TorchRec's config names it: "fp32", "fp16" or "bf16".  The
  // reference DMP models fp32 only; release cells run the others (torchrec.DataType).
  std::string data_type = "fp32";
  // A sequence table (`pooling: none`): TorchRec keeps it in an EmbeddingCollection, which
  // returns each id's row, not a bag's pooled sum.  dmpcheck's model sums each bag's rows before
  // the dense layers, so the reference computes it as a sum-pooled table (`pooling` is kSum):
  // the same numbers, gradients and updates.
  bool sequence = false;

  // TorchRec's default init_fn: uniform in [-sqrt(1/rows), sqrt(1/rows)].
  double init_bound() const;
  int64_t bytes() const { return num_embeddings * embedding_dim * 4; }  // fp32
};

const char* pooling_name(PoolingType pooling);
// An fp16 table's storage as the reference models it: fp32 tensors holding only values an fp16
// can (FBGEMM's CPU kernels read fp16 rows into fp32, accumulate in fp32 and round each updated
// row back to fp16, to nearest).  Rounds `weight` in place when the table is fp16; else nothing.
void round_to_storage(const EmbeddingBagConfig& table, at::Tensor& weight);
// "sum", "mean", or "none" for a sequence table.
const char* pooling_name(const EmbeddingBagConfig& table);

// The state_dict key of a table's weight in the unsharded model.
std::string table_weight_key(const std::string& table);
// The features the tables read, each once, in first-appearance order (a batch's keys).
std::vector<std::string> unique_features(const std::vector<EmbeddingBagConfig>& tables);
// The name of each (table, feature) lookup, in table order, as TorchRec's EBC keys its output:
// the feature's name, or "<feature>@<table>" for a feature several tables read.
std::vector<std::string> embedding_names(const std::vector<EmbeddingBagConfig>& tables);

// The names of a forward's outputs, compared across systems: the EBC's pooled embedding of a
// feature ([batch, dim], as `ebc(kjt)[feature]`) and the model's output ([batch, last layer]).
std::string pooled_output_key(const std::string& feature);
inline constexpr const char* kModelOutputKey = "model_output";

}  // namespace dmpcheck::dmp
