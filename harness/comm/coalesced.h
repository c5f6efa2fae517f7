// Broadcast of many tensors from one root, coalesced into flat buckets (as DDP's
// _broadcast_coalesced does): one collective per bucket instead of one per tensor.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace dmpcheck::comm {

class Communicator;

struct CoalescedBroadcastOptions {
  int root = 0;
  // Tensors are packed in order into buckets of at most this many bytes (a tensor larger than
  // the cap gets a bucket of its own).  0 means one broadcast per tensor, no flattening.
  int64_t bucket_cap_bytes = 25 * 1024 * 1024;
};

struct CoalescedBroadcastStats {
  int64_t bytes = 0;  // payload bytes broadcast
  int64_t tensors = 0;
  int64_t collectives = 0;  // broadcasts issued (buckets)
  double seconds = 0.0;     // this rank's wall time, flatten and copy-back included
};

// Collective: every rank passes tensors of identical shapes and dtypes in the same order.
// Tensors are overwritten in place with the root's values.
CoalescedBroadcastStats broadcast_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors,
                                            const CoalescedBroadcastOptions& options);

// Collective: sums `tensors` over ranks in place, then divides by world size (DDP's gradient
// averaging), packed into buckets of at most `bucket_cap_bytes`.
void all_reduce_mean_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int64_t bucket_cap_bytes);

}  // namespace dmpcheck::comm
