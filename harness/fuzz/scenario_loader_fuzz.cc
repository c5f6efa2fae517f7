// Fuzz target: any bytes as a scenario file.  The loader must either accept them or raise
// dmpcheck::Error; any other exception, crash or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "scenario/scenario.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    dmpcheck::scenario::load_scenario_text(text, "fuzz.yaml");
  } catch (const dmpcheck::Error&) {}
  return 0;
}
