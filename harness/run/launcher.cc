#include "run/launcher.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <thread>

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "comm/store.h"
#include "common/digest.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/settings.h"
#include "run/handover.h"
#include "run/process_tree.h"
#include "run/release_contract.h"
#include "run/subprocess.h"
#include "run/warm_interpreter.h"

extern char** environ;

namespace dmpcheck::run {
namespace {

using Clock = std::chrono::steady_clock;

// A signal handler may only set a flag (common/interrupt.h: the one piece of process-wide state).
void on_interrupt(int) { g_interrupted = 1; }

// Async-signal-safe (no allocation): also used between fork and exec.
void set_disposition(void (*handler)(int), std::initializer_list<int> signals) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  for (int sig : signals) ::sigaction(sig, &action, nullptr);
}

// Whether a process is stopped (SIGSTOP, SIGTSTP: state T in /proc/PID/stat; t, by a tracer).
bool process_stopped(pid_t pid) {
  const std::string stat = read_proc_file(fmt::format("/proc/{}/stat", pid));
  const auto name_end = stat.rfind(')');
  return name_end != std::string::npos && name_end + 2 < stat.size() &&
         (stat[name_end + 2] == 'T' || stat[name_end + 2] == 't');
}

constexpr const char* kStoppedCause = "was stopped (state T: SIGSTOP or SIGTSTP) and never resumed";

// A line longer than this is cut: its first kMaxLineBytes are kept and the rest only counted, so a
// rank printing one endless line costs the launcher neither memory nor time.
constexpr size_t kMaxLineBytes = 16 * 1024;
// At most this much of one rank's output is read per turn of the watch loop: a rank that prints
// without pause cannot keep the launcher from its deadline.
constexpr size_t kMaxReadPerTurn = 1 << 20;

struct Rank {
  int rank = 0;
  pid_t pid = -1;
  int output_fd = -1;
  bool running = true;
  int status = 0;
  std::string partial;  // the line being read, at most kMaxLineBytes
  size_t cut = 0;       // bytes of that line beyond kMaxLineBytes, not kept
  std::deque<std::string> last_lines;
};

// Everything the child needs, built before fork(): between fork and exec only
// async-signal-safe calls are allowed.
struct ChildImage {
  std::vector<std::string> argv_storage;
  std::vector<std::string> env_storage;
  std::vector<char*> argv;
  std::vector<char*> envp;
};

ChildImage make_image(const LaunchRequest& request, int rank, const std::string& store_file,
                      const std::string& secret) {
  ChildImage image;
  // One machine stands in for several hosts of local_world_size ranks each.
  const int local_world_size = request.local_world_size > 0 ? request.local_world_size : request.world_size;
  image.argv_storage.push_back(request.executable);
  image.argv_storage.insert(image.argv_storage.end(), request.arguments.begin(), request.arguments.end());
  std::map<std::string, std::string> ours = {
      {"RANK", std::to_string(rank)},
      {"WORLD_SIZE", std::to_string(request.world_size)},
      {"LOCAL_RANK", std::to_string(rank % local_world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(local_world_size)},
      {"MASTER_ADDR", "127.0.0.1"},
      {"DMPCHECK_STORE_FILE", store_file},
      {kSecretVariable, secret},
      {"OMP_NUM_THREADS", std::to_string(request.threads_per_rank)},
      {"DMPCHECK_LAUNCHED", "1"},
  };
  // Programs with a rendezvous of their own (a TorchRec rank) get its port; dmpcheck's ranks need
  // none: their store is a file.
  if (request.master_port > 0) ours["MASTER_PORT"] = std::to_string(request.master_port);
  ours.insert(request.environment.begin(), request.environment.end());  // the rank's own names are ours
  for (const auto& [name, value] : request.launch_environment) ours[name] = value;
  image.env_storage = child_environment(ours);
  image.argv = c_argv(image.argv_storage);
  image.envp = c_argv(image.env_storage);
  return image;
}

void end_line(Rank& r, const LaunchRequest& request) {
  std::string line = std::move(r.partial);
  r.partial.clear();
  if (r.cut > 0) line += fmt::format(" [dmpcheck: {} more bytes of this line cut]", r.cut);
  r.cut = 0;
  if (request.on_line) request.on_line(r.rank, line);
  r.last_lines.push_back(std::move(line));
  if (r.last_lines.size() > request.last_lines_kept) r.last_lines.pop_front();
}

void take_output(Rank& r, const char* data, size_t size, const LaunchRequest& request) {
  while (size > 0) {
    const auto* newline = static_cast<const char*>(std::memchr(data, '\n', size));
    const size_t piece = newline != nullptr ? static_cast<size_t>(newline - data) : size;
    const size_t kept = std::min(piece, kMaxLineBytes - std::min(r.partial.size(), kMaxLineBytes));
    r.partial.append(data, kept);
    r.cut += piece - kept;
    if (newline == nullptr) return;
    end_line(r, request);
    data += piece + 1;
    size -= piece + 1;
  }
}

// What the rank wrote since the last turn, up to kMaxReadPerTurn; at the end of its output, the
// last line even without its newline.
void drain(Rank& r, const LaunchRequest& request) {
  if (r.output_fd < 0) return;
  char buffer[65536];
  for (size_t taken = 0; taken < kMaxReadPerTurn;) {
    const ssize_t n = ::read(r.output_fd, buffer, sizeof(buffer));
    if (n > 0) {
      take_output(r, buffer, static_cast<size_t>(n), request);
      taken += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {  // the write end is closed: no more output
      if (!r.partial.empty() || r.cut > 0) end_line(r, request);
      ::close(r.output_fd);
      r.output_fd = -1;
    }
    return;  // EAGAIN, or closed
  }
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGSEGV: return "SIGSEGV";
    case SIGABRT: return "SIGABRT";
    case SIGKILL: return "SIGKILL";
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    default: return "signal";
  }
}

}  // namespace

std::vector<std::string> child_environment(const std::map<std::string, std::string>& ours) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string key = entry.substr(0, entry.find('='));
    if (!ours.count(key) && key != "MASTER_PORT") env.push_back(entry);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  return env;
}

