#include "comm/broadcast_bytes.h"

#include <cstring>

#include <ATen/ATen.h>

#include "comm/communicator.h"
#include "common/digest.h"

namespace dmpcheck::comm {

std::string broadcast_bytes(Communicator& comm, const std::string& bytes, int root) {
  at::Tensor size = at::tensor({static_cast<int64_t>(bytes.size())}, at::kLong);
  comm.broadcast(size, root);
  const int64_t n = size.item<int64_t>();
  if (n == 0) return {};
  at::Tensor payload = at::empty({n}, at::kByte);
  if (comm.rank() == root) std::memcpy(payload.data_ptr<uint8_t>(), bytes.data(), static_cast<size_t>(n));
  comm.broadcast(payload, root);
  return std::string(reinterpret_cast<const char*>(payload.data_ptr<uint8_t>()), static_cast<size_t>(n));
}

int first_rank_disagreeing(Communicator& comm, const std::string& text) {
  const auto all = comm.all_gather(at::tensor({static_cast<int64_t>(fnv1a64(text) >> 1)}, at::kLong));
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r].item<int64_t>() != all[0].item<int64_t>()) return static_cast<int>(r);
  }
  return -1;
}

}  // namespace dmpcheck::comm
