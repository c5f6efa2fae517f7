#include "run/warm_interpreter.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/file_io.h"
#include "common/settings.h"
#include "run/launcher.h"
#include "run/preflight.h"
#include "run/rank_run.h"
#include "run/subprocess.h"

namespace dmpcheck::run {
namespace {

using Clock = std::chrono::steady_clock;

// How long the interpreter may take to import the stack (a cold disk, a slow machine).
constexpr auto kReadyTimeout = std::chrono::seconds(300);
// How long it may take to answer a spawn request (it forks: milliseconds).
constexpr auto kSpawnTimeout = std::chrono::seconds(60);
constexpr size_t kMaxPacket = 1 << 20;

std::string tail_of(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  for (std::string line; std::getline(in, line);) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += "\n  | " + all[i];
  return out;
}

// Every interpreter this process started, by what it runs; failures are kept so as not to retry.
struct Registry {
  struct Entry {
    std::shared_ptr<WarmInterpreter> warm;
    std::string failed;
    uint64_t last_used = 0;
    std::shared_ptr<void> hold;  // what prestart was asked to keep with it
  };
  std::mutex mutex;
  std::map<std::string, Entry> entries;
  std::vector<std::pair<std::string, WarmInterpreter::Wanted>> queued;  // prestart's, in order of use
  uint64_t clock = 0;
  // At exit: every interpreter is told to go (its socket closed) and waited for, so that nothing
  // it forked outlives the command.
  ~Registry() { entries.clear(); }
};

Registry& registry() {
  static Registry r;
  return r;
}

std::string key_of(const WarmInterpreter::Wanted& w) {
  std::string key = w.python;
  for (const auto& [k, v] : w.environment) key += "\n" + k + "=" + v;
  for (const auto& m : w.preload) key += "\n" + m;
  return key;
}

// The interpreters started and still importing (they have not spoken yet).
size_t importing(Registry& reg) {
  return std::count_if(reg.entries.begin(), reg.entries.end(), [](auto& entry) {
    const auto& warm = entry.second.warm;
    return warm && !warm->ready() && !warm->answered();
  });
}

// Why ranks start cold when the interpreter of `python` fails to start or to import its stack.
std::string cold_reason(const std::string& python, const std::exception& e) {
  return fmt::format("the warm interpreter of {} could not serve ({}): ranks start cold", python, e.what());
}

size_t live(Registry& reg) {
  return std::count_if(reg.entries.begin(), reg.entries.end(),
                       [](auto& entry) { return entry.second.warm != nullptr; });
}

// Starts queued interpreters while fewer than `at_once` import and fewer than `kept` live.
void pump_locked(Registry& reg) {
  const int at_once = WarmInterpreter::prestart_at_once();
  while (!reg.queued.empty() && at_once > 0 && importing(reg) < static_cast<size_t>(at_once) &&
         live(reg) < WarmInterpreter::kept()) {
    auto [key, wanted] = std::move(reg.queued.front());
    reg.queued.erase(reg.queued.begin());
    if (reg.entries.count(key) != 0) continue;  // started (or failed) since it was queued
    Registry::Entry entry;
    entry.last_used = ++reg.clock;
    entry.hold = wanted.hold;
    try {
      entry.warm = WarmInterpreter::start(wanted);
    } catch (const std::exception& e) { entry.failed = cold_reason(wanted.python, e); }
    reg.entries[key] = std::move(entry);
  }
}

}  // namespace

size_t WarmInterpreter::kept() {
  if (const auto set = settings().warm_interpreters) return static_cast<size_t>(*set);
  // One per 2 GiB of what the machine has free when first asked (read once: every launch asks):
  // a suite over every installed release keeps all of them (7 here) rather than importing one
  // again each time it comes back to it.
  static const auto by_memory =
      static_cast<size_t>(std::clamp(static_cast<long>(meminfo_available_bytes() / (int64_t{2} << 30)), 4L, 12L));
  return by_memory;
}

int WarmInterpreter::prestart_at_once() {
  if (const auto set = settings().warm_prestart) return *set;
  return std::max(2, available_cores() / 2);
}

void WarmInterpreter::prestart(std::vector<Wanted> wanted) {
  if (kept() == 0 || prestart_at_once() == 0) return;  // turned off
  Registry& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    for (auto& w : wanted) {
      std::string key = key_of(w);
      const bool queued =
          std::any_of(reg.queued.begin(), reg.queued.end(), [&](const auto& q) { return q.first == key; });
      if (!queued && reg.entries.count(key) == 0) reg.queued.emplace_back(std::move(key), std::move(w));
    }
  }
  pump();
}

void WarmInterpreter::pump() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  pump_locked(reg);
}

