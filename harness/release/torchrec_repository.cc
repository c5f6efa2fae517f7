// TorchRec's git repository, for `torchrec@<rev>` systems and commit bisection: opened or cloned
// once per command (settings().torchrec_repo: a path, a URL, a bundle), each commit's source
// exported into a folder of its own beside the release environments.
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/digest.h"
#include "common/error.h"
#include "common/settings.h"
#include "release/torchrec_systems.h"
#include "run/subprocess.h"

namespace dmpcheck::run {

namespace fs = std::filesystem;

namespace {

// `<name>.partial-<pid>` folders under `dir` whose maker no longer runs (a clone or an export that
// was killed): removed, so that nothing a killed command staged stays in the cache.
void remove_partials_of_gone_makers(const std::string& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const auto at = name.rfind(".partial-");
    if (at == std::string::npos) continue;
    char* stop = nullptr;
    const long pid = std::strtol(name.c_str() + at + 9, &stop, 10);
    if (stop == name.c_str() + at + 9 || *stop != '\0' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM) continue;  // its maker still runs
    std::error_code removed;
    fs::remove_all(it->path(), removed);
    if (!removed) fmt::print(stderr, "dmpcheck: removed {}, left by a dmpcheck that was killed\n", it->path().string());
  }
}

}  // namespace

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
    remove_partials_of_gone_makers(fs::path(mirror).parent_path().string());
    const std::string staging = fmt::format("{}.partial-{}", mirror, ::getpid());
    std::error_code ec;
    fs::remove_all(staging, ec);
    const auto budget = std::chrono::seconds(static_cast<int64_t>(std::max(1.0, settings().command_budget_s)));
    fmt::print(stderr, "dmpcheck: cloning {} into {} (once, within {} s)\n", given, mirror, budget.count());
    // "--" ends git's options: the repository is never read as one.  git's own allow-list keeps the
    // transports to those a user means, submodules and redirects included, and nothing prompts.
    const Captured c =
        capture({"git", "clone", "--quiet", "--mirror", "--", given, staging},
                {{"GIT_ALLOW_PROTOCOL", "file:https:http:ssh:git"}, {"GIT_TERMINAL_PROMPT", "0"}}, budget);
    if (!c.ok()) {
      fs::remove_all(staging, ec);
      DMP_CHECK(!c.interrupted, ErrorKind::kInvalidInput, "--torchrec-repo {}: the clone was interrupted", given);
      DMP_CHECK(!c.timed_out, ErrorKind::kTimeout, "--torchrec-repo {}: the clone took longer than {} s (--budget)",
                given, budget.count());
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
  remove_partials_of_gone_makers(fs::path(dir).parent_path().string());
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
