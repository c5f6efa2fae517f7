#include "release/script_cell.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <deque>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "check/expectations.h"
#include "check/script_checks.h"
#include "common/error.h"
#include "common/file_io.h"
#include "common/settings.h"
#include "release/release_inputs.h"
#include "release/torchrec_systems.h"
#include "run/launcher.h"
#include "run/rank_run.h"
#include "run/subprocess.h"

namespace dmpcheck::run {
namespace {

namespace fs = std::filesystem;

// Output kept per rank, by bytes (the launcher already cut each line to 16 KiB): its first lines,
// which are also echoed, and its last, where a traceback is; what lies between is counted, not kept.
constexpr size_t kHeadBytesKept = 256 * 1024;
constexpr size_t kTailBytesKept = 128 * 1024;

// One rank's output as kept: the head, the tail, and what was dropped between them.
struct KeptOutput {
  std::vector<std::string> head;
  size_t head_bytes = 0;
  std::deque<std::string> tail;
  size_t tail_bytes = 0;
  size_t dropped_lines = 0;
  size_t dropped_bytes = 0;

  // Whether `line` went to the head (and so is echoed).
  bool take(const std::string& line) {
    if (dropped_lines == 0 && tail.empty() && head_bytes + line.size() <= kHeadBytesKept) {
      head_bytes += line.size() + 1;
      head.push_back(line);
      return true;
    }
    tail_bytes += line.size() + 1;
    tail.push_back(line);
    while (tail_bytes > kTailBytesKept && !tail.empty()) {
      tail_bytes -= tail.front().size() + 1;
      dropped_bytes += tail.front().size() + 1;
      ++dropped_lines;
      tail.pop_front();
    }
    return false;
  }

  std::vector<std::string> lines(int rank) && {
    std::vector<std::string> out = std::move(head);
    if (dropped_lines > 0) {
      out.push_back(
          fmt::format("[dmpcheck: {} line(s), {} byte(s) of rank {} not kept]", dropped_lines, dropped_bytes, rank));
    }
    out.insert(out.end(), std::make_move_iterator(tail.begin()), std::make_move_iterator(tail.end()));
    return out;
  }
};

// A port nothing listens on now, for scripts that read MASTER_PORT themselves.  torch's env://
// rendezvous never binds it here (audit_boot gives it a FileStore); a script that builds its own
// tcp:// store from it may race another program for it, as under torchrun.
int unused_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 29500;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof(address);
  int port = 29500;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) == 0) {
    port = ntohs(address.sin_port);
  }
  ::close(fd);
  return port;
}

scenario::Phase phase_of(const std::string& audited) {
  return audited == "exit" ? scenario::Phase::kFinal : scenario::Phase::kInit;
}

// The audit's comparison (audit_compare --json-file) as the report's replicas: the wrap phases as
// init, exit as final, every step as a row of the divergence table.
void read_audit(const nlohmann::json& doc, check::RunResult& result) {
  const auto& comparison = doc.at("comparison");
  for (const auto& phase : comparison.at("phases")) {
    const std::string name = phase.at("phase").get<std::string>();
    const auto& diverge = phase.at("diverge");
    const auto& equal = phase.at("equal");
    result.audit_phases.push_back(
        fmt::format("{} (after {}): {} equal, {} diverge", name, phase.value("via", ""), equal.size(), diverge.size()));
    const auto missing = phase.at("missing_ranks").get<std::vector<int>>();
    if (!missing.empty()) {
      result.audit_gaps.push_back(fmt::format("phase {}: not recorded on rank(s) {}", name, fmt::join(missing, ", ")));
    }
    if (name.rfind("step ", 0) == 0) {
      result.divergence.push_back({std::stoi(name.substr(5)), static_cast<int>(diverge.size()), 0.0});
      continue;
    }
    for (const auto& tensor : equal) {
      result.replicas.push_back({tensor.get<std::string>(), "audited", phase_of(name), true, 0.0, 0, 0, {}});
    }
    for (const auto& d : diverge) {
      check::TensorCheck c{d.at("name").get<std::string>(), "audited", phase_of(name), false, 0.0, 0, 0, {}};
      const auto& ranks = d.at("ranks");
      const nlohmann::json first = ranks.begin().value();
      for (auto it = ranks.begin(); it != ranks.end(); ++it) {
        if (it.value() != first) c.differing_ranks.push_back(std::stoi(it.key()));
        if (it.value().is_object() && c.numel == 0) {
          int64_t numel = 1;
          for (const auto& size : it.value().at("shape")) numel *= size.get<int64_t>();
          c.numel = numel;
        }
      }
      result.replicas.push_back(c);
    }
  }
  for (const auto& [rank, said] : doc.at("ranks").items()) {
    for (const auto& error : said.value("errors", nlohmann::json::array())) {
      result.system.notes.push_back(fmt::format("the audit on rank {}: {}", rank, error.get<std::string>()));
    }
  }
}