std::shared_ptr<WarmInterpreter> WarmInterpreter::get(const std::string& python,
                                                      const std::map<std::string, std::string>& environment,
                                                      const std::vector<std::string>& preload, std::string& why_not) {
  if (kept() == 0) {
    why_not = "warm interpreters are turned off (DMPCHECK_WARM_INTERPRETERS=0): ranks start cold";
    return nullptr;
  }
  const Wanted wanted{python, environment, preload, nullptr};
  const std::string key = key_of(wanted);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto found = reg.entries.find(key);
  if (found != reg.entries.end() && found->second.warm && found->second.warm->ready() && !found->second.warm->alive()) {
    reg.entries.erase(found);  // it died (killed from outside): a new one is started
    found = reg.entries.end();
  }
  if (found == reg.entries.end()) {
    // This one is wanted now: not from the queue later.
    reg.queued.erase(
        std::remove_if(reg.queued.begin(), reg.queued.end(), [&](const auto& q) { return q.first == key; }),
        reg.queued.end());
    // Room for one more: the least recently used interpreter no launch holds goes.
    std::vector<std::map<std::string, Registry::Entry>::iterator> idle;
    size_t running = 0;
    for (auto it = reg.entries.begin(); it != reg.entries.end(); ++it) {
      if (!it->second.warm) continue;
      ++running;
      if (it->second.warm.use_count() == 1 && it->second.warm->ready()) idle.push_back(it);
    }
    std::sort(idle.begin(), idle.end(), [](auto a, auto b) { return a->second.last_used < b->second.last_used; });
    for (size_t i = 0; running >= kept() && i < idle.size(); ++i, --running) reg.entries.erase(idle[i]);
    Registry::Entry entry;
    try {
      entry.warm = start(wanted);
    } catch (const std::exception& e) { entry.failed = cold_reason(python, e); }
    found = reg.entries.emplace(key, std::move(entry)).first;
  }
  Registry::Entry& entry = found->second;
  entry.last_used = ++reg.clock;
  if (entry.warm && !entry.warm->ready()) {
    try {
      entry.warm->await_ready();
    } catch (const std::exception& e) {
      entry.failed = cold_reason(python, e);
      entry.warm.reset();  // its socket closes and its process is reaped
    }
  }
  // While this one's ranks run, the next queued interpreters import.
  pump_locked(reg);
  why_not = entry.failed;
  return entry.warm;
}

std::shared_ptr<WarmInterpreter> WarmInterpreter::start(const Wanted& wanted) {
  const std::string& python = wanted.python;
  std::shared_ptr<WarmInterpreter> warm(new WarmInterpreter());
  warm->start_ = Clock::now();
  // The interpreter's own output (never a rank's) goes to a file shown when it fails to start.
  warm->dir_ = std::make_unique<PrivateDir>("dmpcheck-warm");
  warm->log_ = warm->dir_->path() + "/interpreter.log";
  const int log_fd = ::open(warm->log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int sv[2];
  DMP_CHECK(log_fd >= 0 && null_fd >= 0 && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) == 0,
            ErrorKind::kRankFailed, "cannot set up a warm interpreter: {}", std::strerror(errno));
  // Everything the child needs, built before fork(): between fork and exec only
  // async-signal-safe calls are allowed (a suite may run cells on several threads).
  std::vector<std::string> args = {python, "-m", "dmpcheck_torchrec.warm", std::to_string(sv[1])};
  args.insert(args.end(), wanted.preload.begin(), wanted.preload.end());
  // Importing torch starts its OpenMP pool unless told to keep one thread: a fork would copy a
  // pool without its threads.  Each rank sets its own count after the fork.
  std::map<std::string, std::string> ours = wanted.environment;
  ours["OMP_NUM_THREADS"] = "1";
  ours["MKL_NUM_THREADS"] = "1";
  // What torch and Python put in the temporary directory (torchinductor's cache, tempfile's
  // folders) goes into the interpreter's own, removed with it; its ranks inherit it.
  ours["TMPDIR"] = warm->dir_->path() + "/tmp";
  std::filesystem::create_directory(ours["TMPDIR"]);
  std::vector<std::string> env = child_environment(ours);
  std::vector<char*> argv = c_argv(args), envp = c_argv(env);
  const pid_t pid = ::fork();
  if (pid == 0) {
    // A process group of its own: Ctrl-C at a terminal is dmpcheck's to handle.
    ::setpgid(0, 0);
    ::fcntl(sv[1], F_SETFD, 0);  // the one descriptor it keeps across exec
    ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(sv[1]);
  ::close(log_fd);
  ::close(null_fd);
  if (pid < 0) {
    ::close(sv[0]);
    throw_error(ErrorKind::kRankFailed, fmt::format("fork failed: {}", std::strerror(errno)));
  }
  warm->pid_ = pid;
  warm->socket_ = sv[0];
  return warm;
}

void WarmInterpreter::await_ready() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Its first word: ready, or why not.
  while (pending_.empty() && alive_ && Clock::now() - start_ < kReadyTimeout && !interrupt_requested())
    read_messages(100);
  DMP_CHECK(!pending_.empty(), ErrorKind::kRankFailed, "{}{}",
            alive_ ? "it did not say it was ready within 300 s" : "it ended before it was ready", tail_of(log_, 6));
  const contract::WarmMessage ready = pending_.front();
  pending_.clear();
  DMP_CHECK(ready.kind == "ready", ErrorKind::kRankFailed, "{}",
            ready.why.empty() ? "its first word was '" + ready.kind + "', not 'ready'" : ready.why);
  import_s_ = ready.import_s;
  ready_ = true;
}

