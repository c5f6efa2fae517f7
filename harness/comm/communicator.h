// The collective interface everything above comm/ talks to.  Only comm/ includes c10d or nccl.h.
//
// Contract for every collective below: it is called by every rank of the group, in the same
// order, with matching shapes; it returns when the result is in place on this rank; it fails
// with Error(kTimeout) when the collective does not complete within timeout(), and with
// Error(kCommunication) when the backend reports an error.  Tensors are CPU tensors here; a
// backend that computes elsewhere (NCCL) stages them itself.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dmpcheck::comm {

enum class ReduceOp { kSum, kMax, kMin };

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // Overwrites `tensor` on every rank with root's values.
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // In place: every rank ends with the reduction of all ranks' `tensor`.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // Every rank passes a tensor of the same shape and dtype; returns world_size tensors, rank order.
  virtual std::vector<at::Tensor> all_gather(const at::Tensor& input) = 0;
  // Splits are along dim 0: input_splits[r] rows go to rank r, output_splits[r] rows come from r.
  // Every rank's input_splits[r] must equal rank r's output_splits[this rank].
  virtual at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                                const std::vector<int64_t>& output_splits) = 0;
  // Dim 0 of `input` is world_size equal chunks; returns chunk `rank()` reduced over all ranks.
  virtual at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op) = 0;
  virtual void barrier() = 0;

  // Seconds the last collective took on the device, staging copies excluded, where the backend
  // can time that apart from the host's wall clock (NCCL: CUDA events on its stream).
  virtual std::optional<double> last_device_seconds() const { return std::nullopt; }
  // The framework's own coalesced broadcast (c10d::broadcast_coalesced), as a baseline for ours.
  // Returns false, and does nothing, where the backend has none.
  virtual bool has_framework_broadcast_coalesced() const { return false; }
  virtual bool framework_broadcast_coalesced(const std::vector<at::Tensor>& /*tensors*/, int64_t /*bucket_cap_bytes*/,
                                             int /*root*/) {
    return false;
  }
};

}  // namespace dmpcheck::comm
