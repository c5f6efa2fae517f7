#include "check/broadcast_probe.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <tuple>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include "comm/coalesced.h"
#include "comm/communicator.h"
#include "common/error.h"

namespace dmpcheck::check {
namespace {

using Clock = std::chrono::steady_clock;

// Forwards to `inner` and adds up the device time its broadcasts report (NCCL's CUDA events),
// so that a coalesced broadcast's collectives can be timed apart from its copies.
class DeviceTimeAccumulator final : public comm::Communicator {
 public:
  explicit DeviceTimeAccumulator(comm::Communicator& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::string backend_name() const override { return inner_.backend_name(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }
  void broadcast(at::Tensor& tensor, int root) override {
    inner_.broadcast(tensor, root);
    if (auto seconds = inner_.last_device_seconds()) {
      device_seconds_ += *seconds;
      timed_ = true;
    }
  }
  void all_reduce(at::Tensor& tensor, comm::ReduceOp op) override { inner_.all_reduce(tensor, op); }
  std::vector<at::Tensor> all_gather(const at::Tensor& input) override { return inner_.all_gather(input); }
  at::Tensor all_to_all(const at::Tensor& input, const std::vector<int64_t>& in,
                        const std::vector<int64_t>& out) override {
    return inner_.all_to_all(input, in, out);
  }
  at::Tensor reduce_scatter(const at::Tensor& input, comm::ReduceOp op) override {
    return inner_.reduce_scatter(input, op);
  }
  void barrier() override { inner_.barrier(); }

  // The device time added up since the last take, if a broadcast reported one; then starts anew.
  std::optional<double> take_device_seconds() {
    const auto seconds = timed_ ? std::optional<double>(device_seconds_) : std::nullopt;
    device_seconds_ = 0.0;
    timed_ = false;
    return seconds;
  }

 private:
  comm::Communicator& inner_;
  double device_seconds_ = 0.0;
  bool timed_ = false;
};

int64_t byte_size(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

// Buckets c10d::broadcast_coalesced makes: per dtype, a bucket closes once it reaches the cap.
int64_t framework_buckets(const std::vector<at::Tensor>& tensors, int64_t cap) {
  std::map<at::ScalarType, int64_t> open;  // dtype -> bytes in its open bucket
  int64_t closed = 0;
  for (const auto& t : tensors) {
    int64_t& bytes = open[t.scalar_type()];
    bytes += byte_size(t);
    if (bytes >= cap) {
      ++closed;
      bytes = 0;
    }
  }
  for (const auto& [type, bytes] : open) closed += bytes > 0 ? 1 : 0;
  return closed;
}

std::string caption(const BroadcastMethodCost& m) {
  if (m.method == "coalesced" || m.method == "framework") {
    return fmt::format("{} {} MiB", m.method, static_cast<double>(m.bucket_cap_bytes) / (1 << 20));
  }
  return m.method;
}

}  // namespace

std::vector<double> max_over_ranks(comm::Communicator& comm, const std::vector<double>& samples) {
  if (samples.empty()) return {};
  at::Tensor t = at::tensor(samples, at::kDouble);
  comm.all_reduce(t, comm::ReduceOp::kMax);
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

std::pair<LatencyStats, std::optional<LatencyStats>> time_iterations(
    comm::Communicator& comm, int warmup, int iterations, const std::function<void()>& op,
    const std::function<std::optional<double>()>& device_seconds) {
  std::vector<double> host;
  std::vector<double> device;
  for (int i = 0; i < warmup + iterations; ++i) {
    comm.barrier();
    const auto start = Clock::now();
    op();
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    const std::optional<double> on_device = device_seconds();
    if (i < warmup) continue;
    host.push_back(seconds);
    if (on_device) device.push_back(*on_device);
  }
  const LatencyStats times = latency_stats(max_over_ranks(comm, host));
  // Every rank of a backend reports device time or none does, so this stays collective.
  if (device.empty() || device.size() != host.size()) return {times, std::nullopt};
  return {times, latency_stats(max_over_ranks(comm, device))};
}

LatencyStats latency_stats(std::vector<double> samples) {
  LatencyStats s;
  if (samples.empty()) return s;
  std::sort(samples.begin(), samples.end());
  const auto n = samples.size();
  auto nearest_rank = [&](double p) {
    const auto rank = static_cast<size_t>(std::ceil(p * static_cast<double>(n)));
    return samples[std::min(n, std::max<size_t>(rank, 1)) - 1];
  };
  s.min_s = samples.front();
  s.max_s = samples.back();
  s.p50_s = nearest_rank(0.50);
  s.p99_s = nearest_rank(0.99);
  double sum = 0.0;
  for (double v : samples) sum += v;
  s.mean_s = sum / static_cast<double>(n);
  return s;
}

BroadcastProbe probe_broadcast(comm::Communicator& comm, const std::vector<at::Tensor>& tensors,
                               const ProbeOptions& options, const std::function<void(const std::string&)>& progress) {
  DMP_CHECK(options.iterations >= 1 && options.warmup >= 0, ErrorKind::kInvalidInput,
            "the broadcast probe needs at least 1 iteration and no negative warm-up (got {} and {})",
            options.iterations, options.warmup);
  at::NoGradGuard no_grad;
  BroadcastProbe probe;
  probe.performed = true;
  probe.backend = comm.backend_name();
  probe.world_size = comm.world_size();
  probe.warmup = options.warmup;
  probe.iterations = options.iterations;
  std::vector<at::Tensor> copies;
  for (const auto& t : tensors) {
    copies.push_back(t.detach().clone());
    probe.bytes += byte_size(t);
  }
  probe.tensors = static_cast<int64_t>(tensors.size());
  if (copies.empty()) return probe;
  DeviceTimeAccumulator timed(comm);

  // Runs `op` warmup + iterations times, each after a barrier, and records the method's cost.
  auto measure = [&](const char* method, int64_t cap, const std::function<int64_t()>& op) {
    BroadcastMethodCost cost;
    cost.method = method;
    cost.bucket_cap_bytes = cap;
    std::tie(cost.end_to_end, cost.device) = time_iterations(
        comm, options.warmup, options.iterations, [&] { cost.collectives = op(); },
        [&] { return timed.take_device_seconds(); });
    cost.algbw_gbps =
        cost.end_to_end.mean_s > 0 ? static_cast<double>(probe.bytes) / cost.end_to_end.mean_s / 1e9 : 0.0;
    cost.busbw_gbps = cost.algbw_gbps;  // broadcast: factor 1
    if (cost.device)
      cost.device_algbw_gbps =
          cost.device->mean_s > 0 ? static_cast<double>(probe.bytes) / cost.device->mean_s / 1e9 : 0.0;
    if (progress) {
      progress(fmt::format("probe {}: {} broadcast(s), mean {:.1f} us, {:.3f} GB/s", caption(cost), cost.collectives,
                           cost.end_to_end.mean_s * 1e6, cost.algbw_gbps));
    }
    probe.methods.push_back(cost);
  };

  // Ours: a cap of 0 is one broadcast per tensor.
  auto coalesced = [&](int64_t cap) {
    return comm::broadcast_coalesced(timed, copies, {options.root, cap}).collectives;
  };
  if (options.per_tensor) measure("per_tensor", 0, [&] { return coalesced(0); });
  for (int64_t cap : options.bucket_caps) measure("coalesced", cap, [&] { return coalesced(cap); });
  if (options.framework) {
    // Every rank runs the same backend, so all skip or none does.
    if (comm.has_framework_broadcast_coalesced()) {
      for (int64_t cap : options.bucket_caps) {
        measure("framework", cap, [&] {
          comm.framework_broadcast_coalesced(copies, cap, options.root);
          return framework_buckets(copies, cap);
        });
      }
    } else {
      probe.note = fmt::format("no framework baseline on {} (c10d::broadcast_coalesced needs a c10d process group)",
                               comm.backend_name());
    }
  }
  if (options.raw) {
    // Written before timing: an untouched buffer would let the root send from the kernel's
    // shared zero page, which stays in cache and made "raw" 25% faster than any real tensor.
    at::Tensor flat = at::empty({probe.bytes}, at::kByte);
    flat.fill_(0x5a);
    measure("raw", 0, [&] {
      timed.broadcast(flat, options.root);
      return int64_t{1};
    });
  }
  return probe;
}

std::string render_probe(const BroadcastProbe& probe) {
  std::string out = fmt::format(
      "broadcast probe: {} tensor(s), {} bytes, {} on {} ranks, {} warm-up + {} timed iteration(s), max over ranks\n",
      probe.tensors, probe.bytes, probe.backend, probe.world_size, probe.warmup, probe.iterations);
  out += fmt::format("{:<20} {:>7} {:>11} {:>11} {:>11} {:>11} {:>11} {:>8} {:>8} {:>11}\n", "method", "bcasts",
                     "time(us)", "min(us)", "p50(us)", "p99(us)", "max(us)", "algbw", "busbw", "device(us)");
  for (const auto& m : probe.methods) {
    out += fmt::format("{:<20} {:>7} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>11.1f} {:>8.3f} {:>8.3f} {:>11}\n",
                       caption(m), m.collectives, m.end_to_end.mean_s * 1e6, m.end_to_end.min_s * 1e6,
                       m.end_to_end.p50_s * 1e6, m.end_to_end.p99_s * 1e6, m.end_to_end.max_s * 1e6, m.algbw_gbps,
                       m.busbw_gbps, m.device ? fmt::format("{:.1f}", m.device->mean_s * 1e6) : std::string("-"));
  }
  out += "  (algbw = bytes / mean time in GB/s, 1 GB = 1e9 bytes; busbw = algbw for broadcast)\n";
  if (!probe.note.empty()) out += fmt::format("  note: {}\n", probe.note);
  // Ratios measured side by side in this one run.
  auto find = [&](const std::string& method, int64_t cap) -> const BroadcastMethodCost* {
    for (const auto& m : probe.methods) {
      if (m.method == method && m.bucket_cap_bytes == cap) return &m;
    }
    return nullptr;
  };
  const BroadcastMethodCost* per_tensor = find("per_tensor", 0);
  const BroadcastMethodCost* raw = find("raw", 0);
  for (const auto& m : probe.methods) {
    if (m.method != "coalesced" || m.end_to_end.mean_s <= 0) continue;
    // By mean (what algbw uses) and by median (steadier on a noisy machine).
    auto ratio = [&](const BroadcastMethodCost& other, const char* what) {
      return fmt::format("{:.2f}x {} (p50 {:.2f}x)", other.end_to_end.mean_s / m.end_to_end.mean_s, what,
                         other.end_to_end.p50_s / m.end_to_end.p50_s);
    };
    std::vector<std::string> ratios;
    if (per_tensor) ratios.push_back(ratio(*per_tensor, "faster than per_tensor"));
    if (raw) ratios.push_back(ratio(*raw, "the throughput of raw"));
    if (const auto* f = find("framework", m.bucket_cap_bytes))
      ratios.push_back(ratio(*f, "the throughput of framework"));
    if (!ratios.empty()) out += fmt::format("  ratio {}: {}\n", caption(m), fmt::join(ratios, ", "));
  }
  return out;
}

}  // namespace dmpcheck::check
