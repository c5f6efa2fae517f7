// What a script cell is judged by beside its replicas: each rank's exit, output and exception
// (scenario::ScriptExpectation), and the names a script's `diverged` list gives.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "check/run_result.h"
#include "scenario/scenario.h"

namespace dmpcheck::check {

// The exception of the last traceback in `lines` ("Traceback (most recent call last):" then indented
// frames, then "Type: message"), as "Type: message"; nullopt when the lines hold none.  The
// "[rank<R>]: " torch.distributed puts before each line of an uncaught exception is read through.
std::optional<std::string> last_traceback_exception(const std::vector<std::string>& lines);

// Whether an exception line "a.b.Type: message" is of `type` ("Type", or a dotted suffix of it) and
// its message contains `message`.
bool exception_matches(const std::string& seen, const std::string& type, const std::string& message);

// A `diverged` name of a script cell and the audited tensors it names: the tensor of that name, or
// those whose name ends with ".<name>" or ".<name>.weight" (a table's name names its weight).
bool names_tensor(const std::string& name, const std::string& tensor);

// Appends one line per unmet part of `expect` to `failures`.
void judge_script(const scenario::ScriptExpectation& expect, const RunResult& result,
                  std::vector<std::string>& failures);

}  // namespace dmpcheck::check
