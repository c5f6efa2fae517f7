// A world of one rank, for tests: every collective is the identity, so DMP code runs in one
// process (the unsharded oracle no longer uses it: check/unsharded_model.h shares no DMP code).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dmpcheck::comm {

std::unique_ptr<Communicator> make_loopback_communicator();

}  // namespace dmpcheck::comm
