#include "dmp/embedding_bag_collection.h"

#include <set>

#include <ATen/ATen.h>

#include "common/error.h"
#include "dmp/pooling.h"

namespace dmpcheck::dmp {

at::Tensor KeyedTensor::at_key(const std::string& key) const {
  int64_t offset = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (keys[i] == key) return values.narrow(1, offset, length_per_key[i]);
    offset += length_per_key[i];
  }
  throw_error(ErrorKind::kInvalidInput,
              fmt::format("KeyedTensor has no key '{}' (keys: {})", key, fmt::join(keys, ", ")));
}

EmbeddingBagCollection::EmbeddingBagCollection(std::vector<EmbeddingBagConfig> tables) : tables_(std::move(tables)) {
  std::set<std::string> names;
  for (const auto& t : tables_) {
    std::set<std::string> features;  // a feature may feed several tables, each table once
    DMP_CHECK(names.insert(t.name).second, ErrorKind::kInvalidInput, "table '{}' appears twice", t.name);
    DMP_CHECK(t.num_embeddings > 0 && t.embedding_dim > 0 && !t.feature_names.empty(), ErrorKind::kInvalidInput,
              "table '{}': needs rows > 0, dim > 0 and a feature (got {} x {}, {} features)", t.name, t.num_embeddings,
              t.embedding_dim, t.feature_names.size());
    for (const auto& f : t.feature_names) {
      DMP_CHECK(features.insert(f).second, ErrorKind::kInvalidInput, "table '{}' lists feature '{}' twice", t.name, f);
    }
  }
}

void EmbeddingBagCollection::reset_parameters(at::Generator& generator) {
  weights_.clear();
  for (const auto& t : tables_) {
    at::Tensor w = at::empty({t.num_embeddings, t.embedding_dim}, at::kFloat);
    w.uniform_(-t.init_bound(), t.init_bound(), generator);
    weights_.push_back(w);
  }
}

const at::Tensor& EmbeddingBagCollection::weight(const std::string& name) const {
  DMP_INTERNAL_ASSERT(materialized(), "EmbeddingBagCollection::weight before reset_parameters");
  for (size_t i = 0; i < tables_.size(); ++i) {
    if (tables_[i].name == name) return weights_[i];
  }
  throw_error(ErrorKind::kInvalidInput, fmt::format("no table named '{}'", name));
}

KeyedTensor EmbeddingBagCollection::forward(const KeyedJaggedTensor& features) const {
  DMP_INTERNAL_ASSERT(materialized(), "EmbeddingBagCollection::forward before reset_parameters");
  KeyedTensor out;
  std::vector<at::Tensor> pooled;
  const std::vector<std::string> names = embedding_names(tables_);
  for (size_t i = 0; i < tables_.size(); ++i) {
    for (const auto& f : tables_[i].feature_names) {
      const size_t k = features.key_index(f);
      Bags bags{features.values_of(k), features.lengths_of(k),
                tables_[i].weighted ? features.weights_of(k) : std::nullopt};
      check_ids_in_range(bags, tables_[i].num_embeddings, tables_[i].name, f);
      pooled.push_back(pooled_forward(weights_[i], bags, tables_[i].pooling));
      out.keys.push_back(names[out.keys.size()]);
      out.length_per_key.push_back(tables_[i].embedding_dim);
    }
  }
  out.values = at::cat(pooled, 1);
  return out;
}

}  // namespace dmpcheck::dmp
