// A warm interpreter per Python environment: one long-lived `python -m dmpcheck_torchrec.warm`
// that imported the rank program's stack (a release's torch, fbgemm_gpu, torchrec) once, and
// forks a rank for each request instead of a fresh interpreter paying that import per rank.
//
// Lifetime: started on first use, or ahead of it (prestart: a suite queues the environments its
// cells will use, and their imports run in the background, two at a time on two cores, while
// earlier cells run); kept for the rest of this process (at most $DMPCHECK_WARM_INTERPRETERS at
// once, by default one per 2 GiB of available memory, 4 to 12, each holding 0.45-0.7 GB shared
// copy-on-write with its ranks; the least recently used idle one goes first), gone with it.  The interpreter
// watches its socket to this process, so however dmpcheck ends (exit, Ctrl-C, a crash, SIGKILL)
// the kernel closes the socket and the interpreter kills every rank it forked and exits; a rank
// also dies with the interpreter (PR_SET_PDEATHSIG).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <sys/types.h>

#include "run/release_contract.h"

namespace dmpcheck {
class PrivateDir;
}

namespace dmpcheck::run {

class WarmInterpreter {
 public:
  // The warm interpreter of `python` under `environment` (on top of this process's own) that
  // imported `preload`, started now if there is none yet; nullptr with `why_not` when it cannot
  // serve (an import failed there, it is not single-threaded after the import, it did not start).
  // A failure is remembered: the same interpreter is not started twice by one process.
  static std::shared_ptr<WarmInterpreter> get(const std::string& python,
                                              const std::map<std::string, std::string>& environment,
                                              const std::vector<std::string>& preload, std::string& why_not);

  // Every interpreter this process started is told to go and waited for (the CLI's end, a test's).
  static void stop_all();

  // An interpreter a later get() will ask for, as get() takes it; `hold` is kept as long as the
  // interpreter is (the release environment's in-use lock).
  struct Wanted {
    std::string python;
    std::map<std::string, std::string> environment;
    std::vector<std::string> preload;
    std::shared_ptr<void> hold;
  };
  // Queues `wanted` (in the order they will be used) to be started ahead of their first get():
  // pump() starts them without waiting for their imports, at most prestart_at_once() importing at
  // a time and never past the number kept.  An interpreter already started or failed is skipped.
  static void prestart(std::vector<Wanted> wanted);
  // Starts queued interpreters while fewer than prestart_at_once() are importing.  Never blocks on
  // an import; forks (and execs at once), so call it where forking is safe (get() does too).
  static void pump();
  // How many interpreters prestart keeps importing at once: one per two available cores, at least
  // two ($DMPCHECK_WARM_PRESTART; 0 turns prestarting off).  An import keeps one core busy at most;
  // on two cores, two at once beside the cells ran the seed's release cells 1.1-1.3x faster than
  // one at a time (measured 2026-12-03).
  static int prestart_at_once();
  // How many interpreters are kept at most ($DMPCHECK_WARM_INTERPRETERS, or from the memory); 0:
  // none is started, and every release rank starts cold (what the benchmark compares with).
  static size_t kept();

  ~WarmInterpreter();
  WarmInterpreter(const WarmInterpreter&) = delete;
  WarmInterpreter& operator=(const WarmInterpreter&) = delete;

  // Forks one rank that runs `arguments` (`-m MODULE ARG ...`) as `python` would, with `environment`
  // ("K=V" entries, the whole of it), `threads` intra-op threads, in process group `group` (0: its
  // own), its stdout and stderr on `output_fd`.  Returns its pid; throws Error(kRankFailed) when the
  // interpreter refuses or is gone.
  pid_t spawn(const std::vector<std::string>& arguments, const std::vector<std::string>& environment, int threads,
              pid_t group, int output_fd);
  // Whether `pid` (a rank this interpreter forked) has ended, with its wait status; `block`: wait
  // for it.  A rank of an interpreter that died is reported as killed by SIGKILL.
  bool reap(pid_t pid, int* status, bool block);

  // (The registry's, below get() and pump().)  Forks and execs the interpreter; does not wait for its import.  Throws
  // Error(kRankFailed).
  static std::shared_ptr<WarmInterpreter> start(const Wanted& wanted);
  // Waits for the first word of an interpreter start() began: ready (sets import_s_), or throws
  // Error(kRankFailed) with why not.
  void await_ready();
  // Whether it has spoken since start() (ready or not), without blocking.
  bool answered();

  double import_seconds() const { return import_s_; }
  bool ready() const { return ready_; }
  pid_t pid() const { return pid_; }
  bool alive();

 private:
  WarmInterpreter() = default;
  // Reads what the interpreter sent: exits into `ended_`.  Returns false when it is gone.
  bool read_messages(int timeout_ms);

  pid_t pid_ = -1;
  int socket_ = -1;
  double import_s_ = 0;
  bool ready_ = false;  // await_ready() succeeded
  std::chrono::steady_clock::time_point start_;
  bool alive_ = true;
  std::unique_ptr<PrivateDir> dir_;  // holds log_, the interpreter's own output (not its ranks')
  std::string log_;
  std::mutex mutex_;
  std::map<pid_t, int> ended_;
  std::vector<contract::WarmMessage> pending_;  // its first word, then replies to a spawn, in order
  std::vector<char> buffer_;                    // one packet
};

}  // namespace dmpcheck::run
