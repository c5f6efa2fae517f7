#include "release/torchrec_systems.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/digest.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/settings.h"
#include "run/release_contract.h"
#include "run/subprocess.h"
#include "run/warm_interpreter.h"

#ifndef DMPCHECK_SOURCE_DIR
#define DMPCHECK_SOURCE_DIR "."
#endif

namespace dmpcheck::run {
namespace {

namespace fs = std::filesystem;

// The environment every torchrec_sut module runs with: the rank program (and a commit's source
// before it) on PYTHONPATH, nothing from the user's site, output unbuffered so each line is echoed
// as it comes, the releases' warnings off.
std::map<std::string, std::string> python_environment(const std::string& source_dir) {
  const std::string path = source_dir.empty() ? torchrec_sut_dir() : source_dir + ":" + torchrec_sut_dir();
  return {{"PYTHONPATH", path},      {"PYTHONNOUSERSITE", "1"},    {"PYTHONDONTWRITEBYTECODE", "1"},
          {"PYTHONUNBUFFERED", "1"}, {"PYTHONWARNINGS", "ignore"}, {"TORCH_CPP_LOG_LEVEL", "ERROR"}};
}

// `python -m dmpcheck_torchrec.probe` in `python`: what it imports.  Error(kInvalidInput) naming
// `name` and the import that failed (or Python's own failure) when it cannot run TorchRec cells.
contract::ProbeAnswer probe(const std::string& python, const std::string& name) {
  const PrivateDir scratch("dmpcheck-probe");
  const std::string answer_path = scratch.path() + "/probe.json";
  // At most 300 s, or the command's --budget where that is shorter.
  const auto deadline = std::chrono::seconds(static_cast<int64_t>(std::clamp(settings().command_budget_s, 1.0, 300.0)));
  const Captured c = capture({python, "-m", "dmpcheck_torchrec.probe", answer_path}, python_environment(""), deadline);
  if (c.ok()) {
    try {
      return contract::read_document_file<contract::ProbeAnswer>(answer_path);
    } catch (const Error& e) {
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("{}: its answer to the probe is unreadable: {}", name, e.what()));
    }
  }
  // The probe's own line names the import that failed; anything else (Python's own failure) as it came.
  const auto said = c.output.rfind("import ");
  const bool named = said != std::string::npos && c.output.find(" failed: ", said) != std::string::npos;
  throw_error(
      ErrorKind::kInvalidInput,
      fmt::format("{} cannot run TorchRec cells, which need torch, fbgemm_gpu and torchrec to import there: {}", name,
                  c.timed_out ? fmt::format("its imports took longer than {} s", deadline.count())
                  : named     ? trim(c.output.substr(said))
                              : fmt::format("`{} -m dmpcheck_torchrec.probe` {}:{}", python, c.ended(deadline),
                                            last_lines(c.output, 6))));
}

void take_versions(TorchRecEnvironment& env, const contract::ProbeAnswer& answer) {
  env.torchrec = answer.versions.torchrec;
  env.torch = answer.versions.torch;
  env.fbgemm_gpu = answer.versions.fbgemm_gpu;
}

// Where the versions an environment reports differ from what `system` pins ("torchrec 1.9.1, not
// 1.9.2"); empty where they agree (a local version label, as torch's "+cu121", agrees).
std::string disagreement(const scenario::System& system, const TorchRecEnvironment& env) {
  const auto same = [](const std::string& seen, const std::string& pinned) {
    return seen == pinned || seen.rfind(pinned + "+", 0) == 0;
  };
  if (!same(env.torchrec, system.version)) return fmt::format("torchrec {}, not {}", env.torchrec, system.version);
  for (const auto& [package, version] : system.pins) {
    const std::string* seen = package == "torch" ? &env.torch : package == "fbgemm-gpu-cpu" ? &env.fbgemm_gpu : nullptr;
    if (seen != nullptr && !same(*seen, version)) return fmt::format("{} {}, not {}", package, *seen, version);
  }
  return "";
}

// What ci/torchrec-env.sh is given for `system`: the version of a release as pinned, the whole set
// (one argument, quoted for a shell) for a set of pins.
std::string installer_argument(const scenario::System& system) {
  return system.pins.empty() ? system.version : "'" + system.name() + "'";
}

// What a report says of the environment: "torchrec 1.9.2", "torchrec 1.2.0, fbgemm-gpu-cpu 1.1.0".
std::string label(const scenario::System& system) {
  std::string out = "torchrec " + system.version;
  for (const auto& [package, version] : system.pins) out += ", " + package + " " + version;
  return out;
}

// The last lines an installer printed, without terminal colours or blank lines: where a set does
// not resolve or does not import, the resolver's or the import's own words.
std::string last_words(const std::string& output, size_t lines = 12) {
  std::string plain;
  for (size_t i = 0; i < output.size(); ++i) {
    if (output[i] == '\x1b' && i + 1 < output.size() && output[i + 1] == '[') {
      i += 2;
      while (i < output.size() && !std::isalpha(static_cast<unsigned char>(output[i]))) ++i;
      continue;
    }
    if (output[i] != '\r') plain += output[i];
  }
  std::vector<std::string> kept;
  std::istringstream in(plain);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos) continue;
    kept.push_back(line.substr(first));
    if (kept.size() > lines) kept.erase(kept.begin());
  }
  std::string out;
  for (const auto& line : kept) out += (out.empty() ? "" : "\n  ") + line;
  return out;
}