// Compares the ranks' audit files in `dir`; what cannot be compared is said in the report's notes.
void compare_audit(const TorchRecEnvironment& env, const std::string& dir, check::RunResult& result) {
  const std::string answer = dir + "/comparison.json";
  std::error_code ec;
  if (fs::is_empty(dir + "/audit", ec)) {
    result.system.notes.push_back(
        "the audit recorded nothing: no rank built a DistributedModelParallel (or none lived to finish one)");
    return;
  }
  std::map<std::string, std::string> environment = {{"PYTHONPATH", torchrec_sut_dir()}, {"PYTHONNOUSERSITE", "1"}};
  const Captured c =
      capture({env.python, "-m", "dmpcheck_torchrec.audit_compare", "compare", dir + "/audit", "--json-file", answer},
              environment, std::chrono::seconds(120));
  if (c.exit_code != 0 && c.exit_code != 1) {
    std::string said = c.output;
    while (!said.empty() && std::isspace(static_cast<unsigned char>(said.back()))) said.pop_back();
    result.system.notes.push_back(fmt::format("the audit compared nothing: {}", said));
    return;
  }
  try {
    std::ifstream in(answer);
    read_audit(nlohmann::json::parse(in), result);
  } catch (const std::exception& e) {
    throw_error(ErrorKind::kInternal, fmt::format("the audit's comparison {} is unreadable: {}", answer, e.what()));
  }
}

class ScriptCell {
 public:
  ScriptCell(const scenario::Scenario& scenario, size_t index, const ScenarioRunOptions& options)
      : options_(options),
        spec_(scenario.runs.at(index)),
        script_(*spec_.script),
        result_(result_header(scenario, spec_)) {
    result_.init_mode = "the script's own";  // dmpcheck seeds nothing of a script
  }

  check::RunResult run() {
    env_ = cell_environment(spec_, result_);
    if (!env_) return result_;
    describe_system();
    PrivateDir dir("dmpcheck-script", settings().keep_exchange);
    fs::create_directories(dir.path() + "/audit");
    fs::create_directories(dir.path() + "/tmp");
    const LaunchOutcome launched = launch(dir.path());
    result_.timings.total_s = launched.seconds;
    result_.stray_processes = launched.strays;
    take_ranks(launched);
    const bool interrupted = launched.failure && launched.failure->kind == check::FailureKind::kInterrupted;
    if (!launched.ok && (interrupted || !spec_.expect.script.judges_failure())) {
      // The script failed and nothing expects it to: the cell's error, in the failing rank's words.
      result_.failure = launched.failure;
      if (result_.failure && result_.failure->kind == check::FailureKind::kTimeout) {
        result_.failure->message = hang_message();
      }
      result_.verdict = check::Verdict::kError;
      return result_;
    }
    if (script_.audit) compare_audit(*env_, dir.path(), result_);
    result_.expectation = check::evaluate_expectation(spec_.expect, result_);
    result_.verdict = result_.expectation.held ? check::Verdict::kPass : check::Verdict::kFail;
    return result_;
  }

 private:
  void describe_system() {
    result_.loop = "script";
    std::string command = script_.path;
    for (const auto& a : script_.args) command += " " + a;
    result_.system.notes.push_back(
        fmt::format("the script `{}`, unchanged, on {} rank(s) with torchrun's variables{}", command, spec_.world_size,
                    script_.audit ? "; dmpcheck's audit loaded first" : "; no audit (script.audit: false)"));
  }

