#include "suite/suite.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>
#include "common/error.h"
#include "common/file_io.h"

#include "report/json.h"
#include "report/suite_reports.h"
#include "run/launcher.h"
#include "run/preflight.h"
#include "run/rank_run.h"
#include "run/warm_interpreter.h"
#include "scenario/scenario.h"
#include "suite/cells.h"

namespace dmpcheck::run {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string utc_now(const char* format) {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[64];
  std::strftime(buffer, sizeof(buffer), format, &tm);
  return buffer;
}

// reports/<timestamp>, made unique when two suites start in the same second.
std::string make_report_dir(const std::string& root) {
  fs::create_directories(root);
  const std::string stamp = utc_now("%Y%m%d-%H%M%S");
  for (int n = 0;; ++n) {
    const fs::path dir = fs::path(root) / (n == 0 ? stamp : fmt::format("{}-{}", stamp, n));
    std::error_code ec;
    if (fs::create_directory(dir, ec)) return dir.string();
    DMP_CHECK(!ec || ec == std::errc::file_exists, ErrorKind::kInvalidInput, "cannot create {}: {}", dir.string(),
              ec.message());
  }
}

}  // namespace

std::vector<std::string> collect_scenario_files(const std::vector<std::string>& paths) {
  std::vector<std::string> files;
  for (const auto& p : paths) {
    if (fs::is_directory(p)) {
      for (const auto& entry : fs::recursive_directory_iterator(p)) {
        if (entry.is_regular_file() && entry.path().extension() == ".yaml") files.push_back(entry.path().string());
      }
    } else {
      DMP_CHECK(fs::is_regular_file(p), ErrorKind::kInvalidInput, "{}: no such scenario file or directory", p);
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  files.erase(std::unique(files.begin(), files.end()), files.end());
  return files;
}

SuiteOutcome run_suite(const SuiteOptions& options) {
  const auto start = Clock::now();
  SuiteOutcome outcome;
  const std::string started_at = utc_now("%Y-%m-%dT%H:%M:%SZ");

  const std::regex filter = filter_regex(options.filter.empty() ? std::string(".*") : options.filter);
  std::vector<scenario::Scenario> scenarios;
  for (const auto& file : collect_scenario_files(options.paths)) {
    try {
      scenario::Scenario loaded = scenario::load_scenario_file(file);
      preflight(loaded);
      scenarios.push_back(std::move(loaded));
    } catch (const Error& e) {
      // A file the filter does not select is not judged, valid or not: its cells would be
      // "<name> [...]", and it is named by its file's stem while it does not load.
      if (!options.filter.empty() && !std::regex_search(fs::path(file).stem().string() + " [load]", filter)) continue;
      check::RunResult r;
      r.scenario = fs::path(file).stem().string();
      r.scenario_file = file;
      r.run = "load";
      r.slug = "load";
      r.verdict = check::Verdict::kError;
      r.failure = check::RankFailure{-1, check::FailureKind::kInvalidScenario, "did not load", e.what(), {}};
      outcome.results.push_back(r);
      if (options.out) *options.out << "invalid scenario: " << e.what() << "\n";
    }
  }
  struct Cell {
    size_t scenario;
    size_t run;
  };
  std::vector<Cell> cells;
  for (size_t s = 0; s < scenarios.size(); ++s) {
    for (size_t r = 0; r < scenarios[s].runs.size(); ++r) {
      const std::string label = fmt::format("{} [{}]", scenarios[s].name, scenarios[s].runs[r].name);
      if (std::regex_search(label, filter)) cells.push_back({s, r});
    }
  }
  ScenarioRunOptions run_options;
  run_options.worker_executable = options.worker_executable;
  run_options.budget_s = options.budget_s;
  run_options.echo_rank_output = false;
  run_options.exec_ranks = options.exec_ranks;
  // A command line's mistake is said before anything is made; the releases' interpreters import
  // in the background while the cells before theirs run.
  std::vector<const scenario::RunSpec*> specs;
  for (const auto& c : cells) specs.push_back(&scenarios[c.scenario].runs[c.run]);
  before_cells(specs, run_options);
  outcome.report_dir = make_report_dir(options.out_root);
  run_options.out_dir = outcome.report_dir;

  // Scheduler: up to `jobs` runs at once while their ranks fit on the machine's cores (a run
  // larger than the machine runs alone).
  const int cores = available_cores();
  std::vector<check::RunResult> results(cells.size());
  std::mutex mutex;
  std::condition_variable changed;
  int running = 0, ranks_busy = 0;
  size_t finished = 0;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < cells.size() && !interrupt_requested(); ++i) {
    const auto& spec = scenarios[cells[i].scenario].runs[cells[i].run];
    const int ranks = spec.world_size;
    WarmInterpreter::pump();
    {
      std::unique_lock<std::mutex> lock(mutex);
      changed.wait(
          lock, [&] { return running == 0 || (running < std::max(1, options.jobs) && ranks_busy + ranks <= cores); });
      ++running;
      ranks_busy += ranks;
    }
    auto cell = [&, i, ranks] {
      const auto& scenario = scenarios[cells[i].scenario];
      check::RunResult result = run_cell(scenario, cells[i].run, run_options);
      std::lock_guard<std::mutex> lock(mutex);
      results[i] = std::move(result);
      ++finished;
      --running;
      ranks_busy -= ranks;
      if (options.out) {
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        const double remaining = elapsed / static_cast<double>(finished) * static_cast<double>(cells.size() - finished);
        const auto& r = results[i];
        const std::string verdict = r.verdict == check::Verdict::kPass      ? "PASS"
                                    : r.verdict == check::Verdict::kSkipped ? "SKIPPED"
                                    : r.verdict == check::Verdict::kFail    ? "FAIL"
                                                                            : "ERROR";
        *options.out << fmt::format("[{}/{}] {} [{}]: {} ({:.1f} s) | elapsed {:.0f} s, about {:.0f} s left\n",
                                    finished, cells.size(), r.scenario, r.run, verdict, r.timings.total_s, elapsed,
                                    remaining);
        if (r.verdict != check::Verdict::kPass) *options.out << "        " << report::failure_text(r) << "\n";
        *options.out << std::flush;
      }
      changed.notify_all();
    };
    // One run at a time runs on this thread: the launcher then forks its ranks from this warm
    // process (launcher.h), which it may only do while the process has a single thread.
    if (options.jobs <= 1) {
      cell();
    } else {
      threads.emplace_back(cell);
    }
  }
  for (auto& t : threads) t.join();

  for (auto& r : results) {
    if (!r.scenario.empty()) outcome.results.push_back(std::move(r));  // cells never started (interrupted) are left out
  }
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  write_suite_reports(outcome.report_dir, fmt::format("dmpcheck suite: {}", fmt::join(options.paths, " ")), started_at,
                      outcome.seconds, outcome.results);
  outcome.exit_code = check::exit_status(outcome.results);
  return outcome;
}

void write_suite_reports(const std::string& directory, const std::string& title, const std::string& started_at,
                         double seconds, const std::vector<check::RunResult>& results) {
  const report::SuiteSummary summary{title, started_at, seconds, results};
  write_file_atomically(directory + "/junit.xml", report::render_junit(summary));
  write_file_atomically(directory + "/summary.md", report::render_markdown(summary));
  write_file_atomically(directory + "/report.html", report::render_html(summary, report::load_chart_js()));
}

size_t rerender_reports(const std::string& directory) {
  std::vector<std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(directory)) {
    if (entry.is_regular_file() && entry.path().extension() == ".json") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  std::vector<check::RunResult> results;
  double seconds = 0.0;
  for (const auto& f : files) {
    std::ifstream in(f);
    try {
      results.push_back(nlohmann::json::parse(in).get<check::RunResult>());
      seconds += results.back().timings.total_s;
    } catch (const std::exception& e) {
      throw_error(ErrorKind::kInvalidInput, fmt::format("{}: not a dmpcheck run result: {}", f, e.what()));
    }
  }
  DMP_CHECK(!results.empty(), ErrorKind::kInvalidInput, "{}: no run results (*.json) found", directory);
  write_suite_reports(directory, "dmpcheck report", utc_now("%Y-%m-%dT%H:%M:%SZ"), seconds, results);
  return results.size();
}

}  // namespace dmpcheck::run
