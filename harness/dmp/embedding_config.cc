#include "dmp/embedding_config.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>

#include <cmath>

namespace dmpcheck::dmp {

double EmbeddingBagConfig::init_bound() const { return std::sqrt(1.0 / static_cast<double>(num_embeddings)); }

const char* pooling_name(PoolingType pooling) { return pooling == PoolingType::kSum ? "sum" : "mean"; }
void round_to_storage(const EmbeddingBagConfig& table, at::Tensor& weight) {
  if (table.data_type != DataType::kFp16) return;
  at::NoGradGuard no_grad;
  weight.copy_(weight.to(at::kHalf).to(at::kFloat));
}

const char* pooling_name(const EmbeddingBagConfig& table) {
  return table.sequence ? "none" : pooling_name(table.pooling);
}

std::string table_weight_key(const std::string& table) { return table_state_key(table, "weight"); }
std::string table_state_key(const std::string& table, const std::string& state) {
  return "ebc.embedding_bags." + table + "." + state;
}
std::string pooled_output_key(const std::string& feature) { return "pooled_embeddings." + feature; }

std::vector<std::string> unique_features(const std::vector<EmbeddingBagConfig>& tables) {
  std::vector<std::string> out;
  for (const auto& t : tables) {
    for (const auto& f : t.feature_names) {
      if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
    }
  }
  return out;
}

std::vector<std::string> embedding_names(const std::vector<EmbeddingBagConfig>& tables) {
  std::map<std::string, int> readers;
  for (const auto& t : tables) {
    for (const auto& f : t.feature_names) ++readers[f];
  }
  std::vector<std::string> out;
  for (const auto& t : tables) {
    for (const auto& f : t.feature_names) out.push_back(readers[f] > 1 ? f + "@" + t.name : f);
  }
  return out;
}

}  // namespace dmpcheck::dmp
