#include "run/data_generator.h"

#include <algorithm>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace dmpcheck::run {

dmp::KeyedJaggedTensor make_global_batch(const scenario::RunSpec& spec, int step) {
  // splitmix-style mixing keeps nearby (seed, step) pairs far apart.
  uint64_t seed = spec.data.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1;
  seed ^= seed >> 31;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t bags = spec.batch_size * spec.world_size;
  std::vector<std::string> keys;
  std::vector<at::Tensor> lengths, values, weights;
  const auto& weighted = spec.data.weighted_features;
  for (const auto& table : spec.model.tables) {
    for (const auto& feature : table.feature_names) {
      const auto [lo, hi] = spec.data.ids_per_bag(feature);
      at::Tensor len = lo == hi ? at::full({bags}, lo, at::kLong) : at::randint(lo, hi + 1, {bags}, generator, at::kLong);
      const int64_t n = len.sum().item<int64_t>();
      keys.push_back(feature);
      lengths.push_back(len);
      values.push_back(at::randint(0, table.num_embeddings, {n}, generator, at::kLong));
      // Per-id weights in [0.5, 1.5) for weighted features, 1 for the others.
      at::Tensor w = at::ones({n}, at::kFloat);
      if (std::find(weighted.begin(), weighted.end(), feature) != weighted.end()) w.uniform_(0.5, 1.5, generator);
      weights.push_back(w);
    }
  }
  std::optional<at::Tensor> w;
  if (!weighted.empty()) w = at::cat(weights);
  return dmp::KeyedJaggedTensor(keys, at::cat(values), at::cat(lengths), w);
}

dmp::KeyedJaggedTensor local_batch(const scenario::RunSpec& spec, const dmp::KeyedJaggedTensor& global, int rank) {
  return global.slice_batch(rank * spec.batch_size, (rank + 1) * spec.batch_size);
}

}  // namespace dmpcheck::run
