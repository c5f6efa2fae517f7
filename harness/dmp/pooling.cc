#include "dmp/pooling.h"

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::dmp {
namespace {

at::Tensor bag_offsets(const at::Tensor& lengths) {
  // embedding_bag wants the start of each bag: an exclusive prefix sum of size batch.
  at::Tensor offsets = at::zeros({lengths.numel()}, at::kLong);
  if (lengths.numel() > 1)
    offsets.narrow(0, 1, lengths.numel() - 1).copy_(lengths.cumsum(0).narrow(0, 0, lengths.numel() - 1));
  return offsets;
}

// FBGEMM's mean: each bag's sum times the float reciprocal of its length (1 for an empty bag,
// whose sum is 0 anyway).
at::Tensor inverse_lengths(const at::Tensor& lengths) {
  const at::Tensor l = lengths.to(at::kFloat);
  return at::where(l > 0, l.reciprocal(), at::ones_like(l));
}

// Per-id scale: the per-id weight, or 1/L (a float) under mean pooling, or 1.
at::Tensor id_scales(const Bags& bags, PoolingType pooling, const at::Tensor& bag_of_id) {
  if (bags.weights) return bags.weights->to(at::kFloat);
  if (pooling == PoolingType::kMean && bags.ids.numel() > 0)
    return inverse_lengths(bags.lengths).index_select(0, bag_of_id);
  return at::ones({bags.ids.numel()}, at::kFloat);
}

// Unique rows (ascending) of `ids` and, for each id, the index of its row among them.
std::pair<at::Tensor, at::Tensor> unique_rows(const at::Tensor& ids) {
  // A stable sort and unique_consecutive: ATen's hash-based unique costs 20x more on CPU.
  auto [sorted, order] = ids.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto [rows, inverse_sorted, counts] =
      at::unique_consecutive(sorted, /*return_inverse=*/true, /*return_counts=*/false);
  at::Tensor inverse = at::empty_like(inverse_sorted);
  inverse.index_copy_(0, order, inverse_sorted);
  return {rows, inverse};
}

}  // namespace

void check_ids_in_range(const Bags& bags, int64_t num_rows, const std::string& table, const std::string& feature) {
  if (bags.ids.numel() == 0) return;
  const auto bad = (bags.ids < 0).logical_or(bags.ids >= num_rows);
  if (bad.any().item<bool>()) {
    const int64_t at_index = bad.nonzero()[0][0].item<int64_t>();
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("table '{}', feature '{}': id {} (position {}) is outside [0, {})", table, feature,
                            bags.ids[at_index].item<int64_t>(), at_index, num_rows));
  }
}

at::Tensor pooled_forward(const at::Tensor& weight, const Bags& bags, PoolingType pooling) {
  const int64_t batch = bags.lengths.numel();
  if (bags.ids.numel() == 0) return at::zeros({batch, weight.size(1)}, weight.options());
  DMP_CHECK(!(bags.weights && pooling == PoolingType::kMean), ErrorKind::kInvalidInput,
            "weighted features with mean pooling are not modelled by the reference DMP (TorchRec accepts them)");
  // Sums in bag order (weighted: one rounding per id, as FBGEMM's multiply-add); the mean is the
  // sum times 1/L as a float, as FBGEMM computes it (ATen's mean mode divides, a different bit).
  at::Tensor per_sample = bags.weights ? bags.weights->to(weight.scalar_type()) : at::Tensor();
  auto result = at::embedding_bag(weight, bags.ids, bag_offsets(bags.lengths), /*scale_grad_by_freq=*/false,
                                  /*mode=*/0, /*sparse=*/false, per_sample, /*include_last_offset=*/false);
  at::Tensor pooled = std::get<0>(result);
  if (pooling == PoolingType::kMean) pooled.mul_(inverse_lengths(bags.lengths).unsqueeze(1));
  return pooled;
}

RowGradients row_gradients(const std::vector<GradientPart>& parts) {
  DMP_INTERNAL_ASSERT(!parts.empty(), "row gradients of no part");
  const int64_t dim = parts.front().grad_pooled.size(1);
  std::vector<at::Tensor> all_ids;
  for (const auto& p : parts) all_ids.push_back(p.bags.ids);
  const at::Tensor ids = at::cat(all_ids).contiguous();
  if (ids.numel() == 0) return {at::empty({0}, at::kLong), at::empty({0, dim}, at::kFloat)};
  auto [rows, inverse] = unique_rows(ids);
  at::Tensor grads = at::zeros({rows.numel(), dim}, at::kFloat);
  float* out = grads.data_ptr<float>();
  const int64_t* target = inverse.data_ptr<int64_t>();
  int64_t position = 0;  // of the current id among all parts' ids
  for (const auto& p : parts) {
    const at::Tensor g = p.grad_pooled.contiguous().to(at::kFloat);
    const at::Tensor lengths = p.bags.lengths.contiguous().to(at::kLong);
    const float* gp = g.data_ptr<float>();
    const int64_t* lp = lengths.data_ptr<int64_t>();
    const at::Tensor weights = p.bags.weights ? p.bags.weights->contiguous().to(at::kFloat) : at::Tensor();
    const float* wp = weights.defined() ? weights.data_ptr<float>() : nullptr;
    const bool mean = p.pooling == PoolingType::kMean && wp == nullptr;
    int64_t i = 0;  // the id's index in this part
    for (int64_t b = 0; b < lengths.numel(); ++b) {
      const float* gb = gp + b * dim;
      const float inverse_length = lp[b] > 0 ? 1.0f / static_cast<float>(lp[b]) : 1.0f;
      for (int64_t k = 0; k < lp[b]; ++k, ++position, ++i) {
        float* row = out + target[position] * dim;
        if (wp == nullptr && !mean) {
          for (int64_t j = 0; j < dim; ++j) row[j] += gb[j];
          continue;
        }
        // row + g * scale rounded once (FBGEMM's multiply-add); the product of two floats is exact in double.
        const double scale = wp != nullptr ? wp[i] : inverse_length;
        for (int64_t j = 0; j < dim; ++j)
          row[j] = static_cast<float>(static_cast<double>(row[j]) + static_cast<double>(gb[j]) * scale);
      }
    }
  }
  DMP_INTERNAL_ASSERT(position == ids.numel(), "the bags' lengths account for every id");
  return {rows, grads};
}

