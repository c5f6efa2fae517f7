// Writing a file so that a reader never sees half of it and nobody can redirect the write: the
// bytes go to a new file made with mkstemp (O_EXCL, an unpredictable name, 0600) in the target's
// directory, which is then renamed over the target.  A file or symlink planted at any name the
// writer might use cannot catch the bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dmpcheck {

// Creates the parent directories.  Error(kInvalidInput) naming the path on failure; the
// temporary file is removed.  The target ends with the usual permissions (0666 & ~umask).
void write_file_atomically(const std::string& path, std::string_view bytes);

// A private directory (mkdtemp under $TMPDIR: 0700, an unpredictable name, "<stem>-XXXXXX"),
// removed with everything in it however its scope ends -- unless `keep` (DMPCHECK_KEEP_EXCHANGE,
// common/settings.h), when its path is printed instead.  Error(kRankFailed) when it cannot be made.
// It names its maker in a file `.owner` (pid, start time, pid namespace), so that a directory
// whose maker was killed (SIGKILL: nothing ran to remove it) is removed by the next dmpcheck.
class PrivateDir {
 public:
  explicit PrivateDir(const std::string& stem, bool keep = false);
  ~PrivateDir();
  PrivateDir(const PrivateDir&) = delete;
  PrivateDir& operator=(const PrivateDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

// Removes every private directory under $TMPDIR ("dmpcheck-*", this user's) whose maker is gone:
// its `.owner` names a process of this pid namespace that no longer runs (or another process now
// has its pid).  A directory without `.owner`, or of a live maker, is left alone.  Returns the
// paths removed.
std::vector<std::string> remove_private_dirs_of_gone_makers();

}  // namespace dmpcheck