// ci/torchrec-env.sh X (its own lock, budget and progress lines), its output shown as it comes.
// Empty when it made the environment, else why not in the installer's own last words; a set that
// failed once in this process is not tried again (every cell on it would fail alike).
std::string install_release(const scenario::System& system) {
  static std::map<std::string, std::string> failed;
  if (const auto it = failed.find(system.name()); it != failed.end()) return it->second;
  const std::string script = !settings().torchrec_installer.empty()
                                 ? settings().torchrec_installer
                                 : std::string(DMPCHECK_SOURCE_DIR) + "/ci/torchrec-env.sh";
  DMP_CHECK(fs::exists(script), ErrorKind::kInvalidInput,
            "{} is not installed and the installer {} is not there (set DMPCHECK_TORCHREC_INSTALLER)", label(system),
            script);
  fmt::print(stderr, "dmpcheck: {} is not installed: installing it (bash {} {})\n", label(system), script,
             installer_argument(system));
  std::string tail;
  const int code = run_visible({"bash", script, system.pins.empty() ? system.version : system.name()}, &tail);
  if (code == 0) return "";
  return failed[system.name()] = fmt::format(
             "{} could not be made: `bash {} {}` {}; it said last:\n  {}", label(system), script,
             installer_argument(system), code < 0 ? "was killed" : fmt::format("exited {}", code), last_words(tail));
}

// An environment the installer finished: its marker and its interpreter are there.
bool installed(const std::string& dir) {
  return fs::exists(dir + "/dmpcheck-ready.json") && fs::exists(dir + "/bin/python");
}

