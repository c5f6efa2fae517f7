// Global-model equivalence: the unsharded model, started from the sharded model's initial
// weights and trained on the global batches in one process, must end where the sharded model
// ended, within the scenario's tolerance.  The unsharded model runs through the same DMP code
// on a one-rank loopback world with every table table_wise on rank 0: the reference differs
// from the subject in sharding and communication, and in nothing else.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "dmp/keyed_jagged_tensor.h"
#include "dmp/model_parallel.h"

namespace dmpcheck::check {

struct GlobalModelInput {
  dmp::ModelConfig model;
  dmp::DmpOptions options;
  std::map<std::string, at::Tensor> initial_weights;  // full tensors, from gather_full_weights()
  std::map<std::string, at::Tensor> final_weights;    // the sharded model's, after the last step
  int steps = 0;
  std::function<dmp::KeyedJaggedTensor(int step)> global_batch;
  double rtol = 1e-5;
  double atol = 1e-6;
};

// Runs the unsharded model and compares every weight.  Not collective.
std::vector<GlobalModelCheck> compare_with_global_model(const GlobalModelInput& input);

}  // namespace dmpcheck::check
