#include "common/error.h"

namespace dmpcheck {

void throw_error(ErrorKind kind, const std::string& message) { throw Error(kind, message); }

void throw_internal(const char* file, int line, const char* condition, std::string message) {
  throw Error(ErrorKind::kInternal,
              fmt::format("internal error at {}:{}: {} ({}); this is a dmpcheck bug", file, line, message, condition));
}

}  // namespace dmpcheck
