#include "run/data_generator.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

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
  // Read once per process while the file is unchanged: preflight reads every step's file before
  // any cell starts, and the ranks it forks (and the matrix's other runs over the same files)
  // find it here.
  using Stamp = std::pair<std::filesystem::file_time_type, std::uintmax_t>;
  static std::mutex mutex;
  static std::map<std::string, std::pair<Stamp, dmp::KeyedJaggedTensor>> loaded;
  const dmp::KeyedJaggedTensor batch = [&] {
    const Stamp stamp{std::filesystem::last_write_time(path), std::filesystem::file_size(path)};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = loaded.find(path);
    if (it == loaded.end() || it->second.first != stamp)
      it = loaded.insert_or_assign(path, std::make_pair(stamp, dmp::load_batch(path))).first;
    return it->second.second;
  }();
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
      DMP_CHECK(lo >= 0 && hi < spec.id_range(table), ErrorKind::kInvalidInput,
                "{}: feature '{}' has id {} but table '{}' takes ids [0, {})", path, feature, lo < 0 ? lo : hi,
                table.name, spec.id_range(table));
    }
  }
  return ordered;
}

// The generator of step `step`'s draws (`salt` 0: the ids; another: a stream of its own).
// splitmix-style mixing keeps nearby (seed, step) pairs far apart.
at::Generator step_generator(const scenario::RunSpec& spec, int step, uint64_t salt = 0) {
  uint64_t seed = (spec.data.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(step) + 1) ^ salt;
  seed ^= seed >> 31;
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

// One rank's bags of one feature, as lengths, ids and weights.
struct Bags {
  std::vector<int64_t> lengths, ids;
  std::vector<float> weights;

  // The batch's bags from distinct ones: bag i is distinct bag inverse[i].
  Bags expanded(const std::vector<int64_t>& inverse) const {
    std::vector<int64_t> offsets(lengths.size() + 1, 0);
    for (size_t j = 0; j < lengths.size(); ++j) offsets[j + 1] = offsets[j] + lengths[j];
    Bags out;
    for (const int64_t j : inverse) {
      const auto u = static_cast<size_t>(j);
      out.lengths.push_back(lengths[u]);
      out.ids.insert(out.ids.end(), ids.begin() + offsets[u], ids.begin() + offsets[u + 1]);
      out.weights.insert(out.weights.end(), weights.begin() + offsets[u], weights.begin() + offsets[u + 1]);
    }
    return out;
  }
};

// Generated VBE: per feature with stride_per_rank, per rank, batch_size inverse indices: the
// distinct bags first, in order, then bags drawn among them.  Its own generator, so that the
// ids of every feature are drawn as without variable batches.
std::map<std::string, std::vector<std::vector<int64_t>>> generated_inverse(const scenario::RunSpec& spec, int step) {
  at::Generator generator = step_generator(spec, step, 0x5642455F494E56ull);
  std::map<std::string, std::vector<std::vector<int64_t>>> out;
  for (const auto& feature : spec.model.features()) {
    auto it = spec.data.stride_per_rank.find(feature);
    if (it == spec.data.stride_per_rank.end()) continue;
    for (const int64_t stride : it->second) {
      std::vector<int64_t> inverse;
      for (int64_t i = 0; i < spec.batch_size; ++i) inverse.push_back(i < stride ? i : -1);
      if (stride < spec.batch_size) {
        const auto drawn = to_vector(at::randint(0, stride, {spec.batch_size - stride}, generator, at::kLong));
        std::copy(drawn.begin(), drawn.end(), inverse.begin() + stride);
      }
      out[feature].push_back(std::move(inverse));
    }
  }
  return out;
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
      Bags bags{it->second.lengths, it->second.ids, it->second.weights};
      if (bags.weights.empty()) bags.weights.assign(bags.ids.size(), 1.0f);
      if (!it->second.inverse_indices.empty()) bags = bags.expanded(it->second.inverse_indices);
      lengths.insert(lengths.end(), bags.lengths.begin(), bags.lengths.end());
      values.insert(values.end(), bags.ids.begin(), bags.ids.end());
      weights.insert(weights.end(), bags.weights.begin(), bags.weights.end());
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

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.contiguous().to(at::kLong);
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

dmp::KeyedJaggedTensor make_global_batch(const scenario::RunSpec& spec, int step) {
  if (!spec.data.from.empty()) return replayed_batch(spec, step);
  if (!spec.data.batches.empty()) return inline_batch(spec, step);
  at::Generator generator = step_generator(spec, step);
  const int64_t bags = spec.batch_size * spec.world_size;
  const std::vector<std::string> keys = spec.model.features();
  std::vector<at::Tensor> lengths, values, weights;
  const auto& weighted = spec.data.weighted_features;
  // Each feature once, its ids valid for every table that reads it.
  std::map<std::string, int64_t> rows_of;
  for (const auto& table : spec.model.tables) {
    for (const auto& feature : table.feature_names) {
      auto it = rows_of.find(feature);
      rows_of[feature] = it == rows_of.end() ? spec.id_range(table) : std::min(it->second, spec.id_range(table));
    }
  }
  const auto inverse = generated_inverse(spec, step);
  for (const auto& feature : keys) {
    const auto [lo, hi] = spec.data.ids_per_bag(feature);
    const bool is_weighted = std::find(weighted.begin(), weighted.end(), feature) != weighted.end();
    // `count` bags of the feature: lengths, ids, per-id weights (in [0.5, 1.5) for weighted
    // features, 1 for the others).
    auto draw = [&, lo = lo, hi = hi](int64_t count) {
      at::Tensor len =
          lo == hi ? at::full({count}, lo, at::kLong) : at::randint(lo, hi + 1, {count}, generator, at::kLong);
      const int64_t n = len.sum().item<int64_t>();
      at::Tensor ids = at::randint(0, rows_of.at(feature), {n}, generator, at::kLong);
      at::Tensor w = at::ones({n}, at::kFloat);
      if (is_weighted) w.uniform_(0.5, 1.5, generator);
      return std::make_tuple(len, ids, w);
    };
    auto vbe = inverse.find(feature);
    if (vbe == inverse.end()) {
      auto [len, ids, w] = draw(bags);
      lengths.push_back(len);
      values.push_back(ids);
      weights.push_back(w);
      continue;
    }
    // Each rank's distinct bags, drawn, then expanded to its batch through the inverse indices.
    const auto& strides = spec.data.stride_per_rank.at(feature);
    for (size_t rank = 0; rank < strides.size(); ++rank) {
      auto [len, ids, w] = draw(strides[rank]);
      const at::Tensor wf = w.contiguous();
      const Bags distinct{to_vector(len), to_vector(ids), {wf.data_ptr<float>(), wf.data_ptr<float>() + wf.numel()}};
      const Bags batch = distinct.expanded(vbe->second[rank]);
      lengths.push_back(at::tensor(at::ArrayRef<int64_t>(batch.lengths), at::kLong).reshape({-1}));
      values.push_back(at::tensor(at::ArrayRef<int64_t>(batch.ids), at::kLong).reshape({-1}));
      weights.push_back(at::tensor(at::ArrayRef<float>(batch.weights), at::kFloat).reshape({-1}));
    }
  }
  std::optional<at::Tensor> w;
  if (!weighted.empty()) w = at::cat(weights);
  return dmp::KeyedJaggedTensor(keys, at::cat(values), at::cat(lengths), w);
}

dmp::KeyedJaggedTensor local_batch(const scenario::RunSpec& spec, const dmp::KeyedJaggedTensor& global, int rank) {
  return global.slice_batch(rank * spec.batch_size, (rank + 1) * spec.batch_size);
}

VariableBatch variable_batch(const scenario::RunSpec& spec, int step, int rank) {
  VariableBatch out;
  std::map<std::string, std::vector<std::vector<int64_t>>> generated;
  if (spec.data.batches.empty()) generated = generated_inverse(spec, step);
  for (const auto& feature : spec.model.features()) {
    std::vector<int64_t> inverse;
    if (auto it = generated.find(feature); it != generated.end()) inverse = it->second.at(static_cast<size_t>(rank));
    if (!spec.data.batches.empty()) {
      const auto& local = spec.data.batches.at(static_cast<size_t>(step)).at(static_cast<size_t>(rank));
      if (auto it = local.find(feature); it != local.end()) inverse = it->second.inverse_indices;
    }
    if (inverse.empty()) {
      for (int64_t i = 0; i < spec.batch_size; ++i) inverse.push_back(i);
    }
    out.stride_per_key.push_back(*std::max_element(inverse.begin(), inverse.end()) + 1);
    out.inverse_indices.insert(out.inverse_indices.end(), inverse.begin(), inverse.end());
  }
  return out;
}

}  // namespace dmpcheck::run
