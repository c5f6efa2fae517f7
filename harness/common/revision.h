// The git revision dmpcheck was configured at, for reports.  Generated into one small file so
// that a new commit recompiles that file alone.
#pragma once

namespace dmpcheck {

const char* git_revision();

}  // namespace dmpcheck
