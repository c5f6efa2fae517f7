#include "common/file_io.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"

namespace dmpcheck {

void write_file_atomically(const std::string& path, std::string_view bytes) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  DMP_CHECK(!ec, ErrorKind::kInvalidInput, "cannot create the directory {}: {}", target.parent_path().string(),
            ec.message());
  std::string temporary = path + ".XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  DMP_CHECK(fd >= 0, ErrorKind::kInvalidInput, "cannot create a file next to {}: {}", path, std::strerror(errno));
  // Removes the temporary file (closing it first unless it is closed) and says why: `what` and errno.
  auto fail = [&](const std::string& what, bool closed = false) {
    const std::string reason = std::strerror(errno);
    if (!closed) ::close(fd);
    ::unlink(temporary.c_str());
    throw_error(ErrorKind::kInvalidInput, fmt::format("{}: {}", what, reason));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing " + path);
    done += static_cast<size_t>(n);
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail("setting the permissions of " + path);
  if (::close(fd) != 0) fail("writing " + path, /*closed=*/true);
  if (::rename(temporary.c_str(), path.c_str()) != 0) fail(fmt::format("cannot move {} into place", path), true);
}

namespace {

std::string temporary_root() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// "<pid> <start time in clock ticks> <pid namespace>": one process, told apart from a later one
// given the same pid.  Empty when the process does not exist.
std::string process_identity(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return "";
  std::istringstream fields(stat.substr(name_end + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {  // field 22 of proc(5): starttime
  }
  std::error_code ec;
  const auto ns = std::filesystem::read_symlink("/proc/" + pid + "/ns/pid", ec);
  return fmt::format("{} {} {}", pid, field, ns.string());
}

std::string own_pid_namespace() {
  std::error_code ec;
  return std::filesystem::read_symlink("/proc/self/ns/pid", ec).string();
}

}  // namespace

PrivateDir::PrivateDir(const std::string& stem, bool keep) : keep_(keep) {
  std::string pattern = temporary_root() + "/" + stem + "-XXXXXX";
  DMP_CHECK(::mkdtemp(pattern.data()) != nullptr, ErrorKind::kRankFailed,
            "cannot create a private directory from {}: {}", pattern, std::strerror(errno));
  path_ = pattern;
  // Written at once: a full TMPDIR is said here, before a store or a rank meets it (c10d's
  // FileStore aborts the process from its destructor when it cannot write).
  try {
    write_file_atomically(path_ + "/.owner", process_identity(std::to_string(::getpid())) + "\n");
  } catch (const Error& e) {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    throw_error(ErrorKind::kInvalidInput,
                fmt::format("cannot write in the temporary directory {} ({}); free space there or set TMPDIR",
                            temporary_root(), e.what()));
  }
}

std::vector<std::string> remove_private_dirs_of_gone_makers() {
  namespace fs = std::filesystem;
  std::vector<std::string> removed;
  const std::string ns = own_pid_namespace();
  std::error_code ec;
  for (fs::directory_iterator it(temporary_root(), ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& dir = it->path();
    struct stat info {};
    if (dir.filename().string().rfind("dmpcheck-", 0) != 0 || ::lstat(dir.c_str(), &info) != 0 ||
        !S_ISDIR(info.st_mode) || info.st_uid != ::getuid()) {
      continue;
    }
    std::ifstream in(dir / ".owner");
    std::string recorded;
    if (!std::getline(in, recorded)) continue;
    std::istringstream words(recorded);
    std::string pid, start, owner_ns;
    if (!(words >> pid >> start >> owner_ns) || owner_ns != ns || ns.empty()) continue;
    if (process_identity(pid) == recorded) continue;  // its maker still runs
    std::error_code remove_error;
    fs::remove_all(dir, remove_error);
    if (!remove_error) removed.push_back(dir.string());
  }
  return removed;
}

PrivateDir::~PrivateDir() {
  if (keep_) {
    std::fprintf(stderr, "dmpcheck: kept %s (DMPCHECK_KEEP_EXCHANGE is set)\n", path_.c_str());
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dmpcheck
