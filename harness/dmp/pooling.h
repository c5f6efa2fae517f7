// Pooled embedding lookup and its backward, the computation FBGEMM's table-batched embedding
// kernels do for one table: forward sums (or averages) the rows of each bag; backward turns the
// gradient of each pooled bag into one summed gradient per unique row ("exact" optimizers
// update each touched row once).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "dmp/embedding_config.h"

namespace dmpcheck::dmp {

// Ids and bag lengths of one feature for one batch.
struct Bags {
  at::Tensor ids;                     // int64 [n]
  at::Tensor lengths;                 // int64 [batch]
  std::optional<at::Tensor> weights;  // float [n], per-id weights (weighted features)
};

// Checks that every id is in [0, num_rows); Error(kInvalidInput) names table, feature and id.
void check_ids_in_range(const Bags& bags, int64_t num_rows, const std::string& table, const std::string& feature);

// [batch, dim]: bag b is sum_i w_i * weight[ids_i] (or the mean over the bag).  An empty bag
// pools to zeros.
at::Tensor pooled_forward(const at::Tensor& weight, const Bags& bags, PoolingType pooling);

struct RowGradients {
  at::Tensor rows;   // int64 [u], unique rows in ascending order
  at::Tensor grads;  // [u, dim], the summed gradient of each row
};

// The ids of `bags` that fall in [begin, begin + rows), shifted to start at 0, with the lengths
// of the bags they came from (what a row-wise shard's owner receives).
Bags bucketize_rows(const Bags& bags, int64_t begin, int64_t rows);

// Gradient of the pooled output with respect to the rows the bags touched.
RowGradients pooled_backward(const at::Tensor& grad_pooled, const Bags& bags, PoolingType pooling);

// One table's pooled gradient for one feature (or one part of a feature's bags).
struct GradientPart {
  at::Tensor grad_pooled;  // [batch, dim]
  Bags bags;
  PoolingType pooling;
};
// The gradient of every row the parts touched, as FBGEMM's backward computes it: each id
// occurrence, in order (parts in turn, then bags, then ids), adds its bag's gradient times its
// scale -- the id's weight, 1/L as a float under mean pooling, or 1 -- rounded once.
RowGradients row_gradients(const std::vector<GradientPart>& parts);

// The same gradient, one entry per id occurrence (rows repeat, in bag order).
RowGradients per_occurrence_gradients(const at::Tensor& grad_pooled, const Bags& bags, PoolingType pooling);
// Sums per-occurrence gradients per unique row (rows ascending).
RowGradients sum_by_row(const RowGradients& per_occurrence);
// Splits per-occurrence gradients into groups of unique rows: group k holds the k-th occurrence
// of every row that occurs more than k times, in bag order.
std::vector<RowGradients> occurrence_groups(const RowGradients& per_occurrence);
// One RowGradients from several (a table read by several features): rows summed.
RowGradients merge_row_gradients(const std::vector<RowGradients>& parts);

}  // namespace dmpcheck::dmp
