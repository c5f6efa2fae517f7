// A world of one rank: every collective is the identity.  It lets the unsharded reference
// model run through the same DMP code as the sharded one.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dmpcheck::comm {

std::unique_ptr<Communicator> make_loopback_communicator();

}  // namespace dmpcheck::comm
