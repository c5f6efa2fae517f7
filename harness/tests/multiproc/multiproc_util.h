// Helpers shared by the multi-process tests: run a scenario through the real launcher and the
// real dmpcheck binary, quietly, into a temporary report directory.
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <gtest/gtest.h>

#include "run/scenario_runner.h"
#include "scenario/scenario.h"

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

inline std::string temporary_directory() {
  std::string pattern = (std::filesystem::temp_directory_path() / "dmpcheck-test-XXXXXX").string();
  return ::mkdtemp(pattern.data());
}

// Runs the cells of `s` that `wanted` selects, each by its index in the full scenario (the ranks
// re-read the scenario and pick their run by index), quietly, with reports in a scratch folder.
template <typename Wanted>
run::ScenarioOutcome run_cells_quietly(const scenario::Scenario& s, Wanted wanted) {
  run::ScenarioRunOptions options;
  options.worker_executable = DMPCHECK_CLI_PATH;
  options.out_dir = temporary_directory();
  options.out = nullptr;
  options.budget_s = 120;
  run::ScenarioOutcome outcome;
  for (size_t i = 0; i < s.runs.size(); ++i) {
    if (wanted(s.runs[i])) outcome.results.push_back(run::run_cell(s, i, options));
  }
  outcome.exit_code = check::exit_status(outcome.results);
  std::filesystem::remove_all(options.out_dir);
  return outcome;
}

inline run::ScenarioOutcome run_quietly(const scenario::Scenario& s) {
  return run_cells_quietly(s, [](const scenario::RunSpec&) { return true; });
}

// The reference's cells; release cells are tested in torchrec_sut/tests.
inline run::ScenarioOutcome run_reference_cells_quietly(const scenario::Scenario& s) {
  return run_cells_quietly(s, [](const scenario::RunSpec& r) { return !r.on_torchrec(); });
}

inline std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << "'" << from << "' not in the scenario";
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

}  // namespace dmpcheck::testing
