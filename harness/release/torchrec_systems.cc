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

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

// The last `n` lines of a program's output: where Python puts the exception.
std::string last_lines(const std::string& output, size_t n) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  std::string out;
  for (size_t i = lines.size() > n ? lines.size() - n : 0; i < lines.size(); ++i) out += "\n  | " + lines[i];
  return out;
}

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
  const Captured c = capture({python, "-m", "dmpcheck_torchrec.probe", answer_path}, python_environment(""),
                             std::chrono::seconds(300));
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
                  c.timed_out ? std::string("its imports took longer than 300 s")
                  : named     ? trim(c.output.substr(said))
                              : fmt::format("`{} -m dmpcheck_torchrec.probe` exited {}:{}", python, c.exit_code,
                                            last_lines(c.output, 6))));
}

void take_versions(TorchRecEnvironment& env, const contract::ProbeAnswer& answer) {
  env.torchrec = answer.versions.torchrec;
  env.torch = answer.versions.torch;
  env.fbgemm_gpu = answer.versions.fbgemm_gpu;
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

std::optional<TorchRecEnvironment> release_environment(const scenario::System& system, std::string& why_not) {
  TorchRecEnvironment env;
  env.dir = environment_dir(system);
  env.python = env.dir + "/bin/python";
  env.pins = system.pins;
  const std::string ready = env.dir + "/dmpcheck-ready.json";
  if ((!fs::exists(ready) || !fs::exists(env.python)) && settings().install_releases) {
    static std::mutex installing;  // cells run side by side wait for one install
    std::lock_guard<std::mutex> lock(installing);
    if (!fs::exists(ready)) {
      const std::string failure = install_release(system);
      if (!failure.empty()) throw EnvironmentNotMade(failure);
    }
  }
  const std::string missing = fmt::format("{} is not installed in {}: run `bash ci/torchrec-env.sh {}`", label(system),
                                          env.dir, installer_argument(system));
  if (!fs::exists(ready) || !fs::exists(env.python)) {
    why_not = missing;
    return std::nullopt;
  }
  // Held while the cell runs, so the installer's eviction passes it by; taken after an eviction
  // that held it exclusively, the environment may be gone: then it is missing.
  const int fd = ::open((env.dir + "/dmpcheck-in-use.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd >= 0) {
    while (::flock(fd, LOCK_SH) != 0 && errno == EINTR) {}
    env.in_use = std::shared_ptr<void>(nullptr, [fd](void*) { ::close(fd); });
  }
  if (!fs::exists(ready)) {
    why_not = missing;
    return std::nullopt;
  }
  // For the installer's least-recently-used eviction (ci/torchrec-env.sh).
  std::ofstream(env.dir + "/dmpcheck-last-used").put('\n');
  try {
    take_versions(env, contract::read_document_file<contract::ProbeAnswer>(ready));
  } catch (const Error& unreadable) {
    // Marked by another dmpcheck's installer (another schema): asked again, and marked anew.
    fmt::print(stderr, "dmpcheck: {} is not this dmpcheck's probe answer ({}): asking the environment again\n", ready,
               unreadable.what());
    try {
      const contract::ProbeAnswer answer = probe(env.python, label(system) + "'s environment " + env.dir);
      write_file_atomically(ready, nlohmann::json(answer).dump());
      take_versions(env, answer);
    } catch (const Error& e) {
      why_not = fmt::format("{}: run `bash ci/torchrec-env.sh {}` again", e.what(), installer_argument(system));
      return std::nullopt;
    }
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

// ---- TorchRec's repository ----

void require_torchrec_repository() {
  DMP_CHECK(!settings().torchrec_repo.empty(), ErrorKind::kInvalidInput,
            "a torchrec@<rev> system needs TorchRec's git repository: give --torchrec-repo PATH|URL|BUNDLE (or set "
            "DMPCHECK_TORCHREC_REPO), e.g. --torchrec-repo https://github.com/pytorch/torchrec");
}

void require_torchrec_repository_for(const std::vector<scenario::System>& systems) {
  if (std::any_of(systems.begin(), systems.end(),
                  [](const scenario::System& s) { return s.kind == scenario::System::Kind::kCommit; })) {
    require_torchrec_repository();
  }
}

TorchRecRepository TorchRecRepository::open() {
  require_torchrec_repository();
  std::string given = settings().torchrec_repo;
  // A local path is named absolutely (its clone in the cache is the same from any directory).
  std::error_code canonical_error;
  if (const auto absolute = fs::canonical(given, canonical_error); !canonical_error) given = absolute.string();
  // A local repository is used where it is; anything else (a URL, a bundle file) is cloned once.
  if (fs::is_directory(given)) {
    const Captured c = capture({"git", "-C", given, "rev-parse", "--git-dir"});
    DMP_CHECK(c.ok(), ErrorKind::kInvalidInput, "--torchrec-repo {}: not a git repository ({})", given, trim(c.output));
    return TorchRecRepository(given);
  }
  const std::string mirror = fmt::format("{}/repos/torchrec-{}.git", torchrec_environments_root(), [&] {
    const auto h = sha256(given);
    return to_hex(h.data(), h.size()).substr(0, 12);
  }());
  if (!fs::exists(mirror + "/HEAD")) {
    fs::create_directories(fs::path(mirror).parent_path());
    const std::string staging = fmt::format("{}.partial-{}", mirror, ::getpid());
    std::error_code ec;
    fs::remove_all(staging, ec);
    fmt::print(stderr, "dmpcheck: cloning {} into {} (once)\n", given, mirror);
    const Captured c = capture({"git", "clone", "--quiet", "--mirror", given, staging}, {}, std::chrono::seconds(1800));
    if (!c.ok()) {
      fs::remove_all(staging, ec);
      throw_error(ErrorKind::kInvalidInput,
                  fmt::format("--torchrec-repo {}: git clone failed:{}", given, last_lines(c.output, 4)));
    }
    fs::rename(staging, mirror, ec);  // another process may have finished first: theirs stays
    if (ec) fs::remove_all(staging, ec);
  }
  return TorchRecRepository(mirror);
}

std::string TorchRecRepository::git(const std::vector<std::string>& args, const std::string& what) const {
  std::vector<std::string> argv = {"git", "-C", path_};
  argv.insert(argv.end(), args.begin(), args.end());
  const Captured c = capture(argv);
  DMP_CHECK(c.ok(), ErrorKind::kInvalidInput, "{} in TorchRec's repository {}: {}", what, path_, trim(c.output));
  return trim(c.output);
}

Commit TorchRecRepository::resolve(const std::string& rev) const {
  const Captured c = capture({"git", "-C", path_, "rev-parse", "--verify", "--quiet", rev + "^{commit}"});
  DMP_CHECK(c.ok(), ErrorKind::kInvalidInput, "torchrec@{}: TorchRec's repository {} has no commit '{}'", rev, path_,
            rev);
  const std::string hash = trim(c.output);
  const std::string line = git({"log", "-1", "--format=%cs%x09%s", hash}, "reading commit " + hash);
  const auto tab = line.find('\t');
  return {hash, line.substr(tab + 1), line.substr(0, tab)};
}

std::optional<std::string> TorchRecRepository::release_tag(const std::string& version) const {
  const std::string tag = "v" + version;
  const Captured c = capture({"git", "-C", path_, "rev-parse", "--verify", "--quiet", "refs/tags/" + tag});
  if (!c.ok()) return std::nullopt;
  return tag;
}

bool TorchRecRepository::is_ancestor(const std::string& ancestor, const std::string& descendant) const {
  const Captured c = capture({"git", "-C", path_, "merge-base", "--is-ancestor", ancestor, descendant});
  DMP_CHECK(c.exit_code == 0 || c.exit_code == 1, ErrorKind::kInvalidInput, "git merge-base in {}: {}", path_,
            trim(c.output));
  return c.exit_code == 0;
}

std::string TorchRecRepository::merge_base(const std::string& a, const std::string& b) const {
  return git({"merge-base", a, b}, fmt::format("the merge base of {} and {}", a, b));
}

std::vector<Commit> TorchRecRepository::first_parent_range(const std::string& from, const std::string& to) const {
  const std::string listing = git({"log", "--first-parent", "--reverse", "--format=%H%x09%cs%x09%s", from + ".." + to},
                                  fmt::format("listing the commits {}..{}", from, to));
  std::vector<Commit> out;
  std::istringstream in(listing);
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find('\t');
    const auto b = line.find('\t', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    out.push_back({line.substr(0, a), line.substr(b + 1), line.substr(a + 1, b - a - 1)});
  }
  return out;
}

std::string TorchRecRepository::base_release(const Commit& commit, const std::vector<std::string>& pinned,
                                             std::string* why) const {
  for (size_t i = 0; i < pinned.size(); ++i) {
    const auto tag = release_tag(pinned[i]);
    if (!tag || !is_ancestor(commit.hash, *tag)) continue;
    if (i == 0) {
      *why = fmt::format("commit {} is already in torchrec {}, the oldest pinned release: no pinned environment is "
                         "older than it",
                         commit.short_hash(), pinned[i]);
      return "";
    }
    return pinned[i - 1];
  }
  DMP_CHECK(!pinned.empty(), ErrorKind::kInvalidInput, "no release is pinned in torchrec_sut/pins.tsv");
  return pinned.back();
}

std::string TorchRecRepository::source_tree(const Commit& commit) const {
  std::string dir = fmt::format("{}/commits/{}", torchrec_environments_root(), commit.hash);
  if (fs::exists(dir + "/torchrec/__init__.py")) return dir;
  const std::string staging = fmt::format("{}.partial-{}", dir, ::getpid());
  std::error_code ec;
  fs::remove_all(staging, ec);
  fs::create_directories(staging);
  git({"archive", "--format=tar", "-o", staging + "/source.tar", commit.hash, "torchrec"},
      "extracting the source of " + commit.short_hash());
  const Captured untar = capture({"tar", "-xf", staging + "/source.tar", "-C", staging});
  DMP_CHECK(untar.ok(), ErrorKind::kInternal, "tar failed on {}: {}", staging, trim(untar.output));
  fs::remove(staging + "/source.tar", ec);
  fs::rename(staging, dir, ec);  // another process may have finished first: theirs stays
  if (ec) fs::remove_all(staging, ec);
  DMP_CHECK(fs::exists(dir + "/torchrec/__init__.py"), ErrorKind::kInvalidInput,
            "commit {} has no torchrec/__init__.py: is {} TorchRec's repository?", commit.short_hash(), path_);
  return dir;
}

}  // namespace dmpcheck::run
