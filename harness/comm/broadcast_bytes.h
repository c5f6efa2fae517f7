// Broadcast of a byte string (a plan, a serialised object) from one rank to all.
#pragma once

#include <string>

namespace dmpcheck::comm {

class Communicator;

// Collective: returns root's `bytes` on every rank (the argument is ignored elsewhere).
std::string broadcast_bytes(Communicator& comm, const std::string& bytes, int root);

}  // namespace dmpcheck::comm
