// What the rank-0 broadcast of replicated state costs, measured the way nccl-tests measures:
// warm-up, then timed iterations, each iteration's time the maximum over ranks (a broadcast is
// done when the slowest rank has it), then min / p50 / p99 / max / mean over iterations.
//
// Methods, all on the same tensors (copies: the model is not touched):
//  * per_tensor   one broadcast per tensor (what TorchRec #1739's fix costs done naively)
//  * coalesced    ours (comm/coalesced.h), flattened into buckets of at most bucket_cap_bytes
//  * framework    c10d::broadcast_coalesced with the same cap, where the backend has it (Gloo)
//  * raw          one broadcast of a preallocated buffer of the same total bytes: the floor
// algbw = bytes / mean time, busbw = algbw (nccl-tests' factor for broadcast is 1), GB = 1e9.
// On NCCL, `device` is the CUDA-event time of the collectives alone (staging copies excluded).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "check/run_result.h"

namespace dmpcheck::comm {
class Communicator;
}

namespace dmpcheck::check {

// Over `samples` (seconds); all zero when empty.
LatencyStats latency_stats(std::vector<double> samples);

// Collective: element i becomes the maximum over ranks of every rank's samples[i] (an
// iteration is done when its slowest rank is).  Every rank passes as many samples.
std::vector<double> max_over_ranks(comm::Communicator& comm, const std::vector<double>& samples);

// Collective: runs `op` warmup + iterations times, each after a barrier, and asks `device_seconds`
// after every one (warm-up too) for its device time, if any.  Returns the timed iterations' times,
// each the maximum over ranks, and their device times where every one reported one.
std::pair<LatencyStats, std::optional<LatencyStats>> time_iterations(
    comm::Communicator& comm, int warmup, int iterations, const std::function<void()>& op,
    const std::function<std::optional<double>()>& device_seconds);

struct ProbeOptions {
  int warmup = 1;
  int iterations = 5;
  int root = 0;
  std::vector<int64_t> bucket_caps = {1 << 20, 25 << 20, 250 << 20};  // 1, 25 (DDP's default), 250 MiB
  bool per_tensor = true;
  bool framework = true;
  bool raw = true;
};

// Collective: every rank passes tensors of the same shapes, dtypes and order.  Does not modify
// `tensors`.  `progress`, when set, gets a line per method.
BroadcastProbe probe_broadcast(comm::Communicator& comm, const std::vector<at::Tensor>& tensors,
                               const ProbeOptions& options,
                               const std::function<void(const std::string&)>& progress = nullptr);

// Human-readable table of a probe, and each coalesced cap measured against the other methods.
std::string render_probe(const BroadcastProbe& probe);

}  // namespace dmpcheck::check
