#include "dmp/optim/fused_optimizer.h"

#include <cmath>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace dmpcheck::dmp {
namespace {

// A 3x2 table; the batch touches row 1 twice (one bag holding id 1 twice) and row 2 once, so
// the exact optimizer must see row 1's two gradients summed into one update.
struct Tiny {
  at::Tensor weight = at::tensor({0.5f, -0.5f, 1.0f, 2.0f, -1.0f, 0.25f}).view({3, 2});
  Bags bags{at::tensor({1, 1, 2}, at::kLong), at::tensor({2, 1}, at::kLong), std::nullopt};
  at::Tensor grad_pooled = at::tensor({0.1f, 0.2f, 0.3f, -0.4f}).view({2, 2});
};

TEST(FusedOptimizer, SgdAppliesOneSummedUpdatePerRow) {
  Tiny t;
  FusedOptimizer sgd({FusedOptimizerType::kSgd, 0.5, 1e-8}, 3, 2);
  sgd.apply(t.weight, pooled_backward(t.grad_pooled, t.bags, PoolingType::kSum));
  // row 1: g = 2 * (0.1, 0.2) = (0.2, 0.4); w = (1, 2) - 0.5 g = (0.9, 1.8)
  // row 2: g = (0.3, -0.4);                 w = (-1, 0.25) - 0.5 g = (-1.15, 0.45)
  const at::Tensor expected = at::tensor({0.5f, -0.5f, 0.9f, 1.8f, -1.15f, 0.45f}).view({3, 2});
  EXPECT_TRUE(t.weight.allclose(expected, 0, 1e-6)) << t.weight;
  EXPECT_TRUE(sgd.state().empty());
}

TEST(FusedOptimizer, AdagradMatchesFbgemmExactMathOverTwoSteps) {
  Tiny t;
  const double lr = 0.1, eps = 1e-8;
  FusedOptimizer adagrad({FusedOptimizerType::kAdagrad, lr, eps}, 3, 2);
  const RowGradients g = pooled_backward(t.grad_pooled, t.bags, PoolingType::kSum);
  adagrad.apply(t.weight, g);
  adagrad.apply(t.weight, g);
  // Per element: m1 = g^2, w1 = w0 - lr g/(|g| + eps); m2 = 2 g^2, w2 = w1 - lr g/(sqrt(2)|g| + eps).
  auto expect = [&](double w0, double gv) {
    const double w1 = w0 - lr * gv / (std::sqrt(gv * gv) + eps);
    return w1 - lr * gv / (std::sqrt(2 * gv * gv) + eps);
  };
  const at::Tensor expected = at::tensor({0.5f, -0.5f, static_cast<float>(expect(1.0, 0.2)), static_cast<float>(expect(2.0, 0.4)),
                                          static_cast<float>(expect(-1.0, 0.3)), static_cast<float>(expect(0.25, -0.4))})
                                  .view({3, 2});
  EXPECT_TRUE(t.weight.allclose(expected, 0, 1e-6)) << t.weight << expected;
  const auto state = adagrad.state();
  ASSERT_EQ(state.size(), 1u);
  EXPECT_EQ(state[0].name, "momentum1");
  // Row 0 was never touched: its state stays zero.
  const at::Tensor m_expected = at::tensor({0.f, 0.f, 0.08f, 0.32f, 0.18f, 0.32f}).view({3, 2});
  EXPECT_TRUE(state[0].tensor.allclose(m_expected, 0, 1e-7)) << state[0].tensor;
}

TEST(FusedOptimizer, UntouchedRowsAreNotUpdated) {
  Tiny t;
  const at::Tensor before = t.weight.clone();
  FusedOptimizer adagrad({FusedOptimizerType::kAdagrad, 0.1, 1e-8}, 3, 2);
  adagrad.apply(t.weight, pooled_backward(t.grad_pooled, t.bags, PoolingType::kSum));
  EXPECT_TRUE(t.weight[0].equal(before[0]));
  EXPECT_FALSE(t.weight[1].equal(before[1]));
}

}  // namespace
}  // namespace dmpcheck::dmp