RowGradients per_occurrence_gradients(const at::Tensor& grad_pooled, const Bags& bags, PoolingType pooling) {
  const int64_t dim = grad_pooled.size(1);
  if (bags.ids.numel() == 0) return {at::empty({0}, at::kLong), at::empty({0, dim}, grad_pooled.options())};
  const at::Tensor bag_of_id = at::repeat_interleave(at::arange(bags.lengths.numel(), at::kLong), bags.lengths);
  return {bags.ids, grad_pooled.index_select(0, bag_of_id) * id_scales(bags, pooling, bag_of_id).unsqueeze(1)};
}

RowGradients sum_by_row(const RowGradients& per_id) {
  if (per_id.rows.numel() == 0) return per_id;
  // Unique rows by a stable sort, and the sums by a plain loop in entry order: the float
  // additions of index_add_ in the same order (so the same bits), without ATen's hash-based
  // unique and per-row slice ops, which cost 20x more on CPU.
  const at::Tensor ids = per_id.rows.contiguous();
  auto [rows, inverse] = unique_rows(ids);
  const at::Tensor source = per_id.grads.contiguous().to(at::kFloat);
  const int64_t dim = source.size(1);
  at::Tensor grads = at::zeros({rows.numel(), dim}, at::kFloat);
  float* out = grads.data_ptr<float>();
  const float* in = source.data_ptr<float>();
  const int64_t* target = inverse.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    float* row = out + target[i] * dim;
    const float* add = in + i * dim;
    for (int64_t j = 0; j < dim; ++j) row[j] += add[j];
  }
  return {rows, grads.to(per_id.grads.scalar_type())};
}

Bags bucketize_rows(const Bags& bags, int64_t begin, int64_t rows) {
  const at::Tensor keep = bags.ids.ge(begin).logical_and(bags.ids.lt(begin + rows));
  const at::Tensor bag_of_id = at::repeat_interleave(at::arange(bags.lengths.numel(), at::kLong), bags.lengths);
  at::Tensor lengths = at::zeros({bags.lengths.numel()}, at::kLong);
  if (bags.ids.numel() > 0) lengths.index_add_(0, bag_of_id, keep.to(at::kLong));
  Bags out{bags.ids.masked_select(keep) - begin, lengths, std::nullopt};
  if (bags.weights) out.weights = bags.weights->masked_select(keep);
  return out;
}

RowGradients pooled_backward(const at::Tensor& grad_pooled, const Bags& bags, PoolingType pooling) {
  return row_gradients({{grad_pooled, bags, pooling}});
}

std::vector<RowGradients> occurrence_groups(const RowGradients& per_occurrence) {
  const int64_t n = per_occurrence.rows.numel();
  if (n == 0) return {};
  // occurrence[i] = how many earlier entries have the same row.
  auto [sorted, order] = per_occurrence.rows.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false);
  auto [unique, inverse, counts] = at::_unique2(sorted, true, true, true);
  const at::Tensor run_start = (counts.cumsum(0) - counts).repeat_interleave(counts);
  at::Tensor occurrence = at::empty({n}, at::kLong);
  occurrence.index_copy_(0, order, at::arange(n, at::kLong) - run_start);
  std::vector<RowGradients> groups;
  const int64_t most = occurrence.max().item<int64_t>();
  for (int64_t k = 0; k <= most; ++k) {
    const at::Tensor positions = occurrence.eq(k).nonzero().reshape({-1});
    groups.push_back({per_occurrence.rows.index_select(0, positions), per_occurrence.grads.index_select(0, positions)});
  }
  return groups;
}

RowGradients merge_row_gradients(const std::vector<RowGradients>& parts) {
  DMP_INTERNAL_ASSERT(!parts.empty(), "merge of no gradients");
  if (parts.size() == 1) return parts.front();
  std::vector<at::Tensor> rows, grads;
  for (const auto& p : parts) {
    rows.push_back(p.rows);
    grads.push_back(p.grads);
  }
  return sum_by_row({at::cat(rows), at::cat(grads)});
}

}  // namespace dmpcheck::dmp
