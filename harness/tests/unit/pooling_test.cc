#include "dmp/pooling.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "test_util.h"

namespace dmpcheck::dmp {
namespace {

// A 4x2 table whose rows are easy to add by hand.
at::Tensor table() { return at::tensor({1.f, 2.f, 10.f, 20.f, 100.f, 200.f, 1000.f, 2000.f}).view({4, 2}); }
at::Tensor longs(std::vector<int64_t> v) { return at::tensor(v, at::kLong); }

TEST(Pooling, SumAndMeanMatchAHandComputation) {
  // bags: {0, 2}, {}, {3, 3, 1}
  Bags bags{longs({0, 2, 3, 3, 1}), longs({2, 0, 3}), std::nullopt};
  at::Tensor sum = pooled_forward(table(), bags, PoolingType::kSum);
  EXPECT_TRUE(sum.equal(at::tensor({101.f, 202.f, 0.f, 0.f, 2010.f, 4020.f}).view({3, 2}))) << sum;
  at::Tensor mean = pooled_forward(table(), bags, PoolingType::kMean);
  EXPECT_TRUE(mean.allclose(at::tensor({50.5f, 101.f, 0.f, 0.f, 670.f, 1340.f}).view({3, 2}))) << mean;
}

TEST(Pooling, MeanAndItsGradientUseFbgemmsArithmetic) {
  // FBGEMM (CPU, measured): a mean is the bag's sum times the float 1/L (not the sum divided by
  // L), and a row's gradient adds g * (1/L) per occurrence with one rounding.
  at::manual_seed(3);
  const at::Tensor weight = at::randn({5, 16});
  Bags bags{longs({0, 1, 2, 3, 3, 1, 4}), longs({3, 4}), std::nullopt};
  const at::Tensor grad = at::randn({2, 16});
  const at::Tensor mean = pooled_forward(weight, bags, PoolingType::kMean);
  const RowGradients back = pooled_backward(grad, bags, PoolingType::kMean);
  const int64_t ids[] = {0, 1, 2, 3, 3, 1, 4};
  const int64_t bag_of[] = {0, 0, 0, 1, 1, 1, 1};
  for (int64_t j = 0; j < 16; ++j) {
    float sum0 = 0, sum1 = 0;
    for (int i = 0; i < 3; ++i) sum0 = sum0 + weight[ids[i]][j].item<float>();
    for (int i = 3; i < 7; ++i) sum1 = sum1 + weight[ids[i]][j].item<float>();
    EXPECT_EQ(mean[0][j].item<float>(), sum0 * (1.0f / 3.0f)) << j;
    EXPECT_EQ(mean[1][j].item<float>(), sum1 * (1.0f / 4.0f)) << j;
    float row[5] = {0, 0, 0, 0, 0};
    for (int i = 0; i < 7; ++i) {
      const float inverse = bag_of[i] == 0 ? 1.0f / 3.0f : 1.0f / 4.0f;
      row[ids[i]] = static_cast<float>(static_cast<double>(row[ids[i]]) +
                                       static_cast<double>(grad[bag_of[i]][j].item<float>()) * inverse);
    }
    for (int64_t r = 0; r < 5; ++r) EXPECT_EQ(back.grads[r][j].item<float>(), row[r]) << r << " " << j;
  }
}

TEST(Pooling, WeightedSum) {
  Bags bags{longs({0, 1}), longs({2}), at::tensor({2.f, 0.5f})};
  at::Tensor out = pooled_forward(table(), bags, PoolingType::kSum);
  EXPECT_TRUE(out.equal(at::tensor({7.f, 14.f}).view({1, 2}))) << out;
}

TEST(Pooling, BackwardSumsGradientsPerUniqueRow) {
  // Row 3 appears twice in bag 2; row 1 once in bag 2; row 0 and 2 in bag 0.
  Bags bags{longs({0, 2, 3, 3, 1}), longs({2, 0, 3}), std::nullopt};
  at::Tensor grad = at::tensor({1.f, 2.f, 5.f, 5.f, 3.f, 4.f}).view({3, 2});
  RowGradients sum = pooled_backward(grad, bags, PoolingType::kSum);
  EXPECT_TRUE(sum.rows.equal(longs({0, 1, 2, 3})));
  EXPECT_TRUE(sum.grads.equal(at::tensor({1.f, 2.f, 3.f, 4.f, 1.f, 2.f, 6.f, 8.f}).view({4, 2}))) << sum.grads;
  RowGradients mean = pooled_backward(grad, bags, PoolingType::kMean);
  EXPECT_TRUE(mean.grads.allclose(at::tensor({0.5f, 1.f, 1.f, 4.f / 3, 0.5f, 1.f, 2.f, 8.f / 3}).view({4, 2})))
      << mean.grads;
}

TEST(Pooling, OutOfRangeIdNamesTableFeatureAndId) {
  Bags bags{longs({0, 4}), longs({2}), std::nullopt};
  EXPECT_TRUE(testing::throws_with(ErrorKind::kInvalidInput,
                                   "table 't0', feature 'f0': id 4 (position 1) is outside [0, 4)",
                                   [&] { check_ids_in_range(bags, 4, "t0", "f0"); }));
}

TEST(Pooling, MergeRowGradientsSumsSharedRows) {
  RowGradients a{longs({1, 3}), at::tensor({1.f, 2.f}).view({2, 1})};
  RowGradients b{longs({0, 3}), at::tensor({4.f, 8.f}).view({2, 1})};
  RowGradients merged = merge_row_gradients({a, b});
  EXPECT_TRUE(merged.rows.equal(longs({0, 1, 3})));
  EXPECT_TRUE(merged.grads.equal(at::tensor({4.f, 1.f, 10.f}).view({3, 1})));
}

}  // namespace
}  // namespace dmpcheck::dmp