std::optional<TorchRecEnvironment> release_environment(const scenario::System& system, std::string& why_not) {
  TorchRecEnvironment env;
  env.dir = environment_dir(system);
  env.python = env.dir + "/bin/python";
  env.pins = system.pins;
  const std::string ready = env.dir + "/dmpcheck-ready.json";
  if (!installed(env.dir) && settings().install_releases) {
    static std::mutex installing;  // cells run side by side wait for one install
    std::lock_guard<std::mutex> lock(installing);
    if (!fs::exists(ready)) {
      const std::string failure = install_release(system);
      if (!failure.empty()) throw EnvironmentNotMade(failure);
    }
  }
  const std::string missing = fmt::format("{} is not installed in {}: run `bash ci/torchrec-env.sh {}`", label(system),
                                          env.dir, installer_argument(system));
  // The cell is skipped, `why` saying why.
  const auto skipped = [&why_not](std::string why) -> std::optional<TorchRecEnvironment> {
    why_not = std::move(why);
    return std::nullopt;
  };
  if (!installed(env.dir)) return skipped(missing);
  // Held while the cell runs, so the installer's eviction passes it by; taken after an eviction
  // that held it exclusively, the environment may be gone: then it is missing.
  const int fd = ::open((env.dir + "/dmpcheck-in-use.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    while (::flock(fd, LOCK_SH) != 0 && errno == EINTR) {}
    env.in_use = std::shared_ptr<void>(nullptr, [fd](void*) { ::close(fd); });
  }
  if (!fs::exists(ready)) return skipped(missing);
  // For the installer's least-recently-used eviction (ci/torchrec-env.sh).
  std::ofstream(env.dir + "/dmpcheck-last-used").put('\n');
  std::string stale;
  try {
    take_versions(env, contract::read_document_file<contract::ProbeAnswer>(ready));
    // A marker that names other versions than the system's (edited, or left by another set) must
    // not name the report's environment.
    if (const std::string other = disagreement(system, env); !other.empty()) stale = fmt::format("says {}", other);
  } catch (const Error& unreadable) {
    // Marked by another dmpcheck's installer (another schema): asked again, and marked anew.
    stale = fmt::format("is not this dmpcheck's probe answer ({})", unreadable.what());
  }
  if (stale.empty()) return env;
  fmt::print(stderr, "dmpcheck: {} {}: asking the environment again\n", ready, stale);
  try {
    const contract::ProbeAnswer answer = probe(env.python, label(system) + "'s environment " + env.dir);
    take_versions(env, answer);
    if (const std::string other = disagreement(system, env); !other.empty())
      return skipped(fmt::format("{} imports {}: remove it and run `bash ci/torchrec-env.sh {}`", env.dir, other,
                                 installer_argument(system)));
    write_file_atomically(ready, nlohmann::json(answer).dump());
  } catch (const Error& e) {
    return skipped(fmt::format("{}: run `bash ci/torchrec-env.sh {}` again", e.what(), installer_argument(system)));
  }
  return env;
}

// A user's interpreter, asked once per process what it imports.
TorchRecEnvironment interpreter_environment(const std::string& python) {
  static std::mutex mutex;
  static std::map<std::string, TorchRecEnvironment> probed;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = probed.find(python); it != probed.end()) return it->second;
  const std::string name = "python:" + python;
  DMP_CHECK(fs::exists(python), ErrorKind::kInvalidInput, "{}: there is no interpreter at {}", name, python);
  DMP_CHECK(::access(python.c_str(), X_OK) == 0, ErrorKind::kInvalidInput, "{}: {} is not executable", name, python);
  TorchRecEnvironment env;
  env.python = python;
  take_versions(env, probe(python, name));
  probed[python] = env;
  return env;
}

}  // namespace

std::optional<std::string> release_not_installed(const scenario::System& system) {
  if (!system.is_release() || settings().install_releases) return std::nullopt;
  if (installed(environment_dir(system))) return std::nullopt;
  return installer_argument(system);
}

std::string TorchRecEnvironment::describe() const {
  if (commit.empty()) {
    std::string out = torchrec;
    for (const auto& [package, version] : pins) out += (out == torchrec ? " with " : ", ") + package + "==" + version;
    return out;
  }
  return fmt::format("{} ({}; its source over the torchrec {} environment)", commit.substr(0, 8), subject,
                     base_release);
}

std::string torchrec_environments_root() { return settings().torchrec_envs; }

std::string environment_dir(const scenario::System& system) {
  std::string dir = torchrec_environments_root() + "/torchrec-" + system.version;
  for (const auto& [package, version] : system.pins) dir += "+" + package + "=" + version;
  return dir;
}

std::string torchrec_sut_dir() {
  if (!settings().torchrec_sut.empty()) return settings().torchrec_sut;
  std::string source = std::string(DMPCHECK_SOURCE_DIR) + "/torchrec_sut";
  if (fs::exists(source)) return source;
  std::error_code ec;
  const auto exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = exe.parent_path().parent_path() / "share" / "dmpcheck" / "torchrec_sut";
    if (fs::exists(installed)) return installed.string();
  }
  return source;
}

bool version_less(const std::string& a, const std::string& b) {
  auto numbers = [](const std::string& v) {
    std::vector<long> out;
    std::istringstream in(v);
    for (std::string part; std::getline(in, part, '.');) out.push_back(std::strtol(part.c_str(), nullptr, 10));
    return out;
  };
  return numbers(a) < numbers(b);
}

std::vector<std::string> pinned_releases() {
  const std::string path = torchrec_sut_dir() + "/pins.tsv";
  std::ifstream in(path);
  DMP_CHECK(in.good(), ErrorKind::kInvalidInput, "the pin table {} is missing", path);
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const std::string version = line.substr(0, line.find('\t'));
    if (scenario::System::is_version(version)) out.push_back(version);
  }
  std::sort(out.begin(), out.end(), version_less);
  return out;
}

