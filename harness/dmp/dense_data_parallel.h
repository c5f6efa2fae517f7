// A DDP-like wrapper for the dense parameters: when wrapped, rank 0's parameters are broadcast
// to every rank (DDP's constructor does the same); after each backward the gradients are
// averaged by bucketed all-reduce, in DDP's buckets; then a libtorch optimizer steps.
#pragma once

#include <map>
#include <memory>
#include <vector>

#include "comm/coalesced.h"
#include "dmp/dense.h"
#include "dmp/optim/dense_optimizer.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::dmp {

struct DenseDataParallelOptions {
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;        // DDP's default bucket_cap_mb=25
  int64_t first_bucket_cap_bytes = 25 * 1024 * 1024;  // of the buckets rebuilt in backward order
  bool broadcast_at_wrap = true;
};

class DenseDataParallel {
 public:
  // Collective (broadcasts).  `mlp` must outlive the wrapper.  `also_trained`: more tensors the
  // optimizer steps (data-parallel tables in TorchRec's behaviour) whose .grad their owner has
  // already averaged over ranks; they are not broadcast here.
  DenseDataParallel(comm::Communicator& comm, DenseMlp& mlp, const DenseOptimizerConfig& optimizer,
                    const DenseDataParallelOptions& options, std::vector<NamedTensor> also_trained = {});

  // Collective: average gradients over ranks (each scaled by 1/world_size, then summed, as DDP
  // does), then the optimizer step, then zero the grads.
  void step();

  // The gradient buckets of step `step` (1-based), as indices into the parameters in
  // registration order.  TorchRec's DDP (static_graph=True) reduces the first two steps in one
  // bucket in registration order, then rebuilds its buckets in the order the gradients became
  // ready: for an MLP the reverse of registration, cut where a bucket reaches its cap (the first
  // bucket's cap, then bucket_cap_bytes).  Measured on torchrec 0.6.0 and 1.9.2 with a comm hook.
  static std::vector<std::vector<size_t>> buckets(const std::vector<int64_t>& bytes, int64_t step, int64_t first_cap,
                                                  int64_t cap);
  std::vector<NamedTensor> optimizer_state() const { return optimizer_.state(); }
  void load_optimizer_state(const std::map<std::string, at::Tensor>& state, int64_t steps) {
    optimizer_.load_state(state, steps);
  }

 private:
  comm::Communicator& comm_;  // owned by the worker, outlives the model
  DenseMlp& mlp_;
  DenseDataParallelOptions options_;
  DenseOptimizer optimizer_;
  int64_t steps_ = 0;
};

}  // namespace dmpcheck::dmp
