#include "comm/collectives.h"

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::comm {

namespace {

// Reduces dim 0 of `stacked` ([world, ...]) with `op`, in index order.
at::Tensor reduce_stacked(const at::Tensor& stacked, ReduceOp op) {
  at::Tensor out = stacked[0].clone();
  for (int64_t r = 1; r < stacked.size(0); ++r) {
    switch (op) {
      case ReduceOp::kSum: out.add_(stacked[r]); break;
      case ReduceOp::kMax: out = at::maximum(out, stacked[r]); break;
      case ReduceOp::kMin: out = at::minimum(out, stacked[r]); break;
    }
  }
  return out;
}

}  // namespace

at::Tensor reduce_scatter_via_all_to_all(Communicator& comm, const at::Tensor& input, ReduceOp op) {
  const int world = comm.world_size();
  DMP_CHECK(input.dim() >= 1 && input.size(0) % world == 0, ErrorKind::kInvalidInput,
            "reduce_scatter needs dim 0 divisible by the world size {}, got {} rows", world,
            input.dim() >= 1 ? input.size(0) : 0);
  const int64_t rows = input.size(0) / world;
  const std::vector<int64_t> splits(static_cast<size_t>(world), rows);
  const at::Tensor received = comm.all_to_all(input, splits, splits);  // chunk `rank` from every rank
  auto sizes = input.sizes().vec();
  sizes[0] = rows;
  sizes.insert(sizes.begin(), world);
  return reduce_stacked(received.view(sizes), op);
}

}  // namespace dmpcheck::comm
