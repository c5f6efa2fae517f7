#include "comm/coalesced.h"

#include <chrono>
#include <functional>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "comm/communicator.h"

namespace dmpcheck::comm {
namespace {

// Packs `tensors` in order into buckets of one dtype and at most `cap` bytes (cap <= 0: one
// tensor per bucket), hands each bucket's flat buffer to `collective`, and copies the result
// back into the tensors.  A broadcast needs only half of that: the root's values go in and do
// not change, the others' are overwritten, so `pack` is false on receivers (the buffer is
// allocated, not filled) and `unpack` false on the root.  Returns the number of buckets.
int64_t for_each_bucket(const std::vector<at::Tensor>& tensors, int64_t cap,
                        const std::function<void(at::Tensor&)>& collective, bool pack = true, bool unpack = true) {
  at::NoGradGuard no_grad;  // parameters are leaves that require grad; these copies are not training
  int64_t buckets = 0;
  std::vector<at::Tensor> bucket;
  int64_t bucket_bytes = 0;
  auto flush = [&] {
    if (bucket.empty()) return;
    ++buckets;
    if (bucket.size() == 1 && bucket[0].is_contiguous()) {
      at::Tensor t = bucket[0];
      collective(t);
    } else {
      at::Tensor flat;
      if (pack) {
        std::vector<at::Tensor> flat_views;
        for (const auto& t : bucket) flat_views.push_back(t.reshape({-1}));
        flat = at::cat(flat_views);
      } else {
        flat = at::empty({bucket_bytes / static_cast<int64_t>(bucket[0].element_size())}, bucket[0].options());
      }
      collective(flat);
      if (unpack) {
        int64_t offset = 0;
        for (const auto& t : bucket) {
          t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
          offset += t.numel();
        }
      }
    }
    bucket.clear();
    bucket_bytes = 0;
  };
  for (const auto& t : tensors) {
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    const bool other_dtype = !bucket.empty() && bucket.front().scalar_type() != t.scalar_type();
    if (other_dtype || (!bucket.empty() && bucket_bytes + bytes > cap)) flush();
    bucket.push_back(t);
    bucket_bytes += bytes;
    if (cap <= 0) flush();
  }
  flush();
  return buckets;
}

}  // namespace

CoalescedBroadcastStats broadcast_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors,
                                            const CoalescedBroadcastOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  CoalescedBroadcastStats stats;
  for (const auto& t : tensors) stats.bytes += t.numel() * static_cast<int64_t>(t.element_size());
  stats.tensors = static_cast<int64_t>(tensors.size());
  const bool root = comm.rank() == options.root;
  stats.collectives = for_each_bucket(
      tensors, options.bucket_cap_bytes, [&](at::Tensor& flat) { comm.broadcast(flat, options.root); },
      /*pack=*/root, /*unpack=*/!root);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return stats;
}

void all_reduce_mean_coalesced(Communicator& comm, const std::vector<at::Tensor>& tensors, int64_t bucket_cap_bytes) {
  // DDP's arithmetic: each gradient times 1/world_size (rounded to the gradient's type) into the
  // bucket, then the sum; dividing the sum instead differs in the last bit for world sizes that
  // are not powers of two.
  const double scale = 1.0 / comm.world_size();
  for_each_bucket(tensors, bucket_cap_bytes, [&](at::Tensor& flat) {
    flat.mul_(scale);
    comm.all_reduce(flat, ReduceOp::kSum);
  });
}

}  // namespace dmpcheck::comm
