// Helpers shared by the communicators: names, and collectives composed from others.
#pragma once

#include <ATen/core/Tensor.h>

#include "comm/communicator.h"

namespace dmpcheck::comm {

// reduce_scatter as one all_to_all of equal chunks followed by a local reduction in rank order
// (for backends without a native one: Gloo in libtorch 1.13).  Moves (n-1)/n of the input per
// rank, as a ring reduce-scatter does, so its bus bandwidth is comparable.
at::Tensor reduce_scatter_via_all_to_all(Communicator& comm, const at::Tensor& input, ReduceOp op);

}  // namespace dmpcheck::comm
