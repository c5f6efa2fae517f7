// What a TorchRec system runs under.  Every system but the reference runs the same rank program
// (torchrec_sut/) under some Python: a pinned release's environment (ci/torchrec-env.sh), the
// user's own interpreter (`python:/path`), or a TorchRec commit's source put first on PYTHONPATH
// over the environment of the pinned release it descends from (`torchrec@<rev>`; TorchRec is pure
// Python, so torch and fbgemm come from that release's pins).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "run/launcher.h"
#include "scenario/system.h"

namespace dmpcheck::run {

struct TorchRecEnvironment {
  std::string python;                       // the interpreter
  std::string dir;                          // the release's venv; empty for a user's interpreter
  std::string torchrec, torch, fbgemm_gpu;  // as its import reported them
  // A set of pins: the packages pinned beside the release (scenario::System::pins).
  std::vector<std::pair<std::string, std::string>> pins;
  // A commit: its source tree (first on PYTHONPATH), full hash, subject, and whose environment.
  std::string source_dir, commit, subject, base_release;
  // A release's environment is held (dmpcheck-in-use.lock, shared) while any copy of this lives:
  // the installer's least-recently-used eviction (ci/torchrec-env.sh) passes it by.
  std::shared_ptr<void> in_use;
  // What the report says it ran: "1.9.2", "1.2.0 with fbgemm-gpu-cpu==1.1.0", "cc482f8a (Broadcast DP tables when init;
  // its source over the torchrec 0.7.0 environment)", or the interpreter's own torchrec version.
  std::string describe() const;
};

// An environment the installer was asked to make (`--install`) and did not: the message is the
// set, the command and the installer's last words (the resolver's, or the import's).
struct EnvironmentNotMade : Error {
  explicit EnvironmentNotMade(const std::string& message) : Error(ErrorKind::kInvalidInput, message) {}
};

// The environment `system` (not the reference) runs under, or nullopt with `why_not` when it is not
// installed yet (a release, or a commit's base release: the cell is skipped with the command that
// installs it).  Throws EnvironmentNotMade where it was to be installed and the installer failed,
// and Error(kInvalidInput) for what cannot work as given: an interpreter where torch, fbgemm_gpu or
// torchrec does not import (naming which, with its error), a revision the repository does not
// have, no repository to find it in.
std::optional<TorchRecEnvironment> resolve_environment(const scenario::System& system, std::string& why_not);

// A release (or set of pins) whose environment is not installed and will not be installed by this
// command (no --install): the installer's argument for it ("0.3.1", "'torchrec==1.2.0 ...'"), for
// saying every such release once; nullopt for anything else.
std::optional<std::string> release_not_installed(const scenario::System& system);

// What is wrong with the hook file at `path` (torchrec: {hooks}), one "FILE:LINE: ..." line each,
// as `python -m dmpcheck_torchrec.hooks check` says under `env`'s interpreter (no torch imported).
std::vector<std::string> check_hook_file(const TorchRecEnvironment& env, const std::string& path);

// A launch of a torchrec_sut module under `env` (the one place its environment is set).
LaunchRequest torchrec_launch(const TorchRecEnvironment& env, std::vector<std::string> arguments,
                              const std::string& error_dir);

// Queues the warm interpreters of the installed releases among `systems` (in the order given: the
// order their cells come) to start in the background (WarmInterpreter::prestart), so that their
// imports overlap the cells before them.  Commits and a user's interpreter are not started
// ahead (naming their environment means asking git or the interpreter); nor is anything with
// exec-ed ranks (`exec_ranks`, DMPCHECK_RANKS=exec), which no warm interpreter serves.
void prestart_release_interpreters(const std::vector<scenario::System>& systems, bool exec_ranks);

// $DMPCHECK_TORCHREC_ENVS, else $XDG_CACHE_HOME/dmpcheck/torchrec, else ~/.cache/dmpcheck/torchrec.
std::string torchrec_environments_root();
// A release's environment under it: torchrec-1.9.2, torchrec-1.2.0+fbgemm-gpu-cpu=1.1.0 (the name
// ci/torchrec-env.sh gives it: the release, then each pin in name order).
std::string environment_dir(const scenario::System& system);
// The rank program: $DMPCHECK_TORCHREC_SUT, else this source tree's, else the installed copy.
std::string torchrec_sut_dir();
// The releases torchrec_sut/pins.tsv pins, oldest first.
std::vector<std::string> pinned_releases();
// Versions ordered as numbers ("0.10.0" after "0.9.0").
bool version_less(const std::string& a, const std::string& b);

// TorchRec's git repository, where commits are found: $DMPCHECK_TORCHREC_REPO (set by
// `--torchrec-repo`), a local clone used in place, or a URL or bundle cloned once into the cache.
struct Commit {
  std::string hash, subject, date;  // date: the committer's, YYYY-MM-DD
  std::string short_hash() const { return hash.substr(0, 8); }
};

// Error(kInvalidInput) naming --torchrec-repo when no TorchRec repository is given; the second,
// only when `systems` (the cells a command is about to run) hold a commit: a command line's
// mistake, said before any cell runs, not each commit cell's error.
void require_torchrec_repository();
void require_torchrec_repository_for(const std::vector<scenario::System>& systems);

class TorchRecRepository {
 public:
  // Throws Error(kInvalidInput) naming --torchrec-repo when there is none, or git's words when it fails.
  static TorchRecRepository open();
  const std::string& path() const { return path_; }
  Commit resolve(const std::string& rev) const;
  // "v0.7.0" where the repository has that tag.
  std::optional<std::string> release_tag(const std::string& version) const;
  bool is_ancestor(const std::string& ancestor, const std::string& descendant) const;
  std::string merge_base(const std::string& a, const std::string& b) const;
  // The commits from `to` back along first parents to (not including) `from`, oldest first.
  std::vector<Commit> first_parent_range(const std::string& from, const std::string& to) const;
  // The pinned release whose environment a commit runs over: the one before the oldest pinned
  // release whose tag contains it; with none containing it, the newest pinned release.  Empty,
  // with `why`, when the commit is in the oldest pinned release already.
  std::string base_release(const Commit& commit, const std::vector<std::string>& pinned, std::string* why) const;
  // The commit's torchrec/ package, extracted once into the cache; the folder to put on PYTHONPATH.
  std::string source_tree(const Commit& commit) const;

 private:
  explicit TorchRecRepository(std::string path) : path_(std::move(path)) {}
  std::string git(const std::vector<std::string>& args, const std::string& what) const;
  std::string path_;
};

}  // namespace dmpcheck::run