std::optional<TorchRecEnvironment> resolve_environment(const scenario::System& system, std::string& why_not) {
  switch (system.kind) {
    case scenario::System::Kind::kRelease: return release_environment(system, why_not);
    case scenario::System::Kind::kPython: return interpreter_environment(system.version);
    case scenario::System::Kind::kCommit: {
      const TorchRecRepository repo = TorchRecRepository::open();
      const Commit commit = repo.resolve(system.version);
      std::string why;
      const std::string base = !system.over.empty() ? system.over : repo.base_release(commit, pinned_releases(), &why);
      DMP_CHECK(!base.empty(), ErrorKind::kInvalidInput, "{}: {}", system.name(), why);
      auto env = release_environment(scenario::System::release(base), why_not);
      if (!env) {
        why_not =
            fmt::format("{} runs its source over the torchrec {} environment, and {}", system.name(), base, why_not);
        return std::nullopt;
      }
      env->source_dir = repo.source_tree(commit);
      env->commit = commit.hash;
      env->subject = commit.subject;
      env->base_release = base;
      return env;
    }
    case scenario::System::Kind::kReference: break;
  }
  throw_error(ErrorKind::kInternal, "resolve_environment: the reference has no TorchRec environment");
}

std::vector<std::string> check_hook_file(const TorchRecEnvironment& env, const std::string& path) {
  const Captured c = capture({env.python, "-m", "dmpcheck_torchrec.hooks", "check", path}, python_environment(""),
                             std::chrono::seconds(120));
  if (c.ok()) return {};
  std::vector<std::string> lines;
  std::istringstream said(c.output);
  for (std::string line; std::getline(said, line);) {
    if (!trim(line).empty()) lines.push_back(line);
  }
  if (lines.empty()) lines.push_back(fmt::format("{}: the hook check exited {}", path, c.exit_code));
  return lines;
}

LaunchRequest torchrec_launch(const TorchRecEnvironment& env, std::vector<std::string> arguments,
                              const std::string& error_dir) {
  LaunchRequest request;
  request.executable = env.python;
  request.arguments = std::move(arguments);
  request.error_dir = error_dir;
  request.environment = python_environment(env.source_dir);
  // Gloo listens where the host name resolves unless told: a release cell's ranks are on one host.
  request.environment["GLOO_SOCKET_IFNAME"] = "lo";
  if (!env.source_dir.empty()) {
    // A commit: torch and fbgemm_gpu are its environment's and the same for every commit over it,
    // so one warm interpreter per environment imports them, never TorchRec; each commit's ranks
    // fork from it and import that commit's TorchRec only (PYTHONPATH, put first by the rank).
    request.warm_environment = python_environment("");
    request.warm_environment["GLOO_SOCKET_IFNAME"] = "lo";
    request.warm_preload = {"torch", "fbgemm_gpu", "torch.distributed.checkpoint", "dmpcheck_torchrec.runner"};
    return request;
  }
  // What every rank imports first, once per command in a warm interpreter (warm_interpreter.h).
  request.warm_preload = {"torch",
                          "fbgemm_gpu",
                          "torchrec",
                          "torch.distributed.checkpoint",
                          "torchrec.distributed.model_parallel",
                          "torchrec.distributed.planner",
                          "torchrec.distributed.train_pipeline",
                          "torchrec.distributed.embedding",
                          "torchrec.distributed.embeddingbag",
                          "dmpcheck_torchrec.runner"};
  return request;
}

void prestart_release_interpreters(const std::vector<scenario::System>& systems, bool exec_ranks) {
  if (exec_ranks || settings().exec_ranks) return;
  std::vector<WarmInterpreter::Wanted> wanted;
  std::set<std::string> seen;
  for (const auto& system : systems) {
    if (system.kind != scenario::System::Kind::kRelease || !seen.insert(system.name()).second) continue;
    TorchRecEnvironment env;
    env.dir = environment_dir(system);
    env.python = env.dir + "/bin/python";
    // Installed only (never installing ahead), and held against the installer's eviction as a cell holds it.
    if (!fs::exists(env.dir + "/dmpcheck-ready.json") || !fs::exists(env.python)) continue;
    const int fd = ::open((env.dir + "/dmpcheck-in-use.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
      ::close(fd);
      continue;
    }
    const LaunchRequest request = torchrec_launch(env, {}, "");
    wanted.push_back({request.executable, request.environment, request.warm_preload,
                      std::shared_ptr<void>(nullptr, [fd](void*) { ::close(fd); })});
  }
  WarmInterpreter::prestart(std::move(wanted));
}

}  // namespace dmpcheck::run
