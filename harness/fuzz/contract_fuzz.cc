// Fuzz target: bytes as a document a release's rank program writes back to dmpcheck (meta.json,
// error.json, the plan and probe answers, a warm interpreter's message): the first byte picks the
// type, the rest is its JSON.  Read strictly as dmpcheck reads a release's output; anything
// malformed must raise dmpcheck::Error, never crash.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "run/release_contract.h"

namespace contract = dmpcheck::run::contract;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const nlohmann::json document = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (document.is_discarded()) return 0;  // not JSON: read_json's own error, before any type
  try {
    switch (data[0] % 6) {
      case 0: (void)contract::read_document<contract::RunMeta>(document, "meta.json"); break;
      case 1: (void)contract::read_document<contract::RankError>(document, "error.json"); break;
      case 2: (void)contract::read_document<contract::PlanAnswer>(document, "plan.json"); break;
      case 3: (void)contract::read_document<contract::ProbeAnswer>(document, "probe.json"); break;
      case 4: (void)contract::read_document<contract::WarmMessage>(document, "warm"); break;
      default: (void)contract::read_document<contract::Phase>(document, "step1.json"); break;
    }
  } catch (const dmpcheck::Error&) {}
  return 0;
}
