#include "comm/rendezvous.h"

#include <cstdlib>

#include "common/error.h"

namespace dmpcheck::comm {
namespace {

int64_t parse_int(const std::string& name, const std::string& text, int64_t min, int64_t max) {
  size_t used = 0;
  int64_t value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  DMP_CHECK(used == text.size() && !text.empty() && value >= min && value <= max,
            ErrorKind::kInvalidInput, "environment variable {}='{}': expected an integer in [{}, {}]",
            name, text, min, max);
  return value;
}

}  // namespace

RankEnvironment rank_environment_from(
    const std::function<std::optional<std::string>(const std::string&)>& lookup) {
  auto required = [&](const std::string& name) {
    auto value = lookup(name);
    DMP_CHECK(value.has_value(), ErrorKind::kInvalidInput,
              "environment variable {} is not set; a rank needs RANK, WORLD_SIZE, MASTER_ADDR and "
              "MASTER_PORT (set by torchrun, or by `dmpcheck run`)",
              name);
    return *value;
  };
  RankEnvironment env;
  env.world_size = static_cast<int>(parse_int("WORLD_SIZE", required("WORLD_SIZE"), 1, 1 << 20));
  env.rank = static_cast<int>(parse_int("RANK", required("RANK"), 0, env.world_size - 1));
  env.master_addr = required("MASTER_ADDR");
  env.master_port = static_cast<uint16_t>(parse_int("MASTER_PORT", required("MASTER_PORT"), 1, 65535));
  env.local_rank = env.rank;
  env.local_world_size = env.world_size;
  if (auto v = lookup("LOCAL_WORLD_SIZE")) {
    env.local_world_size = static_cast<int>(parse_int("LOCAL_WORLD_SIZE", *v, 1, env.world_size));
  }
  if (auto v = lookup("LOCAL_RANK")) {
    env.local_rank = static_cast<int>(parse_int("LOCAL_RANK", *v, 0, env.local_world_size - 1));
  }
  return env;
}

RankEnvironment rank_environment_from_process() {
  return rank_environment_from([](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  });
}

}  // namespace dmpcheck::comm
