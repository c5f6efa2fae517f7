#include "run/subprocess.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"
#include "common/interrupt.h"

extern char** environ;

namespace dmpcheck::run {
namespace {

// Starts argv (looked up on PATH) with `envp`, its stdin /dev/null when `null_stdin`; with `output`,
// its stdout and stderr go to a pipe whose read end is put there; with `own_group`, in a process
// group of its own (its pid), so that it and what it starts are killed together.
// Error(kInvalidInput) when it cannot be started.
pid_t spawn_child(const std::vector<std::string>& argv, char* const* envp, bool null_stdin, int* output,
                  bool own_group = false) {
  std::vector<std::string> argv_copy = argv;
  std::vector<char*> args = c_argv(argv_copy);
  int fds[2] = {-1, -1};
  DMP_CHECK(output == nullptr || ::pipe2(fds, O_CLOEXEC) == 0, ErrorKind::kInternal, "pipe2: {}", std::strerror(errno));
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (null_stdin) posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  if (output != nullptr) {
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  }
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  if (own_group) {
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attributes, 0);
  }
  pid_t pid = 0;
  const int spawned = ::posix_spawnp(&pid, args[0], &actions, &attributes, args.data(), envp);
  posix_spawnattr_destroy(&attributes);
  posix_spawn_file_actions_destroy(&actions);
  if (output != nullptr) ::close(fds[1]);
  if (spawned != 0) {
    if (output != nullptr) ::close(fds[0]);
    throw_error(ErrorKind::kInvalidInput, fmt::format("cannot start {}: {}", argv[0], std::strerror(spawned)));
  }
  if (output != nullptr) *output = fds[0];
  return pid;
}

}  // namespace

std::vector<char*> c_argv(std::vector<std::string>& storage) {
  std::vector<char*> out;
  for (auto& s : storage) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

Captured capture(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment,
                 std::chrono::seconds deadline) {
  DMP_CHECK(!argv.empty(), ErrorKind::kInternal, "capture: no program");
  // The child's environment: ours, with `environment`'s entries in place of any of the same name.
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const auto eq = entry.find('=');
    if (eq != std::string::npos && environment.count(entry.substr(0, eq)) != 0) continue;
    env_strings.push_back(entry);
  }
  for (const auto& [k, v] : environment) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp = c_argv(env_strings);
  int output = -1;
  const pid_t pid = spawn_child(argv, envp.data(), true, &output, true);
  Captured out;
  const auto until = std::chrono::steady_clock::now() + deadline;
  char buffer[4096];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
    out.interrupted = interrupt_requested();
    if (left <= 0 || out.interrupted) {
      // The program and whatever it started (git's transport helpers): killed together, reaped below.
      out.timed_out = !out.interrupted;
      ::kill(-pid, SIGKILL);
      break;
    }
    pollfd p{output, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 200)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;
    const ssize_t n = ::read(output, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of output: the child (and anything it left running) closed it
    out.output.append(buffer, static_cast<size_t>(n));
  }
  ::close(output);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  // What it left running in its group (a helper holding the pipe) ends with it.
  ::kill(-pid, SIGKILL);
  out.exit_code = WIFEXITED(status) && !out.timed_out && !out.interrupted ? WEXITSTATUS(status) : -1;
  out.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  return out;
}

std::string Captured::ended(std::chrono::seconds deadline) const {
  if (interrupted) return "was interrupted (dmpcheck received SIGINT or SIGTERM)";
  if (timed_out) return fmt::format("took longer than {} s", deadline.count());
  if (term_signal != 0) return fmt::format("was killed by signal {} (SIG{})", term_signal, sigabbrev_np(term_signal));
  return fmt::format("exited {}", exit_code);
}

int run_visible(const std::vector<std::string>& argv, std::string* tail, size_t keep) {
  DMP_CHECK(!argv.empty(), ErrorKind::kInternal, "run_visible: no program");
  std::fflush(nullptr);
  int output = -1;
  const pid_t pid = spawn_child(argv, environ, false, tail != nullptr ? &output : nullptr);
  if (tail != nullptr) {
    char buffer[4096];
    for (;;) {
      const ssize_t n = ::read(output, buffer, sizeof(buffer));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;  // end of output: the child (and anything it left running) closed it
      for (ssize_t done = 0; done < n;) {
        const ssize_t w = ::write(STDERR_FILENO, buffer + done, static_cast<size_t>(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;  // our stderr is gone: the words are still kept
        done += w;
      }
      tail->append(buffer, static_cast<size_t>(n));
      if (tail->size() > 2 * keep) tail->erase(0, tail->size() - keep);
    }
    ::close(output);
    if (tail->size() > keep) tail->erase(0, tail->size() - keep);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

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

}  // namespace dmpcheck::run
