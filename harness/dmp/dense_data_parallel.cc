#include "dmp/dense_data_parallel.h"

#include <limits>

#include <ATen/ATen.h>

#include "comm/communicator.h"

namespace dmpcheck::dmp {

DenseDataParallel::DenseDataParallel(comm::Communicator& comm, DenseMlp& mlp, const DenseOptimizerConfig& optimizer,
                                     const DenseDataParallelOptions& options, std::vector<NamedTensor> also_trained)
    : comm_(comm), mlp_(mlp), options_(options), optimizer_(optimizer, [&] {
        // In TorchRec's named_parameters() order: the tables come before the dense layers.
        std::vector<NamedTensor> all = std::move(also_trained);
        for (const auto& p : mlp.parameters()) all.push_back(p);
        return all;
      }()) {
  if (options_.broadcast_at_wrap)
    comm::broadcast_coalesced(comm_, mlp_.parameter_tensors(), {0, options_.bucket_cap_bytes});
}

std::vector<std::vector<size_t>> DenseDataParallel::buckets(const std::vector<int64_t>& bytes, int64_t step,
                                                            int64_t first_cap, int64_t cap) {
  std::vector<std::vector<size_t>> out;
  if (bytes.empty()) return out;
  if (step <= 2) {
    out.emplace_back();
    for (size_t i = 0; i < bytes.size(); ++i) out.back().push_back(i);
    return out;
  }
  // DDP's assignment: a tensor joins the open bucket, which closes once it holds at least the
  // current limit; the limits run first_cap, then cap.
  std::vector<size_t> open;
  int64_t held = 0;
  for (size_t k = bytes.size(); k-- > 0;) {
    open.push_back(k);
    held += bytes[k];
    if (held >= (out.empty() ? first_cap : cap)) {
      out.push_back(std::move(open));
      open.clear();
      held = 0;
    }
  }
  if (!open.empty()) out.push_back(std::move(open));
  return out;
}

void DenseDataParallel::step() {
  std::vector<at::Tensor> grads;
  std::vector<int64_t> bytes;
  for (const auto& p : mlp_.parameters()) {
    // A parameter that took no part in the loss has no gradient; DDP would treat it as zero.
    if (!p.tensor.grad().defined()) p.tensor.mutable_grad() = at::zeros_like(p.tensor);
    grads.push_back(p.tensor.grad());
    bytes.push_back(grads.back().numel() * static_cast<int64_t>(grads.back().element_size()));
  }
  ++steps_;
  // Each bucket is one flat buffer and one all-reduce: where an element sits in it decides the
  // order in which Gloo's ring adds the ranks' values (visible in the last bit at world size 3).
  for (const auto& bucket : buckets(bytes, steps_, options_.first_bucket_cap_bytes, options_.bucket_cap_bytes)) {
    std::vector<at::Tensor> members;
    for (size_t i : bucket) members.push_back(grads[i]);
    comm::all_reduce_mean_coalesced(comm_, members, std::numeric_limits<int64_t>::max());
  }
  optimizer_.step();
  optimizer_.zero_grad();
}

}  // namespace dmpcheck::dmp
