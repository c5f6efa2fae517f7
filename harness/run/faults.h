// Fault injection: what a scenario's `faults:` make a rank do, at the step they name.
#pragma once

#include <functional>
#include <string>

#include "dmp/model_parallel.h"
#include "scenario/scenario.h"

namespace dmpcheck::run {

// The scenario's faults for this rank at this step (0: after the build), each announced through
// `say` first.  Faults that end the process do so the way a real failure would: a signal, an
// exit status, an exception (ErrorKind::kInjected), a hang; the others corrupt a tensor, put a
// NaN in one, or issue a collective the other ranks do not.
void inject_faults(const scenario::RunSpec& spec, comm::Communicator& comm, int step,
                   dmp::DistributedModelParallel& model, const std::function<void(const std::string&)>& say);

}  // namespace dmpcheck::run
