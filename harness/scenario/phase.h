// Where in a run the replicas are compared: before any step, after a step, after the last one.
#pragma once

#include "common/names.h"

namespace dmpcheck::scenario {

enum class Phase { kInit, kStep, kFinal };
inline constexpr Named<Phase> kPhaseNames[] = {
    {Phase::kInit, "init"}, {Phase::kStep, "step"}, {Phase::kFinal, "final"}};
inline const char* phase_name(Phase phase) { return name_in(kPhaseNames, phase); }

}  // namespace dmpcheck::scenario
