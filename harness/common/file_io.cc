#include "common/file_io.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fcntl.h>
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
  auto fail = [&](const std::string& what) {
    const std::string reason = std::strerror(errno);
    ::close(fd);
    ::unlink(temporary.c_str());
    throw_error(ErrorKind::kInvalidInput, fmt::format("{} {}: {}", what, path, reason));
  };
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing");
    done += static_cast<size_t>(n);
  }
  const mode_t mask = ::umask(0);
  ::umask(mask);
  if (::fchmod(fd, 0666 & ~mask) != 0) fail("setting the permissions of");
  if (::close(fd) != 0) {
    ::unlink(temporary.c_str());
    throw_error(ErrorKind::kInvalidInput, fmt::format("writing {}: {}", path, std::strerror(errno)));
  }
  if (::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    ::unlink(temporary.c_str());
    throw_error(ErrorKind::kInvalidInput, fmt::format("cannot move {} into place: {}", path, reason));
  }
}

PrivateDir::PrivateDir(const std::string& stem, const char* keep) : keep_(keep) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/" + stem + "-XXXXXX";
  DMP_CHECK(::mkdtemp(pattern.data()) != nullptr, ErrorKind::kRankFailed,
            "cannot create a private directory from {}: {}", pattern, std::strerror(errno));
  path_ = pattern;
}

PrivateDir::~PrivateDir() {
  if (keep_ != nullptr && std::getenv(keep_) != nullptr) {
    std::fprintf(stderr, "dmpcheck: kept %s (%s is set)\n", path_.c_str(), keep_);
    return;
  }
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

}  // namespace dmpcheck
