#include "comm/gloo/gloo_communicator.h"

#include <numeric>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include "comm/collectives.h"
#include "comm/store.h"
#include "comm/store_impl.h"
#include "common/error.h"

namespace dmpcheck::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  DMP_INTERNAL_ASSERT(false, "unknown reduce op");
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(Store& store, int rank, int world_size, const GlooOptions& options)
      : rank_(rank), world_size_(world_size), timeout_(options.timeout) {
    try {
      auto pg_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
      pg_options->devices.push_back(options.interface.empty()
                                        ? c10d::ProcessGroupGloo::createDeviceForHostname(options.hostname)
                                        : c10d::ProcessGroupGloo::createDeviceForInterface(options.interface));
      pg_options->threads = options.threads;
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store.impl().store, rank, world_size, pg_options);
#if TORCH_VERSION_MAJOR >= 2
      // libtorch 2.x: ProcessGroupGloo is a Backend; c10d::broadcast_coalesced wants the
      // ProcessGroup that wraps it.
      group_ = c10::make_intrusive<c10d::ProcessGroup>(store.impl().store, rank, world_size);
      group_->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
      group_->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, pg_);
#endif
    } catch (const std::exception& e) {
      throw_error(
          ErrorKind::kCommunication,
          fmt::format("rank {}: Gloo process group of {} ranks could not be created: {}", rank, world_size, e.what()));
    }
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  void broadcast(at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    options.timeout = timeout_;
    wait("broadcast", shape(tensor), [&] { return pg_->broadcast(tensors, options); });
  }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(op);
    options.timeout = timeout_;
    wait("all_reduce", shape(tensor), [&] { return pg_->allreduce(tensors, options); });
  }

  std::vector<at::Tensor> all_gather(const at::Tensor& input) override {
    std::vector<at::Tensor> inputs{input.contiguous()};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < world_size_; ++r) outputs[0].push_back(at::empty_like(inputs[0]));
    c10d::AllgatherOptions options;
    options.timeout = timeout_;
    wait("all_gather", shape(input), [&] { return pg_->allgather(outputs, inputs, options); });
    return outputs[0];
  }

  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& input_splits,
                        const std::vector<int64_t>& output_splits) override {
    DMP_INTERNAL_ASSERT(
        static_cast<int>(input_splits.size()) == world_size_ && static_cast<int>(output_splits.size()) == world_size_,
        "all_to_all needs one split per rank");
    auto sizes = input.sizes().vec();
    sizes[0] = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
    at::Tensor in = input.contiguous();
    at::Tensor out = at::empty(sizes, input.options());
    std::vector<int64_t> in_splits = input_splits;
    std::vector<int64_t> out_splits = output_splits;
    c10d::AllToAllOptions options;
    options.timeout = timeout_;
    wait("all_to_all",
         fmt::format("{} -> {}, splits in [{}] out [{}]", shape(input), shape(out), fmt::join(in_splits, ","),
                     fmt::join(out_splits, ",")),
         [&] { return pg_->alltoall_base(out, in, out_splits, in_splits, options); });
    return out;
  }

  // ProcessGroupGloo in 1.13 has no reduce_scatter; see collectives.h.
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op) override {
    return reduce_scatter_via_all_to_all(*this, input, op);
  }

  bool has_framework_broadcast_coalesced() const override { return true; }
  bool framework_broadcast_coalesced(const std::vector<at::Tensor>& tensors, int64_t bucket_cap_bytes,
                                     int root) override {
    at::NoGradGuard no_grad;
    int64_t bytes = 0;
    for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
    wait("c10d::broadcast_coalesced", fmt::format("{} tensors, {} bytes", tensors.size(), bytes), [&] {
#if TORCH_VERSION_MAJOR >= 2
      c10d::broadcast_coalesced(group_, tensors, static_cast<size_t>(bucket_cap_bytes), root);
#else
      c10d::broadcast_coalesced(pg_, tensors, static_cast<size_t>(bucket_cap_bytes), root);
#endif
      return c10::intrusive_ptr<c10d::Work>();
    });
    return true;
  }

  void barrier() override {
    c10d::BarrierOptions options;
    options.timeout = timeout_;
    wait("barrier", "", [&] { return pg_->barrier(options); });
  }

 private:
  static std::string shape(const at::Tensor& t) {
    return fmt::format("{}[{}]", std::string(c10::toString(t.scalar_type())), fmt::join(t.sizes(), ","));
  }

  // Wraps every c10d call: adds rank, operation and sequence number, and sorts timeouts from
  // other failures.
  template <typename Issue>
  void wait(const char* operation, const std::string& shapes, Issue&& issue) {
    ++sequence_;
    try {
      auto work = issue();
      if (work) work->wait(timeout_);
    } catch (const std::exception& e) {
      const std::string what = e.what();
      const bool timed_out = what.find("imed out") != std::string::npos || what.find("imeout") != std::string::npos;
      throw_error(timed_out ? ErrorKind::kTimeout : ErrorKind::kCommunication,
                  fmt::format("rank {}: gloo {} #{} of {} failed after up to {} ms: {}", rank_, operation, sequence_,
                              shapes.empty() ? std::string("no tensors") : shapes, timeout_.count(),
                              what.substr(0, what.find('\n'))));
    }
  }

  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  uint64_t sequence_ = 0;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
#endif
};

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int world_size,
                                                     const GlooOptions& options) {
  return std::make_unique<GlooCommunicator>(store, rank, world_size, options);
}

}  // namespace dmpcheck::comm
