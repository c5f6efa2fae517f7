#include "dmp/optim/fused_optimizer.h"
#include "dmp/optim/dense_optimizer.h"

#include <cmath>
#include <map>

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
  const at::Tensor expected =
      at::tensor({0.5f, -0.5f, static_cast<float>(expect(1.0, 0.2)), static_cast<float>(expect(2.0, 0.4)),
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

namespace dmpcheck::dmp {
namespace {

// One row, two columns: g = (0.2, 0.4) summed from two occurrences of id 1, w = (1, 2).
struct OneRow {
  at::Tensor weight = at::tensor({0.5f, -0.5f, 1.0f, 2.0f}).view({2, 2});
  RowGradients grads{at::tensor({1}, at::kLong), at::tensor({0.2f, 0.4f}).view({1, 2})};
};

TEST(FusedOptimizer, RowWiseAdagradKeepsOneMomentumPerRow) {
  OneRow t;
  FusedOptimizerConfig c;
  c.type = FusedOptimizerType::kRowWiseAdagrad;
  c.learning_rate = 0.1;
  FusedOptimizer opt(c, 2, 2);
  opt.apply(t.weight, t.grads);
  // m = mean(0.04, 0.16) = 0.1; mult = 0.1 / (sqrt(0.1) + 1e-8)
  const double mult = 0.1 / (std::sqrt(0.1) + 1e-8);
  EXPECT_NEAR(t.weight[1][0].item<double>(), 1.0 - mult * 0.2, 1e-6);
  EXPECT_NEAR(t.weight[1][1].item<double>(), 2.0 - mult * 0.4, 1e-6);
  EXPECT_NEAR(opt.state()[0].tensor[1].item<double>(), 0.1, 1e-7);
  EXPECT_EQ(opt.state()[0].tensor[0].item<float>(), 0.0f);
  EXPECT_EQ(opt.state()[0].tensor.sizes(), (at::IntArrayRef{2}));
}

TEST(FusedOptimizer, RowWiseAdagradWeightDecayModes) {
  const double lr = 0.1, wd = 0.5;
  {  // L2: the decayed gradient g + wd*w enters the momentum and the step.
    OneRow t;
    FusedOptimizerConfig c{FusedOptimizerType::kRowWiseAdagrad, lr, 1e-8, 0.9, 0.999, wd, WeightDecayMode::kL2};
    FusedOptimizer opt(c, 2, 2);
    opt.apply(t.weight, t.grads);
    const double g0 = 0.2 + wd * 1.0, g1 = 0.4 + wd * 2.0;
    const double m = (g0 * g0 + g1 * g1) / 2;
    const double mult = lr / (std::sqrt(m) + 1e-8);
    EXPECT_NEAR(t.weight[1][0].item<double>(), 1.0 - mult * g0, 1e-6);
    EXPECT_NEAR(t.weight[1][1].item<double>(), 2.0 - mult * g1, 1e-6);
  }
  {  // Decoupled: w = (1 - lr*wd) w - mult*g, momentum from the raw gradient.
    OneRow t;
    FusedOptimizerConfig c{FusedOptimizerType::kRowWiseAdagrad, lr, 1e-8, 0.9, 0.999, wd, WeightDecayMode::kDecoupled};
    FusedOptimizer opt(c, 2, 2);
    opt.apply(t.weight, t.grads);
    const double mult = lr / (std::sqrt(0.1) + 1e-8);
    EXPECT_NEAR(t.weight[1][0].item<double>(), (1 - lr * wd) * 1.0 - mult * 0.2, 1e-6);
    EXPECT_NEAR(t.weight[1][1].item<double>(), (1 - lr * wd) * 2.0 - mult * 0.4, 1e-6);
  }
}

// The one-pass row-wise kernel against its formula written out in float, element by element,
// in every weight-decay mode, on rows of several widths (a remainder after any vector width).
// The row's mean square is ATen's reduction in both (fused_kernels.h says why).  On libtorch 1.13
// the kernel also gave the bits of the tensor expression it replaced (same digests, same fidelity
// counts); libtorch 2.x evaluates `double / Tensor` differently, so that is not a test.
TEST(FusedOptimizer, RowWiseAdagradKernelComputesItsFormulaExactly) {
  at::manual_seed(7);
  for (const auto mode : {WeightDecayMode::kNone, WeightDecayMode::kL2, WeightDecayMode::kDecoupled}) {
    for (const int64_t dim : {1, 8, 37, 128}) {
      const double lr = 0.03, eps = 1e-8, wd = mode == WeightDecayMode::kNone ? 0.0 : 0.01;
      at::Tensor weight = at::randn({50, dim});
      const at::Tensor rows = at::randperm(50, at::kLong).slice(0, 0, 20);
      const at::Tensor g = at::randn({20, dim});
      const at::Tensor momentum = at::rand({50});
      FusedOptimizer opt({FusedOptimizerType::kRowWiseAdagrad, lr, eps, 0.9, 0.999, wd, mode}, 50, dim);
      opt.state()[0].tensor.copy_(momentum);  // state() shares the optimizer's tensors
      // The formula, in float.
      at::Tensor expected = weight.clone();
      at::Tensor expected_momentum = momentum.clone();
      const bool l2 = mode == WeightDecayMode::kL2;
      const at::Tensor decayed = l2 ? g + wd * weight.index_select(0, rows) : g;
      // FBGEMM's order for the row mean of g^2 (measured against its CPU kernel): each square
      // into lane j % 8, the lanes added pairwise, the total divided by D.
      at::Tensor mean_square = at::empty({rows.numel()}, at::kFloat);
      for (int64_t i = 0; i < rows.numel(); ++i) {
        float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int64_t j = 0; j < dim; ++j) {
          const float x = decayed[i][j].item<float>();
          const float square = x * x;
          lane[j % 8] = lane[j % 8] + square;
        }
        const float total = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        mean_square[i] = total / static_cast<float>(dim);
      }
      const float lr_f = static_cast<float>(lr), eps_f = static_cast<float>(eps), wd_f = static_cast<float>(wd);
      for (int64_t i = 0; i < rows.numel(); ++i) {
        const int64_t r = rows[i].item<int64_t>();
        const float m = expected_momentum[r].item<float>() + mean_square[i].item<float>();
        expected_momentum[r] = m;
        const float mult = lr_f / (std::sqrt(m) + eps_f);
        const float corr = l2                                    ? 1.0f - mult * wd_f
                           : mode == WeightDecayMode::kDecoupled ? static_cast<float>(1.0 - lr * wd)
                                                                 : 1.0f;
        for (int64_t j = 0; j < dim; ++j) {
          expected[r][j] = expected[r][j].item<float>() * corr - mult * g[i][j].item<float>();
        }
      }
      opt.apply(weight, RowGradients{rows, g});
      EXPECT_TRUE(weight.equal(expected)) << "mode " << weight_decay_mode_name(mode) << " dim " << dim << " max diff "
                                          << (weight - expected).abs().max().item<float>();
      EXPECT_TRUE(opt.state()[0].tensor.equal(expected_momentum))
          << "mode " << weight_decay_mode_name(mode) << " dim " << dim;
    }
  }
}

TEST(FusedOptimizer, AdamCountsEveryStepAndLeavesUntouchedRowsAlone) {
  OneRow t;
  FusedOptimizerConfig c;
  c.type = FusedOptimizerType::kAdam;
  c.learning_rate = 0.1;
  c.weight_decay = 0.01;
  FusedOptimizer opt(c, 2, 2);
  const RowGradients none{at::empty({0}, at::kLong), at::empty({0, 2}, at::kFloat)};
  opt.apply(t.weight, none);     // step 1 touches nothing
  opt.apply(t.weight, t.grads);  // step 2
  EXPECT_EQ(opt.step(), 2);
  // m1 = 0.1 g, m2 = 0.001 g^2; corrections use t = 2.
  auto expect = [&](double w, double g) {
    const double m1 = 0.1 * g / (1 - 0.9 * 0.9);
    const double m2 = 0.001 * g * g / (1 - 0.999 * 0.999);
    return w - 0.1 * (m1 / (std::sqrt(m2) + 1e-8) + 0.01 * w);
  };
  EXPECT_NEAR(t.weight[1][0].item<double>(), expect(1.0, 0.2), 1e-5);
  EXPECT_NEAR(t.weight[1][1].item<double>(), expect(2.0, 0.4), 1e-5);
  EXPECT_EQ(t.weight[0][0].item<float>(), 0.5f);  // untouched: no decay either
  EXPECT_EQ(opt.state()[0].tensor[0][0].item<float>(), 0.0f);
}

}  // namespace
}  // namespace dmpcheck::dmp

namespace dmpcheck::dmp {
namespace {

// The dense side's rowwise_adagrad: torchrec.optim.RowWiseAdagrad over a matrix (one accumulator
// per row, mean(g^2)), torch.optim.Adagrad over a vector; before 0.8.0 the row's mean gradient.
TEST(DenseOptimizer, RowWiseAdagradKeepsOneAccumulatorPerRowAndAdagradForVectors) {
  for (const bool mean_gradient : {false, true}) {
    at::Tensor w = at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2});
    at::Tensor b = at::tensor({0.5f, -0.5f});
    DenseOptimizerConfig config;
    config.type = DenseOptimizerType::kRowWiseAdagrad;
    config.learning_rate = 0.1;
    config.eps = 1e-8;
    config.rowwise_mean_gradient = mean_gradient;
    DenseOptimizer optimizer(config, {{"w", w}, {"b", b}});
    ASSERT_EQ(optimizer.state().size(), 2u);  // both exist, zero, before the first step
    w.mutable_grad() = at::tensor({3.0f, 1.0f, 0.0f, -2.0f}).reshape({2, 2});
    b.mutable_grad() = at::tensor({2.0f, 0.0f});
    optimizer.step();
    std::map<std::string, at::Tensor> state;
    for (const auto& s : optimizer.state()) state[s.name] = s.tensor;
    // Row 0: g = [3, 1]; row 1: g = [0, -2].
    const at::Tensor sum = mean_gradient ? at::tensor({4.0f, 1.0f}) : at::tensor({5.0f, 2.0f});
    EXPECT_TRUE(state.at("w.sum").allclose(sum.reshape({2, 1})));
    const at::Tensor step = mean_gradient ? at::tensor({2.0f, 2.0f, -1.0f, -1.0f}).reshape({2, 2})
                                          : at::tensor({3.0f, 1.0f, 0.0f, -2.0f}).reshape({2, 2});
    const at::Tensor expected =
        at::tensor({1.0f, 2.0f, 3.0f, 4.0f}).reshape({2, 2}) - 0.1 * step / sum.sqrt().reshape({2, 1});
    EXPECT_TRUE(w.allclose(expected)) << w;
    EXPECT_TRUE(state.at("b.sum").allclose(at::tensor({4.0f, 0.0f})));
    EXPECT_TRUE(b.allclose(at::tensor({0.4f, -0.5f})));
  }
}

}  // namespace
}  // namespace dmpcheck::dmp
