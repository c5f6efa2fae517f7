// What a table is, independent of where it lives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dmp/config.h"

namespace dmpcheck::dmp {

const char* pooling_name(PoolingType pooling);
// An fp16 table's storage as the reference models it: fp32 tensors holding only values an fp16
// can (FBGEMM's CPU kernels read fp16 rows into fp32, accumulate in fp32 and round each updated
// row back to fp16, to nearest).  Rounds `weight` in place when the table is fp16; else nothing.
void round_to_storage(const EmbeddingBagConfig& table, at::Tensor& weight);
// "sum", "mean", or "none" for a sequence table.
const char* pooling_name(const EmbeddingBagConfig& table);

// The state_dict keys of a table's weight and of its optimizer state `state` in the unsharded model.
std::string table_weight_key(const std::string& table);
std::string table_state_key(const std::string& table, const std::string& state);
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
