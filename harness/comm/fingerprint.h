// A Communicator that checks, before every collective, that every rank is about to run the
// same one: each rank's (operation, sequence number, dtype, shape) is all-gathered first and a
// mismatch fails on every rank with both fingerprints, like TORCH_DISTRIBUTED_DEBUG=DETAIL.
// Costs one small all-gather per collective: a debugging mode, off by default.
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace dmpcheck::comm {

std::unique_ptr<Communicator> make_fingerprinting_communicator(std::unique_ptr<Communicator> inner);

}  // namespace dmpcheck::comm
