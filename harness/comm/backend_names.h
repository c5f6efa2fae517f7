// The backends a scenario or `dmpcheck bench` names, each name spelt once; a rank's task carries
// one by its name.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/names.h"

namespace dmpcheck::comm {

enum class Backend { kGloo, kNccl };
inline constexpr Named<Backend> kBackendNames[] = {{Backend::kGloo, "gloo"}, {Backend::kNccl, "nccl"}};
inline const char* backend_name(Backend backend) { return name_in(kBackendNames, backend); }

inline void to_json(nlohmann::json& j, const Backend& b) { j = std::string(backend_name(b)); }
inline void from_json(const nlohmann::json& j, Backend& b) {
  const auto parsed = value_in(kBackendNames, j.get<std::string>());
  DMP_CHECK(parsed.has_value(), ErrorKind::kInvalidInput, "unknown backend '{}' (expected one of: {})",
            j.get<std::string>(), fmt::join(names_in(kBackendNames), ", "));
  b = *parsed;
}

}  // namespace dmpcheck::comm