  LaunchOutcome launch(const std::string& dir) {
    std::vector<std::string> arguments = {script_.path};
    arguments.insert(arguments.end(), script_.args.begin(), script_.args.end());
    LaunchRequest request = torchrec_launch(*env_, arguments, "");
    request.warm_preload.clear();  // the script's own interpreter on every rank, as torchrun starts it
    // As torchrun runs it: its warnings and torch's own log shown.
    request.environment.erase("PYTHONWARNINGS");
    request.environment.erase("TORCH_CPP_LOG_LEVEL");
    const std::string sut = torchrec_sut_dir();
    request.environment["PYTHONPATH"] = sut + "/dmpcheck_torchrec/audit_boot:" + request.environment["PYTHONPATH"];
    for (const auto& [name, value] : script_.env) request.environment[name] = value;
    request.world_size = spec_.world_size;
    request.threads_per_rank = threads_per_rank(spec_, available_cores());
    request.master_port = unused_loopback_port();
    request.launch_environment["DMPCHECK_RENDEZVOUS_FILE"] = dir + "/rendezvous";
    request.launch_environment["TMPDIR"] = dir + "/tmp";
    if (script_.audit) request.launch_environment["DMPCHECK_AUDIT_DIR"] = dir + "/audit";
    set_cell_budget_and_echo(spec_, options_, "", request);
    // A peer that raised too ends by itself, with its own status (`exit: nonzero` on every rank).
    request.peer_grace = std::chrono::seconds(5);
    // timeout_s is the script's whole run: past it, a rank that still runs is a hang.
    request.budget =
        std::chrono::milliseconds(static_cast<int64_t>(1000 * options_.budget_s.value_or(spec_.timeout_s)));
    kept_.assign(static_cast<size_t>(spec_.world_size), {});
    auto echo = request.on_line;
    request.on_line = [this, echo](int rank, const std::string& line) {
      auto& kept = kept_[static_cast<size_t>(rank)];
      const bool first_cut = kept.tail.empty() && kept.dropped_lines == 0;
      if (kept.take(line)) {
        if (echo) echo(rank, line);
      } else if (echo && first_cut) {
        echo(rank, fmt::format("[dmpcheck: rank {} printed over {} KiB; the rest is not echoed, its last {} KiB are "
                               "kept in the report]",
                               rank, kHeadBytesKept / 1024, kTailBytesKept / 1024));
      }
    };
    return run::launch(request);
  }

  void take_ranks(const LaunchOutcome& launched) {
    for (int r = 0; r < spec_.world_size; ++r) {
      const auto i = static_cast<size_t>(r);
      check::ScriptRank rank;
      rank.rank = r;
      const int status = i < launched.wait_statuses.size() ? launched.wait_statuses[i] : 0;
      rank.stopped = i < launched.stopped.size() && launched.stopped[i];
      rank.exit_status = !rank.stopped && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      rank.ended = rank.stopped            ? "was still running when dmpcheck stopped the ranks"
                   : rank.exit_status == 0 ? "exited 0"
                                           : describe_wait_status(status);
      rank.output = std::move(kept_[i]).lines(r);
      rank.exception = check::last_traceback_exception(rank.output).value_or("");
      result_.script_ranks.push_back(std::move(rank));
    }
    result_.script_hung = launched.failure && launched.failure->kind == check::FailureKind::kTimeout;
  }

  std::string hang_message() const {
    std::vector<std::string> running;
    for (const auto& r : result_.script_ranks) {
      if (r.stopped) running.push_back(std::to_string(r.rank));
    }
    return fmt::format("rank(s) {} still running after timeout_s = {} s: a hang (expect it with 'hang: true')",
                       fmt::join(running, ", "), spec_.timeout_s);
  }

  const ScenarioRunOptions& options_;
  const scenario::RunSpec& spec_;
  const scenario::ScriptSpec& script_;
  check::RunResult result_;
  std::optional<TorchRecEnvironment> env_;
  std::vector<KeptOutput> kept_;
};

}  // namespace

void ScriptCellKind::before_cells(const std::vector<const scenario::RunSpec*>& specs,
                                  const ScenarioRunOptions& /*options*/) const {
  std::vector<scenario::System> systems;
  for (const auto* spec : specs) systems.push_back(spec->system);
  require_torchrec_repository_for(systems);
}

check::RunResult ScriptCellKind::run(const scenario::Scenario& scenario, size_t index,
                                     const ScenarioRunOptions& options) const {
  return ScriptCell(scenario, index, options).run();
}

}  // namespace dmpcheck::run
