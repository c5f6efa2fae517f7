#include "common/settings.h"

#include <cstdlib>
#include <mutex>

#include "common/error.h"

namespace dmpcheck {
namespace {

std::string variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

std::optional<int> count(const char* name) {
  const std::string value = variable(name);
  if (value.empty()) return std::nullopt;
  size_t used = 0;
  int n = -1;
  try {
    n = std::stoi(value, &used);
  } catch (const std::exception&) { used = 0; }
  DMP_CHECK(used == value.size() && n >= 0, ErrorKind::kInvalidInput, "{}='{}': expected a count (0 or more)", name,
            value);
  return n;
}

std::mutex& settings_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::optional<Settings>& installed() {
  static std::optional<Settings> settings;
  return settings;
}

}  // namespace

Settings Settings::from_environment() {
  Settings s;
  s.torchrec_repo = variable("DMPCHECK_TORCHREC_REPO");
  s.install_releases = variable("DMPCHECK_INSTALL_RELEASES") == "1";
  const std::string home = variable("HOME").empty() ? "/root" : variable("HOME");
  const std::string cache = variable("XDG_CACHE_HOME").empty() ? home + "/.cache" : variable("XDG_CACHE_HOME");
  s.torchrec_envs =
      variable("DMPCHECK_TORCHREC_ENVS").empty() ? cache + "/dmpcheck/torchrec" : variable("DMPCHECK_TORCHREC_ENVS");
  s.torchrec_installer = variable("DMPCHECK_TORCHREC_INSTALLER");
  s.torchrec_sut = variable("DMPCHECK_TORCHREC_SUT");
  const std::string ranks = variable("DMPCHECK_RANKS");
  DMP_CHECK(ranks.empty() || ranks == "exec" || ranks == "fork", ErrorKind::kInvalidInput,
            "DMPCHECK_RANKS='{}': expected exec or fork", ranks);
  s.exec_ranks = ranks == "exec";
  s.warm_interpreters = count("DMPCHECK_WARM_INTERPRETERS");
  s.warm_prestart = count("DMPCHECK_WARM_PRESTART");
  s.memory_available = variable("DMPCHECK_MEMORY_AVAILABLE");
  s.chartjs = variable("DMPCHECK_CHARTJS");
  s.keep_exchange = std::getenv("DMPCHECK_KEEP_EXCHANGE") != nullptr;
  return s;
}

const Settings& settings() {
  std::lock_guard<std::mutex> lock(settings_mutex());
  if (!installed()) installed() = Settings::from_environment();
  return *installed();
}

void install_settings(Settings settings) {
  std::lock_guard<std::mutex> lock(settings_mutex());
  installed() = std::move(settings);
}

ScopedSettings::ScopedSettings(Settings settings) : before_(dmpcheck::settings()) {
  install_settings(std::move(settings));
}

ScopedSettings::~ScopedSettings() { install_settings(std::move(before_)); }

}  // namespace dmpcheck