void install_interrupt_handlers() { set_disposition(on_interrupt, {SIGINT, SIGTERM}); }

int thread_count() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

std::string describe_wait_status(int status) {
  if (WIFSIGNALED(status)) {
    return fmt::format("killed by signal {} ({})", WTERMSIG(status), signal_name(WTERMSIG(status)));
  }
  if (WIFEXITED(status)) return fmt::format("exited with status {}", WEXITSTATUS(status));
  return fmt::format("ended with wait status {}", status);
}

LaunchOutcome launch(const LaunchRequest& request) {
  const auto start = Clock::now();
  // The run's store is a file in a directory only this user can enter (mkdtemp: 0700): a
  // single-host run opens no socket for its rendezvous, so nobody else can join it or read it.
  PrivateDir store_dir("dmpcheck-run");
  comm::Store file_store = comm::Store::host_file(store_dir.path(), request.store_timeout);
  const std::string secret = random_secret();
  comm::Store store = secret_view(file_store, secret);
  hand_over(store, request.task, secret);

  std::vector<Rank> ranks(static_cast<size_t>(request.world_size));
  // What the ranks start is theirs too, in their group or not: followed, and killed at the end.
  become_subreaper();
  ProcessTree tree(std::string(kSecretVariable) + "=" + secret);
  pid_t group = 0;
  const pid_t parent = ::getpid();
  LaunchOutcome outcome;
  const bool exec_demanded = request.exec_ranks || settings().exec_ranks;
  const bool fork_warm = request.in_process && !exec_demanded && thread_count() == 1;
  outcome.forked = fork_warm;
  // A Python rank program: forked from the warm interpreter of its environment where one serves.
  std::shared_ptr<WarmInterpreter> warm;
  if (!request.warm_preload.empty()) {
    if (exec_demanded) {
      outcome.cold_reason = "exec-ed ranks were asked for (--ranks exec or DMPCHECK_RANKS=exec)";
    } else {
      warm = WarmInterpreter::get(request.executable,
                                  request.warm_environment.empty() ? request.environment : request.warm_environment,
                                  request.warm_preload, outcome.cold_reason);
    }
    outcome.warm_interpreter = warm != nullptr;
    outcome.warm_import_s = warm ? warm->import_seconds() : 0.0;
  }
  // Whether `r` has ended (its wait status in r.status); options: WNOHANG, or 0 to wait for it.
  auto reaped = [&](Rank& r, int options) {
    if (warm) return warm->reap(r.pid, &r.status, options == 0);
    return ::waitpid(r.pid, &r.status, options) == r.pid;
  };
  if (fork_warm) std::fflush(nullptr);  // what this process buffered would be written again by every child
  for (int r = 0; r < request.world_size; ++r) {
    ChildImage image = make_image(request, r, file_store.path(), secret);
    int fds[2];
    DMP_CHECK(::pipe2(fds, O_CLOEXEC) == 0, ErrorKind::kRankFailed, "pipe2 failed: {}", std::strerror(errno));
    auto abandon = [&](const std::string& why) {
      ::close(fds[0]);
      ::close(fds[1]);
      if (group != 0) ::kill(-group, SIGKILL);
      for (auto& started : ranks) {
        if (started.pid > 0) {
          ::kill(started.pid, SIGKILL);
          reaped(started, 0);
        }
        if (started.output_fd >= 0) ::close(started.output_fd);
      }
      throw_error(ErrorKind::kRankFailed, why);
    };
    pid_t pid = -1;
    if (warm) {
      try {
        pid = warm->spawn(request.arguments, image.env_storage, request.threads_per_rank, group, fds[1]);
      } catch (const Error& e) { abandon(fmt::format("rank {}: {}", r, e.what())); }
    } else if ((pid = ::fork()) < 0) {
      abandon(fmt::format("fork for rank {} failed: {}", r, std::strerror(errno)));
    } else if (pid == 0) {
      ::setpgid(0, group);                      // rank 0 leads the run's process group
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);       // die with the launcher
      if (::getppid() != parent) ::_exit(127);  // the launcher died before prctl
      // A write to a peer that has died must fail (EPIPE) on this rank, not kill it with SIGPIPE:
      // that death would race the peer's own exit to be the failure reported first.  Ignored
      // signals stay ignored across exec, so exec-ed ranks get the same.
      set_disposition(SIG_IGN, {SIGPIPE});
      ::dup2(fds[1], STDOUT_FILENO);
      ::dup2(fds[1], STDERR_FILENO);
      if (fork_warm) {
        // A copy of a process with one thread: everything is allowed here, and what an exec
        // would have reset is reset by hand -- signal dispositions, the other ranks' pipes,
        // the environment -- so that the rank cannot tell the difference.
        ::close(fds[0]);
        ::close(fds[1]);
        for (int earlier = 0; earlier < r; ++earlier) ::close(ranks[static_cast<size_t>(earlier)].output_fd);
        set_disposition(SIG_DFL, {SIGINT, SIGTERM});
        sigset_t none;
        sigemptyset(&none);
        ::sigprocmask(SIG_SETMASK, &none, nullptr);
        g_interrupted = 0;
        environ = image.envp.data();
        const std::string name = "dmpcheck-r" + std::to_string(r);
        ::prctl(PR_SET_NAME, name.c_str());
        int code = 3;
        try {
          code = request.in_process();
        } catch (const std::exception& e) { std::fprintf(stderr, "rank %d: error: %s\n", r, e.what()); } catch (...) {
          std::fprintf(stderr, "rank %d: error: an unknown exception\n", r);
        }
        std::fflush(nullptr);
        ::_exit(code);
      }
      ::execve(image.argv[0], image.argv.data(), image.envp.data());
      const char message[] = "dmpcheck launcher: execve of the rank's program failed\n";
      (void)!::write(STDERR_FILENO, message, sizeof(message) - 1);
      ::_exit(127);
    }
    if (!warm) ::setpgid(pid, group == 0 ? pid : group);  // also from the parent: no race with the kill below
    if (group == 0) group = pid;
    ::close(fds[1]);
    ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    ranks[static_cast<size_t>(r)] = {r, pid, fds[0], true, 0, {}, 0, {}};
    outcome.pids.push_back(pid);
    tree.add_root(pid);
  }

  // SIGTERM, kill_grace to exit, then SIGKILL for the ranks and anything a rank started in its group.
  auto kill_all = [&] {
    auto reap = [&](int options) {  // whether any rank still runs
      bool any = false;
      for (auto& r : ranks) {
        if (r.running && reaped(r, options)) r.running = false;
        any = any || r.running;
      }
      return any;
    };
    ::kill(-group, SIGTERM);
    const auto deadline = Clock::now() + request.kill_grace;
    while (reap(WNOHANG) && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(-group, SIGKILL);
    reap(0);
  };

  // When one rank fails its peers often fail a moment later ("connection closed by peer"), and
  // may even exit first.  Failures seen within a short grace window are collected and the root
  // cause is reported: a signal or a rank's own error before a peer's communication error.
  auto make_failure = [&](Rank& r, check::FailureKind kind, const std::string& cause) {
    check::RankFailure f{r.rank, kind, cause, {}, {}};
    std::string refused;
    std::optional<std::string> error = get_signed(store, error_key(r.rank), secret, &refused);
    if (!error && !request.error_dir.empty()) {
      std::ifstream in(fmt::format("{}/rank{}/error.json", request.error_dir, r.rank));
      if (in.good()) error = std::string(std::istreambuf_iterator<char>(in), {});
    }
    if (!error && !refused.empty()) f.message = refused;
    if (error) {
      try {
        const auto said = contract::read_document<contract::RankError>(nlohmann::json::parse(*error), "error");
        // The rank said why; a kind this build does not know is still a rank failure.
        f.kind = check::parse_failure_kind(said.kind).value_or(kind);
        f.message = said.message;
      } catch (const std::exception&) { f.message = *error; }  // not the contract's: shown as it came
    }
    // Ranks are only SIGKILLed by us after the first failure, so a first failure by SIGKILL came
    // from elsewhere, most often the kernel's out-of-memory killer.
    if (f.message.empty() && WIFSIGNALED(r.status) && WTERMSIG(r.status) == SIGKILL) {
      f.message =
          "SIGKILL that the launcher did not send: most often the kernel's out-of-memory killer (see dmesg), else "
          "an operator or a scenario's kill fault";
    }
    return f;
  };
  // A rank that ended other than with status 0: what it said, else how it ended.
  auto ended_failure = [&](Rank& r) {
    return make_failure(r, WIFSIGNALED(r.status) ? check::FailureKind::kCrashed : check::FailureKind::kRankFailed,
                        describe_wait_status(r.status));
  };
  auto rank_of_cause = [](const check::RankFailure& f) {
    using check::FailureKind;
    switch (f.kind) {
      case FailureKind::kCrashed: return 0;
      case FailureKind::kRankFailed: return 2;  // exited non-zero without saying why
      case FailureKind::kCommunication:
      case FailureKind::kTimeout: return 3;  // most often a peer of the rank that failed
      default: return 1;                     // the rank's own error
    }
  };
  auto fail = [&](Rank& r) {
    std::vector<check::RankFailure> seen = {ended_failure(r)};
    const auto grace_end = std::min(Clock::now() + request.peer_grace, start + request.budget);
    while (Clock::now() < grace_end && !interrupt_requested()) {
      bool any = false;
      for (auto& other : ranks) {
        if (!other.running) continue;
        any = true;
        drain(other, request);  // a peer blocked on a full pipe would never end by itself
        if (reaped(other, WNOHANG)) {
          other.running = false;
          drain(other, request);
          if (!(WIFEXITED(other.status) && WEXITSTATUS(other.status) == 0)) seen.push_back(ended_failure(other));
        }
      }
      if (!any) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    outcome.failure = *std::min_element(
        seen.begin(), seen.end(), [&](const auto& a, const auto& b) { return rank_of_cause(a) < rank_of_cause(b); });
    // A stopped rank cannot fail by itself: its peers time out waiting for it, and the first of
    // them to say so is not the cause.
    for (auto& other : ranks) {
      if (outcome.failure->kind == check::FailureKind::kCrashed) break;  // a signal is a cause of its own
      if (!other.running || !process_stopped(other.pid)) continue;
      const check::RankFailure peer = *outcome.failure;
      outcome.failure = make_failure(other, check::FailureKind::kTimeout, kStoppedCause);
      outcome.failure->message = fmt::format("rank {} gave up waiting for it: it {}{}{}", peer.rank, peer.cause,
                                             peer.message.empty() ? "" : ": ", peer.message);
      break;
    }
  };

  while (true) {
    std::vector<pollfd> fds;
    for (auto& r : ranks) {
      if (r.output_fd >= 0) fds.push_back({r.output_fd, POLLIN, 0});
    }
    if (!fds.empty()) ::poll(fds.data(), fds.size(), 50);
    else std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (auto& r : ranks) drain(r, request);
    tree.scan();

    bool any_running = false;
    for (auto& r : ranks) {
      if (!r.running) continue;
      if (reaped(r, WNOHANG)) {
        r.running = false;
        const bool clean = WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0;
        if (!clean && !outcome.failure) {
          drain(r, request);
          fail(r);
        }
      } else {
        any_running = true;
      }
    }
    if (outcome.failure || !any_running) break;
    const bool interrupted = interrupt_requested();
    if (interrupted || Clock::now() - start > request.budget) {
      // The rank to name: a stopped one (the others wait for it), else the first still running.
      auto named =
          std::find_if(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running && process_stopped(r.pid); });
      const bool stopped = named != ranks.end();
      if (!stopped) named = std::find_if(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; });
      const std::string budget =
          fmt::format("the run's budget of {:.0f} s ran out", std::chrono::duration<double>(request.budget).count());
      outcome.failure =
          interrupted
              ? make_failure(*named, check::FailureKind::kInterrupted, "stopped: dmpcheck received SIGINT or SIGTERM")
          : stopped
              ? make_failure(*named, check::FailureKind::kTimeout, fmt::format("{} when {}", kStoppedCause, budget))
              : make_failure(*named, check::FailureKind::kTimeout, "still running when " + budget);
      break;
    }
  }
  for (auto& r : ranks) outcome.stopped.push_back(r.running);
  tree.scan();
  kill_all();
  outcome.strays = tree.kill_strays();
  for (auto& r : ranks) {
    outcome.wait_statuses.push_back(r.status);
    drain(r, request);
    if (r.output_fd >= 0) ::close(r.output_fd);
  }
  if (outcome.failure) {
    auto& lines = ranks[static_cast<size_t>(outcome.failure->rank)].last_lines;
    outcome.failure->last_lines.assign(lines.begin(), lines.end());
    if (outcome.failure->message.empty() && !lines.empty()) outcome.failure->message = lines.back();
  } else {
    outcome.ok = true;
    std::string refused;
    outcome.result = get_signed(store, kResultKey, secret, &refused);
    if (!outcome.result && !refused.empty()) {
      // Every rank exited 0 but the result is not the run's: believe nothing of it.
      outcome.ok = false;
      outcome.failure = check::RankFailure{0, check::FailureKind::kCommunication, "exited with status 0", refused, {}};
    }
  }
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return outcome;
}

}  // namespace dmpcheck::run
