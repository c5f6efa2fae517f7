#include "check/unsharded_model.h"

#include <cmath>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "comm/communicator.h"
#include "dmp/model_parallel.h"
#include "dmp/planner.h"
#include "unit/loopback_communicator.h"

namespace dmpcheck::check {
namespace {

dmp::ModelConfig model() {
  dmp::ModelConfig m;
  m.tables = {{"a", 11, 4, {"fa"}, dmp::PoolingType::kSum}, {"b", 7, 4, {"fb"}, dmp::PoolingType::kMean}};
  m.dense_layers = {3, 1};
  return m;
}

// Bags of 0-3 ids with many repeats (ids < 5), the same for both features' shapes.
dmp::KeyedJaggedTensor batch(at::Generator& g) {
  const at::Tensor lengths = at::randint(0, 4, {12}, g, at::kLong);  // 6 bags per feature
  const at::Tensor values = at::randint(0, 5, {lengths.sum().item<int64_t>()}, g, at::kLong);
  return dmp::KeyedJaggedTensor({"fa", "fb"}, values, lengths);
}

dmp::ShardingPlan one_rank_plan(const dmp::ModelConfig& m) {
  dmp::PlannerInput planner;
  planner.tables = m.tables;
  planner.topology = {1, 1, 0};
  for (const auto& t : m.tables) planner.constraints[t.name].sharding_types = {dmp::ShardingType::kTableWise};
  return dmp::plan_sharding(planner);
}

// Trains the DMP (one rank) and the unsharded model side by side; returns the largest excess of
// |difference| over the global-model check's default tolerance (1e-6 + 1e-5 * |unsharded|) over
// every tensor and step (<= 0: within it), or NaN when their tensor names differ.
double worst_difference(dmp::DmpOptions options, int steps, std::string* worst_name = nullptr) {
  auto comm = comm::make_loopback_communicator();
  at::Generator init = at::make_generator<at::CPUGeneratorImpl>(3);
  dmp::DistributedModelParallel dmp(*comm, model(), one_rank_plan(model()), init, options);
  UnshardedModel oracle(model(), options.sparse_optimizer, options.dense_optimizer, dmp.gather_full_state(), 0);
  at::Generator data = at::make_generator<at::CPUGeneratorImpl>(7);
  double worst = -1;
  for (int s = 0; s < steps; ++s) {
    const dmp::KeyedJaggedTensor b = batch(data);
    dmp.train_step(b);
    oracle.train_step(b);
    const auto expected = oracle.state();
    for (const auto& [name, actual] : dmp.gather_full_state()) {
      auto it = expected.find(name);
      if (it == expected.end()) return std::nan("");
      const at::Tensor excess = (actual - it->second).abs() - (1e-6 + 1e-5 * it->second.abs());
      if (excess.max().item<double>() > worst) {
        worst = excess.max().item<double>();
        if (worst_name) *worst_name = name + " at step " + std::to_string(s + 1);
      }
    }
  }
  return worst;
}

TEST(UnshardedModel, TracksTheReferenceDmpOnOneRankWithEveryOptimizer) {
  for (auto type : {dmp::FusedOptimizerType::kSgd, dmp::FusedOptimizerType::kAdagrad,
                    dmp::FusedOptimizerType::kRowWiseAdagrad, dmp::FusedOptimizerType::kAdam}) {
    dmp::DmpOptions options;
    options.profile = *dmp::find_behaviour_profile("current");
    options.sparse_optimizer.type = type;
    // Adam's step is lr * m / sqrt(v) whatever the gradient's size: at 0.1 the last-bit differences
    // of a near-zero gradient move a weight by more than the tolerance; 0.01 is Adam's usual scale.
    options.sparse_optimizer.learning_rate = type == dmp::FusedOptimizerType::kAdam ? 0.01 : 0.1;
    options.dense_optimizer.type = dmp::DenseOptimizerType::kAdam;
    options.dense_optimizer.learning_rate = 0.01;
    std::string where;
    const double worst = worst_difference(options, 4, &where);
    EXPECT_FALSE(std::isnan(worst)) << dmp::fused_optimizer_name(type)
                                    << ": the two models name their tensors differently";
    EXPECT_LE(worst, 0.0) << dmp::fused_optimizer_name(type) << ": " << where;
  }
}

TEST(UnshardedModel, TellsPerOccurrenceUpdatesFromExactOnes) {
  // The check can fail: a DMP that updates a row once per occurrence (#1298's switch) leaves the
  // exact semantics the unsharded model keeps, on batches with repeated ids.
  dmp::DmpOptions options;
  options.profile = *dmp::find_behaviour_profile("torchrec#1298");
  options.sparse_optimizer.type = dmp::FusedOptimizerType::kAdagrad;
  options.sparse_optimizer.learning_rate = 0.1;
  EXPECT_GT(worst_difference(options, 2), 1e-4);  // far outside the tolerance
}

}  // namespace
}  // namespace dmpcheck::check
