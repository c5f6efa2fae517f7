// Every process of a launch, the ranks and whatever they started, found while it runs and killed
// at its end: a rank's child that left the rank's process group (setsid(), a daemon's double fork)
// is not reached by the group's kill, so it is followed by parentage (/proc) and by the run's secret
// in its environment.  The launcher is made a child subreaper (PR_SET_CHILD_SUBREAPER), so an orphan
// of a rank becomes its child, is still seen, and is reaped here.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dmpcheck::run {

class ProcessTree {
 public:
  // `marker`: an environment entry only this launch's processes carry (NAME=value).
  explicit ProcessTree(std::string marker);

  void add_root(pid_t pid);
  // One look at /proc: every live process whose parent is a member, or whose environment holds the
  // marker, becomes a member (a pid is known with its start time, so a reused pid is not taken).
  void scan();
  // SIGKILL to every member but the roots that is still alive, until none is (a few rounds: one
  // may fork while it is killed); those now this process's children are reaped.  Returns each, as
  // "pid 123 (python3)", once.
  std::vector<std::string> kill_strays();

 private:
  struct Seen {
    uint64_t start = 0;
    std::string name;
  };
  std::string marker_;
  std::set<pid_t> roots_;
  std::map<pid_t, Seen> members_;
  std::map<pid_t, uint64_t> environ_checked_;  // pid -> start time whose environment was read
};

// A /proc file's text, read with read(2): a process that ends while it is read gives what was read
// (std::ifstream throws from underflow on ESRCH).  Empty when it cannot be opened.
std::string read_proc_file(const std::string& path);

// Makes this process the reaper of its descendants' orphans (once; harmless when it fails).
void become_subreaper();

}  // namespace dmpcheck::run
