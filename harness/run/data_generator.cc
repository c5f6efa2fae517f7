#include "run/data_generator.h"

#include <algorithm>
#include <filesystem>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/error.h"
#include "dmp/checkpoint.h"

namespace dmpcheck::run {

namespace {

// data.from: batch<step>.pt, checked against the run's features, rows and global batch size.
dmp::KeyedJaggedTensor replayed_batch(const scenario::RunSpec& spec, int step) {
  const std::string path = fmt::format("{}/batch{}.pt", spec.data.from, step);
  DMP_CHECK(std::filesystem::is_regular_file(path), ErrorKind::kInvalidInput,
            "data.from: {} does not exist; step {} of the run reads it (batches are counted from 0)", path, step + 1);
  const dmp::KeyedJaggedTensor batch = dmp::load_batch(path);
  const std::vector<std::string> features = spec.model.features();
  for (const auto& key : batch.keys()) {
    DMP_CHECK(std::find(features.begin(), features.end(), key) != features.end(), ErrorKind::kInvalidInput,
              "{}: no table reads feature '{}'; the model's features: {}", path, key, fmt::join(features, ", "));
  }
  for (const auto& feature : features) {
    DMP_CHECK(std::find(batch.keys().begin(), batch.keys().end(), feature) != batch.keys().end(),
              ErrorKind::kInvalidInput, "{}: has no feature '{}' (it holds {})", path, feature,
              fmt::join(batch.keys(), ", "));
  }
  const int64_t bags = spec.batch_size * spec.world_size;
  DMP_CHECK(batch.stride() == bags, ErrorKind::kInvalidInput,
            "{}: holds {} bags per feature; this run needs batch_size {} x world_size {} = {}", path, batch.stride(),
            spec.batch_size, spec.world_size, bags);
  const bool weighted = !spec.data.weighted_features.empty();
  DMP_CHECK(weighted == batch.weights().has_value(), ErrorKind::kInvalidInput, "{}: {}", path,
            weighted ? fmt::format("has no 'weights' but feature(s) {} are weighted",
                                   fmt::join(spec.data.weighted_features, ", "))
                     : std::string("has 'weights' but no table is weighted"));
  dmp::KeyedJaggedTensor ordered = batch.select(features);
  for (const auto& table : spec.model.tables) {
    for (const auto& feature : table.feature_names) {
      const at::Tensor ids = ordered.values_of(ordered.key_index(feature));
      if (ids.numel() == 0) continue;
      const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
      DMP_CHECK(lo >= 0 && hi < table.num_embeddings, ErrorKind::kInvalidInput,
                "{}: feature '{}' has id {} but table '{}' has rows [0, {})", path, feature, lo < 0 ? lo : hi,
                table.name, table.num_embeddings);
    }
  }
  return ordered;
}

// data.batches: the ranks' bags of each feature, concatenated in rank order.
dmp::KeyedJaggedTensor inline_batch(const scenario::RunSpec& spec, int step) {
  DMP_CHECK(step < static_cast<int>(spec.data.batches.size()), ErrorKind::kInvalidInput,
            "data.batches gives {} step(s); step {} has none", spec.data.batches.size(), step + 1);
  const auto& ranks = spec.data.batches[step];
  const bool weighted = !spec.data.weighted_features.empty();
  const std::vector<std::string> keys = spec.model.features();
  std::vector<int64_t> lengths, values;
  std::vector<float> weights;
  for (const auto& feature : keys) {
    for (const auto& rank : ranks) {
      auto it = rank.find(feature);
      if (it == rank.end()) {
        lengths.insert(lengths.end(), spec.batch_size, 0);
        continue;
      }
      const auto& bags = it->second;
      lengths.insert(lengths.end(), bags.lengths.begin(), bags.lengths.end());
      values.insert(values.end(), bags.ids.begin(), bags.ids.end());
      if (bags.weights.empty()) weights.insert(weights.end(), bags.ids.size(), 1.0f);
      else weights.insert(weights.end(), bags.weights.begin(), bags.weights.end());
    }
  }
  auto longs = [](const std::vector<int64_t>& v) {
    return at::tensor(at::ArrayRef<int64_t>(v), at::kLong).reshape({-1});
  };
  std::optional<at::Tensor> w;
  if (weighted) w = at::tensor(at::ArrayRef<float>(weights), at::kFloat).reshape({-1});
  return dmp::KeyedJaggedTensor(keys, longs(values), longs(lengths), w);
}

}  // namespace

dmp::KeyedJaggedTensor make_global_batch(const scenario::RunSpec& spec, int step) {
  if (!spec.data.from.empty()) return replayed_batch(spec, step);
  if (!spec.data.batches.empty()) return inline_batch(spec, step);
  // splitmix-style mixing keeps nearby (seed, step) pairs far apart.
  uint64_t seed = spec.data.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1;
  seed ^= seed >> 31;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t bags = spec.batch_size * spec.world_size;
  const std::vector<std::string> keys = spec.model.features();
  std::vector<at::Tensor> lengths, values, weights;
  const auto& weighted = spec.data.weighted_features;
  // Each feature once, its ids valid for every table that reads it.
  std::map<std::string, int64_t> rows_of;
  for (const auto& table : spec.model.tables) {
    for (const auto& feature : table.feature_names) {
      auto it = rows_of.find(feature);
      rows_of[feature] = it == rows_of.end() ? table.num_embeddings : std::min(it->second, table.num_embeddings);
    }
  }
  for (const auto& feature : keys) {
    const auto [lo, hi] = spec.data.ids_per_bag(feature);
    at::Tensor len = lo == hi ? at::full({bags}, lo, at::kLong) : at::randint(lo, hi + 1, {bags}, generator, at::kLong);
    const int64_t n = len.sum().item<int64_t>();
    lengths.push_back(len);
    values.push_back(at::randint(0, rows_of.at(feature), {n}, generator, at::kLong));
    // Per-id weights in [0.5, 1.5) for weighted features, 1 for the others.
    at::Tensor w = at::ones({n}, at::kFloat);
    if (std::find(weighted.begin(), weighted.end(), feature) != weighted.end()) w.uniform_(0.5, 1.5, generator);
    weights.push_back(w);
  }
  std::optional<at::Tensor> w;
  if (!weighted.empty()) w = at::cat(weights);
  return dmp::KeyedJaggedTensor(keys, at::cat(values), at::cat(lengths), w);
}

dmp::KeyedJaggedTensor local_batch(const scenario::RunSpec& spec, const dmp::KeyedJaggedTensor& global, int rank) {
  return global.slice_batch(rank * spec.batch_size, (rank + 1) * spec.batch_size);
}

}  // namespace dmpcheck::run
