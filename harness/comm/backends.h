// The backends (comm/backend_names.h), for the worker and `dmpcheck bench`.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/backend_names.h"
#include "comm/communicator.h"

namespace dmpcheck::comm {

class Store;
struct RankEnvironment;

// Why `backend` cannot run `local_world_size` ranks per host on this machine (a reason to skip),
// or nullopt.  Never touches a GPU context that a later fork would inherit: NCCL's check only
// counts devices, and ranks are exec'd.
std::optional<std::string> backend_unavailable_reason(Backend backend, int local_world_size);

struct BackendOptions {
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  int local_rank = 0;
  std::string hostname = "127.0.0.1";  // Gloo: the address its pairs listen on
  std::string interface;               // Gloo: listen on this interface instead (GLOO_SOCKET_IFNAME)
};

std::unique_ptr<Communicator> make_communicator(Backend backend, Store& store, int rank, int world_size,
                                                const BackendOptions& options);
// The communicator of a rank that `env` describes, with a deadline of `timeout_s` per collective:
// Gloo listens where PyTorch's would (gloo_listen_address), or on loopback under dmpcheck's own
// launcher (DMPCHECK_LAUNCHED=1), whose "hosts" are simulated on this one.
std::unique_ptr<Communicator> make_communicator(Backend backend, Store& store, const RankEnvironment& env,
                                                double timeout_s);

}  // namespace dmpcheck::comm
