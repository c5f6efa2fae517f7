#include "dmp/dense_data_parallel.h"

#include <ATen/ATen.h>

#include "comm/communicator.h"

namespace dmpcheck::dmp {

DenseDataParallel::DenseDataParallel(comm::Communicator& comm, DenseMlp& mlp,
                                     const DenseOptimizerConfig& optimizer,
                                     const DenseDataParallelOptions& options, std::vector<NamedTensor> also_trained)
    : comm_(comm), mlp_(mlp), options_(options), optimizer_(optimizer, [&] {
        // In TorchRec's named_parameters() order: the tables come before the dense layers.
        std::vector<NamedTensor> all = std::move(also_trained);
        for (const auto& p : mlp.parameters()) all.push_back(p);
        return all;
      }()) {
  if (options_.broadcast_at_wrap) {
    comm::CoalescedBroadcastOptions bopts;
    bopts.root = 0;
    bopts.bucket_cap_bytes = options_.bucket_cap_bytes;
    wrap_broadcast_ = comm::broadcast_coalesced(comm_, mlp_.parameter_tensors(), bopts);
  }
}

void DenseDataParallel::step() {
  std::vector<at::Tensor> grads;
  for (const auto& p : mlp_.parameters()) {
    // A parameter that took no part in the loss has no gradient; DDP would treat it as zero.
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    grads.push_back(p.tensor.grad());
  }
  comm::all_reduce_mean_coalesced(comm_, grads, options_.bucket_cap_bytes);
  optimizer_.step();
  optimizer_.zero_grad();
}

}  // namespace dmpcheck::dmp
