#include "dmp/embedding_config.h"

#include <cmath>

namespace dmpcheck::dmp {

double EmbeddingBagConfig::init_bound() const { return std::sqrt(1.0 / static_cast<double>(num_embeddings)); }

const char* pooling_name(PoolingType pooling) { return pooling == PoolingType::kSum ? "sum" : "mean"; }

std::string table_weight_key(const std::string& table) { return "ebc.embedding_bags." + table + ".weight"; }
std::string pooled_output_key(const std::string& feature) { return "pooled_embeddings." + feature; }

}  // namespace dmpcheck::dmp
