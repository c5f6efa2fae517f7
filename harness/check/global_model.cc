#include "check/global_model.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "comm/loopback/loopback_communicator.h"
#include "common/error.h"

namespace dmpcheck::check {

std::vector<GlobalModelCheck> compare_with_global_model(const GlobalModelInput& input) {
  auto comm = comm::make_loopback_communicator();
  dmp::PlannerInput planner;
  planner.tables = input.model.tables;
  planner.world_size = 1;
  for (const auto& t : input.model.tables) {
    planner.constraints[t.name].sharding_types = {dmp::ShardingType::kTableWise};
  }
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(0);  // overwritten below
  dmp::DistributedModelParallel reference(*comm, input.model, dmp::plan_sharding(planner), generator, input.options);
  reference.load_full_weights(input.initial_weights);
  for (int step = 0; step < input.steps; ++step) reference.train_step(input.global_batch(step));

  std::vector<GlobalModelCheck> checks;
  std::map<std::string, at::Tensor> expected;
  for (const auto& s : reference.state()) expected[s.name] = s.tensor;
  for (const auto& [name, actual] : input.final_weights) {
    auto it = expected.find(name);
    DMP_INTERNAL_ASSERT(it != expected.end(), "the unsharded model has no tensor '{}'", name);
    const at::Tensor a = actual.to(at::kDouble);
    const at::Tensor b = it->second.detach().to(at::kDouble);
    const at::Tensor diff = (a - b).abs();
    const at::Tensor excess = diff - (input.atol + input.rtol * b.abs());
    GlobalModelCheck check;
    check.name = name;
    check.numel = a.numel();
    check.max_abs_diff = a.numel() ? diff.max().item<double>() : 0.0;
    check.max_allowed_excess = a.numel() ? excess.max().item<double>() : 0.0;
    check.within_tolerance = !(check.max_allowed_excess > 0.0) && !std::isnan(check.max_abs_diff);
    checks.push_back(check);
  }
  return checks;
}

}  // namespace dmpcheck::check
