#include "comm/backends.h"

#include <cstdlib>

#include "comm/gloo/gloo_communicator.h"
#include "comm/nccl/nccl_communicator.h"
#include "comm/rendezvous.h"

namespace dmpcheck::comm {

std::optional<std::string> backend_unavailable_reason(Backend backend, int local_world_size) {
  if (backend == Backend::kNccl) return nccl_unavailable_reason(local_world_size);
  return std::nullopt;
}

std::unique_ptr<Communicator> make_communicator(Backend backend, Store& store, int rank, int world_size,
                                                const BackendOptions& options) {
  if (backend == Backend::kGloo) {
    return make_gloo_communicator(store, rank, world_size, {options.hostname, options.interface, options.timeout});
  }
  return make_nccl_communicator(store, rank, world_size, {options.local_rank, options.timeout});
}

std::unique_ptr<Communicator> make_communicator(Backend backend, Store& store, const RankEnvironment& env,
                                                double timeout_s) {
  BackendOptions options;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0));
  options.local_rank = env.local_rank;
  const char* launched = std::getenv("DMPCHECK_LAUNCHED");
  options.hostname = launched != nullptr && std::string(launched) == "1" ? "127.0.0.1" : gloo_listen_address(env);
  options.interface = env.gloo_interface;
  return make_communicator(backend, store, env.rank, env.world_size, options);
}

}  // namespace dmpcheck::comm