bool WarmInterpreter::answered() {
  std::lock_guard<std::mutex> lock(mutex_);
  read_messages(0);
  return !pending_.empty() || !alive_;
}

void WarmInterpreter::stop_all() {
  Registry& reg = registry();
  std::map<std::string, Registry::Entry> going;
  {
    std::lock_guard<std::mutex> lock(reg.mutex);
    going.swap(reg.entries);
    reg.queued.clear();
  }
}

WarmInterpreter::~WarmInterpreter() {
  if (socket_ >= 0) ::close(socket_);  // it kills what it forked and exits
  // One still importing (started ahead, never used: the command ended or was interrupted first)
  // reads its socket only once the import is done, and has forked nothing: it is stopped now,
  // not waited for.
  if (pid_ > 0 && !ready_) ::kill(pid_, SIGKILL);
  if (pid_ > 0) {
    int status = 0;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      ::usleep(2000);
    }
  }
}

bool WarmInterpreter::alive() {
  std::lock_guard<std::mutex> lock(mutex_);
  return read_messages(0);
}

bool WarmInterpreter::read_messages(int timeout_ms) {
  if (!alive_) return false;
  pollfd p{socket_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return alive_;
  buffer_.resize(kMaxPacket);  // once: the messages are small, and reap() polls this often
  for (;;) {
    const ssize_t n = ::recv(socket_, buffer_.data(), buffer_.size(), MSG_DONTWAIT);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // nothing more now
    if (n == 0) {      // it is gone; so are the ranks it forked
      alive_ = false;
      break;
    }
    const std::string text(buffer_.data(), static_cast<size_t>(n));
    contract::WarmMessage message;
    try {
      message =
          contract::read_document<contract::WarmMessage>(nlohmann::json::parse(text), "the warm interpreter's message");
    } catch (const std::exception& e) {  // not JSON, or not a WarmMessage: said as a refusal
      message.kind = "refused";
      message.why = fmt::format("{} ({})", e.what(), text.substr(0, 200));
    }
    if (message.kind == "exit") {
      ended_[message.pid] = message.status;
    } else {
      pending_.push_back(std::move(message));
    }
  }
  return alive_;
}

pid_t WarmInterpreter::spawn(const std::vector<std::string>& arguments, const std::vector<std::string>& environment,
                             int threads, pid_t group, int output_fd) {
  std::lock_guard<std::mutex> lock(mutex_);
  contract::WarmSpawn spawn;
  spawn.argv = arguments;
  spawn.env = environment;
  spawn.cwd = std::filesystem::current_path().string();
  spawn.threads = threads;
  spawn.group = group;
  const std::string request = nlohmann::json(spawn).dump();
  DMP_CHECK(request.size() < kMaxPacket, ErrorKind::kRankFailed, "a warm rank's request of {} bytes is too large",
            request.size());
  DMP_CHECK(alive_, ErrorKind::kRankFailed, "the warm interpreter (pid {}) has ended{}", pid_, tail_of(log_, 6));
  iovec io{const_cast<char*>(request.data()), request.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &output_fd, sizeof(int));
  ssize_t sent;
  do { sent = ::sendmsg(socket_, &msg, MSG_NOSIGNAL); } while (sent < 0 && errno == EINTR);
  DMP_CHECK(sent == static_cast<ssize_t>(request.size()), ErrorKind::kRankFailed,
            "cannot reach the warm interpreter (pid {}): {}", pid_, std::strerror(errno));
  const auto deadline = Clock::now() + kSpawnTimeout;
  while (pending_.empty() && read_messages(50) && Clock::now() < deadline) {}
  DMP_CHECK(!pending_.empty(), ErrorKind::kRankFailed, "the warm interpreter (pid {}) did not fork the rank: {}{}",
            pid_, alive_ ? "no answer within 60 s" : "it ended", tail_of(log_, 6));
  const contract::WarmMessage reply = pending_.front();
  pending_.erase(pending_.begin());
  DMP_CHECK(reply.kind == "pid" && reply.pid > 0, ErrorKind::kRankFailed,
            "the warm interpreter refused to fork a rank: {}", reply.why.empty() ? reply.kind : reply.why);
  return reply.pid;
}

bool WarmInterpreter::reap(pid_t pid, int* status, bool block) {
  // Whether the interpreter said `pid` ended (its status then in *status).
  const auto take = [&] {
    const auto it = ended_.find(pid);
    if (it == ended_.end()) return false;
    *status = it->second;
    ended_.erase(it);
    return true;
  };
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (take()) return true;
      if (!alive_) {  // its ranks died with it (PR_SET_PDEATHSIG)
        *status = SIGKILL;
        return true;
      }
      read_messages(block ? 20 : 0);
      if (take()) return true;
    }
    if (!block) return false;
  }
}

}  // namespace dmpcheck::run
