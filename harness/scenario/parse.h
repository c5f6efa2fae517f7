// What the loader's parts share (loader.cc, matrix.cc, run_fields.cc, expectation.cc,
// system_rules.cc).  Internal to scenario/.
#pragma once

#include <set>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "scenario/reader.h"
#include "scenario/scenario.h"

namespace dmpcheck::scenario::detail {

// Keys a matrix may vary (everything that describes one run), and every top-level key.
extern const std::vector<std::string> kMatrixRoots;
extern const std::vector<std::string> kTopLevelKeys;

std::vector<std::string> split_path(const std::string& path);
// Sets root[path] = value, creating maps on the way.  False when the path crosses a scalar or
// indexes past a list.
bool assign_path(const YAML::Node& root, const std::vector<std::string>& parts, const YAML::Node& value);
// A matrix value as its cell names it: a scalar's text, a profile on one line, else YAML's dump.
std::string cell_text(const std::string& path, const YAML::Node& value);
std::string slug_of(const std::string& text);
bool axis_of_scalars(const std::vector<YAML::Node>& values);

// The matrix (matrix.cc): its axes, each one path (`steps: [1, 2]`) or several that advance
// together (`zip: [{world_size: 2, batch_size: 8}, {world_size: 4, batch_size: 4}]`), crossed into
// cells, first axis varying slowest.
struct MatrixAxis {
  std::vector<std::string> paths;
  std::vector<YAML::Node> keys;                 // per path: where the file names it (for errors)
  std::vector<std::vector<YAML::Node>> values;  // per value of the axis: one node per path
};
struct Matrix {
  std::vector<MatrixAxis> axes;
  std::vector<std::vector<size_t>> cells;  // per cell: the index of its value on each axis
  bool varies(const std::string& path) const;
  std::vector<YAML::Node> values_of(const std::string& path) const;  // every value the path takes
};
// Reads `matrix` (at most 1024 cells, counted before one is made) and refuses a `when` of `expect`
// whose value has another shape than its path's values (it would select nothing).
// (`root` by value: a non-const node answers a missing key with a null node, a const one throws.)
Matrix read_matrix(const Reader& r, YAML::Node root);

// A behaviour profile: a name from `names`, or {base: <name>, <switch>: value, ...} (run_fields.cc).
// Returns the base's name; each switch turned is checked and appended to `switches` in the file's order.
std::string parse_profile(const Reader& r, const YAML::Node& node, const std::string& path,
                          const std::vector<std::string>& names,
                          std::vector<std::pair<std::string, std::string>>& switches);

// One run's fields (the file with one matrix cell assigned).
RunSpec parse_run(const Reader& r, const YAML::Node& root);
// The longest time a scenario may give (timeout_s): a week.
inline constexpr double kLongestTimeout = 7 * 24 * 3600.0;
// ... and the shortest: 10 ms (1e-300 would pass "> 0" and end every run before it starts).
inline constexpr double kShortestTimeout = 0.01;

// One run's fields when the file names a script (script_fields.cc).
RunSpec parse_script_run(const Reader& r, const YAML::Node& root);
// The fields of the processes, which script and scenario cells share: world_size, system,
// timeout_s, threads_per_rank (each error recorded, reading goes on).
void parse_process_fields(const Reader& r, const YAML::Node& root, RunSpec& run);
// One entry of `expect`; on a script cell (`script`) a `diverged` name is any part of a tensor's
// name, not one of the tables the file declares.
Expectation parse_expectation(const Reader& r, const YAML::Node& node, const std::string& path,
                              const std::set<std::string>& table_names, bool script);
// ... its exit, output, exception and hang (script_fields.cc).
void parse_script_expectation(const Reader& r, const YAML::Node& node, const std::string& path, ScriptExpectation& e);
// What a script cell judges, and only a script cell: refused with the field.
// `script`: the file declares a script (true even when the script itself could not be read).
void check_script_expectation(const Reader& r, const YAML::Node& node, const std::string& path, const RunSpec& run,
                              bool script);

// The rules of what each system can run and judge, in one place (system_rules.cc): what a release
// cell cannot run, refused before any rank starts; what an expectation cannot judge on its run's
// system (`node` is the expectation entry at `path`).
void check_system_can_run(const Reader& r, const YAML::Node& root, const RunSpec& run);
void check_system_can_judge(const Reader& r, const YAML::Node& node, const std::string& path, const RunSpec& run);

}  // namespace dmpcheck::scenario::detail
