#include "common/settings.h"

#include <unistd.h>

#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "common/error.h"

namespace dmpcheck {
namespace {

using Environment = std::map<std::string, std::string>;

std::string variable(const Environment& environment, const char* name) {
  const auto it = environment.find(name);
  return it != environment.end() ? it->second : std::string();
}

std::optional<int> count(const Environment& environment, const char* name) {
  const std::string value = variable(environment, name);
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
  Environment environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const size_t eq = text.find('=');
    if (eq != std::string::npos) environment.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return from_environment(environment);
}

Settings Settings::from_environment(const std::map<std::string, std::string>& environment) {
  const auto get = [&](const char* name) { return variable(environment, name); };
  Settings s;
  s.torchrec_repo = get("DMPCHECK_TORCHREC_REPO");
  if (!s.torchrec_repo.empty()) check_torchrec_repo(s.torchrec_repo, "DMPCHECK_TORCHREC_REPO");
  s.install_releases = get("DMPCHECK_INSTALL_RELEASES") == "1";
  const std::string home = get("HOME").empty() ? "/root" : get("HOME");
  const std::string cache = get("XDG_CACHE_HOME").empty() ? home + "/.cache" : get("XDG_CACHE_HOME");
  s.torchrec_envs =
      get("DMPCHECK_TORCHREC_ENVS").empty() ? cache + "/dmpcheck/torchrec" : get("DMPCHECK_TORCHREC_ENVS");
  s.torchrec_installer = get("DMPCHECK_TORCHREC_INSTALLER");
  s.torchrec_sut = get("DMPCHECK_TORCHREC_SUT");
  const std::string ranks = get("DMPCHECK_RANKS");
  DMP_CHECK(ranks.empty() || ranks == "exec" || ranks == "fork", ErrorKind::kInvalidInput,
            "DMPCHECK_RANKS='{}': expected exec or fork", ranks);
  s.exec_ranks = ranks == "exec";
  s.warm_interpreters = count(environment, "DMPCHECK_WARM_INTERPRETERS");
  s.warm_prestart = count(environment, "DMPCHECK_WARM_PRESTART");
  s.memory_available = get("DMPCHECK_MEMORY_AVAILABLE");
  s.chartjs = get("DMPCHECK_CHARTJS");
  s.keep_exchange = environment.count("DMPCHECK_KEEP_EXCHANGE") > 0;
  return s;
}

void check_torchrec_repo(const std::string& value, const std::string& where) {
  const auto refuse = [&](const std::string& why) {
    throw_error(ErrorKind::kInvalidInput, fmt::format("{} '{}': {}", where, value, why));
  };
  if (value.empty()) refuse("empty: give a path, a bundle file or a URL of TorchRec's repository");
  if (value.front() == '-')
    refuse("begins with '-', which git would read as an option: give a path, a bundle or a URL");
  for (const char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) refuse("holds a control character");
  }
  if (value.find("::") != std::string::npos) {
    refuse("git's <transport>::<address> remote helpers (fd::, ext::, ...) are not taken: give a path, a bundle, or "
           "an https, http, ssh, git or file URL");
  }
  const auto scheme_end = value.find("://");
  if (scheme_end != std::string::npos) {
    const std::string scheme = value.substr(0, scheme_end);
    static const std::set<std::string> allowed = {"https", "http", "ssh", "git", "file"};
    if (allowed.count(scheme) == 0) {
      refuse(fmt::format("the transport '{}' is not taken: give a path, a bundle, or an https, http, ssh, git or file "
                         "URL",
                         scheme));
    }
  }
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
