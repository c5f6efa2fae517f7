// Error policy (see docs/errors.md):
//  * Bad user input (scenario files, batches, environment) is checked always and raises
//    dmpcheck::Error with a kind the harness sorts by and a message that says what was seen
//    and what was expected.  Use DMP_CHECK.
//  * A broken internal invariant is a bug in dmpcheck: DMP_INTERNAL_ASSERT, kind kInternal.
// Reports and exit codes are derived from ErrorKind, never from message text.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace dmpcheck {

enum class ErrorKind {
  kInvalidScenario,  // a scenario file is malformed or asks for the impossible
  kInvalidInput,     // a batch, a tensor or an environment variable is malformed
  kCommunication,    // a collective or the rendezvous failed
  kTimeout,          // a collective or a run exceeded its deadline
  kRankFailed,       // a rank process crashed or exited non-zero
  kInternal,         // a dmpcheck bug
  kInjected,         // a fault the scenario asked for (`faults: {kind: throw}`)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);
[[noreturn]] void throw_internal(const char* file, int line, const char* condition, std::string message);

}  // namespace dmpcheck

// DMP_CHECK(condition, kind, "format {}", args...): always-on check of user input.
#define DMP_CHECK(condition, kind, ...)                                                \
  do {                                                                                 \
    if (!(condition)) { ::dmpcheck::throw_error((kind), ::fmt::format(__VA_ARGS__)); } \
  } while (false)

// DMP_CHECK_EQ(a, b, kind, "format {}", args...): DMP_CHECK(a == b, ...) whose message ends with
// both operands, as gloo's GLOO_ENFORCE_EQ: "...: source.sizes() is [2, 4], s.tensor.sizes() is [3, 4]".
#define DMP_CHECK_EQ(a, b, kind, ...)                                                                               \
  do {                                                                                                              \
    const auto& dmp_check_a = (a);                                                                                  \
    const auto& dmp_check_b = (b);                                                                                  \
    if (!(dmp_check_a == dmp_check_b)) {                                                                            \
      ::dmpcheck::throw_error((kind), ::fmt::format(__VA_ARGS__) +                                                  \
                                          ::fmt::format(": {} is {}, {} is {}", #a, dmp_check_a, #b, dmp_check_b)); \
    }                                                                                                               \
  } while (false)

// DMP_INTERNAL_ASSERT(condition, "format {}", args...): an invariant of dmpcheck itself.
#define DMP_INTERNAL_ASSERT(condition, ...)                                                                       \
  do {                                                                                                            \
    if (!(condition)) { ::dmpcheck::throw_internal(__FILE__, __LINE__, #condition, ::fmt::format(__VA_ARGS__)); } \
  } while (false)
