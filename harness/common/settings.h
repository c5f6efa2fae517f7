// Every setting dmpcheck takes from its environment, read in one place (docs/settings.md lists each
// with what it does).  The program reads them once at main (Settings::from_environment), applies
// its command line's flags over them and installs the result for the process; nothing below main
// reads a DMPCHECK_* setting or sets one.  What runs without dmpcheck's main (the Python module,
// the tests) gets the environment's, read on first use; a test changes them with ScopedSettings.
//
// Not settings: what the launcher tells its ranks (DMPCHECK_LAUNCHED, DMPCHECK_RUN_SECRET,
// DMPCHECK_RENDEZVOUS_FILE, RANK and torchrun's others), read by the rank once at its start.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace dmpcheck {

struct Settings {
  std::string torchrec_repo;       // DMPCHECK_TORCHREC_REPO; --torchrec-repo
  bool install_releases = false;   // DMPCHECK_INSTALL_RELEASES=1; --install-releases (bisect, releases: default)
  std::string torchrec_envs;       // DMPCHECK_TORCHREC_ENVS, else $XDG_CACHE_HOME/dmpcheck/torchrec, else ~/.cache/...
  std::string torchrec_installer;  // DMPCHECK_TORCHREC_INSTALLER; empty: this source tree's ci/torchrec-env.sh
  std::string torchrec_sut;        // DMPCHECK_TORCHREC_SUT; empty: this source tree's, else the installed copy
  bool exec_ranks = false;         // DMPCHECK_RANKS=exec; --ranks exec
  std::optional<int> warm_interpreters;  // DMPCHECK_WARM_INTERPRETERS (0: none)
  std::optional<int> warm_prestart;      // DMPCHECK_WARM_PRESTART (0: none started ahead)
  std::string memory_available;          // DMPCHECK_MEMORY_AVAILABLE, bytes (preflight reads it as a number)
  std::string chartjs;                   // DMPCHECK_CHARTJS
  bool keep_exchange = false;            // DMPCHECK_KEEP_EXCHANGE set: release cells keep their directories
  // How long a step of a command outside its cells may take (a clone of torchrec_repo, an
  // interpreter's probe): 1800 s, or less where the command's --budget says.
  double command_budget_s = 1800;

  // The process's environment (or `environment`, NAME -> value) as settings; Error(kInvalidInput)
  // naming the variable for a value that is not what it should be.
  static Settings from_environment();
  static Settings from_environment(const std::map<std::string, std::string>& environment);
};

// Error(kInvalidInput) naming `where` (--torchrec-repo, DMPCHECK_TORCHREC_REPO) when `value` is not a
// repository a user means: one that git would read as an option (a leading '-'), a remote helper
// (fd::3, ext::...), a scheme other than https, http, ssh, git and file, or a control character.
// A local path, a bundle file, one of those URLs and ssh's user@host:path pass.
void check_torchrec_repo(const std::string& value, const std::string& where);

// The settings in force: those installed, else the environment's (read on the first call).
const Settings& settings();
// main, once, after its flags: these are the settings from now on.
void install_settings(Settings settings);

// For tests: `settings` while this lives, then those before.
class ScopedSettings {
 public:
  explicit ScopedSettings(Settings settings);
  ~ScopedSettings();
  ScopedSettings(const ScopedSettings&) = delete;
  ScopedSettings& operator=(const ScopedSettings&) = delete;

 private:
  Settings before_;
};

}  // namespace dmpcheck
