// The one way the multi-process tests start processes: MultiProcessTest.  Every test of this
// binary derives from it.  It gives the test a scratch directory, starts programs (exec-ed, their
// output in a log there) or scenario cells (through the product's own launcher), holds the test
// to one deadline, names the process that failed or ran past it with its log, and on the way out
// kills and reaps whatever the test started, then fails the test if any child was left behind.
#pragma once

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "run/warm_interpreter.h"
#include "scenario/scenario.h"
#include "suite/cells.h"
#include "test_util.h"

namespace dmpcheck::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// This host's IPv4 addresses outside 127.0.0.0/8 (empty on a host, or in a namespace, with none).
inline std::vector<std::string> non_loopback_ipv4_addresses() {
  std::vector<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {0};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    if (std::string(text).rfind("127.", 0) != 0) out.push_back(text);
  }
  ::freeifaddrs(list);
  return out;
}

inline std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the scenario";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  using Clock = std::chrono::steady_clock;
  // Long enough for the slowest test on a loaded two-core machine; a hang is a failure, not a wait.
  static constexpr std::chrono::seconds kDeadline{240};

  void SetUp() override {
    std::string pattern = (std::filesystem::temp_directory_path() / "dmpcheck-test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr) << "cannot create a scratch directory";
    dir_ = pattern;
    deadline_ = Clock::now() + kDeadline;
  }

  void TearDown() override {
    for (auto& p : processes_) {
      if (p.reaped) continue;
      ::kill(p.pid, SIGKILL);
      reap(p);
    }
    // The warm interpreters a launch kept for this process's next cells (warm_interpreter.h).
    run::WarmInterpreter::stop_all();
    // Anything else still a child of this test (a process the code under test forked and left).
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      const std::string name = entry.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::istringstream stat(read_file(entry.path().string() + "/stat"));
      std::string pid, comm, state;
      pid_t parent = 0;
      stat >> pid >> comm >> state >> parent;
      if (parent != ::getpid()) continue;
      ADD_FAILURE() << "the test left process " << pid << " " << comm << " (" << state << ") behind";
      ::kill(std::stoi(pid), SIGKILL);
      ::waitpid(std::stoi(pid), nullptr, 0);
    }
    std::filesystem::remove_all(dir_);
  }

  // A file in the scratch directory, written with `text`; its path.
  std::string write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // Starts `args` (args[0] a path) with `env` added to this environment, stdout and stderr to
  // <dir>/<name>.log.  Returns the process's index for wait() and log().
  size_t start(const std::string& name, const std::vector<std::string>& args,
               const std::vector<std::string>& env = {}) {
    Process p{name, path(name + ".log")};
    p.pid = ::fork();
    if (p.pid == 0) {
      for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
      const int fd = ::open(p.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    EXPECT_GT(p.pid, 0) << "fork for " << name << " failed";
    processes_.push_back(p);
    return processes_.size() - 1;
  }

  // The process's exit status (128 + the signal when killed).  At the test's deadline it is
  // killed, and the test fails naming it, with its log; the status is then -1.
  int wait(size_t index) {
    Process& p = processes_.at(index);
    while (!p.reaped) {
      int status = 0;
      const pid_t got = ::waitpid(p.pid, &status, WNOHANG);
      if (got == p.pid) {
        p.reaped = true;
        p.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (Clock::now() > deadline_) {
        ::kill(p.pid, SIGKILL);
        reap(p);
        ADD_FAILURE() << p.name << " was still running at the test's deadline (" << kDeadline.count()
                      << " s); its log:\n"
                      << read_file(p.log);
        p.status = -1;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    return p.status;
  }
  std::string log(size_t index) const { return read_file(processes_.at(index).log); }
  pid_t pid(size_t index) const { return processes_.at(index).pid; }

  // `dmpcheck <arguments...>` to completion: its exit status; its output is log(<name>).
  int cli(const std::string& name, std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), DMPCHECK_CLI_PATH);
    return wait(start(name, arguments));
  }

  // Runs the cells of `s` that `wanted` selects through the product's launcher (which forks and
  // reaps the ranks itself), each by its index in the full scenario, reports in the scratch
  // directory, within what is left of the test's deadline.
  template <typename Wanted>
  run::ScenarioOutcome run_cells(const scenario::Scenario& s, Wanted wanted, run::ScenarioRunOptions options = {}) {
    options.worker_executable = DMPCHECK_CLI_PATH;
    if (options.out_dir.empty()) options.out_dir = path("reports");
    options.out = nullptr;
    run::ScenarioOutcome outcome;
    for (size_t i = 0; i < s.runs.size(); ++i) {
      if (!wanted(s.runs[i])) continue;
      options.budget_s = std::max(1.0, std::chrono::duration<double>(deadline_ - Clock::now()).count());
      outcome.results.push_back(run::run_cell(s, i, options));
    }
    outcome.exit_code = check::exit_status(outcome.results);
    return outcome;
  }
  run::ScenarioOutcome run_all(const scenario::Scenario& s, run::ScenarioRunOptions options = {}) {
    return run_cells(
        s, [](const scenario::RunSpec&) { return true; }, std::move(options));
  }
  // The reference's cells; release cells are tested in torchrec_sut/tests.
  run::ScenarioOutcome run_reference(const scenario::Scenario& s) {
    return run_cells(s, [](const scenario::RunSpec& r) { return !r.on_torchrec(); });
  }

  // Starts `world` ranks of `args` as an external launcher would: rank r gets `env(r, port)` for
  // a MASTER_PORT chosen here, and the ranks run to completion (their logs: <name><r>).  A port
  // must be chosen before the ranks start, so another program may take it first; when rank 0
  // says so ("Address already in use") they run again on another.  Returns their exit statuses.
  std::vector<int> run_ranks(const std::string& name, int world, const std::vector<std::string>& args,
                             const std::function<std::vector<std::string>(int rank, int port)>& env) {
    std::vector<int> statuses;
    for (int attempt = 0; attempt < 3; ++attempt) {
      const int port = free_port();
      std::vector<size_t> ranks;
      for (int r = 0; r < world; ++r) ranks.push_back(start(name + std::to_string(r), args, env(r, port)));
      statuses.clear();
      for (size_t index : ranks) statuses.push_back(wait(index));
      if (log(ranks[0]).find("Address already in use") == std::string::npos) break;
    }
    return statuses;
  }

  // A port nothing listens on now (see run_ranks).
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
  }

  std::string dir_;

 private:
  struct Process {
    std::string name;
    std::string log;
    pid_t pid = -1;
    bool reaped = false;
    int status = -1;
  };
  static void reap(Process& p) {
    ::waitpid(p.pid, nullptr, 0);
    p.reaped = true;
  }
  std::vector<Process> processes_;
  Clock::time_point deadline_;
};

}  // namespace dmpcheck::testing
