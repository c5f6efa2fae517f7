// Plans a small model with the installed library and prints it.
#include <iostream>

#include "dmp/planner.h"

int main() {
  dmpcheck::dmp::PlannerInput input;
  input.topology = {2, 2, 0};
  input.tables = {{"t0", 10, 4, {"f0"}, dmpcheck::dmp::PoolingType::kSum}};
  input.constraints["t0"].sharding_types = {dmpcheck::dmp::ShardingType::kRowWise};
  const auto plan = dmpcheck::dmp::plan_sharding(input);
  std::cout << plan.serialize();
  return plan.of("t0").shards.size() == 2 ? 0 : 1;
}
