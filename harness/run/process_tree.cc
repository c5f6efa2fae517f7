#include "run/process_tree.h"

#include <cerrno>
#include <csignal>
#include <cstring>
#include <thread>

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

namespace dmpcheck::run {

std::string read_proc_file(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the end, or the process is gone (ESRCH): what was read so far
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

namespace {

struct Stat {
  pid_t pid = 0;
  pid_t ppid = 0;
  char state = '?';
  uint64_t start = 0;
  std::string name;
};

// /proc/PID/stat: "pid (comm) state ppid ... starttime(22nd field)"; false when it is gone.
bool read_stat(pid_t pid, Stat& out) {
  const std::string stat = read_proc_file(fmt::format("/proc/{}/stat", pid));
  const auto open = stat.find('(');
  const auto close = stat.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close + 2 >= stat.size()) return false;
  out.pid = pid;
  out.name = stat.substr(open + 1, close - open - 1);
  out.state = stat[close + 2];
  // Fields after the name, from the 3rd (state): ppid is the 4th, starttime the 22nd.
  const char* p = stat.c_str() + close + 2;
  for (int field = 3; field <= 22 && *p != '\0'; ++field) {
    if (field == 4) out.ppid = static_cast<pid_t>(std::strtol(p, nullptr, 10));
    if (field == 22) out.start = std::strtoull(p, nullptr, 10);
    p = std::strchr(p, ' ');
    if (p == nullptr) break;
    ++p;
  }
  return true;
}

std::vector<Stat> all_processes() {
  std::vector<Stat> out;
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return out;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    Stat s;
    if (end != entry->d_name && *end == '\0' && read_stat(static_cast<pid_t>(pid), s)) out.push_back(s);
  }
  ::closedir(dir);
  return out;
}

bool environment_holds(pid_t pid, const std::string& marker) {
  const std::string env = read_proc_file(fmt::format("/proc/{}/environ", pid));
  size_t at = 0;
  while (at < env.size()) {
    const size_t end = env.find('\0', at);
    const size_t length = (end == std::string::npos ? env.size() : end) - at;
    if (env.compare(at, length, marker) == 0) return true;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return false;
}

}  // namespace

ProcessTree::ProcessTree(std::string marker) : marker_(std::move(marker)) {}

void ProcessTree::add_root(pid_t pid) {
  roots_.insert(pid);
  Stat s;
  if (read_stat(pid, s)) members_[pid] = {s.start, s.name};
}

void ProcessTree::scan() {
  const std::vector<Stat> live = all_processes();
  const pid_t self = ::getpid();
  bool grew = true;
  while (grew) {  // a grandchild's parent may come later in /proc's order than it
    grew = false;
    for (const auto& s : live) {
      if (s.pid == self || s.state == 'Z') continue;
      const auto known = members_.find(s.pid);
      if (known != members_.end() && known->second.start == s.start) continue;
      const auto parent = members_.find(s.ppid);
      bool ours = parent != members_.end();
      if (!ours && !marker_.empty()) {
        auto& checked = environ_checked_[s.pid];
        if (checked != s.start + 1) {  // +1: 0 means never read
          checked = s.start + 1;
          ours = environment_holds(s.pid, marker_);
        }
      }
      if (ours) {
        members_[s.pid] = {s.start, s.name};
        grew = true;
      }
    }
  }
}

std::vector<std::string> ProcessTree::kill_strays() {
  std::vector<std::string> killed;
  std::set<pid_t> said;
  for (int round = 0; round < 20; ++round) {
    scan();
    bool any = false;
    for (const auto& [pid, seen] : members_) {
      if (roots_.count(pid) != 0) continue;
      Stat now;
      if (!read_stat(pid, now) || now.start != seen.start || now.state == 'Z') continue;
      any = true;
      ::kill(pid, SIGKILL);
      if (said.insert(pid).second) killed.push_back(fmt::format("pid {} ({})", pid, seen.name));
    }
    if (!any) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Orphans adopted by this process (the subreaper) are reaped, so that none is left a zombie; a
  // killed member whose parent still lives is its parent's to reap.
  const pid_t self = ::getpid();
  for (const auto& [pid, seen] : members_) {
    Stat now;
    if (roots_.count(pid) == 0 && read_stat(pid, now) && now.start == seen.start && now.ppid == self) {
      while (::waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
    }
  }
  return killed;
}

void become_subreaper() { ::prctl(PR_SET_CHILD_SUBREAPER, 1); }

}  // namespace dmpcheck::run
