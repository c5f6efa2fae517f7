// Communicator over NCCL (nccl.h, no libtorch CUDA needed): libtorch here is CPU-only, so each
// collective stages the CPU tensors into device buffers this communicator owns, runs on its own
// CUDA stream, and copies the result back.  Built when CMake finds nccl.h and cudart
// (DMPCHECK_WITH_NCCL); otherwise nccl_unavailable_reason() says so and nothing else is usable.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"

namespace dmpcheck::comm {

class Store;

struct NcclOptions {
  int local_rank = 0;  // the GPU this rank uses (cudaSetDevice before init)
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// Why `local_world_size` ranks per host cannot run NCCL here, or nullopt when they can: dmpcheck
// built without NCCL, no CUDA driver or GPU, or fewer GPUs than ranks (NCCL before 2.30 refuses
// two ranks on one GPU: "Duplicate GPU detected").  A reason to skip, not a failure.
std::optional<std::string> nccl_unavailable_reason(int local_world_size);

// Collective over all `world_size` ranks.  Rank 0 creates NCCL's unique id and shares it through
// `store`; the communicator is non-blocking, and every wait polls ncclCommGetAsyncError against
// the deadline, aborting the communicator on error or timeout.
std::unique_ptr<Communicator> make_nccl_communicator(Store& store, int rank, int world_size,
                                                     const NcclOptions& options);

}  // namespace dmpcheck::comm
