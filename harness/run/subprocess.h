// A short child program run to completion with its output captured: git in TorchRec's repository,
// an interpreter asked what it imports.  Not for ranks (run/launcher.h starts those).
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace dmpcheck::run {

struct Captured {
  int exit_code = -1;  // the exit status; -1 when it did not exit by itself (killed at the deadline, a signal)
  bool timed_out = false;
  bool interrupted = false;  // dmpcheck was asked to stop (SIGINT, SIGTERM): the child was killed
  int term_signal = 0;       // the signal that ended it, when one did
  std::string output;        // stdout and stderr together, as they came
  bool ok() const { return exit_code == 0; }
  // How it ended: "exited 1", "was killed by signal 9 (SIGKILL)", "took longer than 30 s", "was
  // interrupted" (`deadline`: the one it was given).
  std::string ended(std::chrono::seconds deadline) const;
};

// Runs argv (argv[0] looked up on PATH when it has no '/') with `environment` added to this
// process's, and waits for it, at most `deadline` (then SIGKILL).  Throws Error(kInvalidInput)
// when the program cannot be started at all.
Captured capture(const std::vector<std::string>& argv, const std::map<std::string, std::string>& environment = {},
                 std::chrono::seconds deadline = std::chrono::seconds(120));

// Runs argv with its output shown as it comes (its progress) and returns its exit status (-1:
// killed by a signal).  With `tail`, its stdout and stderr both go to this process's stderr and
// the last `keep` bytes of them are kept there too (what an installer said last: the resolver's or
// the import's own words).  Throws Error(kInvalidInput) when it cannot be started.
int run_visible(const std::vector<std::string>& argv, std::string* tail = nullptr, size_t keep = 4096);

// argv (or an environment) as execve wants it: pointers into `storage`, which must outlive them,
// then a null.
std::vector<char*> c_argv(std::vector<std::string>& storage);

// A captured output without its trailing newlines and spaces (a git hash, a one-line answer).
std::string trim(std::string s);
// Its last `n` non-empty lines, each as "\n  | line": where Python puts the exception.
std::string last_lines(const std::string& output, size_t n);

}  // namespace dmpcheck::run
