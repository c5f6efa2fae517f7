// The outcome types (common/outcome.h) where the checks and reports use them, as check::.
#pragma once

#include "common/outcome.h"

namespace dmpcheck::check {

using dmpcheck::exit_status;
using dmpcheck::failure_kind_name;
using dmpcheck::failure_kind_names;
using dmpcheck::failure_kind_of;
using dmpcheck::FailureKind;
using dmpcheck::parse_failure_kind;
using dmpcheck::parse_verdict;
using dmpcheck::Verdict;
using dmpcheck::verdict_name;

}  // namespace dmpcheck::check
