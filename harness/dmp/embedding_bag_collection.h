// EmbeddingBagCollection: the unsharded module a user writes, as in TorchRec.  Constructed
// without weights (TorchRec builds it on the "meta" device); reset_parameters() draws every
// table in order from a generator with TorchRec's default init.  DistributedModelParallel takes
// one and shards it by a plan.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include "dmp/embedding_config.h"
#include "dmp/keyed_jagged_tensor.h"

namespace dmpcheck::dmp {

// Pooled embeddings keyed by feature: values [batch, sum(length_per_key)], key k's columns are
// the k-th block.
struct KeyedTensor {
  std::vector<std::string> keys;
  std::vector<int64_t> length_per_key;
  at::Tensor values;

  // Column block of `key`; Error(kInvalidInput) when absent.
  at::Tensor at_key(const std::string& key) const;
};

class EmbeddingBagCollection {
 public:
  // Error(kInvalidInput) for duplicate table names, a feature a table lists twice, or a table
  // with no rows, no columns or no feature.
  explicit EmbeddingBagCollection(std::vector<EmbeddingBagConfig> tables);

  bool materialized() const { return !weights_.empty(); }

  // Draws every table, in order, uniform in [-sqrt(1/rows), sqrt(1/rows)].
  void reset_parameters(at::Generator& generator);
  // The weight of table `name` (after reset_parameters).
  const at::Tensor& weight(const std::string& name) const;
  // Unsharded pooled lookup.  Checks every id against its table's rows.
  KeyedTensor forward(const KeyedJaggedTensor& features) const;

 private:
  std::vector<EmbeddingBagConfig> tables_;
  std::vector<at::Tensor> weights_;  // same order as tables_
};

}  // namespace dmpcheck::dmp
