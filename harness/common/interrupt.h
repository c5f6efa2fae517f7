// Whether dmpcheck was asked to stop (SIGINT or SIGTERM).  The handler that sets it is installed by
// run::install_interrupt_handlers (run/launcher.h) and may only set this flag; long work anywhere,
// loading a scenario's cells included, polls it and stops (the CLI then exits 130).
#pragma once

#include <csignal>

namespace dmpcheck {

inline volatile std::sig_atomic_t g_interrupted = 0;

inline bool interrupt_requested() { return g_interrupted != 0; }

}  // namespace dmpcheck
