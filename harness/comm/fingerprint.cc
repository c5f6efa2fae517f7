#include "comm/fingerprint.h"

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::comm {
namespace {

enum Op : int64_t { kBroadcast = 1, kAllReduce, kAllGather, kAllToAll, kBarrier, kReduceScatter, kFrameworkBroadcast };

const char* op_name(int64_t op) {  // in Op's order
  static const char* const kNames[] = {"unknown",    "broadcast", "all_reduce",     "all_gather",
                                       "all_to_all", "barrier",   "reduce_scatter", "framework_broadcast_coalesced"};
  return op >= kBroadcast && op <= kFrameworkBroadcast ? kNames[op] : "unknown";
}

constexpr int64_t kSlots = 12;  // op, sequence, dtype, ndim, up to 8 sizes

class FingerprintingCommunicator final : public Communicator {
 public:
  explicit FingerprintingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}

  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

  void broadcast(at::Tensor& tensor, int root) override {
    check(kBroadcast, tensor);
    inner_->broadcast(tensor, root);
  }
  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check(kAllReduce, tensor);
    inner_->all_reduce(tensor, op);
  }
  std::vector<at::Tensor> all_gather(const at::Tensor& input) override {
    check(kAllGather, input);
    return inner_->all_gather(input);
  }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                        const std::vector<int64_t>& output_splits) override {
    check(kAllToAll, at::Tensor(), /*shape_free=*/true, input.scalar_type());  // splits differ per rank
    return inner_->all_to_all(input, input_splits, output_splits);
  }
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op) override {
    check(kReduceScatter, input);
    return inner_->reduce_scatter(input, op);
  }
  void barrier() override {
    check(kBarrier, at::Tensor(), true);
    inner_->barrier();
  }
  std::optional<double> last_device_seconds() const override { return inner_->last_device_seconds(); }
  bool has_framework_broadcast_coalesced() const override { return inner_->has_framework_broadcast_coalesced(); }
  bool framework_broadcast_coalesced(const std::vector<at::Tensor>& tensors, int64_t bucket_cap_bytes,
                                     int root) override {
    check(kFrameworkBroadcast, at::Tensor(), true);
    return inner_->framework_broadcast_coalesced(tensors, bucket_cap_bytes, root);
  }

 private:
  void check(int64_t op, const at::Tensor& tensor, bool shape_free = false, at::ScalarType dtype = at::kFloat) {
    ++sequence_;
    at::Tensor mine = at::full({kSlots}, -1, at::kLong);
    mine[0] = op;
    mine[1] = sequence_;
    mine[2] = static_cast<int64_t>(tensor.defined() ? tensor.scalar_type() : dtype);
    if (!shape_free && tensor.defined()) {
      mine[3] = tensor.dim();
      for (int64_t d = 0; d < std::min<int64_t>(tensor.dim(), kSlots - 4); ++d) mine[4 + d] = tensor.size(d);
    }
    const auto all = inner_->all_gather(mine);
    for (size_t r = 0; r < all.size(); ++r) {
      if (all[r].equal(all[static_cast<size_t>(rank())])) continue;
      throw_error(ErrorKind::kCommunication,
                  fmt::format("collective mismatch: rank {} is running {}, but rank {} is running {}", rank(),
                              describe(mine), r, describe(all[r])));
    }
  }

  static std::string describe(const at::Tensor& f) {
    const auto* v = f.data_ptr<int64_t>();
    std::vector<int64_t> sizes;
    for (int64_t d = 0; d < std::min<int64_t>(v[3], kSlots - 4); ++d) sizes.push_back(v[4 + d]);
    return fmt::format("{} #{} ({} [{}])", op_name(v[0]), v[1],
                       std::string(c10::toString(static_cast<at::ScalarType>(v[2]))),
                       v[3] < 0 ? std::string("any shape") : fmt::format("{}", fmt::join(sizes, ",")));
  }

  std::unique_ptr<Communicator> inner_;
  int64_t sequence_ = 0;
};

}  // namespace

std::unique_ptr<Communicator> make_fingerprinting_communicator(std::unique_ptr<Communicator> inner) {
  return std::make_unique<FingerprintingCommunicator>(std::move(inner));
}

}  // namespace dmpcheck::comm
