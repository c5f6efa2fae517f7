// Replica equality: every replicated tensor is all-gathered and compared bitwise with rank 0's
// copy.  Every rank computes the same verdict from the same gathered data (nccl-tests'
// "agreed by all ranks").
#pragma once

#include <string>
#include <vector>

#include "check/run_result.h"
#include "dmp/model_parallel.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::check {

// Collective.  `tensors` are this rank's replicated tensors; every rank must hold the same
// names, shapes and dtypes (checked first: Error(kInternal) names the first mismatch).
std::vector<TensorCheck> check_replicas(comm::Communicator& comm, const std::vector<dmp::StateTensor>& tensors,
                                        scenario::Phase phase);

// Compares a tensor set across ranks bitwise: the pure core of check_replicas, for tests.
TensorCheck compare_copies(const std::string& name, const std::string& sharding, scenario::Phase phase,
                           const std::vector<at::Tensor>& copies);

// How many of `checks` differ across ranks and the largest |diff|, as the divergence of one step.
StepDivergence step_divergence(int step, const std::vector<TensorCheck>& checks);

}  // namespace dmpcheck::check
