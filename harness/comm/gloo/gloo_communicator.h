// Communicator over c10d::ProcessGroupGloo (CPU tensors, TCP transport on loopback or the
// host's interface).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace dmpcheck::comm {

class Store;

struct GlooOptions {
  std::string hostname = "127.0.0.1";  // the address this rank's Gloo pairs listen on
  std::string interface;               // set: listen on this interface instead (GLOO_SOCKET_IFNAME)
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  int threads = 2;  // Gloo's own worker threads
};

// Collective over all ranks of `world_size`; `store` is used for Gloo's pairwise rendezvous
// only during construction (a prefixed view keeps several groups apart).
std::unique_ptr<Communicator> make_gloo_communicator(Store& store, int rank, int world_size,
                                                     const GlooOptions& options);

}  // namespace dmpcheck::comm
