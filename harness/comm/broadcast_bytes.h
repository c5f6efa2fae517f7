// Broadcast of a byte string (a plan, a serialised object) from one rank to all, and the ranks'
// agreement on one.
#pragma once

#include <string>

namespace dmpcheck::comm {

class Communicator;

// Collective: returns root's `bytes` on every rank (the argument is ignored elsewhere).
std::string broadcast_bytes(Communicator& comm, const std::string& bytes, int root);

// Collective: the first rank whose `text` differs from rank 0's (compared by hash), or -1 when
// every rank holds the same.
int first_rank_disagreeing(Communicator& comm, const std::string& text);

}  // namespace dmpcheck::comm
