#include "unit/loopback_communicator.h"

#include <ATen/ATen.h>

#include "common/error.h"

namespace dmpcheck::comm {
namespace {

class LoopbackCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string backend_name() const override { return "loopback"; }
  std::chrono::milliseconds timeout() const override { return std::chrono::milliseconds(0); }
  void broadcast(at::Tensor&, int root) override {
    DMP_INTERNAL_ASSERT(root == 0, "loopback broadcast from rank {}", root);
  }
  void all_reduce(at::Tensor&, ReduceOp) override {}
  std::vector<at::Tensor> all_gather(const at::Tensor& input) override { return {input.clone()}; }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                        const std::vector<int64_t>& output_splits) override {
    DMP_INTERNAL_ASSERT(input_splits.size() == 1 && output_splits.size() == 1 && input_splits[0] == output_splits[0],
                        "loopback all_to_all with mismatched splits");
    return input.clone();
  }
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp) override { return input.clone(); }
  void barrier() override {}
};

}  // namespace

std::unique_ptr<Communicator> make_loopback_communicator() { return std::make_unique<LoopbackCommunicator>(); }

}  // namespace dmpcheck::comm
