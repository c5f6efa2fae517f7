#include "common/error.h"
#include "dmp/optim/fused_optimizer.h"
#include "scenario/scenario.h"

namespace dmpcheck::scenario {

dmp::PlannerInput planner_input(const RunSpec& run, int local_world_size) {
  dmp::PlannerInput input;
  input.tables = run.model.tables;
  input.constraints = run.constraints;
  input.topology = {run.world_size, local_world_size > 0 ? local_world_size : run.ranks_per_host(),
                    run.memory_per_rank};
  const dmp::FusedOptimizerConfig sparse = run.sparse_optimizer;
  input.state_bytes = [sparse](int64_t rows, int64_t cols) {
    return dmp::FusedOptimizer::state_bytes(sparse, rows, cols);
  };
  input.state_multiplier = [type = sparse.type](const dmp::EmbeddingBagConfig& t) {
    switch (type) {
      case dmp::FusedOptimizerType::kSgd: return 0.0;
      case dmp::FusedOptimizerType::kAdagrad: return 1.0;
      case dmp::FusedOptimizerType::kAdam: return 2.0;
      case dmp::FusedOptimizerType::kRowWiseAdagrad: return 1.0 / static_cast<double>(t.embedding_dim);
    }
    return 0.0;
  };
  return input;
}

RunSpec resumed_run(const RunSpec& run) {
  DMP_CHECK(run.resume.has_value(), ErrorKind::kInternal, "run '{}' has no resume", run.name);
  RunSpec resumed = run;
  resumed.world_size = run.resume->world_size;
  resumed.local_world_size = 0;
  resumed.batch_size = run.batch_size * run.world_size / resumed.world_size;
  for (const auto& [table, c] : run.resume->constraints) resumed.constraints[table] = c;
  return resumed;
}

}  // namespace dmpcheck::scenario
